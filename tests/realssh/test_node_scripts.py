"""Host preparation and burn-in, run over real SSH on real sshd test hosts (hardware tools are doubles)."""

from __future__ import annotations

import pytest
import yaml

from components.nodes import NodePoolArgs
from components.nodes.burn_in import parse_result, render_burn_in
from components.nodes.host_prep import CPU_MANAGER_STATE, KUBELET_DROP_IN, PERSISTENCE_OVERRIDE, TUNING_UNIT
from components.nodes.node_pool import render_pool_preparation, render_preparation
from components.nodes.retire import LEFT_FILE, POOL_FILE, render_retirement
from components.nodes.rollout import owed_restarts, roll_failure
from components.spec import parse_spec
from components.ssh import as_command, digest
from tests.conftest import _DEV
from tests.realssh.doubles import STATE_DIR


def spec_of(software=None, **tuning):
    data = yaml.safe_load(yaml.safe_dump(_DEV))
    data["node_pools"][0]["tuning"].update(tuning)
    if software:
        data["node_pools"][0]["software"] = software
    return parse_spec(yaml.safe_dump(data))


def pool_host(name, software=None, **tuning):
    """The dev pool's args and host `name` (gpu-dev-03 stands in for a third dev host)."""
    spec = spec_of(software, **tuning)
    pool = spec.node_pools[0]
    host = next((h for h in pool.hosts if h.hostname == name), None) or \
        pool.hosts[0].model_copy(update={"hostname": name})
    return NodePoolArgs.from_spec(spec, pool), host


def preparation(name, software=None, **tuning):
    return render_preparation(*pool_host(name, software, **tuning))


def undo_part(name, **tuning):
    """The preparation's undo itself, without the guard the whole delete runs first (a cut lands inside it)."""
    args, host = pool_host(name, **tuning)
    return render_pool_preparation(args).for_host(host).delete


def roll_script(name, **tuning):
    """The rollout's step on host `name` after its drain, for the preparation with `tuning`."""
    args, host = pool_host(name, **tuning)
    return render_pool_preparation(args).roll_for_host(host, digest(render_preparation(args, host)))


def prepare(hosts, host, user="root", **tuning):
    return hosts.ssh(host, as_command(preparation(host.name, **tuning).create, user))


def mutating(calls):
    """Double calls that change something (queries excluded)."""
    return [c for c in calls if c.split()[:2] not in (["systemctl", "is-enabled"], ["systemctl", "is-active"],
                                                      ["systemctl", "show"])
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


def test_a_driver_other_than_the_pools_fails_before_anything_changes(test_hosts):
    host = test_hosts.hosts["gpu-dev-03"]
    script = preparation(host.name, software={"driver_version": "570.124.06"})
    host.clear_calls()
    out = test_hosts.ssh(host, as_command(script.create, "root"))
    assert out.returncode == 1
    assert ("gpu-dev-03: error: the NVIDIA driver is 550.54.15 but the pool runs 570.124.06 "
            "(software.driver_version); install 570.124.06, set software.package_repositories to have it installed, "
            "or change the spec") in out.stderr
    assert mutating(host.calls()) == []
    # The right driver passes on to the next check (a power limit the GPUs refuse stops it before any change).
    same = preparation(host.name, software={"driver_version": "550.54.15"}, gpu_power_limit_w=150)
    out = test_hosts.ssh(host, as_command(same.create, "root"))
    assert out.returncode == 1 and "the NVIDIA driver is" not in out.stderr
    assert "power limit 150 W is outside GPU 0's range 200.00-700.00 W" in out.stderr
    assert mutating(host.calls()) == []


def undo(hosts, host):
    return hosts.ssh(host, as_command(preparation(host.name).delete, "root"))


STATIC_STATE = '{"policyName":"static","defaultCpuSet":"2-111","checksum":1}\n'


def test_undo_removes_what_preparation_wrote_and_restarts_kubelet_clean(test_hosts):
    """Without the drop-in kubelet runs the none policy: the static policy's state file would stop it."""
    host = test_hosts.hosts["gpu-dev-02"]
    assert prepare(test_hosts, host).returncode == 0
    host.put(CPU_MANAGER_STATE, STATIC_STATE)
    out = undo(test_hosts, host)
    assert out.returncode == 0, out.stderr
    assert not host.exists(KUBELET_DROP_IN) and not host.exists(TUNING_UNIT) and not host.exists(CPU_MANAGER_STATE)
    assert "gpu-dev-02: changed: removed /etc/kubernetes/kubelet.conf.d/50-gpucluster.conf" in out.stdout
    assert "gpu-dev-02: changed: removed the CPU manager state of policy static (kubelet now runs none)" in out.stdout
    assert "gpu-dev-02: changed: restarted kubelet" in out.stdout


def roll(hosts, host, **tuning):
    return hosts.roll(host, roll_script(host.name, **tuning).create)


OWED_DIR = "/var/lib/gpucluster/owed"      # the prelude's (components/bash.py)
TENANTS = "kube-system/kube-proxy-7x gpu-operator/dcgm-exporter-2 team-a/train-0 team-b/eval-1"
DRAINED = "kube-system/kube-proxy-7x gpu-operator/dcgm-exporter-2"


def test_a_busy_node_takes_what_keeps_work_running_and_owes_the_restart_to_the_rollout(test_hosts):
    host = test_hosts.hosts["gpu-dev-01"]
    assert prepare(test_hosts, host).returncode == 0
    new = {"kubelet_cpu_manager_static": False, "shm_size_gib": 256}
    with host.hardware(PODS=TENANTS):
        out = prepare(test_hosts, host, **new)
        assert out.returncode == 0, out.stderr
        assert "gpu-dev-01: rollout owed: kubelet\n" in out.stdout and owed_restarts(out.stdout) == "kubelet"
        assert ("2 tenant pod(s) run here (team-a/train-0 team-b/eval-1): kubelet left to the pool's "
                "rollout, which drains the node first") in out.stdout
        assert "restarted kubelet" not in out.stdout and "CPU manager state" not in out.stdout
        assert "size=256G" in host.read("/etc/fstab")          # what does not stop work is done now
        assert "cpuManagerPolicy" not in yaml.safe_load(host.read(KUBELET_DROP_IN))     # kubelet's default: none
        assert host.exists(f"{OWED_DIR}/restart-kubelet")
        again = prepare(test_hosts, host, **new)          # still owed, still not restarted, nothing else to do
        assert again.returncode == 0 and owed_restarts(again.stdout) == "kubelet"
        assert again.stdout.endswith("gpu-dev-01: 0 change(s)\n"), again.stdout
        out = undo(test_hosts, host)          # undoing is refused outright: it has no rollout behind it
        assert out.returncode == 1 and "restarting kubelet without the gpucluster settings would disrupt 2" in out.stderr
        assert host.exists(KUBELET_DROP_IN)
        out = roll(test_hosts, host, **new)       # a drain that left tenants' pods: the roll stops untouched
        assert out.returncode == 0, out.stderr     # its failure is the uncordon's to judge, from this line
        assert roll_failure(out.stdout).startswith(
            "2 tenant pod(s) still run here after the drain (team-a/train-0 team-b/eval-1)"), out.stdout
        assert "changed:" not in out.stdout and host.exists(f"{OWED_DIR}/restart-kubelet")
    host.put(CPU_MANAGER_STATE, STATIC_STATE)
    with host.hardware(PODS=DRAINED):
        out = roll(test_hosts, host, **new)
        assert out.returncode == 0, out.stderr
        assert "gpu-dev-01: changed: removed the CPU manager state of policy static (kubelet now runs none)" in out.stdout
        assert "gpu-dev-01: changed: restarted kubelet" in out.stdout and "dcgmi diag -r 1 passed" in out.stdout
        assert not host.exists(f"{OWED_DIR}/restart-kubelet") and not host.exists(CPU_MANAGER_STATE)
        again = roll(test_hosts, host, **new)
        assert again.returncode == 0 and "no restart is owed here: nothing to roll" in again.stdout
        assert again.stdout.endswith("gpu-dev-01: 0 change(s)\n")
        out = prepare(test_hosts, host, **new)            # the next preparation finds nothing owed
        assert out.returncode == 0 and owed_restarts(out.stdout) == "" and "0 change(s)" in out.stdout


@pytest.mark.parametrize("drained", ["deferred", "failed"])
def test_a_roll_whose_drain_did_not_take_the_node_out_leaves_what_is_owed_for_the_next_apply(test_hosts, drained):
    host = test_hosts.hosts["gpu-dev-01"]
    assert prepare(test_hosts, host).returncode == 0
    new = {"kubelet_cpu_manager_static": False}
    with host.hardware(PODS=TENANTS):
        assert owed_restarts(prepare(test_hosts, host, **new).stdout) == "kubelet"
        host.clear_calls()
        out = test_hosts.roll(host, roll_script(host.name, **new).create, drained=drained)
        assert out.returncode == 0 and roll_failure(out.stdout) == "", out.stderr
        assert f"gpu-dev-01: not drained ({drained}): what is owed here waits for a later pulumi up" in out.stdout
        assert host.exists(f"{OWED_DIR}/restart-kubelet") and mutating(host.calls()) == []
    with host.hardware(PODS=DRAINED):       # the next apply drained it: the roll pays what is owed
        out = roll(test_hosts, host, **new)
        assert out.returncode == 0 and "changed: restarted kubelet" in out.stdout, out.stderr
        assert not host.exists(f"{OWED_DIR}/restart-kubelet")


def test_a_roll_that_fails_outside_its_own_checks_says_so_for_the_uncordon(test_hosts):
    """A command failing under `set -e` (no message of the script's own) is still a `roll failed:` line."""
    host = test_hosts.hosts["gpu-dev-02"]
    assert prepare(test_hosts, host).returncode == 0
    new = {"kubelet_cpu_manager_static": False}
    with host.hardware(PODS=TENANTS):
        assert owed_restarts(prepare(test_hosts, host, **new).stdout) == "kubelet"
    with host.hardware(PODS=DRAINED):
        script = roll_script(host.name, **new).create
        assert "\n  paid restart-kubelet\n" in script
        out = test_hosts.roll(host, script.replace("\n  paid restart-kubelet\n", "\n  false\n", 1))
        assert out.returncode == 0, out.stderr
        assert roll_failure(out.stdout).startswith("a command failed (exit 1)"), out.stdout


def test_a_busy_node_owes_a_containerd_restart_too(test_hosts):
    """RDMA's memlock drop-in takes effect when containerd restarts, which stops every container."""
    host = test_hosts.hosts["gpu-dev-02"]
    host.sh(f"touch {STATE_DIR}/active/containerd")
    assert prepare(test_hosts, host).returncode == 0
    host.sh("rm -f /etc/systemd/system/containerd.service.d/50-gpucluster-memlock.conf")
    with host.hardware(PODS=TENANTS):
        out = prepare(test_hosts, host)
        assert out.returncode == 0, out.stderr
        assert owed_restarts(out.stdout) == "containerd" and "restarted containerd" not in out.stdout, out.stdout
    with host.hardware(PODS=DRAINED):
        out = roll(test_hosts, host)
        assert out.returncode == 0, out.stderr
        assert "gpu-dev-02: changed: restarted containerd" in out.stdout
        assert not host.exists(f"{OWED_DIR}/restart-containerd")


def test_cpu_manager_state_is_reset_only_when_its_recorded_policy_differs(test_hosts):
    """Compared with the policy the state file records: a drop-in lost to a replacement or a hand edit does not
    make the same policy look new."""
    host = test_hosts.hosts["gpu-dev-02"]
    assert prepare(test_hosts, host).returncode == 0
    host.put(CPU_MANAGER_STATE, STATIC_STATE)
    host.sh(f"rm -f {KUBELET_DROP_IN}")
    out = prepare(test_hosts, host)
    assert out.returncode == 0, out.stderr
    assert "restarted kubelet" in out.stdout and "CPU manager state" not in out.stdout
    assert host.read(CPU_MANAGER_STATE) == STATIC_STATE
    out = prepare(test_hosts, host, kubelet_cpu_manager_static=False)
    assert out.returncode == 0, out.stderr
    assert "gpu-dev-02: changed: removed the CPU manager state of policy static (kubelet now runs none)" in out.stdout
    assert not host.exists(CPU_MANAGER_STATE)


def test_a_static_persistenced_unit_is_made_to_keep_persistence_on(test_hosts):
    """Ubuntu's packaged unit is static and runs --no-persistence-mode: enabling it changes nothing."""
    host = test_hosts.hosts["gpu-dev-03"]
    host.put(f"{STATE_DIR}/units/nvidia-persistenced.service", "[Service]\nType=forking\nExecStart="
               "/usr/bin/nvidia-persistenced --user nvidia-persistenced --no-persistence-mode --verbose\n")
    host.put(f"{STATE_DIR}/static/nvidia-persistenced", "")
    out = prepare(test_hosts, host)
    assert out.returncode == 0, out.stderr
    assert "gpu-dev-03: changed: multi-user.target starts the static nvidia-persistenced unit at boot" in out.stdout
    assert "gpu-dev-03: persistence mode is on for every GPU" in out.stdout
    assert "--no-persistence-mode" not in host.read(PERSISTENCE_OVERRIDE)
    host.sh("test -L /etc/systemd/system/multi-user.target.wants/nvidia-persistenced.service")
    again = prepare(test_hosts, host)
    assert again.returncode == 0 and again.stdout.endswith("gpu-dev-03: 0 change(s)\n"), again.stdout
    host.put(PERSISTENCE_OVERRIDE, "[Service]\n")          # a hand edit: the packaged command line is back
    out = prepare(test_hosts, host)
    assert out.returncode == 0, out.stderr
    assert "restarted nvidia-persistenced in persistence mode" in out.stdout


def test_gpudirect_loads_nvidia_peermem_now_and_at_boot(test_hosts):
    host = test_hosts.hosts["gpu-dev-01"]
    host.sh("rm -rf /sys/module/nvidia_peermem")        # as after a reboot that did not load it
    out = prepare(test_hosts, host)
    assert out.returncode == 0, out.stderr
    assert "gpu-dev-01: changed: loaded nvidia-peermem" in out.stdout and "modprobe nvidia-peermem" in host.calls()
    assert host.read("/etc/modules-load.d/gpucluster-nvidia-peermem.conf") == "nvidia-peermem\n"


def burn_in(hosts, host):
    pool = spec_of().node_pools[0]
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


def test_a_burn_in_runs_again_only_where_no_tenant_works(test_hosts):
    """A changed burn-in runs as an update on every host; a node with tenants' pods keeps its last passing
    verdict untouched (no DCGM or NCCL next to their jobs), an idle or quarantined node is burned in again."""
    host = test_hosts.hosts["gpu-dev-02"]
    host.sh("rm -f /var/lib/gpucluster/burn-in")
    assert parse_result(burn_in(test_hosts, host).stdout) == (True, "passed")
    host.clear_calls()
    with host.hardware(PODS="team-a/train-0 kube-system/dcgm-exporter"):
        busy = burn_in(test_hosts, host)
    assert busy.returncode == 0, busy.stderr
    assert parse_result(busy.stdout) == (True, "passed")
    assert "not burned in again: 1 tenant pod(s) run here (team-a/train-0); the verdict of" in busy.stdout
    assert not any(c.startswith(("dcgmi", "all_reduce_perf")) for c in host.calls())
    with host.hardware(PODS="kube-system/dcgm-exporter"):     # only node agents: idle, so it runs
        assert "dcgmi diag -r 2" in (burn_in(test_hosts, host), host.calls())[1]
    with host.hardware(DCGM="fail"):
        assert not parse_result(burn_in(test_hosts, host).stdout)[0]
    host.clear_calls()
    with host.hardware(PODS="team-a/train-0"):                # quarantined: no tenant should be there, rerun
        again = burn_in(test_hosts, host)
    assert parse_result(again.stdout) == (True, "passed") and "dcgmi diag -r 2" in host.calls()


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


def test_fabric_settings_and_preparation_share_one_session_and_converge(test_hosts):
    """As GpuCluster runs them: the host's fabric script, then its preparation, in one SSH session; each part
    keeps its own change count, and a second run changes nothing in either."""
    from components.fabric.fabric import fabric_hosts
    from components.fabric.host import render_fabric_host
    host = test_hosts.hosts["gpu-dev-02"]
    spec = spec_of()
    pool = spec.node_pools[0]
    hostname, _, nics, env, storage = next(h for h in fabric_hosts(spec) if h.hostname == host.name)
    script = render_preparation(NodePoolArgs.from_spec(spec, pool), pool.hosts[1],
                                render_fabric_host(spec, hostname, nics, env, storage))
    first = test_hosts.ssh(host, as_command(script.create, "root"))
    assert first.returncode == 0, first.stdout + first.stderr
    counts = [line for line in first.stdout.splitlines() if line.endswith(" change(s)")]
    assert len(counts) == 2 and all(not c.endswith(": 0 change(s)") for c in counts), first.stdout
    assert first.stdout.index("ens1f0np0") < first.stdout.index("restarted kubelet")     # fabric first
    second = test_hosts.ssh(host, as_command(script.create, "root"))
    assert second.returncode == 0, second.stderr
    assert [line for line in second.stdout.splitlines() if line.endswith(" change(s)")] == \
        [f"{host.name}: 0 change(s)"] * 2, second.stdout


def test_the_driver_stack_is_held_at_its_installed_version(test_hosts, tmp_path):
    """Real dpkg and apt-mark on the host: an installed Fabric Manager package is held once (an unattended
    upgrade would move it apart from the driver on every node at once); other packages are left alone."""
    from tests.realssh.test_storage_scripts import _deb
    (tmp_path / "repo").mkdir()
    _deb(tmp_path, "nvidia-fabricmanager-550", {"/usr/local/share/gpucluster-test/fm": ""})
    _deb(tmp_path, "nvidia-container-toolkit", {"/usr/local/share/gpucluster-test/ctk": ""})
    host = test_hosts.hosts["gpu-dev-03"]
    for name in ("nvidia-fabricmanager-550", "nvidia-container-toolkit"):     # installed into the host's overlay
        host.sh(f"dpkg -i {tmp_path / 'repo' / name}.deb >/dev/null")
    first = prepare(test_hosts, host)
    assert first.returncode == 0, first.stderr
    assert ("changed: held nvidia-fabricmanager-550 at its installed version (apt-mark unhold "
            "nvidia-fabricmanager-550 to upgrade it on purpose)") in first.stdout
    assert "held nvidia-container-toolkit" not in first.stdout
    second = prepare(test_hosts, host)
    assert second.returncode == 0 and "held " not in second.stdout, second.stdout
    host.sh("apt-mark showhold | grep -qx nvidia-fabricmanager-550")


def test_on_el_the_kubelet_flag_goes_to_the_file_its_unit_reads(test_hosts):
    """kubeadm's EL packages read KUBELET_EXTRA_ARGS from /etc/sysconfig/kubelet: the flag written to
    /etc/default/kubelet there would never reach kubelet (and a second run would restart it again)."""
    host = test_hosts.hosts["gpu-dev-03"]
    with host.hardware(KUBELET_ENV_FILES="/etc/sysconfig/kubelet (ignore_errors=yes)"):
        first = prepare(test_hosts, host)
        assert first.returncode == 0, first.stderr
        assert "changed: kubelet reads /etc/kubernetes/kubelet.conf.d (/etc/sysconfig/kubelet)" in first.stdout
        assert host.read("/etc/sysconfig/kubelet") == \
            'KUBELET_EXTRA_ARGS="--config-dir=/etc/kubernetes/kubelet.conf.d"\n'
        second = prepare(test_hosts, host)
    assert second.returncode == 0 and "restarted kubelet" not in second.stdout, second.stdout


def membership(name):
    args, host = pool_host(name)
    return render_retirement(args.pool, host, args.system_namespaces).membership


def kubelet_state(host):
    return (host.exists(f"{STATE_DIR}/enabled/kubelet"), host.exists(f"{STATE_DIR}/active/kubelet"))


def test_a_host_leaves_the_cluster_only_once_no_tenant_works_there_and_can_join_again(test_hosts):
    host = test_hosts.hosts["gpu-dev-02"]
    scripts = membership(host.name)
    join = test_hosts.ssh(host, as_command(scripts.create, "root"))
    assert join.returncode == 0 and host.read(POOL_FILE) == "h100\n", join.stderr
    assert test_hosts.ssh(host, as_command(scripts.create, "root")).stdout.endswith("gpu-dev-02: 0 change(s)\n")
    assert prepare(test_hosts, host).returncode == 0
    with host.hardware(PODS=TENANTS):
        out = test_hosts.ssh(host, as_command(scripts.delete, "root"))
        assert out.returncode == 1
        assert ("stopping kubelet to retire the host would disrupt 2 running pod(s): team-a/train-0 team-b/eval-1"
                in out.stderr)
        assert kubelet_state(host) == (True, True) and not host.exists(LEFT_FILE)
    with host.hardware(PODS=DRAINED):
        host.clear_calls()
        out = test_hosts.ssh(host, as_command(scripts.delete, "root"))
        assert out.returncode == 0, out.stderr
        assert "gpu-dev-02: changed: stopped and disabled kubelet: the host no longer registers a Node" in out.stdout
        assert "gpu-dev-02: changed: removed 2 pod(s) of node agents the kubelet left" in out.stdout
        assert "crictl rmp -f sandbox0 sandbox1" in host.calls()
        assert kubelet_state(host) == (False, False) and host.exists(LEFT_FILE) and not host.exists(POOL_FILE)
        again = test_hosts.ssh(host, as_command(scripts.delete, "root"))
        assert again.returncode == 0 and again.stdout.endswith("gpu-dev-02: 0 change(s)\n"), again.stdout
    # Put back in the spec: kubelet is enabled again, and preparation starts it with its settings.
    join = test_hosts.ssh(host, as_command(scripts.create, "root"))
    assert "gpu-dev-02: changed: enabled kubelet again (a retirement had disabled it)" in join.stdout
    assert kubelet_state(host) == (True, False) and not host.exists(LEFT_FILE)
    assert prepare(test_hosts, host).returncode == 0
    assert kubelet_state(host) == (True, True)


def test_a_host_another_pool_took_over_keeps_its_preparation_fabric_and_kubelet(test_hosts):
    """A host moved from pool h100 to another in one change: the new pool's resources run first, then the old
    pool's are deleted, and those must leave the host as the new pool set it."""
    host = test_hosts.hosts["gpu-dev-01"]
    assert prepare(test_hosts, host).returncode == 0
    host.put(POOL_FILE, "inference\n")          # what the new pool's join wrote
    try:
        for script in (undo, lambda hosts, h: hosts.ssh(h, as_command(membership(h.name).delete, "root"))):
            out = script(test_hosts, host)
            assert out.returncode == 0, out.stderr
            assert "gpu-dev-01: prepared for pool inference now, not h100:" in out.stdout
            assert "changed:" not in out.stdout
        assert host.exists(KUBELET_DROP_IN) and kubelet_state(host) == (True, True)
    finally:
        host.sh(f"rm -f {POOL_FILE}")

