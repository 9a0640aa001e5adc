"""Shared fixtures: the dev spec as data, a recorder that runs any program under Pulumi's mocks, shared/."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

import pulumi

from components.offline.runner import ProgramRun, run_offline
from components.spec import ClusterSpec, SpecError, parse_spec

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
_DEV = yaml.safe_load((ROOT / "stacks" / "dev.yaml").read_text())


@pytest.fixture
def dev_data() -> dict[str, Any]:
    """The dev stack's spec as plain data, a fresh copy for each test to change."""
    return copy.deepcopy(_DEV)


@pytest.fixture(scope="session")
def dev_spec() -> ClusterSpec:
    return parse_spec(yaml.safe_dump(_DEV), "stacks/dev.yaml")


def problems_of(data: dict[str, Any] | str) -> list[str]:
    """Every problem the loader reports for `data` (a dict or raw YAML); [] when it is valid."""
    text = data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False)
    try:
        parse_spec(text, "spec.yaml")
    except SpecError as e:
        return e.problems
    return []


def with_changes(doc: Any, changes: list[tuple[tuple, Any]]) -> Any:
    """A deep copy of `doc` with each (path, value) set; a change whose parent an earlier one replaced is skipped
    (for generated hostile input)."""
    out = copy.deepcopy(doc)
    for path, value in changes:
        node = out
        try:
            for part in path[:-1]:
                node = node[part]
            node[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue
    return out


@pytest.fixture
def record() -> Callable[[Callable[[], Any]], ProgramRun]:
    """Run a program under the recording mock monitor; unknown invokes fail loudly (EchoMocks.call)."""
    def run(program: Callable[[], Any], stack: str = "test") -> ProgramRun:
        return run_offline(program, project="gpucluster", stack=stack)
    return run


def ssh_key() -> pulumi.Output[str]:
    """A stand-in private key, secret as in a real stack (call inside a program)."""
    return pulumi.Output.secret("-----BEGIN OPENSSH PRIVATE KEY-----\ntest-only\n-----END OPENSSH PRIVATE KEY-----")


@pytest.fixture
def shared_dir() -> Path:
    if not (SHARED / "schemas" / "crds").is_dir():
        pytest.skip("../shared/schemas is not here; the upstream CRD checks need it")
    return SHARED


# pytest puts the running test's id in the environment of every process a test starts (PYTEST_CURRENT_TEST), and
# Linux takes no environment string over 128 KiB (MAX_ARG_STRLEN): such a test fails with "Argument list too
# long" (seen under pytest 9.1, not 9.2). A parameter that long gets an id of its own (pytest.param(id=)).
TEST_ID_MAX = 16000


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    long = [item.nodeid[:120] for item in items if len(item.nodeid) > TEST_ID_MAX]
    if long:
        raise pytest.UsageError(f"{len(long)} test id(s) over {TEST_ID_MAX} characters, e.g. {long[0]}...: give "
                                "the parameter an id (pytest.param(value, id=...))")
