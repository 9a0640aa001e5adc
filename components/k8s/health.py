"""Runtime GPU health: node-problem-detector on every GPU node, watching the kernel log for the driver's XIDs.

node-problem-detector (kubernetes/node-problem-detector, SIG Node) is the maintained engine for node problems:
its kernel monitor reads /dev/kmsg and sets node conditions and events by pattern, which is all a GPU XID needs
(the driver logs `NVRM: Xid (PCI:...): <n>, ...` for every one). A hardware XID sets the permanent condition
GpuHardwareFault; every XID is a Node event. The monitor looks back over the whole boot, so a restarted monitor
finds the fault again (a reboot clears the kernel log, and the condition with it). The manifests are upstream's
deployment (deployment/node-problem-detector.yaml and rbac.yaml of the release) with our monitor config, on GPU
nodes only, tolerating every taint: a monitor must keep running on a quarantined node.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..spec import ClusterSpec
from ..spec.hardware import XID_LINE, xid_pattern
from .images import mirrored
from .labels import POOL_LABEL
from .objects import Manifest

NAMESPACE = "kube-system"            # where upstream deploys it, beside the node's other system agents
NAME = "gpucluster-gpu-health"       # not upstream's name: a distribution's own detector may run there too
IMAGE = "registry.k8s.io/node-problem-detector/node-problem-detector"
CONDITION = "GpuHardwareFault"
MONITOR = "gpu-xid-monitor.json"
# The bootstrap ClusterRole every apiserver creates for node-problem-detector: read nodes, patch their status,
# write events (kubernetes/plugin/pkg/auth/authorizer/rbac/bootstrappolicy).
CLUSTER_ROLE = "system:node-problem-detector"
_LABELS = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/managed-by": "pulumi"}
_ANY_XID = XID_LINE + "[0-9]+,"


def monitor_config(spec: ClusterSpec) -> dict[str, Any]:
    """The kernel monitor's configuration (node-problem-detector's system-log-monitor format)."""
    xids = sorted(set(spec.kubernetes.health.fault_xids))
    return {
        "plugin": "kmsg", "logPath": "/dev/kmsg",
        # The whole boot: a fault stays reported when the monitor restarts, until a reboot clears the kernel log.
        "lookback": "87600h", "bufferSize": 10, "source": "gpu-xid-monitor", "metricsReporting": True,
        "conditions": [{"type": CONDITION, "reason": "NoGpuHardwareXid",
                        "message": "no GPU hardware XID in the kernel log since boot"}],
        "rules": [{"type": "temporary", "reason": "GpuXid", "pattern": _ANY_XID + ".*"},
                  *({"type": "permanent", "condition": CONDITION, "reason": f"GpuXid{x}",
                     "pattern": xid_pattern([x]) + ".*"} for x in xids)],
    }


def image(spec: ClusterSpec) -> str:
    return mirrored(f"{IMAGE}:{spec.kubernetes.health.npd_version}", spec)


def render_gpu_health(spec: ClusterSpec) -> list[Manifest]:
    """Service account bound to the bootstrap role, the monitor's ConfigMap and the DaemonSet on GPU nodes."""
    meta = {"namespace": NAMESPACE, "labels": dict(_LABELS)}
    container = {
        "name": "node-problem-detector", "image": image(spec),
        "command": ["/node-problem-detector", "--logtostderr", f"--config.system-log-monitor=/config/{MONITOR}"],
        "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
        # No requests (nor limits, which would set them): a GPU job may take a node's whole allocatable, and a
        # request would leave the detector pending there or, at its critical priority, preempt the tenant's pod.
        # Upstream's 10m and 80Mi are what it uses; the priority keeps the kubelet from evicting it first.
        "securityContext": {"privileged": True},           # reads /dev/kmsg, as upstream's deployment does
        "volumeMounts": [{"name": "kmsg", "mountPath": "/dev/kmsg", "readOnly": True},
                         {"name": "localtime", "mountPath": "/etc/localtime", "readOnly": True},
                         {"name": "config", "mountPath": "/config", "readOnly": True}]}
    selector = {"app.kubernetes.io/name": NAME}
    config = json.dumps(monitor_config(spec), indent=2) + "\n"
    # The detector reads its config once, at start: a changed config rolls the pods (the look back finds any
    # fault again).
    checksum = {"gpucluster.io/config-sha256": hashlib.sha256(config.encode()).hexdigest()}
    gpu_nodes = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": POOL_LABEL, "operator": "Exists"}]}]}}}
    return [
        Manifest("gpu-health-sa", {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": NAME, **meta}}),
        Manifest("gpu-health-binding", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": NAME, "labels": dict(_LABELS)},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": CLUSTER_ROLE},
            "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]}),
        Manifest("gpu-health-config", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": NAME, **meta},
                                       "data": {MONITOR: config}}),
        Manifest("gpu-health", {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": NAME, **meta},
                                "spec": {"selector": {"matchLabels": selector}, "template": {
                                    "metadata": {"labels": {**_LABELS, **selector}, "annotations": checksum},
                                    "spec": {
                                        "serviceAccountName": NAME, "priorityClassName": "system-node-critical",
                                        "affinity": gpu_nodes, "containers": [container],
                                        "tolerations": [{"operator": "Exists", "effect": "NoSchedule"},
                                                        {"operator": "Exists", "effect": "NoExecute"}],
                                        "volumes": [
                                            {"name": "kmsg", "hostPath": {"path": "/dev/kmsg", "type": "CharDevice"}},
                                            {"name": "localtime", "hostPath": {"path": "/etc/localtime", "type": "File"}},
                                            {"name": "config", "configMap": {"name": NAME}}]}}}}),
    ]
