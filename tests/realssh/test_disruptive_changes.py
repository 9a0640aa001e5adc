"""Changes that disrupt running work besides kubelet and containerd restarts, over real SSH: a new hugepages
count and fabric settings that bounce links are applied at once where no tenant works, left to the rollout's
step (on the drained node) where one does, and converge when the kernel cannot do them at run time."""

from __future__ import annotations

import yaml

from components.fabric.fabric import fabric_hosts
from components.fabric.host import APPLY, render_fabric_host
from components.nodes import NodePoolArgs
from components.nodes.host_prep import HUGEPAGES_SYSCTL
from components.nodes.node_pool import render_pool_preparation, render_preparation
from components.nodes.rollout import owed_restarts
from components.spec import parse_spec
from components.ssh import as_command, digest
from tests.conftest import _DEV
from tests.cutting import cut_everywhere
from tests.realssh.doubles import STATE_DIR
from components.records import MAINTENANCE, PORT_SEEN
from tests.realssh.test_fabric_scripts import mtu
from tests.realssh.test_interrupted import no_action_owed, ok
from tests.realssh.test_node_scripts import DRAINED, OWED_DIR, TENANTS


def scripts(hostname, mtu_bytes=9000, **tuning):
    """The host's fabric settings (left to its preparation where they bounce links) then its preparation, as
    GpuCluster runs them, and the rollout's step for that preparation."""
    data = yaml.safe_load(yaml.safe_dump(_DEV))
    data["fabric"]["mtu_bytes"] = mtu_bytes
    hosts = data["node_pools"][0]["hosts"]
    hosts.append({**hosts[0], "hostname": "gpu-dev-03", "address": "10.10.0.13"})     # the third test host
    data["node_pools"][0]["tuning"].update(tuning)
    spec = parse_spec(yaml.safe_dump(data))
    pool = spec.node_pools[0]
    host = next(h for h in pool.hosts if h.hostname == hostname)
    args = NodePoolArgs.from_spec(spec, pool)
    _, _, nics, env, storage = next(h for h in fabric_hosts(spec) if h.hostname == hostname)
    prep = render_preparation(args, host, render_fabric_host(spec, hostname, nics, env, storage, in_place=True))
    return prep, render_pool_preparation(args).roll_for_host(host, digest(prep))


def prepare(hosts, host, **change):
    return hosts.ssh(host, as_command(scripts(host.name, **change)[0].create, "root"))


def roll(hosts, host, **change):
    return hosts.roll(host, scripts(host.name, **change)[1].create)


def pages(host):
    return int(host.read(f"{STATE_DIR}/nr_hugepages"))


def test_a_new_hugepages_count_waits_for_a_drained_node_and_restarts_the_kubelet(test_hosts):
    host = test_hosts.hosts["gpu-dev-01"]
    first = prepare(test_hosts, host, hugepages_2mi=1024)         # no tenant yet: reserved at once
    assert first.returncode == 0, first.stderr
    assert "gpu-dev-01: changed: hugepages of 2 MiB: 0 -> 1024" in first.stdout
    assert "gpu-dev-01: changed: restarted kubelet" in first.stdout      # the kubelet offers what it read at start
    assert pages(host) == 1024 and host.read(HUGEPAGES_SYSCTL) == "vm.nr_hugepages = 1024\n"
    with host.hardware(PODS=TENANTS):
        host.clear_calls()
        out = prepare(test_hosts, host, hugepages_2mi=2048)
        assert out.returncode == 0, out.stderr
        assert owed_restarts(out.stdout) == "hugepages", out.stdout
        assert pages(host) == 1024 and "restarted kubelet" not in out.stdout
        assert host.read(HUGEPAGES_SYSCTL) == "vm.nr_hugepages = 2048\n"      # at boot, the new count
        assert not [c for c in host.calls() if c.startswith("sysctl") and "-w" in c.split()]
        again = prepare(test_hosts, host, hugepages_2mi=2048)
        assert again.returncode == 0 and owed_restarts(again.stdout) == "hugepages"
        assert again.stdout.endswith("gpu-dev-01: 0 change(s)\n"), again.stdout
    with host.hardware(PODS=DRAINED):
        out = roll(test_hosts, host, hugepages_2mi=2048)
        assert out.returncode == 0, out.stderr
        assert "gpu-dev-01: changed: hugepages of 2 MiB: 1024 -> 2048" in out.stdout
        assert out.stdout.index("1024 -> 2048") < out.stdout.index("changed: restarted kubelet")
        assert pages(host) == 2048 and not host.exists(f"{OWED_DIR}/restart-hugepages")
        assert not host.exists(f"{OWED_DIR}/restart-kubelet")
        out = prepare(test_hosts, host, hugepages_2mi=2048)
        assert out.returncode == 0 and owed_restarts(out.stdout) == "" and "0 change(s)" in out.stdout


def test_hugepages_the_kernel_cannot_reserve_at_run_time_ask_for_a_reboot_and_converge_after_it(test_hosts):
    host = test_hosts.hosts["gpu-dev-02"]
    assert prepare(test_hosts, host, hugepages_2mi=1024).returncode == 0
    with host.hardware(HUGEPAGES_FREE="100"):                 # fragmented: 100 pages more at most
        out = prepare(test_hosts, host, hugepages_2mi=4096)
    assert out.returncode == 1
    assert ("gpu-dev-02: error: the kernel holds 1124 hugepages of 2 MiB, not 4096 (it releases no page in use "
            "and finds no more in fragmented memory at run time); reboot gpu-dev-02, which reserves them at boot"
            ) in out.stderr
    assert host.exists(f"{OWED_DIR}/restart-hugepages") and host.exists(f"{OWED_DIR}/restart-kubelet")
    host.put(f"{STATE_DIR}/nr_hugepages", "4096")             # the reboot: /etc/sysctl.d reserves them early
    out = prepare(test_hosts, host, hugepages_2mi=4096)
    assert out.returncode == 0, out.stderr
    assert "hugepages of 2 MiB:" not in out.stdout and "gpu-dev-02: changed: restarted kubelet" in out.stdout
    assert not host.exists(f"{OWED_DIR}/restart-hugepages") and not host.exists(f"{OWED_DIR}/restart-kubelet")
    with host.hardware(HUGEPAGES_USED="1000"):                # a spec without hugepages frees what it reserved
        out = prepare(test_hosts, host)
    assert out.returncode == 1 and "the kernel holds 1000 hugepages of 2 MiB, not 0" in out.stderr
    assert not host.exists(HUGEPAGES_SYSCTL) and host.exists(f"{OWED_DIR}/restart-hugepages")
    out = prepare(test_hosts, host)
    assert out.returncode == 0, out.stderr
    assert "gpu-dev-02: changed: hugepages of 2 MiB: 1000 -> 0" in out.stdout and pages(host) == 0


def test_an_mtu_change_bounces_no_link_under_running_work_and_the_rollout_applies_it(test_hosts):
    host = test_hosts.hosts["gpu-dev-03"]
    first = prepare(test_hosts, host)
    assert first.returncode == 0, first.stdout + first.stderr
    assert mtu(test_hosts, host, "ens1f0np0") == 9000 and not host.exists(f"{OWED_DIR}/restart-fabric")
    assert "gpu-dev-03: changed: ens1f0np0: MTU 1500 -> 9000" in first.stdout
    with host.hardware(PODS=TENANTS):
        out = prepare(test_hosts, host, mtu_bytes=4200)
        assert out.returncode == 0, out.stderr
        assert owed_restarts(out.stdout) == "fabric", out.stdout
        assert "due where no tenant works (they bounce links): ens1f0np0: MTU 9000 -> 4200" in out.stdout
        assert mtu(test_hosts, host, "ens1f0np0") == 9000          # the link did not bounce
        assert 'set_mtu "$if" 4200' in host.read(APPLY)               # what a reboot would apply
        again = prepare(test_hosts, host, mtu_bytes=4200)
        assert again.returncode == 0 and owed_restarts(again.stdout) == "fabric"
        assert [line for line in again.stdout.splitlines() if line.endswith(" change(s)")] == \
            ["gpu-dev-03: 0 change(s)"] * 2, again.stdout
    with host.hardware(PODS=DRAINED):
        host.sysfs("/sys/class/infiniband/mlx5_0/ports/1/counters/link_downed").write_text("3\n")   # the bounce
        out = roll(test_hosts, host, mtu_bytes=4200)
        assert out.returncode == 0, out.stderr
        assert "gpu-dev-03: changed: ens1f0np0: MTU 9000 -> 4200" in out.stdout
        # the monitors were fenced while it bounced the link, and judge again from the roll's own baseline
        assert "gpu-dev-03: the health monitors judge this host again" in out.stdout
        assert not host.exists(MAINTENANCE)
        assert host.read(PORT_SEEN).splitlines() == ["mlx5_0/1 3", "mlx5_1/1 0"]
        assert mtu(test_hosts, host, "ens1f0np0") == 4200 and not host.exists(f"{OWED_DIR}/restart-fabric")
        assert "restarted kubelet" not in out.stdout              # nothing else was owed
        out = prepare(test_hosts, host, mtu_bytes=4200)
        assert out.returncode == 0 and owed_restarts(out.stdout) == ""
        assert [line for line in out.stdout.splitlines() if line.endswith(" change(s)")] == \
            ["gpu-dev-03: 0 change(s)"] * 2, out.stdout


def test_the_rollouts_step_owing_hugepages_and_an_mtu_killed_anywhere_converges(test_hosts):
    """A busy host that owes a new hugepages count and a new MTU, drained, then its roll step cut anywhere: the
    next run leaves both applied, the kubelet restarted after the count changed, and nothing owed."""
    host = test_hosts.hosts["gpu-dev-03"]
    old, new = {"mtu_bytes": 4200, "hugepages_2mi": 512}, {"mtu_bytes": 9000, "hugepages_2mi": 1024}

    def owed():
        host.set_hardware()
        ok(prepare(test_hosts, host, **old))
        host.set_hardware(PODS=TENANTS)
        out = prepare(test_hosts, host, **new)
        ok(out)
        assert owed_restarts(out.stdout) == "fabric hugepages", out.stdout
        host.set_hardware(PODS=DRAINED)
        host.clear_calls()

    def converged(k):
        assert mtu(test_hosts, host, "ens1f0np0") == 9000 and pages(host) == 1024, k
        calls = host.calls()
        last = {what: max((i for i, c in enumerate(calls) if c.startswith(prefix)), default=-1)
                for what, prefix in (("pages", "sysctl -q -w vm.nr_hugepages=1024"),
                                     ("kubelet", "systemctl start kubelet"))}
        assert last["kubelet"] > last["pages"], f"step {k}: the kubelet did not restart after the new count"
        no_action_owed(host, k)
        assert not host.exists(MAINTENANCE), f"step {k}: the monitors are still fenced"

    try:
        cut_everywhere(lambda text: test_hosts.roll(host, text),
                       scripts(host.name, **new)[1].create, owed, converged)
    finally:
        host.set_hardware()
