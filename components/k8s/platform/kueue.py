"""Kueue: its configuration, the flavors that map quota onto node pools, topology, cohort and priorities."""

from __future__ import annotations

from typing import Any

import yaml

from ...spec import ClusterSpec
from ...spec.cluster import OPERATOR_NAMESPACES, network_operator_enabled
from ..helm import Chart
from ..images import KUEUE_REPOSITORIES, ChartImages, chart_from
from ..labels import POOL_LABEL, pool_tolerations
from ..rails import rdma_resource
from ..objects import Manifest
from ..tenancy.tenant import KUEUE_API, TENANT_LABEL

NAMESPACE = OPERATOR_NAMESPACES["kueue"]
TOPOLOGY = "gpu-topology"
FRAMEWORKS = ["batch/job", "kubeflow.org/mpijob", "kubeflow.org/pytorchjob", "trainer.kubeflow.org/trainjob",
              "jobset.x-k8s.io/jobset", "ray.io/rayjob", "ray.io/raycluster", "leaderworkerset.x-k8s.io/leaderworkerset",
              "pod", "deployment", "statefulset"]


def chart(spec: ClusterSpec) -> Chart:
    k = spec.kubernetes.kueue
    return chart_from(k, "oci://registry.k8s.io/kueue/charts/kueue", k.chart_version, None)


def chart_images(spec: ClusterSpec) -> ChartImages:
    return ChartImages(KUEUE_REPOSITORIES)


def render_kueue_config(spec: ClusterSpec) -> dict[str, Any]:
    """The controller's whole Configuration (the chart takes it as one string, replacing its default)."""
    k = spec.kubernetes.kueue
    config: dict[str, Any] = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
        "health": {"healthProbeBindAddress": ":8081"},
        "metrics": {"bindAddress": ":8443", "enableClusterQueueResources": True},
        "webhook": {"port": 9443},
        "leaderElection": {"leaderElect": True, "resourceName": "c1f6bfd2.kueue.x-k8s.io"},
        "clientConnection": {"qps": 300, "burst": 500},
        # Every batch workload in a tenant namespace goes through a queue; system namespaces are left alone.
        "manageJobsWithoutQueueName": True,
        "managedJobsNamespaceSelector": {"matchExpressions": [{"key": TENANT_LABEL, "operator": "Exists"}]},
        "integrations": {"frameworks": FRAMEWORKS},
        # Stated, not left to Kueue's defaults (on since v1beta2): a workload whose pods cannot all run, at
        # first or again after a drain, is evicted and queued again instead of holding its quota.
        "waitForPodsReady": {"timeout": f"{k.pods_ready_timeout_s}s",
                             "recoveryTimeout": f"{k.pods_recovery_timeout_s or k.pods_ready_timeout_s}s",
                             "blockAdmission": False,
                             "requeuingStrategy": {"timestamp": "Eviction", "backoffBaseSeconds": 60,
                                                   "backoffMaxSeconds": 3600}},
    }
    if network_operator_enabled(spec):
        # RDMA devices are a per-node device-plugin count, not a quota: Kueue must not refuse pods that ask for one.
        config["resources"] = {"excludeResourcePrefixes": [rdma_resource(spec)]}
    if k.fair_sharing:
        config["fairSharing"] = {"preemptionStrategies": ["LessThanOrEqualToFinalShare", "LessThanInitialShare"]}
    return config


def render_kueue_values(spec: ClusterSpec) -> dict[str, Any]:
    return {"enablePrometheus": spec.kubernetes.monitoring.enabled,
            "managerConfig": {"controllerManagerConfigYaml": yaml.safe_dump(render_kueue_config(spec), sort_keys=False)}}


def render_kueue_objects(spec: ClusterSpec) -> list[Manifest]:
    """A flavor per node pool Kueue schedules, the Topology, the shared Cohort and the priority classes."""
    k = spec.kubernetes.kueue
    out = []
    for pool in spec.kueue_pools:
        out.append(Manifest(f"flavor-{pool.name}", {
            "apiVersion": KUEUE_API, "kind": "ResourceFlavor", "metadata": {"name": pool.name},
            "spec": {"nodeLabels": {POOL_LABEL: pool.name}, "tolerations": pool_tolerations(pool),
                     "topologyName": TOPOLOGY}}))
    out.append(Manifest("topology", {"apiVersion": KUEUE_API, "kind": "Topology", "metadata": {"name": TOPOLOGY},
                                     "spec": {"levels": [{"nodeLabel": label} for label in k.topology_levels]}}))
    out.append(Manifest("cohort", {"apiVersion": KUEUE_API, "kind": "Cohort", "metadata": {"name": k.cohort},
                                   "spec": {}}))
    for pc in k.priority_classes:
        obj = {"apiVersion": KUEUE_API, "kind": "WorkloadPriorityClass", "metadata": {"name": pc.name},
               "value": pc.value}
        if pc.description:
            obj["description"] = pc.description
        out.append(Manifest(f"priority-{pc.name}", obj))
    return out
