"""GpuCluster: one environment, composed from a validated ClusterSpec."""

from __future__ import annotations

from typing import ClassVar

import pulumi

from .fabric import Fabric
from .k8s.gpu_stack import GpuKubernetesStack
from .k8s.tenant import Tenant, TenantArgs, tenancy_of
from .nodes import GpuNodePool, NodePoolArgs
from .spec import ClusterSpec
from .spec.tenants import Tenancy
from .storage import ParallelFilesystem


class GpuCluster(pulumi.ComponentResource):
    """Everything an environment needs, built from one ClusterSpec.

    The validated spec is the component's input, and each child's slice of it that child's input and output,
    so policy packs can check intent across layers (the engine gives stack policies components' outputs).
    Providers (a Kubernetes provider for another cluster, say) come in through `opts.providers`; the SSH
    private key for hosts and switches is a Pulumi secret.
    """

    TYPE: ClassVar[str] = "gpucluster:index:GpuCluster"

    node_pools: dict[str, GpuNodePool]
    """Node pool components by pool name."""
    fabric: Fabric
    """Host and switch fabric settings, topology figures, NCCL settings and the after-apply checks."""
    kubernetes: GpuKubernetesStack
    """The operators, Kueue and monitoring; what job templates need (flavors, RDMA resource, networks)."""
    tenants: dict[str, Tenant]
    """Tenant components by tenant name."""
    storage: ParallelFilesystem | None
    """The parallel filesystem, where the spec has one."""
    tenancy: Tenancy
    """What tenants managed from another project need (export it; see tenants/)."""

    def __init__(self, name: str, spec: ClusterSpec, ssh_private_key: pulumi.Input[str],
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__(self.TYPE, name, {"spec": spec.model_dump(mode="json")}, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.fabric = Fabric(f"{name}-fabric", spec, ssh_private_key, opts=child)
        # A host's Node is opened to work only once its fabric is set up.
        ready = {h: [r] for h, r in self.fabric.host_scripts.items()}
        self.node_pools = {p.name: GpuNodePool(f"{name}-{p.name}", NodePoolArgs.from_spec(spec, p), ssh_private_key,
                                               opts=child, host_ready=ready) for p in spec.node_pools}
        self.kubernetes = GpuKubernetesStack(f"{name}-k8s", spec, opts=child)
        self.tenancy = tenancy_of(spec)
        self.tenants = {t.name: Tenant(f"{name}-{t.name}", TenantArgs.from_tenancy(self.tenancy, t),
                                       kueue_ready=self.kubernetes.kueue_ready, opts=child)
                        for t in spec.tenants}
        self.storage = None
        if spec.storage.kind != "none":
            self.storage = ParallelFilesystem(
                f"{name}-storage", spec, ssh_private_key, opts=child, host_ready=ready,
                namespaces={t.namespace_name: self.tenants[t.name].namespace for t in spec.tenants})
        self.register_outputs({
            "environment": spec.environment,
            "racks": {name: {"pdu_capacity_kw": rack.pdu_capacity_kw} for name, rack in spec.racks.items()},
            "system_namespaces": sorted(spec.system_namespaces),
            "gpus": spec.gpus,
            "fabric_topology": self.fabric.topology,
            "rdma_resource": self.kubernetes.rdma_resource,
            "networks": self.kubernetes.networks,
            "burn_in": {h: v for p in self.node_pools.values() for h, v in p.burn_in.items()},
            "tenant_namespaces": {n: t.namespace for n, t in self.tenants.items()},
            "tenant_local_queues": {n: t.local_queue for n, t in self.tenants.items()},
            "storage": self.storage.outputs if self.storage else None,
        })
