"""Active health checks on the real control plane: the real Kueue admits a host's check only while every GPU of
that host is free, never preempts a tenant for it, and lets a tenant reclaim its GPUs from a running check; a
check that fails is seen by the real node-problem-detector, which holds the node until a burn-in passes.

The CronJobs are applied suspended (conftest.apply_plan): a test creates the Job of a CronJob's template itself,
as the CronJob controller would at the scheduled time."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from components.k8s.health import checks as health_checks
from components.k8s.health.detector import BURN_IN_CONDITION
from components.spec.cluster import checked_pools

from . import readiness
from .conftest import Cluster, wait_for
from .scenarios import Grant, grants
from .test_quarantine import _enforced_rule, _placed_on, _unquarantine, _watched

pytestmark = pytest.mark.e2e
HOSTNAME = "kubernetes.io/hostname"
SAMPLES = Path(__file__).resolve().parents[1] / "samples"


def check_job(c: Cluster, host: str, suffix: str = "1") -> dict[str, Any]:
    """The Job the CronJob controller creates for `host`'s check: its jobTemplate, named as the controller names
    it (the CronJob's name and the scheduled minute)."""
    (cron,) = [o for o in c.plan.objects if o["kind"] == "CronJob"
               and o["metadata"]["labels"].get(health_checks.HOST_LABEL) == host]
    template = cron["spec"]["jobTemplate"]
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": f"{cron['metadata']['name']}-{suffix}", "namespace": health_checks.NAMESPACE,
                         "labels": dict(template["metadata"]["labels"])},
            "spec": template["spec"]}


def _checked_grant(c: Cluster) -> Grant:
    pools = {p.name for p in checked_pools(c.spec)}
    g = next((g for g in grants(c.spec) if g.pool.name in pools and g.nominal > 0), None)
    if g is None:
        pytest.skip("no tenant holds GPUs on a pool the active checks serve")
    return g


def _pinned(job: dict[str, Any], node: str) -> dict[str, Any]:
    job["spec"]["template"]["spec"]["nodeSelector"] = {HOSTNAME: node}
    return job


def _not_preempted(c: Cluster, *jobs: dict[str, Any]) -> None:
    for job in jobs:
        a = c.admission(job)
        conditions = {x["type"]: x for x in a.workload["status"].get("conditions", [])}
        assert a.admitted and conditions.get("Evicted", {}).get("status") != "True", (job["metadata"], conditions)


def test_a_check_waits_while_a_tenant_uses_its_node_and_runs_once_the_node_is_idle(clean: Cluster):
    g = _checked_grant(clean)
    node = g.pool.hosts[0].hostname
    tenant = clean.submit(_pinned(clean.job(g.tenant, g.pool, "one-gpu-there", pods=1, gpus_per_pod=1), node))
    clean.wait_admitted(tenant)
    clean.wait_running(tenant)
    check = clean.submit(check_job(clean, node))
    # Seven of its GPUs are free and the cohort has quota to lend, but not the whole node: it waits, and the
    # tenant's job runs on.
    clean.assert_stays_pending(check)
    _not_preempted(clean, tenant)
    assert {p["spec"]["nodeName"] for p in clean.wait_running(tenant)} == {node}

    clean.delete_jobs(tenant)
    clean.wait_admitted(check, 60)
    assert _placed_on(clean, check) == {node}
    assert {p["spec"]["nodeName"] for p in clean.wait_running(check)} == {node}


def test_a_tenant_reclaims_its_gpus_from_a_running_check_and_no_tenant_is_preempted_for_one(clean: Cluster):
    """The others use their guaranteed GPUs; a check borrows a whole idle node from what the tenant leaves
    unused; the tenant then asks for all of its guaranteed GPUs, and Kueue preempts the check (reclaim within the
    cohort), not a tenant."""
    pools = {p.name for p in checked_pools(clean.spec)}
    per_host = {p.name: p.gpu.count for p in checked_pools(clean.spec)}
    g = next((g for g in grants(clean.spec) if g.pool.name in pools and g.tenant.gpu_quota[g.pool.name].lending_limit
              is None and g.tenant.preemption.reclaim_within_cohort == "Any"
              and g.nominal >= per_host[g.pool.name]), None)
    if g is None:
        pytest.skip("no tenant lends a whole node's GPUs and reclaims them")
    others = [o for o in grants(clean.spec) if o.pool.name == g.pool.name and o.tenant is not g.tenant and o.nominal]
    fillers = [clean.submit(clean.job(o.tenant, o.pool, "guaranteed", pods=o.nominal, gpus_per_pod=1))
               for o in others]
    for f in fillers:
        clean.wait_admitted(f)
        clean.wait_running(f, 120)
    busy = {p["spec"]["nodeName"] for f in fillers for p in clean.pods(f)}
    idle = [h.hostname for h in g.pool.hosts if h.hostname not in busy]
    if not idle:
        pytest.skip("the other tenants' guaranteed GPUs leave no node of the pool idle")
    check = clean.submit(check_job(clean, idle[0]))
    clean.wait_admitted(check)
    clean.wait_running(check)

    mine = clean.submit(clean.job(g.tenant, g.pool, "all-i-am-owed", pods=g.nominal, gpus_per_pod=1))

    def preempted() -> dict[str, Any] | None:
        a = clean.admission(check)
        conditions = {x["type"]: x for x in a.workload["status"].get("conditions", [])}
        return conditions if conditions.get("Preempted", {}).get("status") == "True" else None
    conditions = wait_for(preempted, 60, lambda: f"check not preempted: {clean._why(check)}; tenant: "
                                                 f"{clean._why(mine)}")
    assert conditions["Preempted"]["reason"] == "InCohortReclamation", conditions["Preempted"]
    clean.wait_admitted(mine, 60)
    clean.wait_running(mine, 120)
    _not_preempted(clean, *fillers, mine)
    assert not clean.admission(check).admitted      # back in its queue, to run when a node is idle again


def _run_check(c: Cluster, state: Path, work: Path, output: Path, code: int) -> subprocess.CompletedProcess:
    """The plan's check script as the check's pod runs it on the host, with doubles for the GPU tools."""
    (config,) = [o for o in c.plan.objects if o["kind"] == "ConfigMap"
                 and o["metadata"].get("namespace") == health_checks.NAMESPACE]
    script = work / health_checks.SCRIPT
    script.write_text(config["data"][health_checks.SCRIPT])
    tools = work / "tools"
    tools.mkdir(exist_ok=True)
    links = SAMPLES / "nvidia_smi_nvlink_s_8xh100.txt"
    for name, body in (("nv-hostengine", "exit 0"), ("dcgmi", f'cat "{output}"; exit {code}'),
                       ("nvidia-smi", f'cat "{links}"')):
        (tools / name).write_text(f"#!/bin/bash\n{body}\n")
        (tools / name).chmod(0o755)
    return subprocess.run(["/bin/bash", str(script), str(state), "2", "1"], capture_output=True, text=True,
                          timeout=30, env={"PATH": f"{tools}:/usr/bin:/bin"})


def test_a_failed_check_quarantines_its_node_until_a_burn_in_passes(clean: Cluster, tmp_path: Path):
    rule = _enforced_rule(clean)
    g = _checked_grant(clean)
    node = g.pool.hosts[-1].hostname
    d = _watched(clean, node, tmp_path)
    try:
        assert not readiness.reconcile(clean.cp, rule, node)
        out = _run_check(clean, d.state, tmp_path, SAMPLES / "dcgmi_diag_r2_fail.txt", 226)
        assert out.returncode == 1, out.stdout + out.stderr
        held = d.wait_condition("True", "FaultSinceBurnIn", BURN_IN_CONDITION)
        assert "active check failed: dcgmi diag -r 2: GPU Memory: Fail - GPU: 3" in held["message"]
        assert readiness.reconcile(clean.cp, rule, node)
        # No tenant's new work lands there.
        job = clean.submit(_pinned(clean.job(g.tenant, g.pool, "onto-the-failed-node", pods=1, gpus_per_pod=1),
                                   node))
        clean.assert_stays_pending(job)
        clean.delete_jobs(job)

        d.burn_in()                                      # `pulumi up --replace` of the host's burn-in: it passed
        d.wait_condition("False", "NoFaultSinceBurnIn", BURN_IN_CONDITION)
        assert not readiness.reconcile(clean.cp, rule, node)
    finally:
        d.forget()
        _unquarantine(clean)
