"""Slurm on chosen node pools, through SchedMD's Slinky (slurm-operator and its Slurm chart)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from pydantic import Field

from .common import ChartRepo, DnsLabel, Problem, SpecModel, duplicates

if TYPE_CHECKING:
    from .cluster import ClusterSpec

SLINKY_NAMESPACE = "slinky"          # the operator's and its webhook's, as Slinky's install guide names it
SLINKY_VERSION = r"^[0-9]+\.[0-9]+\.[0-9]+$"
# Slinky releases whose charts, CRDs and operator were read for this library (the slurm-operator Go module's
# helm/ and config/crd/bases at the tag), with the Slurm release their images run.
SLINKY_KNOWN = {"1.1.0": "25.11"}


class SlurmSettings(SpecModel):
    """Slurm as a second orchestrator: slurmd runs on every host of the listed pools (a Slinky NodeSet per pool,
    one slurmd pod per node holding all of its GPUs), each pool is a Slurm partition, and Kueue does not see
    those pools at all. A pool is scheduled by Kueue or by Slurm, never both: each would hand out the same GPUs
    without seeing the other's jobs."""

    pools: list[DnsLabel] = Field(
        default_factory=list, max_length=64,
        description="Node pools Slurm schedules, one partition each (named as the pool). Omitted: none; no Slurm "
                    "is installed.")
    default_pool: DnsLabel | None = Field(
        None, description="Pool whose partition jobs go to without --partition. Omitted: the first of pools.")
    version: str = Field("1.1.0", pattern=SLINKY_VERSION,
                         description="Slinky release (the slurm-operator, slurm-operator-crds and slurm charts, "
                                     "one version). Omitted: 1.1.0, running Slurm 25.11.")
    chart_repository: ChartRepo | None = Field(
        None, description="Helm repository or OCI registry path the three charts are mirrored to. Omitted: "
                          "oci://ghcr.io/slinkyproject/charts.")
    namespace: DnsLabel = Field("slurm", description="Namespace of slurmctld and the slurmd pods. Omitted: slurm.")
    partition_max_time_h: int | None = Field(
        None, ge=1, le=8760, description="Longest a job may run in any partition. Omitted: no limit (UNLIMITED).")
    priority_decay_half_life_h: int = Field(
        168, ge=1, le=8760,
        description="Half-life of past usage in fair share (multifactor priority's PriorityDecayHalfLife). "
                    "Omitted: 168 (7 days, Slurm's default).")

    @property
    def enabled(self) -> bool:
        return bool(self.pools)

    @property
    def default(self) -> str | None:
        return self.default_pool or (self.pools[0] if self.pools else None)


def slurm_problems(spec: ClusterSpec) -> Iterator[Problem]:
    """The pools Slurm takes exist, are whole GPUs, and no tenant has a Kueue quota on one."""
    s = spec.kubernetes.slurm
    at = ("kubernetes", "slurm")
    pools = spec.pools
    yield from duplicates([(at + ("pools", i), name) for i, name in enumerate(s.pools)], "pool",
                          "list each pool once")
    for i, name in enumerate(s.pools):
        pool = pools.get(name)
        if pool is None:
            yield Problem(at + ("pools", i), f"no node pool named {name!r}; pools: {', '.join(sorted(pools))}")
        elif pool.sharing.time_slicing_replicas or pool.sharing.mig_config:
            yield Problem(at + ("pools", i),
                          f"node pool {name} shares its GPUs (sharing), which Slurm's gpu GRES does not count; "
                          "give Slurm a pool of whole GPUs or remove the pool's sharing")
        elif pool.cpu_cores_per_host % (pool.threads_per_core * pool.numa_nodes_per_host):
            p = spec.node_pools.index(pool)
            yield Problem(("node_pools", p, "cpu_cores_per_host"),
                          f"{pool.cpu_cores_per_host} CPU threads do not split into {pool.numa_nodes_per_host} NUMA "
                          f"nodes of whole cores of {pool.threads_per_core} threads (threads_per_core), which "
                          "Slurm's gres.conf ties GPUs to; fix cpu_cores_per_host, numa_nodes_per_host or "
                          "threads_per_core")
        elif pool.dedicated_to:
            yield Problem(at + ("pools", i),
                          f"node pool {name} is dedicated to tenant {pool.dedicated_to} through Kueue "
                          "(dedicated_to), which does not schedule a Slurm pool; remove dedicated_to or the pool "
                          "from slurm.pools")
    seen: dict[str, str] = {}
    for p, pool in enumerate(spec.node_pools):
        for h, host in enumerate(pool.hosts if pool.name in s.pools else ()):
            short = host.hostname.split(".", 1)[0]
            if short in seen:
                yield Problem(("node_pools", p, "hosts", h, "hostname"),
                              f"{host.hostname} and {seen[short]} would be the same Slurm node {short!r} (a "
                              "NodeSet pod registers under its node's name up to the first dot); rename one")
            seen.setdefault(short, host.hostname)
    if s.default_pool is not None and s.default_pool not in s.pools:
        yield Problem(at + ("default_pool",), f"{s.default_pool!r} is not one of slurm.pools "
                                              f"({', '.join(s.pools) or 'none'}); name one of them")
    if s.enabled and s.version not in SLINKY_KNOWN and not spec.kubernetes.allow_unknown_versions:
        yield Problem(at + ("version",), f"Slinky {s.version} is not known to this library; known: "
                                         f"{', '.join(SLINKY_KNOWN)}. Use a known one or set "
                                         "kubernetes.allow_unknown_versions: true")
    taken = set(s.pools)
    for i, t in enumerate(spec.tenants):
        for name in t.gpu_quota:
            if name in taken:
                yield Problem(("tenants", i, "gpu_quota", name),
                              f"node pool {name} is scheduled by Slurm (kubernetes.slurm.pools), so a Kueue quota "
                              "on it would never admit a pod there; Slurm accounts for tenants are not generated "
                              "yet: remove the quota, or the pool from slurm.pools")
