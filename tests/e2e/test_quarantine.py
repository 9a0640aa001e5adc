"""Quarantine on the real control plane: the plan's NodeReadinessRule as the apiserver accepts it (CEL included),
a GPU fault reported by the real node-problem-detector, the taint the rule calls for (readiness.py: the one
stand-in, for node-readiness-controller, which cannot run here), then Kubernetes' taint eviction and the real
Kueue requeueing the job elsewhere, and the node released only by a burn-in after the reboot."""

from __future__ import annotations

import copy
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from components.k8s.health.detector import (BLIND_CONDITION, BURN_IN_CONDITION, CONDITION, PORT_CONDITION, PORTS_FILE,
                                   RESET_CONDITION)
from components.k8s.health.nvml import NVLINK_CONDITION, TEMPERATURE_CONDITION, HOT_SINCE
from components.k8s.labels import QUARANTINE_TAINT, RESET_TAINT
from components.k8s.health.quarantine import GRANT_LABEL, HELD_ANNOTATION, RESET_RULE, RULE, RULE_LABEL

from . import readiness
from .conftest import Cluster, wait_for
from .detector import DBE, FELL_OFF, Detector, NvmlDetector
from .scenarios import Grant, grants

pytestmark = pytest.mark.e2e

SAMPLES = Path(__file__).resolve().parents[1] / "samples"
QUERY = (SAMPLES / "nvidia_smi_q_h800.txt").read_text()         # real `nvidia-smi -q`: GPU 00000000:18:00.0 at 35 C
NVLINK_OK = (SAMPLES / "nvidia_smi_nvlink_s_8xh100.txt").read_text()
NVLINK_DEGRADED = (SAMPLES / "nvidia_smi_nvlink_s_degraded.txt").read_text()


def plan_rule(c: Cluster, name: str = RULE) -> dict[str, Any]:
    """The plan's rule `name` (quarantine.RULE or RESET_RULE), whose object name ends in its spec's digest."""
    (rule,) = [o for o in c.plan.objects if o["kind"] == "NodeReadinessRule"
               and o["metadata"]["labels"][RULE_LABEL] == name]
    assert rule["metadata"]["name"].startswith(f"{name}-")
    return rule


def test_the_rule_is_served_and_its_immutable_fields_refuse_an_in_place_change(cluster: Cluster):
    """The apiserver evaluates the CRD's CEL: a changed taint or condition list is refused, so a changed rule is
    a new one (its name carries its spec's digest), created before the old one is deleted."""
    name = plan_rule(cluster)["metadata"]["name"]
    served = cluster.cp.get("nodereadinessrules.readiness.node.x-k8s.io", name)
    assert served["spec"]["conditions"] == plan_rule(cluster)["spec"]["conditions"]
    effect = served["spec"]["taint"]["effect"]
    other = "NoSchedule" if effect == "NoExecute" else "NoExecute"
    for patch, message in (({"spec": {"taint": {"effect": other}}}, "taint effect is immutable"),
                           ({"spec": {"conditions": [served["spec"]["conditions"][0]]}}, "conditions is immutable")):
        proc = cluster.cp.kubectl("patch", "nodereadinessrules.readiness.node.x-k8s.io", name, "--type=merge",
                                  "--dry-run=server", "-p", json.dumps(patch), check=False)
        assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    bad = copy.deepcopy(plan_rule(cluster))
    bad["metadata"]["name"] = "not-readiness-prefixed"
    bad["spec"]["taint"]["key"] = "gpucluster.io/gpu-health"
    proc = cluster.cp.apply_objects([bad], dry_run=True, check=False)
    assert proc.returncode != 0 and "taint key must start with 'readiness.k8s.io/'" in proc.stderr, proc.stderr


def _unquarantine(c: Cluster) -> None:
    """The next test's nodes as the spec has them: no quarantine taint, breaker grant or hold."""
    for node in c.nodes().values():
        taints = node["spec"].get("taints") or []
        meta = node["metadata"]
        if any(t["key"] in (QUARANTINE_TAINT, RESET_TAINT) for t in taints) or \
                GRANT_LABEL in (meta.get("labels") or {}) or HELD_ANNOTATION in (meta.get("annotations") or {}):
            c.cp.kubectl("patch", "node", meta["name"], "--type=merge", "-p", json.dumps(
                {"metadata": {"labels": {GRANT_LABEL: None}, "annotations": {HELD_ANNOTATION: None}},
                 "spec": {"taints": [t for t in taints if t["key"] not in (QUARANTINE_TAINT, RESET_TAINT)]}}))


def _enforced_rule(c: Cluster) -> readiness.Quarantine:
    """The plan's quarantine: its rules and its breaker, each pass as readiness.Quarantine.settle runs them."""
    if plan_rule(c)["spec"]["dryRun"]:
        pytest.skip(f"{c.plan.stack} observes only (kubernetes.health.quarantine.mode: observe)")
    return readiness.Quarantine.of(c.plan.objects)


def _watched(c: Cluster, node: str, work: Path) -> Detector:
    """The detector on `node`, healthy, with the verdict of the burn-in that admitted it."""
    d = Detector(c, node, work)
    d.burn_in()
    d.start()
    d.wait_condition("False", "NoGpuHardwareXid")
    d.wait_condition("False", "NoFaultSinceBurnIn", BURN_IN_CONDITION)
    return d


def _fault(c: Cluster, d: Detector, rule: dict[str, Any]) -> None:
    """A double-bit ECC error (NVIDIA: its diagnosis); the detector reports it and the rule taints the node."""
    assert not readiness.reconcile(c.cp, rule, d.node)
    d.kernel(DBE)
    d.wait_condition("True", "GpuXid48")
    d.wait_condition("True", "FaultSinceBurnIn", BURN_IN_CONDITION)
    assert readiness.reconcile(c.cp, rule, d.node)


def _one_gpu_job(c: Cluster, name: str) -> tuple[Grant, dict[str, Any], dict[str, Any], str]:
    """A tenant's one-GPU job, running on a pool of two hosts or more: its grant, the job, its pod, its node."""
    g = next((g for g in grants(c.spec) if g.nominal and len(g.pool.hosts) > 1), None)
    if g is None:
        pytest.skip("no tenant holds GPUs on a pool of two hosts or more")
    job = c.submit(c.job(g.tenant, g.pool, name, pods=1, gpus_per_pod=1))
    c.wait_admitted(job)
    (pod,) = c.wait_running(job)
    return g, job, pod, pod["spec"]["nodeName"]


def _new_work_avoids(c: Cluster, g: Grant, node: str, name: str) -> None:
    """As many one-GPU pods as the rest of the pool and the quota hold: none lands on `node`."""
    more = min(g.pool.gpu_units_per_host * (len(g.pool.hosts) - 1), g.nominal + g.borrowable) - 1
    if more > 0:
        others = c.submit(c.job(g.tenant, g.pool, name, pods=more, gpus_per_pod=1))
        c.wait_admitted(others)
        assert node not in {p["spec"]["nodeName"] for p in c.wait_running(others)}
        c.delete_jobs(others)


def _placed_on(c: Cluster, job: dict[str, Any]) -> set[str]:
    wl = c.workload(job)
    return {v for ps in wl["status"]["admission"]["podSetAssignments"]
            for sl in ps["topologyAssignment"]["slices"] for v in _values(sl)}


def _values(slice_: dict[str, Any]) -> list[str]:
    """Node names of one slice of a topology assignment (Kueue 0.19's encoding: one universal value, or
    individual roots between a common prefix and suffix: TopologyAssignmentSliceLevelValues)."""
    level = slice_["valuesPerLevel"][-1]
    if "universal" in level:
        return [level["universal"]]
    ind = level["individual"]
    return [ind.get("prefix", "") + root + ind.get("suffix", "") for root in ind["roots"]]


def test_a_gpu_fault_drains_the_node_kueue_moves_the_job_and_only_a_burn_in_releases_it(clean: Cluster,
                                                                                        tmp_path: Path):
    rule = _enforced_rule(clean)
    g, job, pod, node = _one_gpu_job(clean, "on-a-faulty-gpu")
    assert _placed_on(clean, job) == {node}
    d = _watched(clean, node, tmp_path)
    try:
        _fault(clean, d, rule)
        # Kubernetes evicts the pod (NoExecute, untolerated); Kueue finds the job's node failed and assigns it
        # a healthy one (TASFailedNodeReplacement), where the Job's new pod runs.
        def moved() -> list[dict[str, Any]] | None:
            pods = [p for p in clean.pods(job) if not p["metadata"].get("deletionTimestamp")]
            running = [p for p in pods if p["status"].get("phase") == "Running" and p["spec"].get("nodeName")]
            return running if running and all(p["spec"]["nodeName"] != node for p in running) and \
                pod["metadata"]["uid"] not in {p["metadata"]["uid"] for p in pods} else None
        (new,) = wait_for(moved, 120, lambda: f"job not moved off {node}: {clean._why(job)}; pods "
                          f"{[(p['spec'].get('nodeName'), p['status'].get('phase')) for p in clean.pods(job)]}")
        assert clean.admission(job).admitted and _placed_on(clean, job) == {new["spec"]["nodeName"]}

        _new_work_avoids(clean, g, node, "after-the-fault")

        d.reboot()                                       # the fault is fixed and the host rebooted
        d.wait_condition("False", "NoGpuHardwareXid")
        d.wait_condition("True", "FaultSinceBurnIn", BURN_IN_CONDITION)
        assert readiness.reconcile(clean.cp, rule, node)      # still held: no burn-in since the fault

        d.burn_in("failed: dcgmi diag -r 2 failed")
        d.wait_condition("True", "FaultSinceBurnIn", BURN_IN_CONDITION)
        assert readiness.reconcile(clean.cp, rule, node)

        d.burn_in()                                      # `pulumi up --replace` of the host's burn-in: it passed
        d.wait_condition("False", "NoFaultSinceBurnIn", BURN_IN_CONDITION)
        assert not readiness.reconcile(clean.cp, rule, node)
        assert not any(t["key"] == QUARANTINE_TAINT for t in clean.nodes()[node]["spec"].get("taints") or [])
    finally:
        d.forget()
        _unquarantine(clean)
        clean.delete_jobs(job)


def test_with_no_healthy_room_left_kueue_evicts_the_job_and_readmits_it_once_the_node_is_released(
        clean: Cluster, tmp_path: Path):
    """The whole pool busy: no node can replace the faulty one, so Kueue evicts the workload
    (TASFailedNodeReplacementFailFast) and it waits in its queue, neither running on the quarantined node nor
    hanging, until a burn-in releases the node."""
    rule = _enforced_rule(clean)
    g = next((g for g in grants(clean.spec) if len(g.pool.hosts) > 1 and
              g.nominal + g.borrowable >= g.pool.gpu_units_per_host * len(g.pool.hosts)), None)
    if g is None:
        pytest.skip("no tenant can hold a whole pool of two hosts or more")
    per_host, hosts = g.pool.gpu_units_per_host, len(g.pool.hosts)
    job = clean.submit(clean.job(g.tenant, g.pool, "whole-node", pods=1, gpus_per_pod=per_host))
    clean.wait_admitted(job)
    (pod,) = clean.wait_running(job)
    node = pod["spec"]["nodeName"]
    rest = clean.submit(clean.job(g.tenant, g.pool, "rest-of-the-pool", pods=hosts - 1, gpus_per_pod=per_host))
    clean.wait_admitted(rest)
    clean.wait_running(rest)
    d = _watched(clean, node, tmp_path)
    try:
        _fault(clean, d, rule)

        def evicted() -> dict[str, Any] | None:
            a = clean.admission(job)
            conditions = {c["type"]: c for c in a.workload["status"].get("conditions", [])} if a else {}
            return conditions if not a.admitted and conditions.get("Evicted", {}).get("status") == "True" else None
        conditions = wait_for(evicted, 120, lambda: f"{clean._why(job)}; pods " + str(
            [(p["spec"].get("nodeName"), p["status"].get("phase"), bool(p["metadata"].get("deletionTimestamp")))
             for p in clean.pods(job)]))
        assert conditions["Evicted"]["reason"] == conditions["Requeued"]["reason"] == "NodeFailures", conditions
        assert node in conditions["Evicted"]["message"]
        # Requeued with nowhere to go, and Kueue says why; the evicted pod has terminated (the Job keeps it,
        # failed, while it is suspended).
        excluded = re.compile(f'taint "{re.escape(QUARANTINE_TAINT)}=gpu-fault:No(Schedule|Execute)": 1')
        wait_for(lambda: (a := clean.admission(job)) and not a.admitted and excluded.search(a.message), 60,
                 lambda: f"no pending reason naming the quarantine: {clean._why(job)}")
        time.sleep(5)
        assert not clean.admission(job).admitted
        assert all(p["status"].get("phase") in ("Failed", "Succeeded") for p in clean.pods(job))
        d.reboot()
        d.wait_condition("False", "NoGpuHardwareXid")
        d.burn_in()
        d.wait_condition("False", "NoFaultSinceBurnIn", BURN_IN_CONDITION)
        assert not readiness.reconcile(clean.cp, rule, node)
        clean.wait_admitted(job, 120)
        assert {p["spec"]["nodeName"] for p in clean.wait_running(job)} == {node}
    finally:
        d.forget()
        _unquarantine(clean)
        clean.delete_jobs(job, rest)


def test_a_gpu_that_needs_a_reset_takes_no_new_work_its_running_job_runs_on_and_the_reboot_frees_it(
        clean: Cluster, tmp_path: Path):
    """XID 79 (NVIDIA: restart the machine): the reset rule's NoSchedule taint, not the quarantine. The job on the
    node keeps running (no eviction), new pods go elsewhere, and the reboot alone releases the node."""
    _enforced_rule(clean)
    reset_rule = plan_rule(clean, RESET_RULE)
    assert reset_rule["spec"]["taint"] == {"key": RESET_TAINT, "value": "gpu-reset", "effect": "NoSchedule"}
    g, job, pod, node = _one_gpu_job(clean, "beside-a-reset")
    d = _watched(clean, node, tmp_path)
    try:
        d.kernel(FELL_OFF)
        d.wait_condition("True", "GpuXid79", RESET_CONDITION)
        assert readiness.reconcile(clean.cp, reset_rule, node)
        assert not readiness.reconcile(clean.cp, plan_rule(clean), node)          # no quarantine, no burn-in
        _new_work_avoids(clean, g, node, "while-it-waits")
        time.sleep(3)
        still = [p for p in clean.pods(job) if p["metadata"]["uid"] == pod["metadata"]["uid"]]
        assert still and still[0]["status"].get("phase") == "Running" and \
            not still[0]["metadata"].get("deletionTimestamp")                  # the running job runs on
        d.reboot()
        d.wait_condition("False", "NoGpuResetPending", RESET_CONDITION)
        assert not readiness.reconcile(clean.cp, reset_rule, node)
    finally:
        d.forget()
        _unquarantine(clean)
        clean.delete_jobs(job)


def test_a_fabric_port_that_goes_down_quarantines_the_node_until_it_is_back_and_burned_in(clean: Cluster,
                                                                                          tmp_path: Path):
    """The detector's port plugin over the host's RDMA ports (a stand-in for /sys/class/infiniband), with the
    node's name from the detector's environment as the DaemonSet sets it."""
    rule = _enforced_rule(clean)
    node = next((h.hostname for p in clean.spec.node_pools if p.nics for h in p.hosts), None)
    if node is None or not clean.spec.fabric.rdma:
        pytest.skip("no GPU host with RDMA NICs")
    d = _watched(clean, node, tmp_path)
    try:
        d.wait_condition("False", "FabricPortsActive", PORT_CONDITION)
        port = d.ports[-1]
        d.port(port, "1: DOWN", "2: Polling", 1)
        held = d.wait_condition("True", "FabricPortDownOrFlapping", PORT_CONDITION)
        assert f"{port}: DOWN/Polling" in held["message"]
        d.wait_condition("True", "FaultSinceBurnIn", BURN_IN_CONDITION)
        assert readiness.reconcile(clean.cp, rule, node)
        d.port(port, "4: ACTIVE", "5: LinkUp")            # the cable is reseated
        d.wait_condition("False", "FabricPortsActive", PORT_CONDITION)
        d.wait_condition("True", "FaultSinceBurnIn", BURN_IN_CONDITION)
        assert readiness.reconcile(clean.cp, rule, node)      # still held: no burn-in since
        d.burn_in()
        d.wait_condition("False", "NoFaultSinceBurnIn", BURN_IN_CONDITION)
        assert not readiness.reconcile(clean.cp, rule, node)
    finally:
        d.forget()
        _unquarantine(clean)


def test_a_detector_that_cannot_read_its_inputs_holds_no_node_and_says_it_is_blind(clean: Cluster, tmp_path: Path):
    """The real node-problem-detector with its checks' inputs gone (the boot id, the ports file: a broken image or
    a missing ConfigMap on every node at once): their conditions keep the last verdict, never Unknown, so the rule
    taints nothing; GpuHealthCheckBlind, which the rule does not read, says which check and why. A fault seen
    before the inputs went stays held."""
    rule = _enforced_rule(clean)
    node = next((h.hostname for p in clean.spec.node_pools if p.nics for h in p.hosts), None)
    if node is None or not clean.spec.fabric.rdma:
        pytest.skip("no GPU host with RDMA NICs")
    assert BLIND_CONDITION not in {c["type"] for c in rule.hold["spec"]["conditions"]}
    d = _watched(clean, node, tmp_path)
    try:
        d.wait_condition("False", "HealthChecksReading", BLIND_CONDITION)
        d.boot_id.unlink()
        (tmp_path / PORTS_FILE).unlink()
        blind = d.wait_condition("True", "HealthCheckWithoutReading", BLIND_CONDITION)
        assert "gpu-burn-in-last: cannot read the boot id" in blind["message"], blind
        # (a check that exits 0 sets its condition's healthy reason and message: the detector keeps no output)
        time.sleep(3)
        assert d.condition(BURN_IN_CONDITION)["status"] == d.condition(PORT_CONDITION)["status"] == "False"
        assert not readiness.reconcile(clean.cp, rule, node)
        d.boot_id.write_text("boot-1\n")
        _fault(clean, d, rule)                              # a real fault, then the kernel log unreadable
        d.log.unlink()
        d.wait_condition("True", "HealthCheckWithoutReading", BLIND_CONDITION)
        time.sleep(3)                                       # a few more looks: the fault's verdict stands
        assert d.condition(BURN_IN_CONDITION)["status"] == "True"
        assert readiness.reconcile(clean.cp, rule, node)
    finally:
        d.forget()
        _unquarantine(clean)


def test_a_gpu_that_stays_too_hot_or_loses_an_nvlink_quarantines_the_node_until_a_burn_in(clean: Cluster,
                                                                                         tmp_path: Path):
    """The real NVML detector beside the real kernel detector on one node, each patching its own conditions;
    nvidia-smi prints real captures. Its looks of the last eleven minutes are the state file it keeps."""
    rule = _enforced_rule(clean)
    if TEMPERATURE_CONDITION not in {c["type"] for c in rule.hold["spec"]["conditions"]}:
        pytest.skip("the stack does not quarantine on temperature")
    node = next((h.hostname for p in clean.spec.node_pools if p.gpu.nvswitch for h in p.hosts), None)
    if node is None:
        pytest.skip("no GPU host on an NVSwitch board")
    d = _watched(clean, node, tmp_path)
    n = NvmlDetector(d, tmp_path)
    n.smi(QUERY, NVLINK_OK)
    n.start()
    try:
        d.wait_condition("False", "GpuTemperatureNormal", TEMPERATURE_CONDITION)
        d.wait_condition("False", "NvlinksUp", NVLINK_CONDITION)
        assert not readiness.reconcile(clean.cp, rule, node)
        limit = clean.spec.kubernetes.monitoring.gpu_temperature_limit_c
        n.smi(QUERY.replace("GPU Current Temp                  : 35 C",
                            f"GPU Current Temp                  : {limit + 6} C"), NVLINK_OK)
        since = d.state / HOT_SINCE
        wait_for(lambda: since.exists() and since.read_text().strip(), 30, lambda: "no look above the limit")


        def hot_for_eleven_minutes() -> dict[str, Any] | None:
            # Rewritten until the detector reads it: a look may have read the file just before a write.
            now = int(time.time())
            since.write_text(f"00000000:18:00.0 {now - 660} {now}\n")
            x = d.condition(TEMPERATURE_CONDITION)
            return x if x and x["status"] == "True" else None
        held = wait_for(hot_for_eleven_minutes, 60, lambda: f"{d.condition(TEMPERATURE_CONDITION)}\n"
                                                            f"{n.out.read_text()[-2000:]}")
        assert held["reason"] == "GpuAboveTemperatureLimit"
        assert f"GPU 00000000:18:00.0 at {limit + 6} C for 11 min" in held["message"]
        d.wait_condition("True", "FaultSinceBurnIn", BURN_IN_CONDITION)
        assert d.condition()["status"] == "False"           # the kernel detector's condition is its own
        assert readiness.reconcile(clean.cp, rule, node)
        n.smi(QUERY, NVLINK_OK)                               # the fan is replaced: 35 C again
        d.wait_condition("False", "GpuTemperatureNormal", TEMPERATURE_CONDITION)
        assert readiness.reconcile(clean.cp, rule, node)      # held until a burn-in passes
        d.burn_in()
        d.wait_condition("False", "NoFaultSinceBurnIn", BURN_IN_CONDITION)
        assert not readiness.reconcile(clean.cp, rule, node)
        n.smi(QUERY, NVLINK_DEGRADED)                         # while jobs run, a link drops out
        down = d.wait_condition("True", "NvlinkDownOrDegraded", NVLINK_CONDITION)
        assert down["message"].startswith(f"NVLink down on {node}: GPU ")
        assert readiness.reconcile(clean.cp, rule, node)
    finally:
        n.stop()
        d.forget()
        _unquarantine(clean)


def _set_fault(c: Cluster, node: str, status: str) -> None:
    """GpuHardwareFault as the detector writes it (the detector itself is proven above)."""
    c.cp.kubectl("patch", "node", node, "--subresource=status", "--type=strategic", "-p", json.dumps(
        {"status": {"conditions": [{"type": CONDITION, "status": status,
                                    "reason": "GpuXid48" if status == "True" else "NoGpuHardwareXid",
                                    "message": "e2e: the breaker's test", "lastHeartbeatTime": _now(),
                                    "lastTransitionTime": _now()}]}}))


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _sleeper(c: Cluster, ns: str, node: str) -> str:
    """A pod on `node` that tolerates the node's taints of now, so only a quarantine taint evicts it."""
    taints = c.nodes()[node]["spec"].get("taints") or []
    name = f"on-{node}"
    c.cp.apply_objects([{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
                         "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}],
                                  "tolerations": [{"key": t["key"], "operator": "Exists", "effect": t["effect"]}
                                                  for t in taints]}}])
    wait_for(lambda: c.cp.get("pod", name, ns)["status"].get("phase") == "Running", 60,
             lambda: f"pod {name} not running")
    return name


def test_a_fault_on_more_nodes_than_the_breaker_allows_drains_its_share_and_holds_the_rest(clean: Cluster):
    """The plan's breaker (its own script, the real kubectl and jq, the real apiserver) between the plan's two
    rules: every faulty node takes no new work, only the pool's share is drained (its pod evicted by Kubernetes'
    taint eviction), the rest keep their pods and say why; as a drained node recovers, the next one is drained."""
    q = _enforced_rule(clean)
    if q.breaker is None:
        pytest.skip(f"{clean.plan.stack} has no breaker (quarantine.drain false or evict_at_most_percent 100)")
    pool = max(clean.spec.node_pools, key=lambda p: len(p.hosts))
    hosts = sorted(h.hostname for h in pool.hosts)
    share = max(1, len(hosts) * q.percent // 100)
    if len(hosts) <= share:
        pytest.skip(f"pool {pool.name}: its share ({share}) is every host")
    faulty = hosts[:share + 1]
    drained, held = faulty[:share], faulty[share]
    ns = "e2e-breaker"
    clean.cp.kubectl("create", "namespace", ns)
    pods = {n: _sleeper(clean, ns, n) for n in faulty}

    def taints(node: str) -> set[str]:
        return {t["effect"] for t in clean.nodes()[node]["spec"].get("taints") or [] if t["key"] == QUARANTINE_TAINT}

    def pod_gone(node: str) -> bool:
        pod = clean.cp.get("pods", namespace=ns)["items"]
        return not any(p["metadata"]["name"] == pods[node] and not p["metadata"].get("deletionTimestamp")
                       for p in pod)
    try:
        for n in faulty:
            _set_fault(clean, n, "True")
        log = q.settle(clean.cp, faulty)
        assert {n: taints(n) for n in faulty} == {**{n: {"NoSchedule", "NoExecute"} for n in drained},
                                                   held: {"NoSchedule"}}, log
        for n in drained:
            wait_for(lambda n=n: pod_gone(n), 60, lambda n=n: f"pod on drained {n} not evicted")
        time.sleep(3)
        assert not pod_gone(held)                                      # its job runs on
        note = clean.nodes()[held]["metadata"]["annotations"][HELD_ANNOTATION]
        assert note.startswith(f"breaker open: {share} of the {len(hosts)} nodes of pool {pool.name} evicted at "
                               f"once, at most {share} ({q.percent}%); 1 more held NoSchedule"), note
        assert q.settle(clean.cp, faulty) == ""                        # settled: a second pass writes nothing

        _set_fault(clean, drained[0], "False")                         # repaired (and burned in)
        log = q.settle(clean.cp, faulty)
        assert taints(drained[0]) == set() and taints(held) == {"NoSchedule"}, log   # the grant goes back first
        log += q.settle(clean.cp, faulty)
        assert GRANT_LABEL not in clean.nodes()[drained[0]]["metadata"]["labels"], log
        assert taints(held) == {"NoSchedule", "NoExecute"}, log
        assert HELD_ANNOTATION not in (clean.nodes()[held]["metadata"].get("annotations") or {})
        wait_for(lambda: pod_gone(held), 60, lambda: f"pod on {held} not evicted once granted")
    finally:
        for n in faulty:                   # as a new node: no condition of ours (Detector.forget)
            conditions = clean.cp.get("node", n)["status"].get("conditions", [])
            clean.cp.kubectl("patch", "node", n, "--subresource=status", "--type=json", "-p", json.dumps(
                [{"op": "remove", "path": f"/status/conditions/{i}"} for i, x in reversed(list(enumerate(conditions)))
                 if x["type"] == CONDITION]), check=False)
        _unquarantine(clean)
        clean.cp.kubectl("delete", "namespace", ns, "--wait=false")
