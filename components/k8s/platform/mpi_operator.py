"""The Kubeflow MPI operator: the controller that turns an MPIJob into a launcher Job and worker pods.

The NCCL check and tenants' MPI training submit MPIJobs (kubeflow.org/v2beta1); Kueue's MPIJob integration
suspends each one and admits it as one workload, launcher and workers together. Upstream ships no chart, only a
release manifest: its CRD is applied from the pinned release (or the site's copy); the controller's namespace,
RBAC and Deployment are rendered here, so they carry the mirror, pod security and resources of this library.
The RBAC is the release's own (manifests/base/cluster-role.yaml of v0.8.2); tenants get MPIJobs through the
built-in admin/edit/view roles they are bound to.
"""

from __future__ import annotations

from typing import Any

from ...spec import ClusterSpec
from ...spec.cluster import OPERATOR_NAMESPACES
from ...spec.kubernetes import MpiOperatorSettings
from ..objects import Manifest, rbac_rule

NAMESPACE = OPERATOR_NAMESPACES["mpi_operator"]
IMAGE = "docker.io/mpioperator/mpi-operator"
CRD = "kubeflow.org_mpijobs.yaml"
NAME = "mpi-operator"
_LABELS = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/managed-by": "pulumi"}
_MPIJOBS = ["mpijobs", "mpijobs/status"]


def crd_source(m: MpiOperatorSettings) -> str:
    """Where the MPIJob CRD comes from: the project file, the site's URL, or the pinned release upstream."""
    return m.crd_path or m.crd_url or \
        f"https://raw.githubusercontent.com/kubeflow/mpi-operator/{m.version}/manifests/base/{CRD}"


def image(m: MpiOperatorSettings) -> str:
    return f"{IMAGE}:{m.version.lstrip('v')}"


def _controller_rules() -> list[dict[str, Any]]:
    """What the controller does: pods, services, config maps and secrets (the SSH keys and hostfile) per job,
    the launcher's Job, events, its leader lease, and reading priority classes; gang-scheduling groups of the
    schedulers it can drive (off here: Kueue admits the gang)."""
    return [
        rbac_rule([""], ["configmaps", "secrets", "services"], ["create", "list", "watch", "update"]),
        rbac_rule([""], ["pods"], ["create", "get", "list", "watch", "delete", "update", "patch"]),
        rbac_rule([""], ["pods/exec"], ["create"]),                    # granted on to each launcher's Role
        rbac_rule([""], ["endpoints"], ["create", "get", "update"]),
        rbac_rule([""], ["events"], ["create", "patch"]),
        rbac_rule(["batch"], ["jobs"], ["create", "list", "update", "watch"]),
        rbac_rule(["apiextensions.k8s.io"], ["customresourcedefinitions"], ["create", "get"]),
        rbac_rule(["kubeflow.org"], ["mpijobs", "mpijobs/finalizers", "mpijobs/status"], ["*"]),
        rbac_rule(["coordination.k8s.io"], ["leases"], ["*"]),
        rbac_rule(["scheduling.incubator.k8s.io", "scheduling.sigs.dev", "scheduling.volcano.sh"],
                  ["queues", "podgroups"], ["*"]),
        rbac_rule(["scheduling.x-k8s.io"], ["podgroups"], ["*"]),
        rbac_rule(["scheduling.k8s.io"], ["priorityclasses"], ["get", "list", "watch"]),
    ]


def render_mpi_operator(spec: ClusterSpec) -> list[Manifest]:
    """Service account, RBAC (the controller's, and MPIJobs aggregated into the built-in roles) and the
    controller's Deployment; its namespace (pod security restricted) is the stack's, with the others'."""
    meta = {"labels": dict(_LABELS)}
    aggregate = {"rbac.authorization.k8s.io/aggregate-to-admin": "true",
                 "rbac.authorization.k8s.io/aggregate-to-edit": "true"}
    container = {
        "name": NAME, "image": image(spec.kubernetes.mpi_operator),
        "args": ["-alsologtostderr", f"--lock-namespace={NAMESPACE}", "--kube-api-qps=50", "--kube-api-burst=100"],
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
        # distroless image, run as its nonroot user so the namespace can enforce the restricted profile
        "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "allowPrivilegeEscalation": False,
                            "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]},
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]}
    selector = {"app.kubernetes.io/name": NAME}
    return [
        Manifest("mpi-operator-sa", {"apiVersion": "v1", "kind": "ServiceAccount",
                                     "metadata": {"name": NAME, "namespace": NAMESPACE, **meta}}),
        Manifest("mpi-operator-role", {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                                       "metadata": {"name": NAME, **meta}, "rules": _controller_rules()}),
        Manifest("mpi-operator-binding", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": NAME, **meta},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
            "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]}),
        Manifest("mpijobs-edit", {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                                  "metadata": {"name": "gpucluster-mpijobs-edit",
                                               "labels": {**_LABELS, **aggregate}},
                                  "rules": [rbac_rule(["kubeflow.org"], _MPIJOBS,
                                                      ["get", "list", "watch", "create", "delete",
                                                       "deletecollection", "patch", "update"])]}),
        Manifest("mpijobs-view", {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                                  "metadata": {"name": "gpucluster-mpijobs-view", "labels": {
                                      **_LABELS, "rbac.authorization.k8s.io/aggregate-to-view": "true"}},
                                  "rules": [rbac_rule(["kubeflow.org"], _MPIJOBS, ["get", "list", "watch"])]}),
        Manifest("mpi-operator", {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {
            "name": NAME, "namespace": NAMESPACE, **meta}, "spec": {
            "replicas": 1, "selector": {"matchLabels": selector},
            "template": {"metadata": {"labels": {**_LABELS, **selector}}, "spec": {
                "serviceAccountName": NAME, "containers": [container],
                "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}]}}}}),
    ]
