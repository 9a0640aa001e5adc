"""Retiring a host removed from the spec, with the plan's own scripts as pulumi runs them (bash, kubectl),
against the real apiserver and controllers with tenants' jobs on KWOK nodes: its Node is drained (budgets
honoured) and deleted, the job runs on elsewhere, and no other Node changes; a drain that cannot finish keeps
the Node; a host another pool took over is left alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from components.spec import Host, NodePool

from .conftest import Cluster, wait_for
from .test_rollout import (CORDONED_BEFORE_ANNOTATION, a_grant, blocking_budget, node, one_gpu_job, rollout_taint,
                           run_step)

pytestmark = pytest.mark.e2e


def local_script(c: Cluster, pool: NodePool, host: Host, role: str) -> str:
    """The plan's delete script of the host's `-retire` or `-deregister`."""
    (path,) = (c.plan.dir / "scripts" / "_local").glob(f"*-{pool.name}-{host.hostname}-{role}.delete.sh")
    return path.read_text()


def others(c: Cluster, host: str) -> dict[str, Any]:
    """What a retirement must not touch: every other Node's labels, annotations, taints and cordon."""
    return {name: (n["metadata"].get("labels"), n["metadata"].get("annotations"), n["spec"].get("taints"),
                   n["spec"].get("unschedulable"))
            for name, n in c.nodes().items() if name != host}


@pytest.fixture
def busy(clean: Cluster, tmp_path: Path) -> Iterator[tuple[Cluster, NodePool, Host, dict[str, Any], Path]]:
    """A tenant's one-GPU job running; its pod's node and pool. Every Node as the spec has it afterwards."""
    pool, host, job = one_gpu_job(clean, "retired")
    try:
        yield clean, pool, host, job, tmp_path
    finally:
        clean.clean()
        clean.cp.kubectl("delete", "node", host.hostname, "--ignore-not-found")
        clean.set_nodes()


def test_a_retired_host_is_drained_then_its_node_deleted_and_nothing_else_changes(busy):
    c, pool, host, job, home = busy
    before = others(c, host.hostname)
    out = run_step(c, local_script(c, pool, host, "retire"), home)
    assert out.returncode == 0, out.stderr
    assert f"{host.hostname}: changed: drained: 1 pod(s) evicted" in out.stdout
    n = node(c, host.hostname)
    assert n["spec"].get("unschedulable") is True and rollout_taint(n) == "retiring"
    # the job goes on elsewhere: Kueue keeps it admitted, the Job controller replaces the evicted pod
    assert c.wait_admitted(job).admitted
    wait_for(lambda: [p for p in c.pods(job) if p["status"].get("phase") == "Running"
                      and p["spec"].get("nodeName") not in (None, host.hostname)], 90, lambda: c._pods_state(job))
    # the SSH steps between (unmount, undo, kubelet stopped) run on the SSH test hosts; then the Node goes
    out = run_step(c, local_script(c, pool, host, "deregister"), home)
    assert out.returncode == 0, out.stderr
    assert f"{host.hostname}: changed: deleted its Node: {host.hostname} has left the cluster" in out.stdout
    assert host.hostname not in c.nodes()
    assert others(c, host.hostname) == before, "a retirement changed another Node"
    for role in ("retire", "deregister"):        # the engine retries a delete it saw fail: nothing left to do
        again = run_step(c, local_script(c, pool, host, role), home)
        assert again.returncode == 0 and f"no Node {host.hostname} in the cluster" in again.stdout, again.stdout


def test_a_retirement_a_budget_blocks_keeps_the_node_cordoned_and_refuses_to_delete_it(busy):
    c, pool, host, job, home = busy
    with blocking_budget(c, job, "retired"):
        retire = local_script(c, pool, host, "retire").replace(
            f"--timeout={pool.rollout.drain_timeout_s}s", "--timeout=5s")
        out = run_step(c, retire, home)
        assert out.returncode == 1 and "the drain did not finish" in out.stderr, out.stdout
        assert f"{host.hostname} stays cordoned and tainted gpucluster.io/rollout=retiring and is not retired" \
            in out.stderr
        n = node(c, host.hostname)
        assert n["spec"].get("unschedulable") is True and rollout_taint(n) == "retiring"
        assert n["metadata"]["annotations"][CORDONED_BEFORE_ANNOTATION] == "false"
        # Were the Node's deletion reached anyway (a person's `pulumi state delete`), it is refused while the
        # tenant's pod is bound there.
        out = run_step(c, local_script(c, pool, host, "deregister"), home)
        assert out.returncode == 1, out.stdout
        assert f"1 tenant pod(s) are still bound to {host.hostname}" in out.stderr
        assert host.hostname in c.nodes()


def test_a_host_another_pool_took_over_is_not_retired(clean: Cluster, tmp_path: Path):
    pool = a_grant(clean).pool
    host = pool.hosts[0]
    c = clean
    c.cp.kubectl("label", "node", host.hostname, "--overwrite", "gpucluster.io/pool=inference")
    try:
        before = c.nodes()[host.hostname]
        for role in ("retire", "deregister"):
            out = run_step(c, local_script(c, pool, host, role), tmp_path)
            assert out.returncode == 0, out.stderr
            assert f"its Node is in pool inference now, not {pool.name}: left as it is" in out.stdout
        after = c.nodes()[host.hostname]
        assert after["spec"] == before["spec"] and after["metadata"]["labels"] == before["metadata"]["labels"]
    finally:
        c.set_nodes()
