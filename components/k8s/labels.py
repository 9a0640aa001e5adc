"""Node labels and taints the stack agrees on: node pools set them, Kueue and the operators select by them."""

from __future__ import annotations

from typing import Any

from ..spec import ClusterSpec, NodePool

POOL_LABEL = "gpucluster.io/pool"
BLOCK_LABEL = "gpucluster.io/block"
RACK_LABEL = "gpucluster.io/rack"
# The leaf switch of the host's first rail (the rack, when the spec lists no leaves): Kueue's middle level.
LEAF_LABEL = "gpucluster.io/leaf"
# On the nodes of a site's WEKA or Scale cluster's clients: where its CSI node plugin runs (value: the kind).
FILESYSTEM_CLIENT_LABEL = "gpucluster.io/filesystem-client"
DEVICE_PLUGIN_CONFIG_LABEL = "nvidia.com/device-plugin.config"
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
# Taint a node carries until its burn-in passes; operators' daemonsets tolerate it, workloads do not.
BURN_IN_TAINT = "gpucluster.io/burn-in"
# Taint node-readiness-controller keeps on a GPU node with a fault not yet followed by a passing burn-in (its
# rules' taint keys must be in readiness.k8s.io/); node agents tolerate it, workloads do not.
QUARANTINE_TAINT = "readiness.k8s.io/gpucluster-gpu-health"
# Taint (NoSchedule) it keeps on a GPU node whose GPU needs a reset or a reboot; node agents tolerate it too.
RESET_TAINT = "readiness.k8s.io/gpucluster-gpu-reset"
# What a pod that must run on any node, quarantined or not, tolerates (the detector, the quarantine's controller).
TOLERATE_EVERY_TAINT = ({"operator": "Exists", "effect": "NoSchedule"}, {"operator": "Exists", "effect": "NoExecute"})


def pool_labels(pool: NodePool) -> dict[str, str]:
    """Labels every node of the pool carries (besides its rack and block)."""
    labels = {POOL_LABEL: pool.name, **pool.labels}
    if pool.sharing.time_slicing_replicas:
        labels[DEVICE_PLUGIN_CONFIG_LABEL] = pool.name
    if pool.sharing.mig_config:
        labels[MIG_CONFIG_LABEL] = pool.sharing.mig_config
    return labels


def pool_tolerations(pool: NodePool) -> list[dict[str, Any]]:
    """Tolerations matching exactly the pool's taints."""
    return [{"key": t.key, "operator": "Equal", "value": t.value, "effect": t.effect} if t.value
            else {"key": t.key, "operator": "Exists", "effect": t.effect} for t in pool.all_taints]


def every_pool_tolerations(spec: ClusterSpec) -> list[dict[str, Any]]:
    """Every GPU pool's taints tolerated, each once: for pods that run on any of the pools."""
    return [dict(t) for t in {tuple(sorted(t.items())): t for pool in spec.node_pools
                              for t in pool_tolerations(pool)}.values()]


def system_tolerations(spec: ClusterSpec) -> list[dict[str, Any]]:
    """What node agents (drivers, device plugins, NFD) tolerate: every pool taint, the burn-in gate, the
    quarantine and the reset (a drained node keeps its driver, device plugin and exporters for the burn-in that
    releases it)."""
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for pool in spec.node_pools:
        for t in pool.all_taints:
            seen[(t.key, t.effect)] = {"key": t.key, "operator": "Exists", "effect": t.effect}
    for key in (BURN_IN_TAINT, QUARANTINE_TAINT, RESET_TAINT):
        for effect in ("NoSchedule", "NoExecute"):
            seen[(key, effect)] = {"key": key, "operator": "Exists", "effect": effect}
    return [seen[k] for k in sorted(seen)]
