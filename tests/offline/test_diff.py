"""A spec change shows up as exactly the resources it touches."""

from __future__ import annotations

import json

import yaml

from components.offline.diff import diff_outputs, diff_plans, render_diff
from components.offline.plan import build_plan
from components.cluster import GpuCluster
from components.spec import parse_spec
from components.types import MOVED, moved_urn
from tests.conftest import ssh_key


def plan_of(record, data):
    spec = parse_spec(yaml.safe_dump(data))
    return build_plan(record(lambda: GpuCluster(spec.name, spec, ssh_key()), stack="dev")).document


def test_a_tenant_quota_change_touches_only_that_tenant_and_its_cluster_queue(record, dev_data):
    before = plan_of(record, dev_data)
    dev_data["tenants"][0]["gpu_quota"]["h100"]["nominal"] = 8
    dev_data["tenants"][0]["cpu_cores"] = 140      # keep the derived CPU quota as it was
    dev_data["tenants"][0]["memory_gib"] = 2560
    diffs = diff_plans(before, plan_of(record, dev_data))
    changed = [(d.action, d.urn.rsplit("::", 1)[-1]) for d in diffs if not d.urn.endswith("::dev")]
    assert sorted(changed) == [("update", "dev-team-a"), ("update", "dev-team-a-cq")]   # its intent, its quota
    cq = next(d for d in diffs if d.urn.endswith("dev-team-a-cq"))
    assert [(c.path, c.old, c.new) for c in cq.changes] == [
        ("inputs.spec.resourceGroups[0].flavors[0].resources[2].nominalQuota", "10", "8")]


def test_adding_a_tenant_changes_no_other_tenant(record, dev_data):
    before = plan_of(record, dev_data)
    dev_data["tenants"][1]["gpu_quota"]["h100"]["nominal"] = 4
    dev_data["tenants"].append({"name": "team-c", "groups": {"edit": ["oidc:team-c"]}, "gpu_quota": {"h100": 2}})
    diffs = diff_plans(before, plan_of(record, dev_data))
    touched = {d.urn.rsplit("::", 1)[-1] for d in diffs if d.action != "create"}
    assert touched == {"dev-team-b", "dev-team-b-cq"}     # team-b's intent and quota; the cluster carries no spec input
    assert {d.urn.rsplit("::", 1)[-1] for d in diffs if d.action == "create"} >= {"dev-team-c", "dev-team-c-ns"}


def test_renaming_a_namespace_is_a_replacement_and_is_rendered(record, dev_data):
    before = plan_of(record, dev_data)
    dev_data["tenants"][1]["namespace"] = "team-bee"
    diffs = diff_plans(before, plan_of(record, dev_data))
    ns = next(d for d in diffs if d.urn.endswith("::dev-team-b-ns"))
    assert ns.action == "replace"
    text = render_diff(diffs, unchanged=0)
    assert '+- replace kubernetes:core/v1:Namespace dev-team-b-ns' in text
    assert 'inputs.metadata.name: "team-b" -> "team-bee"' in text


def test_identical_plans_have_no_diff(record, dev_data):
    plan = plan_of(record, dev_data)
    assert diff_plans(plan, plan) == []
    assert render_diff([], unchanged=25) == "0 to create, 0 to update, 0 to replace, 0 to delete, 25 unchanged\n"


def test_changed_outputs_and_exports_are_shown_beside_the_resources(record, dev_data):
    """Adding a host changes no existing resource, but the GPU count, topology and burn-in outputs do change."""
    before = plan_of(record, dev_data)
    before["outputs"] = {"gpus": 16}
    dev_data["sites"][0]["racks"][0]["pdu_capacity_kw"] = 60
    dev_data["node_pools"][0]["hosts"].append({"hostname": "gpu-dev-03", "address": "10.10.0.13", "rack": "r01"})
    after = plan_of(record, dev_data)
    after["outputs"] = {"gpus": 24}
    changes = {c.path: (c.old, c.new) for c in diff_outputs(before, after)}
    assert changes["exports.gpus"] == (16, 24)
    assert changes["dev-fabric.outputs.topology.leaves.leaf-dev-01.downlinks"] == (4, 6)
    text = render_diff(diff_plans(before, after), 10, diff_outputs(before, after))
    assert "Outputs:\n" in text and "  ~ exports.gpus: 16 -> 24" in text
    assert text.rstrip().endswith(f"10 unchanged; {len(changes)} output value(s) change")
    assert diff_outputs(before, before) == []


def _prod_data():
    from tests.components.storage.test_filesystem import PROD
    return yaml.safe_load(yaml.safe_dump(PROD))


def test_a_live_storage_setting_updates_the_protected_servers_in_place(record):
    """A protected server's command that is replaced fails `pulumi up` (unprotected, its delete unmounts the
    MDT under every client): client tunables, quotas and LNet settings apply live, so they are updates."""
    data = _prod_data()
    before = plan_of(record, data)
    data["storage"]["client_tunables"] = {"rpcs_in_flight": 32, "read_ahead_mib": 1024}
    data["storage"]["quotas"] = False
    diffs = diff_plans(before, plan_of(record, data))
    servers = {d.urn.rsplit("::", 1)[-1]: d.action for d in diffs if "remote:Command" in d.urn
               and any(s["hostname"] in d.urn for s in data["storage"]["servers"])}
    assert servers and set(servers.values()) == {"update"}, servers
    mgs = next(d for d in diffs if d.urn.endswith("-mds-01"))
    assert {c.path.split("[")[0] for c in mgs.changes} == {"inputs.create"}     # which an update runs again


def test_a_target_on_another_device_replaces_its_server(record):
    data = _prod_data()
    before = plan_of(record, data)
    oss = next(s for s in data["storage"]["servers"] if s["hostname"] == "oss-02")
    oss["targets"][0]["device"] = "/dev/disk/by-id/dm-ost2-new"
    diffs = diff_plans(before, plan_of(record, data))
    replaced = [d.urn.rsplit("::", 1)[-1] for d in diffs if d.action == "replace"]
    assert len(replaced) == 1 and replaced[0].endswith("-oss-02"), replaced


def test_a_read_of_a_live_object_is_read_or_discarded_never_created_or_deleted(record, dev_data):
    """A new host brings a Node read (the live taints its patch keeps): nothing is made, nothing destroyed."""
    before = plan_of(record, dev_data)
    dev_data["sites"][0]["racks"][0]["pdu_capacity_kw"] = 60
    dev_data["node_pools"][0]["hosts"].append({"hostname": "gpu-dev-03", "address": "10.10.0.13", "rack": "r01"})
    after = plan_of(record, dev_data)
    grown = {d.urn.rsplit("::", 1)[-1]: d.action for d in diff_plans(before, after)}
    assert grown["dev-h100-gpu-dev-03-live"] == "read" and grown["dev-h100-gpu-dev-03-node"] == "create"
    assert "dev-h100-gpu-dev-01-live" not in grown                 # read again each run, no change shown
    shrunk = diff_plans(after, before)
    assert {d.urn.rsplit("::", 1)[-1]: d.action for d in shrunk}["dev-h100-gpu-dev-03-live"] == "discard"
    text = render_diff(shrunk, 0)
    assert "<  discard kubernetes:core/v1:Node dev-h100-gpu-dev-03-live" in text


def test_a_host_added_mid_pool_moves_later_hosts_to_later_batches_and_changes_no_resource(record, dev_data):
    """The rollout's batches follow rack and hostname; a host sorted before another moves its drain a batch on.
    Only their dependencies change: the engine records them in a same step and runs nothing (as for any edge)."""
    before = plan_of(record, dev_data)
    dev_data["sites"][0]["racks"][0]["pdu_capacity_kw"] = 60
    dev_data["node_pools"][0]["hosts"].insert(1, {"hostname": "gpu-dev-01a", "address": "10.10.0.10", "rack": "r01"})
    after = plan_of(record, dev_data)
    old = {r["urn"]: r for r in before["resources"]}
    new = {r["urn"]: r for r in after["resources"]}
    # gpu-dev-02's batch now waits for gpu-dev-01a's, which waits for gpu-dev-01's: the point before it moves
    gate = next(u for u in old if u.endswith("::dev-h100-gpu-dev-02-batch"))
    assert old[gate]["dependsOn"] != new[gate]["dependsOn"] and any("gpu-dev-01a" in d for d in new[gate]["dependsOn"])
    assert any(u.endswith("::dev-h100-gpu-dev-01a-batch") for u in new)
    touched = {d.urn.rsplit("::", 1)[-1] for d in diff_plans(before, after) if d.action not in ("create", "read")}
    # components' intent, the detectors' lists of fabric ports and NVSwitch hosts (read on every look: no
    # pod restarts) and the
    # pool's rollout report (it waits for every host's uncordon)
    assert touched <= {"dev-h100", "dev-fabric", "dev", "dev-k8s-gpu-health-ports", "dev-k8s-gpu-nvml-hosts",
                       "dev-h100-rollout"}, touched


def _before_the_move(plan: dict) -> dict:
    """The plan as a release before the components moved to the `index` module wrote it: the earlier tokens in
    every URN, no aliases."""
    text = json.dumps(plan)
    for before, now in MOVED.items():
        text = text.replace(now, before)
    old = json.loads(text)
    for r in old["resources"]:
        (r.get("options") or {}).pop("aliases", None)
    return old


def test_a_plan_from_before_the_type_tokens_moved_matches_todays_through_the_aliases(record, dev_data):
    now = plan_of(record, dev_data)
    old = _before_the_move(now)
    assert {r["urn"] for r in old["resources"]} != {r["urn"] for r in now["resources"]}
    assert diff_plans(old, now) == []                       # the engine updates nothing: each alias names the URN
    moved = [r for r in now["resources"] if r["type"] in MOVED.values()]
    assert moved and all(r["options"]["aliases"] == [{"spec": {"type": old_type, "parentUrn": ""}}]
                         for r in moved for old_type in [k for k, v in MOVED.items() if v == r["type"]])
    dev_data["tenants"][0]["gpu_quota"]["h100"]["nominal"] = 8
    dev_data["tenants"][0].update(cpu_cores=140, memory_gib=2560)
    dev_data["tenants"].pop(1)
    dev_data["storage"]["datasets"] = []
    diffs = diff_plans(old, plan_of(record, dev_data))
    updated = {d.urn for d in diffs if d.action == "update"}
    assert "urn:pulumi:dev::gpucluster::gpucluster:index:GpuCluster$gpucluster:index:Tenant$" \
           "kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue::dev-team-a-cq" in updated
    deleted = [d.urn for d in diffs if d.action == "delete"]        # named as the state names them
    assert deleted and all("gpucluster:index:Tenant" not in u for u in deleted)
    assert any("gpucluster:k8s:Tenant$kubernetes:core/v1:Namespace::dev-team-b-ns" in u for u in deleted)


def test_moved_urns_name_every_component_of_the_chain_by_todays_token():
    old = ("urn:pulumi:dev::gpucluster::gpucluster:index:GpuCluster$gpucluster:nodes:GpuNodePool$"
           "command:remote:Command::dev-h100-gpu-dev-01-burn-in")
    assert moved_urn(old) == ("urn:pulumi:dev::gpucluster::gpucluster:index:GpuCluster$gpucluster:index:GpuNodePool$"
                              "command:remote:Command::dev-h100-gpu-dev-01-burn-in")
    assert moved_urn(moved_urn(old)) == moved_urn(old)
    assert moved_urn("urn:pulumi:dev::p::gpucluster:k8s:Tenant::a::gpucluster:k8s:Tenant") == \
        "urn:pulumi:dev::p::gpucluster:index:Tenant::a::gpucluster:k8s:Tenant"    # a name may hold "::"


def test_a_changed_quarantine_rule_is_a_new_rule_created_before_the_old_one_goes(record, dev_data):
    """Its spec is immutable and its deletion lifts its taints: a change (here from observing to enforcing)
    renames it, so the engine creates the new rule first; the diff flags a taint owner replaced delete-first."""
    before = plan_of(record, dev_data)
    assert parse_spec(yaml.safe_dump(dev_data)).kubernetes.health.quarantine.mode == "observe"
    dev_data["kubernetes"]["health"].setdefault("quarantine", {})["mode"] = "enforce"
    after = plan_of(record, dev_data)
    diffs = diff_plans(before, after)
    rule = next(d for d in diffs if d.urn.endswith("::dev-k8s-quarantine-rule"))
    assert rule.action == "replace" and not rule.delete_first
    names = [c for c in rule.changes if c.path == "inputs.metadata.name"]
    assert len(names) == 1 and names[0].old != names[0].new
    assert all(n.startswith("gpucluster-gpu-health-") for n in (names[0].old, names[0].new))
    assert "!!" not in render_diff(diffs, unchanged=0)
    for r in after["resources"]:        # as an earlier release registered it: delete-first
        if r["urn"] == rule.urn:
            r.setdefault("options", {})["deleteBeforeReplace"] = True
    text = render_diff(diff_plans(before, after), unchanged=0)
    assert "+- replace kubernetes:readiness.node.x-k8s.io/v1alpha1:NodeReadinessRule dev-k8s-quarantine-rule\n" \
        "      !! deleted before its replacement is created: a NodeReadinessRule lifts its taints from every node" in text


def test_a_kubelet_change_on_busy_hosts_also_runs_the_pools_rollout_report_as_the_engine_previews_it(record,
                                                                                                     dev_data):
    """The report's inputs are the same in both plans but computed from the uncordons' output, which the engine
    knows only once they ran: its preview shows the report changing (found by the real engine, issue 54)."""
    before = plan_of(record, dev_data)
    dev_data["node_pools"][0]["tuning"]["kubelet_topology_policy"] = "best-effort"
    diffs = {d.urn.rsplit("::", 1)[-1]: d for d in diff_plans(before, plan_of(record, dev_data))}
    report = diffs["dev-h100-rollout"]
    assert report.action == "update"
    assert {c.path for c in report.changes} >= {"inputs.environment.GPUCLUSTER_ROUND"}
    assert all(c.new.startswith("<computed>, known once dev-h100-gpu-dev-01-uncordon, dev-h100-gpu-dev-02-uncordon")
               for c in report.changes)


def _entry(name, kind, inputs, deps=None):
    return {"urn": f"urn:pulumi:dev::p::{kind}::{name}", "type": kind, "custom": True, "inputs": inputs,
            "propertyDependencies": {k: [f"urn:pulumi:dev::p::{t}::{n}" for t, n in v] for k, v in (deps or {}).items()}}


def test_what_waits_on_a_running_command_follows_the_chain_and_stops_at_known_values():
    cmd, k8s = "command:local:Command", "kubernetes:core/v1:ConfigMap"
    def plan(script, data):
        return {"resources": [
            _entry("a", cmd, {"create": script}),
            _entry("b", cmd, {"environment": {"X": "<computed>"}}, {"environment": [(cmd, "a")]}),
            _entry("c", cmd, {"environment": {"Y": "<computed>"}}, {"environment": [(cmd, "b")]}),
            _entry("d", cmd, {"environment": {"Z": "known"}}, {"environment": [(cmd, "a")]}),
            _entry("m", k8s, {"data": data}),
            _entry("e", cmd, {"environment": {"W": "<computed>"}}, {"environment": [(k8s, "m")]})]}
    diffs = {d.urn.rsplit("::", 1)[-1]: d.action for d in diff_plans(plan("one", "x"), plan("two", "y"))}
    # b waits on a, c on b; d's value is known; a ConfigMap's update is previewed by the server's dry run
    assert diffs == {"a": "update", "b": "update", "c": "update", "m": "update"}
    assert diff_plans(plan("one", "x"), plan("one", "x")) == []
