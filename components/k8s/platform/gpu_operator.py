"""NVIDIA GPU Operator: chart values rendered from the spec."""

from __future__ import annotations

from typing import Any

import yaml

from ...spec import ClusterSpec, NodePool
from ...spec.cluster import OPERATOR_NAMESPACES
from ..helm import NVIDIA_REPO, Chart
from ..images import GPU_OPERATOR_REPOSITORIES, ChartImages, chart_from
from ..labels import system_tolerations
from .monitoring import DCGM_METRICS_CONFIG, render_dcgm_metrics_csv

NAMESPACE = OPERATOR_NAMESPACES["gpu_operator"]
DEVICE_PLUGIN_CONFIG = "gpucluster-device-plugin"


def chart(spec: ClusterSpec) -> Chart:
    g = spec.kubernetes.gpu_operator
    return chart_from(g, "gpu-operator", g.chart_version, NVIDIA_REPO)


def chart_images(spec: ClusterSpec) -> ChartImages:
    return ChartImages(GPU_OPERATOR_REPOSITORIES)


def render_time_slicing(pool: NodePool) -> str:
    """One key of the device plugin ConfigMap; nodes pick it with the nvidia.com/device-plugin.config label."""
    return yaml.safe_dump({"version": "v1", "sharing": {"timeSlicing": {
        "renameByDefault": pool.sharing.rename_shared, "failRequestsGreaterThanOne": True,
        "resources": [{"name": "nvidia.com/gpu", "replicas": pool.sharing.time_slicing_replicas}]}}},
        sort_keys=False)


def render_driver_upgrade_policy(spec: ClusterSpec) -> dict[str, Any]:
    """The operator's own rollout of a driver it manages, bounded as the pools' rollouts are: one policy for
    every node, so the strictest pool's batch size and drain timeout (chart keys: driver.upgradePolicy)."""
    pools = spec.node_pools
    batch = min(p.rollout.batch_size(len(p.hosts)) for p in pools)
    timeout_s = min(p.rollout.drain_timeout_s for p in pools)
    return {"autoUpgrade": True, "maxParallelUpgrades": batch, "maxUnavailable": batch,
            "gpuPodDeletion": {"force": False, "timeoutSeconds": timeout_s, "deleteEmptyDir": True},
            "drain": {"enable": True, "force": False, "timeoutSeconds": timeout_s, "deleteEmptyDir": True}}


def render_gpu_operator_values(spec: ClusterSpec) -> dict[str, Any]:
    g, monitoring = spec.kubernetes.gpu_operator, spec.kubernetes.monitoring
    # The driver container loads nvidia-peermem only for a driver it manages; host preparation does it otherwise.
    rdma = spec.fabric.effective_gpudirect and g.driver_managed
    values: dict[str, Any] = {
        "nfd": {"enabled": False},          # the stack installs NFD once, for both operators
        "driver": {"enabled": g.driver_managed, "kernelModuleType": g.kernel_module_type,
                   "rdma": {"enabled": rdma,
                            "useHostMofed": rdma and spec.kubernetes.network_operator.ofed_driver_version is None}},
        "toolkit": {"enabled": True},
        "cdi": {"enabled": True},
        "mig": {"strategy": g.mig_strategy},
        "migManager": {"enabled": any(p.sharing.mig_config for p in spec.node_pools)},
        "daemonsets": {"tolerations": system_tolerations(spec)},
        "dcgmExporter": {"enabled": True, "serviceMonitor": {
            "enabled": monitoring.enabled, "interval": "15s", "honorLabels": False,
            "additionalLabels": dict(monitoring.rule_labels) if monitoring.enabled else {}}},
    }
    if g.driver_managed and spec.node_pools:
        values["driver"]["upgradePolicy"] = render_driver_upgrade_policy(spec)
    if g.driver_managed and spec.storage.gds:     # nvidia-fs, which GDS reads through, beside the driver it runs
        values["gds"] = {"enabled": True}
    if monitoring.enabled:
        values["dcgmExporter"]["config"] = {"name": DCGM_METRICS_CONFIG, "create": True,
                                            "data": render_dcgm_metrics_csv()}
    sliced = [p for p in spec.node_pools if p.sharing.time_slicing_replicas]
    if sliced:
        data = {"default": yaml.safe_dump({"version": "v1"}), **{p.name: render_time_slicing(p) for p in sliced}}
        values["devicePlugin"] = {"config": {"create": True, "name": DEVICE_PLUGIN_CONFIG, "default": "default",
                                             "data": data}}
    return values
