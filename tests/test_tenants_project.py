"""tenants/: a project that onboards teams onto a platform stack it reads through a StackReference."""

from __future__ import annotations

import runpy

import pulumi

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from components.offline.recorder import StackReferenceMocks
from components.offline.runner import _program_dir, load_stack_config, run_offline, run_program
from components.spec import SpecError
from components.spec.loader import load_tenants, read_tenancy
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
    assert "gpucluster:index:Tenant" in types and "pulumi:pulumi:StackReference" in types
    assert not types & {"gpucluster:index:Fabric", "gpucluster:index:GpuNodePool",
                        "gpucluster:index:ParallelFilesystem"}
    assert not {t for t in types if t.startswith("command:")}
    by_name = {r.name: r for r in run.records}
    cq = by_name["prod-team-d-cq"].inputs["spec"]
    assert cq["cohortName"] == "gpu-cluster"
    gpus = [r for r in cq["resourceGroups"][0]["flavors"][0]["resources"] if r["name"] == "nvidia.com/gpu"][0]
    assert (gpus["nominalQuota"], gpus["borrowingLimit"]) == ("0", "16")
    nccl = by_name["prod-team-d-nccl-h100"].inputs["data"]
    assert nccl == prod_outputs["tenancy"]["nccl"]["h100"]
    assert run.outputs["tenantNamespaces"][0] == {"team-d": "team-d"}


def refusal(outputs, tmp_path, text: str) -> str:
    """The one clean error a real `pulumi up` would print (a RunError: no traceback) for this tenants file."""
    path = tmp_path / "t.yaml"
    path.write_text(text)
    with pytest.raises(pulumi.RunError) as e:
        run_tenants(outputs, path)
    return str(e.value).replace(str(path), "t.yaml")


def test_the_platform_refuses_what_it_cannot_give(prod_outputs, tmp_path):
    text = refusal(prod_outputs, tmp_path, yaml.safe_dump({"platform_stack": PLATFORM, "tenants": [
        {"name": "team-a", "gpu_quota": {"h100": 8}},
        {"name": "team-e", "gpu_quota": {"a100": 1}}]}, sort_keys=False))
    assert text.splitlines() == [
        "t.yaml: 3 problem(s) in the tenants file:",
        "  - t.yaml:3: tenants[0].name: namespace 'team-a' is already taken on cluster prod (by the platform or its "
        "own tenants); choose another",
        "  - t.yaml:5: tenants[0].gpu_quota.h100: 8 h100 GPUs guaranteed here and 64 by the platform stack exceed "
        "the pool's 64; lower the nominal quotas",
        "  - t.yaml:8: tenants[1].gpu_quota.a100: cluster prod has no node pool 'a100' (pools: h100)"]


def test_a_bad_tenants_file_names_the_line_and_the_field_not_the_mapping(prod_outputs, tmp_path):
    text = refusal(prod_outputs, tmp_path, "platform_stack: prod\ntenants:\n  - {name: Team_X, gpu_quotas: {}}\n"
                                           "  - {namespace: team-y}\n")
    assert "t.yaml:3: tenants[0].name: " in text
    assert "t.yaml:3: tenants[0].gpu_quotas: unknown field 'gpu_quotas'; did you mean 'gpu_quota'?" in text
    assert "t.yaml:4: tenants[1].name: required field is missing; add it" in text
    assert "namespace': 'team-y" not in text            # the mapping is not echoed


def test_two_teams_of_one_name_are_a_field_error_not_an_engine_urn_error(prod_outputs, tmp_path):
    text = refusal(prod_outputs, tmp_path, f"platform_stack: {PLATFORM}\ntenants:\n  - name: team-x\n"
                                           "  - name: team-x\n    namespace: team-x2\n")
    assert "t.yaml:4: tenants[1].name: tenant name 'team-x' is already used at tenants[0].name; give each " \
           "tenant its own name" in text


def test_a_filesystem_directory_is_refused_here_not_silently_dropped(prod_outputs, tmp_path):
    text = refusal(prod_outputs, tmp_path, f"platform_stack: {PLATFORM}\ntenants:\n  - name: team-x\n"
                                           "    storage: {filesystem_gib: 100, group_id: 5000}\n")
    assert "t.yaml:4: tenants[0].storage.filesystem_gib: filesystem_gib 100 asks for a directory on the parallel " \
           "filesystem, which only the platform stack creates" in text
    assert "tenants[0].storage.group_id: group_id 5000" in text


def test_a_missing_tenants_file_is_one_clean_error(prod_outputs, tmp_path):
    with pytest.raises(pulumi.RunError, match="cannot read the tenants file .No such file or directory.; create it"):
        run_tenants(prod_outputs, tmp_path / "absent.yaml")


def test_a_platform_stack_without_tenancy_says_what_to_do(tmp_path):
    text = refusal({"cluster": "prod"}, tmp_path, f"platform_stack: {PLATFORM}\ntenants:\n  - name: team-x\n")
    assert f"t.yaml:1: platform_stack: stack '{PLATFORM}' exports no `tenancy` output; run `pulumi up` on " \
           f"{PLATFORM} with the same release of gpucluster" in text


def test_an_older_tenancy_shape_is_named_not_a_traceback(prod_outputs, tmp_path):
    old = {"tenancy": {**prod_outputs["tenancy"], "pools": {"h100": {"gpus_per_host": 8}}}}
    text = refusal(old, tmp_path, f"platform_stack: {PLATFORM}\ntenants:\n  - name: team-x\n")
    assert "exports `tenancy` in a shape this release cannot read (pools.h100.gpu_units_per_host: field required" \
           in text and "pools.h100.gpus_per_host: extra inputs are not permitted" in text


_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(), st.text(max_size=20))
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                        st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                       max_leaves=8)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.binary(max_size=200), st.text(alphabet="{}[]&*!|>-:,'\"#%@\n\t abc012", max_size=200),
                 _VALUES.map(lambda v: yaml.safe_dump({"platform_stack": "a/b/c", "tenants": v}))))
def test_any_tenants_file_gives_problems_not_a_crash(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("t") / "t.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    try:
        load_tenants(path)
    except SpecError as e:
        assert e.problems and all(p.startswith(str(path)) and len(p) < 2000 for p in e.problems), e.problems


@settings(max_examples=200, deadline=None)
@given(_VALUES)
def test_any_exported_tenancy_gives_problems_not_a_crash(tmp_path_factory, exported):
    path = tmp_path_factory.mktemp("t") / "t.yaml"
    path.write_text("platform_stack: a/b/c\ntenants: [{name: x}]\n")
    try:
        read_tenancy(exported, load_tenants(path))
    except SpecError as e:
        assert len(e.problems) == 1 and len(e.problems[0]) < 2000
