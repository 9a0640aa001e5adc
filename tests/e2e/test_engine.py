"""The real Pulumi engine runs the YAML examples against the component provider: the YAML language host binds each
program to the provider's schema, the engine constructs each component over gRPC and stores what the Python path
registers, a second `up` with one value changed updates exactly what it should, and a bad input stops with the
provider's message.

Needs the Pulumi CLI and its YAML language host, built from their Go modules by `make engine-e2e` (about 12
minutes cold, so `make e2e` and CI leave this out); without them the test skips and says so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pulumi
import pytest
import yaml

from components.cluster import GpuCluster
from components.k8s.tenancy.tenant import Tenant, TenantArgs, tenancy_of
from components.nodes import GpuNodePool, NodePoolArgs
from components.offline.runner import run_offline
from components.spec import Tenant as TenantSpec, load_spec
from tests.conftest import ROOT

from .engine import PLUGINS, serve_echo, start_component_provider

pytestmark = pytest.mark.e2e

TOOLS = Path(os.environ.get("GPUCLUSTER_E2E_TOOLS", ROOT / ".e2e")) / "bin"
EXAMPLE = Path("examples") / "tenant-and-pool"
KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nengine-test-key\n-----END OPENSSH PRIVATE KEY-----\n"


class Pulumi:
    """The CLI with a state backend of its own, attached to the stand-in plugins and to a component provider
    started in the program's directory (as the language host starts a plugin)."""

    def __init__(self, work: Path, echoes: dict[str, int]):
        self.work, self.echoes = work, echoes
        self.env = {**os.environ, "PATH": f"{TOOLS}:{os.environ['PATH']}", "PULUMI_HOME": str(work / "home"),
                    "PULUMI_BACKEND_URL": f"file://{work / 'state'}", "PULUMI_CONFIG_PASSPHRASE": "engine-test",
                    "PULUMI_SKIP_UPDATE_CHECK": "1", "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true"}
        self.providers: dict[Path, tuple[subprocess.Popen, int]] = {}
        (work / "state").mkdir()

    def program(self, example: Path, *beside: Path) -> Path:
        """A copy of an example where it lives relative to the provider (its `packages: gpucluster:` path) and
        to the files it names, with its own running provider."""
        program = self.work / "repo" / example
        shutil.copytree(ROOT / example, program, ignore=shutil.ignore_patterns("node_modules"))
        for path in beside:
            (self.work / "repo" / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / path, self.work / "repo" / path)
        if not (self.work / "repo" / "provider").exists():
            (self.work / "repo" / "provider").symlink_to(ROOT / "provider")
        self.providers[program] = start_component_provider(program, self.work / f"{program.name}.provider.err")
        return program

    def __call__(self, cwd: Path, *args: str, input: str | None = None, ok: bool = True) -> str:
        attach = {"gpucluster": self.providers[cwd][1], **self.echoes} if cwd in self.providers else self.echoes
        env = {**self.env, "PULUMI_DEBUG_PROVIDERS": ",".join(f"{n}:{p}" for n, p in attach.items())}
        done = subprocess.run([str(TOOLS / "pulumi"), *args, "--non-interactive", "--color", "never"], cwd=cwd,
                              env=env, input=input, capture_output=True, text=True, timeout=600)
        out = done.stdout + done.stderr
        assert (done.returncode == 0) == ok, out
        return out

    def close(self) -> None:
        for proc, _ in self.providers.values():
            proc.terminate()
            proc.wait(timeout=30)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pulumi]:
    if not (TOOLS / "pulumi").exists() or not (TOOLS / "pulumi-language-yaml").exists():
        if os.environ.get("GPUCLUSTER_ENGINE_E2E") == "1":
            pytest.fail(f"no pulumi or pulumi-language-yaml in {TOOLS}: `make engine-e2e` builds them")
        pytest.skip(f"the Pulumi CLI is not built in {TOOLS}; `make engine-e2e` builds it and runs this test")
    work = tmp_path_factory.mktemp("engine")
    echoes = {name: serve_echo(version) for name, version in PLUGINS.items()}
    pulumi = Pulumi(work, {name: port for name, (_, port, _) in echoes.items()})
    try:
        platform = work / "platform"         # stands for the platform stack: its `tenancy` export, as __main__.py's
        platform.mkdir()
        (platform / "Pulumi.yaml").write_text(yaml.safe_dump({"name": "platform", "runtime": "yaml", "outputs": {
            "tenancy": tenancy_of(load_spec(ROOT / "stacks" / "dev.yaml")).model_dump(mode="json")}}))
        pulumi(platform, "stack", "init", "dev")
        pulumi(platform, "up", "--yes")
        yield pulumi
    finally:
        pulumi.close()
        for server, _, _ in echoes.values():
            server.stop(0)


@pytest.fixture(scope="module")
def team(engine: Pulumi) -> Path:
    program = engine.program(EXAMPLE / "yaml", EXAMPLE / "expansion.yaml")
    engine(program, "stack", "init", "dev")
    engine(program, "config", "set", "platformStack", "organization/platform/dev")
    engine(program, "config", "set", "--secret", "sshPrivateKey", input=KEY)
    engine(program, "config", "set", "--secret", "kubeconfig", "~/.kube/gpucluster-dev")
    return program


def _team_urns(project: str) -> set[str]:
    """What the Python path registers for the team example's pool and tenant, in its project."""
    spec = load_spec(ROOT / EXAMPLE / "expansion.yaml")
    program = yaml.safe_load((ROOT / EXAMPLE / "yaml" / "Pulumi.yaml").read_text())
    tenant = TenantSpec(**program["resources"]["vision"]["properties"]["tenant"])
    tenancy = tenancy_of(load_spec(ROOT / "stacks" / "dev.yaml"))
    run = run_offline(lambda: [GpuNodePool("l40s", NodePoolArgs.from_spec(spec, spec.node_pools[0]),
                                           pulumi.Output.secret(KEY)),
                               Tenant("vision", TenantArgs.from_tenancy(tenancy, tenant))],
                      project=project, stack="dev")
    return {r.urn for r in run.records}


def _edited(program: Path, old: str, new: str) -> None:
    text = (program / "Pulumi.yaml").read_text()
    assert old in text
    (program / "Pulumi.yaml").write_text(text.replace(old, new))


def _steps(out: str) -> dict[str, list[str]]:
    by_op: dict[str, list[str]] = {}
    for step in json.loads(out).get("steps", []):
        by_op.setdefault(step["op"], []).append(step["urn"].rsplit("::", 1)[-1])
    return by_op


def test_the_engine_runs_the_team_example_and_a_second_up_changes_only_what_changed(engine, team):
    pulumi, program = engine, team
    pulumi(program, "preview")                     # binds the program to the schema, constructs both components
    pulumi(program, "up", "--yes")
    outputs: dict[str, Any] = json.loads(pulumi(program, "stack", "output", "--json"))
    assert (outputs["namespace"], outputs["queue"], outputs["hosts"]) == ("vision", "default",
                                                                         ["l40s-dev-01", "l40s-dev-02"])
    state = json.loads(pulumi(program, "stack", "export"))["deployment"]["resources"]
    urns = {r["urn"] for r in state if not r["type"].startswith("pulumi:providers:")}
    project = "gpucluster-team-yaml"
    assert urns - {f"urn:pulumi:dev::{project}::pulumi:pulumi:StackReference::platform"} == \
        _team_urns(project) | {f"urn:pulumi:dev::{project}::pulumi:pulumi:Stack::{project}-dev"}
    assert KEY.splitlines()[1] not in json.dumps(state)        # the key is a secret in the state too
    pulumi(program, "preview", "--expect-no-changes")
    # Day 2: the tenant borrows less. Its intent and its ClusterQueue change; nothing else runs.
    _edited(program, "borrowing_limit: 8", "borrowing_limit: 4")
    steps = _steps(pulumi(program, "preview", "--json"))
    assert sorted(steps.pop("update")) == ["vision", "vision-cq"]
    assert set(steps) <= {"same", "read"}
    pulumi(program, "up", "--yes")
    pulumi(program, "preview", "--expect-no-changes")


@pytest.mark.parametrize("old, new, message", [
    ("pool: l40s", "pool: a100", "property pool with value \"a100\" has a problem: the spec has no node pool "
                                 "'a100'; its pools: l40s"),
    ("nominal: 0,", "nominal: 2,",
     "tenant: gpu_quota.h100: 2 h100 GPUs guaranteed here and 16 by the platform stack exceed the pool's 16; "
     "lower the nominal quotas"),
])
def test_a_bad_input_stops_the_engine_with_the_providers_message_not_a_traceback(engine, team, old, new, message):
    pulumi, program = engine, team
    before = (program / "Pulumi.yaml").read_text()
    _edited(program, old, new)
    try:
        out = pulumi(program, "preview", ok=False)
    finally:
        (program / "Pulumi.yaml").write_text(before)
    assert message in out and "Traceback" not in out


def test_the_engine_builds_the_dev_environment_from_the_yaml_example(engine):
    """The whole environment through one remote component: the registrations of the Python path, and its
    outputs."""
    program = engine.program(Path("examples") / "pulumi-yaml", Path("stacks") / "dev.yaml")
    engine(program, "stack", "init", "dev")
    engine(program, "config", "set", "--secret", "sshPrivateKey", input=KEY)
    engine(program, "config", "set", "--secret", "kubeconfig", "~/.kube/gpucluster-dev")
    engine(program, "up", "--yes")
    spec = load_spec(ROOT / "stacks" / "dev.yaml")
    project = "gpucluster-yaml"
    python = run_offline(lambda: GpuCluster("cluster", spec, pulumi.Output.secret(KEY)), project=project,
                         stack="dev")
    state = json.loads(engine(program, "stack", "export"))["deployment"]["resources"]
    assert {r["urn"] for r in state if not r["type"].startswith("pulumi:providers:")} == \
        {r.urn for r in python.records}
    outputs = json.loads(engine(program, "stack", "output", "--json"))
    assert outputs["gpus"] == spec.gpus and outputs["flavors"] == {"h100": "h100"}
    assert outputs["tenantNamespaces"] == {"team-a": "team-a", "team-b": "team-b"}
    assert KEY.splitlines()[1] not in json.dumps(state)
    engine(program, "preview", "--expect-no-changes")
