"""WEKA and Storage Scale clients over real SSH: the generated scripts run on a real test host, with doubles only
for the vendors' binaries (site_storage.py), which record what they were called with; the calls are checked
against the vendors' documented syntax:

- `mount -t wekafs -o <options> <backend>[,<backend>...]/<fs> <dir>`, options `num_cores=N` or `core=ID` per
  core and `net=<netdev>` or `net=udp` (docs.weka.io, "Mount filesystems"; here through an fstab line, which
  `mount <dir>` reads as those three fields); `weka fs quota set <path> --hard <size>` ("Manage quotas");
- `mmaddnode -N NodeDesc`, `mmchlicense client --accept -N Node`, `mmstartup -N Node`, `mmmount Device -N Node`,
  `mmumount Device -N Node`, `mmshutdown -N Node`, `mmdelnode -N Node`, `mmcrfileset Device Fileset
  --inode-space new`, `mmlinkfileset Device Fileset -J JunctionPath`, `mmsetquota Device:Fileset --block
  Soft:Hard`, `mmchconfig Attribute=value[,...] -N Node` (IBM Storage Scale command reference, synopses).
"""

from __future__ import annotations

import re
import shlex

import pytest
import yaml

from components.nodes import NodePoolArgs
from components.nodes.node_pool import render_pool_preparation, render_preparation
from components.nodes.rollout import roll_failure
from components.spec import parse_spec
from components.ssh import as_command
from components.storage import clients, packages
from components.storage.clients import render_scale_member, render_scale_node, render_weka_client
from components.storage.layout import plan_layout
from components.storage.scripts import render_directories
from tests.components.storage.client_specs import SCALE, WEKA, with_storage
from tests.realssh.doubles import STATE_DIR
from tests.realssh.site_storage import KERNEL, SCALE_ROOT, WEKA_INSTALLER, scale_installed
from tests.realssh.storage_host import storage_host
from tests.realssh.test_interrupted import each_cut, ok
from tests.realssh.test_node_scripts import DRAINED
from tests.realssh.test_storage_scripts import run

MIRROR = "/srv/weka-mirror/install"
PASSWORD = "W3KA-API-PASSWORD-never-printed"


@pytest.fixture(scope="module")
def host(test_hosts):
    return storage_host(test_hosts.hosts["gpu-dev-03"])


@pytest.fixture
def scale_root(monkeypatch):
    monkeypatch.setattr(packages, "SCALE_ROOT", SCALE_ROOT)


def weka_spec(**settings):
    data = with_storage({**WEKA, "mount_point": "/srv/weka"}, install_url=f"file://{MIRROR}", **settings)
    return parse_spec(yaml.safe_dump(data))


def scale_spec(kernels=(KERNEL,), **settings):
    data = with_storage({**SCALE, "mount_point": "/srv/gpfs0"}, supported_kernels=list(kernels), **settings)
    return parse_spec(yaml.safe_dump(data))


def weka_client(host, **settings):
    spec = weka_spec(**settings)
    return render_weka_client(spec, plan_layout(spec), host.name, "eth0")


def fresh_weka(host):
    host.sh(f"rm -f /usr/local/bin/weka /etc/systemd/system/weka-agent.service {STATE_DIR}/weka-stopped "
            f"{STATE_DIR}/mounts/_srv_weka {STATE_DIR}/active/weka-agent")
    host.sh("sed -i '/ # gpucluster$/d' /etc/fstab")
    host.put(MIRROR, WEKA_INSTALLER)


def fstab_entry(host, mount):
    lines = [line for line in host.read("/etc/fstab").splitlines() if f" {mount} " in line]
    assert len(lines) == 1, lines
    return lines[0].split()


def test_a_weka_client_installs_the_agent_from_the_mirror_and_mounts_once(test_hosts, host):
    fresh_weka(host)
    client = weka_client(host)
    host.clear_calls()
    first = run(test_hosts, host, client.create)
    ok(first)
    assert "installer" in host.calls() and "mount /srv/weka" in host.calls()
    source, mount, fstype, options = fstab_entry(host, "/srv/weka")[:4]
    # what `mount /srv/weka` hands mount.wekafs: SOURCE DIR -t TYPE -o OPTIONS, as WEKA documents them
    assert re.fullmatch(r"[0-9.]+(,[0-9.]+)*/wfs", source) and (mount, fstype) == ("/srv/weka", "wekafs")
    assert options.split(",")[:3] == ["core=1", "net=eth0", "sync_on_close"]
    assert "x-systemd.requires=weka-agent.service" in options.split(",")
    host.clear_calls()
    again = run(test_hosts, host, client.create)
    assert again.stdout.strip().endswith(": 0 change(s)"), again.stdout
    assert "installer" not in host.calls() and not any(c.startswith("mount ") for c in host.calls())
    ok(run(test_hosts, host, client.delete))
    assert " /srv/weka " not in host.read("/etc/fstab") and not host.exists(f"{STATE_DIR}/mounts/_srv_weka")
    assert host.exists("/usr/local/bin/weka")          # the agent stays


def test_a_weka_mount_over_a_stopped_client_container_fails_naming_it(test_hosts, host):
    fresh_weka(host)
    client = weka_client(host)
    ok(run(test_hosts, host, client.create))
    host.sh(f"touch {STATE_DIR}/weka-stopped")
    host.sh(f"printf '#!/bin/sh\\nexit 0\\n' > /usr/local/bin/sleep && chmod +x /usr/local/bin/sleep")
    try:
        out = run(test_hosts, host, client.create)
    finally:
        host.sh(f"rm -f {STATE_DIR}/weka-stopped /usr/local/bin/sleep")
    assert out.returncode == 1
    assert "/srv/weka is mounted but the WEKA client container client is Stopped (weka local ps)" in out.stderr
    ok(run(test_hosts, host, client.delete))


def test_weka_quotas_log_in_with_the_password_from_standard_input_only(test_hosts, host):
    spec = weka_spec()
    script = render_directories(spec, plan_layout(spec), host.name).create
    assert PASSWORD not in script
    host.sh(f"mkdir -p {STATE_DIR}/mounts && touch {STATE_DIR}/mounts/_srv_weka && rm -f /etc/gpucluster/wekafs-wfs-dirs")
    host.put(f"{STATE_DIR}/weka-password", PASSWORD)
    host.clear_calls()
    first = run(test_hosts, host, script, stdin=PASSWORD)
    ok(first)
    assert "weka fs quota set /srv/weka/tenants/team-b --hard 2048GiB" in host.calls()
    assert "quota-as gpucluster" in host.calls()
    assert PASSWORD not in first.stdout + first.stderr + "\n".join(host.calls())
    assert host.upper("/srv/weka/tenants/team-b").stat().st_gid == plan_layout(spec).project_ids["team-b"]
    host.sh("rm /etc/gpucluster/wekafs-wfs-dirs")
    wrong = run(test_hosts, host, script, stdin="not-the-password")
    assert wrong.returncode == 1 and "Authentication failed" in wrong.stderr
    ok(run(test_hosts, host, script, stdin=PASSWORD))
    host.clear_calls()
    assert run(test_hosts, host, script, stdin=PASSWORD).stdout.strip().endswith(": 0 change(s)")
    host.sh(f"rm -rf /srv/weka {STATE_DIR}/mounts/_srv_weka")


def test_a_scale_node_on_a_kernel_its_release_does_not_support_stops_before_any_change(test_hosts, host,
                                                                                     scale_root):
    scale_installed(host)
    spec = scale_spec(kernels=("1.2.3-*",))
    host.clear_calls()
    out = run(test_hosts, host, render_scale_node(spec, plan_layout(spec), spec.node_pools[0], host.name).create)
    assert out.returncode == 1
    assert (f"kernel {KERNEL} is not one Storage Scale 5.2 supports here (storage.scale.supported_kernels: "
            "1.2.3-*)") in out.stderr, out.stderr
    assert host.calls() == []


def test_a_scale_node_builds_its_portability_layer_once_per_kernel(test_hosts, host, scale_root):
    scale_installed(host)
    host.sh(f"rm -f {STATE_DIR}/scale-modules-*")
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIIjPvsb1auu+FHfwP0boHL4g7PTUuBh+Kb48FXfnr632"
    spec = scale_spec(admin_public_key=key)
    node = render_scale_node(spec, plan_layout(spec), spec.node_pools[0], host.name).create
    host.clear_calls()
    ok(run(test_hosts, host, node))
    assert "mmbuildgpl " in host.calls()
    assert key in host.read("/root/.ssh/authorized_keys")
    host.clear_calls()
    again = run(test_hosts, host, node)
    assert again.stdout.strip().endswith(": 0 change(s)") and "mmbuildgpl " not in host.calls()
    host.sh(f"rm -f {STATE_DIR}/scale-modules-{KERNEL}")      # a new kernel: no layer built for it yet
    host.clear_calls()
    ok(run(test_hosts, host, node))
    assert "mmbuildgpl " in host.calls()


def member_calls(host):
    return [c for c in host.calls() if c.split()[0] in (
        "mmaddnode", "mmchlicense", "mmstartup", "mmmount", "mmumount", "mmshutdown", "mmdelnode", "mmchconfig")]


def test_a_scale_node_joins_and_leaves_through_the_admin_node(test_hosts, host, scale_root):
    scale_installed(host)
    host.sh(f"rm -rf {STATE_DIR}/scale")
    spec = scale_spec()
    member = render_scale_member(spec, plan_layout(spec), spec.node_pools[0], host.name)
    n = host.name
    host.clear_calls()
    ok(run(test_hosts, host, member.create))
    assert member_calls(host) == [f"mmaddnode -N {n}", f"mmchlicense client --accept -N {n}",
                                  f"mmchconfig autoBuildGPL=yes -N {n}", f"mmstartup -N {n}", f"mmmount gpfs0 -N {n}"]
    host.clear_calls()
    again = run(test_hosts, host, member.create)
    assert again.stdout.strip().endswith(": 0 change(s)") and member_calls(host) == []
    host.sh(f"touch {STATE_DIR}/scale/busy")
    busy = run(test_hosts, host, member.delete)
    host.sh(f"rm -f {STATE_DIR}/scale/busy")
    assert busy.returncode == 1 and "gpfs0 is busy on" in busy.stderr
    assert host.exists(f"{STATE_DIR}/scale/nodes/{n}")       # still a node: nothing half-removed
    host.clear_calls()
    ok(run(test_hosts, host, member.delete))
    assert member_calls(host) == [f"mmumount gpfs0 -N {n}", f"mmshutdown -N {n}", f"mmdelnode -N {n}"]
    assert not host.exists(f"{STATE_DIR}/scale/nodes/{n}")
    assert not host.exists(f"/etc/gpucluster/scale-gpfs0-autobuild/{n}")       # a new join sets it again


def test_scale_gds_settings_are_set_once_and_left_to_the_next_start_on_a_running_node(test_hosts, host,
                                                                                     scale_root):
    scale_installed(host)
    host.sh(f"rm -rf {STATE_DIR}/scale /etc/gpucluster/scale-gpfs0-gds")
    plain, gds = scale_spec(), scale_spec(gds=True)
    pool = plain.node_pools[0]
    ok(run(test_hosts, host, render_scale_member(plain, plan_layout(plain), pool, host.name).create))
    host.clear_calls()
    out = run(test_hosts, host, render_scale_member(gds, plan_layout(gds), pool, host.name).create)
    ok(out)
    assert member_calls(host) == [f"mmchconfig verbsRdma=enable,verbsGPUDirectStorage=yes,"
                                  f"verbsPorts=mlx5_0/1 mlx5_1/1 -N {host.name}"]
    assert "the GDS settings apply at its next start" in out.stdout
    host.clear_calls()
    ok(run(test_hosts, host, render_scale_member(plain, plan_layout(plain), pool, host.name).create))
    assert member_calls(host) == [f"mmchconfig verbsRdma=DEFAULT,verbsGPUDirectStorage=DEFAULT,verbsPorts=DEFAULT "
                                  f"-N {host.name}"]
    ok(run(test_hosts, host, render_scale_member(gds, plan_layout(gds), pool, host.name).delete))


def test_tenants_get_linked_filesets_with_block_quotas_on_scale(test_hosts, host, scale_root):
    scale_installed(host)
    host.sh(f"rm -rf {STATE_DIR}/scale /srv/gpfs0 /etc/gpucluster/scale-gpfs0-dirs")
    host.sh(f"mkdir -p {STATE_DIR}/mounts /srv/gpfs0 && touch {STATE_DIR}/mounts/_srv_gpfs0")
    spec = scale_spec()
    script = render_directories(spec, plan_layout(spec), host.name).create
    host.clear_calls()
    ok(run(test_hosts, host, script))
    calls = [c for c in host.calls() if c.startswith(("mmcrfileset", "mmlinkfileset", "mmsetquota"))]
    assert calls == ["mmcrfileset gpfs0 team-b --inode-space new",
                     "mmlinkfileset gpfs0 team-b -J /srv/gpfs0/tenants/team-b",
                     "mmsetquota gpfs0:team-b --block 2048G:2048G"]
    assert host.upper("/srv/gpfs0/tenants/team-b").stat().st_gid == plan_layout(spec).project_ids["team-b"]
    assert oct(host.upper("/srv/gpfs0/tenants/team-b").stat().st_mode & 0o7777) == "0o2770"
    host.clear_calls()
    assert run(test_hosts, host, script).stdout.strip().endswith(": 0 change(s)")
    # a fileset cut off before its link is linked on the next run; a plain directory in its place is not taken
    host.sh(f"rm -rf {STATE_DIR}/scale/junctions/* /srv/gpfs0/tenants/team-b /etc/gpucluster/scale-gpfs0-dirs")
    host.sh("mkdir -p /srv/gpfs0/tenants/team-b")
    taken = run(test_hosts, host, script)
    assert taken.returncode == 1
    assert "/srv/gpfs0/tenants/team-b exists but is not the junction of fileset team-b" in taken.stderr
    host.sh("rmdir /srv/gpfs0/tenants/team-b")
    ok(run(test_hosts, host, script))
    host.sh(f"rm -rf /srv/gpfs0 {STATE_DIR}/mounts/_srv_gpfs0")


# --- killed anywhere --------------------------------------------------------------------------------------

def test_a_weka_client_killed_anywhere_converges_on_the_next_run(test_hosts, host):
    """From no client, and from one cache mode to another (Pulumi replaces the command: unmount, then mount)."""
    a, b = weka_client(host), weka_client(host, cache_mode="readcache")

    def mounted_as(client):
        def check(k):
            options = fstab_entry(host, "/srv/weka")[3]
            assert options == re.search(r"wekafs (\S+)", client.create).group(1), (k, options)
            assert host.exists(f"{STATE_DIR}/mounts/_srv_weka"), f"step {k}: not mounted"
        return check
    fresh_weka(host)
    uninstalled = type(a)(a.delete.replace("\nfinish\n", "\nrm -f /usr/local/bin/weka\nfinish\n"))
    each_cut(test_hosts, host, uninstalled, a, mounted_as(a))
    each_cut(test_hosts, host, a, b, mounted_as(b), replaced=True)
    ok(run(test_hosts, host, b.delete))


def test_a_scale_node_joining_killed_anywhere_converges_on_the_next_run(test_hosts, host, scale_root):
    """The node's own step from nothing built, then its join from no member and from plain to GDS settings (in
    place: the member command converges)."""
    scale_installed(host)
    spec, gds = scale_spec(), scale_spec(gds=True)
    node = render_scale_node(spec, plan_layout(spec), spec.node_pools[0], host.name)
    pool = spec.node_pools[0]
    plain_member = render_scale_member(spec, plan_layout(spec), pool, host.name)
    gds_member = render_scale_member(gds, plan_layout(gds), pool, host.name)

    def layer_built(k):
        assert host.exists(f"{STATE_DIR}/scale-modules-{KERNEL}"), f"step {k}"

    def nothing_built():
        host.sh(f"rm -f {STATE_DIR}/scale-modules-*")
    cleared = type(node)("#!/usr/bin/env bash\nset -euo pipefail\n" + f"rm -f {STATE_DIR}/scale-modules-*\n")
    each_cut(test_hosts, host, cleared, node, layer_built)

    def joined(with_gds):
        def check(k):
            assert host.read(f"{STATE_DIR}/scale/nodes/{host.name}").strip() == "active", f"step {k}"
            assert host.exists(f"{STATE_DIR}/scale/mounts/gpfs0/{host.name}"), f"step {k}: not mounted"
            assert host.exists(f"/etc/gpucluster/scale-gpfs0-gds/{host.name}") == with_gds, f"step {k}"
        return check
    host.sh(f"rm -rf {STATE_DIR}/scale /etc/gpucluster/scale-gpfs0-gds")
    leave = type(plain_member)(plain_member.delete, None)
    each_cut(test_hosts, host, leave, plain_member, joined(False))
    each_cut(test_hosts, host, plain_member, gds_member, joined(True))
    each_cut(test_hosts, host, gds_member, plain_member, joined(False))
    ok(run(test_hosts, host, gds_member.delete))
    nothing_built()



# --- GPUDirect Storage's cufile.json ----------------------------------------------------------------------

CUFILE_FOUND = '{\n  // the GDS package\'s own file, comments and all\n  "logging": {"level": "ERROR"}\n}\n'
RAIL_ADDRESSES = {"ens1f0np0": "10.40.0.13", "ens2f0np0": "10.41.0.13"}


@pytest.fixture
def addressed(host):
    """The host's data-plane interfaces with their IPv4 addresses, as the site gives them (and the GDS package's
    own cufile.json in place); afterwards as they were."""
    for dev, addr in RAIL_ADDRESSES.items():
        host.sh(f"ip addr flush dev {dev} && ip addr add {addr}/24 dev {dev}")
    host.sh(f"rm -f {clients.CUFILE_RECORD} {clients.CUFILE_KEPT}*")
    host.put(clients.CUFILE, CUFILE_FOUND)
    host.sh("mkdir -p /sys/module/nvidia_fs")       # the test host's own /sys: nvidia-fs loaded with its driver
    yield RAIL_ADDRESSES
    host.sh("rmdir /sys/module/nvidia_fs")
    for dev in RAIL_ADDRESSES:
        host.sh(f"ip addr flush dev {dev}")
    host.sh(f"rm -f {clients.CUFILE} {clients.CUFILE_RECORD} {clients.CUFILE_KEPT}*")


def dated_copies(host):
    """Files kept aside after the first (a cufile.json edited since this library wrote it)."""
    kept = host.upper(clients.CUFILE_KEPT)
    return sorted(kept.parent.glob(kept.name + ".*"))


def cufile_addresses(host):
    import json
    return json.loads(host.read(clients.CUFILE))["properties"]["rdma_dev_addr_list"]


def test_a_scale_gds_node_lists_its_verbs_ports_addresses_in_cufile_and_gives_the_old_file_back_when_off(
        test_hosts, host, scale_root, addressed):
    scale_installed(host)
    gds, plain = scale_spec(gds=True), scale_spec()
    pool = gds.node_pools[0]
    node = render_scale_node(gds, plan_layout(gds), pool, host.name).create
    ok(run(test_hosts, host, node))
    # rail order, as verbsPorts names the devices (mlx5_0/1 mlx5_1/1 are ens1f0np0 and ens2f0np0)
    assert clients.scale_verbs_ports(pool) == "mlx5_0/1 mlx5_1/1"
    assert cufile_addresses(host) == ["10.40.0.13", "10.41.0.13"]
    assert host.read(clients.CUFILE_KEPT) == CUFILE_FOUND           # the package's file, kept
    again = run(test_hosts, host, node)
    assert again.stdout.strip().endswith(": 0 change(s)"), again.stdout
    host.sh("ip addr flush dev ens2f0np0 && ip addr add 10.41.0.99/24 dev ens2f0np0")   # the site renumbers
    ok(run(test_hosts, host, node))
    assert cufile_addresses(host) == ["10.40.0.13", "10.41.0.99"]
    assert not dated_copies(host) and host.read(clients.CUFILE_KEPT) == CUFILE_FOUND
    off = run(test_hosts, host, render_scale_node(plain, plan_layout(plain), pool, host.name).create)
    ok(off)
    assert host.read(clients.CUFILE) == CUFILE_FOUND and not host.exists(clients.CUFILE_RECORD)
    assert "GPUDirect Storage is off" in off.stdout


def test_a_cufile_edited_by_hand_is_kept_aside_and_never_overwritten_unseen(test_hosts, host, scale_root,
                                                                            addressed):
    scale_installed(host)
    gds, plain = scale_spec(gds=True), scale_spec()
    pool = gds.node_pools[0]
    ok(run(test_hosts, host, render_scale_node(gds, plan_layout(gds), pool, host.name).create))
    host.put(clients.CUFILE, '{"properties": {"rdma_dev_addr_list": ["10.40.0.13"], "use_poll_mode": true}}\n')
    out = run(test_hosts, host, render_scale_node(gds, plan_layout(gds), pool, host.name).create)
    ok(out)
    kept = dated_copies(host)
    assert len(kept) == 1 and "use_poll_mode" in kept[0].read_text(), out.stdout
    host.put(clients.CUFILE, '{"properties": {"use_poll_mode": true}}\n')       # edited again, then GDS off
    off = run(test_hosts, host, render_scale_node(plain, plan_layout(plain), pool, host.name).create)
    ok(off)
    assert "use_poll_mode" in host.read(clients.CUFILE) and "edited since" in off.stdout


def test_gds_through_an_interface_without_an_address_fails_naming_it(test_hosts, host, scale_root, addressed):
    scale_installed(host)
    host.sh("ip addr flush dev ens2f0np0")
    gds = scale_spec(gds=True)
    out = run(test_hosts, host, render_scale_node(gds, plan_layout(gds), gds.node_pools[0], host.name).create)
    assert out.returncode == 1
    assert ("GPUDirect Storage (storage.scale.gds) lists each RDMA interface's IPv4 address in /etc/cufile.json, "
            "and ens2f0np0 has none") in out.stderr, out.stderr
    assert host.read(clients.CUFILE) == CUFILE_FOUND                 # nothing changed


def test_a_weka_gds_client_lists_its_interfaces_address(test_hosts, host, addressed):
    fresh_weka(host)
    spec = weka_spec(gds=True, network="dpdk")
    try:
        ok(run(test_hosts, host, render_weka_client(spec, plan_layout(spec), host.name, "ens1f0np0").create))
        assert cufile_addresses(host) == ["10.40.0.13"]
    finally:
        ok(run(test_hosts, host, weka_client(host).delete))


def test_gds_with_the_hosts_driver_and_no_nvidia_fs_stops_before_cufile(test_hosts, host, scale_root, addressed):
    scale_installed(host)
    host.sh("rmdir /sys/module/nvidia_fs && mkdir -p /sys/module/nvidia_fs.off")
    try:
        gds = scale_spec(gds=True)
        out = run(test_hosts, host, render_scale_node(gds, plan_layout(gds), gds.node_pools[0], host.name).create)
    finally:
        host.sh("rmdir /sys/module/nvidia_fs.off && mkdir -p /sys/module/nvidia_fs")
    assert out.returncode == 1
    assert "GPUDirect Storage (storage.scale.gds) needs the nvidia-fs module" in out.stderr, out.stderr
    assert host.read(clients.CUFILE) == CUFILE_FOUND


def test_cufile_killed_anywhere_converges_on_the_next_run(test_hosts, host, scale_root, addressed):
    """The node's step from GDS off to on (the file found there kept aside), and back (that file given back)."""
    scale_installed(host)
    gds, plain = scale_spec(gds=True), scale_spec()
    pool = gds.node_pools[0]
    on = render_scale_node(gds, plan_layout(gds), pool, host.name)
    off = render_scale_node(plain, plan_layout(plain), pool, host.name)
    reset = type(on)("#!/usr/bin/env bash\nset -euo pipefail\n" + f"rm -f {clients.CUFILE_RECORD} "
                     f"{clients.CUFILE_KEPT}*\nprintf %s {shlex.quote(CUFILE_FOUND)} > {clients.CUFILE}\n")

    def listed(k):
        assert cufile_addresses(host) == ["10.40.0.13", "10.41.0.13"], f"step {k}"
        assert host.read(clients.CUFILE_KEPT) == CUFILE_FOUND, f"step {k}"
        assert not dated_copies(host), f"step {k}"

    def given_back(k):
        assert host.read(clients.CUFILE) == CUFILE_FOUND, f"step {k}"
        assert not host.exists(clients.CUFILE_RECORD), f"step {k}"
    each_cut(test_hosts, host, reset, on, listed)
    each_cut(test_hosts, host, on, off, given_back)

# --- the rollout's roll -----------------------------------------------------------------------------------

@pytest.fixture
def quick_roll(monkeypatch):
    monkeypatch.setattr(clients, "ROLL_MOUNT_S", 5)


def weka_pool(spec):
    pool = spec.node_pools[0]
    return NodePoolArgs.from_spec(spec, pool), pool.hosts[0].model_copy(update={"hostname": "gpu-dev-03"})


def test_a_roll_restarts_the_weka_client_after_a_driver_change_and_returns_the_node_only_mounted(
        test_hosts, host, quick_roll):
    """A kubelet restart owed (the CPU manager's policy changed under tenants' pods), then the roll on the
    drained node: it fails while the filesystem is not mounted or its client container is stopped (the node
    stays cordoned for the uncordon to judge), and passes once both are well; a driver change owed restarts the
    client container first."""
    fresh_weka(host)
    host.put(MIRROR, WEKA_INSTALLER)
    data = with_storage({**WEKA, "mount_point": "/srv/weka"}, install_url=f"file://{MIRROR}")
    data["node_pools"][0]["tuning"]["kubelet_cpu_manager_static"] = False
    spec = parse_spec(yaml.safe_dump(data))
    args, node = weka_pool(spec)
    ok(test_hosts.ssh(host, as_command(render_preparation(args, node).create, "root")))
    ok(run(test_hosts, host, render_weka_client(spec, plan_layout(spec), host.name, "eth0").create))
    roll = render_pool_preparation(args).roll_for_host(node, "a" * 64).create
    assert "weka local restart client" in roll

    def rolled():
        host.sh(f"mkdir -p /var/lib/gpucluster/owed && touch /var/lib/gpucluster/owed/restart-kubelet")
        with host.hardware(PODS=DRAINED):
            out = test_hosts.roll(host, roll)
        assert out.returncode == 0, out.stderr
        return out
    host.sh(f"mv {STATE_DIR}/mounts/_srv_weka {STATE_DIR}/mounts/_srv_weka.off")
    assert "/srv/weka is not mounted 5 s into the roll" in roll_failure(rolled().stdout)
    host.sh(f"mv {STATE_DIR}/mounts/_srv_weka.off {STATE_DIR}/mounts/_srv_weka && touch {STATE_DIR}/weka-stopped")
    assert "the WEKA client container client is Stopped after the roll" in roll_failure(rolled().stdout)
    host.sh(f"rm -f {STATE_DIR}/weka-stopped")
    out = rolled()
    assert roll_failure(out.stdout) == "" and "/srv/weka is mounted and answers" in out.stdout
    host.sh("touch /var/lib/gpucluster/owed/restart-driver")
    host.clear_calls()
    out = rolled()
    assert roll_failure(out.stdout) == "" and "weka local restart client" in host.calls()
    assert "restarted the WEKA client (its NICs' driver changed)" in out.stdout
    ok(run(test_hosts, host, render_weka_client(spec, plan_layout(spec), host.name, "eth0").delete))


def test_a_roll_rebuilds_the_scale_layer_for_a_new_kernel_restarts_gpfs_and_waits_for_the_mount(
        test_hosts, host, scale_root, quick_roll):
    """A driver change owed on a drained node: the portability layer is built for the running kernel where it
    is missing, GPFS restarts on the node (mmshutdown, mmstartup without -N: this node), and the node returns to
    work only with the file system mounted."""
    scale_installed(host)
    spec = scale_spec()
    args, node = weka_pool(spec)
    ok(test_hosts.ssh(host, as_command(render_preparation(args, node).create, "root")))
    roll = render_pool_preparation(args).roll_for_host(node, "b" * 64).create
    host.sh(f"rm -f {STATE_DIR}/scale-modules-* {STATE_DIR}/mounts/_srv_gpfs0 && mkdir -p /srv/gpfs0")

    def rolled():
        host.sh("mkdir -p /var/lib/gpucluster/owed && touch /var/lib/gpucluster/owed/restart-driver")
        with host.hardware(PODS=DRAINED):
            out = test_hosts.roll(host, roll)
        assert out.returncode == 0, out.stderr
        return out
    host.clear_calls()
    out = rolled()
    assert [c for c in host.calls() if c.startswith("mm")][:3] == ["mmbuildgpl ", "mmshutdown ", "mmstartup "]
    assert "/srv/gpfs0 is not mounted 5 s into the roll" in roll_failure(out.stdout)
    assert "mmmount gpfs0" in host.calls()       # the node mounts it itself where GPFS does not automount
    host.sh(f"touch {STATE_DIR}/mounts/_srv_gpfs0")
    host.clear_calls()
    out = rolled()
    assert roll_failure(out.stdout) == "" and "/srv/gpfs0 is mounted and answers" in out.stdout
    assert "mmbuildgpl " not in host.calls()      # built for this kernel already
    host.sh(f"rm -rf /srv/gpfs0 {STATE_DIR}/mounts/_srv_gpfs0")
