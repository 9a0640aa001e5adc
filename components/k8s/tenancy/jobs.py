"""The job template tenants start from: a batch/v1 Job that Kueue admits and Pod Security `restricted` accepts.

Written for the spec it is rendered from, so what it asks for is what the tenant's queue and the pool's nodes
can give: GPUs per pod within a host, CPU and memory per GPU as the tenant's quota derives them, the pool's RDMA
resource and NCCL settings, and a memory-backed /dev/shm (the host's /dev/shm size does not reach pods).
It selects its pool (a tenant with quota on several would otherwise get whichever flavor fits first); the
pool's tolerations come from Kueue's flavor.
"""

from __future__ import annotations

from typing import Any

from ...spec import ClusterSpec, NodePool, Tenant
from ...fabric.nccl import batch_exports, nccl_envs, pod_env
from ...spec.cluster import network_operator_enabled
from ..labels import POOL_LABEL
from ..quantities import binary
from ..rails import pod_networks, rdma_resource
from .tenant import LOCAL_QUEUE
from ..images import through_mirror
from ..mpijob import mpijob

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
# Pod-template annotations asking Kueue's topology-aware scheduling to keep all pods within one domain.
REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
PREFERRED_TOPOLOGY = "kueue.x-k8s.io/podset-preferred-topology"
EXAMPLE_IMAGE = "nvcr.io/nvidia/pytorch:25.01-py3"
# The MPI operator's non-root image layout (its build/base Dockerfile): user mpiuser, uid 1000, sshd on port 2222
# with its config in the home directory, where the operator mounts the job's SSH keys.
EXAMPLE_MPI_IMAGE = "docker.io/mpioperator/mpi-pi:openmpi"
MPI_HOME = "/home/mpiuser"
MPI_SSH_PORT = 2222

# The pod condition Kueue's node failure controller sets on a pod it fails (kueue pkg/controller/tas).
KUEUE_TERMINATED = "TerminatedByKueue"


def per_gpu(pool: NodePool) -> tuple[int, int]:
    """CPU cores and GiB of memory that come with one GPU (or slice) of the pool, rounded down, from what the
    kubelet offers pods (allocatable, always below the host's capacity), so a whole-host pod fits its node."""
    units = pool.gpu_units_per_host
    return pool.allocatable_cpu_cores_per_host // units, pool.allocatable_memory_mib_per_host // 1024 // units


def render_job(spec: ClusterSpec, tenant: Tenant, pool: NodePool, *, name: str, pods: int = 1,
               gpus_per_pod: int | None = None, topology: str | None = None, required: bool = True,
               limits: bool = True, priority_class: str | None = None, queue: str | None = LOCAL_QUEUE,
               image: str = EXAMPLE_IMAGE, command: list[str] | None = None,
               filesystem: bool = True) -> dict[str, Any]:
    """A Job of `pods` pods with `gpus_per_pod` GPUs each (omitted: a whole host's; one replica on a time-sliced
    pool, whose device plugin refuses a pod more).

    `topology` is a node label of the Kueue Topology (a level of `kubernetes.topology_levels`): all pods within
    one such domain, `required` or only preferred; omitted, Kueue places pods where they fit. `limits` sets
    memory limits equal to requests (Guaranteed memory); `queue=None` leaves the queue label out, as a tenant who
    forgets it would (Kueue then defaults it to the namespace's `default` LocalQueue). `filesystem` mounts the
    tenant's parallel-filesystem claims (its directory, the datasets) where the hosts have them.
    """
    shared = pool.sharing.time_slicing_replicas is not None
    gpus = gpus_per_pod if gpus_per_pod is not None else (1 if shared else pool.gpu_units_per_host)
    if shared and gpus > 1:      # the device plugin's time-slicing config sets failRequestsGreaterThanOne
        raise ValueError(f"pool {pool.name} time-slices its GPUs, and the device plugin gives a pod at most one "
                         f"replica; ask for {gpus} pods of one GPU each (one per process) instead")
    cores, mem_gib = per_gpu(pool)
    extended = {pool.gpu_resource_name: str(gpus)} if gpus else {}      # device plugins: requests equal limits
    if network_operator_enabled(spec) and pool.nics and gpus:
        extended[rdma_resource(spec)] = "1"
    requests: dict[str, Any] = {"cpu": str(max(1, cores * gpus)), "memory": binary(max(1, mem_gib * gpus), "Gi"),
                                **extended}
    resources: dict[str, Any] = {"requests": requests,
                                 "limits": {**extended, **({"memory": requests["memory"]} if limits else {})}}
    container: dict[str, Any] = {
        "name": "trainer", "image": image,
        "command": command or ["torchrun", f"--nnodes={pods}", f"--nproc-per-node={gpus}", "train.py"],
        "resources": resources,
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }
    # Memory-backed, counted against the pod's memory: half of what the pod requests.
    shm = binary(max(1, mem_gib * gpus // 2), "Gi")
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}}]
    claims = spec.filesystem_claims(tenant) if filesystem else []
    for claim in claims:                                                 # at the paths they have on the hosts
        container["volumeMounts"].append({"name": claim.name, "mountPath": claim.path, "readOnly": claim.read_only})
        volumes.append({"name": claim.name, "persistentVolumeClaim": {"claimName": claim.name,
                                                                      "readOnly": claim.read_only}})
    groups = sorted({c.group for c in claims if c.group is not None})    # the tenant directory's owning group
    if pool.name in tenant.gpu_quota:        # the tenant's namespace has the pool's NCCL settings (see Tenant)
        container["envFrom"] = [{"configMapRef": {"name": f"nccl-{pool.name}"}}]
    template_meta: dict[str, Any] = {"labels": {"app.kubernetes.io/name": name}}
    annotations = {**({REQUIRED_TOPOLOGY if required else PREFERRED_TOPOLOGY: topology} if topology else {}),
                   **(pod_networks(spec, pool) if gpus else {})}
    if annotations:
        template_meta["annotations"] = annotations
    labels = {**({QUEUE_LABEL: queue} if queue else {}), **({PRIORITY_LABEL: priority_class} if priority_class else {})}
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": tenant.namespace_name, **({"labels": labels} if labels else {})},
        "spec": {
            "parallelism": pods, "completions": pods, "completionMode": "Indexed",
            # A pod evicted by a drain (a pool's rollout, a node's maintenance) is not the job's failure: the
            # Job controller starts it again where it fits, and Kueue keeps the job admitted. Any other failure
            # still ends the job at once (no index may fail). Back-off per index: the controller delays a
            # replacement 10 s doubling per failure, ignored ones included, counted per index here but over
            # the whole job with a job-wide backoffLimit (a rollout's evictions of 8 pods: 10 min).
            "backoffLimitPerIndex": 0, "maxFailedIndexes": 0,
            # Kueue's own (TAS): a replacement pod pinned to a node that cannot take it (drained, tainted) is
            # failed with TerminatedByKueue (reason UnschedulableOnAssignedNode) for the Job controller to create
            # again elsewhere; counted as a failure, it would fail the whole job (maxFailedIndexes 0).
            "podFailurePolicy": {"rules": [{"action": "Ignore", "onPodConditions": [
                {"type": "DisruptionTarget", "status": "True"}, {"type": KUEUE_TERMINATED, "status": "True"}]}]},
            "template": {
                "metadata": template_meta,
                "spec": {
                    "restartPolicy": "Never",
                    # The pool it was written for: with quota on several pools, Kueue would otherwise give it the
                    # first flavor that fits, another GPU model than its NCCL settings and sizes are for.
                    "nodeSelector": {POOL_LABEL: pool.name},
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000,
                                        "seccompProfile": {"type": "RuntimeDefault"},
                                        **({"supplementalGroups": groups} if groups else {})},
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }


def render_mpijob(spec: ClusterSpec, tenant: Tenant, pool: NodePool, *, name: str, workers: int,
                  gpus_per_worker: int | None = None, image: str = EXAMPLE_MPI_IMAGE,
                  command: list[str] | None = None, topology: str | None = None, required: bool = True,
                  queue: str | None = LOCAL_QUEUE) -> dict[str, Any]:
    """An MPIJob (kubeflow.org/v2beta1) of `workers` workers with `gpus_per_worker` GPUs each (omitted: as
    render_job's pods), one rank per GPU, and a launcher of one CPU. Kueue admits it as one workload, launcher
    and workers together, and its flavor places both on the pool. Under the namespace's restricted pod security
    the image must run sshd as its user, as the MPI operator's non-root images do (`image`: one built on them)."""
    job = render_job(spec, tenant, pool, name=name, pods=workers, gpus_per_pod=gpus_per_worker, topology=topology,
                     required=required, queue=queue, image=image,
                     command=["/usr/sbin/sshd", "-De", "-f", f"{MPI_HOME}/.sshd_config"])
    worker = job["spec"]["template"]
    container = worker["spec"]["containers"][0]
    container["name"] = "worker"
    container["readinessProbe"] = {"tcpSocket": {"port": MPI_SSH_PORT}, "periodSeconds": 5}
    gpus = int(container["resources"]["limits"][pool.gpu_resource_name])
    # Ranks start through sshd, which does not hand them the pod's environment: mpirun forwards the NCCL settings.
    forward = [a for k in sorted(pod_env(nccl_envs(spec)[pool.name])) for a in ("-x", k)] \
        if pool.name in tenant.gpu_quota else []
    mpirun = command or ["mpirun", "-np", str(workers * gpus), "--bind-to", "none", *forward, "python", "train.py"]
    launcher = render_job(spec, tenant, pool, name=name, gpus_per_pod=0, queue=None, image=image, command=mpirun,
                          filesystem=False)["spec"]["template"]
    launcher["spec"]["containers"][0]["name"] = "launcher"
    for template in (worker, launcher):
        del template["spec"]["restartPolicy"]             # the operator sets each replica's own
    return mpijob(job["metadata"], slots_per_worker=gpus, launcher=launcher, worker=worker, workers=workers,
                  ssh_auth_mount_path=f"{MPI_HOME}/.ssh")


def _example_shape(pool: NodePool, nominal: int) -> tuple[int, int]:
    """An example job's pods (two hosts where the pool has them and the tenant two GPUs) and GPUs per pod,
    within the tenant's guaranteed `nominal`."""
    pods = min(2, len(pool.hosts)) if nominal >= 2 else 1
    return pods, max(1, min(pool.gpu_units_per_host, nominal // pods))


def render_example_jobs(spec: ClusterSpec) -> dict[str, dict[str, Any]]:
    """One ready-to-edit Job per tenant and pool it has GPUs on, within its guaranteed GPUs: two pods (on two
    hosts where the pool has them), kept in one leaf switch's domain when the topology has that level; and the
    same as an MPIJob (`<tenant>-<pool>-mpi`) where the pool's GPUs are whole and two workers fit."""
    leaf = next((lvl for lvl in spec.kubernetes.kueue.topology_levels if lvl.endswith("/leaf")), None)
    out = {}
    kueue = {p.name for p in spec.kueue_pools}          # a Slurm pool's GPUs: render_example_batch_jobs
    for tenant in spec.tenants:
        for pool_name, quota in tenant.gpu_quota.items():
            if pool_name not in kueue:
                continue
            pool = spec.pools[pool_name]
            pods, per_pod = _example_shape(pool, quota.nominal)
            if pool.sharing.time_slicing_replicas:     # one replica per pod, a pod per process
                pods, per_pod = min(2, quota.nominal) or 1, 1
            out[f"{tenant.name}-{pool.name}"] = render_job(spec, tenant, pool, name=f"train-{pool.name}", pods=pods,
                                                           gpus_per_pod=per_pod, topology=leaf, required=False,
                                                           image=EXAMPLE_IMAGE)
            if pods >= 2 and not pool.sharing.time_slicing_replicas and not pool.sharing.mig_config:
                out[f"{tenant.name}-{pool.name}-mpi"] = render_mpijob(
                    spec, tenant, pool, name=f"mpi-{pool.name}", workers=pods, gpus_per_worker=per_pod,
                    topology=leaf, required=False, image=EXAMPLE_MPI_IMAGE)
    return through_mirror(out, spec)


def render_example_batch_jobs(spec: ClusterSpec) -> dict[str, str]:
    """What a tenant starts from on a Slurm pool (where no Kubernetes job is ever admitted): an sbatch script
    under its account and the pool's partition, within its guaranteed GPUs, CPU and memory per GPU as the
    Kubernetes template asks, the pool's NCCL settings, and torchrun on each node (one task a node)."""
    out = {}
    slurm = set(spec.kubernetes.slurm.pools)
    envs = nccl_envs(spec) if slurm else {}             # the topology is planned once for every pool
    for tenant in spec.tenants:
        for pool_name, quota in tenant.gpu_quota.items():
            if pool_name not in slurm or not quota.nominal:
                continue
            pool = spec.pools[pool_name]
            nodes, gpus = _example_shape(pool, quota.nominal)     # Slurm pools give whole GPUs only
            cores, mem_gib = per_gpu(pool)
            out[f"{tenant.name}-{pool.name}"] = (
                f"#!/bin/bash\n#SBATCH --job-name=train-{pool.name}\n#SBATCH --account={tenant.name}\n"
                f"#SBATCH --partition={pool.name}\n#SBATCH --nodes={nodes}\n#SBATCH --ntasks-per-node=1\n"
                f"#SBATCH --gpus-per-node={gpus}\n#SBATCH --cpus-per-gpu={max(1, cores)}\n"
                f"#SBATCH --mem-per-gpu={max(1, mem_gib)}G\n"
                f"# {tenant.name}'s job on Slurm pool {pool.name} (generated by gpucluster): {nodes} node(s) x "
                f"{gpus} GPU(s), within its guaranteed {quota.nominal}.\n"
                "# Edit the torchrun line and submit it with sbatch from a login node. The ranks get the pool's "
                "NCCL settings from\n# here: a job's tasks do not see the slurmd pod's.\n"
                "set -euo pipefail\n" + batch_exports(envs[pool.name])
                + 'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)\n'
                f'srun torchrun --nnodes="$SLURM_NNODES" --nproc-per-node={gpus} --rdzv-backend=c10d '
                '--rdzv-endpoint="$head:29500" --rdzv-id="$SLURM_JOB_ID" train.py\n')
    return out
