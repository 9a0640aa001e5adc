"""Runs of the real program to hold the policies to, and a way to change one thing in what it registered."""

from __future__ import annotations

import copy
from typing import Any, Callable

import pytest

from components.offline.policy import Violation, evaluate, load_policies
from components.offline.recorder import Record
from components.offline.runner import ProgramRun, run_program
from tests.conftest import ROOT

POLICIES = load_policies(ROOT)          # the pack's package, never its __main__ (which serves forever)
BY_NAME = {p.name: p for p in POLICIES}


@pytest.fixture(scope="session")
def dev_run() -> ProgramRun:
    return run_program(ROOT, "dev")


@pytest.fixture(scope="session")
def prod_run() -> ProgramRun:
    return run_program(ROOT, "prod")


def findings(run: ProgramRun, policy: str, config: dict[str, tuple[int, dict[str, Any]]] | None = None) -> list[str]:
    """The messages one policy reports on a run, through the SDK's own analyzer."""
    return [v.message for v in evaluate(run, [BY_NAME[policy]], config)]


def violations(run: ProgramRun, policy: str) -> list[Violation]:
    return evaluate(run, [BY_NAME[policy]])


def changed(run: ProgramRun, name: str, edit: Callable[[dict[str, Any]], Any]) -> ProgramRun:
    """A copy of the run where the resource `name` registered something else: a component's outputs, or a
    custom resource's inputs."""
    out = copy.deepcopy(run)
    record = next(r for r in out.records if r.name == name)
    edit(out.component_outputs[record.urn] if not record.custom else record.inputs)
    return out


def _set(path, value):
    """An edit for `changed`: the value at `path` becomes `value`."""
    def edit(obj):
        *head, last = path
        for key in head:
            obj = obj[key]
        obj[last] = value
    return edit


def without(run: ProgramRun, name: str) -> ProgramRun:
    """A copy of the run without the resource `name`, as a program that leaves it out would register."""
    out = copy.deepcopy(run)
    out.records = [r for r in out.records if r.name != name]
    return out


def with_resource(run: ProgramRun, type_: str, name: str, inputs: dict[str, Any], parent: str = "",
                  **options: Any) -> ProgramRun:
    """A copy of the run with one more custom resource, as a user's own program might register it."""
    out = copy.deepcopy(run)
    urn = f"urn:pulumi:{run.stack}::{run.project}::{type_}::{name}"
    out.records.append(Record(urn=urn, type=type_, name=name, custom=True, remote=False, parent=parent,
                              dependencies=[], property_dependencies={}, provider="", inputs=inputs,
                              options=options))
    return out
