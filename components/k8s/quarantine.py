"""Quarantine: node-readiness-controller (kubernetes-sigs) taints a GPU node while its health conditions say so.

A second rule, `gpucluster-gpu-reset`, taints a node NoSchedule while GpuResetRequired is True (an XID that NVIDIA's
catalog resolves by a GPU reset or a reboot): new work waits, the jobs there run on, the reboot releases it.

One NodeReadinessRule on every GPU node, in continuous enforcement: its taint stays while GpuHardwareFault,
GpuBurnInRequired or FabricPortFault (health.py), or GpuOverheating or GpuNvlinkDown (health_nvml.py, when the spec
quarantines on them) is anything but False, and goes once all are False again. A condition the
detector has not yet reported counts as False (the rule's defaultStatus; upstream's "problem gate" pattern), so
a new node waits only for its burn-in taint. Draining is Kubernetes' own: a NoExecute taint makes the taint
eviction controller evict every pod that does not tolerate it, and Kueue (TASReplaceNodeOnNodeTaints and
TASFailedNodeReplacement, on by default in 0.19) requeues the workloads whose pods were there.

Upstream ships no chart for it yet (registry.k8s.io OCI is "WIP"), only release manifests: the CRD is applied
from the pinned release's crds.yaml (or the site's copy); the namespace, RBAC and Deployment are rendered here
from its config/ (rbac/role.yaml, rbac/leader_election_role.yaml, manager/manager.yaml of v0.5.0), without the
optional webhook and secure metrics, which need cert-manager.

The rule's conditions, taint, selector and mode are immutable (CEL in its CRD), and its deletion removes its
taint from every node (the controller's cleanup finalizer). A rule deleted before its replacement would lift
every quarantine until the new one reconciled, so each rule's name ends in a digest of its spec: a change is a
new rule, created first (its taints go on), and the old one deleted after. `gpucluster diff` flags any
delete-first replacement of a taint-owning object (diff.TAINT_OWNERS).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..spec import ClusterSpec
from ..spec.cluster import OPERATOR_NAMESPACES
from . import health_nvml
from .health import QUARANTINE_CONDITIONS, RESET_CONDITION
from .images import mirrored
from .labels import POOL_LABEL, QUARANTINE_TAINT, RESET_TAINT, TOLERATE_EVERY_TAINT
from .objects import Manifest, rbac_rule

NAMESPACE = OPERATOR_NAMESPACES["node_readiness"]
NAME = "nrr-controller-manager"
RULE = "gpucluster-gpu-health"
RESET_RULE = "gpucluster-gpu-reset"
RULE_LABEL = "gpucluster.io/readiness-rule"     # which rule a digest-named NodeReadinessRule is (RULE, RESET_RULE)
IMAGE = "registry.k8s.io/node-readiness-controller/node-readiness-controller"
GROUP = "readiness.node.x-k8s.io"
_LABELS = {"app.kubernetes.io/name": "node-readiness-controller", "app.kubernetes.io/managed-by": "pulumi"}


def enabled(spec: ClusterSpec) -> bool:
    h = spec.kubernetes.health
    return h.enabled and h.quarantine.mode != "off"


def crd_source(spec: ClusterSpec) -> str:
    """Where the NodeReadinessRule CRD comes from: the project file, the site's URL, or the pinned release."""
    q = spec.kubernetes.health.quarantine
    return q.crd_path or q.crd_url or \
        f"https://github.com/kubernetes-sigs/node-readiness-controller/releases/download/{q.version}/crds.yaml"


def conditions(spec: ClusterSpec) -> tuple[str, ...]:
    """The conditions that hold a node: the kernel detector's, and those of the NVML detector the spec
    quarantines on (health.gpu_monitor.quarantine_on)."""
    return QUARANTINE_CONDITIONS + health_nvml.quarantine_conditions(spec)


def image(spec: ClusterSpec) -> str:
    return mirrored(f"{IMAGE}:{spec.kubernetes.health.quarantine.version}", spec)


def taint_effect(spec: ClusterSpec) -> str:
    return "NoExecute" if spec.kubernetes.health.quarantine.drain else "NoSchedule"


def rule_name(base: str, rule_spec: dict[str, Any]) -> str:
    """`<base>-<digest of the spec>`: a changed rule is a new object, created before the old one is deleted."""
    return f"{base}-{hashlib.sha256(json.dumps(rule_spec, sort_keys=True).encode()).hexdigest()[:8]}"


def _rule(spec: ClusterSpec, role: str, base: str, conditions: tuple[str, ...], taint: dict[str, str]) -> Manifest:
    rule_spec = {
        "conditions": [{"type": c, "requiredStatus": "False", "defaultStatus": "False"} for c in conditions],
        "taint": taint,
        "enforcementMode": "continuous",
        "nodeSelector": {"matchExpressions": [{"key": POOL_LABEL, "operator": "Exists"}]},
        "dryRun": spec.kubernetes.health.quarantine.mode == "observe"}
    return Manifest(role, {
        "apiVersion": f"{GROUP}/v1alpha1", "kind": "NodeReadinessRule",
        "metadata": {"name": rule_name(base, rule_spec), "labels": {**_LABELS, RULE_LABEL: base}},
        "spec": rule_spec})


def render_rule(spec: ClusterSpec) -> Manifest:
    """The quarantine: a fault that needs NVIDIA's diagnosis, or one not yet followed by a passing burn-in."""
    return _rule(spec, "quarantine-rule", RULE, conditions(spec),
                 {"key": QUARANTINE_TAINT, "value": "gpu-fault", "effect": taint_effect(spec)})


def render_reset_rule(spec: ClusterSpec) -> Manifest:
    """A GPU that needs a reset (GpuResetRequired): NoSchedule whatever `drain` says, so the jobs already there
    run on and new work waits; the reboot that resets the GPU clears the condition and the taint."""
    return _rule(spec, "reset-rule", RESET_RULE, (RESET_CONDITION,),
                 {"key": RESET_TAINT, "value": "gpu-reset", "effect": "NoSchedule"})


def render_rules(spec: ClusterSpec) -> list[Manifest]:
    return [render_rule(spec), render_reset_rule(spec)]


def render_controller(spec: ClusterSpec) -> list[Manifest]:
    """Service account, its cluster role (nodes and rules) and leader-election role, and the Deployment."""
    meta = {"namespace": NAMESPACE, "labels": dict(_LABELS)}
    cluster_rules = [
        rbac_rule([""], ["nodes"], ["get", "list", "patch", "update", "watch"]),
        rbac_rule([""], ["nodes/status"], ["get"]),
        rbac_rule(["", "events.k8s.io"], ["events"], ["create", "patch"]),
        rbac_rule([GROUP], ["nodereadinessrules"], ["get", "list", "patch", "update", "watch"]),
        rbac_rule([GROUP], ["nodereadinessrules/finalizers"], ["update"]),
        rbac_rule([GROUP], ["nodereadinessrules/status"], ["get", "patch", "update"])]
    election_rules = [
        rbac_rule(["coordination.k8s.io"], ["leases"], ["get", "list", "watch", "create", "update", "patch", "delete"]),
        rbac_rule([""], ["events"], ["create", "patch"])]
    subject = [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]
    selector = {"app.kubernetes.io/name": "node-readiness-controller", "control-plane": "controller-manager"}
    probe = lambda path, delay, period: {"httpGet": {"path": path, "port": 8081},  # noqa: E731
                                         "initialDelaySeconds": delay, "periodSeconds": period}
    container = {
        "name": "manager", "image": image(spec), "command": ["/manager"],
        "args": ["--leader-elect", "--health-probe-bind-address=:8081"],
        "ports": [{"containerPort": 8081, "name": "http"}],
        "securityContext": {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]}},
        "livenessProbe": probe("/healthz", 15, 20), "readinessProbe": probe("/readyz", 5, 10),
        "resources": {"limits": {"cpu": "500m", "memory": "128Mi"}, "requests": {"cpu": "10m", "memory": "64Mi"}}}
    return [
        Manifest("quarantine-sa", {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": NAME, **meta}}),
        Manifest("quarantine-role", {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                                     "metadata": {"name": NAME, "labels": dict(_LABELS)}, "rules": cluster_rules}),
        Manifest("quarantine-binding", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": NAME, "labels": dict(_LABELS)},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
            "subjects": subject}),
        Manifest("quarantine-election-role", {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                                              "metadata": {"name": f"{NAME}-leader-election", **meta},
                                              "rules": election_rules}),
        Manifest("quarantine-election-binding", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": f"{NAME}-leader-election", **meta},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"{NAME}-leader-election"},
            "subjects": subject}),
        Manifest("quarantine-controller", {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": NAME, **meta},
            "spec": {"replicas": 1, "selector": {"matchLabels": selector}, "template": {
                "metadata": {"labels": {**_LABELS, **selector},
                             "annotations": {"kubectl.kubernetes.io/default-container": "manager"}},
                "spec": {
                    # Cluster-critical, as upstream: without it no node leaves quarantine.
                    "priorityClassName": "system-cluster-critical", "serviceAccountName": NAME,
                    "terminationGracePeriodSeconds": 10,
                    "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                    # Upstream tolerates every taint, so it runs on control-plane nodes too; here it also stays
                    # off GPU nodes, whose allocatable the job templates hand out whole (its memory there would
                    # keep a job that takes a whole node from fitting). A cluster without a node outside the
                    # pools (control-plane nodes count) leaves it pending, and `pulumi up`, which awaits it, fails
                    # naming it.
                    "tolerations": [dict(t) for t in TOLERATE_EVERY_TAINT],
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [{"key": POOL_LABEL,
                                                                     "operator": "DoesNotExist"}]}]}}},
                    "containers": [container]}}}}),
    ]
