"""The MPIJob (kubeflow.org/v2beta1, as the MPI operator the stack runs serves it) every MPI run of the library
is: a tenant's training job (tenancy/jobs.py) and the fabric's NCCL check (fabric/checks.py) alike."""

from __future__ import annotations

from typing import Any

API_VERSION = "kubeflow.org/v2beta1"


def mpijob(metadata: dict[str, Any], *, slots_per_worker: int, launcher: dict[str, Any], worker: dict[str, Any],
           workers: int, ssh_auth_mount_path: str | None = None) -> dict[str, Any]:
    """`launcher` and `worker`: their pod templates. mpirun starts once every worker's sshd is ready, not
    against one still starting (launcherCreationPolicy); a failed run is not retried, and what still runs after
    it is removed (runPolicy). `ssh_auth_mount_path` omitted: the operator's default (/root/.ssh)."""
    return {
        "apiVersion": API_VERSION, "kind": "MPIJob", "metadata": metadata,
        "spec": {"slotsPerWorker": slots_per_worker,
                 **({"sshAuthMountPath": ssh_auth_mount_path} if ssh_auth_mount_path else {}),
                 "launcherCreationPolicy": "WaitForWorkersReady",
                 "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": 0},
                 "mpiReplicaSpecs": {"Launcher": {"replicas": 1, "template": launcher},
                                     "Worker": {"replicas": workers, "template": worker}}},
    }
