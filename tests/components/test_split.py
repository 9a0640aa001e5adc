"""A split environment (README: Split stacks): the platform stack and each shard's build, between them, exactly
what the one stack of the environment builds, each resource once and with the same inputs, so a pool moved into
a shard with `pulumi state move` shows no change; and a shard refuses a platform it cannot trust."""

from __future__ import annotations

import copy
from pathlib import Path

import pulumi
import pytest
import yaml

from components.offline.recorder import StackReferenceMocks
from components.offline.runner import ProgramRun, run_program
from components.spec import parse_spec
from components.spec.loader import SpecError
from tests.conftest import ROOT

PLATFORM_STACK = "organization/gpucluster/staging"


def split_staging(shards: dict[str, list[str]] | None = None) -> dict:
    """Staging with its four hosts in two pools, the second in shard `b`."""
    data = yaml.safe_load((ROOT / "stacks" / "staging.yaml").read_text())
    pool = data["node_pools"][0]
    second = copy.deepcopy(pool)
    second["name"], pool["hosts"], second["hosts"] = "h100b", pool["hosts"][:2], pool["hosts"][2:]
    data["node_pools"].append(second)
    data["tenants"][0]["gpu_quota"] = {"h100": {"nominal": 16, "borrowing_limit": 12}, "h100b": {"nominal": 4}}
    data["tenants"][1]["gpu_quota"] = {"h100b": {"nominal": 12, "lending_limit": 4}}
    data["shards"] = [{"name": n, "node_pools": p} for n, p in (shards or {"b": ["h100b"]}).items()]
    return data


def run_part(tmp_path: Path, data: dict, part: str | None, platform: dict | None = None) -> ProgramRun:
    spec_file = tmp_path / "split.yaml"
    spec_file.write_text(yaml.safe_dump(data, sort_keys=False))
    settings = {"part": part} if part else {}
    if part not in (None, "platform"):
        settings["platformStack"] = PLATFORM_STACK
    mocks = StackReferenceMocks({PLATFORM_STACK: platform}) if platform is not None else None
    return run_program(ROOT, "staging", spec_file=spec_file, mocks=mocks, settings=settings)


def exported(run: ProgramRun) -> dict:
    """A stack's outputs as another stack's StackReference reads them once it is applied (the storage secret
    the preview left unknown is made by then)."""
    return {k: known(v[0]) for k, v in run.outputs.items()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, ProgramRun]:
    tmp = tmp_path_factory.mktemp("split")
    data = split_staging()
    whole = run_part(tmp, data, None)
    platform = run_part(tmp, data, "platform")
    shard = run_part(tmp, data, "b", exported(platform))
    return {"whole": whole, "platform": platform, "b": shard}


def known(value):
    """A value with the preview's unknowns as one marker (each Unknown is an object of its own)."""
    if isinstance(value, dict):
        return {k: known(v) for k, v in value.items()}
    if isinstance(value, list):
        return [known(v) for v in value]
    if isinstance(value, pulumi.FileArchive):
        return value.path
    return "<unknown>" if type(value).__name__ == "Unknown" else value


def by_urn(run: ProgramRun) -> dict[str, dict]:
    return {f"{r.type}::{r.name}": known(r.inputs) for r in run.records
            if r.type not in ("pulumi:pulumi:Stack", "pulumi:pulumi:StackReference", "gpucluster:index:GpuCluster")}


def test_the_parts_build_what_the_whole_builds_each_resource_once_with_the_same_inputs(runs):
    whole, platform, shard = (by_urn(runs[k]) for k in ("whole", "platform", "b"))
    assert set(platform) & set(shard) == {"gpucluster:index:ParallelFilesystem::staging-storage",
                                          "gpucluster:index:GpuKubernetesStack::staging-k8s"}
    assert set(platform) | set(shard) == set(whole)
    # The same inputs, so a pool moved into a shard with `pulumi state move` has nothing to change; but for its
    # first client, which applies the tenants' directories for its stack too (an update in place, no remount).
    directories = "command:remote:Command::staging-storage-gpu-stg-03"
    for urn, inputs in {**platform, **shard}.items():
        if urn != directories:
            assert inputs == whole[urn], urn
    changed = {k for k in whole[directories].keys() | shard[directories].keys()
               if whole[directories].get(k) != shard[directories].get(k)}
    assert changed == {"create", "update"} and "quota set-limits" in shard[directories]["update"]
    hosts = {n.rsplit("::", 1)[1] for n in shard if n.startswith("command:remote:Command::")}
    assert hosts and all(h.startswith(("staging-h100b-gpu-stg-03", "staging-h100b-gpu-stg-04",
                                       "staging-storage-gpu-stg-03", "staging-storage-gpu-stg-04"))
                         for h in hosts), hosts
    # The platform keeps nothing of a shard's host, its active check's CronJob included, so its length does not
    # grow with the shards' hosts; the shard's checks wait for the platform (their queue and script).
    assert not any("gpu-stg-03" in n or "gpu-stg-04" in n for n in platform)
    checks = [r for r in runs["b"].records if r.type == "kubernetes:batch/v1:CronJob"]
    ref = next(r for r in runs["b"].records if r.type == "pulumi:pulumi:StackReference")
    assert sorted(r.name for r in checks) == ["staging-k8s-gpu-check-gpu-stg-03", "staging-k8s-gpu-check-gpu-stg-04"]
    assert all(ref.urn in r.dependencies for r in checks)


def test_a_shards_hosts_wait_for_the_platform_stack_and_read_its_storage_secret(runs):
    shard = runs["b"]
    ref = next(r for r in shard.records if r.type == "pulumi:pulumi:StackReference")
    prepares = [r for r in shard.records if r.name.endswith("-prepare")]
    clients = [r for r in shard.records if r.name.startswith("staging-storage-gpu-stg-")]
    assert prepares and clients
    for r in prepares + clients:
        assert ref.urn in r.dependencies, r.name
    platform = exported(runs["platform"])
    assert platform["platform"]["shards"] == {"b": ["h100b"]}
    assert "storageAuth" in runs["platform"].outputs          # BeeGFS's connection secret, for the shards
    assert not {"fabricTopology", "tenantNamespaces", "storageAuth"} & set(shard.outputs)


def test_the_whole_stack_exports_nothing_for_shards(runs):
    assert not {"platform", "storageAuth"} & set(runs["whole"].outputs)


def test_a_shard_preview_against_a_platform_of_another_spec_warns_and_goes_on(tmp_path, runs, monkeypatch):
    warned: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *a, **k: warned.append(message))
    stale = exported(runs["platform"])
    stale["platform"] = {**stale["platform"], "spec_digest": "0" * 64}
    run = run_part(tmp_path, split_staging(), "b", stale)
    assert warned == [f"shard b: platform stack {PLATFORM_STACK} was last applied from another version of the "
                      "spec: apply it first, then the shards (`pulumi up` stops here until then)"]
    assert any(r.name.endswith("-prepare") for r in run.records)


def test_a_shard_up_against_a_stack_that_is_not_split_stops_before_registering_anything(tmp_path, runs, monkeypatch):
    """`pulumi up` (not a preview): one RunError, the program's first words to the engine."""
    registered: list[str] = []
    real = StackReferenceMocks.new_resource
    monkeypatch.setattr(StackReferenceMocks, "new_resource",
                        lambda self, args: registered.append(args.name) or real(self, args))
    monkeypatch.setattr(pulumi.runtime, "is_dry_run", lambda: False)
    with pytest.raises(pulumi.RunError, match=r"^shard b: platform stack organization/gpucluster/staging has no "
                                              r"`platform` output: apply it first with `gpucluster:part` platform$"):
        run_part(tmp_path, split_staging(), "b", exported(runs["whole"]))
    assert registered == []


@pytest.mark.parametrize("part, platform_stack, message", [
    ("c", None, r"gpucluster:part is 'c', but .*split.yaml has the shards b: use platform or one of them"),
    ("b", "", r"gpucluster:part is the shard 'b', which reads the platform stack: set gpucluster:platformStack"),
])
def test_a_wrong_part_is_one_clean_error_naming_the_setting(tmp_path, part, platform_stack, message):
    from components.split import part_problem

    spec_file = str(tmp_path / "split.yaml")
    problem = part_problem(parse_spec(yaml.safe_dump(split_staging())), spec_file, part, platform_stack or None)
    assert problem is not None
    import re
    assert re.search(message, problem), problem


def test_the_platform_stack_names_no_platform_stack():
    from components.split import part_problem

    spec = parse_spec(yaml.safe_dump(split_staging()))
    assert "remove it from the platform stack" in part_problem(spec, "s.yaml", "platform", PLATFORM_STACK)
    assert part_problem(spec, "s.yaml", "platform", None) is None
    assert part_problem(spec, "s.yaml", None, None) is None


@pytest.mark.parametrize("part, platform, message", [
    ("c", None, "GpuCluster's part is 'c', but the spec has the shards b: use platform or one of them"),
    ("b", None, "GpuCluster's part is the shard 'b', which reads the platform stack: set GpuCluster's platform "
                "to its StackReference"),
    (None, "ref", "GpuCluster's platform is set, but GpuCluster's part is not"),
])
def test_a_program_of_its_own_passing_a_wrong_part_is_told_in_its_arguments_names(part, platform, message):
    from components.split import part_intent

    with pytest.raises(ValueError) as e:
        part_intent(parse_spec(yaml.safe_dump(split_staging())), part, platform)
    assert str(e.value).startswith(message), str(e.value)


@pytest.mark.parametrize("shards, where, says", [
    ({"b": ["h100c"]}, "shards[0].node_pools[0]", "no node pool named 'h100c'"),
    ({"b": ["h100b"], "c": ["h100b"]}, "shards[1].node_pools[0]", "already in shard 'b'"),
    ({"platform": ["h100b"]}, "shards[0].name", "is the part that builds everything"),
])
def test_a_shard_the_platform_would_wait_for_is_refused_naming_the_field(shards, where, says):
    with pytest.raises(SpecError) as e:
        parse_spec(yaml.safe_dump(split_staging(shards)))
    assert any(where in line and says in line for line in str(e.value).splitlines()), str(e.value)


def test_a_pool_running_a_subnet_manager_stays_in_the_platform():
    data = yaml.safe_load((ROOT / "stacks" / "prod.yaml").read_text())
    pool = data["node_pools"][0]
    second = copy.deepcopy(pool)
    second["name"], pool["hosts"], second["hosts"] = "h100b", pool["hosts"][:4], pool["hosts"][4:]
    data["node_pools"].append(second)
    data["shards"] = [{"name": "b", "node_pools": ["h100b"]}]
    with pytest.raises(SpecError) as e:
        parse_spec(yaml.safe_dump(data))
    assert "runs the subnet manager on gpu-prod-05" in str(e.value)


def test_each_stacks_first_client_applies_the_directories_and_its_other_hosts_open_after_it(tmp_path, runs):
    """The first pool in a shard: the platform's first client (of its remaining pool) and the shard's each
    apply the tenants' directories (they converge), and the platform's volumes wait for none of the shard's."""
    data = split_staging({"a": ["h100"]})
    platform = run_part(tmp_path, data, "platform")
    shard = run_part(tmp_path, data, "a", exported(platform))
    directories = {run: sorted(r.name for r in runs_.records if r.name.startswith("staging-storage-gpu-")
                               and "beegfs quota set-limits" in str(r.inputs.get("create")))
                   for run, runs_ in (("platform", platform), ("a", shard))}
    assert directories == {"platform": ["staging-storage-gpu-stg-03"], "a": ["staging-storage-gpu-stg-01"]}
    first = next(r for r in shard.records if r.name == "staging-storage-gpu-stg-01")
    second = next(r for r in shard.records if r.name == "staging-h100-gpu-stg-02-node")
    assert first.urn in second.dependencies
    volumes = [r for r in platform.records if r.type.startswith("kubernetes:core/v1:PersistentVolume")]
    assert volumes and all("gpu-stg-01" not in d for v in volumes for d in v.dependencies)


def careless_split_staging() -> dict:
    """The split staging environment with findings of both kinds: one the platform alone can judge (no GPU
    temperature alert without monitoring) and one about what every part holds (storage too slow for its GPUs)."""
    data = split_staging()
    data["storage"]["read_gb_per_s_per_server"] = 1
    data["kubernetes"]["monitoring"] = {"enabled": False}
    return data


@pytest.mark.parametrize("careless", [False, True], ids=["clean", "careless"])
def test_the_policy_pack_on_each_part_finds_only_what_it_finds_on_the_whole_and_misses_nothing(
        tmp_path, runs, careless):
    """A shard holds GPU pools alone: a policy asking for something the environment must have somewhere leaves
    that to the platform stack (`whole_environment`), or every shard's pull request would fail on it."""
    from components.offline.policy import evaluate, load_policies

    policies = load_policies(ROOT)
    if careless:
        data = careless_split_staging()
        platform = run_part(tmp_path, data, "platform")
        parts = {"whole": run_part(tmp_path, data, None), "platform": platform,
                 "b": run_part(tmp_path, data, "b", exported(platform))}
    else:
        parts = runs
    found = {part: {(v.policy, v.resource, v.message) for v in evaluate(run, policies)}
             for part, run in parts.items()}
    assert found["platform"] <= found["whole"] and found["b"] <= found["whole"]
    assert found["platform"] | found["b"] == found["whole"]
    assert bool(found["whole"]) == careless
    if careless:
        assert {p for p, _, _ in found["whole"]} == {"ops-gpu-temperature-alert", "storage-bandwidth-per-gpu"}
        assert {p for p, _, _ in found["b"]} == {"storage-bandwidth-per-gpu"}
