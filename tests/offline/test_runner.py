"""The offline runner and recorder: what a run records, where the program runs, how it fails."""

from __future__ import annotations

import os
import threading
import time
import traceback
from pathlib import Path

import pulumi
import pytest
from pulumi.runtime import mocks as pulumi_mocks

from components.offline.recorder import EchoMocks
from components.offline.runner import ProgramTimeout, run_offline, run_program

ROOT = Path(__file__).resolve().parents[2]


class _Thing(pulumi.ComponentResource):
    def __init__(self, name: str, spec: dict):
        super().__init__("test:index:Thing", name, {"spec": spec})
        pulumi.CustomResource("test:index:Leaf", f"{name}-leaf", {"value": "x", "later": pulumi.Output.from_input(
            pulumi.output.Unknown())}, pulumi.ResourceOptions(parent=self))
        self.register_outputs({"spec": spec})


def test_inputs_are_recorded_once_with_unknowns_kept_and_every_mock_still_sees_them():
    seen: list[dict] = []

    class Watching(EchoMocks):
        def new_resource(self, args: pulumi_mocks.MockResourceArgs):
            seen.append(dict(args.inputs))
            return super().new_resource(args)

    run = run_offline(lambda: _Thing("t", {"hosts": [{"name": "a"}]}), project="p", stack="s", mocks=Watching())
    records = {r.name: r for r in run.records}
    assert records["t"].inputs == {"spec": {"hosts": [{"name": "a"}]}}
    assert isinstance(records["t-leaf"].inputs["later"], pulumi.output.Unknown)
    assert records["t-leaf"].inputs["value"] == "x"
    assert {"spec": {"hosts": [{"name": "a"}]}} in seen and any(s.get("value") == "x" for s in seen)
    assert records["p-s"].type == "pulumi:pulumi:Stack"        # the stack registers without a mock call
    assert run.component_outputs[records["t"].urn] == {"spec": {"hosts": [{"name": "a"}]}}


def test_a_component_gets_no_id_and_no_outputs_back_as_from_the_engine():
    args = pulumi_mocks.MockResourceArgs(typ="test:index:Thing", name="t", inputs={"spec": {"a": 1}},
                                         provider=None, resource_id=None, custom=False)
    assert EchoMocks().new_resource(args) == ("", {})
    args.custom = True
    assert EchoMocks().new_resource(args) == ("t-id", {"spec": {"a": 1}})


def test_the_program_runs_near_the_stack_root_not_under_its_caller():
    frames: list[str] = []

    def program() -> None:
        frames.extend(f.name for f in traceback.extract_stack())
        _Thing("t", {})

    def deep(n: int):
        return deep(n - 1) if n else run_offline(program, project="p", stack="s")

    run = deep(40)
    assert "deep" not in frames and len(frames) < 30, frames
    assert any(r.name == "t-leaf" for r in run.records)


def test_a_failing_program_fails_the_run_with_its_own_exception():
    def program() -> None:
        _Thing("t", {})
        raise ValueError("the spec says no")

    with pytest.raises(ValueError, match="the spec says no"):
        run_offline(program, project="p", stack="s")


def test_a_program_that_fails_half_way_fails_the_plan_at_once_instead_of_waiting_forever(monkeypatch):
    """A library error raised while the stack's components are being built (here, in the GPU stack's
    composition, after it registered resources others depend on) fails the run with that error: the SDK would
    otherwise wait for ever on the outputs of what never registered."""
    import components.k8s.rails as rails

    def broken(spec):
        raise AttributeError("broken on purpose")
    monkeypatch.setattr(rails, "network_names", broken)
    started = time.monotonic()
    with pytest.raises(AttributeError, match="broken on purpose"):
        run_program(ROOT, "dev")
    assert time.monotonic() - started < 60


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _runs_alive() -> int:
    """Threads of a run still alive: its own (in runner.py) and its executor's."""
    import sys
    frames = {ident: f for ident, f in sys._current_frames().items() if ident != threading.get_ident()}

    def in_runner(frame) -> bool:
        while frame is not None:
            if frame.f_code.co_filename.endswith(os.path.join("offline", "runner.py")):
                return True
            frame = frame.f_back
        return False
    return sum(map(in_runner, frames.values())) + sum(t.name.startswith("offline-rpc") for t in threading.enumerate())


def test_a_run_leaves_no_thread_loop_or_descriptor_behind():
    """The SDK's executor and the loop the mock monitor opens on each of its threads had outlived every run
    (six threads and some twenty descriptors a run): a test worker running hundreds of plans ran out of both."""
    run_offline(lambda: _Thing("warm", {}), project="p", stack="s")
    fds = _open_fds()
    for n in range(5):
        run_offline(lambda: [_Thing(f"t{i}", {}) for i in range(20)], project="p", stack="s")
    assert (_runs_alive(), _open_fds()) == (0, fds)


def _fails_leaving_an_output_that_never_resolves() -> None:
    import asyncio
    loop = asyncio.get_event_loop()
    never, known = loop.create_future(), loop.create_future()
    known.set_result(True)
    pulumi.export("never", pulumi.Output(set(), never, known).apply(str))
    _Thing("t", {})
    raise ValueError("half way")


def test_a_failed_run_winds_down_instead_of_waiting_on_what_never_resolves():
    fds = _open_fds()
    for _ in range(3):
        with pytest.raises(ValueError, match="half way"):
            run_offline(_fails_leaving_an_output_that_never_resolves, project="p", stack="s")
    assert (_runs_alive(), _open_fds()) == (0, fds)


def test_the_run_after_a_failed_one_waits_on_its_own_outputs_only():
    """The SDK's set of outputs to wait for had been one for every run in the process: the next run waited on
    the failed run's, which never resolve."""
    with pytest.raises(ValueError, match="half way"):
        run_offline(_fails_leaving_an_output_that_never_resolves, project="p", stack="s")
    run = run_offline(lambda: _Thing("next", {}), project="p", stack="s", timeout_s=60)
    assert any(r.name == "next-leaf" for r in run.records)


def test_a_run_that_never_ends_fails_within_its_bound_saying_where_it_was():
    release = threading.Event()

    def stuck_here() -> None:
        release.wait(30)

    started = time.monotonic()
    try:
        with pytest.raises(ProgramTimeout, match=r"(?s)stack 's' did not finish within 0.5 s.*in stuck_here"):
            run_offline(stuck_here, project="p", stack="s", timeout_s=0.5)
    finally:
        release.set()
    assert time.monotonic() - started < 20
