"""Scheduling as the spec promises, with jobs written from the job template, on the real Kueue and scheduler.

Quotas, pools, lenders and topology levels are read from each stack's spec (tests/e2e/scenarios.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from components.k8s.labels import BURN_IN_TAINT, POOL_LABEL

from .conftest import Cluster
from .scenarios import Grant, grants, reclaim_pairs

pytestmark = pytest.mark.e2e
GPU = "nvidia.com/gpu"


def _single_gpu_job(c: Cluster, g: Grant, name: str, gpus: int, **kw: Any) -> dict[str, Any]:
    """`gpus` pods of one GPU each: a shape that always packs onto the pool when the quota allows it."""
    return c.job(g.tenant, g.pool, name, pods=gpus, gpus_per_pod=1, **kw)


def _assert_on_pool(c: Cluster, pods: list[dict[str, Any]], g: Grant) -> None:
    nodes = c.nodes()
    for p in pods:
        node = nodes[p["spec"]["nodeName"]]
        assert node["metadata"]["labels"].get(POOL_LABEL) == g.pool.name, \
            f"{p['metadata']['name']} ran on {node['metadata']['name']}, outside pool {g.pool.name}"
        assert not any(t["key"] == BURN_IN_TAINT for t in node["spec"].get("taints") or []), \
            f"{p['metadata']['name']} ran on quarantined node {node['metadata']['name']}"


def test_every_tenant_gets_its_nominal_gpus_on_every_pool_at_once(clean: Cluster):
    """With and without explicit limits: half the tenants' jobs set memory limits, half rely on defaults."""
    jobs = []
    for i, g in enumerate(gs for gs in grants(clean.spec) if gs.nominal):
        jobs.append((g, clean.submit(_single_gpu_job(clean, g, f"nominal-{g.pool.name}", g.nominal,
                                                     limits=i % 2 == 0))))
    assert jobs, "the stack has no tenant with GPUs"
    for g, job in jobs:
        a = clean.wait_admitted(job)
        assert set(a.flavors.values()) == {g.pool.name}, f"{g.id}: admitted on {a.flavors}"
        _assert_on_pool(clean, clean.wait_running(job), g)


def test_a_tenant_borrows_up_to_its_limit_when_the_cohort_is_idle_and_no_further(clean: Cluster):
    for g in grants(clean.spec):
        most = g.nominal + g.borrowable
        if most:
            job = clean.submit(_single_gpu_job(clean, g, "borrow", most))
            clean.wait_admitted(job)
            _assert_on_pool(clean, clean.wait_running(job), g)
        one_more = clean.submit(_single_gpu_job(clean, g, "one-more", 1))
        pending = clean.assert_stays_pending(one_more)
        assert GPU in pending.message, f"{g.id}: {pending.message}"
        clean.clean()


def test_a_job_larger_than_nominal_plus_borrowing_stays_pending_with_kueues_reason(clean: Cluster):
    for g in grants(clean.spec):
        job = clean.submit(_single_gpu_job(clean, g, f"too-big-{g.pool.name}", g.nominal + g.borrowable + 1))
        a = clean.assert_stays_pending(job)
        assert "insufficient" in a.message or "exceeds" in a.message or "quota" in a.message, a.message
        assert g.pool.name in a.message, a.message


def test_the_lender_reclaims_its_gpus_by_preemption(clean: Cluster):
    pairs = reclaim_pairs(clean.spec)
    if not pairs:
        pytest.skip("no tenant in this stack can borrow from another")
    borrower, lender = pairs[0]
    borrowing = clean.submit(_single_gpu_job(clean, borrower, "borrowing", borrower.nominal + borrower.borrowable))
    clean.wait_admitted(borrowing)
    clean.wait_running(borrowing)
    reclaim = clean.submit(_single_gpu_job(clean, lender, "reclaim", lender.nominal))
    if lender.tenant.preemption.reclaim_within_cohort == "Never":
        clean.assert_stays_pending(reclaim)
        return
    clean.wait_admitted(reclaim, timeout_s=90)
    _assert_on_pool(clean, clean.wait_running(reclaim, timeout_s=90), lender)
    evicted = clean.admission(borrowing)
    assert evicted is not None and not evicted.admitted
    conditions = {c["type"]: c for c in evicted.workload["status"]["conditions"]}
    assert conditions.get("Preempted", {}).get("status") == "True" or \
        conditions.get("Evicted", {}).get("reason") == "Preempted", conditions


def test_a_multi_pod_job_asking_for_one_topology_domain_is_placed_inside_one(clean: Cluster):
    levels = clean.spec.kubernetes.kueue.topology_levels
    g = next((g for g in grants(clean.spec) if min(g.pool.gpu_units_per_host, g.nominal + g.borrowable) >= 2), None)
    if g is None:
        pytest.skip("no tenant of this stack can run two pods with GPUs on one host")
    per_pod = min(g.pool.gpu_units_per_host // 2, (g.nominal + g.borrowable) // 2)
    for level in levels:
        job = clean.submit(clean.job(g.tenant, g.pool, f"within-{level.split('/')[-1]}", pods=2,
                                     gpus_per_pod=per_pod, topology=level))
        a = clean.wait_admitted(job)
        pods = clean.wait_running(job)
        _assert_on_pool(clean, pods, g)
        nodes = clean.nodes()
        domains = {nodes[p["spec"]["nodeName"]]["metadata"]["labels"].get(level) for p in pods}
        assert len(domains) == 1 and None not in domains, f"{level}: pods spread over {domains} ({a.flavors})"
        clean.delete_jobs(job)


def test_pods_never_land_on_a_quarantined_node(clean: Cluster):
    g = next(g for g in grants(clean.spec) if g.nominal)
    hosts = [h.hostname for h in g.pool.hosts]
    if len(hosts) < 2:
        pytest.skip(f"pool {g.pool.name} has one host")
    try:
        clean.set_nodes(quarantined={hosts[0]})
        healthy = g.pool.gpu_units_per_host * (len(hosts) - 1)
        fits = min(g.nominal + g.borrowable, healthy)
        job = clean.submit(_single_gpu_job(clean, g, "avoid-quarantine", fits))
        clean.wait_admitted(job)
        _assert_on_pool(clean, clean.wait_running(job), g)
        if g.nominal + g.borrowable > healthy:        # only the quarantined node is left: nothing may go there
            extra = clean.submit(_single_gpu_job(clean, g, "nowhere-to-go", 1))
            extra_pods = [p for p in clean.pods(extra) if p["spec"].get("nodeName")]
            assert not any(p["spec"]["nodeName"] == hosts[0] for p in extra_pods)
    finally:
        clean.set_nodes()


def test_a_job_without_a_queue_name_is_held_by_kueue(clean: Cluster):
    for g in grants(clean.spec):
        held = clean.submit(_single_gpu_job(clean, g, f"no-queue-{g.pool.name}", g.nominal + g.borrowable + 1,
                                            queue=None))
        a = clean.assert_stays_pending(held)
        assert a.workload["spec"]["queueName"] == "default", a.workload["spec"]
        job = clean.cp.get("job", held["metadata"]["name"], namespace=held["metadata"]["namespace"])
        assert job["spec"]["suspend"] is True
        if g.nominal:
            fits = clean.submit(_single_gpu_job(clean, g, f"no-queue-fits-{g.pool.name}", 1, queue=None))
            clean.wait_admitted(fits)
        clean.delete_jobs(held)


def test_workload_priority_classes_order_admission(clean: Cluster):
    classes = sorted(clean.spec.kubernetes.kueue.priority_classes, key=lambda p: p.value)
    if len(classes) < 2:
        pytest.skip("the stack defines fewer than two workload priority classes")
    g = next(g for g in grants(clean.spec) if g.nominal)
    most = g.nominal + g.borrowable
    low, high = classes[0].name, classes[-1].name
    blocker = clean.submit(_single_gpu_job(clean, g, "blocker", most, priority_class=high))
    clean.wait_admitted(blocker)
    clean.wait_running(blocker)
    first_low = clean.submit(_single_gpu_job(clean, g, "low", most, priority_class=low))
    clean.wait_pending(first_low)
    then_high = clean.submit(_single_gpu_job(clean, g, "high", most, priority_class=high))
    clean.wait_pending(then_high)
    assert clean.admission(blocker).admitted, "an equal-priority job preempted the one running"
    clean.delete_jobs(blocker)
    clean.wait_admitted(then_high, timeout_s=90)
    still = clean.admission(first_low)
    assert still is not None and not still.admitted, "the lower-priority job was admitted first"


def test_tenant_pods_mount_their_filesystem_claims_and_run_on_their_pool(clean: Cluster):
    """The job template mounts the tenant's claims (its directory, the datasets); the claims are bound to the
    stack's volumes, and the scheduler places the pods where the volumes' node affinity allows: the pool."""
    checked = 0
    for g in grants(clean.spec):
        claims = {c.name for c in clean.spec.filesystem_claims(g.tenant)}
        if not claims or not g.nominal:
            continue
        bound = {c["metadata"]["name"]: c["status"].get("phase")
                 for c in clean.cp.get("pvc", namespace=g.tenant.namespace_name)["items"]}
        assert {name: bound.get(name) for name in claims} == {name: "Bound" for name in claims}
        job = clean.submit(_single_gpu_job(clean, g, f"fs-{g.pool.name}", 1))
        clean.wait_admitted(job)
        pods = clean.wait_running(job)
        _assert_on_pool(clean, pods, g)
        for p in pods:
            assert {v["persistentVolumeClaim"]["claimName"] for v in p["spec"]["volumes"]
                    if "persistentVolumeClaim" in v} == claims
        clean.clean()
        checked += 1
    if not checked:
        pytest.skip("the stack has no parallel filesystem claims")
