"""The Kubernetes side of a cluster, in rooms by concern, lowest first; each imports only from its own room, the
rooms below it and the packages below Kubernetes (spec, bash, records, fabric, storage, nodes), as
tests/components/test_layers.py checks:

- the kit (this folder's modules): helm charts, images and the air-gap mirror, labels and taints, objects (a
  rendered manifest as its resource), quantities, rails (a pod's RDMA resource and rail networks), mpijob (the
  MPIJob a tenant's training and the NCCL check both are);
- tenancy/: a tenant's namespace, RBAC, quotas, Kueue queues, and the job templates tenants submit;
- health/: the detectors, the quarantine rule and the active checks between jobs;
- slurm/: Slurm through Slinky and its prolog/epilog node check;
- platform/: the operators (GPU, Network, NFD, Kueue, MPI) and monitoring, which reads every room's conditions;
- gpu_stack.py: GpuKubernetesStack, which composes them.
"""

from .tenancy.tenant import Tenant, TenantArgs

__all__ = ["Tenant", "TenantArgs"]
