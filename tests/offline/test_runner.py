"""The offline runner and recorder: what a run records, where the program runs, how it fails."""

from __future__ import annotations

import time
import traceback
from pathlib import Path

import pulumi
import pytest
from pulumi.runtime import mocks as pulumi_mocks

from components.offline.recorder import EchoMocks
from components.offline.runner import run_offline, run_program

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
