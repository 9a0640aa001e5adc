"""The stack traces the engine stores: the program's frames only (components/stack_traces.py)."""

from __future__ import annotations

import asyncio
import sysconfig
from pathlib import Path

import pulumi
import pulumi.runtime.resource as sdk
from pulumi.runtime.proto import source_pb2

from components import trim_stack_traces
from components.stack_traces import foreign

HERE = Path(__file__).resolve()


def _frame(path: str, line: int = 1) -> source_pb2.StackFrame:
    return source_pb2.StackFrame(pc=source_pb2.SourcePosition(uri=Path(path).as_uri(), line=line))


def test_the_event_loop_the_sdk_and_the_language_host_are_foreign_the_program_is_not():
    stdlib = sysconfig.get_paths()["stdlib"]
    sdk_dir = Path(pulumi.__file__).resolve().parent
    assert foreign(Path(asyncio.__file__).as_uri())
    assert foreign((Path(stdlib) / "asyncio" / "base_events.py").as_uri())
    assert foreign((sdk_dir / "runtime" / "stack.py").as_uri())
    assert foreign(Path("/opt/tools/bin/pulumi-language-python-exec").as_uri())
    assert foreign("")                                              # a frame with no position
    assert not foreign(HERE.as_uri())
    assert not foreign(Path("/srv/platform/__main__.py").as_uri())
    assert not foreign((HERE.parents[2] / "components" / "ssh.py").as_uri())


def test_a_trace_keeps_the_programs_frames_in_order_and_its_first_is_the_source_position(monkeypatch):
    """As the language host's trace of a registration comes: the library's frames, the program's, then the
    runner and the event loop (the SDK's reversed stack, innermost first)."""
    stdlib = sysconfig.get_paths()["stdlib"]
    full = source_pb2.StackTrace(frames=[
        _frame("/srv/platform/components/ssh.py", 129), _frame("/srv/platform/components/cluster.py", 79),
        _frame("/srv/platform/__main__.py", 23), source_pb2.StackFrame(), source_pb2.StackFrame(),
        _frame("/opt/tools/bin/pulumi-language-python-exec", 188),
        _frame(str(Path(pulumi.__file__).resolve().parent / "runtime" / "stack.py"), 237),
        _frame(f"{stdlib}/asyncio/base_events.py", 1922), _frame(f"{stdlib}/asyncio/events.py", 80)])
    monkeypatch.setattr(sdk, "_get_stack_trace", lambda: source_pb2.StackTrace(frames=list(full.frames)))
    assert trim_stack_traces() and trim_stack_traces()          # a second call changes nothing
    trace = sdk._get_stack_trace()
    assert [(Path(f.pc.uri).name, f.pc.line) for f in trace.frames] == [
        ("ssh.py", 129), ("cluster.py", 79), ("__main__.py", 23)]
    assert sdk._get_source_position(trace).line == 129
    assert sdk._get_stack_trace.trims.__name__ == "<lambda>"       # wrapped once, not twice


def test_an_sdk_without_the_hook_keeps_its_traces(monkeypatch):
    monkeypatch.delattr(sdk, "_get_stack_trace")
    assert trim_stack_traces() is False


def test_the_pinned_sdk_registers_through_the_hook():
    """The hook is what register_resource and read_resource call by name (pulumi 3.272's runtime/resource.py):
    where a new SDK stops calling it, this fails instead of the state silently growing again."""
    source = Path(sdk.__file__).read_text()
    assert source.count("stack_trace = _get_stack_trace()") >= 2
