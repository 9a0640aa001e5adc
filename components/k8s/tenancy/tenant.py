"""Tenant: a namespace a team can use safely, with its Kueue queues, RBAC, isolation and limits.

Who guards what (a deliberate split, see ../shared/reference/k8s-gpu-stack.md):
- Kueue guards GPUs, CPU and memory. A namespace ResourceQuota counts *pods*, not admitted workloads, so
  a quota on nvidia.com/gpu (or cpu/memory) as tight as the Kueue quota rejects pods of workloads Kueue has
  already admitted, for example while borrowing or while preempted pods are still terminating. Pods that
  try to bypass the queue are stopped by Kueue itself (manageJobsWithoutQueueName, set by the GPU stack).
- The ResourceQuota guards what Kueue does not count: object counts, load balancers and node ports, and
  persistent storage.
- RDMA pods usually add IPC_LOCK, which the `restricted` Pod Security level forbids; the node pools raise
  the container runtime's memlock limit instead, so tenants stay `restricted`.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, NamedTuple, Sequence

import pulumi
from pydantic import Field

from ...spec import ClusterSpec, FlavorQuota, Share, Tenant as TenantSpec
from ...spec.tenants import Tenancy, quotas_for
from ...fabric.nccl import nccl_envs, pod_env
from ...spec.common import SpecModel
from ...types import token, with_aliases
from ..objects import Manifest, register
from ..quantities import binary, cpu

# A LocalQueue named "default" also receives jobs that carry no queue-name label (Kueue's defaulting).
LOCAL_QUEUE = "default"
KUEUE_API = "kueue.x-k8s.io/v1beta2"
TENANT_LABEL = "gpucluster.io/tenant"


class TenantArgs(SpecModel):
    """Everything one tenant's objects depend on: its spec plus the few cluster facts it needs."""

    tenant: TenantSpec
    cluster: str = Field(description="Cluster name, set as a label on every object.")
    quotas: dict[str, FlavorQuota] = Field(
        default_factory=dict, description="Kueue quotas per node pool flavor (GPUs, CPU, memory), as "
                                          "ClusterSpec.tenant_quotas derives them. Omitted: no quota anywhere.")
    cohort: str = Field(description="Kueue cohort shared by every tenant.")
    dns_namespace: str = Field("kube-system", description="Omitted: cluster DNS runs in kube-system.")
    monitoring_namespace: str | None = Field(None, description="Omitted: no scraping is allowed in.")
    protect: bool = Field(True, description="Omitted: the namespace is protected; deleting it needs an explicit "
                                            "unprotect first, since it deletes the tenant's volumes too.")
    nccl: dict[str, dict[str, str]] = Field(
        default_factory=dict, description="NCCL settings per node pool, as ConfigMaps `nccl-<pool>` for jobs' "
                                          "envFrom. Omitted: none.")
    foreign_storage_classes: list[str] = Field(
        default_factory=list, description="Other tenants' own StorageClasses, which this tenant's quota allows no "
                                          "claim from (their volumes belong to those tenants' groups). Omitted: "
                                          "none.")

    @classmethod
    def from_spec(cls, spec: ClusterSpec, tenant: TenantSpec) -> TenantArgs:
        return cls.from_tenancy(tenancy_of(spec), tenant)

    @classmethod
    def from_tenancy(cls, tenancy: Tenancy, tenant: TenantSpec) -> TenantArgs:
        return cls(tenant=tenant, cluster=tenancy.cluster, quotas=quotas_for(tenant, tenancy.pools),
                   cohort=tenancy.cohort, dns_namespace=tenancy.dns_namespace,
                   monitoring_namespace=tenancy.monitoring_namespace, protect=tenancy.environment != "dev",
                   nccl={pool: env for pool, env in tenancy.nccl.items() if pool in tenant.gpu_quota},
                   foreign_storage_classes=sorted(c for ns, c in tenancy.storage_classes.items()
                                                  if ns != tenant.namespace_name))


def tenant_storage_classes(spec: ClusterSpec) -> dict[str, str]:
    """The tenants' own StorageClasses (a site cluster's CSI driver), by namespace."""
    return {t.namespace_name: c for t in spec.tenants
            if t.storage.filesystem_gib and (c := spec.storage.storage_class(t.namespace_name))}


def tenancy_of(spec: ClusterSpec) -> Tenancy:
    """What the platform tells tenants managed elsewhere (exported as the stack output `tenancy`)."""
    monitoring, envs = spec.kubernetes.monitoring, nccl_envs(spec)
    pools = {name: capacity.model_copy(update={"guaranteed": sum(
        t.gpu_quota[name].nominal for t in spec.tenants if name in t.gpu_quota)})
        for name, capacity in spec.pool_capacities().items()}
    return Tenancy(cluster=spec.name, environment=spec.environment, cohort=spec.kubernetes.kueue.cohort,
                   dns_namespace=spec.kubernetes.dns_namespace,
                   monitoring_namespace=monitoring.namespace if monitoring.enabled else None,
                   pools=pools, nccl={pool: pod_env(env) for pool, env in envs.items()},
                   namespaces_taken=sorted(spec.reserved_namespaces | {t.namespace_name for t in spec.tenants}),
                   storage_classes=tenant_storage_classes(spec))


# --- pure rendering ---------------------------------------------------------------------------------

def _labels(args: TenantArgs) -> dict[str, str]:
    return {"app.kubernetes.io/managed-by": "pulumi", "gpucluster.io/cluster": args.cluster,
            TENANT_LABEL: args.tenant.name}


def _meta(args: TenantArgs, name: str, namespaced: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": _labels(args)}
    if namespaced:
        meta["namespace"] = args.tenant.namespace_name
    return meta


def _ns_selector(namespace: str) -> dict[str, Any]:
    return {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}


def render_namespace(args: TenantArgs) -> dict[str, Any]:
    labels = {**args.tenant.labels, **_labels(args)}
    for mode in ("enforce", "audit", "warn"):
        labels[f"pod-security.kubernetes.io/{mode}"] = "restricted"
        labels[f"pod-security.kubernetes.io/{mode}-version"] = "latest"
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": args.tenant.namespace_name, "labels": labels}}


def render_role_bindings(args: TenantArgs) -> list[Manifest]:
    """One RoleBinding per built-in namespace role that has groups; cluster-admin is never bound."""
    out = []
    for role in ("admin", "edit", "view"):
        groups = getattr(args.tenant.groups, role)
        if not groups:
            continue
        out.append(Manifest(f"rb-{role}", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": _meta(args, f"tenant-{role}"),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": g} for g in groups],
        }))
    return out


def render_network_policies(args: TenantArgs) -> list[Manifest]:
    """Default deny both ways, then explicit allows: the namespace itself, DNS, monitoring, the spec's extras."""
    t = args.tenant

    def policy(role: str, name: str, spec: dict[str, Any]) -> Manifest:
        return Manifest(role, {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                               "metadata": _meta(args, name), "spec": {"podSelector": {}, **spec}})

    out = [
        policy("np-deny", "default-deny", {"policyTypes": ["Ingress", "Egress"]}),
        policy("np-same-ns", "allow-same-namespace", {
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"podSelector": {}}]}],
            "egress": [{"to": [{"podSelector": {}}]}]}),
        policy("np-dns", "allow-dns", {
            "policyTypes": ["Egress"],
            "egress": [{"to": [{**_ns_selector(args.dns_namespace),
                                "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                        "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}]}),
    ]
    sources = ([args.monitoring_namespace] if args.monitoring_namespace else []) + t.allow_ingress_from_namespaces
    if sources:
        out.append(policy("np-ingress", "allow-ingress-from-namespaces", {
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [_ns_selector(ns) for ns in sources]}]}))
    if t.allow_egress_cidrs:
        out.append(policy("np-egress", "allow-egress-cidrs", {
            "policyTypes": ["Egress"],
            "egress": [{"to": [{"ipBlock": {"cidr": c}} for c in t.allow_egress_cidrs]}]}))
    return out


def render_limit_range(args: TenantArgs) -> dict[str, Any]:
    """Default requests only: a default limit would make a container that requests more than it (and sets no
    limit) invalid, so large GPU jobs would be refused. Kueue guards the totals."""
    d = args.tenant.container_defaults
    return {"apiVersion": "v1", "kind": "LimitRange", "metadata": _meta(args, "container-defaults"),
            "spec": {"limits": [{
                "type": "Container",
                "defaultRequest": {"cpu": cpu(d.cpu_request), "memory": binary(d.memory_request_mib, "Mi")},
            }]}}


def render_resource_quota(args: TenantArgs) -> dict[str, Any]:
    """Objects and storage only: GPUs, CPU and memory are Kueue's (see the module docstring)."""
    o, s = args.tenant.objects, args.tenant.storage
    hard = {"pods": str(o.pods), "services": str(o.services), "configmaps": str(o.configmaps),
            "secrets": str(o.secrets), "services.loadbalancers": str(o.load_balancers),
            "services.nodeports": str(o.node_ports), "persistentvolumeclaims": str(s.max_claims),
            "requests.storage": binary(s.quota_gib, "Gi")}
    # Kubernetes' storage resource quota: claims of a class counted apart, here none allowed from another's.
    hard.update({f"{c}.storageclass.storage.k8s.io/persistentvolumeclaims": "0" for c in args.foreign_storage_classes})
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": _meta(args, "tenant-quota"),
            "spec": {"hard": hard}}


# Resources a tenant's ClusterQueue covers on every flavor, in Kueue's required order within a resource group
# (then nvidia.com/gpu.shared too, where a pool's time slices are renamed).
QUEUE_RESOURCES = ("cpu", "memory", "nvidia.com/gpu")


def _share(name: str, share: Share, unit: Callable[[int], Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "nominalQuota": unit(share.nominal)}
    if share.borrowing_limit is not None:
        out["borrowingLimit"] = unit(share.borrowing_limit)
    if share.lending_limit is not None:
        out["lendingLimit"] = unit(share.lending_limit)
    return out


def render_cluster_queue(args: TenantArgs) -> dict[str, Any]:
    """One resource group: each pool's flavor carries the tenant's GPUs with their CPU and memory, so a GPU
    job is admitted whole on one pool (and on its topology); the spec's order is Kueue's preference order."""
    t = args.tenant
    # Every flavor of a group lists every covered resource: a pool's GPUs under its own name, nothing of the
    # other, so a job asking for whole GPUs is never admitted onto slices, nor the reverse.
    gpu_names = sorted({q.gpu_resource for q in args.quotas.values()} | {QUEUE_RESOURCES[2]})
    flavors = [{"name": flavor, "resources": [
        _share("cpu", q.cpu_cores, str), _share("memory", q.memory_gib, lambda n: binary(n, "Gi")),
        *(_share(name, q.gpus if name == q.gpu_resource else Share(nominal=0), str) for name in gpu_names)]}
        for flavor, q in args.quotas.items()]
    groups = [{"coveredResources": [*QUEUE_RESOURCES[:2], *gpu_names], "flavors": flavors}] if flavors else []
    p = t.preemption
    spec: dict[str, Any] = {
        "cohortName": args.cohort,
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": t.namespace_name}},
        "queueingStrategy": "BestEffortFIFO",
        "resourceGroups": groups,
        "preemption": {"reclaimWithinCohort": p.reclaim_within_cohort,
                       "borrowWithinCohort": {"policy": p.borrow_within_cohort},
                       "withinClusterQueue": p.within_cluster_queue},
    }
    if t.fair_sharing_weight is not None:
        spec["fairSharing"] = {"weight": str(t.fair_sharing_weight)}
    return {"apiVersion": KUEUE_API, "kind": "ClusterQueue", "metadata": _meta(args, t.name, namespaced=False),
            "spec": spec}


def render_local_queue(args: TenantArgs) -> dict[str, Any]:
    return {"apiVersion": KUEUE_API, "kind": "LocalQueue", "metadata": _meta(args, LOCAL_QUEUE),
            "spec": {"clusterQueue": args.tenant.name}}


def render_tenant(args: TenantArgs) -> list[Manifest]:
    """Every object of the tenant, namespace first."""
    return [Manifest("ns", render_namespace(args)), *render_role_bindings(args),
            *render_network_policies(args), Manifest("limits", render_limit_range(args)),
            Manifest("quota", render_resource_quota(args)), Manifest("cq", render_cluster_queue(args)),
            Manifest("lq", render_local_queue(args)), *render_nccl_config_maps(args)]


def render_nccl_config_maps(args: TenantArgs) -> list[Manifest]:
    """The fabric's NCCL settings for the pools the tenant may use (`envFrom: [{configMapRef: nccl-<pool>}]`)."""
    return [Manifest(f"nccl-{pool}", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(args, f"nccl-{pool}"),
                                      "data": dict(env)}) for pool, env in sorted(args.nccl.items())]


# --- the component ------------------------------------------------------------------------------------

class Tenant(pulumi.ComponentResource):
    """A tenant namespace with RBAC, isolation, limits and its Kueue queues.

    `kueue_ready` holds resources the Kueue objects must wait for (Kueue's webhook); omitted, they are
    created straight away, which is right only when Kueue is already running.
    """

    TYPE: ClassVar[str] = token("Tenant")

    namespace: pulumi.Output[str]
    """Name of the tenant's namespace."""
    local_queue: pulumi.Output[str]
    """LocalQueue jobs name in the `kueue.x-k8s.io/queue-name` label (also the namespace default)."""
    cluster_queue: pulumi.Output[str]
    """The tenant's ClusterQueue."""

    def __init__(self, name: str, args: TenantArgs, kueue_ready: Sequence[pulumi.Resource] = (),
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__(self.TYPE, name, intent(args), with_aliases(self.TYPE, opts))
        self.namespace, self.local_queue, self.cluster_queue = compose(self, name, args, kueue_ready)


def intent(args: TenantArgs) -> dict[str, Any]:
    """What a Tenant registers as its inputs: its args, for policies."""
    return {"spec": args.model_dump(mode="json")}


class Queues(NamedTuple):
    namespace: pulumi.Output[str]
    local_queue: pulumi.Output[str]
    cluster_queue: pulumi.Output[str]


def compose(tenant: pulumi.ComponentResource, name: str, args: TenantArgs,
            kueue_ready: Sequence[pulumi.Resource]) -> Queues:
    """A Tenant's children under `tenant` (a Tenant, or the component provider's, provider.py), its outputs
    registered; returns them. Returned, not set: the provider may build a tenant in an apply, once the platform's
    facts are known, when its own outputs are long taken."""
    child = pulumi.ResourceOptions(parent=tenant)
    manifests = render_tenant(args)
    ns = register(f"{name}-ns", manifests[0].obj, pulumi.ResourceOptions(parent=tenant, protect=args.protect))
    ns_name = ns.metadata.apply(lambda m: m["name"])
    created: dict[str, pulumi.CustomResource] = {}
    for m in manifests[1:]:
        if m.obj["apiVersion"] == KUEUE_API:
            # The LocalQueue names its ClusterQueue by a plain string, so the order is made explicit.
            deps = [*kueue_ready, *([created["cq"]] if m.role == "lq" else [])]
            opts_ = pulumi.ResourceOptions(parent=tenant, depends_on=deps)
        else:
            opts_ = child
        namespaced = "namespace" in m.obj["metadata"]
        created[m.role] = register(f"{name}-{m.role}", m.obj, opts_, namespace=ns_name if namespaced else None)
    cq, lq = created["cq"], created["lq"]
    cluster_queue = cq.metadata.apply(lambda m: m["name"])
    # The LocalQueue is usable once its ClusterQueue exists too.
    queues = Queues(ns_name, pulumi.Output.all(lq.metadata, cluster_queue).apply(lambda a: a[0]["name"]),
                    cluster_queue)
    tenant.register_outputs({**intent(args), **queues._asdict()})
    return queues
