"""ClusterSpec: one validated description of a whole environment, and the rules that span its parts."""

from __future__ import annotations

import ipaddress
import zlib
from typing import Iterator, Literal, NamedTuple

from pydantic import Field

from .common import Check, DnsLabel, Loc, Problem, SpecModel, duplicates, fmt_loc, valid
from .fabric import FabricSpec, pkey_problem
from .hardware import Host, NodePool, Rack, Site, SshSettings, cpu_ids
from .kubernetes import KubernetesSpec, ValidationSpec
from .slurm import slurm_problems
from .storage import FilesystemClaim, StorageSpec
from .tenants import FlavorQuota, PoolCapacity, Tenant, quotas_for, unique_tenants
from .topology import plan_topology
from .versions import MPI_OPERATOR_KNOWN, describe_known, find

# Switch vendors with a RoCE backend in components/fabric/switches.py (kept here so the spec needs no Pulumi).
SWITCH_VENDORS = ("cumulus", "sonic", "eos")
# Priorities a backend can make lossless. SONiC's buffer profiles, TC-to-PG map and WRED queues give lossless
# buffers to priorities 3 and 4 only: PFC on another priority would pause traffic that has no headroom.
# Cumulus (NVUE) and EOS (`no-drop`) size the buffers for whichever priority gets PFC.
LOSSLESS_PRIORITIES = {"sonic": (3, 4)}

# Where each operator of the GPU stack runs (components/k8s take their namespace from here).
OPERATOR_NAMESPACES = {"gpu_operator": "gpu-operator", "network_operator": "network-operator",
                       "kueue": "kueue-system", "nfd": "node-feature-discovery", "mpi_operator": "mpi-operator",
                       "node_readiness": "nrr-system", "health_checks": "gpu-health-checks"}
# The lowest GPU temperature limit that is a fault, not a busy GPU: data-center GPUs run up to their Max Operating
# Temp under load (87 C on an H800, tests/samples/nvidia_smi_q_h800.txt; slowdown at 89 C).
LOADED_GPU_C = 75
# Namespaces no tenant may take: Kubernetes' own and the operators'; a tenant there would share their privileges.
SYSTEM_NAMESPACES = frozenset({"default", "kube-system", "kube-public", "kube-node-lease",
                               *OPERATOR_NAMESPACES.values()})


class PowerPart(NamedTuple):
    what: str                  # "h100 host", "storage server", "leaf switch"
    count: int
    watts: int | None          # each, at peak; None: the spec does not say


class RackPower(NamedTuple):
    parts: tuple[PowerPart, ...]
    peak_kw: float             # of the parts whose power is known: a floor where some is not
    unknown: tuple[str, ...]   # parts whose power the spec does not give
    capacity_kw: float
    redundancy: str | None

    def listing(self) -> str:
        return " + ".join(f"{p.count} x {'?' if p.watts is None else f'{p.watts / 1000:g}'} kW ({p.what})"
                          for p in self.parts) or "-"

    def verdict(self, budget_kw: float) -> str:
        """ok, over budget, or unknown (never ok while a device's power is missing or the budget unclear)."""
        if self.peak_kw > budget_kw + 1e-9:
            return "over budget"
        if self.unknown:
            return f"unknown: no power figure for {', '.join(self.unknown)}"
        return "ok" if self.redundancy else "unknown: pdu_redundancy not stated"


# The part of a split environment that builds everything but its shards' pools (README: Split stacks).
PLATFORM = "platform"


class Shard(SpecModel):
    """Node pools built by a stack of their own, so that one engine's per-step cost is paid by each shard in
    parallel rather than by one stack for the whole fleet."""
    name: DnsLabel = Field(description="The shard's name, which its stack's `gpucluster:part` config names.")
    node_pools: list[DnsLabel] = Field(min_length=1, max_length=64,
                                       description="The pools its stack builds, and the platform stack does not.")


class ClusterSpec(SpecModel):
    name: DnsLabel = Field(description="Cluster name; prefixes every resource of the environment.")
    environment: Literal["dev", "staging", "prod"] = Field(
        description="Which environment this is; staging and prod get the strict policies.")
    sites: list[Site] = Field(min_length=1, max_length=64)
    ssh: SshSettings = Field(default_factory=SshSettings, description="Omitted: root on port 22, no bastion.")
    node_pools: list[NodePool] = Field(min_length=1, max_length=64)
    fabric: FabricSpec = Field(default_factory=FabricSpec, description="Omitted: plain Ethernet, unmanaged switches.")
    storage: StorageSpec = Field(default_factory=StorageSpec, description="Omitted: no parallel filesystem.")
    kubernetes: KubernetesSpec = Field(default_factory=KubernetesSpec,
                                       description="Omitted: the defaults of each field.")
    tenants: list[Tenant] = Field(default_factory=list, max_length=1024, description="Omitted: no tenants.")
    validation: ValidationSpec = Field(default_factory=ValidationSpec,
                                       description="Omitted: the defaults of each field.")
    shards: list[Shard] = Field(
        default_factory=list, max_length=64,
        description="Omitted: one stack builds the environment. Given: the stack whose `gpucluster:part` is "
                    "`platform` builds everything but these shards' pools, and each shard's stack its own pools "
                    "(README: Split stacks).")

    # --- derived views used by planners ----------------------------------------------------------
    @property
    def racks(self) -> dict[str, Rack]:
        return {r.name: r for s in self.sites for r in s.racks}

    @property
    def pools(self) -> dict[str, NodePool]:
        return {p.name: p for p in self.node_pools}

    def pools_of(self, part: str | None) -> list[NodePool]:
        """The pools a stack builds: every one (`part` None: the one stack of the environment), a shard's, or
        the platform's (every pool no shard holds)."""
        if part is None:
            return list(self.node_pools)
        sharded = {s.name: set(s.node_pools) for s in self.shards}
        if part == PLATFORM:
            held = set().union(*sharded.values())
            return [p for p in self.node_pools if p.name not in held]
        return [p for p in self.node_pools if p.name in sharded[part]]

    def hosts(self) -> Iterator[tuple[NodePool, Host]]:
        for pool in self.node_pools:
            for host in pool.hosts:
                yield pool, host

    @property
    def gpus(self) -> int:
        return sum(p.gpus for p in self.node_pools)

    @property
    def isolated_pools(self) -> dict[str, str]:
        """Pool -> tenant, for each dedicated pool the fabric isolates: its tenant's own InfiniBand partition
        (partitioned_pools) or RoCE VLAN (vlan_pools)."""
        return self.partitioned_pools or self.vlan_pools

    @property
    def partitioned_pools(self) -> dict[str, str]:
        """Pool -> tenant, for each dedicated pool in its tenant's own InfiniBand partition."""
        return self._fenced_pools("infiniband")

    @property
    def vlan_pools(self) -> dict[str, str]:
        """Pool -> tenant, for each dedicated pool whose RoCE leaf ports are in its tenant's own VLAN."""
        return self._fenced_pools("rocev2")

    def _fenced_pools(self, kind: str) -> dict[str, str]:
        settings = self.fabric.infiniband if kind == "infiniband" else self.fabric.roce
        if settings is None or not settings.isolate_dedicated_pools or self.fabric.kind != kind:
            return {}
        return {p.name: p.dedicated_to for p in self.node_pools if p.dedicated_to is not None and p.nics}

    @property
    def isolated_hosts(self) -> dict[str, str]:
        """Host -> tenant, for the hosts of isolated pools."""
        isolated = self.isolated_pools
        return {h.hostname: isolated[p.name] for p, h in self.hosts() if p.name in isolated}

    @property
    def partitioned_hosts(self) -> dict[str, str]:
        """Host -> tenant, for the hosts whose ports are in their tenant's InfiniBand partition."""
        return self.isolated_hosts if self.partitioned_pools else {}

    @property
    def tenant_vlans(self) -> dict[str, int]:
        """Tenant -> its RoCE VLAN, for the tenants that own an isolated pool: the spec's, else derived from the
        name (CRC-32 into tenant_vlan_first-tenant_vlan_last), so adding or removing a tenant moves no other's."""
        roce, owners = self.fabric.roce, set(self.vlan_pools.values())
        if roce is None:
            return {}
        span = roce.tenant_vlan_last - roce.tenant_vlan_first + 1
        return {t.name: t.roce_vlan if t.roce_vlan is not None
                else roce.tenant_vlan_first + zlib.crc32(t.name.encode()) % span
                for t in self.tenants if t.name in owners}

    @property
    def tenant_pkeys(self) -> dict[str, int]:
        """Tenant -> its partition key, for the tenants that own an isolated pool: the spec's, else derived from
        the name (CRC-32 into 0x4000-0x6fff), so adding or removing a tenant moves no other tenant's key."""
        owners = set(self.partitioned_pools.values())
        return {t.name: t.infiniband_pkey if t.infiniband_pkey is not None
                else 0x4000 + zlib.crc32(t.name.encode()) % 0x3000 for t in self.tenants if t.name in owners}

    @property
    def kueue_pools(self) -> list[NodePool]:
        """Pools Kueue schedules (a flavor each): all but Slurm's."""
        slurm = set(self.kubernetes.slurm.pools)
        return [p for p in self.node_pools if p.name not in slurm]

    def tenant_quotas(self, tenant: Tenant) -> dict[str, FlavorQuota]:
        """Per pool the tenant has GPUs on: its GPUs, and the CPU and memory that come with them."""
        return quotas_for(tenant, self.pool_capacities())

    def pool_capacities(self) -> dict[str, PoolCapacity]:
        """What tenants' quotas are cut from, per pool Kueue schedules."""
        return {p.name: PoolCapacity(gpu_units_per_host=p.gpu_units_per_host, cpu_cores_per_host=p.cpu_cores_per_host,
                                     memory_gib_per_host=p.memory_gib_per_host, gpu_resources=p.gpu_resources,
                                     gpu_resource=p.gpu_resource_name, dedicated_to=p.dedicated_to)
                for p in self.kueue_pools}

    def rack_power(self) -> dict[str, RackPower]:
        """Per rack, everything its PDUs feed at peak: each pool's hosts (GPUs at TDP plus base power), storage
        servers and switches mounted there; a device of unknown power makes the rack's figure a floor."""
        parts: dict[str, dict[str, list]] = {name: {} for name in self.racks}

        def add(rack: str, what: str, watts: int | None) -> None:
            if rack in parts:
                n, _ = parts[rack].get(what, (0, watts))
                parts[rack][what] = [n + 1, watts]
        for pool in self.node_pools:
            watts = pool.peak_power_w_per_host if pool.base_power_w is not None else None
            # A figure the spec does not give but the host model's default does is named as such.
            what = f"{pool.name} host" + (f", {pool.host_model}'s base power" if pool.host_base_power_w is None
                                          and watts is not None else "")
            for host in pool.hosts:
                if valid(host.rack):
                    add(host.rack, what, watts)
        for server in self.storage.servers:
            if valid(server.rack):
                add(server.rack, "storage server", None if server.power_w is None else server.power_w)
        for switch in self.fabric.switches:
            if switch.rack is not None and valid(switch.rack):
                add(switch.rack, f"{switch.role} switch", switch.power_w)
        out = {}
        for name, rack in self.racks.items():
            items = tuple(PowerPart(what, n, w) for what, (n, w) in sorted(parts[name].items()))
            out[name] = RackPower(items, sum(p.count * p.watts for p in items if p.watts is not None) / 1000,
                                  tuple(p.what for p in items if p.watts is None), rack.pdu_capacity_kw,
                                  rack.pdu_redundancy)
        return out

    @property
    def storage_lnet(self) -> str:
        """Lustre's network type: the spec's, else o2ib (verbs) where the fabric has RDMA."""
        return self.storage.lnet or ("o2ib" if self.fabric.rdma else "tcp")

    @property
    def storage_rdma(self) -> bool:
        """The filesystem's traffic is RDMA (LNet o2ib, or BeeGFS on an RDMA fabric): on RoCE it needs the same
        lossless class as NCCL's on every NIC it crosses, the servers' included."""
        kind = self.storage.kind
        scale_rdma = kind == "scale" and self.storage.scale is not None and self.storage.scale.gds
        return self.fabric.rdma and (kind == "beegfs" or (kind == "lustre" and self.storage_lnet == "o2ib")
                                     or scale_rdma)

    @property
    def secret_settings(self) -> tuple[str, ...]:
        """The stack secrets this spec needs beyond the SSH key (Slurm's directory bind, a storage API user)."""
        return self.kubernetes.slurm.secret_settings + self.storage.secret_settings

    def filesystem_claims(self, tenant: Tenant) -> list[FilesystemClaim]:
        return self.storage.claims(tenant.namespace_name, tenant.storage.filesystem_gib, tenant.storage.group_id)

    def storage_client_interface(self, pool: NodePool) -> str | None:
        """The interface a pool's hosts reach the parallel filesystem on: the fast NICs carry TCP too."""
        if self.storage.client_interface:
            return self.storage.client_interface
        if pool.nics:
            return min(pool.nics, key=lambda n: n.rail).interface
        return pool.control_interface or self.fabric.control_interface

    @property
    def system_namespaces(self) -> frozenset[str]:
        """Where the platform's own agents and operators run, as this spec installs them: the only namespaces
        whose pods may have host access, and whose pods on a GPU node are not tenants' work. Not `default`,
        kube-public or kube-node-lease: nothing of the platform's runs there."""
        k = self.kubernetes
        installed = {"gpu_operator": k.gpu_operator.enabled, "network_operator": network_operator_enabled(self),
                     "kueue": True, "nfd": True, "mpi_operator": k.mpi_operator.enabled,
                     "node_readiness": self.quarantines, "health_checks": bool(checked_pools(self))}
        return frozenset({"kube-system", k.dns_namespace,
                          *(OPERATOR_NAMESPACES[o] for o, on in installed.items() if on),
                          *([k.monitoring.namespace] if k.monitoring.enabled else []),
                          *k.slurm.namespaces})

    @property
    def quarantines(self) -> bool:
        """Faulty nodes are tainted by the node readiness controller this spec installs."""
        h = self.kubernetes.health
        return h.enabled and h.quarantine.mode != "off"

    @property
    def agent_namespaces(self) -> frozenset[str]:
        """System namespaces whose pods on a GPU node are node agents, not work: all but the active health
        checks' and Slurm's, whose pods hold every GPU of their host, so a burn-in or a restart waits for them like
        for a job."""
        return self.system_namespaces - {OPERATOR_NAMESPACES["health_checks"], self.kubernetes.slurm.namespace}

    @property
    def reserved_namespaces(self) -> frozenset[str]:
        """Names no tenant namespace may have."""
        k = self.kubernetes
        return SYSTEM_NAMESPACES | {k.monitoring.namespace, k.dns_namespace,
                                    *k.slurm.namespaces}

    def tenant_cpu_cores(self, tenant: Tenant) -> int:
        return sum(q.cpu_cores.nominal for q in self.tenant_quotas(tenant).values())

    def tenant_memory_gib(self, tenant: Tenant) -> int:
        return sum(q.memory_gib.nominal for q in self.tenant_quotas(tenant).values())

    def warnings(self) -> list[str]:
        """Legal but risky choices, shown in the plan summary."""
        out = []
        health, slurm = self.kubernetes.health, self.kubernetes.slurm
        if slurm.enabled and health.enabled and health.quarantine.mode == "enforce" and not health.quarantine.drain:
            out.append(f"health.quarantine.drain is false, so a quarantined node of the Slurm pool(s) "
                       f"{', '.join(slurm.pools)} keeps its slurmd (NoSchedule stops new pods, not a running one) "
                       "and Slurm keeps placing jobs there until the node check drains it: set drain: true, or "
                       "drain such nodes in Slurm by hand (`scontrol update nodename=<node> state=drain`)")
        unpinned = [h.hostname for _, h in self.hosts() if h.host_key is None]
        if unpinned:
            out.append(f"{len(unpinned)} host(s) have no host_key, so SSH does not verify them: "
                       f"{', '.join(unpinned[:5])}{' ...' if len(unpinned) > 5 else ''}")
        if self.fabric.rdma:
            bare = [p.name for p in self.node_pools if not p.nics]
            if bare:
                out.append(f"fabric is {self.fabric.kind} but node pool(s) {', '.join(bare)} list no NICs")
        storage = self.storage
        if storage.kind == "beegfs" and storage.effective_quotas and storage.effective_version == "7.4":
            out.append("BeeGFS 7.4 quota enforcement is an enterprise feature: it runs without a licence, but its "
                       "production use needs a support contract")
        if storage.kind not in ("none", "scale") and storage.client_interface is None:
            shared = [f"{p.name} ({min(p.nics, key=lambda n: n.rail).interface})" for p in self.node_pools
                      if p.nics and p.workload == "training"]
            if shared:
                out.append(f"storage traffic of training pool(s) {', '.join(shared)} rides the rail-0 NIC that "
                           "NCCL uses too, so checkpoints and data loading slow the all-reduces on that rail: set "
                           "storage.client_interface to the hosts' storage NIC")
        if storage.kind != "none" and self.validation.fio_image is None:
            out.append("validation.fio_image is not set, so validate does not measure the filesystem's read "
                       "bandwidth: build an image with fio into the site's registry (the fio project publishes none) "
                       "and name it there")
        unclear = [f"{name} ({', '.join(p.unknown) or 'pdu_redundancy'})" for name, p in self.rack_power().items()
                   if p.unknown or not p.redundancy]
        if unclear:
            out.append(f"rack power of {', '.join(unclear[:5])} cannot be called within budget: give each pool's "
                       "host_base_power_w (or a DGX host_model), storage servers' and switches' power_w and rack, "
                       "and each rack's pdu_redundancy")
        unplaced = [s.name for s in self.fabric.switches if s.rack is None]
        if unplaced:
            out.append(f"switch(es) {', '.join(unplaced[:5])} have no rack, so no rack's power counts them")
        derived = [t.name for t in self.tenants if t.storage.filesystem_gib and t.storage.group_id is None]
        if storage.kind != "none" and derived:
            out.append(f"tenant(s) {', '.join(derived[:5])} have no storage.group_id: their directory's group is a "
                       "hash of the namespace, in a range identity systems also hand out; set it from yours")
        sized = [t.name for t in self.tenants if t.storage.filesystem_gib]
        if storage.kind != "none" and sized and not storage.effective_quotas:
            out.append(f"storage quotas are off, so the filesystem_gib of tenant(s) {', '.join(sized[:5])} is not "
                       "enforced (set storage.quotas)")
        whole = [f"{p.name} ({len(p.hosts)} hosts, max_unavailable {p.rollout.max_unavailable})"
                 for p in self.node_pools if len(p.hosts) > 1 and p.rollout.batch_size(len(p.hosts)) >= len(p.hosts)]
        if whole:
            out.append(f"the rollout of pool(s) {', '.join(whole[:5])} takes every host out of service in one batch: "
                       "a change that disrupts running work (a driver, kubelet or fabric change) stops every job "
                       "on the pool at once; set rollout.max_unavailable to a share (e.g. '25%')")
        limit = self.kubernetes.monitoring.gpu_temperature_limit_c
        if limit < LOADED_GPU_C:
            out.append(f"kubernetes.monitoring.gpu_temperature_limit_c is {limit} C, below what a busy GPU reaches "
                       f"within NVIDIA's limits (an H800's Max Operating Temp is 87 C): GpuTemperatureHigh fires "
                       f"on every busy node; alert at {LOADED_GPU_C}-87 C")
        health = self.kubernetes.health
        if health.enabled and health.active_checks.enabled:
            checked = {p.name for p in checked_pools(self)}
            skipped = [p.name for p in self.kueue_pools if p.name not in checked]
            if skipped:
                out.append(f"pool(s) {', '.join(skipped[:5])} get no active health checks between jobs: only pools "
                           "that burn in (a failed check holds the node until a burn-in passes) and give pods "
                           "whole GPUs are checked")
        for t in self.tenants:
            if not (t.groups.admin or t.groups.edit or t.groups.view):
                out.append(f"tenant {t.name} binds no identity group; only cluster admins can use it")
        return out


# --- cross-field rules: each yields Problems and never stops at the first one ------------------------

def _unique_names(spec: ClusterSpec) -> Iterator[Problem]:
    yield from duplicates([(("sites", i, "name"), s.name) for i, s in enumerate(spec.sites)],
                           "site name", "give each site its own name")
    yield from duplicates([(("sites", i, "racks", j, "name"), r.name)
                            for i, s in enumerate(spec.sites) for j, r in enumerate(s.racks)],
                           "rack name", "rack names must be unique across sites")
    yield from duplicates([(("node_pools", i, "name"), p.name) for i, p in enumerate(spec.node_pools)],
                           "node pool name", "give each pool its own name")
    machines = [(("node_pools", i, "hosts", j, "hostname"), h.hostname)
                for i, p in enumerate(spec.node_pools) for j, h in enumerate(p.hosts)]
    machines += [(("storage", "servers", i, "hostname"), s.hostname) for i, s in enumerate(spec.storage.servers)]
    machines += [(("fabric", "switches", i, "name"), s.name) for i, s in enumerate(spec.fabric.switches)]
    yield from duplicates(machines, "host name", "every host, storage server and switch needs its own name")
    addresses = [(("node_pools", i, "hosts", j, "address"), h.address)
                 for i, p in enumerate(spec.node_pools) for j, h in enumerate(p.hosts)]
    addresses += [(("storage", "servers", i, "address"), s.address) for i, s in enumerate(spec.storage.servers)]
    addresses += [(("storage", "servers", i, "data_address"), s.data_address)
                  for i, s in enumerate(spec.storage.servers) if s.data_address is not None]
    addresses += [(("fabric", "switches", i, "address"), s.address) for i, s in enumerate(spec.fabric.switches)]
    yield from duplicates(addresses, "address", "every host, storage server and switch needs its own address")
    yield from duplicates([(("kubernetes", "kueue", "priority_classes", i, "name"), c.name)
                            for i, c in enumerate(spec.kubernetes.kueue.priority_classes)],
                           "priority class", "give each priority class its own name")


def _racks_exist(spec: ClusterSpec) -> Iterator[Problem]:
    racks = spec.racks
    known = ", ".join(sorted(racks))
    refs = [(("node_pools", i, "hosts", j, "rack"), h.rack)
            for i, p in enumerate(spec.node_pools) for j, h in enumerate(p.hosts)]
    refs += [(("storage", "servers", i, "rack"), s.rack) for i, s in enumerate(spec.storage.servers)]
    refs += [(("fabric", "switches", i, "racks", j), r)
             for i, s in enumerate(spec.fabric.switches) for j, r in enumerate(s.racks)]
    for loc, rack in refs:
        if valid(rack) and rack not in racks:
            yield Problem(loc, f"rack {rack!r} is not defined in sites; known racks: {known}. "
                               "Add the rack to a site or fix the name")


def _tenants(spec: ClusterSpec) -> Iterator[Problem]:
    return unique_tenants(spec.tenants)


def _tenant_namespaces_free(spec: ClusterSpec) -> Iterator[Problem]:
    reserved = spec.reserved_namespaces
    for i, t in enumerate(spec.tenants):
        if t.namespace_name in reserved:
            field = "namespace" if t.namespace else "name"
            yield Problem(("tenants", i, field),
                          f"namespace {t.namespace_name!r} belongs to the platform; choose another "
                          f"(reserved: {', '.join(sorted(reserved))})")


def _dedicated_pools(spec: ClusterSpec) -> Iterator[Problem]:
    """A dedicated pool's owner exists, and no other tenant is given quota on it (its queue could not use it)."""
    names = {t.name for t in spec.tenants}
    for p, pool in enumerate(spec.node_pools):
        owner = pool.dedicated_to
        if owner is None:
            continue
        if owner not in names:
            yield Problem(("node_pools", p, "dedicated_to"), f"no tenant named {owner!r}; tenants: "
                                                           f"{', '.join(sorted(names)) or 'none'}")
        for i, t in enumerate(spec.tenants):
            if t.name != owner and pool.name in t.gpu_quota:
                yield Problem(("tenants", i, "gpu_quota", pool.name),
                              f"node pool {pool.name!r} is dedicated to tenant {owner!r}, so tenant {t.name!r} can "
                              "have no quota on it; remove it, or the pool's dedicated_to")


def _tenant_quotas_fit(spec: ClusterSpec) -> Iterator[Problem]:
    pools = spec.pools
    for i, t in enumerate(spec.tenants):
        for flavor in t.gpu_quota:
            if flavor not in pools:
                yield Problem(("tenants", i, "gpu_quota", flavor),
                              f"no node pool named {flavor!r}; GPU quotas are per node pool: "
                              f"{', '.join(sorted(pools))}")
    for flavor, pool in pools.items():
        asked = [(i, t.gpu_quota[flavor].nominal) for i, t in enumerate(spec.tenants) if flavor in t.gpu_quota]
        total = sum(n for _, n in asked)
        capacity = pool.gpu_resources
        if capacity is not None and total > capacity:
            worst = max(asked, key=lambda a: a[1])[0]
            shared = "" if capacity == pool.gpus else f", shared as {pool.gpu_resources_per_host} per host"
            yield Problem(("tenants", worst, "gpu_quota", flavor),
                          f"tenants are guaranteed {total} {flavor} {pool.gpu_unit_word} in all "
                          f"({', '.join(f'{spec.tenants[i].name}: {n}' for i, n in asked)}) but node pool "
                          f"{flavor!r} holds {capacity} ({len(pool.hosts)} hosts x {pool.gpu.count}{shared}); "
                          "lower the nominal quotas or add hosts")


def _tenant_cpu_memory_fit(spec: ClusterSpec) -> Iterator[Problem]:
    for attr, unit, total in (("cpu_cores", "CPU cores", sum(p.cpu_cores for p in spec.node_pools)),
                              ("memory_gib", "GiB of memory", sum(p.memory_gib for p in spec.node_pools))):
        get = spec.tenant_cpu_cores if attr == "cpu_cores" else spec.tenant_memory_gib
        explicit = [i for i, t in enumerate(spec.tenants) if getattr(t, attr) is not None]
        asked_total = sum(get(t) for t in spec.tenants)
        if explicit and asked_total > total:   # derived quotas follow the GPU quotas, checked above
            yield Problem(("tenants", explicit[0], attr),
                          f"tenants are guaranteed {asked_total} {unit} in all but the node pools have {total}; "
                          f"lower {attr}")


def _infiniband(spec: ClusterSpec) -> Iterator[Problem]:
    fabric = spec.fabric
    hostnames = {h.hostname for _, h in spec.hosts()} | {s.hostname for s in spec.storage.servers}
    if fabric.infiniband is not None:
        ib = fabric.infiniband
        for i, sm in enumerate(ib.subnet_managers):
            if sm not in hostnames:
                yield Problem(("fabric", "infiniband", "subnet_managers", i),
                              f"subnet manager host {sm!r} is not a host or storage server of this cluster; "
                              "list one of their host names")
        yield from duplicates([(("fabric", "infiniband", "partitions", i, "pkey"), f"{p.pkey:#06x}")
                                for i, p in enumerate(ib.partitions)], "partition key",
                               "each partition needs its own pkey")
        yield from duplicates([(("fabric", "infiniband", "partitions", i, "name"), p.name)
                                for i, p in enumerate(ib.partitions)], "partition name",
                               "each partition needs its own name")


def _fabric_isolation(spec: ClusterSpec) -> Iterator[Problem]:
    """Each isolated tenant's partition key is valid and its own; an isolated pool has a fabric to isolate on,
    and its filesystem traffic does not cross the rail ports whose index 0 becomes the tenant's partition."""
    ib = spec.fabric.infiniband
    on = ib is not None and ib.isolate_dedicated_pools
    pkeys = spec.tenant_pkeys
    taken = {p.pkey: ("fabric", "infiniband", "partitions", i, "pkey") for i, p in enumerate(ib.partitions)} \
        if ib is not None else {}
    for i, t in enumerate(spec.tenants):
        loc: Loc = ("tenants", i, "infiniband_pkey")
        if t.infiniband_pkey is not None and ib is None:
            yield Problem(loc, f"tenant {t.name!r} has an infiniband_pkey but the fabric is {spec.fabric.kind}, not "
                               "infiniband; remove it")
            continue
        pkey = t.infiniband_pkey if t.infiniband_pkey is not None else pkeys.get(t.name)
        if pkey is None:
            continue
        if (problem := pkey_problem(pkey)) is not None:
            yield Problem(loc, problem)
        elif pkey in taken:
            how = f"{pkey:#06x}" if t.infiniband_pkey is not None else f"derived key {pkey:#06x}"
            yield Problem(loc, f"tenant {t.name!r}'s partition key ({how}) is already used at {fmt_loc(taken[pkey])};"
                               " each partition needs its own pkey: set tenants[].infiniband_pkey to a free one")
        else:
            taken[pkey] = loc
    if not on:
        return
    if spec.shards:
        yield Problem(("fabric", "infiniband", "isolate_dedicated_pools"),
                      "isolating dedicated pools needs every port GUID in one stack, but the spec is split into "
                      "shards; turn it off or drop shards")
    sms = set(spec.fabric.subnet_managers)
    for p, pool in enumerate(spec.node_pools):
        if pool.dedicated_to is None:
            continue
        for sm in sorted(sms & {h.hostname for h in pool.hosts}):
            yield Problem(("fabric", "infiniband", "subnet_managers", spec.fabric.subnet_managers.index(sm)),
                          f"subnet manager {sm} is a host of node pool {pool.name!r}, which is dedicated to "
                          f"{pool.dedicated_to!r} and isolated: its port would be a limited member of the default "
                          "partition, which every port needs the subnet manager to be a full member of; run it on a "
                          "shared pool's host or a storage server")
        if not pool.nics:
            yield Problem(("node_pools", p, "dedicated_to"),
                          f"node pool {pool.name!r} is dedicated to {pool.dedicated_to!r} but has no InfiniBand NICs "
                          "(nics) to isolate it on; list its NICs, or set isolate_dedicated_pools: false")
        interface = spec.storage_client_interface(pool)
        if pool.nics and spec.storage.kind != "none" and interface in {n.interface for n in pool.nics}:
            yield Problem(("storage", "client_interface"),
                          f"node pool {pool.name!r} (dedicated to {pool.dedicated_to!r}) reaches the filesystem over "
                          f"its rail port {interface}, whose P_Key index 0 (IPoIB, LNet) becomes the tenant's "
                          "partition, which the storage servers are not in; set storage.client_interface to a "
                          "NIC outside the rails, or isolate_dedicated_pools: false")


def _roce_isolation(spec: ClusterSpec) -> Iterator[Problem]:
    """Each isolated tenant's VLAN is valid and its own; an isolated pool's ports are on leaves this library
    configures, and its filesystem traffic does not cross the rail ports that move into the tenant's VLAN."""
    roce = spec.fabric.roce
    vlans = spec.tenant_vlans
    taken: dict[int, Loc] = {}
    if roce is not None:
        taken = {roce.shared_vlan: ("fabric", "roce", "shared_vlan"),
                 **{v: ("fabric", "roce", "site_vlans", i) for i, v in enumerate(roce.site_vlans)}}
    for i, t in enumerate(spec.tenants):
        loc: Loc = ("tenants", i, "roce_vlan")
        if t.roce_vlan is not None and spec.fabric.kind != "rocev2":
            yield Problem(loc, f"tenant {t.name!r} has a roce_vlan but the fabric is {spec.fabric.kind}, not rocev2; "
                               "remove it")
            continue
        vlan = vlans.get(t.name)
        if vlan is None:
            continue
        if vlan in taken:
            how = f"VLAN {vlan}" if t.roce_vlan is not None else f"derived VLAN {vlan}"
            yield Problem(loc, f"tenant {t.name!r}'s {how} is already used at {fmt_loc(taken[vlan])}; each tenant "
                               "needs a VLAN of its own: set tenants[].roce_vlan to a free one")
        else:
            taken[vlan] = loc
    if not spec.vlan_pools:
        return
    at = ("fabric", "roce", "isolate_dedicated_pools")
    if spec.shards:
        yield Problem(at, "isolating dedicated pools sets every leaf port from one stack, but the spec is split into "
                          "shards; turn it off or drop shards")
    managed = {s.name for s in spec.fabric.switches if s.managed and s.vendor in SWITCH_VENDORS}
    for i, s in enumerate(spec.fabric.switches):
        if s.vendor == "sonic" and not s.port_names:
            yield Problem(("fabric", "switches", i, "port_names"),
                          f"SONiC switch {s.name} names its ports by lanes (Ethernet0, Ethernet8 ...), and each "
                          "isolated host's port must be put in its tenant's VLAN by name: list port_names, the "
                          "PORT table's names in port order")
    links = plan_topology(spec)[0].links
    for p, pool in enumerate(spec.node_pools):
        if pool.name not in spec.vlan_pools:
            if pool.dedicated_to is not None and not pool.nics:
                yield Problem(("node_pools", p, "dedicated_to"),
                              f"node pool {pool.name!r} is dedicated to {pool.dedicated_to!r} but has no RoCE NICs "
                              "(nics) to isolate it on; list its NICs, or set isolate_dedicated_pools: false")
            continue
        hosts = {h.hostname for h in pool.hosts}
        cabled = {(link.host, link.rail) for link in links if link.host in hosts and link.leaf in managed}
        loose = sorted({f"{h.hostname} rail {n.rail}" for h in pool.hosts for n in pool.nics} -
                       {f"{h} rail {r}" for h, r in cabled})
        if loose:
            yield Problem(at, f"node pool {pool.name!r} (dedicated to {pool.dedicated_to!r}) has ports on no leaf "
                              f"this library configures ({', '.join(loose[:3])}{' ...' if len(loose) > 3 else ''}), "
                              "so nothing would fence them: list their leaves in fabric.switches (cumulus, sonic or "
                              "eos, not managed: false), or set isolate_dedicated_pools: false")
        interface = spec.storage_client_interface(pool)
        if spec.storage.kind != "none" and interface in {n.interface for n in pool.nics}:
            yield Problem(("storage", "client_interface"),
                          f"node pool {pool.name!r} (dedicated to {pool.dedicated_to!r}) reaches the filesystem over "
                          f"its rail port {interface}, which moves into the tenant's VLAN, where the storage servers "
                          "are not; set storage.client_interface to a NIC outside the rails, or "
                          "isolate_dedicated_pools: false")


def _switches(spec: ClusterSpec) -> Iterator[Problem]:
    fabric = spec.fabric
    switches = {s.name: s for s in fabric.switches}
    rails = {n.rail for p in spec.node_pools for n in p.nics}
    for i, sw in enumerate(fabric.switches):
        if sw.role == "spine" and (sw.uplinks or sw.rails):
            yield Problem(("fabric", "switches", i),
                          f"spine {sw.name} lists uplinks or rails; only leaves have them")
        for j, up in enumerate(sw.uplinks):
            if switches.get(up) is None or switches[up].role != "spine":
                yield Problem(("fabric", "switches", i, "uplinks", j),
                              f"uplink {up!r} of leaf {sw.name} is not a spine switch in fabric.switches")
        for j, rail in enumerate(sw.rails):
            if rail not in rails:
                yield Problem(("fabric", "switches", i, "rails", j),
                              f"rail {rail} is not a rail of any node pool NIC "
                              f"(rails: {', '.join(map(str, sorted(rails))) or 'none'})")
        if fabric.kind != "infiniband" and sw.mtu_bytes is not None and sw.mtu_bytes < fabric.effective_mtu_bytes:
            yield Problem(("fabric", "switches", i, "mtu_bytes"),
                          f"switch {sw.name} MTU {sw.mtu_bytes} is below the hosts' MTU {fabric.effective_mtu_bytes} "
                          "(fabric.mtu_bytes): it would drop their jumbo frames; raise it to at least "
                          f"{fabric.effective_mtu_bytes} or omit it for the vendor's jumbo size")
        roce = fabric.effective_roce
        lossless = LOSSLESS_PRIORITIES.get(sw.vendor)
        if roce is not None and sw.managed and lossless and roce.priority not in lossless:
            yield Problem(("fabric", "roce", "priority"),
                          f"switch {sw.name} runs {sw.vendor}, whose default buffer configuration is lossless only "
                          f"on priorities {' and '.join(map(str, lossless))}, but RoCE uses priority "
                          f"{roce.priority}: PFC there would pause traffic without lossless buffers; use priority "
                          f"{lossless[0]} (and pfc_priorities: [{lossless[0]}])")
        if fabric.kind == "rocev2" and sw.managed and sw.vendor not in SWITCH_VENDORS:
            yield Problem(("fabric", "switches", i, "vendor"),
                          f"no RoCE configuration backend for {sw.vendor} (have: {', '.join(SWITCH_VENDORS)}); "
                          "set managed: false and configure it by hand, or use a supported vendor")


def _leaves_reach_spines(spec: ClusterSpec) -> Iterator[Problem]:
    fabric = spec.fabric
    leaves = [(i, sw) for i, sw in enumerate(fabric.switches) if sw.role == "leaf"]
    if fabric.kind == "infiniband" and len(leaves) > 1:
        for i, sw in leaves:
            if not sw.uplinks:
                yield Problem(("fabric", "switches", i, "uplinks"),
                              f"InfiniBand leaf {sw.name} has no uplinks: leaves without spines are separate subnets, "
                              "each needing its own subnet manager, which this fabric does not set up; connect it "
                              "to the spines")


def _cabling(spec: ClusterSpec) -> Iterator[Problem]:
    yield from plan_topology(spec)[1]


def _control_plane_apart(spec: ClusterSpec) -> Iterator[Problem]:
    """The management network (SSH, NCCL's bootstrap) must not ride a data NIC: changing that NIC's MTU, QoS or
    link would cut the host off, and the data plane's lossless class would carry management traffic."""
    for i, pool in enumerate(spec.node_pools):
        control = pool.control_interface or spec.fabric.control_interface
        field = f"node_pools[{i}].control_interface" if pool.control_interface else "fabric.control_interface"
        for j, nic in enumerate(pool.nics):
            if nic.interface == control:
                yield Problem(("node_pools", i, "nics", j, "interface"),
                              f"{nic.interface} is {field} and also the rail {nic.rail} data NIC "
                              f"of node pool {pool.name}; management and data plane need separate NICs: set "
                              f"{field} to the management interface")


def _rail_subnets(spec: ClusterSpec) -> Iterator[Problem]:
    """The pods' address ranges on the rails (nv-ipam hands each node a block of ips_per_node of its rail's
    subnet): unicast, apart from each other, large enough for every node's block, and holding no address a host,
    storage server or switch already has (pods would be given it, or SSH would run over a data NIC)."""
    n = spec.kubernetes.network_operator
    subnets = [ipaddress.ip_network(c) for c in n.rail_subnets]
    loc = ("kubernetes", "network_operator", "rail_subnets")
    rails = sorted({nic.rail for p in spec.node_pools for nic in p.nics})
    for k, net in enumerate(subnets):
        kind = next((what for what, bad in (("multicast", net.is_multicast), ("loopback", net.is_loopback),
                                            ("link-local", net.is_link_local), ("unspecified", net.is_unspecified),
                                            ("reserved", net.is_reserved)) if bad), None)
        if kind:
            yield Problem((*loc, k), f"{net} is a {kind} range, which no pod can be given; use a private unicast "
                                     "range (e.g. 10.201.0.0/16)")
            continue
        other = next((j for j, o in enumerate(subnets[:k]) if net.overlaps(o)), None)
        if other is not None:
            yield Problem((*loc, k), f"{net} overlaps rail_subnets[{other}] {subnets[other]}: two rails would hand "
                                     "out the same pod addresses; give each rail its own range")
        if k < len(rails):
            nodes = sum(len(p.hosts) for p in spec.node_pools if any(nic.rail == rails[k] for nic in p.nics))
            if nodes * n.ips_per_node > net.num_addresses - 2:
                yield Problem((*loc, k), f"{net} holds {net.num_addresses - 2} pod addresses but rail {rails[k]}'s "
                                         f"{nodes} node(s) take a block of {n.ips_per_node} (ips_per_node) each, "
                                         f"{nodes * n.ips_per_node} in all; use a larger range or fewer ips_per_node")
    holders: list[tuple[Loc, str, str]] = [
        (("node_pools", i, "hosts", j, "address"), f"host {h.hostname}'s SSH address", h.address)
        for i, p in enumerate(spec.node_pools) for j, h in enumerate(p.hosts)]
    for i, server in enumerate(spec.storage.servers):
        holders.append((("storage", "servers", i, "address"), f"storage server {server.hostname}'s address",
                        server.address))
        if server.data_address:
            holders.append((("storage", "servers", i, "data_address"),
                            f"storage server {server.hostname}'s data address", server.data_address))
    holders += [(("fabric", "switches", i, "address"), f"switch {sw.name}'s address", sw.address)
                for i, sw in enumerate(spec.fabric.switches)]
    for k, net in enumerate(subnets):
        inside = [(where, what, addr) for where, what, addr in holders if ipaddress.ip_address(addr) in net]
        if inside:
            yield Problem((*loc, k), f"{net} (rail {rails[k] if k < len(rails) else k}'s pod addresses) holds "
                                     f"{len(inside)} address(es) already in use: "
                                     f"{', '.join(f'{what} {addr}' for _, what, addr in inside[:5])}; pods would be "
                                     "given them, and SSH would run over a data NIC: move the rail subnet to a range "
                                     "no host uses (or, if that is a data NIC's address, give the management "
                                     "address instead)")


def _nccl_floor_reachable(spec: ClusterSpec) -> Iterator[Problem]:
    """A check floor above what the pool's GPUs and NICs can carry fails on every healthy cluster; 1.25 times
    the line rate leaves room for in-network reductions (SHARP, NVLS)."""
    fabric_floor = spec.fabric.checks.nccl_min_busbw_gb_per_s
    for i, pool in enumerate(spec.node_pools):
        ceiling = round(1.25 * pool.nccl_line_rate_gb_per_s, 1)
        wanted, loc = ((pool.nccl_min_busbw_gb_per_s, ("node_pools", i, "nccl_min_busbw_gb_per_s"))
                       if pool.nccl_min_busbw_gb_per_s is not None
                       else (fabric_floor, ("fabric", "checks", "nccl_min_busbw_gb_per_s")))
        if wanted is not None and wanted > ceiling and len(pool.hosts) >= 2:
            yield Problem(loc, f"an NCCL floor of {wanted:g} GB/s is more than pool {pool.name} can carry "
                               f"({pool.nccl_line_rate_gb_per_s:g} GB/s: the slower of its GPUs' NVLink and its NICs), "
                               f"so the check fails on healthy nodes; use at most {ceiling:g}, or omit it for "
                               "nccl_min_percent of the line rate")


def _nccl_hosts_fit(spec: ClusterSpec) -> Iterator[Problem]:
    """The NCCL check runs on exactly nccl_hosts nodes of each pool it runs on; more than a pool holds would be
    quietly cut down to the pool."""
    wanted = spec.fabric.checks.nccl_hosts
    if wanted is None:
        return
    short = [f"{p.name} ({len(p.hosts)})" for p in spec.node_pools
             if 2 <= len(p.hosts) < wanted and not p.sharing.mig_config]
    if short:
        smallest = min(len(p.hosts) for p in spec.node_pools if 2 <= len(p.hosts) < wanted)
        yield Problem(("fabric", "checks", "nccl_hosts"),
                      f"{wanted} nodes for the NCCL check, but node pool(s) {', '.join(short)} hold fewer; use at "
                      f"most {smallest}, or omit it to run the check on every host of each pool")


def _kubernetes(spec: ClusterSpec) -> Iterator[Problem]:
    k = spec.kubernetes
    limit, monitor = k.monitoring.gpu_temperature_limit_c, k.health.gpu_monitor
    if limit < LOADED_GPU_C and k.health.enabled and monitor.enabled and "temperature" in monitor.quarantine_on:
        yield Problem(("kubernetes", "monitoring", "gpu_temperature_limit_c"),
                      f"{limit} C is below what a busy GPU reaches within NVIDIA's limits (an H800's Max Operating "
                      f"Temp is 87 C, nvidia-smi -q), and health.gpu_monitor.quarantine_on has 'temperature': "
                      f"every node that runs a job for temperature_for_s would be quarantined as overheating; give "
                      f"{LOADED_GPU_C}-87 or remove 'temperature' from quarantine_on")
    network = k.network_operator.chart_version if network_operator_enabled(spec) else None
    if not k.allow_unknown_versions and find(k.gpu_operator.chart_version, network, k.kueue.chart_version,
                                             k.nfd.chart_version) is None:
        yield Problem(("kubernetes",),
                      f"gpu_operator {k.gpu_operator.chart_version}, network_operator {network or '(not installed)'}, "
                      f"kueue {k.kueue.chart_version} and nfd {k.nfd.chart_version} are not a known-good "
                      f"combination; known: {describe_known()}. Use a known one or set allow_unknown_versions: true")
    mpi = k.mpi_operator
    if mpi.enabled and not k.allow_unknown_versions and mpi.version not in MPI_OPERATOR_KNOWN:
        yield Problem(("kubernetes", "mpi_operator", "version"),
                      f"MPI operator {mpi.version} is not known to work with Kueue {k.kueue.chart_version}'s MPIJob "
                      f"integration; known: {', '.join(MPI_OPERATOR_KNOWN)}. Use a known one or set "
                      "allow_unknown_versions: true")
    if k.gpu_operator.enabled and k.gpu_operator.driver_managed:
        for i, pool in enumerate(spec.node_pools):
            host_work = [f for f, on in (("burn_in.enabled", pool.burn_in.enabled),
                                         ("tuning.persistence", pool.tuning.persistence),
                                         ("tuning.gpu_clock_lock_mhz", pool.tuning.gpu_clock_lock_mhz),
                                         ("tuning.gpu_power_limit_w", pool.tuning.gpu_power_limit_w)) if on]
            if pool.software.package_repositories and pool.software.driver_version:
                yield Problem(("node_pools", i, "software", "driver_version"),
                              f"node pool {pool.name} installs driver {pool.software.driver_version} on its hosts "
                              "(software.package_repositories), but the GPU Operator installs the driver "
                              "(kubernetes.gpu_operator.driver_managed) and refuses hosts that have one; remove "
                              "driver_version from the pool or set driver_managed: false")
            if host_work:
                yield Problem(("kubernetes", "gpu_operator", "driver_managed"),
                              f"the GPU Operator installs the driver, but node pool {pool.name} sets "
                              f"{', '.join(host_work)}, which run nvidia-smi and DCGM on the host before the "
                              "operator's driver exists; install the driver on the hosts (driver_managed: false, "
                              "the default) or turn those off in the pool")
    for i, pool in enumerate(spec.node_pools):
        if pool.sharing.mig_config and not pool.gpu.info.mig:
            yield Problem(("node_pools", i, "sharing", "mig_config"),
                          f"{pool.gpu.model} has no MIG; remove mig_config or use time_slicing_replicas")
    subnets = k.network_operator.rail_subnets
    with_nics = [p.name for p in spec.node_pools if p.nics]
    if spec.fabric.kind == "rocev2" and network_operator_enabled(spec) and with_nics and not subnets:
        yield Problem(("kubernetes", "network_operator", "rail_subnets"),
                      f"the fabric is RoCE but no rail has a secondary network, so pods of {', '.join(with_nics)} "
                      "get the RDMA devices without their netdevs and no RoCE GID: NCCL falls back to TCP or "
                      "fails; set rail_subnets, one pod IP range per rail, in rail order")
    if subnets:
        rails = sorted({n.rail for p in spec.node_pools for n in p.nics})
        if len(subnets) != len(rails):
            yield Problem(("kubernetes", "network_operator", "rail_subnets"),
                          f"{len(subnets)} subnet(s) for {len(rails)} rail(s) ({', '.join(map(str, rails))}); "
                          "give one subnet per rail, in rail order")


def checked_pools(spec: ClusterSpec) -> list[NodePool]:
    """Pools whose idle nodes get the active health check: a failed check is left by a burn-in, and DCGM's
    diagnostics need whole GPUs, which a pool of time slices or MIG slices never leaves idle as such. A pool
    dedicated to a tenant only where the spec says so: the check's queue would borrow the tenant's flavor."""
    h = spec.kubernetes.health
    if not (h.enabled and h.active_checks.enabled):
        return []
    return [p for p in spec.kueue_pools
            if p.burn_in.enabled and not p.sharing.time_slicing_replicas and not p.sharing.mig_config
            and (p.dedicated_to is None or h.active_checks.dedicated_pools)]


def network_operator_enabled(spec: ClusterSpec) -> bool:
    enabled = spec.kubernetes.network_operator.enabled
    return spec.fabric.rdma if enabled is None else enabled


def _rack_power(spec: ClusterSpec) -> Iterator[Problem]:
    """At peak, what a rack's PDUs feed (GPUs at their TDP plus each host's base power, storage servers, switches)
    must not exceed them: the breakers trip under a full training load, which no burn-in of one node shows."""
    power = spec.rack_power()
    for i, site in enumerate(spec.sites):
        for j, rack in enumerate(site.racks):
            p = power[rack.name]
            if p.peak_kw > rack.pdu_capacity_kw:
                yield Problem(("sites", i, "racks", j, "pdu_capacity_kw"),
                              f"rack {rack.name} draws {'at least ' if p.unknown else ''}{p.peak_kw:g} kW at peak "
                              f"({p.listing()}; GPUs at TDP plus base power) but its PDUs deliver "
                              f"{rack.pdu_capacity_kw:g} kW; move hosts to another rack or correct pdu_capacity_kw")


def _storage_reachable(spec: ClusterSpec) -> Iterator[Problem]:
    """Clients must have a network that reaches the servers' (LNet o2ib needs RDMA on both ends)."""
    storage = spec.storage
    if storage.kind == "none":
        return
    o2ib = storage.kind == "lustre" and spec.storage_lnet == "o2ib"
    if o2ib and not spec.fabric.rdma:
        yield Problem(("storage", "lnet"), f"lnet o2ib needs RDMA but the fabric is {spec.fabric.kind}; use tcp")
    if o2ib:
        for i, server in enumerate(storage.servers):
            if server.data_address is None:
                yield Problem(("storage", "servers", i, "data_address"),
                              f"{server.hostname} has no data_address: an o2ib NID is the address of the "
                              "InfiniBand or RoCE interface, not the management address; set it")
    yield from _client_kinds(spec)
    for i, pool in enumerate(spec.node_pools):
        interface = spec.storage_client_interface(pool)
        if interface is None:
            yield Problem(("storage", "client_interface"),
                          f"node pool {pool.name} has no interface to reach the filesystem on (no NICs, no "
                          "control_interface); set storage.client_interface")
        elif o2ib and storage.client_interface is None and not pool.nics:
            yield Problem(("node_pools", i, "nics"),
                          f"node pool {pool.name} has no RDMA NICs, so it cannot reach the servers' o2ib LNet; "
                          "give it NICs, set storage.client_interface to an RDMA interface, or use lnet tcp")


def _client_kinds(spec: ClusterSpec) -> Iterator[Problem]:
    """A WEKA client's polling cores stay out of every pinned pod's CPUs; GPUDirect Storage needs RDMA NICs; a
    mirror reaches the Scale operator's own image only through a file the program can rewrite."""
    weka, scale = spec.storage.weka, spec.storage.scale
    if weka is not None:
        ids = set(cpu_ids(weka.client_core_ids)) if weka.client_core_ids else None
        for i, pool in enumerate(spec.node_pools):
            t = pool.tuning
            if not t.kubelet_cpu_manager_static:
                continue
            reserved = set(cpu_ids(t.kubelet_reserved_cpus))
            if ids is None:
                yield Problem(("storage", "weka", "client_core_ids"),
                              f"pool {pool.name} pins pods to CPUs (kubelet_cpu_manager_static), and WEKA would "
                              "pick its polling cores among them: name them in client_core_ids, inside "
                              f"kubelet_reserved_cpus ({t.kubelet_reserved_cpus})")
            elif not ids <= reserved or len(reserved - ids) < 1:
                yield Problem(("node_pools", i, "tuning", "kubelet_reserved_cpus"),
                              f"WEKA's polling cores ({weka.client_core_ids}) must lie in {pool.name}'s "
                              f"kubelet_reserved_cpus ({t.kubelet_reserved_cpus}), with at least one CPU left for "
                              "the system: widen kubelet_reserved_cpus or move client_core_ids")
        if weka.gds and (not spec.fabric.rdma or weka.network != "dpdk"):
            yield Problem(("storage", "weka", "gds"), "GPUDirect Storage moves data by RDMA from the client's NIC: "
                                                      "it needs an RDMA fabric and network dpdk; set gds: false")
    if scale is not None and scale.csi.enabled and spec.kubernetes.image_registry and not scale.csi.operator_path:
        source = scale.csi.operator_url or "IBM's release on GitHub"
        yield Problem(("storage", "scale", "csi", "operator_path"),
                      f"images come through the mirror {spec.kubernetes.image_registry}, but the operator's "
                      f"installer from {source} would be applied as it is, its operator image pulled from IBM's "
                      "registry: download the installer into the project and set operator_path to it (its images "
                      "are then rewritten through the mirror)")
    if scale is not None and scale.gds:
        if not spec.fabric.rdma:
            yield Problem(("storage", "scale", "gds"), f"GPUDirect Storage needs RDMA (verbsRdma) but the fabric is "
                                                       f"{spec.fabric.kind}; set gds: false")
        for i, pool in enumerate(spec.node_pools):
            if not pool.nics:
                yield Problem(("node_pools", i, "nics"), f"GPUDirect Storage (storage.scale.gds) reads through "
                                                         f"each pool's RDMA NICs (verbsPorts); {pool.name} lists "
                                                         "none")


def _tenant_claims_fit(spec: ClusterSpec) -> Iterator[Problem]:
    """A tenant's filesystem claims (its directory, each dataset) count against its own ResourceQuota, which
    would refuse them."""
    for i, t in enumerate(spec.tenants):
        if t.storage.filesystem_gib and spec.storage.kind == "none":
            yield Problem(("tenants", i, "storage", "filesystem_gib"),
                          "filesystem_gib is set but there is no parallel filesystem (storage.kind is none)")
            continue
        # the size a site's cluster declares (Lustre's and BeeGFS's targets here are often stand-ins in small specs)
        capacity = spec.storage.capacity_tib if spec.storage.client_only else None
        if t.storage.filesystem_gib and capacity is not None and t.storage.filesystem_gib > capacity * 1024:
            yield Problem(("tenants", i, "storage", "filesystem_gib"),
                          f"{t.storage.filesystem_gib} GiB is more than the whole {spec.storage.kind} filesystem "
                          f"({capacity:g} TiB), so its quota could never bind; lower it")
        claims = spec.filesystem_claims(t)
        gib = sum(c.size_gib for c in claims)
        if gib > t.storage.quota_gib:
            yield Problem(("tenants", i, "storage", "quota_gib"),
                          f"the tenant's filesystem claims request {gib} GiB ({', '.join(c.name for c in claims)}) "
                          f"but quota_gib is {t.storage.quota_gib}, so the quota refuses them; raise quota_gib to "
                          f"at least {gib}")
        if len(claims) > t.storage.max_claims:
            yield Problem(("tenants", i, "storage", "max_claims"),
                          f"the tenant gets {len(claims)} filesystem claims but max_claims is "
                          f"{t.storage.max_claims}")


def _shards(spec: ClusterSpec) -> Iterator[Problem]:
    """A shard's stack is applied after the platform's, so it may hold nothing the platform waits for."""
    yield from duplicates([(("shards", i, "name"), s.name) for i, s in enumerate(spec.shards)], "shard name",
                          "each shard is a stack of its own")
    sms = set(spec.fabric.subnet_managers)
    held: dict[str, str] = {}
    for i, shard in enumerate(spec.shards):
        if shard.name == PLATFORM:
            yield Problem(("shards", i, "name"), f"{PLATFORM!r} is the part that builds everything but the "
                                                 "shards' pools; give the shard another name")
        for j, name in enumerate(shard.node_pools):
            loc = ("shards", i, "node_pools", j)
            pool = spec.pools.get(name)
            if pool is None:
                yield Problem(loc, f"no node pool named {name!r}; node pools: {', '.join(spec.pools) or '(none)'}")
            elif name in held:
                yield Problem(loc, f"pool {name!r} is already in shard {held[name]!r}; a pool is built by one stack")
            elif managers := sorted(h.hostname for h in pool.hosts if h.hostname in sms):
                yield Problem(loc, f"pool {name!r} runs the subnet manager on {', '.join(managers)}, which every "
                                   "other host waits for: keep it in the platform stack (remove it from the shard)")
            held.setdefault(name, shard.name)


_RULES: tuple[Check, ...] = (_unique_names, _racks_exist, _tenants, _tenant_namespaces_free, _dedicated_pools, _tenant_quotas_fit,
                             _tenant_cpu_memory_fit, _infiniband, _fabric_isolation, _roce_isolation, _switches, _leaves_reach_spines,
                             _control_plane_apart, _rail_subnets, _nccl_floor_reachable, _nccl_hosts_fit, _cabling,
                             _kubernetes, slurm_problems, _rack_power, _storage_reachable, _tenant_claims_fit, _shards)
ClusterSpec._checks = _RULES
