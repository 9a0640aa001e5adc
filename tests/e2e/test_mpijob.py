"""MPIJobs on the real control plane: the MPI operator built from its Go module at the release the stack installs,
Kueue's MPIJob integration as the stack configures it, a tenant's MPIJob from the library's template."""

from __future__ import annotations

import time
from typing import Iterator

import pytest

from components.k8s.platform import mpi_operator
from components.k8s.tenancy.jobs import render_mpijob

from .conftest import Cluster
from .scenarios import Grant, grants
from .test_scheduling import _assert_on_pool

pytestmark = pytest.mark.e2e
LAUNCHER = "training.kubeflow.org/job-role=launcher"


def _mpi_grant(c: Cluster) -> Grant:
    """A tenant with at least two guaranteed whole GPUs on a pool of two hosts or more."""
    for g in grants(c.spec):
        if g.nominal >= 2 and len(g.pool.hosts) >= 2 and not g.pool.sharing.time_slicing_replicas \
                and not g.pool.sharing.mig_config:
            return g
    pytest.skip("the stack has no tenant with two guaranteed whole GPUs on a pool of two hosts")


@pytest.fixture(scope="module")
def operator(cluster: Cluster) -> Iterator[Cluster]:
    """The stack's cluster with the controller its Deployment runs, built from its Go module, for this module's
    tests (one per machine at a time: ControlPlane.mpi_operator)."""
    if not cluster.spec.kubernetes.mpi_operator.enabled:
        pytest.skip("the stack does not install the MPI operator")
    with cluster.cp.mpi_operator(mpi_operator.NAMESPACE):
        yield cluster


@pytest.fixture
def clean(operator: Cluster, clean: Cluster) -> Cluster:
    return clean


def test_the_controller_runs_and_its_pod_passes_restricted_pod_security(operator: Cluster):
    """The plan's Deployment: the ReplicaSet's pod is admitted in the restricted namespace (it stays pending
    here, where every node is a tainted GPU node; the controller itself runs as a process)."""
    cluster = operator
    from .conftest import wait_for
    pods = wait_for(lambda: cluster.cp.get("pods", namespace="mpi-operator")["items"], 30,
                    lambda: "no pod of the mpi-operator Deployment: " + cluster.cp.kubectl(
                        "get", "events", "-n", "mpi-operator").stdout)
    assert pods[0]["spec"]["containers"][0]["securityContext"]["runAsNonRoot"] is True
    assert cluster.cp.procs["mpi-operator"].poll() is None, cluster.cp.log("mpi-operator")


def test_an_mpijob_is_admitted_as_one_gang_and_its_launcher_and_workers_land_on_the_pool(clean: Cluster):
    g = _mpi_grant(clean)
    per_worker = min(g.pool.gpu_units_per_host, g.nominal // 2)
    job = clean.submit(render_mpijob(clean.spec, g.tenant, g.pool, name="mpi-gang", workers=2,
                                     gpus_per_worker=per_worker))
    a = clean.wait_admitted(job, timeout_s=90)
    pod_sets = {ps["name"]: ps["count"] for ps in a.workload["spec"]["podSets"]}
    assert pod_sets == {"launcher": 1, "worker": 2}, pod_sets             # one workload: launcher and workers
    assert set(a.flavors.values()) == {g.pool.name}, a.flavors
    pods = clean.wait_running(job, timeout_s=120)
    roles = sorted(p["metadata"]["labels"].get("training.kubeflow.org/job-role") for p in pods)
    assert roles == ["launcher", "worker", "worker"], roles
    _assert_on_pool(clean, pods, g)


def test_an_mpijob_beyond_the_quota_starts_no_pod_at_all(clean: Cluster):
    """All or nothing: an MPIJob whose workers would fit the quota but not with all of them stays suspended,
    with Kueue's reason, and the operator starts neither launcher nor any worker."""
    g = _mpi_grant(clean)
    per_worker = min(g.pool.gpu_units_per_host, g.nominal // 2)
    workers = (g.nominal + g.borrowable) // per_worker + 1
    job = clean.submit(render_mpijob(clean.spec, g.tenant, g.pool, name="mpi-too-big", workers=workers,
                                     gpus_per_worker=per_worker))
    a = clean.assert_stays_pending(job)
    assert g.pool.name in a.message, a.message
    time.sleep(3)
    live = clean.cp.get("mpijobs.kubeflow.org", "mpi-too-big", namespace=g.tenant.namespace_name)
    assert live["spec"]["runPolicy"].get("suspend") is True
    assert not clean.pods(job)
