"""tenants/: a project that onboards teams onto a platform stack it reads through a StackReference."""

from __future__ import annotations

import runpy

import pytest
import yaml

from components.offline.recorder import StackReferenceMocks
from components.offline.runner import _program_dir, load_stack_config, run_offline, run_program
from components.spec import SpecError
from tests.conftest import ROOT

PROJECT = ROOT / "tenants"
PLATFORM = "organization/gpucluster/prod"


@pytest.fixture(scope="module")
def prod_outputs() -> dict:
    """What the platform stack exports (a referenced stack's outputs are known, even during a preview)."""
    return {"tenancy": run_program(ROOT, "prod").outputs["tenancy"][0]}


def run_tenants(outputs, tenants_file=None):
    """The tenants program for stack `example`, its StackReference answered by the platform's offline run."""
    cfg = load_stack_config(PROJECT, "example")
    if tenants_file is not None:
        cfg.values[f"{cfg.project}:tenantsFile"] = str(tenants_file)
    with _program_dir(PROJECT):
        return run_offline(lambda: runpy.run_path(str(PROJECT / "__main__.py"), run_name="__main__"),
                           project=cfg.project, stack="example", config=cfg.values,
                           mocks=StackReferenceMocks({PLATFORM: outputs}))


def test_a_team_is_onboarded_from_the_platforms_exported_tenancy(prod_outputs):
    run = run_tenants(prod_outputs)
    types = {r.type for r in run.records}
    assert "gpucluster:k8s:Tenant" in types and "pulumi:pulumi:StackReference" in types
    assert not {t for t in types if t.startswith(("gpucluster:fabric", "gpucluster:nodes", "gpucluster:storage",
                                                  "command:"))}
    by_name = {r.name: r for r in run.records}
    cq = by_name["prod-team-d-cq"].inputs["spec"]
    assert cq["cohortName"] == "gpu-cluster"
    gpus = [r for r in cq["resourceGroups"][0]["flavors"][0]["resources"] if r["name"] == "nvidia.com/gpu"][0]
    assert (gpus["nominalQuota"], gpus["borrowingLimit"]) == (0, 16)
    nccl = by_name["prod-team-d-nccl-h100"].inputs["data"]
    assert nccl == prod_outputs["tenancy"]["nccl"]["h100"]
    assert run.outputs["tenantNamespaces"][0] == {"team-d": "team-d"}


def test_the_platform_refuses_what_it_cannot_give(prod_outputs, tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({"platform_stack": PLATFORM, "tenants": [
        {"name": "team-a", "gpu_quota": {"h100": 8}},
        {"name": "team-e", "gpu_quota": {"a100": 1}}]}))
    with pytest.raises(SpecError) as e:
        run_tenants(prod_outputs, path)
    text = str(e.value)
    assert "tenants[0].namespace: 'team-a' is already taken on cluster prod; choose another" in text
    assert "tenants[1].gpu_quota.a100: cluster prod has no node pool 'a100' (pools: h100)" in text
    assert "tenants: 8 h100 GPUs guaranteed here and 64 by the platform stack exceed the pool's 64; lower the " \
           "nominal quotas" in text


def test_a_bad_tenants_file_names_the_field(prod_outputs, tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("platform_stack: prod\ntenants:\n  - {name: Team_X}\n")
    with pytest.raises(SpecError) as e:
        run_tenants(prod_outputs, path)
    assert f"{path}: tenants.0.name: " in str(e.value)
