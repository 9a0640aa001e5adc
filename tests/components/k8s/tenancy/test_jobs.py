"""The tenant job template: what it asks for follows the pool and the tenant's quota; Pod Security restricted."""

from __future__ import annotations

import kubernetes_validate
import yaml

from components.k8s.labels import POOL_LABEL
from components.nodes.host_prep import render_kubelet_config
from components.k8s.tenancy.jobs import PREFERRED_TOPOLOGY, REQUIRED_TOPOLOGY, render_example_jobs, render_job
from components.spec import parse_spec
from components.spec.storage import quota_id


def test_a_whole_host_job_asks_for_what_the_kubelet_offers_pods_not_the_hosts_capacity(dev_spec):
    """dev: 112 cores of which the static CPU manager reserves 0-1 (not allocatable), 2048 GiB less the system's
    reservation (GKE's tiers: 48,866 MiB of 2 TiB) and kubelet's 100 MiB eviction threshold; a pod gets whole
    cores and GiB per GPU of that. A pod asking for the capacity would never schedule, and one asking for all but
    the eviction threshold would leave the kubelet, containerd, DCGM and slurmd nothing."""
    pool = dev_spec.pools["h100"]
    assert pool.system_reserved_memory_mib == 48866
    assert (pool.allocatable_cpu_cores_per_host, pool.allocatable_memory_mib_per_host) == \
        (110, 2048 * 1024 - 48866 - 100)
    job = render_job(dev_spec, dev_spec.tenants[0], pool, name="train", pods=2)
    pod = job["spec"]["template"]["spec"]
    [c] = pod["containers"]
    assert c["resources"]["requests"] == {"cpu": "104", "memory": "2000Gi", "nvidia.com/gpu": "8",
                                          "rdma/rdma_shared_devices": "1"}
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "8", "rdma/rdma_shared_devices": "1", "memory": "2000Gi"}
    assert job["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "default"}
    assert job["spec"]["parallelism"] == job["spec"]["completions"] == 2
    assert c["envFrom"] == [{"configMapRef": {"name": "nccl-h100"}}]
    assert pod["nodeSelector"] == {POOL_LABEL: pool.name} and "tolerations" not in pod   # the flavor adds them


def test_the_template_meets_pod_security_restricted(dev_spec):
    pod = render_job(dev_spec, dev_spec.tenants[0], dev_spec.pools["h100"], name="t")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for c in pod["containers"]:
        assert c["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def test_an_evicted_pod_comes_back_after_its_own_back_off_and_any_other_failure_ends_the_job(dev_spec):
    """A drain's eviction (DisruptionTarget) is ignored; the Job controller's back-off (10 s doubling per failure,
    ignored ones included: kubernetes pkg/controller/job/backoff_utils.go) counts per index, so a rollout that
    evicts every pod of an 8-pod job delays each by 10 s, not the whole job by 2^7 x 10 s (capped at 10 min).
    No index may fail: a real failure still ends the job at once, as backoffLimit 0 did. A pod Kueue fails for
    its assigned node (TerminatedByKueue, tests/e2e/test_rollout.py) is ignored like an eviction."""
    spec = render_job(dev_spec, dev_spec.tenants[0], dev_spec.pools["h100"], name="t", pods=8)["spec"]
    assert spec["completionMode"] == "Indexed"
    assert (spec["backoffLimitPerIndex"], spec["maxFailedIndexes"]) == (0, 0) and "backoffLimit" not in spec
    assert spec["podFailurePolicy"]["rules"] == [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"},
                                                 {"type": "TerminatedByKueue", "status": "True"}]}]


def test_shm_is_memory_backed_and_sized_from_the_pod_memory(dev_spec):
    pod = render_job(dev_spec, dev_spec.tenants[0], dev_spec.pools["h100"], name="t", gpus_per_pod=2,
                     filesystem=False)
    spec = pod["spec"]["template"]["spec"]
    assert spec["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "250Gi"}}]  # 2 x 250 / 2
    assert spec["containers"][0]["volumeMounts"] == [{"name": "dshm", "mountPath": "/dev/shm"}]


def test_pods_mount_the_tenants_filesystem_claims_where_the_hosts_have_them(dev_spec):
    team_b = next(t for t in dev_spec.tenants if t.name == "team-b")
    pod = render_job(dev_spec, team_b, dev_spec.pools["h100"], name="t")["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["devfs"] == {"name": "devfs", "mountPath": "/mnt/devfs/tenants/team-b", "readOnly": False}
    assert mounts["devfs-common"]["readOnly"] is True
    assert {"name": "devfs", "persistentVolumeClaim": {"claimName": "devfs", "readOnly": False}} in pod["volumes"]
    # the tenant's directory belongs to its group (setgid): its pods join that group to write there
    assert pod["securityContext"]["supplementalGroups"] == [quota_id("team-b")]
    team_a = render_job(dev_spec, dev_spec.tenants[0], dev_spec.pools["h100"], name="t")["spec"]["template"]["spec"]
    assert "supplementalGroups" not in team_a["securityContext"]          # datasets only: read-only, no group


def test_options_topology_priority_no_limits_no_queue(dev_spec):
    t, pool = dev_spec.tenants[0], dev_spec.pools["h100"]
    job = render_job(dev_spec, t, pool, name="t", topology="gpucluster.io/leaf", priority_class="production",
                     limits=False, queue=None)
    assert job["metadata"]["labels"] == {"kueue.x-k8s.io/priority-class": "production"}
    assert job["spec"]["template"]["metadata"]["annotations"] == {
        REQUIRED_TOPOLOGY: "gpucluster.io/leaf", "k8s.v1.cni.cncf.io/networks": "default/rail-0,default/rail-1"}
    assert "memory" not in job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    preferred = render_job(dev_spec, t, pool, name="t", topology="gpucluster.io/leaf", required=False)
    assert preferred["spec"]["template"]["metadata"]["annotations"][PREFERRED_TOPOLOGY] == "gpucluster.io/leaf"


def test_time_sliced_pools_share_the_host_per_slice(dev_data):
    dev_data["node_pools"][0]["sharing"] = {"time_slicing_replicas": 4}
    dev_data["node_pools"][0]["tuning"]["kubelet_cpu_manager_static"] = False
    spec = parse_spec(yaml.safe_dump(dev_data))
    job = render_job(spec, spec.tenants[0], spec.pools["h100"], name="t", gpus_per_pod=1)
    assert job["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] == str(112 // 32)


def test_no_rdma_resource_on_plain_ethernet(dev_data):
    dev_data["fabric"] = {"kind": "ethernet"}
    spec = parse_spec(yaml.safe_dump(dev_data))
    c = render_job(spec, spec.tenants[0], spec.pools["h100"], name="t")["spec"]["template"]["spec"]["containers"][0]
    assert set(c["resources"]["requests"]) == {"cpu", "memory", "nvidia.com/gpu"}


def test_example_jobs_fit_each_tenants_guaranteed_gpus_and_are_valid(dev_spec):
    jobs = render_example_jobs(dev_spec)
    assert sorted(jobs) == ["team-a-h100", "team-a-h100-mpi", "team-b-h100", "team-b-h100-mpi"]
    for name, job in jobs.items():
        tenant = next(t for t in dev_spec.tenants if name.startswith(t.name))
        if job["kind"] == "MPIJob":          # its schema is the MPIJob CRD's: the e2e applies it to the real one
            workers = job["spec"]["mpiReplicaSpecs"]["Worker"]
            replicas, template = workers["replicas"], workers["template"]
            launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
            assert "nvidia.com/gpu" not in launcher["resources"]["requests"]
        else:
            replicas, template = job["spec"]["parallelism"], job["spec"]["template"]
            kubernetes_validate.validate(job, dev_spec.kubernetes.version, strict=True)
        c = template["spec"]["containers"][0]
        gpus = replicas * int(c["resources"]["requests"]["nvidia.com/gpu"])
        assert 0 < gpus <= tenant.gpu_quota["h100"].nominal


def test_hugepages_come_off_what_pods_get(dev_data):
    dev_data["node_pools"][0]["tuning"]["hugepages_2mi"] = 8192            # 16 GiB
    pool = parse_spec(yaml.safe_dump(dev_data)).pools["h100"]
    assert pool.allocatable_memory_mib_per_host == 2048 * 1024 - 48866 - 16384 - 100


def test_the_systems_reservation_is_the_kubelets_and_a_spec_may_set_it(dev_data):
    """Without the static CPU manager the kubelet keeps CPU by GKE's tiers too (350m of 112 cores), and
    allocatable cores round down; a site's own memory figure replaces the tiers."""
    dev_data["node_pools"][0]["tuning"].update(kubelet_cpu_manager_static=False, system_reserved_memory_gib=64)
    pool = parse_spec(yaml.safe_dump(dev_data)).pools["h100"]
    assert render_kubelet_config(pool)["systemReserved"] == {"memory": "65536Mi", "cpu": "350m"}
    assert (pool.allocatable_cpu_cores_per_host, pool.allocatable_memory_mib_per_host) == \
        (111, 2048 * 1024 - 65536 - 100)


def test_a_time_sliced_pool_gets_one_replica_per_pod(dev_data):
    """The device plugin's time-slicing (failRequestsGreaterThanOne) refuses a pod more than one replica: the
    template asks for one per pod, one pod per process, and refuses more."""
    dev_data["node_pools"][0]["sharing"] = {"time_slicing_replicas": 4}
    spec = parse_spec(yaml.safe_dump(dev_data))
    job = render_example_jobs(spec)["team-a-h100"]
    [c] = job["spec"]["template"]["spec"]["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu.shared"] == "1" and job["spec"]["parallelism"] == 2
    assert "nvidia.com/gpu" not in c["resources"]["limits"]           # a whole GPU is another resource
    assert "--nproc-per-node=1" in c["command"]
    try:
        render_job(spec, spec.tenants[0], spec.pools["h100"], name="t", gpus_per_pod=4)
    except ValueError as e:
        assert "gives a pod at most one replica; ask for 4 pods of one GPU each" in str(e)
    else:
        raise AssertionError("a 4-replica pod on a time-sliced pool was rendered")


def test_an_mpijob_runs_a_rank_per_gpu_and_forwards_the_pools_nccl_settings(dev_spec):
    """Ranks start through sshd, which does not pass the pod's environment on: mpirun forwards each NCCL setting
    of the pool's ConfigMap; the launcher waits for every worker's sshd and asks for no GPU."""
    from components.fabric.nccl import nccl_envs, pod_env
    from components.k8s.tenancy.jobs import render_mpijob
    team_a, pool = dev_spec.tenants[0], dev_spec.node_pools[0]
    job = render_mpijob(dev_spec, team_a, pool, name="mpi", workers=2, gpus_per_worker=4)
    spec = job["spec"]
    assert spec["slotsPerWorker"] == 4 and spec["launcherCreationPolicy"] == "WaitForWorkersReady"
    assert job["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "default"}
    command = spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"]
    assert command[:3] == ["mpirun", "-np", "8"]
    assert [command[i + 1] for i, w in enumerate(command) if w == "-x"] == sorted(pod_env(nccl_envs(dev_spec)["h100"]))
    worker = spec["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    assert worker["containers"][0]["command"] == ["/usr/sbin/sshd", "-De", "-f", "/home/mpiuser/.sshd_config"]
    assert worker["securityContext"]["runAsUser"] == 1000 and "restartPolicy" not in worker


def test_each_template_selects_the_pool_it_was_written_for(make_spec):
    """A tenant with quota on two pools of other GPU models: Kueue gives a workload the first flavor that fits,
    so a template without the pool's selector ran on the other model with this pool's NCCL settings."""
    from tests.components.k8s.slurm_specs import with_slurm_pool

    def second_pool(d):
        with_slurm_pool(d)
        d["kubernetes"].pop("slurm")                       # a second Kueue pool, not Slurm's
        d["node_pools"][-1]["gpu"] = {"model": "A100-SXM4-80GB", "count": 8}
    spec = make_spec(second_pool)
    jobs = render_example_jobs(spec)
    assert {name for name in jobs if name.startswith("team-a-")} >= {"team-a-h100", "team-a-h100-slurm"}
    for name, job in jobs.items():
        pool = "h100-slurm" if "h100-slurm" in name else "h100"
        templates = ([r["template"] for r in job["spec"]["mpiReplicaSpecs"].values()] if job["kind"] == "MPIJob"
                     else [job["spec"]["template"]])
        assert all(t["spec"]["nodeSelector"] == {POOL_LABEL: pool} for t in templates), name
