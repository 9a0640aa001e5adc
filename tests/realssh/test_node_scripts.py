"""Host preparation and burn-in, run over real SSH on real sshd test hosts (hardware tools are doubles)."""

from __future__ import annotations

import yaml

from components.nodes.burn_in import parse_result, render_burn_in
from components.nodes.host_prep import KUBELET_DROP_IN, TUNING_UNIT, render_host_prep
from components.spec import parse_spec
from components.ssh import as_command
from tests.conftest import _DEV


def pool_of(**tuning):
    data = yaml.safe_load(yaml.safe_dump(_DEV))
    data["node_pools"][0]["tuning"].update(tuning)
    spec = parse_spec(yaml.safe_dump(data))
    return spec.node_pools[0], spec.fabric.rdma


def prepare(hosts, host, user="root", **tuning):
    pool, rdma = pool_of(**tuning)
    spec_host = next(h for h in pool.hosts if h.hostname == host.name) if host.name != "gpu-dev-03" else \
        pool.hosts[0].model_copy(update={"hostname": "gpu-dev-03"})
    return hosts.ssh(host, as_command(render_host_prep(pool, spec_host, rdma=rdma).create, user))


def mutating(calls):
    """Double calls that change something (queries excluded)."""
    return [c for c in calls if c.split()[:2] not in (["systemctl", "is-enabled"], ["systemctl", "is-active"])
            and not c.startswith("nvidia-smi --query") and not c.startswith("nv-fabricmanager --version")]


def test_preparation_succeeds_then_changes_nothing(test_hosts):
    host = test_hosts.hosts["gpu-dev-01"]
    first = prepare(test_hosts, host)
    assert first.returncode == 0, first.stderr
    assert "gpu-dev-01: 8 x NVIDIA-H100-80GB-HBM3 present" in first.stdout
    assert "gpu-dev-01: changed: enabled nvidia-persistenced" in first.stdout
    assert "gpu-dev-01: changed: remounted /dev/shm with 512G (was 1G)" in first.stdout
    assert "gpu-dev-01: changed: restarted kubelet" in first.stdout
    kubelet = yaml.safe_load(host.read(KUBELET_DROP_IN))
    assert kubelet["registerWithTaints"][0]["key"] == "gpucluster.io/burn-in"
    assert kubelet["cpuManagerPolicy"] == "static"
    assert host.read("/etc/default/kubelet") == 'KUBELET_EXTRA_ARGS="--config-dir=/etc/kubernetes/kubelet.conf.d"\n'
    assert "tmpfs /dev/shm tmpfs defaults,size=512G 0 0 # gpucluster /dev/shm" in host.read("/etc/fstab")
    assert host.exists(TUNING_UNIT) and host.exists("/usr/local/sbin/gpucluster-node-tuning")
    assert "LimitMEMLOCK=infinity" in host.read("/etc/systemd/system/containerd.service.d/50-gpucluster-memlock.conf")
    for cpu in range(4):        # written in sysfs: Ubuntu's cpupower wrapper fails without linux-tools
        assert host.sysfs(f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor").read_text() == "performance\n"
    host.clear_calls()
    second = prepare(test_hosts, host)
    assert second.returncode == 0, second.stderr
    assert "changed:" not in second.stdout and second.stdout.endswith("gpu-dev-01: 0 change(s)\n")
    assert mutating(host.calls()) == []


def test_a_changed_spec_changes_only_what_it_should(test_hosts):
    host = test_hosts.hosts["gpu-dev-02"]
    assert prepare(test_hosts, host).returncode == 0
    host.clear_calls()
    out = prepare(test_hosts, host, gpu_power_limit_w=600)
    assert out.returncode == 0, out.stderr
    changes = [line for line in out.stdout.splitlines() if ": changed: " in line]
    assert changes == ["gpu-dev-02: changed: wrote /usr/local/sbin/gpucluster-node-tuning",
                       "gpu-dev-02: changed: applied GPU clocks, power cap and governor"]
    assert "nvidia-smi -pl 600" in host.read("/usr/local/sbin/gpucluster-node-tuning")
    calls = host.calls()
    assert "systemctl restart gpucluster-node-tuning.service" in calls and "nvidia-smi -pl 600" in calls


def test_a_missing_tool_fails_naming_host_and_tool(test_hosts):
    host = test_hosts.hosts["gpu-dev-03"]
    with host.without("nvidia-smi"):
        out = prepare(test_hosts, host)
    assert out.returncode == 1
    assert out.stderr.strip() == "gpu-dev-03: error: nvidia-smi is missing (the NVIDIA driver is not installed or not on PATH)"
    assert not host.exists(KUBELET_DROP_IN)            # nothing was changed before the check


def test_missing_gpus_fail_with_what_is_missing(test_hosts):
    host = test_hosts.hosts["gpu-dev-03"]
    with host.hardware(GPU_COUNT="7"):
        out = prepare(test_hosts, host)
    assert out.returncode == 1
    assert "gpu-dev-03: error: found 7 GPUs, the pool expects 8 (H100-SXM5-80GB)" in out.stderr


def test_ecc_errors_and_a_mismatched_fabric_manager_fail(test_hosts):
    host = test_hosts.hosts["gpu-dev-03"]
    with host.hardware(ECC="2"):
        out = prepare(test_hosts, host)
    assert out.returncode == 1 and "GPU 0 has 2 uncorrected ECC errors" in out.stderr
    with host.hardware(FM_VERSION="550.54.14"):
        out = prepare(test_hosts, host)
    assert out.returncode == 1
    assert "nvidia-fabricmanager is 550.54.14 but the driver is 550.54.15" in out.stderr


def test_undo_removes_what_preparation_wrote(test_hosts):
    host = test_hosts.hosts["gpu-dev-02"]
    pool, rdma = pool_of()
    assert prepare(test_hosts, host).returncode == 0
    out = test_hosts.ssh(host, as_command(render_host_prep(pool, pool.hosts[1], rdma=rdma).delete, "root"))
    assert out.returncode == 0, out.stderr
    assert not host.exists(KUBELET_DROP_IN) and not host.exists(TUNING_UNIT)
    assert "gpu-dev-02: changed: removed /etc/kubernetes/kubelet.conf.d/50-gpucluster.conf" in out.stdout


def burn_in(hosts, host):
    pool, _ = pool_of()
    return hosts.ssh(host, as_command(render_burn_in(pool, pool.hosts[0]).create, "root"))


def test_burn_in_passes_on_a_healthy_node(test_hosts):
    """451 GB/s at 8 GiB passes the 360 GB/s floor, though the average over all sizes (113) would not."""
    host = test_hosts.hosts["gpu-dev-01"]
    out = burn_in(test_hosts, host)
    assert out.returncode == 0, out.stderr
    assert parse_result(out.stdout) == (True, "passed")
    assert "dcgmi diag -r 2" in host.calls() and "all_reduce_perf -b 8 -e 8G -f 2 -g 8" in host.calls()


def test_burn_in_reports_why_a_node_fails(test_hosts):
    host = test_hosts.hosts["gpu-dev-01"]
    with host.hardware(BUSBW="120.5", DCGM="fail"):
        out = burn_in(test_hosts, host)
    assert out.returncode == 0, out.stderr
    passed, why = parse_result(out.stdout)
    assert not passed
    assert "dcgmi diag -r 2 failed: Memory | Fail - GPU 3 row remap pending" in why
    assert "NCCL all_reduce bus bandwidth 120.5 GB/s at 8 GiB is below 360.0 GB/s" in why


def test_burn_in_without_dcgm_cannot_run(test_hosts):
    host = test_hosts.hosts["gpu-dev-03"]
    with host.without("dcgmi"):
        out = burn_in(test_hosts, host)
    assert out.returncode == 1 and "dcgmi is missing" in out.stderr


def test_a_wrong_pinned_host_key_is_refused(test_hosts):
    host = test_hosts.hosts["gpu-dev-01"]
    other = test_hosts.hosts["gpu-dev-02"].host_key
    out = test_hosts.ssh(host, "true", host_key=other)
    assert out.returncode == 255 and "Host key verification failed" in out.stderr
