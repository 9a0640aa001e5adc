"""What the policies share: resource types, reading Kubernetes objects and component intent, and config.

Policies read what the program registered (resource inputs; for components, the outputs the engine hands to
stack policies, which carry each component's slice of the spec as `spec`), never the library's Python objects:
the pack runs in its own environment, beside any program that uses the components.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from pulumi_policy import PolicyConfigSchema
from pulumi_policy.proxy import UnknownValueError

NAMESPACE = "kubernetes:core/v1:Namespace"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
ROLE = "kubernetes:rbac.authorization.k8s.io/v1:Role"
CLUSTER_ROLE = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole"
ROLE_BINDING = "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding"
CLUSTER_ROLE_BINDING = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding"
KUEUE = "kueue.x-k8s.io"          # Kueue's API group: its objects are matched by kind, at any served version
PROMETHEUS_RULE = "kubernetes:monitoring.coreos.com/v1:PrometheusRule"
HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
REMOTE_COMMAND = "command:remote:Command"
REMOTE_COPY = "command:remote:CopyToRemote"

# One token per component, from Python and from the component provider alike (components/types.py).
CLUSTER = "gpucluster:index:GpuCluster"
NODE_POOL = "gpucluster:index:GpuNodePool"
FABRIC = "gpucluster:index:Fabric"
PARTITIONS = "gpucluster:index:FabricPartitions"
VLANS = "gpucluster:index:FabricVlans"
K8S_STACK = "gpucluster:index:GpuKubernetesStack"
TENANT = "gpucluster:index:Tenant"
FILESYSTEM = "gpucluster:index:ParallelFilesystem"

TENANT_LABEL = "gpucluster.io/tenant"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GPU = "nvidia.com/gpu"
# Where the library's operators run when no GpuCluster says (Kubernetes' own kube-system among them; `default`,
# kube-public and kube-node-lease hold nothing of the platform's).
SYSTEM_NAMESPACES = ("kube-system", "gpu-operator", "network-operator", "kueue-system", "node-feature-discovery",
                     "mpi-operator", "nrr-system", "gpu-health-checks", "monitoring")

_TYPE = re.compile(r"kubernetes:([^:/]+)/([^:/]+):([A-Za-z0-9]+)$")


def kind_of(resource_type: str) -> tuple[str, str] | None:
    """(API group, kind) of a Kubernetes resource type at any version ('core' for the core group)."""
    m = _TYPE.match(resource_type)
    return (m.group(1), m.group(3)) if m else None


def is_kind(resource_type: str, group: str, kind: str) -> bool:
    """Kubernetes objects are matched by group and kind: an API server serves older versions of a type (Kueue's
    v1beta1 beside v1beta2) and a program may register any of them."""
    return kind_of(resource_type) == (group, kind)


class Workload(NamedTuple):
    """Where a workload kind keeps its pod templates (role, path) and the labels Kueue reads its queue from.
    A path is dotted keys; `[]` takes each list item (its role: the item's name), `{}` each map value (its role:
    the key), and a key with `*` each matching key."""
    pods: tuple[tuple[str, str], ...]
    queue_labels: str = "metadata.labels"


_TEMPLATE = (("", "spec.template.spec"),)
_JOBSET = "spec.replicatedJobs[].template.spec.template.spec"
_RAY = "{}.headGroupSpec.template.spec", "{}.workerGroupSpecs[].template.spec"
# Every kind a tenant can submit that runs pods, and where those pods are described: one table for every
# workload policy. Kueue's integrations (batch/Job, JobSet, LeaderWorkerSet, RayJob, RayCluster, Kubeflow jobs,
# TrainJob, Pod, Deployment, StatefulSet) read the queue from the object's own labels, a CronJob's from its jobs'.
WORKLOADS: dict[tuple[str, str], Workload] = {
    ("core", "Pod"): Workload((("", "spec"),)),
    ("core", "ReplicationController"): Workload(_TEMPLATE),
    **{("apps", kind): Workload(_TEMPLATE) for kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet")},
    ("batch", "Job"): Workload(_TEMPLATE),
    ("batch", "CronJob"): Workload((("", "spec.jobTemplate.spec.template.spec"),), "spec.jobTemplate.metadata.labels"),
    ("jobset.x-k8s.io", "JobSet"): Workload((("", _JOBSET),)),
    ("leaderworkerset.x-k8s.io", "LeaderWorkerSet"): Workload((
        ("leader", "spec.leaderWorkerTemplate.leaderTemplate.spec"),
        ("worker", "spec.leaderWorkerTemplate.workerTemplate.spec"))),
    ("ray.io", "RayCluster"): Workload((("head", _RAY[0].format("spec")), ("", _RAY[1].format("spec")))),
    ("ray.io", "RayJob"): Workload((("head", _RAY[0].format("spec.rayClusterSpec")),
                                    ("", _RAY[1].format("spec.rayClusterSpec")),
                                    ("submitter", "spec.submitterPodTemplate.spec"))),
    ("ray.io", "RayService"): Workload((("head", _RAY[0].format("spec.rayClusterConfig")),
                                        ("", _RAY[1].format("spec.rayClusterConfig")))),
    **{("kubeflow.org", kind): Workload((("", "spec.*ReplicaSpecs.{}.template.spec"),))
       for kind in ("MPIJob", "PyTorchJob", "TFJob", "XGBoostJob", "PaddleJob", "JAXJob")},
    ("trainer.kubeflow.org", "TrainJob"): Workload((
        ("", "spec.podTemplateOverrides[].spec"),
        ("", "spec.runtimePatches[].trainingRuntimeSpec.template.spec.replicatedJobs[].template.spec.template.spec"))),
    **{("trainer.kubeflow.org", kind): Workload((("", "spec.template." + _JOBSET),))
       for kind in ("TrainingRuntime", "ClusterTrainingRuntime")},
}


def guarded(validate: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
    """A policy that meets a value it cannot read reports that, under its own name and level, instead of raising:
    an exception in a policy fails the engine's whole preview with a Python traceback. Unknown values still
    reach the SDK, which turns them into its advisory 'can't run during preview' note."""
    @functools.wraps(validate)
    def run(args: Any, report: Any) -> None:
        try:
            validate(args, report)
        except UnknownValueError:
            raise
        except Exception as e:                      # noqa: BLE001 - any defect of ours, reported not raised
            where = f"resource {args.name}" if hasattr(args, "name") else "the stack"
            report(f"could not check {where}: {type(e).__name__}: {e}. The policy pack cannot read a value it was "
                   "given; nothing was checked by this policy there: report it with the resource's inputs")
    return run


# Readers of registered values. A program can register any JSON where a policy expects a number or an object
# (another program, an older component, a typo in a manifest): a value of the wrong type reads as absent.

def mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def items(value: Any) -> Sequence[Any]:
    """A list's items (the SDK hands lists over as Sequence proxies); nothing for any other value."""
    return value if isinstance(value, Sequence) and not isinstance(value, (str, bytes)) else ()


def maps(value: Any) -> list[Mapping[str, Any]]:
    """The objects of a list of objects."""
    return [v for v in items(value) if isinstance(v, Mapping)]


def strings(value: Any) -> list[str]:
    return [v for v in items(value) if isinstance(v, str)]


def dig(value: Any, *keys: str) -> Any:
    for key in keys:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def number(value: Any) -> float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def shown(value: Any) -> str:
    """A value as written in a spec or manifest: numbers crossed the wire as doubles (8.0 is 8)."""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else format(value, ".10g")
    return str(value)


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
    return mapping(dig(props, "metadata"))


def labels(props: Mapping[str, Any]) -> Mapping[str, Any]:
    return mapping(metadata(props).get("labels"))


def name_of(props: Mapping[str, Any]) -> str | None:
    return text(metadata(props).get("name"))


def namespace_of(props: Mapping[str, Any]) -> str | None:
    return text(metadata(props).get("namespace"))


def text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def tenant_namespaces(resources: Sequence[Any]) -> dict[str, Any]:
    """Tenant namespace name -> its Namespace resource. A system namespace with the tenant label is the
    platform's (the active health checks' carries it so that Kueue queues their Jobs), not a tenant's."""
    system = system_namespaces(resources)
    return {name_of(r.props): r for r in of_type(resources, NAMESPACE)
            if TENANT_LABEL in labels(r.props) and name_of(r.props) and name_of(r.props) not in system}


def _walk(value: Any, keys: list[str], role: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    if not keys:
        if isinstance(value, Mapping):
            yield role, value
        return
    key, rest = keys[0], keys[1:]
    if key == "[]":
        for item in items(value):
            name = item.get("name") or item.get("groupName") if isinstance(item, Mapping) else None
            yield from _walk(item, rest, " ".join(str(p) for p in (role, name) if p))
    elif key == "{}":
        for k, item in sorted(value.items()) if isinstance(value, Mapping) else ():
            yield from _walk(item, rest, " ".join(p for p in (role, str(k)) if p))
    elif isinstance(value, Mapping):
        for k in (sorted(k for k in value if fnmatch.fnmatchcase(str(k), key)) if "*" in key else [key]):
            if k in value:
                yield from _walk(value[k], rest, role)


def _path(path: str) -> list[str]:
    return [k for part in path.split(".") for k in re.split(r"(\[\]|\{\})", part) if k]


def workload(resource_type: str) -> tuple[str, Workload] | None:
    """(kind, where it keeps its pods) of a workload type; None for any other type."""
    kind = kind_of(resource_type)
    return (kind[1], WORKLOADS[kind]) if kind in WORKLOADS else None


def pod_specs(resource_type: str, props: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(kind and role, pod spec) of each pod template of a workload object; nothing for other objects."""
    found = workload(resource_type)
    for role, path in found[1].pods if found else ():
        for name, spec in _walk(props, _path(path), role):
            yield " ".join(p for p in (found[0], name) if p), spec


def queue_label(resource_type: str, props: Mapping[str, Any]) -> Any:
    """The Kueue queue a workload object names (None: none), from where Kueue reads it for that kind."""
    found = workload(resource_type)
    labels_ = next((v for _, v in _walk(props, _path(found[1].queue_labels), "")), {}) if found else {}
    return mapping(labels_).get(QUEUE_LABEL)


def containers(pod_spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [*maps(pod_spec.get("initContainers")), *maps(pod_spec.get("containers"))]


def intent(resource: Any) -> Mapping[str, Any]:
    """A component's slice of the spec, as it registered it."""
    return mapping(resource.props.get("spec"))


def environment(resources: Sequence[Any]) -> str | None:
    clusters = of_type(resources, CLUSTER)
    return text(clusters[0].props.get("environment")) if clusters else None


def in_shard(resources: Sequence[Any]) -> bool:
    """A shard's stack of a split environment (README: Split stacks): its GPU pools alone."""
    clusters = of_type(resources, CLUSTER)
    return bool(clusters) and text(clusters[0].props.get("part")) not in (None, "platform")


def whole_environment(validate: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
    """A stack policy that asks for something the environment must have somewhere (an alert, a queue): in a
    shard's stack, which holds GPU pools alone, it stays silent, and the platform stack's run of the pack gives
    the verdict. Every other policy checks what each stack holds."""
    @functools.wraps(validate)
    def run(args: Any, report: Any) -> None:
        if not in_shard(args.resources):
            validate(args, report)
    return run


def system_namespaces(resources: Sequence[Any]) -> set[str]:
    clusters = of_type(resources, CLUSTER)
    return set(strings(clusters[0].props.get("system_namespaces"))) if clusters else set(SYSTEM_NAMESPACES)


class SecretStr(str):
    """A string that came to the pack as a Pulumi secret: equal to its value everywhere, and telling a policy
    that it is encrypted in the state and masked in logs (the policy SDK unwraps secrets before policies see
    them, and the real engine hands them over with their values)."""


def _marked(value: Any) -> Any:
    if isinstance(value, str):
        return SecretStr(value)
    if isinstance(value, dict):
        return {k: _marked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_marked(v) for v in value]
    return value


def mark_secrets() -> None:
    """Every string inside a secret reaches validation policies as a SecretStr, under the real engine and in
    `gpucluster check` alike (both run the SDK's analyzer, which this patches once, on import of the pack).
    Remediations, which write secrets back, get them wrapped as the SDK makes them."""
    from pulumi_policy import deserialize

    unwrapped = deserialize._deserialize_property
    if getattr(unwrapped, "marks_secrets", False):
        return

    def marking(prop: Any, proxy_secrets: bool = False) -> Any:
        value = unwrapped(prop, proxy_secrets)
        if (not proxy_secrets and isinstance(prop, dict)
                and prop.get(deserialize.SPECIAL_SIG_KEY) == deserialize.SPECIAL_SECRET_SIG):
            return _marked(value)
        return value

    marking.marks_secrets = True  # type: ignore[attr-defined]
    deserialize._deserialize_property = marking
