"""The driver stack as desired state, with real apt and dpkg on real SSH test hosts: a flat repository (file://,
as a site mirror serves it) of real packages named and versioned as NVIDIA's repository names them, whose
dependencies are `>=` as NVIDIA's meta packages' are. The doubles stand for the kernel: `modprobe nvidia` loads the
version the installed driver package carries, `nvidia-smi` and `nv-fabricmanager` report what is loaded and
installed, and a marker makes the GPUs busy so the modules cannot unload."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Iterable

import pytest

from components.nodes.driver import APT_LIST, APT_PIN
from components.nodes.node_pool import render_pool_preparation, render_preparation
from components.nodes.rollout import owed_restarts, roll_failure
from components.ssh import as_command, digest
from tests.realssh.doubles import STATE_DIR
from tests.realssh.test_node_scripts import pool_host
from tests.realssh.test_storage_scripts import _deb

OLD, NEW, NEWEST = "550.54.15", "550.127.05", "550.163.01"
DOCA = "2.9.5"


def driver_repo(tmp: Path, drivers: Iterable[str], docas: Iterable[str]) -> Path:
    """A flat apt repository in `tmp`/repo with NVIDIA's package names for each driver version (the branch is
    its first number) and DOCA-OFED's for each DOCA version (as 2.9.5-0.1.8 is named)."""
    (tmp / "repo").mkdir(parents=True)
    drivers = list(drivers)
    for v in drivers:
        branch, deb = v.split(".")[0], f"{v}-0ubuntu1"
        oldest = min((d for d in drivers if d.split(".")[0] == branch), key=lambda d: [int(x) for x in d.split(".")])
        _deb(tmp, f"libnvidia-compute-{branch}", {"/opt/nvidia-test/compute-version": f"{v}\n"}, deb)
        _deb(tmp, f"nvidia-open-{branch}", {"/opt/nvidia-test/driver-version": f"{v}\n"}, deb,
             depends=f"libnvidia-compute-{branch} (>= {oldest})")
        _deb(tmp, f"nvidia-fabricmanager-{branch}", {"/opt/nvidia-test/fm-version": f"{v}\n"}, f"{v}-1")
    for v in docas:
        _deb(tmp, "doca-ofed", {"/opt/nvidia-test/doca-version": f"{v}\n"}, v)
    index = subprocess.run(["dpkg-scanpackages", "--multiversion", "."], cwd=tmp / "repo", check=True,
                           capture_output=True, text=True).stdout
    (tmp / "repo" / "Packages").write_text(index)
    return tmp / "repo"


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """NVIDIA's names for branch 550 at three versions (the newest would win without the pin), and DOCA-OFED."""
    return driver_repo(tmp_path_factory.mktemp("driver-repo"), (OLD, NEW, NEWEST), ("2.9.5-0.1.8", "2.10.0-0.5.3"))


def software(repo, driver, doca=DOCA):
    return {"driver_version": driver, "doca_ofed_version": doca,
            "package_repositories": [{"os_family": "debian", "url": f"file://{repo}"}]}


def prepared(test_hosts, host, repo, driver, **more):
    args, h = pool_host(host.name, software(repo, driver, **more))
    return test_hosts.ssh(host, as_command(render_preparation(args, h).create, "root"))


def rolled(test_hosts, host, repo, driver):
    args, h = pool_host(host.name, software(repo, driver))
    return test_hosts.roll(host, render_pool_preparation(args).roll_for_host(h, digest(render_preparation(args, h))).create)


def installed(host):
    return {name: host.read(f"/opt/nvidia-test/{name}-version").strip() for name in ("driver", "compute", "fm", "doca")}


@pytest.fixture
def apt_host(test_hosts):
    def make(name, pods=""):
        host = test_hosts.hosts[name]
        host.put("/etc/apt/apt.conf.d/99sandbox", 'APT::Sandbox::User "root";\n')   # _apt cannot write the overlay
        host.set_hardware(DRIVER=OLD, FM_VERSION=OLD, PODS=pods)
        host.sh(f"mkdir -p /sys/module/nvidia && echo {OLD} > /sys/module/nvidia/version")    # the old one runs
        return host
    return make


def test_a_host_gets_the_specs_versions_pinned_and_loaded_then_nothing_changes(test_hosts, repo, apt_host):
    host = apt_host("gpu-dev-01")
    first = prepared(test_hosts, host, repo, NEW)
    assert first.returncode == 0, first.stderr
    assert (f"gpu-dev-01: changed: installed nvidia-open-550={NEW}-0ubuntu1 nvidia-fabricmanager-550={NEW}-1 "
            "doca-ofed=2.9.5-0.1.8") in first.stdout
    # the pin: the dependency (>= the oldest) comes at the driver's version, not the newest there is
    assert installed(host) == {"driver": NEW, "compute": NEW, "fm": NEW, "doca": "2.9.5-0.1.8"}
    assert f"gpu-dev-01: changed: loaded the driver stack (driver {NEW})" in first.stdout
    assert host.sysfs("/sys/module/nvidia/version").read_text().strip() == NEW      # what nvidia-smi reports now
    assert "modprobe -r nvidia" in host.calls()           # the old driver unloaded first
    assert host.read(APT_LIST).strip() == f"deb [trusted=yes] file://{repo} ./"
    assert "Pin: version /^([0-9]+:)?550\\.127\\.05-/" in host.read(APT_PIN)
    host.sh("apt-mark showhold | grep -qx nvidia-open-550 && apt-mark showhold | grep -qx doca-ofed "
            "&& apt-mark showhold | grep -qx libnvidia-compute-550")
    second = prepared(test_hosts, host, repo, NEW)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip().endswith(": 0 change(s)"), second.stdout


def test_a_busy_host_leaves_the_upgrade_to_the_rollout_which_installs_it_drained(test_hosts, repo, apt_host):
    host = apt_host("gpu-dev-02")
    assert prepared(test_hosts, host, repo, NEW).returncode == 0
    host.set_hardware(PODS="team-a/train-0")
    busy = prepared(test_hosts, host, repo, NEWEST)
    assert busy.returncode == 0, busy.stderr
    assert "left to the pool's rollout" in busy.stdout and owed_restarts(busy.stdout) == "driver"
    assert "changed: installed " not in busy.stdout and installed(host)["driver"] == NEW      # nothing moved under the job
    host.set_hardware(PODS="gpu-operator/nvidia-device-plugin-daemonset-x2k4f")     # drained: the agents stay
    host.clear_calls()
    roll = rolled(test_hosts, host, repo, NEWEST)
    assert roll.returncode == 0, roll.stderr
    assert installed(host) == {"driver": NEWEST, "compute": NEWEST, "fm": NEWEST, "doca": "2.9.5-0.1.8"}
    assert f"gpu-dev-02: changed: loaded the driver stack (driver {NEWEST})" in roll.stdout
    calls = host.calls()
    # the node agents' pods and the services holding the GPUs stop before the modules reload, and start after
    assert "modprobe -r nvidia_peermem nvidia_uvm nvidia" in calls
    assert calls.index("systemctl stop kubelet") < calls.index("crictl stopp sandbox0") \
        < calls.index("modprobe -r nvidia_peermem nvidia_uvm nvidia") < calls.index("modprobe nvidia") \
        < calls.index("modprobe nvidia_peermem") < calls.index("systemctl start kubelet")
    assert "dcgmi diag -r 1 passed" in roll.stdout
    again = prepared(test_hosts, host, repo, NEWEST)
    assert again.returncode == 0 and again.stdout.strip().endswith(": 0 change(s)"), again.stdout
    assert owed_restarts(again.stdout) == ""


def test_gpus_held_outside_kubernetes_stop_the_roll_asking_for_a_reboot_then_it_goes_on(test_hosts, repo, apt_host):
    host = apt_host("gpu-dev-03", pods="team-a/train-0")
    assert prepared(test_hosts, host, repo, NEW).returncode == 0          # busy: owed, nothing installed
    host.set_hardware(PODS="")
    host.sh(f"touch {STATE_DIR}/gpus-held {STATE_DIR}/active/nvidia-persistenced {STATE_DIR}/active/nvidia-dcgm")
    host.clear_calls()
    try:
        stuck = rolled(test_hosts, host, repo, NEW)
    finally:
        host.sh(f"rm -f {STATE_DIR}/gpus-held")
    assert stuck.returncode == 0 and "reboot gpu-dev-03" in roll_failure(stuck.stdout), stuck.stdout
    calls = host.calls()      # started again in reverse: kubelet last, after the services its pods need
    assert calls.index("systemctl start nvidia-persistenced") < calls.index("systemctl start nvidia-dcgm") \
        < calls.index("systemctl start kubelet")
    assert ("the driver stack is installed, but 550.54.15 stays loaded (modprobe: FATAL: Module nvidia is in "
            "use.): something outside Kubernetes holds the GPUs; reboot gpu-dev-03") in stuck.stderr
    assert host.exists(f"{STATE_DIR}/active/kubelet")      # what it stopped runs again
    retried = rolled(test_hosts, host, repo, NEW)           # pulumi up again (after the reboot)
    assert retried.returncode == 0, retried.stderr
    assert "changed: installed " not in retried.stdout and "loaded the driver stack" in retried.stdout


def test_a_version_the_mirror_lacks_stops_before_anything_is_installed(test_hosts, repo, apt_host):
    host = apt_host("gpu-dev-03")
    out = prepared(test_hosts, host, repo, "550.999.01")
    assert out.returncode == 1
    assert ("error: the NVIDIA driver 550.999.01 is in none of the repositories (software.package_repositories) as "
            "any of nvidia-open-550 nvidia-driver-550-server-open nvidia-driver-550-open nvidia-open; mirror that "
            "version there, or change the spec's version") in out.stderr


def test_a_spec_that_stops_installing_removes_its_repositories_and_pin(test_hosts, repo, apt_host):
    host = apt_host("gpu-dev-01")
    assert prepared(test_hosts, host, repo, NEW).returncode == 0
    args, h = pool_host(host.name, {"driver_version": NEW})          # checked only, from now on
    out = test_hosts.ssh(host, as_command(render_preparation(args, h).create, "root"))
    assert out.returncode == 0, out.stderr
    assert f"changed: removed {APT_PIN}" in out.stdout and not host.exists(APT_PIN) and not host.exists(APT_LIST)
    assert installed(host)["driver"] == NEW                          # what is installed stays, held
