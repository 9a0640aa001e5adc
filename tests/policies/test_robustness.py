"""No policy raises on anything a program can register, and every workload kind is read where it keeps its pods.

A policy that raises fails `pulumi preview` as a whole (the engine gets a traceback from the analyzer). The pack
guards each policy (a defect is reported as a finding, never raised); these tests hold the policies themselves
to never reaching that guard: real stacks with values replaced by odd but legal ones (hex and octal numbers,
empty lists, unknowns, secrets, strings where numbers were), and every workload kind a tenant can submit.
"""

from __future__ import annotations

import copy
from typing import Any

import pulumi
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pulumi.runtime import rpc as _rpc
from pulumi_policy import EnforcementLevel, ResourceValidationPolicy

from components.offline.policy import evaluate
from tests.policies.conftest import POLICIES, _set, changed, findings, with_resource

from gpucluster_policies.common import WORKLOADS, _path, guarded     # noqa: I001 - on the path once conftest loaded it

GUARD = "could not check"

_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2 ** 40), 2 ** 40),
    st.floats(allow_nan=False, allow_infinity=False, width=32), st.text(max_size=6),
    st.sampled_from(["0x6a", "0X1A", "0o17", "0152", "017", "1e3", " 42 ", "-1", "", "^=mlx5_0", "=mlx5_1",
                     "^mlx5_2", "mlx5_0:1", "*", "NaN", "3.5", "None", "true", "[]", "{}"]),
)
ODD = st.one_of(
    _SCALARS,
    st.just([]), st.just({}), st.lists(_SCALARS, max_size=3), st.dictionaries(st.text(max_size=4), _SCALARS,
                                                                             max_size=2),
    st.just(pulumi.output.Unknown()),
    _SCALARS.map(_rpc.wrap_rpc_secret),
)


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(value, dict) and not _rpc.is_rpc_secret(value):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


def _targets(run) -> list[tuple[int, tuple]]:
    """(record index, path) of every value the program registered: a custom resource's inputs, a component's
    outputs (what stack policies read)."""
    out = []
    for i, r in enumerate(run.records):
        value = r.inputs if r.custom else run.component_outputs.get(r.urn, {})
        out += [(i, p) for p in _paths(value)]
    return out


def _replace(run, edits: list[tuple[int, tuple, Any]]):
    out = copy.deepcopy(run)
    for i, path, value in edits:
        r = out.records[i]
        obj = r.inputs if r.custom else out.component_outputs.setdefault(r.urn, {})
        for key in path[:-1]:
            obj = obj[key]
        obj[path[-1]] = value
    return out


def _guarded(run) -> list[str]:
    return [f"{v.policy}: {v.message}" for v in evaluate(run, POLICIES) if GUARD in v.message]


@pytest.mark.parametrize("stack", ["dev", "prod"])
@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_no_policy_raises_on_odd_values_anywhere(stack, data, request):
    run = request.getfixturevalue(f"{stack}_run")
    targets = _targets(run)
    chosen = data.draw(st.lists(st.sampled_from(targets), min_size=1, max_size=4, unique=True))
    edits = [(i, path, data.draw(ODD)) for i, path in sorted(chosen, key=lambda t: -len(t[1]))]
    assert _guarded(_replace(run, edits)) == []


@pytest.mark.parametrize("tc", ["0x6a", "0X6A", "0152", " 106", "106.0"])
def test_nccl_ib_tc_is_read_as_nccl_reads_it(tc, dev_run):
    """NCCL reads its integer settings with strtoll(value, NULL, 0): 0x6a and 0152 are 106 (DSCP 26), which
    matches the dev fabric; nothing is reported and nothing raises."""
    run = changed(dev_run, "dev-team-b-nccl-h100", _set(["data", "NCCL_IB_TC"], tc))
    assert findings(run, "fabric-qos-consistent") == []


def test_an_unreadable_nccl_ib_tc_is_named_not_raised(dev_run):
    run = changed(dev_run, "dev-team-b-nccl-h100", _set(["data", "NCCL_IB_TC"], "high"))
    assert findings(run, "fabric-qos-consistent") == [
        "ConfigMap team-b/nccl-h100 set NCCL_IB_TC='high', which NCCL reads as 0 (DSCP 0, best effort) but hosts and "
        "switches carry RoCE on DSCP 26; set NCCL_IB_TC=106"]


def test_a_policy_that_raises_is_reported_under_its_name_not_raised(dev_run):
    """The guard itself: a defect in a policy becomes a finding at the policy's own level, naming the resource."""

    def broken(args, report):
        if args.name == "dev-team-a-ns":
            raise KeyError("spec")
    policy = ResourceValidationPolicy(name="k8s-broken", description="Checks nothing.",
                                      enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(broken))
    [v] = evaluate(dev_run, [policy])
    assert (v.policy, v.level) == ("k8s-broken", "mandatory")
    assert v.message.startswith("could not check resource dev-team-a-ns: KeyError: 'spec'.")


# --- every workload kind -------------------------------------------------------------------------------------

def _planted(keys: list[str], pod: dict[str, Any]) -> Any:
    """An object with `pod` where the table's path `keys` leads (a list of one named item, a map of one role)."""
    if not keys:
        return copy.deepcopy(pod)
    key, rest = keys[0], keys[1:]
    if key == "[]":
        return [{"name": "workers", **_planted(rest, pod)}]
    return {"Worker" if key == "{}" else key.replace("*", "pytorch"): _planted(rest, pod)}


def _merge(into: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    for k, v in more.items():
        if isinstance(into.get(k), dict) and isinstance(v, dict):
            _merge(into[k], v)
        else:
            into[k] = v
    return into


@pytest.mark.parametrize("group,kind", sorted(WORKLOADS))
def test_every_workload_kind_is_held_to_the_workload_policies(group, kind, dev_run):
    """A privileged pod asking for GPUs without a limit, in a tenant namespace without a queue: each workload
    policy finds it in every kind, wherever that kind keeps its pod templates."""
    pod = {"containers": [{"name": "main", "image": "registry.example/x:1", "securityContext": {"privileged": True},
                           "resources": {"requests": {"nvidia.com/gpu": 1}}}]}
    workload = WORKLOADS[(group, kind)]
    obj: dict[str, Any] = {"metadata": {"name": "w", "namespace": "team-a"}}
    for _, path in workload.pods:
        _merge(obj, _planted(_path(path), pod))
    run = with_resource(dev_run, f"kubernetes:{group}/v1:{kind}", "w", obj)
    assert findings(run, "k8s-gpu-limits"), kind
    assert any("privileged container main" in m for m in findings(run, "k8s-no-host-access")), kind
    assert any("has no kueue.x-k8s.io/queue-name label" in m for m in findings(run, "k8s-tenant-queue-name")), kind


@pytest.mark.parametrize("spec_json", ["{not json", "0x10", 42, None, "[]", '{"validation": {"dcgm_image": 7}}',
                                       '{"a_image": ["x:latest"], "b": [{"c_image": null}]}'])
def test_a_cluster_spec_text_that_is_not_the_library_s_is_read_as_absent(dev_run, spec_json):
    assert _guarded(changed(dev_run, "dev", _set(["spec_json"], spec_json))) == []


def test_policies_see_a_moved_components_earlier_urn_among_its_aliases(dev_run):
    """As the engine hands them to analyzers: URNs, the component's own under its earlier type token."""
    seen: dict[str, list[str]] = {}

    def aliases(args, report):
        if args.resource_type in ("gpucluster:index:Tenant", "gpucluster:index:GpuCluster"):
            seen[args.name] = list(args.opts.aliases)
    evaluate(dev_run, [ResourceValidationPolicy(name="k8s-aliases", description="Records aliases.",
                                                enforcement_level=EnforcementLevel.ADVISORY, validate=aliases)])
    tenant = next(r for r in dev_run.records if r.name == "dev-team-a")
    assert seen["dev"] == [] and seen["dev-team-a"] == [tenant.urn.replace("$gpucluster:index:Tenant::",
                                                                       "$gpucluster:k8s:Tenant::")]
    assert "gpucluster:k8s:Tenant" not in tenant.urn
