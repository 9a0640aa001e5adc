"""Retiring a host: the order Pulumi deletes a removed host's resources in (the reverse of their dependencies),
what the steps are, and that a removed host changes nothing else."""

from __future__ import annotations

import yaml

from components.nodes.retire import POOL_FILE, render_retirement, undo_guard
from components.offline.diff import diff_plans
from components.offline.plan import build_plan
from components.offline.runner import run_program
from components.bash import SKIP_REST
from tests.conftest import ROOT


def plan_of(data, tmp_path):
    """The dev stack's plan with `data` as its spec."""
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return build_plan(run_program(ROOT, "dev", spec_file=path))


def test_a_removed_hosts_resources_are_deleted_drain_first_and_node_last():
    """Pulumi deletes dependents before what they depend on, so each step must (transitively) depend on the
    one deleted after it: retire -> Node patch -> filesystem client -> preparation -> leave -> deregister."""
    plan = build_plan(run_program(ROOT, "dev")).document["resources"]
    by_name = {r["urn"].rsplit("::", 1)[-1]: r for r in plan}
    urn_name = {r["urn"]: n for n, r in by_name.items()}

    def reaches(a: str, b: str) -> bool:
        seen, todo = set(), [a]
        while todo:
            n = todo.pop()
            if n == b:
                return True
            if n not in seen:
                seen.add(n)
                r = by_name[n]     # the state's dependencies: dependsOn and every input's
                deps = [*r["dependsOn"], *(u for us in r["propertyDependencies"].values() for u in us)]
                todo += [urn_name[u] for u in deps if u in urn_name]
        return False
    for host in ("gpu-dev-01", "gpu-dev-02"):
        order = [f"dev-h100-{host}-retire", f"dev-h100-{host}-node", f"dev-storage-{host}",
                 f"dev-h100-{host}-prepare", f"dev-h100-{host}-leave", f"dev-h100-{host}-deregister"]
        for later, earlier in zip(order, order[1:]):
            assert reaches(later, earlier), f"{later} does not depend on {earlier}: deleted in the wrong order"
        retire, deregister = by_name[order[0]]["inputs"], by_name[order[-1]]["inputs"]
        for step in (retire, deregister):     # they act only when deleted, with the stack's kubeconfig
            assert "create" not in step and "update" not in step and step["delete"].startswith("#!/usr/bin/env")
        leave = by_name[order[-2]]["inputs"]
        assert "triggers" not in leave and "update" not in leave     # a new text never leaves: `create` runs again


def test_the_steps_drain_with_budgets_and_delete_only_this_pools_node(dev_spec):
    pool, host = dev_spec.node_pools[0], dev_spec.node_pools[0].hosts[0]
    steps = render_retirement(pool, host, sorted(dev_spec.system_namespaces))
    assert "drain \"$HOST\" --ignore-daemonsets --delete-emptydir-data --timeout=3600s" in steps.retire
    assert "--force" not in steps.retire and "--disable-eviction" not in steps.retire
    assert "gpucluster.io/rollout=$value:NoSchedule" in steps.retire and "value=retiring" in steps.retire
    for text in (steps.retire, steps.deregister):
        assert "{.metadata.labels.gpucluster\\.io/pool}" in text and '"$pool" != h100' in text
    assert steps.deregister.count('delete node "$HOST"') == 1
    assert f"put_file {POOL_FILE} 0644 h100" in steps.membership.create
    assert "systemctl disable --now kubelet" in steps.membership.delete
    assert f"exit {SKIP_REST}" in undo_guard(pool, host)


def test_removing_a_host_changes_nothing_that_stays(dev_data, tmp_path):
    """The plan with a third host, then without it: every resource of the two others is as it was, so the
    engine acts only on the removed host's (which it deletes)."""
    def plan(data):
        return {r["urn"]: r for r in plan_of(data, tmp_path).document["resources"]}
    dev_data["sites"][0]["racks"][0]["pdu_capacity_kw"] = 60
    dev_data["node_pools"][0]["hosts"].append({"hostname": "gpu-dev-03", "address": "10.10.0.13", "rack": "r01"})
    with_three = plan(dev_data)
    dev_data["node_pools"][0]["hosts"].pop()
    with_two = plan(dev_data)
    gone = set(with_three) - set(with_two)
    assert gone and all("gpu-dev-03" in u for u in gone)
    changed = {u.rsplit("::", 1)[-1] for u in with_two if with_two[u] != with_three[u]}
    assert not {n for n in changed if "gpu-dev-0" in n}, changed


def test_replaced_hardware_prepares_the_host_again_and_burns_it_in_anew(dev_data, tmp_path):
    """`hosts[].hardware_id` changed (same name, new hardware): preparation updates (runs again), the burn-in is
    replaced (a new one, whatever the old verdict), and nothing of any other host changes."""
    def plan(hardware_id):
        dev_data["node_pools"][0]["hosts"][0]["hardware_id"] = hardware_id
        return plan_of(dev_data, tmp_path)
    changes = {d.urn.rsplit("::", 1)[-1]: d.action for d in diff_plans(plan("SN-0001").document,
                                                                       plan("SN-0002").document)
               if d.action not in ("same", "read")}
    host = {k: v for k, v in changes.items() if "gpu-dev-01" in k and not k.endswith(("-drain", "-roll", "-uncordon"))}
    # and its Node's patch, whose annotations and taints carry the new burn-in's verdict (known once it ran)
    assert host == {"dev-h100-gpu-dev-01-prepare": "update", "dev-h100-gpu-dev-01-burn-in": "replace",
                    "dev-h100-gpu-dev-01-node": "update"}, changes
    assert not [k for k in changes if "gpu-dev-02" in k], changes
