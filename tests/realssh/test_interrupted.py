"""Interrupted applies (issue 28): a generated script killed (SIGKILL of its shell) at many points while moving a
host from one spec to the next converges on the next run, judged by the files and by what is running: each
daemon's loaded configuration (the systemctl double records what it read at its last start) is what is on disk,
and no action is left owed."""

from __future__ import annotations

import pytest
import yaml

from components.spec import parse_spec
from components.storage import scripts as storage_scripts
from components.storage.layout import plan_layout
from components.storage.scripts import render_beegfs_client
from tests.conftest import _DEV
from tests.cutting import cut_everywhere
from tests.realssh.doubles import STATE_DIR
from components.nodes.rollout import owed_restarts
from components.nodes.retire import LEFT_FILE, POOL_FILE
from tests.realssh.test_node_scripts import (DRAINED, TENANTS, kubelet_state, membership, preparation,
                                           roll_script, undo_part)
from tests.realssh.test_storage_scripts import (SECRET, beegfs_server, host, loop, lustre_client,  # noqa: F401
                                                rdma_client_module, run)


def ok(out) -> None:
    assert out.returncode == 0, (out.stdout, out.stderr)


def no_action_owed(host, k) -> None:
    owed = host.upper("/var/lib/gpucluster/owed")
    assert not owed.exists() or not any(owed.iterdir()), (k, sorted(p.name for p in owed.iterdir()))


def each_cut(hosts, host, old, new, check, stdin=None, replaced=False):
    """`new` cut at every risky step while moving from `old`, then run again; `check(k)` judges the host and no
    action may stay owed. `replaced`: the command is replaced, as Pulumi replaces it (old delete, then new
    create): the old delete is cut too, and run again before the new create."""
    def creating(text):
        return run(hosts, host, text, stdin=stdin)

    def deleting(text):
        return run(hosts, host, text)

    def from_old():
        ok(creating(old.create))
        if replaced:
            ok(deleting(old.delete))

    def judged(k):
        check(k)
        no_action_owed(host, k)
    cut_everywhere(creating, new.create, from_old, judged)
    if replaced:
        def recreated(k):
            ok(deleting(old.delete))
            ok(creating(new.create))
            judged(k)
        cut_everywhere(deleting, old.delete, lambda: ok(creating(old.create)), recreated, spread=3)


def loaded_matches_disk(host, unit: str, files: str) -> bool:
    loaded = host.read(f"{STATE_DIR}/loaded/{unit}").split()[0]
    host.sh(f"cat {files} 2>/dev/null | md5sum | cut -d' ' -f1 > {STATE_DIR}/disk-md5")
    return host.read(f"{STATE_DIR}/disk-md5").strip() == loaded


A = {"kubelet_topology_policy": "restricted"}
B = {"kubelet_topology_policy": "best-effort", "gpu_power_limit_w": 600}


def test_host_preparation_killed_anywhere_converges_on_the_next_run(test_hosts):
    """Both ways between two specs that change the kubelet drop-in (a kubelet restart) and the power cap (the
    tuning unit's restart); every cut around a change, then a full run."""
    host = test_hosts.hosts["gpu-dev-03"]
    prep_a, prep_b = preparation(host.name, **A), preparation(host.name, **B)
    each_cut(test_hosts, host, prep_a, prep_b, lambda k: prepared_as_on_disk(host, k, power_cap=True))
    each_cut(test_hosts, host, prep_b, prep_a, lambda k: prepared_as_on_disk(host, k, power_cap=False))


def test_the_rollouts_step_killed_anywhere_converges_on_the_next_run(test_hosts):
    """A busy host whose kubelet restart preparation left owed, drained, then its roll step cut anywhere."""
    host = test_hosts.hosts["gpu-dev-03"]

    def owed():
        host.set_hardware()
        ok(run(test_hosts, host, preparation(host.name, **A).create))
        host.set_hardware(PODS=TENANTS)
        out = run(test_hosts, host, preparation(host.name, **B).create)
        ok(out)
        assert owed_restarts(out.stdout) == "kubelet", out.stdout
        host.set_hardware(PODS=DRAINED)

    try:
        cut_everywhere(lambda text: test_hosts.roll(host, text), roll_script(host.name, **B).create, owed,
                       lambda k: (prepared_as_on_disk(host, k, power_cap=True), no_action_owed(host, k)))
    finally:
        host.set_hardware()


def prepared_as_on_disk(host, k, power_cap: bool) -> None:
    assert host.exists(f"{STATE_DIR}/active/kubelet"), f"step {k}: kubelet left stopped"
    assert loaded_matches_disk(host, "kubelet",
                               "/etc/kubernetes/kubelet.conf.d/* /etc/default/kubelet /etc/sysconfig/kubelet"), \
        f"step {k}: kubelet runs an older configuration than the one on disk"
    if power_cap:
        assert loaded_matches_disk(host, "gpucluster-node-tuning",
                                   "/etc/systemd/system/gpucluster-node-tuning.service "
                                   "/usr/local/sbin/gpucluster-node-tuning"), \
            f"step {k}: the power cap on disk was never applied"


def test_host_preparation_destroyed_with_a_cut_then_created_again_converges(test_hosts):
    """The other path Pulumi takes: the host's preparation destroyed (its delete cut and run again, as the
    engine retries a failed delete), then created again."""
    host = test_hosts.hosts["gpu-dev-03"]
    prep = preparation(host.name, **B)
    undo = undo_part(host.name, **B)

    def recreated(k):
        ok(run(test_hosts, host, prep.delete))
        assert not host.exists("/etc/systemd/system/gpucluster-node-tuning.service"), f"step {k}: delete left files"
        ok(run(test_hosts, host, prep.create))
        prepared_as_on_disk(host, k, power_cap=True)
        no_action_owed(host, k)
    cut_everywhere(lambda text: run(test_hosts, host, text), undo,
                   lambda: ok(run(test_hosts, host, prep.create)), recreated, spread=4)


def test_a_host_leaving_the_cluster_killed_anywhere_converges_on_the_next_run(test_hosts):
    """`-leave`'s delete (kubelet stopped and disabled, the node agents' pods removed) cut at every risky step
    and run again, as the engine retries a failed delete; then the host joins again and is prepared."""
    host = test_hosts.hosts["gpu-dev-03"]
    scripts = membership(host.name)

    def joined():
        host.set_hardware(PODS=DRAINED)          # node agents' pods only, none removed yet
        ok(run(test_hosts, host, scripts.create))
        ok(run(test_hosts, host, preparation(host.name).create))
        assert kubelet_state(host) == (True, True)

    def left(k):
        assert kubelet_state(host) == (False, False), f"step {k}: kubelet still enabled or running"
        assert host.exists(LEFT_FILE) and not host.exists(POOL_FILE), f"step {k}"
        assert host.read(f"{STATE_DIR}/removed-pods").split() == DRAINED.split(), f"step {k}: agents' pods left"
    try:
        cut_everywhere(lambda text: run(test_hosts, host, text), scripts.delete, joined, left, spread=4)
    finally:
        host.set_hardware()
    joined()


# --- storage: LNet imports and BeeGFS restarts ------------------------------------------------------------

def test_a_lustre_client_killed_anywhere_runs_lnet_on_the_files_interface(test_hosts, host):
    """The client's interface moves (an import owed by the new /etc/lnet.conf), both ways, in place and as
    Pulumi replaces the command (its delete only unmounts: LNet is left to the new create)."""
    clients = {iface: lustre_client(host, interface=iface) for iface in ("eth0", "eth1")}

    def lnet_runs(iface):
        def check(k):
            assert host.read(f"{STATE_DIR}/lnet-nis").split("\n")[:-1] == [f"tcp {iface}"], \
                f"step {k}: LNet runs {host.read(f'{STATE_DIR}/lnet-nis')!r}, the file says tcp {iface}"
            assert host.exists(f"{STATE_DIR}/mounts/_mnt_gpufs"), f"step {k}: not mounted"
        return check
    for old, new, replaced in (("eth0", "eth1", False), ("eth1", "eth0", True)):
        each_cut(test_hosts, host, clients[old], clients[new], lnet_runs(new), replaced=replaced)
    run(test_hosts, host, clients["eth0"].delete)


def beegfs_client(host, address: str, quotas: bool):
    """The dev stack's BeeGFS 7.4 client; `address` moves the management host (its server's data address)."""
    data = yaml.safe_load(yaml.safe_dump(_DEV))
    data["storage"]["servers"][0]["data_address"] = address
    data["storage"]["quotas"] = quotas
    spec = parse_spec(yaml.safe_dump(data))
    return render_beegfs_client(spec, plan_layout(spec), host.name, "eth0")


@pytest.fixture
def no_settle(monkeypatch):
    """The daemons' doubles never stop after their start: nothing to wait for (the settle check has its own test)."""
    monkeypatch.setattr(storage_scripts, "BEEGFS_SETTLE_S", 0)


@pytest.fixture
def beegfs_client_host(host, no_settle):
    """The client's packages as doubles: its setup tools, conf files as packaged, and a unit that mounts."""
    for tool in ("beegfs-setup-client", "beegfs-helperd", "beegfs-ctl"):
        host.put(f"/usr/local/bin/{tool}", "#!/bin/sh\n")
        host.sh(f"chmod +x /usr/local/bin/{tool}")
    host.sh("mkdir -p /etc/beegfs && touch /etc/beegfs/beegfs-client.conf /etc/beegfs/beegfs-helperd.conf")
    host.put("/etc/systemd/system/beegfs-client.service",
             f"[Service]\nExecStart=/usr/bin/touch {STATE_DIR}/mounts/_mnt_devfs\n")
    host.sh(f"mkdir -p {STATE_DIR}/mounts")
    rdma_client_module(host)
    return host


def daemons_run_what_is_on_disk(host, units, k) -> None:
    for unit in units:
        assert host.exists(f"{STATE_DIR}/active/{unit}"), f"step {k}: {unit} left stopped"
        assert loaded_matches_disk(host, unit, DAEMON_READS[unit]), \
            f"step {k}: {unit} runs an older configuration than the one on disk"


DAEMON_READS = {
    "beegfs-client": "/etc/beegfs/beegfs-client.conf /etc/beegfs/beegfs-mounts.conf "
                     "/etc/beegfs/beegfs-client-autobuild.conf /etc/beegfs/conn.auth /etc/beegfs/gpucluster-interfaces",
    "beegfs-helperd": "/etc/beegfs/beegfs-helperd.conf /etc/beegfs/conn.auth",
    **{f"beegfs-{r}": f"/etc/beegfs/beegfs-{r}.conf /etc/beegfs/conn.auth /etc/beegfs/gpucluster-interfaces"
       for r in ("mgmtd", "meta", "storage")}}


def test_a_new_management_host_alone_restarts_the_beegfs_client(test_hosts, beegfs_client_host):
    host = beegfs_client_host
    a, b = beegfs_client(host, "10.10.1.31", True), beegfs_client(host, "10.10.1.32", True)
    assert run(test_hosts, host, a.create, stdin=SECRET).returncode == 0
    moved = run(test_hosts, host, b.create, stdin=SECRET)
    assert moved.returncode == 0, moved.stderr
    assert f"{host.name}: changed: restarted beegfs-client" in moved.stdout
    daemons_run_what_is_on_disk(host, ["beegfs-client"], "-")


def test_a_beegfs_client_killed_anywhere_runs_its_configuration(test_hosts, beegfs_client_host):
    """The management host and quotas change (the client's conf); both ways, in place and replaced."""
    host = beegfs_client_host
    a, b = beegfs_client(host, "10.10.1.31", True), beegfs_client(host, "10.10.1.32", False)

    def check(k):
        daemons_run_what_is_on_disk(host, ["beegfs-client", "beegfs-helperd"], k)
    each_cut(test_hosts, host, a, b, check, stdin=SECRET)
    each_cut(test_hosts, host, b, a, check, stdin=SECRET, replaced=True)
    run(test_hosts, host, a.delete)


def test_a_beegfs_server_killed_anywhere_runs_its_configuration(test_hosts, host, loop, no_settle):
    """Quotas and the server interface change (every daemon's restart is owed); in place, as Pulumi updates a
    server whose targets stay."""
    devices = [loop(), loop(), loop()]
    host.sh(f"touch {STATE_DIR}/lustre-modules; mkdir -p /opt/beegfs/lib; touch /opt/beegfs/lib/libbeegfs_ib.so")
    a = beegfs_server(host, devices, quotas=False, interface="eth0")
    b = beegfs_server(host, devices, quotas=True, interface="eth1")
    units = ["beegfs-mgmtd", "beegfs-meta", "beegfs-storage"]
    each_cut(test_hosts, host, a, b, lambda k: daemons_run_what_is_on_disk(host, units, k))
    each_cut(test_hosts, host, b, a, lambda k: daemons_run_what_is_on_disk(host, units, k))
    run(test_hosts, host, a.delete)
