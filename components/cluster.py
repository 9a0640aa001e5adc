"""GpuCluster: one environment, composed from a validated ClusterSpec."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import pulumi

from .fabric import Fabric
from .fabric.fabric import fabric_hosts, host_script
from .fabric.partitions import FabricPartitions
from .fabric.vlans import FabricVlans
from .k8s.gpu_stack import GpuKubernetesStack
from .k8s.tenancy.tenant import Tenant, TenantArgs, tenancy_of
from .nodes import GpuNodePool, NodePoolArgs
from .nodes.handover import leaving_drain_s, owners, render_handover
from .nodes.node_pool import kubectl_step
from .spec import ClusterSpec
from .spec.cluster import PLATFORM
from .spec.tenants import Tenancy
from .split import part_intent, platform_exports
from .storage import ParallelFilesystem
from .storage.filesystem import ServersElsewhere, render_client
from .storage.layout import plan_layout
from .types import token


class GpuCluster(pulumi.ComponentResource):
    """Everything an environment needs, built from one ClusterSpec.

    Each child's slice of the validated spec is that child's input and output, so policy packs can check
    intent across layers (the engine gives stack policies components' outputs) while a change shows only where
    its slice is; the whole spec is this component's output `spec_json`, from which the offline plan reads it.
    Providers (a Kubernetes provider for another cluster, say) come in through `opts.providers`; the SSH
    private key for hosts and switches is a Pulumi secret. `kubeconfig` (a secret, the content or a path) and
    `kube_context` are for kubectl where pulumi runs, which drains nodes in a rollout: give what the Kubernetes
    provider is given. Omitted: kubectl's own configuration (KUBECONFIG or ~/.kube/config).
    """

    TYPE: ClassVar[str] = token("GpuCluster")

    node_pools: dict[str, GpuNodePool]
    """Node pool components by pool name."""
    partitions: FabricPartitions | None
    """The isolated tenants' InfiniBand partitions on the subnet managers, where the spec isolates a pool."""
    vlans: FabricVlans | None
    """The isolated tenants' RoCE VLANs on the managed switches, where the spec isolates a pool."""
    fabric: Fabric | None
    """Host and switch fabric settings, topology figures, NCCL settings and the after-apply checks; None in a
    shard's stack."""
    kubernetes: GpuKubernetesStack
    """The operators, Kueue and monitoring; what job templates need (flavors, RDMA resource, networks). In a
    shard's stack, its hosts' objects alone (and none of those facts)."""
    tenants: dict[str, Tenant]
    """Tenant components by tenant name (none in a shard's stack)."""
    storage: ParallelFilesystem | None
    """The parallel filesystem, where the spec has one (in a shard's stack, its hosts' clients alone)."""
    tenancy: Tenancy
    """What tenants managed from another project need (export it; see tenants/)."""
    shared: dict[str, Any]
    """What the shards' stacks read from the platform stack: export each as a stack output there (empty in
    any other part)."""

    def __init__(self, name: str, spec: ClusterSpec, ssh_private_key: pulumi.Input[str],
                 opts: pulumi.ResourceOptions | None = None, *, kubeconfig: pulumi.Input[str] | None = None,
                 kube_context: str | None = None, slurm_directory_password: pulumi.Input[str] | None = None,
                 part: str | None = None, platform: pulumi.StackReference | None = None,
                 storage_api_password: pulumi.Input[str] | None = None):
        """`slurm_directory_password`: the Slurm login set's directory bind_dn's password, a secret; needed
        where the spec has a bind_dn. `storage_api_password`: the WEKA API user's (storage.weka.api_username), a
        secret; needed where the spec has WEKA quotas. `part` (README: Split stacks): `platform`, everything but the pools of
        the spec's shards; or a shard's name, that shard's pools, reading `platform` (a StackReference to the
        platform stack, applied first from the same spec). Omitted: the whole environment."""
        super().__init__(self.TYPE, name, {**intent(spec), **part_intent(spec, part, platform)}, opts)
        compose(self, name, spec, ssh_private_key, kubeconfig=kubeconfig, kube_context=kube_context,
                slurm_directory_password=slurm_directory_password, part=part, platform=platform,
                storage_api_password=storage_api_password)


def intent(spec: ClusterSpec) -> dict[str, Any]:
    """A GpuCluster's registered inputs: which environment it is (each child registers its own slice)."""
    return {"name": spec.name, "environment": spec.environment}


def compose(cluster: Any, name: str, spec: ClusterSpec, ssh_private_key: pulumi.Input[str], *,
            kubeconfig: pulumi.Input[str] | None, kube_context: str | None,
            slurm_directory_password: pulumi.Input[str] | None = None, part: str | None = None,
            platform: pulumi.StackReference | None = None,
            storage_api_password: pulumi.Input[str] | None = None) -> None:
    """GpuCluster's children and outputs, under `cluster`: a GpuCluster, or the component provider's
    (provider.py), which registers the same children under the same type from args any language can give."""
    child = pulumi.ResourceOptions(parent=cluster)
    pools = spec.pools_of(part)
    here = {h.hostname for p in pools for h in p.hosts}
    shard = platform if part not in (None, PLATFORM) else None
    # Each GPU host's fabric settings run in its preparation's SSH session; hosts wait for the subnet
    # managers, so pools with one go first. A shard's pools hold none: they wait for the platform stack.
    sms = set(spec.fabric.subnet_managers)
    if shard is None:
        cluster.fabric = Fabric(f"{name}-fabric", spec, ssh_private_key, opts=child, gpu_hosts=False)
        scripts, after = cluster.fabric.host_scripts, list(cluster.fabric.subnet_managers)
    else:
        cluster.fabric = None
        scripts = {h.hostname: host_script(spec, h, in_place=True) for h in fabric_hosts(spec) if h.hostname in here}
        after = [shard]
    # A Node opens to work only once its filesystem client is mounted, and the client is set up after the
    # host's preparation: the pools' Node patches wait on a value each host's client resolves later.
    mounted: dict[str, asyncio.Future[pulumi.Resource]] = {
        h: asyncio.get_event_loop().create_future() for h in here}
    # Each pool's copy carries its hosts' filesystem client too (one text for the pool but the host's name).
    layout = plan_layout(spec) if spec.storage.kind != "none" else None
    # Split, each stack's first client applies the tenants' directories, which the platform's volumes do not
    # wait for: its stack's hosts open to work after it too.
    first = next((h.hostname for _, h in spec.hosts() if h.hostname in here), None)

    # An isolated pool's host opens to work once its tenant's partition or VLAN is on its ports: after each
    # subnet manager's partitions step, which needs every isolated host's port GUIDs (so it comes after the
    # pools), or each leaf's VLAN step.
    isolated = [h for h in spec.isolated_hosts if h in here]
    fenced: asyncio.Future[pulumi.Resource] | None = asyncio.get_event_loop().create_future() if isolated else None

    def opened_after(host: str) -> list[asyncio.Future[pulumi.Resource]]:
        fence = [fenced] if fenced is not None and host in isolated else []
        return fence + ([mounted[host]] if part is None or layout is None or host == first
                        else [mounted[host], mounted[first]])

    cluster.node_pools = {}
    for p in sorted(pools, key=lambda p: not any(h.hostname in sms for h in p.hosts)):
        client = render_client(spec, layout, p, p.hosts[0]) if layout is not None else None
        pool = GpuNodePool(f"{name}-{p.name}", NodePoolArgs.from_spec(spec, p), ssh_private_key, opts=child,
                           fabric={h.hostname: scripts[h.hostname] for h in p.hosts if h.hostname in scripts},
                           after=after, subnet_managers=sms,
                           host_ready={h.hostname: opened_after(h.hostname) for h in p.hosts},
                           kubeconfig=kubeconfig, kube_context=kube_context,
                           also_ship=[t for t in client if isinstance(t, str)] if client else ())
        after = after + pool.subnet_managers
        cluster.node_pools[p.name] = pool
    cluster.node_pools = {p.name: cluster.node_pools[p.name] for p in pools}
    ready = {h: [r] for pool in cluster.node_pools.values() for h, r in pool.prepared.items()}
    cluster.partitions = cluster.vlans = None
    reopened: pulumi.Resource | None = None
    try:
        if isolated:    # the Nodes whose ports change partition or VLAN drained first, given back after
            kube, env = next(iter(cluster.node_pools.values())).kube, {"GPUCLUSTER_PARTITIONS": owners(spec),
                                                                   "GPUCLUSTER_LEAVING_DRAIN_S": str(leaving_drain_s(spec))}
            steps_of = render_handover(spec)
            role = "partitions" if spec.partitioned_pools else "vlans"
            # Where isolation ends, these go: deleted dependents first, the reopen's delete drains the tenants'
            # Nodes before the fence steps' deletes put their ports back, and the handover's gives them back.
            handover = kubectl_step(cluster, kube, f"{name}-{role}-handover", steps_of.drain, steps_of.released,
                                    [*after, *(ready[h][0] for h in isolated)], env)
            if spec.partitioned_pools:
                cluster.partitions = FabricPartitions(
                    f"{name}-partitions", spec, {h.hostname: h.target for h in fabric_hosts(spec)},
                    {h: ready[h][0].stdout for h in isolated}, ssh_private_key, opts=child, depends_on=[handover])
                steps = list(cluster.partitions.steps.values())
            else:
                switches = list(cluster.fabric.switch_commands.values()) if cluster.fabric is not None else []
                cluster.vlans = FabricVlans(f"{name}-vlans", spec, ssh_private_key, opts=child,
                                            depends_on=[handover, *switches])
                steps = [handover, *cluster.vlans.steps.values()]
            reopened = kubectl_step(cluster, kube, f"{name}-{role}-reopen", steps_of.reopen, steps_of.release,
                                    steps, env)
    finally:     # resolved even when it fails to build, so no registration waits forever
        if fenced is not None:
            fenced.set_result(reopened or ready[isolated[0]][0])
    # Storage servers set up their filesystem once their fabric settings (RoCE QoS, a subnet manager) are in.
    if cluster.fabric is not None:
        ready.update({h: [r] for h, r in cluster.fabric.host_commands.items() if h not in ready})
    cluster.tenancy = tenancy_of(spec)
    # A shard's holds its hosts' Kubernetes objects alone, so the platform's length does not grow with them.
    cluster.kubernetes = GpuKubernetesStack(f"{name}-k8s", spec, opts=child,
                                            slurm_directory_password=slurm_directory_password, part=part,
                                            platform=shard)
    cluster.tenants = {t.name: Tenant(f"{name}-{t.name}", TenantArgs.from_tenancy(cluster.tenancy, t),
                                      kueue_ready=cluster.kubernetes.kueue_ready, opts=child)
                       for t in spec.tenants} if shard is None else {}
    cluster.storage = None
    try:
        if spec.storage.kind != "none":
            auth = shard.get_output("storageAuth") if shard is not None and spec.storage.auth else None
            cluster.storage = ParallelFilesystem(
                f"{name}-storage", spec, ssh_private_key, opts=child, host_ready=ready,
                namespaces={t.namespace_name: cluster.tenants[t.name].namespace for t in spec.tenants
                            if t.name in cluster.tenants},
                libs={h: pool.lib for pool in cluster.node_pools.values() for h in pool.prepared},
                client_hosts=here if part is not None else None,
                servers=ServersElsewhere(shard, auth) if shard is not None else None,
                api_password=storage_api_password)
    finally:     # resolved even when the filesystem fails to build, so no registration waits forever
        clients = cluster.storage.clients if cluster.storage is not None else {}
        for host, future in mounted.items():
            future.set_result(clients.get(host) or ready[host][0])
    cluster.shared = platform_exports(spec, cluster.storage.auth if cluster.storage else None) \
        if part == PLATFORM else {}
    # The whole spec is an output, not an input, so a change shows only on the components and resources whose
    # slice it is; and one JSON text, not a tree, since each child already registers its slice for policies
    # and the SDK serializes a tree value by value. What the children register is theirs alone.
    cluster.register_outputs({
        "spec_json": spec.model_dump_json(exclude=None if spec.shards else {"shards"}),  # as before shards
        "environment": spec.environment,
        "racks": {name: {"pdu_capacity_kw": p.capacity_kw, "pdu_redundancy": p.redundancy,
                         "peak_kw": p.peak_kw, "peak": p.listing(), "unknown": list(p.unknown)}
                  for name, p in spec.rack_power().items()},
        "system_namespaces": sorted(spec.system_namespaces),
        "gpus": spec.gpus,
        **({"part": part} if part is not None else {}),       # for policies, which see components' outputs
    })
