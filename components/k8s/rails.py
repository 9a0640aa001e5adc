"""How a pod reaches its rails: the RDMA resource it requests and the secondary networks it attaches to, named
here once for the Network Operator's objects (platform/network_operator.py) and every pod that uses them (tenants'
job templates, Slurm's slurmd pods, the fabric's NCCL check)."""

from __future__ import annotations

import re

from ..spec import ClusterSpec, NodePool

NETWORK_NAMESPACE = "default"           # where the NetworkAttachmentDefinitions live; pods refer to default/rail-N


def rdma_resource(spec: ClusterSpec) -> str:
    """The extended resource pods request to get the HCAs (expose it to job templates)."""
    n = spec.kubernetes.network_operator
    prefix = "rdma" if n.rdma_device_plugin == "shared" else "nvidia.com"
    return f"{prefix}/{n.rdma_resource_name}"


def rail_networks(spec: ClusterSpec) -> dict[tuple[int, str], str]:
    """(rail, interface) -> secondary network name: `rail-<N>`, or `rail-<N>-<interface>` per NIC name where
    pools name a rail's NIC differently (a Macvlan network has one master interface). Empty without networks."""
    if not spec.kubernetes.network_operator.rail_subnets:
        return {}
    names: dict[int, set[str]] = {}
    for p in spec.node_pools:
        for nic in p.nics:
            names.setdefault(nic.rail, set()).add(nic.interface)
    return {(rail, i): f"rail-{rail}" if len(ifs) == 1 else f"rail-{rail}-{re.sub('[^a-z0-9-]', '-', i.lower())}"
            for rail, ifs in sorted(names.items()) for i in sorted(ifs)}


def network_names(spec: ClusterSpec) -> list[str]:
    """The shared network attachments pods list in k8s.v1.cni.cncf.io/networks, in rail order."""
    if not spec.kubernetes.network_operator.rail_subnets:
        return []
    return [f"{NETWORK_NAMESPACE}/{name}" for name in rail_networks(spec).values()]


NETWORKS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"


def tenant_networks(spec: ClusterSpec) -> dict[str, dict[tuple[int, str], str]]:
    """Tenant namespace -> (rail, interface) -> network name, for the rails of the pools the fabric isolates for
    that tenant (ClusterSpec.isolated_pools): the tenant's own attachments, in its namespace and named after it
    (the Network Operator's network objects are cluster-wide), for its pods on those pools. Empty without
    networks or isolation."""
    isolated, shared = spec.isolated_pools, rail_networks(spec)
    if not shared or not isolated:
        return {}
    namespaces = {t.name: t.namespace_name for t in spec.tenants}
    out: dict[str, dict[tuple[int, str], str]] = {}
    for p in spec.node_pools:
        if p.name in isolated:
            own = out.setdefault(namespaces[isolated[p.name]], {})
            own.update({(n.rail, n.interface): f"{isolated[p.name]}-{shared[n.rail, n.interface]}" for n in p.nics})
    return {ns: dict(sorted(nets.items())) for ns, nets in sorted(out.items())}


def pod_networks(spec: ClusterSpec, pool: NodePool) -> dict[str, str]:
    """Pod annotations attaching a pod of `pool` to its rails' secondary networks (none without them): the shared
    ones, or on a pool the fabric isolates its tenant's own. On RoCE a pod needs them: RoCE GIDs belong to a
    netdev, and only a netdev in the pod's namespace gives it one."""
    if not spec.kubernetes.network_operator.rail_subnets or not pool.nics:
        return {}
    namespace, networks = NETWORK_NAMESPACE, rail_networks(spec)
    if (owner := spec.isolated_pools.get(pool.name)) is not None:
        namespace = next(t.namespace_name for t in spec.tenants if t.name == owner)
        networks = tenant_networks(spec)[namespace]
    return {NETWORKS_ANNOTATION: ",".join(f"{namespace}/{networks[n.rail, n.interface]}"
                                          for n in sorted(pool.nics, key=lambda n: n.rail))}
