"""Tenants: who they are, what they may use, and how they share the cluster."""

from __future__ import annotations

import ipaddress
from typing import Annotated, Iterator, Literal

from pydantic import AfterValidator, BeforeValidator, Field

from .common import DnsLabel, GroupName, Loc, NamespaceLabels, Problem, SpecModel, duplicates, shown


class GpuQuota(SpecModel):
    """A tenant's GPUs of one flavour (node pool); a bare integer in YAML means `nominal`."""

    nominal: int = Field(ge=0, description="GPUs guaranteed to the tenant; on time-sliced or MIG pools, slices "
                                          "(what the device plugin advertises), and CPU and memory follow per slice.")
    borrowing_limit: int | None = Field(
        None, ge=0, description="Extra GPUs it may borrow from the cohort. Omitted: no limit.")
    lending_limit: int | None = Field(
        None, ge=0, description="Of its nominal GPUs, how many idle ones others may borrow. Omitted: all of them.")

    def _lend_at_most_nominal(self) -> Iterator[Problem]:
        if self.lending_limit is not None and self.lending_limit > self.nominal:
            yield Problem(("lending_limit",), f"lending_limit {self.lending_limit} is above nominal {self.nominal}; "
                                              f"a tenant can lend at most what it owns (set lending_limit <= "
                                              f"{self.nominal})")

    _checks = (_lend_at_most_nominal,)


class Share(SpecModel):
    """A quota in Kueue's terms for one resource of one flavour (GPUs, CPU cores or GiB of memory)."""

    nominal: int = Field(ge=0)
    borrowing_limit: int | None = Field(None, ge=0, description="Omitted: no limit.")
    lending_limit: int | None = Field(None, ge=0, description="Omitted: all of the nominal quota.")


class FlavorQuota(SpecModel):
    """What a tenant may use of one node pool: its GPUs, and the CPU and memory that come with them."""

    gpus: Share
    cpu_cores: Share
    memory_gib: Share
    gpu_resource: str = Field("nvidia.com/gpu", description="The pool's GPU resource name. Omitted: "
                                                            "nvidia.com/gpu.")


def _int_is_nominal(value: object) -> object:
    return {"nominal": value} if isinstance(value, int) and not isinstance(value, bool) else value


QuotaOrCount = Annotated[GpuQuota, BeforeValidator(_int_is_nominal)]


def _cidr(value: str) -> str:
    try:
        return str(ipaddress.ip_network(value, strict=True))
    except ValueError as e:
        raise ValueError(f"{shown(value)} is not a network in CIDR form ({shown(str(e))}); e.g. '10.20.0.0/16'") \
            from None


Cidr = Annotated[str, AfterValidator(_cidr)]


class Groups(SpecModel):
    """Identity-provider groups bound to Kubernetes' built-in namespace roles (never cluster-admin)."""

    admin: list[GroupName] = Field(default_factory=list, description="Omitted: no group administers the namespace.")
    edit: list[GroupName] = Field(default_factory=list, description="Omitted: no group may edit.")
    view: list[GroupName] = Field(default_factory=list, description="Omitted: no group may view.")


class ContainerDefaults(SpecModel):
    """LimitRange default requests, so a container that states nothing is still scheduled by its needs.

    There are no default limits: a default limit below what a container requests makes the pod invalid when it
    sets no limit itself, and Kueue already guards each tenant's CPU and memory.
    """

    cpu_request: str = Field("500m", pattern=r"^[0-9]+(\.[0-9]+)?m?$", description="Omitted: 500m.")
    memory_request_mib: int = Field(1024, ge=16, description="Omitted: 1 GiB.")


class TenantStorage(SpecModel):
    quota_gib: int = Field(1024, ge=0, description="Total PVC storage requests. Omitted: 1 TiB.")
    max_claims: int = Field(50, ge=0, description="PersistentVolumeClaims. Omitted: 50.")
    filesystem_gib: int | None = Field(
        None, ge=1, description="The tenant's directory on the parallel filesystem, with this quota (and a PVC "
                                "bound to it in its namespace). Omitted: the tenant gets no directory.")
    group_id: int | None = Field(
        None, ge=1000, le=4294967294,
        description="The tenant's group ID from the site's identity system (LDAP, AD): it owns the tenant's "
                    "directory, its pods join it, and the quota counts it. Omitted: derived from the namespace "
                    "name in 100000-1000099999, a range identity systems also hand out (the plan warns).")


class ObjectLimits(SpecModel):
    """Object counts guarded by the namespace ResourceQuota (Kueue does not count these)."""

    pods: int = Field(1000, ge=1, description="Omitted: 1000.")
    services: int = Field(50, ge=0, description="Omitted: 50.")
    configmaps: int = Field(200, ge=0, description="Omitted: 200.")
    secrets: int = Field(200, ge=0, description="Omitted: 200.")
    load_balancers: int = Field(0, ge=0, description="Omitted: none; tenants do not expose services by default.")
    node_ports: int = Field(0, ge=0, description="Omitted: none.")


class Preemption(SpecModel):
    """Kueue ClusterQueue preemption, in Kueue's own words."""

    reclaim_within_cohort: Literal["Never", "LowerPriority", "Any"] = Field(
        "Any", description="Omitted: Any; a tenant takes back its lent GPUs from any borrower.")
    borrow_within_cohort: Literal["Never", "LowerPriority"] = Field(
        "Never", description="Omitted: Never; a borrowing workload never preempts others.")
    within_cluster_queue: Literal["Never", "LowerPriority", "LowerOrNewerEqualPriority"] = Field(
        "LowerPriority", description="Omitted: LowerPriority; the tenant's urgent jobs preempt its own lesser ones.")


class Tenant(SpecModel):
    name: DnsLabel
    namespace: DnsLabel | None = Field(None, description="Omitted: the tenant's name.")
    labels: NamespaceLabels = Field(default_factory=dict, max_length=64, description="Extra namespace labels. Omitted: only the tenant's own.")
    groups: Groups = Field(default_factory=Groups, description="Omitted: no group is bound.")
    gpu_quota: dict[DnsLabel, QuotaOrCount] = Field(
        default_factory=dict, description="GPU quota per flavour (node pool name). Omitted: no GPUs.")
    cpu_cores: int | None = Field(
        None, ge=0, description="Kueue CPU quota, shared out over its pools in proportion to its nominal GPUs. "
                                "Omitted: the CPUs of the hosts its nominal GPUs sit on.")
    memory_gib: int | None = Field(
        None, ge=0, description="Kueue memory quota, shared out like cpu_cores. Omitted: the memory of the "
                                "hosts its nominal GPUs sit on.")
    container_defaults: ContainerDefaults = Field(default_factory=ContainerDefaults)
    storage: TenantStorage = Field(default_factory=TenantStorage)
    objects: ObjectLimits = Field(default_factory=ObjectLimits)
    preemption: Preemption = Field(default_factory=Preemption)
    fair_sharing_weight: float | None = Field(
        None, gt=0, le=1000, description="Weight under fair sharing. Omitted: 1 (Kueue's default).")
    allow_ingress_from_namespaces: list[DnsLabel] = Field(
        default_factory=list, description="Other namespaces that may reach the tenant's pods. Omitted: none.")
    allow_egress_cidrs: list[Cidr] = Field(
        default_factory=list, description="Networks outside the cluster pods may reach. Omitted: none.")
    infiniband_pkey: int | None = Field(
        None, description="The partition key of the tenant's own InfiniBand partition, used where it owns a "
                          "dedicated pool and fabric.infiniband.isolate_dedicated_pools is on (0x0001-0x7ffe; kept "
                          "while isolation is off). Omitted: "
                          "derived from the tenant's name in 0x4000-0x6fff, stable as tenants come and go, and "
                          "shown in the plan.")
    roce_vlan: int | None = Field(
        None, ge=2, le=4094,
        description="The VLAN of the tenant's dedicated pools' RoCE ports, used where fabric.roce."
                    "isolate_dedicated_pools is on. Omitted: derived from the tenant's name in fabric.roce's "
                    "tenant_vlan_first-tenant_vlan_last, stable as tenants come and go, and shown in the plan.")

    @property
    def namespace_name(self) -> str:
        return self.namespace or self.name


class PoolCapacity(SpecModel):
    """What tenants' quotas are cut from, per node pool (Kueue flavor)."""

    gpu_units_per_host: int = Field(ge=1, description="GPUs, or slices on shared pools, per host.")
    cpu_cores_per_host: int = Field(ge=1)
    memory_gib_per_host: int = Field(ge=1)
    gpu_resources: int | None = Field(None, ge=0, description="GPUs (or slices) in the pool. Omitted: unknown.")
    gpu_resource: str = Field(
        "nvidia.com/gpu", pattern=r"^nvidia\.com/gpu(\.shared)?$",
        description="The extended resource its GPUs are (nvidia.com/gpu.shared for renamed time slices). Omitted: "
                    "nvidia.com/gpu, as platform stacks exported before the name could differ.")
    guaranteed: int = Field(0, ge=0, description="Already guaranteed to tenants elsewhere. Omitted: none.")
    dedicated_to: str | None = Field(None, description="The platform tenant that owns the pool alone. Omitted: "
                                                       "shared.")


def quotas_for(tenant: Tenant, pools: dict[str, PoolCapacity]) -> dict[str, FlavorQuota]:
    """Per pool the tenant has GPUs on: its GPUs, and the CPU and memory that come with them.

    All three sit on the pool's Kueue flavor: Kueue assigns one flavor per resource group, and a
    topology-aware flavor serves only workloads whose every resource it covers. CPU and memory per GPU
    follow the pool's hosts (per GPU slice on time-sliced or MIG pools, whose quotas count slices); an
    explicit tenant total is shared out in proportion to the nominal GPUs, or evenly over the tenant's pools
    when it is guaranteed no GPU (a CPU-only or borrowing tenant keeps its explicit CPU and memory). Rounded down.
    """
    owned = {f: q for f, q in tenant.gpu_quota.items() if f in pools}
    total_gpus = sum(q.nominal for q in owned.values())
    out = {}
    for index, (flavor, q) in enumerate(owned.items()):
        pool = pools[flavor]
        units = pool.gpu_units_per_host

        def portion(explicit: int) -> int:
            if total_gpus:
                return explicit * q.nominal // total_gpus
            return explicit // len(owned) + (1 if index < explicit % len(owned) else 0)

        def share(per_host: int, explicit: int | None) -> Share:
            scale = lambda n: None if n is None else n * per_host // units  # noqa: E731
            nominal = scale(q.nominal) if explicit is None else portion(explicit)
            lending = None if q.lending_limit is None else min(nominal, scale(q.lending_limit))
            return Share(nominal=nominal, borrowing_limit=scale(q.borrowing_limit), lending_limit=lending)

        out[flavor] = FlavorQuota(gpus=Share(nominal=q.nominal, borrowing_limit=q.borrowing_limit,
                                             lending_limit=q.lending_limit),
                                  cpu_cores=share(pool.cpu_cores_per_host, tenant.cpu_cores),
                                  memory_gib=share(pool.memory_gib_per_host, tenant.memory_gib),
                                  gpu_resource=pool.gpu_resource)
    return out


class Tenancy(SpecModel):
    """The platform facts a tenant needs, which the platform stack exports as `tenancy`, so tenants can be
    managed from their own project (a StackReference) without touching fabric, nodes or storage."""

    cluster: str
    environment: Literal["dev", "staging", "prod"]
    cohort: str
    dns_namespace: str
    monitoring_namespace: str | None = None
    pools: dict[str, PoolCapacity]
    nccl: dict[str, dict[str, str]] = Field(default_factory=dict, description="Pods' NCCL settings per pool.")
    namespaces_taken: list[str] = Field(default_factory=list,
                                        description="System namespaces and the platform's own tenants'.")
    storage_classes: dict[str, str] = Field(
        default_factory=dict, description="Each tenant's own StorageClass (WEKA's directory or Scale's fileset "
                                          "volumes owned by its group), by namespace: no other tenant may claim "
                                          "from it. Omitted: none.")


def unique_tenants(tenants: list[Tenant], at: Loc = ("tenants",)) -> Iterator[Problem]:
    """Names, namespaces and directory groups each tenant needs for itself (its objects are named by them)."""
    yield from duplicates([((*at, i, "name"), t.name) for i, t in enumerate(tenants)],
                          "tenant name", "give each tenant its own name")
    yield from duplicates([((*at, i, "storage", "group_id"), str(g)) for i, t in enumerate(tenants)
                           if (g := t.storage.group_id) is not None and t.storage.filesystem_gib],
                          "group ID", "each tenant's directory needs a group of its own")
    yield from duplicates([((*at, i, "namespace"), t.namespace_name) for i, t in enumerate(tenants)],
                          "namespace", "each tenant needs its own namespace")


def no_directories(tenants: list[Tenant], at: Loc = ("tenants",)) -> Iterator[Problem]:
    """For tenants built apart from the platform: the filesystem's directories are made on its servers by the
    platform stack, which tenants' projects never reach, so a directory asked for there would silently not exist."""
    for i, t in enumerate(tenants):
        for field in ("filesystem_gib", "group_id"):
            value = getattr(t.storage, field)
            if value is not None:
                yield Problem((*at, i, "storage", field),
                              f"{field} {value} asks for a directory on the parallel filesystem, which only the "
                              "platform stack creates (this project never reaches the storage servers); move "
                              "the tenant to the platform spec's tenants, or remove the field")


class TenantsSpec(SpecModel):
    """A tenants-only stack: the teams one project onboards onto a platform stack it references."""

    platform_stack: str = Field(pattern=r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+){0,2}$",
                                description="The platform stack, as `pulumi stack ls` names it (org/project/stack).")
    tenants: list[Tenant] = Field(min_length=1, max_length=1024)

    def _unique(self) -> Iterator[Problem]:
        return unique_tenants(self.tenants)

    def _no_filesystem_here(self) -> Iterator[Problem]:
        return no_directories(self.tenants)

    _checks = (_unique, _no_filesystem_here)


def tenancy_problems(tenancy: Tenancy, tenants: list[Tenant]) -> list[Problem]:
    """What the platform refuses of these tenants: unknown pools, taken namespaces, guarantees beyond capacity."""
    out = []
    for i, t in enumerate(tenants):
        if t.namespace_name in tenancy.namespaces_taken:
            out.append(Problem(("tenants", i, "namespace" if t.namespace else "name"),
                               f"namespace {t.namespace_name!r} is already taken on cluster {tenancy.cluster} (by "
                               "the platform or its own tenants); choose another"))
        for flavor in t.gpu_quota:
            if flavor not in tenancy.pools:
                out.append(Problem(("tenants", i, "gpu_quota", flavor),
                                   f"cluster {tenancy.cluster} has no node pool {flavor!r} (pools: "
                                   f"{', '.join(sorted(tenancy.pools))})"))
            elif (owner := tenancy.pools[flavor].dedicated_to) is not None:
                out.append(Problem(("tenants", i, "gpu_quota", flavor),
                                   f"node pool {flavor!r} of cluster {tenancy.cluster} is dedicated to the platform's "
                                   f"tenant {owner!r}; give this tenant quota on a shared pool"))
    for flavor, pool in sorted(tenancy.pools.items()):
        asked = [(i, t.gpu_quota[flavor].nominal) for i, t in enumerate(tenants) if flavor in t.gpu_quota]
        total = sum(n for _, n in asked)
        if total and pool.gpu_resources is not None and pool.guaranteed + total > pool.gpu_resources:
            worst = max(asked, key=lambda x: x[1])[0]
            out.append(Problem(("tenants", worst, "gpu_quota", flavor),
                               f"{total} {flavor} GPUs guaranteed here and {pool.guaranteed} by the platform stack "
                               f"exceed the pool's {pool.gpu_resources}; lower the nominal quotas"))
    return out
