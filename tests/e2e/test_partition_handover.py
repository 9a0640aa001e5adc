"""Issue 58, day 2: the kubectl steps around a partition or VLAN change, as pulumi runs them, against the real apiserver
and controllers with a tenant's job on a KWOK node: the handover drains a node whose ports move to another
partition (a disruption budget that blocks it fails the step, the node left cordoned, so the subnet managers'
steps after it never run), and the reopen marks the node with its partition and gives it back."""

from __future__ import annotations

import shlex

import pytest

from components.nodes.handover import HANDOVER_MARK, PARTITION_MARK, fence_of, render_handover

from .conftest import Cluster
from .test_rollout import blocking_budget, busy, node, restore, run_step  # noqa: F401  (busy: a fixture)

pytestmark = pytest.mark.e2e


def run(c: Cluster, script: str, home, owners: str):
    """A handover or reopen step with GPUCLUSTER_PARTITIONS (`HOST OWNER DRAIN_TIMEOUT_S` lines)."""
    return run_step(c, f"export GPUCLUSTER_PARTITIONS={shlex.quote(owners)}\n{script}", home)


def marks(c: Cluster, host: str) -> dict[str, str]:
    meta = node(c, host)["metadata"].get("annotations") or {}
    return {k: v for k, v in meta.items() if k in (PARTITION_MARK, HANDOVER_MARK)}


@pytest.mark.one_stack
def test_a_node_handed_to_a_tenant_is_drained_before_and_reopened_after_its_partition_changes(busy):
    c, pool, host, job, home = busy
    steps = render_handover(c.spec)
    drain, reopen = steps.drain, steps.reopen
    try:
        out = run(c, drain, home, f"{host.hostname} team-x 60\nno-such-host team-x 60")
        assert out.returncode == 0, out.stdout + out.stderr
        fence = fence_of(c.spec)          # the words of the stack's fabric: a partition, a VLAN
        assert f"changed: drained {host.hostname}: its ports move from shared's {fence} to team-x's" in out.stdout
        n = node(c, host.hostname)
        assert n["spec"].get("unschedulable") is True and marks(c, host.hostname) == {HANDOVER_MARK: "shared->team-x"}
        assert not [p for p in c.pods(job) if p["spec"].get("nodeName") == host.hostname
                    and not p["metadata"].get("deletionTimestamp")], "the tenant's pod is still on the node"

        out = run(c, reopen, home, f"{host.hostname} team-x 60")
        assert out.returncode == 0 and f"changed: reopened {host.hostname}" in out.stdout, out.stdout + out.stderr
        assert not node(c, host.hostname)["spec"].get("unschedulable")
        assert marks(c, host.hostname) == {PARTITION_MARK: "team-x"}
        # the same owners again: nothing to drain, nothing to reopen
        again = run(c, drain, home, f"{host.hostname} team-x 60")
        assert again.returncode == 0 and again.stdout.endswith(": 0 change(s)\n"), again.stdout
        assert not node(c, host.hostname)["spec"].get("unschedulable")
    finally:
        c.cp.kubectl("annotate", "node", host.hostname, f"{PARTITION_MARK}-", f"{HANDOVER_MARK}-")
        restore(c, host.hostname)


@pytest.mark.one_stack
def test_a_handover_a_disruption_budget_blocks_fails_with_the_node_cordoned(busy):
    c, pool, host, job, home = busy
    drain = render_handover(c.spec).drain
    try:
        with blocking_budget(c, job, "keep-one"):
            out = run(c, drain, home, f"{host.hostname} team-x 5")
        assert out.returncode == 1, out.stdout + out.stderr
        fence = fence_of(c.spec)
        assert f"node {host.hostname} did not drain within 5s before its ports move from shared's {fence} to " \
            "team-x's" in out.stderr and f"(it stays cordoned; its {fence} is unchanged)" in out.stderr, out.stderr
        assert node(c, host.hostname)["spec"].get("unschedulable") is True
        assert marks(c, host.hostname) == {HANDOVER_MARK: "shared->team-x"}
    finally:
        c.cp.kubectl("annotate", "node", host.hostname, f"{PARTITION_MARK}-", f"{HANDOVER_MARK}-")
        restore(c, host.hostname)


@pytest.mark.one_stack
def test_a_node_leaving_with_its_tenant_is_drained_before_its_partition_goes(busy):
    """Its tenant (or pool, or host) is gone from the spec, so no line names it, and the fabric steps drop its
    ports from the tenant's partition or VLAN before its own retirement at the end of the run: the handover
    drains it first and leaves it cordoned, marked `leaving`; a second run has nothing to do."""
    c, pool, host, job, home = busy
    steps = render_handover(c.spec)
    drain, reopen = steps.drain, steps.reopen
    leaving = f"export GPUCLUSTER_LEAVING_DRAIN_S=60\n{drain}"
    try:
        c.cp.kubectl("annotate", "node", host.hostname, "--overwrite", f"{PARTITION_MARK}=team-x")
        out = run(c, leaving, home, "no-such-host shared 60")
        assert out.returncode == 0, out.stdout + out.stderr
        fence = fence_of(c.spec)
        assert f"changed: drained {host.hostname}: it leaves the cluster, and its ports leave team-x's {fence}" \
            in out.stdout, out.stdout
        assert node(c, host.hostname)["spec"].get("unschedulable") is True
        assert marks(c, host.hostname) == {PARTITION_MARK: "leaving", HANDOVER_MARK: "team-x->leaving"}
        assert not [p for p in c.pods(job) if p["spec"].get("nodeName") == host.hostname
                    and not p["metadata"].get("deletionTimestamp")], "the tenant's pod is still on the node"
        again = run(c, leaving, home, "no-such-host shared 60")
        assert again.returncode == 0 and again.stdout.endswith(": 0 change(s)\n"), again.stdout
        # it comes back after all (named again, now shared): drained as any move, then reopened
        back = run(c, drain, home, f"{host.hostname} shared 60")
        assert back.returncode == 0 and f"from leaving's {fence} to shared's" in back.stdout, back.stdout
        opened = run(c, reopen, home, f"{host.hostname} shared 60")
        assert opened.returncode == 0 and f"changed: reopened {host.hostname}" in opened.stdout, opened.stdout
        assert not node(c, host.hostname)["spec"].get("unschedulable")
    finally:
        c.cp.kubectl("annotate", "node", host.hostname, f"{PARTITION_MARK}-", f"{HANDOVER_MARK}-")
        restore(c, host.hostname)


@pytest.mark.one_stack
def test_where_isolation_ends_the_tenants_nodes_are_drained_before_and_reopened_after_the_fence_goes(busy):
    """Isolation turned off, or its last isolated pool gone: pulumi deletes the steps dependents first, so the
    reopen's delete drains each Node in a tenant's fence (its line's bound) before the fence steps' deletes put
    its ports back in the shared partitions or VLAN, and the handover's delete marks it shared and gives it
    back. A leaving Node is left as it is; run again after both, neither has anything to do."""
    c, pool, host, job, home = busy
    steps = render_handover(c.spec)
    other = next(h.hostname for p in c.spec.node_pools for h in p.hosts if h.hostname != host.hostname)
    fence = fence_of(c.spec)
    try:
        c.cp.kubectl("annotate", "node", host.hostname, "--overwrite", f"{PARTITION_MARK}=team-x")
        c.cp.kubectl("annotate", "node", other, "--overwrite", f"{PARTITION_MARK}=leaving")
        out = run(c, steps.release, home, f"{host.hostname} team-x 60")
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"changed: drained {host.hostname}: its ports leave team-x's {fence} for the shared one, as tenants " \
            "are no longer isolated" in out.stdout and other not in out.stdout, out.stdout
        assert node(c, host.hostname)["spec"].get("unschedulable") is True
        assert marks(c, host.hostname) == {PARTITION_MARK: "team-x", HANDOVER_MARK: "team-x->shared"}
        assert not [p for p in c.pods(job) if p["spec"].get("nodeName") == host.hostname
                    and not p["metadata"].get("deletionTimestamp")], "the tenant's pod is still on the node"
        assert not node(c, other)["spec"].get("unschedulable") and marks(c, other) == {PARTITION_MARK: "leaving"}

        out = run(c, steps.released, home, "")
        assert out.returncode == 0 and f"changed: reopened {host.hostname}: its ports are in shared's {fence}" \
            in out.stdout and other not in out.stdout, out.stdout + out.stderr
        assert not node(c, host.hostname)["spec"].get("unschedulable")
        assert marks(c, host.hostname) == {PARTITION_MARK: "shared"} and marks(c, other) == {PARTITION_MARK: "leaving"}
        for text in (steps.release, steps.released):
            again = run(c, text, home, "")
            assert again.returncode == 0 and again.stdout.endswith(": 0 change(s)\n"), again.stdout
    finally:
        c.cp.kubectl("annotate", "node", host.hostname, f"{PARTITION_MARK}-", f"{HANDOVER_MARK}-")
        c.cp.kubectl("annotate", "node", other, f"{PARTITION_MARK}-")
        restore(c, host.hostname)


@pytest.mark.one_stack
def test_a_drain_that_blocks_where_isolation_ends_fails_the_delete_with_the_fence_unchanged(busy):
    """The reopen's delete fails, so pulumi deletes nothing it depends on: the fence steps keep the ports where
    they are, and the Node stays cordoned until the next run drains it."""
    c, pool, host, job, home = busy
    steps = render_handover(c.spec)
    fence = fence_of(c.spec)
    try:
        c.cp.kubectl("annotate", "node", host.hostname, "--overwrite", f"{PARTITION_MARK}=team-x")
        with blocking_budget(c, job, "keep-one"):
            out = run(c, steps.release, home, f"{host.hostname} team-x 5")
        assert out.returncode == 1, out.stdout + out.stderr
        assert f"node {host.hostname} did not drain within 5s before its ports leave team-x's {fence} (tenants are " \
            f"no longer isolated)" in out.stderr and f"(it stays cordoned; its {fence} is unchanged)" in out.stderr
        assert node(c, host.hostname)["spec"].get("unschedulable") is True
    finally:
        c.cp.kubectl("annotate", "node", host.hostname, f"{PARTITION_MARK}-", f"{HANDOVER_MARK}-")
        restore(c, host.hostname)
