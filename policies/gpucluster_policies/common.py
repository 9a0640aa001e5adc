"""What the policies share: resource types, reading Kubernetes objects and component intent, and config.

Policies read what the program registered (resource inputs; for components, the outputs the engine hands to
stack policies, which carry each component's slice of the spec as `spec`), never the library's Python objects:
the pack runs in its own environment, beside any program that uses the components.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from pulumi_policy import PolicyConfigSchema

NAMESPACE = "kubernetes:core/v1:Namespace"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
ROLE = "kubernetes:rbac.authorization.k8s.io/v1:Role"
CLUSTER_ROLE = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole"
ROLE_BINDING = "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding"
CLUSTER_ROLE_BINDING = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding"
LOCAL_QUEUE = "kubernetes:kueue.x-k8s.io/v1beta2:LocalQueue"
CLUSTER_QUEUE = "kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue"
PROMETHEUS_RULE = "kubernetes:monitoring.coreos.com/v1:PrometheusRule"
HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
REMOTE_COMMAND = "command:remote:Command"

CLUSTER = "gpucluster:index:GpuCluster"
NODE_POOL = "gpucluster:nodes:GpuNodePool"
FABRIC = "gpucluster:fabric:Fabric"
K8S_STACK = "gpucluster:k8s:GpuKubernetesStack"
TENANT = "gpucluster:k8s:Tenant"
FILESYSTEM = "gpucluster:storage:ParallelFilesystem"

TENANT_LABEL = "gpucluster.io/tenant"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GPU = "nvidia.com/gpu"
# Used when no GpuCluster says which namespaces the platform's own agents run in.
SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease", "gpu-operator",
                     "network-operator", "kueue-system", "node-feature-discovery", "monitoring")

_WORKLOAD = re.compile(r"kubernetes:(?:core|apps|batch)/v1:(Pod|Job|CronJob|Deployment|StatefulSet|DaemonSet|"
                       r"ReplicaSet|ReplicationController)$")
# Training operators' jobs (MPIJob, PyTorchJob, ...) keep a pod template per replica type.
_REPLICATED = re.compile(r"kubernetes:kubeflow\.org/[a-z0-9]+:([A-Za-z]+Job)$")


def shown(value: Any) -> str:
    """A value as written in a spec or manifest: numbers crossed the wire as doubles (8.0 is 8)."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def schema(**properties: dict[str, Any]) -> PolicyConfigSchema:
    """A config schema whose every property has a default, so a policy runs unconfigured."""
    assert all("default" in p for p in properties.values()), "every setting needs a default"
    return PolicyConfigSchema(properties=properties)


def settings(args: Any, config_schema: PolicyConfigSchema) -> dict[str, Any]:
    """The schema's defaults overlaid with the stack's policy config (the engine fills defaults the same way)."""
    given = args.get_config() or {}
    return {k: given.get(k, p["default"]) for k, p in config_schema.properties.items()}


def of_type(resources: Iterable[Any], *types: str) -> list[Any]:
    return [r for r in resources if r.resource_type in types]


def metadata(props: Mapping[str, Any]) -> Mapping[str, Any]:
    return props.get("metadata") or {}


def labels(props: Mapping[str, Any]) -> Mapping[str, Any]:
    return metadata(props).get("labels") or {}


def tenant_namespaces(resources: Iterable[Any]) -> dict[str, Any]:
    """Tenant namespace name -> its Namespace resource."""
    return {metadata(r.props).get("name"): r for r in of_type(resources, NAMESPACE) if TENANT_LABEL in labels(r.props)}


def pod_specs(resource_type: str, props: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(kind, pod spec) of a workload object; nothing for other objects."""
    m = _WORKLOAD.match(resource_type)
    if m is None:
        replicated = _REPLICATED.match(resource_type)
        if replicated is not None:
            for key, replicas in (props.get("spec") or {}).items():
                if key.endswith("ReplicaSpecs"):
                    for role in sorted(replicas):
                        yield f"{replicated.group(1)} {role}", (replicas[role].get("template") or {}).get("spec") or {}
        return
    kind, spec = m.group(1), props.get("spec") or {}
    if kind == "Pod":
        yield kind, spec
    elif kind == "CronJob":
        yield kind, (((spec.get("jobTemplate") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
    else:
        yield kind, (spec.get("template") or {}).get("spec") or {}


def containers(pod_spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [*(pod_spec.get("initContainers") or []), *(pod_spec.get("containers") or [])]


def intent(resource: Any) -> Mapping[str, Any]:
    """A component's slice of the spec, as it registered it."""
    return resource.props.get("spec") or {}


def environment(resources: Sequence[Any]) -> str | None:
    clusters = of_type(resources, CLUSTER)
    return clusters[0].props.get("environment") if clusters else None


def system_namespaces(resources: Sequence[Any]) -> set[str]:
    clusters = of_type(resources, CLUSTER)
    return set(clusters[0].props.get("system_namespaces") or ()) if clusters else set(SYSTEM_NAMESPACES)
