"""The ParallelFilesystem component under Pulumi's mocks, its scripts and its Kubernetes objects."""

from __future__ import annotations

import copy

import shutil
import subprocess

import pytest
import yaml

from components import GpuCluster
from components.offline import recorder
from components.offline.plan import build_plan, write_plan
from components.spec import parse_spec
from components.storage import ParallelFilesystem, plan_layout
from components.storage.kubernetes import render_volumes
from components.storage.scripts import (lustre_params, render_beegfs_client, render_beegfs_server,
                                        render_directories, render_lustre_client, render_lustre_server)
from tests.conftest import ROOT, _DEV, problems_of, ssh_key

PROD = yaml.safe_load((ROOT / "stacks" / "prod.yaml").read_text())
AUTH = "S3CRET-BEEGFS-CONNECTION-AUTH"


def all_scripts(spec):
    layout = plan_layout(spec)
    lustre = layout.kind == "lustre"
    for server in layout.servers:
        s = (render_lustre_server if lustre else render_beegfs_server)(spec, layout, server.hostname)
        yield f"{server.hostname}.sh", s.create
        yield f"{server.hostname}.delete.sh", s.delete
    for pool, host in spec.hosts():
        c = (render_lustre_client if lustre else render_beegfs_client)(spec, layout, host.hostname, "ib0")
        yield f"{host.hostname}.sh", c.create
        yield f"{host.hostname}.delete.sh", c.delete
    yield "directories.sh", render_directories(spec, layout, "gpu-01").create


def shellcheck_findings(named_scripts, tmp_path) -> str:
    """shellcheck's warnings (and worse) on every (file name, text) given, written under `tmp_path`."""
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (.ci/run installs it)")
    paths = []
    for name, text in named_scripts:
        (tmp_path / name).write_text(text)
        paths.append(str(tmp_path / name))
    out = subprocess.run(["shellcheck", "-S", "warning", "-s", "bash", *paths], capture_output=True, text=True)
    return out.stdout if out.returncode else ""


@pytest.mark.parametrize("data", [_DEV, PROD], ids=["beegfs", "lustre"])
def test_every_storage_script_passes_shellcheck(data, tmp_path):
    assert shellcheck_findings(all_scripts(parse_spec(yaml.safe_dump(data))), tmp_path) == ""


def test_delete_scripts_never_format_or_wipe():
    for data in (_DEV, PROD):
        for name, text in all_scripts(parse_spec(yaml.safe_dump(data))):
            if name.endswith(".delete.sh"):
                assert not any(word in text for word in ("mkfs", "wipefs", "dd ", "rm -rf")), name


def test_lustre_targets_carry_the_mgs_nids_and_clients_mount_over_lnet():
    spec = parse_spec(yaml.safe_dump(PROD))
    layout = plan_layout(spec)
    oss = render_lustre_server(spec, layout, "oss-02").create
    assert "mkfs.lustre --fsname=prodfs --index=2 --ost --mgsnode=10.22.0.31@o2ib /dev/disk/by-id/dm-ost2" in oss
    assert "lctl list_nids | grep -qxF 10.22.0.41@o2ib" not in oss and "grep -qxF 10.22.0.42@o2ib" in oss
    mds = render_lustre_server(spec, layout, "mds-01").create
    assert "mkfs.lustre --fsname=prodfs --index=0 --mgs --mdt /dev/disk/by-id/nvme-mdt0" in mds
    assert "lctl set_param -P 'osd-*.prodfs-OST*.quota_slave.enabled=ugp'" in mds
    client = render_lustre_client(spec, layout, "gpu-prod-01", spec.storage_client_interface(spec.node_pools[0])).create
    assert "0: ibp0s0" in client
    assert ("mount_at 10.22.0.31@o2ib:/prodfs /mnt/prodfs lustre "
            "defaults,_netdev,noauto,x-systemd.automount,x-systemd.requires=lnet.service") in client


def test_tenants_get_their_directory_with_a_quota_and_every_dataset_read_only():
    spec = parse_spec(yaml.safe_dump(PROD))
    layout = plan_layout(spec)
    objects = {m.role: m.obj for m in render_volumes(spec, layout)}
    pv, pvc = objects["pv-team-a-prodfs"], objects["pvc-team-a-prodfs"]
    assert pv["spec"]["hostPath"] == {"path": "/mnt/prodfs/tenants/team-a", "type": "Directory"}
    assert pv["spec"]["claimRef"] == {"namespace": "team-a", "name": "prodfs"}
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    assert pvc["spec"]["volumeName"] == "team-a-prodfs" and pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert objects["pvc-team-b-prodfs-common"]["spec"]["accessModes"] == ["ReadOnlyMany"]
    dirs = render_directories(spec, layout, "gpu-prod-01").create
    qid = layout.project_ids["team-a"]
    assert (f"bounded chgrp {qid} /mnt/prodfs/tenants/team-a\n  bounded chmod 2770 /mnt/prodfs/tenants/team-a"
            in dirs)
    assert f"bounded lfs project -p {qid} -s /mnt/prodfs/tenants/team-a" in dirs
    assert f"bounded lfs setquota -p {qid} -B 102400G /mnt/prodfs" in dirs
    assert "bounded lfs setstripe -c -1 -S 4M /mnt/prodfs/datasets/common" in dirs


def test_servers_are_protected_and_come_up_management_first_then_clients(record):
    spec = parse_spec(yaml.safe_dump(PROD))
    run = record(lambda: ParallelFilesystem("prod-storage", spec, ssh_key()))
    commands = {r.name: r for r in run.records if r.type == "command:remote:Command"}
    servers = [n for n in commands if n.removeprefix("prod-storage-") in {s.hostname for s in spec.storage.servers}]
    assert len(servers) == 5 and all(commands[n].options["protect"] for n in servers)
    mds = commands["prod-storage-mds-01"].urn
    assert all(mds in commands[f"prod-storage-oss-0{i}"].dependencies for i in range(1, 5))
    client = commands["prod-storage-gpu-prod-01"]
    assert not client.options["protect"] and {commands[n].urn for n in servers} <= set(client.dependencies)
    assert "prod-storage-directories" not in commands         # the first client's session applies them


def test_the_first_client_applies_the_directories_and_a_quota_change_updates_it_in_place(record):
    def first_client(data):
        spec = parse_spec(yaml.safe_dump(data))
        run = record(lambda: ParallelFilesystem("prod-storage", spec, ssh_key()))
        commands = {r.name: r for r in run.records if r.type == "command:remote:Command"}
        volumes = [r for r in run.records if r.type.startswith("kubernetes:core/v1:Persistent")]
        return commands["prod-storage-gpu-prod-01"], commands["prod-storage-gpu-prod-02"], volumes

    client, other, volumes = first_client(PROD)
    assert "lfs setquota" in client.inputs["create"] and "lfs setquota" in client.inputs["update"]
    assert "mount_at " in client.inputs["create"] and "mount_at " not in client.inputs["update"]
    assert "lfs setquota" not in other.inputs["create"] and other.inputs.get("update") is None
    assert volumes and all(client.urn in v.dependencies for v in volumes)
    data = copy.deepcopy(PROD)
    tenant = next(t for t in data["tenants"] if (t.get("storage") or {}).get("filesystem_gib"))
    tenant["storage"]["filesystem_gib"] += 1024
    changed, other_after, _ = first_client(data)
    assert changed.inputs["triggers"] == client.inputs["triggers"]        # no replacement, no remount
    assert changed.inputs["update"] != client.inputs["update"] and other_after.inputs == other.inputs


def test_the_beegfs_secret_never_reaches_the_plan(record, monkeypatch, tmp_path):
    original = recorder.EchoMocks.new_resource

    def with_result(self, args):
        rid, outputs = original(self, args)
        if args.typ == "random:index/randomPassword:RandomPassword":
            outputs["result"] = AUTH
        return rid, outputs
    monkeypatch.setattr(recorder.EchoMocks, "new_resource", with_result)
    spec = parse_spec(yaml.safe_dump(_DEV))
    plan = build_plan(record(lambda: GpuCluster("dev", spec, ssh_private_key=ssh_key())))
    write_plan(plan, tmp_path / "plan")
    text = "".join(p.read_text() for p in (tmp_path / "plan").rglob("*") if p.is_file())
    assert AUTH not in text
    assert not [f for f in plan.files if f.endswith("-auth.sh")]         # no session of its own
    for path in ("scripts/stor-dev-01/dev-storage-stor-dev-01.sh", "scripts/gpu-dev-01/dev-storage-gpu-dev-01.sh"):
        script = plan.files[path]           # plain text a review reads; the secret comes on standard input
        assert "secret=$(cat)" in script and "put_file /etc/beegfs/conn.auth 0400" in script, path
    commands = {r["name"]: r for r in plan.document["resources"]}
    assert commands["dev-storage-gpu-dev-01"]["inputs"]["stdin"] == "[secret]"
    assert commands["dev-storage-gpu-dev-01"]["inputs"]["create"].startswith('sudo -n /bin/bash -c "$(cat <<')


@pytest.mark.parametrize("change, expected", [
    (lambda s: s["servers"][1]["targets"][1].update(index=0),
     "storage.servers[1].targets[1].index: ost index 0 is on both oss-01 and oss-01"),
    (lambda s: s["servers"][1]["targets"][0].update(raid_level="raid5"),
     "storage.servers[1].targets[0].raid_level: RAID-5 on a 150 TiB target"),
    (lambda s: s["servers"][2].pop("data_address"),
     "storage.servers[2].data_address: oss-02 has no data_address: an o2ib NID is the address"),
    (lambda s: s.update(lnet="o2ib", client_interface=None) or s["servers"][0]["targets"][0].update(raid_level="none"),
     "storage.servers[0].targets[0].raid_level: mgs-mdt target without redundancy"),
])
def test_lustre_bad_input_names_the_field(change, expected):
    data = yaml.safe_load(yaml.safe_dump(PROD))
    change(data["storage"])
    found = problems_of(data)
    assert any(expected in m for m in found), found


def test_a_pool_without_rdma_nics_cannot_reach_an_o2ib_lnet():
    data = yaml.safe_load(yaml.safe_dump(PROD))
    data["node_pools"][0]["nics"] = []
    data["fabric"]["switches"] = []
    found = problems_of(data)
    assert any("node_pools[0].nics: node pool h100 has no RDMA NICs, so it cannot reach the servers' o2ib LNet" in m
               for m in found), found


def test_beegfs_8_refuses_to_run_without_auth():
    data = yaml.safe_load(yaml.safe_dump(_DEV))
    data["storage"].update(version="8", auth=False)
    assert any("storage.auth: BeeGFS 8 services refuse to start without connection authentication" in m
               for m in problems_of(data))


def test_a_tenants_claims_must_fit_its_own_quota():
    data = yaml.safe_load(yaml.safe_dump(_DEV))
    data["tenants"][1]["storage"]["quota_gib"] = 2048
    (msg,) = problems_of(data)
    assert "tenants[1].storage.quota_gib: the tenant's filesystem claims request 2560 GiB" in msg


def test_lustre_tunables_and_quotas_are_persistent_parameters_of_this_filesystem_only():
    spec = parse_spec(yaml.safe_dump(PROD))
    assert lustre_params(spec, "prodfs") == [
        "osd-*.prodfs-MDT*.quota_slave.enabled=ugp", "osd-*.prodfs-OST*.quota_slave.enabled=ugp",
        "obdfilter.prodfs-OST*.brw_size=16", "osc.prodfs-OST*.max_pages_per_rpc=16M",
        "osc.prodfs-OST*.max_rpcs_in_flight=16", "mdc.prodfs-MDT*.max_rpcs_in_flight=16",
        "llite.prodfs-*.max_read_ahead_mb=1024", "llite.prodfs-*.max_read_ahead_per_file_mb=256"]
    mgs = render_lustre_server(spec, plan_layout(spec), "mds-01").create
    assert "lctl set_param -P 'osc.prodfs-OST*.max_pages_per_rpc=16M' >/dev/null" in mgs
    assert "set_param -P" not in render_lustre_server(spec, plan_layout(spec), "oss-01").create   # the MGS only


@pytest.mark.parametrize("change, expected", [
    (lambda s: s.update(kind="beegfs", lnet=None, servers=[]), "client_tunables are Lustre's"),
    (lambda s: s["client_tunables"].update(read_ahead_per_file_mib=4096), "Lustre caps it there"),
    (lambda s: s["client_tunables"].update(rpc_size_mib=3), "client_tunables.rpc_size_mib"),
    (lambda s: s["package_repositories"][0].update(url="https://x/$(reboot)"), "package_repositories[0].url"),
    (lambda s: s["package_repositories"][1].update(os_family="el"),
     "package_repositories[1].os_family: a second el repository"),
    (lambda s: s["package_repositories"][1].pop("os_family"), "package_repositories[1].os_family"),
])
def test_tunables_and_repository_bad_input_names_the_field(change, expected):
    data = yaml.safe_load(yaml.safe_dump(PROD))
    change(data["storage"])
    assert any(expected in p for p in problems_of(data)), problems_of(data)


def test_a_host_without_a_repository_is_told_what_to_install_with_one_it_installs_from_there_only():
    spec = parse_spec(yaml.safe_dump(_DEV))
    client = render_beegfs_client(spec, plan_layout(spec), "gpu-dev-01", "ens1").create
    assert "install them, or name the site's debian repository in storage.package_repositories" in client
    assert "apt-get install" not in client and "dnf install" not in client
    prod = parse_spec(yaml.safe_dump(PROD))
    oss = render_lustre_server(prod, plan_layout(prod), "oss-01").create
    assert "baseurl=https://repo.prod.example.internal/lustre/2.15/el9\nenabled=1\ngpgcheck=1\n" in oss
    assert "  require module osd_ldiskfs kmod-lustre-osd-ldiskfs -\n" in oss       # EL only: no apt package
    # every device is checked before packages are installed: a bad device stops the script first
    assert oss.index("check_device /dev/disk/by-id/dm-ost0") < oss.index("requirements\nif")


def test_lustre_failover_is_refused_unless_an_ha_manager_mounts_the_targets():
    data = yaml.safe_load(yaml.safe_dump(PROD))
    data["storage"]["servers"][1]["failover"] = data["storage"]["servers"][2]["hostname"]
    problems = problems_of(data)
    assert any("failover targets of" in p and "nothing would mount them after a reboot" in p
               and "storage.failover_mounted_by_ha: true" in p for p in problems), problems
    data["storage"]["failover_mounted_by_ha"] = True
    assert not problems_of(data)


def test_each_os_family_installs_from_its_own_repository_only():
    """An apt source never points at the EL (RPM) mirror, nor a dnf repository at the Ubuntu one; a family
    without a repository is refused by name, and the Lustre client on DOCA-OFED takes the DKMS modules."""
    data = yaml.safe_load(yaml.safe_dump(PROD))
    spec = parse_spec(yaml.safe_dump(data))
    client = render_lustre_client(spec, plan_layout(spec), "gpu-prod-01", "ibp0s0").create
    (apt_line,) = [line for line in client.splitlines() if line.strip().startswith("put_file /etc/apt/")]
    assert "lustre/2.15/ubuntu2204 jammy main" in apt_line and "el9" not in apt_line
    (baseurl,) = [line for line in client.splitlines() if line.startswith("baseurl=")]
    assert baseurl == "baseurl=https://repo.prod.example.internal/lustre/2.15/el9"
    assert ("require module ko2iblnd 'kmod-lustre-client|lustre-client-dkms' "
            "'lustre-client-modules-%KERNEL%|lustre-client-modules-dkms'") in client
    assert "the Lustre verbs driver ko2iblnd does not load" in client
    data["storage"]["package_repositories"] = data["storage"]["package_repositories"][:1]     # EL only
    el_only = parse_spec(yaml.safe_dump(data))
    client = render_lustre_client(el_only, plan_layout(el_only), "gpu-prod-01", "ibp0s0").create
    assert "debian) fail \"missing" in client and "apt-get install" not in client


def test_a_tenants_group_comes_from_the_spec_and_is_its_own():
    data = yaml.safe_load(yaml.safe_dump(PROD))
    sized = [t for t in data["tenants"] if t.get("storage", {}).get("filesystem_gib")]
    sized[0]["storage"]["group_id"] = 70001
    spec = parse_spec(yaml.safe_dump(data))
    layout = plan_layout(spec)
    assert layout.project_ids[sized[0].get("namespace", sized[0]["name"])] == 70001
    assert spec.filesystem_claims(spec.tenants[[t["name"] for t in data["tenants"]].index(sized[0]["name"])])[0] \
        .group == 70001
    assert not any(sized[0]["name"] in w and "no storage.group_id" in w for w in spec.warnings())
    if len(sized) > 1:
        sized[1]["storage"]["group_id"] = 70001
        assert any("storage.group_id: group ID '70001' is already used" in p for p in problems_of(data))
