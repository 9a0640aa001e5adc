"""Lustre and BeeGFS scripts over real SSH, against real loop devices that hold real filesystems.

blkid, the filesystem probes and mkfs.ext4 are real; mkfs.lustre is a double that formats the device as the
ldiskfs (ext4) target it would be, with Lustre's label, so the guard sees what a real target looks like. Mounts
of network filesystems, LNet and the BeeGFS tools are recording doubles.
"""

from __future__ import annotations

import os
import subprocess

import pytest
import yaml

from components.spec import parse_spec
from components.ssh import as_command
from components.storage.layout import plan_layout
from components.storage.scripts import (render_beegfs_client, render_beegfs_server, render_directories,
                                        render_lustre_client, render_lustre_server)
from components.storage import scripts as storage_scripts
from tests.conftest import _DEV
from tests.realssh.doubles import STATE_DIR
from tests.realssh.storage_host import BEEGFS_CLIENT_PACKAGES, RECORD as _RECORD, beegfs_client_module, storage_host

@pytest.fixture(scope="module")
def host(test_hosts):
    return storage_host(test_hosts.hosts["gpu-dev-03"])


@pytest.fixture
def loop(tmp_path):
    """A real block device backed by a file; `fs` formats it with a real filesystem first."""
    made = []

    def make(fs: str | None = None, label: str = "data") -> str:
        image = tmp_path / f"disk{len(made)}.img"
        subprocess.run(["truncate", "-s", "64M", str(image)], check=True)
        device = subprocess.run(["losetup", "-f", "--show", str(image)], check=True, capture_output=True,
                                text=True).stdout.strip()
        made.append(device)
        if fs:
            subprocess.run([f"mkfs.{fs}", "-q", "-L", label, device], check=True, capture_output=True)
        return device
    yield make
    for device in made:
        subprocess.run(["losetup", "-d", device], check=False)


def lustre_oss(host, device: str, reformat: bool = False):
    data = yaml.safe_load(yaml.safe_dump(_DEV))
    data["sites"][0]["racks"].append({"name": "r02", "pdu_capacity_kw": 20})
    data["storage"] = {"kind": "lustre", "lnet": "tcp", "fs_name": "labfs", "server_interface": "eth0",
                       "servers": [
                           {"hostname": "mds-01", "address": "10.10.9.1", "rack": "r02", "targets": [
                               {"role": "mgs-mdt", "device": "/dev/nvme0n1", "raid_level": "raid1", "size_tib": 1}]},
                           {"hostname": host.name, "address": host.address, "rack": "r02", "targets": [
                               {"role": "ost", "index": 3, "device": device, "raid_level": "raid6", "size_tib": 1,
                                "reformat": reformat}]}]}
    spec = parse_spec(yaml.safe_dump(data))
    return spec, render_lustre_server(spec, plan_layout(spec), host.name)


def run(test_hosts, host, text, stdin=None):
    """As push() runs it: a script that reads a secret gets it on standard input."""
    return test_hosts.ssh(host, as_command(text, "root", stdin=stdin is not None), stdin=stdin)


def mkfs_calls(host):
    return [c for c in host.calls() if c.startswith(("mkfs.lustre", "mkfs.xfs"))]


def test_a_device_holding_a_filesystem_is_never_formatted(test_hosts, host, loop):
    device = loop("ext4", label="scratch")
    host.clear_calls()
    out = run(test_hosts, host, lustre_oss(host, device)[1].create)
    assert out.returncode == 1
    assert f"{device} holds ext4 labelled scratch; it is left alone to keep its data" in out.stderr
    assert "set reformat: true on it to destroy the data" in out.stderr
    assert mkfs_calls(host) == [] and not any(c.startswith("lnetctl") for c in host.calls())
    probe = subprocess.run(["blkid", "-p", "-o", "value", "-s", "LABEL", device], capture_output=True, text=True)
    assert probe.stdout.strip() == "scratch"


def test_an_empty_device_is_formatted_once_then_left_alone(test_hosts, host, loop):
    device = loop()
    host.clear_calls()
    first = run(test_hosts, host, lustre_oss(host, device)[1].create)
    assert first.returncode == 0, first.stderr
    assert f"changed: formatted {device} as labfs-OST0003" in first.stdout
    (call,) = mkfs_calls(host)
    assert call == f"mkfs.lustre --fsname=labfs --index=3 --ost --mgsnode=10.10.9.1@tcp {device}"
    host.clear_calls()
    second = run(test_hosts, host, lustre_oss(host, device, reformat=True)[1].create)    # reformat, yet ours
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip().endswith(": 0 change(s)") and mkfs_calls(host) == []


def test_reformat_formats_a_device_that_holds_data_only_when_the_spec_says_so(test_hosts, host, loop):
    device = loop("ext4")
    host.clear_calls()
    out = run(test_hosts, host, lustre_oss(host, device, reformat=True)[1].create)
    assert out.returncode == 0, out.stderr
    assert f"{device} holds ext4 labelled data and is formatted over (reformat: true)" in out.stdout
    assert mkfs_calls(host) == [
        f"mkfs.lustre --fsname=labfs --index=3 --ost --mgsnode=10.10.9.1@tcp --reformat {device}"]


def test_deleting_a_server_unmounts_and_keeps_the_data(test_hosts, host, loop):
    device = loop()
    spec, script = lustre_oss(host, device)
    assert run(test_hosts, host, script.create).returncode == 0
    host.clear_calls()
    out = run(test_hosts, host, script.delete)
    assert out.returncode == 0, out.stderr
    assert host.calls() == [c for c in host.calls() if c.split()[0] in ("findmnt", "umount")]
    assert "umount /srv/lustre/labfs/ost3" in host.calls()
    probe = subprocess.run(["blkid", "-p", "-o", "value", "-s", "LABEL", device], capture_output=True, text=True)
    assert probe.stdout.strip() == "labfs:OST0003"


def beegfs_server(host, devices, quotas: bool = False, interface: str = "eth0"):
    data = yaml.safe_load(yaml.safe_dump(_DEV))
    data["storage"] = {"kind": "beegfs", "fs_name": "labfs", "server_interface": interface, "auth": False,
                       "quotas": quotas,
                       "servers": [{"hostname": host.name, "address": host.address, "rack": "r01", "targets": [
                           {"role": "mgmtd", "device": devices[0], "raid_level": "raid1", "size_tib": 1},
                           {"role": "meta", "index": 1, "device": devices[1], "raid_level": "raid1", "size_tib": 1},
                           {"role": "storage", "index": 101, "device": devices[2], "raid_level": "raid6",
                            "size_tib": 1}]}]}
    spec = parse_spec(yaml.safe_dump(data))
    return render_beegfs_server(spec, plan_layout(spec), host.name)


@pytest.fixture
def quick_settle(monkeypatch):
    monkeypatch.setattr(storage_scripts, "BEEGFS_SETTLE_S", 1)


def test_a_beegfs_server_sets_up_its_targets_once(test_hosts, host, loop, quick_settle):
    devices = [loop(), loop(), loop()]
    host.sh(f"touch {STATE_DIR}/lustre-modules; mkdir -p /opt/beegfs/lib; touch /opt/beegfs/lib/libbeegfs_ib.so")
    script = beegfs_server(host, devices, quotas=True)
    host.clear_calls()
    first = run(test_hosts, host, script.create)
    assert first.returncode == 0, first.stderr
    calls = host.calls()
    assert f"beegfs-setup-storage -p /srv/beegfs/labfs/storage101 -s 101 -i 101 -m {host.address}" in calls
    assert host.read("/etc/beegfs/beegfs-storage.conf").splitlines() == [
        "connAuthFile = ", "connDisableAuthentication = true",
        "connInterfacesFile = /etc/beegfs/gpucluster-interfaces", f"sysMgmtdHost = {host.address}",
        "connUseRDMA = true", "quotaEnableEnforcement = true"]
    for role in ("mgmtd", "meta", "storage"):      # each daemon read its conf and runs on
        assert f"beegfs-daemon-{role} /etc/beegfs/beegfs-{role}.conf" in calls
        assert host.exists(f"{STATE_DIR}/active/beegfs-{role}"), role
    host.clear_calls()
    second = run(test_hosts, host, script.create)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip().endswith(": 0 change(s)"), second.stdout
    assert not any(c.startswith(("mkfs", "beegfs-setup", "beegfs-daemon")) for c in host.calls())
    host.clear_calls()
    off = run(test_hosts, host, beegfs_server(host, devices, quotas=False).create)     # restarts all three
    assert off.returncode == 0, off.stderr
    assert [c.split()[0] for c in host.calls() if c.startswith("beegfs-daemon")] == [
        "beegfs-daemon-mgmtd", "beegfs-daemon-meta", "beegfs-daemon-storage"]
    run(test_hosts, host, script.delete)


def test_a_daemon_that_refuses_its_configuration_fails_the_step_with_its_log(test_hosts, host, loop, quick_settle):
    """Type=simple: `systemctl start` succeeds and the daemon exits a moment later. A key planted by hand
    stops the step with the daemon's own words; the key earlier releases of this tool wrote into server confs
    (quotaEnabled, a client-only key) is removed, so an upgraded cluster's daemons start again."""
    devices = [loop(), loop(), loop()]
    host.sh(f"touch {STATE_DIR}/lustre-modules; mkdir -p /opt/beegfs/lib; touch /opt/beegfs/lib/libbeegfs_ib.so")
    script = beegfs_server(host, devices)
    host.sh(f"rm -f {STATE_DIR}/active/beegfs-*; printf 'quotaEnabled = true\\n' >> /etc/beegfs/beegfs-meta.conf")
    upgraded = run(test_hosts, host, script.create)
    assert upgraded.returncode == 0, upgraded.stderr
    assert "/etc/beegfs/beegfs-meta.conf: removed quotaEnabled, which this daemon refuses" in upgraded.stdout
    assert host.exists(f"{STATE_DIR}/active/beegfs-meta")
    host.sh("printf 'tuneBogusSetting = 1\\n' >> /etc/beegfs/beegfs-storage.conf")
    host.sh(f"rm -f {STATE_DIR}/active/beegfs-storage")
    out = run(test_hosts, host, script.create)
    assert out.returncode == 1
    assert ("beegfs-storage stopped right after it started: Unrecoverable error: The config argument "
            "'tuneBogusSetting' is invalid") in out.stderr, out.stderr
    host.sh("sed -i '/tuneBogusSetting/d' /etc/beegfs/beegfs-storage.conf")
    run(test_hosts, host, script.delete)


# --- packages: named when missing, installed only from the spec's repository ------------------------------

def lustre_client(host, repository=None, lnet="tcp", interface="eth0"):
    data = yaml.safe_load(yaml.safe_dump(_DEV))
    data["sites"][0]["racks"].append({"name": "r02", "pdu_capacity_kw": 20})
    data["storage"] = {"kind": "lustre", "lnet": lnet, "fs_name": "labfs", "server_interface": "eth0",
                       "client_interface": "eth0", "package_repositories": [repository] if repository else [],
                       "servers": [{"hostname": "mds-01", "address": "10.10.9.1", "data_address": "10.11.9.1",
                                    "rack": "r02", "targets": [
                           {"role": "mgs-mdt", "device": "/dev/nvme0n1", "raid_level": "raid1", "size_tib": 1},
                           {"role": "ost", "index": 0, "device": "/dev/nvme1n1", "raid_level": "raid6",
                            "size_tib": 1}]}]}
    spec = parse_spec(yaml.safe_dump(data))
    return render_lustre_client(spec, plan_layout(spec), host.name, interface)


def test_a_host_lacking_its_packages_stops_before_any_change_naming_them(test_hosts, host):
    host.sh(f"rm -f {STATE_DIR}/lustre-modules")
    host.clear_calls()
    result = run(test_hosts, host, lustre_client(host).create)
    host.sh(f"touch {STATE_DIR}/lustre-modules")
    assert result.returncode != 0
    assert (f"{host.name}: error: missing module lustre (the Lustre 2.15 client: packages "
            f"lustre-client-modules-{os.uname().release}); install them") in result.stderr, result.stderr
    assert "name the site's debian repository in storage.package_repositories" in result.stderr
    assert "changed" not in result.stdout
    assert {c.split()[0] for c in host.calls()} == {"modinfo"}      # nothing ran but the checks


def test_an_o2ib_client_whose_verbs_driver_does_not_load_says_why(test_hosts, host):
    """Modules built for another kernel or RDMA stack: named at their load, before LNet is touched."""
    host.sh(f"touch {STATE_DIR}/bad-module-ko2iblnd")
    try:
        result = run(test_hosts, host, lustre_client(host, lnet="o2ib").create)
    finally:
        host.sh(f"rm -f {STATE_DIR}/bad-module-ko2iblnd")
    assert result.returncode == 1
    assert (f"the Lustre verbs driver ko2iblnd does not load on kernel {os.uname().release} with the kernel's own "
            "RDMA stack (modprobe: ERROR: could not insert 'ko2iblnd': Invalid argument)") in result.stderr
    assert not host.exists("/etc/lnet.conf") or "o2ib" not in host.read("/etc/lnet.conf")


def _deb(tmp, name: str, files: dict[str, str], version: str = "7.4.7", depends: str = "") -> None:
    """A real Debian package that installs `files` (paths under directories the test host overlays)."""
    root = tmp / f"{name}_{version}"
    for path, text in files.items():
        (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (root / path.lstrip("/")).write_text(text)
        (root / path.lstrip("/")).chmod(0o755)
    (root / "DEBIAN").mkdir()
    (root / "DEBIAN" / "control").write_text(f"Package: {name}\nVersion: {version}\nArchitecture: all\n"
                                             + (f"Depends: {depends}\n" if depends else "")
                                             + "Maintainer: test <t@example.com>\nDescription: test double\n")
    deb = f"{name}.deb" if version == "7.4.7" else f"{name}_{version}.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-b", str(root), str(tmp / "repo" / deb)],
                   check=True, capture_output=True)


SECRET = "Rk9PQkFSc2VjcmV0MTIzNDU2Nzg5MGFiY2RlZmdoaWprbG1ub3BxcnN0dXZ3eHl6"


def rdma_client_module(host):
    return beegfs_client_module(host, "stor-dev-01", "10.22.0.31")


def test_missing_packages_come_from_the_specs_repository_once(test_hosts, host, tmp_path, quick_settle):
    """A flat apt repository of real packages (file://, as a site mirror would serve them): the BeeGFS client
    installs what it lacks from there, and the second run installs nothing."""
    (tmp_path / "repo").mkdir()
    for name, files in BEEGFS_CLIENT_PACKAGES.items():
        _deb(tmp_path, name, files)
    index = subprocess.run(["dpkg-scanpackages", "."], cwd=tmp_path / "repo", check=True, capture_output=True,
                           text=True).stdout
    (tmp_path / "repo" / "Packages").write_text(index)
    data = yaml.safe_load(yaml.safe_dump(_DEV))
    data["storage"]["package_repositories"] = [{"os_family": "debian", "url": f"file://{tmp_path / 'repo'}"}]
    spec = parse_spec(yaml.safe_dump(data))
    script = render_beegfs_client(spec, plan_layout(spec), host.name, "eth0")
    # apt drops to its _apt user, which cannot write under the overlay this test host lives in
    host.put("/etc/apt/apt.conf.d/99sandbox", 'APT::Sandbox::User "root";\n')
    host.sh(f"mkdir -p {STATE_DIR}/mounts")
    module = rdma_client_module(host)
    secret = SECRET
    first = run(test_hosts, host, script.create, stdin=secret)
    assert first.returncode == 0, first.stderr
    assert f"{host.name}: BeeGFS over RDMA to every server it is connected to" in first.stdout
    assert host.read("/etc/beegfs/conn.auth") == secret + "\n" and secret not in first.stdout + first.stderr
    assert oct(host.upper("/etc/beegfs/conn.auth").stat().st_mode & 0o777) == "0o400"
    assert f"{host.name}: changed: installed beegfs-client beegfs-helperd beegfs-utils from file://" in first.stdout
    assert host.read("/etc/apt/sources.list.d/gpucluster-beegfs-devfs.list").strip() == \
        f"deb [trusted=yes] file://{tmp_path / 'repo'} ./"
    second = run(test_hosts, host, script.create, stdin=secret)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip().endswith(": 0 change(s)"), second.stdout
    rotated = run(test_hosts, host, script.create, stdin=secret[::-1])     # a new secret: every daemon rereads
    assert rotated.returncode == 0, rotated.stderr
    assert f"{host.name}: changed: restarted beegfs-helperd" in rotated.stdout
    assert f"{host.name}: changed: restarted beegfs-client" in rotated.stdout
    fed = run(test_hosts, host, script.create)            # fed to bash on its input: no secret to read
    assert fed.returncode == 1 and "reads the connection secret on standard input" in fed.stderr
    # a storage server without libbeegfs-ib answers over TCP: mounted and working, but not what the spec says
    (module / "storage_nodes").write_text("stor-dev-01 [ID: 1]\n   Connections: TCP: 2 (10.22.0.31:8003); \n")
    tcp = run(test_hosts, host, script.create, stdin=secret[::-1])
    assert tcp.returncode == 1 and "the BeeGFS client reaches stor-dev-01 over TCP, not RDMA" in tcp.stderr


def lustre_mgs(host, device: str, tunables: dict):
    data = yaml.safe_load(yaml.safe_dump(_DEV))
    data["sites"][0]["racks"].append({"name": "r02", "pdu_capacity_kw": 20})
    data["storage"] = {"kind": "lustre", "lnet": "tcp", "fs_name": "labfs", "server_interface": "eth0",
                       "client_tunables": tunables, "servers": [
                           {"hostname": host.name, "address": host.address, "rack": "r02", "targets": [
                               {"role": "mgs-mdt", "device": device, "raid_level": "raid1", "size_tib": 1}]},
                           {"hostname": "oss-01", "address": "10.10.9.2", "rack": "r02", "targets": [
                               {"role": "ost", "device": "/dev/nvme1n1", "raid_level": "raid6", "size_tib": 1}]}]}
    spec = parse_spec(yaml.safe_dump(data))
    return render_lustre_server(spec, plan_layout(spec), host.name)


def test_the_mgs_sets_persistent_parameters_once_and_deletes_one_the_spec_drops(test_hosts, host, loop):
    device = loop()
    both = lustre_mgs(host, device, {"rpcs_in_flight": 16, "read_ahead_mib": 512})
    host.clear_calls()
    assert run(test_hosts, host, both.create).returncode == 0
    assert "lctl set_param -P osc.labfs-OST*.max_rpcs_in_flight=16" in host.calls()
    assert "lctl set_param -P llite.labfs-*.max_read_ahead_mb=512" in host.calls()
    host.clear_calls()
    again = run(test_hosts, host, both.create)
    assert again.stdout.strip().endswith(": 0 change(s)"), again.stdout
    assert not any("set_param" in c for c in host.calls())
    host.clear_calls()
    fewer = run(test_hosts, host, lustre_mgs(host, device, {"rpcs_in_flight": 16}).create)
    assert fewer.returncode == 0, fewer.stderr
    assert "lctl set_param -P -d llite.labfs-*.max_read_ahead_mb" in host.calls()
    assert "lctl set_param -P -d osc.labfs-OST*.max_rpcs_in_flight" not in host.calls()
    run(test_hosts, host, both.delete)


def lustre_dirs(host, gib_a: int):
    data = yaml.safe_load(yaml.safe_dump(_DEV))
    data["sites"][0]["racks"].append({"name": "r02", "pdu_capacity_kw": 20})
    data["storage"] = {"kind": "lustre", "lnet": "tcp", "fs_name": "labfs", "server_interface": "eth0",
                       "mount_point": "/srv/labfs", "datasets": [{"name": "common", "size_gib": 64}], "servers": [
                           {"hostname": "mds-01", "address": "10.10.9.1", "rack": "r02", "targets": [
                               {"role": "mgs-mdt", "device": "/dev/nvme0n1", "raid_level": "raid1", "size_tib": 1},
                               {"role": "ost", "device": "/dev/nvme1n1", "raid_level": "raid6", "size_tib": 1}]}]}
    for tenant, gib in zip(data["tenants"], (gib_a, 512)):
        tenant["storage"] = {"filesystem_gib": gib, "quota_gib": 4096}
    spec = parse_spec(yaml.safe_dump(data))
    layout = plan_layout(spec)
    return render_directories(spec, layout, host.name).create, layout.project_ids


def test_a_change_to_one_tenant_directory_touches_that_tenant_alone(test_hosts, host):
    """Real mkdir, chgrp and chmod on the host; lfs records. Nothing walks a tree (no recursive project
    setting), and a quota change for team-a runs team-a's commands only."""
    host.sh(f"mkdir -p {STATE_DIR}/mounts && touch {STATE_DIR}/mounts/_srv_labfs")
    host.put("/usr/local/bin/lfs", _RECORD)
    host.sh("chmod +x /usr/local/bin/lfs")
    script, ids = lustre_dirs(host, 1024)
    host.clear_calls()
    first = run(test_hosts, host, script)
    assert first.returncode == 0, first.stderr
    assert f"lfs project -p {ids['team-a']} -s /srv/labfs/tenants/team-a" in host.calls()
    assert not any(" -r" in c for c in host.calls() if c.startswith("lfs project"))
    assert oct(host.upper("/srv/labfs/tenants/team-b").stat().st_mode & 0o7777) == "0o2770"
    assert host.upper("/srv/labfs/tenants/team-b").stat().st_gid == ids["team-b"]
    host.clear_calls()
    assert run(test_hosts, host, script).stdout.strip().endswith(": 0 change(s)")
    assert host.calls() == [f"findmnt -rn /srv/labfs"]
    changed, _ = lustre_dirs(host, 2048)
    host.clear_calls()
    out = run(test_hosts, host, changed)
    assert out.returncode == 0, out.stderr
    assert [c for c in host.calls() if c.startswith("lfs")] == [
        f"lfs project -p {ids['team-a']} -s /srv/labfs/tenants/team-a",
        f"lfs setquota -p {ids['team-a']} -B 2048G /srv/labfs"]
    assert out.stdout.strip().endswith(": 1 change(s)"), out.stdout


def test_an_md_array_at_another_level_than_declared_stops_before_any_change(test_hosts, host, loop):
    """raid_level is checked where the host can see it: an md RAID-0 declared raid6 stops the script; a device
    that is no md array is taken as declared, and said so."""
    device = loop()
    md = host.sysfs(f"/sys/class/block/{os.path.basename(device)}/md/level")
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text("raid0\n")
    try:
        host.clear_calls()
        out = run(test_hosts, host, lustre_oss(host, device)[1].create)
    finally:
        md.unlink()
    assert out.returncode == 1
    assert f"{device} is an md raid0 array but the spec declares raid6 (raid_level)" in out.stderr, out.stderr
    assert mkfs_calls(host) == []
    declared = run(test_hosts, host, lustre_oss(host, device)[1].create)
    assert f"{device}: raid6 as declared (not an md array" in declared.stdout, declared.stdout + declared.stderr
    run(test_hosts, host, lustre_oss(host, device)[1].delete)


def test_an_earlier_tenants_directory_is_never_handed_to_a_new_one(test_hosts, host):
    """team-a's directory, owned by another group (an earlier team-a, or another tenant's): the step stops
    before changing its owner, so the old data never passes to the new tenant."""
    host.sh(f"mkdir -p {STATE_DIR}/mounts && touch {STATE_DIR}/mounts/_srv_labfs")
    host.put("/usr/local/bin/lfs", _RECORD)
    host.sh("chmod +x /usr/local/bin/lfs; rm -f /etc/gpucluster/lustre-labfs-dirs")
    script, ids = lustre_dirs(host, 1024)
    host.sh("mkdir -p /srv/labfs/tenants/team-a && chgrp 4242 /srv/labfs/tenants/team-a")
    out = run(test_hosts, host, script)
    assert out.returncode == 1
    assert (f"/srv/labfs/tenants/team-a belongs to group 4242, an earlier tenant's, not {ids['team-a']}: its data "
            "is not handed to a new tenant") in out.stderr, out.stderr
    assert host.upper("/srv/labfs/tenants/team-a").stat().st_gid == 4242
    host.sh("rm -rf /srv/labfs/tenants/team-a")
