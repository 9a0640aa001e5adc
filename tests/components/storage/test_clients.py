"""Clients of a site's WEKA or Storage Scale cluster: the spec's refusals, the layout, the scripts' vendor syntax
and the resources the component registers (under Pulumi's mocks)."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pulumi
import pytest
import yaml

from components.spec import parse_spec
from components.storage import ParallelFilesystem, plan_layout
from components.storage.clients import (render_scale_member, render_scale_node, render_weka_client,
                                        scale_gds_settings)
from components.storage.filesystem import filesystem_outputs
from components.storage.scripts import render_directories
from tests.components.storage.client_specs import SCALE, WEKA, with_storage
from tests.components.storage.test_filesystem import shellcheck_findings
from tests.conftest import problems_of, ssh_key


def spec_of(storage, unpinned=False, **settings):
    """`unpinned`: the pools without the static CPU manager."""
    data = with_storage(storage, **settings)
    for pool in data["node_pools"] if unpinned else ():
        pool.setdefault("tuning", {})["kubelet_cpu_manager_static"] = False
        pool["tuning"].pop("kubelet_topology_policy", None)
    return parse_spec(yaml.safe_dump(data))


def scripts(spec):
    layout = plan_layout(spec)
    for pool, host in spec.hosts():
        if layout.kind == "wekafs":
            s = render_weka_client(spec, layout, host.hostname, "ens1f0np0")
        else:
            yield f"{host.hostname}-node.sh", render_scale_node(spec, layout, pool, host.hostname).create
            s = render_scale_member(spec, layout, pool, host.hostname)
        yield f"{host.hostname}.sh", s.create
        yield f"{host.hostname}.delete.sh", s.delete
    yield "directories.sh", render_directories(spec, layout, "gpu-dev-01").create


@pytest.mark.parametrize("storage, settings", [(WEKA, {}), (WEKA, {"gds": True, "network": "dpdk"}), (SCALE, {}),
                                               (SCALE, {"gds": True})],
                         ids=["wekafs", "wekafs-gds", "scale", "scale-gds"])
def test_every_client_script_passes_shellcheck(storage, settings, tmp_path):
    assert shellcheck_findings(scripts(spec_of(storage, **settings)), tmp_path) == ""


def test_gds_lists_the_interfaces_verbsports_names_in_cufile_and_undoes_it_when_off():
    from components.storage.clients import CUFILE_RECORD
    gds, plain = spec_of(SCALE, gds=True), spec_of(SCALE)
    pool = gds.node_pools[0]
    on = render_scale_node(gds, plan_layout(gds), pool, "gpu-dev-01").create
    interfaces = [n.interface for n in sorted(pool.nics, key=lambda n: n.rail)]
    assert f"devices=({' '.join(interfaces)})" in on
    assert scale_gds_settings(pool).endswith("verbsPorts=" + " ".join(
        f"{n.device}/1" for n in sorted(pool.nics, key=lambda n: n.rail)))
    off = render_scale_node(plain, plan_layout(plain), pool, "gpu-dev-01").create
    assert "rdma_dev_addr_list" not in off and f"if [[ -f {CUFILE_RECORD} ]]" in off
    weka = spec_of(WEKA, gds=True, network="dpdk")
    text = render_weka_client(weka, plan_layout(weka), "gpu-dev-01", "ens1f0np0").create
    assert "devices=(ens1f0np0)" in text and text.index("nvidia_fs") < text.index("rdma_dev_addr_list")


@pytest.mark.parametrize("storage", [WEKA, SCALE], ids=["wekafs", "scale"])
def test_client_delete_scripts_never_format_or_remove_data(storage):
    for name, text in scripts(spec_of(storage)):
        if name.endswith(".delete.sh"):
            assert not any(w in text for w in ("mkfs", "wipefs", "mmdelfs", "mmdelfileset", "rm -rf")), name


def test_the_weka_mount_carries_cores_network_cache_and_options_in_one_place():
    """docs.weka.io, "Mount filesystems": core=<id> once per core (or num_cores), net=<netdev> or net=udp."""
    spec = spec_of(WEKA, cache_mode="readcache")
    layout = plan_layout(spec)
    assert layout.client_source == "10.10.0.41,10.10.0.42/wfs" and layout.targets == () and layout.servers == ()
    text = render_weka_client(spec, layout, "gpu-dev-01", "ens1f0np0").create
    assert ("mount_at 10.10.0.41,10.10.0.42/wfs /mnt/weka wekafs core=1,net=ens1f0np0,readcache,sync_on_close,"
            "_netdev,x-systemd.requires=weka-agent.service") in text
    udp = spec_of(WEKA, unpinned=True, network="udp", client_core_ids=None, client_cores=2)
    assert "wekafs num_cores=2,net=udp,sync_on_close," in render_weka_client(
        udp, plan_layout(udp), "gpu-dev-01", "ens1f0np0").create
    assert "http://10.10.0.41:14000/dist/v1/install" in text       # the first backend's installer
    mirror = spec_of(WEKA, install_url="https://mirror.example.internal/weka/install")
    assert "https://mirror.example.internal/weka/install" in render_weka_client(
        mirror, plan_layout(mirror), "gpu-dev-01", "ens1f0np0").create


@pytest.mark.parametrize("settings, expected", [
    ({"mount_options": ["num_cores=4"]}, "storage.weka.mount_options[0]: num_cores=4 is set by "
                                         "storage.weka.client_cores"),
    ({"mount_options": ["writecache"]}, "storage.weka.mount_options[0]: writecache is set by storage.weka.cache_mode"),
    ({"mount_options": ["ro"]}, "storage.weka.mount_options[0]: ro is not passed: tenants write"),
    ({"mount_options": ["bogus=1"]}, "storage.weka.mount_options[0]: 'bogus=1' is not a wekafs mount option"),
    ({"mount_options": ["readahead_kb=lots"]}, "readahead_kb takes a whole number"),
    ({"backends": ["10.10.0.41", "10.10.0.41"]}, "storage.weka.backends: a backend is listed twice"),
    ({"backends": []}, "storage.weka.backends"),
    ({"client_cores": 2}, "storage.weka.client_core_ids: 1 names 1 CPU(s) but client_cores is 2"),
    ({"client_core_ids": None}, "storage.weka.client_core_ids: pool h100 pins pods to CPUs"),
    ({"client_core_ids": "5"}, "node_pools[0].tuning.kubelet_reserved_cpus: WEKA's polling cores (5) must lie in"),
    ({"api_username": None}, "storage.weka.api_username: WEKA directory quotas are set through its API"),
    ({"capacity_tib": 1}, "tenants[1].storage.filesystem_gib: 2048 GiB is more than the whole wekafs filesystem"),
    ({"gds": True, "network": "udp"}, "storage.weka.gds: GPUDirect Storage moves data by RDMA"),
])
def test_weka_bad_input_names_the_field(settings, expected):
    found = problems_of(with_storage(WEKA, **settings))
    assert any(expected in p for p in found), found


@pytest.mark.parametrize("change, expected", [
    (lambda s: s.update(server_interface="ib0"), "storage.server_interface: server_interface is for the servers"),
    (lambda s: s.update(lnet="tcp"), "storage.lnet: lnet is for the servers"),
    (lambda s: s.update(servers=[{"hostname": "x", "address": "10.0.0.9", "rack": "r01", "targets": [
        {"role": "ost", "device": "/dev/sdb", "raid_level": "raid6", "size_tib": 1}]}]),
     "storage.servers: wekafs servers are the site's own cluster"),
    (lambda s: s.pop("weka"), "storage.weka: kind wekafs needs storage.weka"),
    (lambda s: s.update(scale=copy.deepcopy(SCALE["scale"])), "storage.scale: storage.scale is for kind scale"),
    (lambda s: s["datasets"][0].update(stripe_count=4), "storage.datasets[0].stripe_count: wekafs places data"),
    (lambda s: s.update(version="3.9"), "storage.version: wekafs 3.9 is not supported"),
])
def test_server_settings_are_refused_for_a_sites_cluster(change, expected):
    data = with_storage(WEKA)
    change(data["storage"])
    found = problems_of(data)
    assert any(expected in p for p in found), found


@pytest.mark.parametrize("settings, expected", [
    ({"supported_kernels": ["5.15;rm"]}, "storage.scale.supported_kernels[0]: '5.15;rm' is not a kernel release"),
    ({"supported_kernels": []}, "storage.scale.supported_kernels"),
    ({"cluster_id": "abc"}, "storage.scale.cluster_id"),
    ({"device": "gpfs 0"}, "storage.scale.device"),
])
def test_scale_bad_input_names_the_field(settings, expected):
    found = problems_of(with_storage(SCALE, **settings))
    assert any(expected in p for p in found), found


def test_scale_gds_needs_rdma_nics_and_names_them_in_verbs_ports():
    spec = spec_of(SCALE, gds=True)
    pool = spec.node_pools[0]
    assert scale_gds_settings(pool) == "verbsRdma=enable,verbsGPUDirectStorage=yes,verbsPorts=mlx5_0/1 mlx5_1/1"
    member = render_scale_member(spec, plan_layout(spec), pool, "gpu-dev-01").create
    assert "mmchconfig 'verbsRdma=enable,verbsGPUDirectStorage=yes,verbsPorts=mlx5_0/1 mlx5_1/1' -N" in member
    data = with_storage(SCALE, gds=True)
    data["fabric"]["kind"] = "ethernet"
    data["fabric"].pop("roce", None)
    assert any("storage.scale.gds: GPUDirect Storage needs RDMA" in p for p in problems_of(data))


def test_the_scale_node_checks_the_kernel_before_any_change():
    spec = spec_of(SCALE)
    text = render_scale_node(spec, plan_layout(spec), spec.node_pools[0], "gpu-dev-01").create
    assert text.index("storage.scale.supported_kernels") < text.index("--- packages")
    # the layer is built (scale_layer, which runs mmbuildgpl) only after the packages are there
    assert "mmbuildgpl" in text[:text.index("scale_layer() {") + 400]
    assert text.index("--- packages") < text.index("\nscale_layer\n")


def test_tenants_get_filesets_with_block_quotas_on_scale_and_directory_quotas_on_weka():
    weka, scale = spec_of(WEKA), spec_of(SCALE)
    w = render_directories(weka, plan_layout(weka), "gpu-dev-01").create
    s = render_directories(scale, plan_layout(scale), "scale-adm-01").create
    assert "bounded weka fs quota set /mnt/weka/tenants/team-b --hard 2048GiB" in w
    assert "export WEKA_USERNAME=gpucluster WEKA_PASSWORD" in w and "WEKA_PASSWORD=$(cat)" in w
    assert "fileset gpfs0 team-b /gpfs/gpfs0/tenants/team-b" in s
    assert "bounded mmsetquota gpfs0:team-b --block 2048G:2048G" in s
    assert "mmcrfileset \"$1\" \"$2\" --inode-space new" in s and "mmlinkfileset \"$1\" \"$2\" -J \"$3\"" in s
    data = with_storage(WEKA, api_username=None, csi={"enabled": False})
    data["storage"]["quotas"] = False
    unquoted = parse_spec(yaml.safe_dump(data))
    text = render_directories(unquoted, plan_layout(unquoted), "gpu-dev-01").create
    assert "WEKA_PASSWORD" not in text and "quota set" not in text
    assert unquoted.storage.secret_settings == () and weka.storage.secret_settings == ("storageApiPassword",)


def test_outputs_show_the_sites_cluster_with_its_capacity_and_bandwidth():
    spec = spec_of(SCALE)
    out = filesystem_outputs(spec, plan_layout(spec))
    assert out["manager"] == "scale-adm-01" and out["capacity_tib"] == 100 and out["read_gb_per_s"] == 40
    assert out["data_servers"] == 0


def test_scale_nodes_join_through_the_admin_node_after_their_own_step(record):
    spec = spec_of(SCALE)
    run = record(lambda: ParallelFilesystem("dev-storage", spec, ssh_key()))
    commands = {r.name: r for r in run.records if r.type == "command:remote:Command"}
    for host in ("gpu-dev-01", "gpu-dev-02"):
        member, own = commands[f"dev-storage-{host}-member"], commands[f"dev-storage-{host}"]
        assert own.urn in member.dependencies
        assert "10.10.0.51" in str(member.inputs["connection"])
        assert "mmdelnode" in member.inputs["delete"] and "mmaddnode" in member.inputs["create"]
    directories = commands["dev-storage-directories"]
    assert commands["dev-storage-gpu-dev-01-member"].urn in directories.dependencies
    assert "10.10.0.51" in str(directories.inputs["connection"])
    volumes = [r for r in run.records if r.type.startswith("kubernetes:core/v1:Persistent")]
    assert volumes and all(directories.urn in v.dependencies for v in volumes)


def test_weka_directories_take_the_api_password_on_their_input_and_converge_in_place(record):
    spec = spec_of(WEKA)

    def program():
        ParallelFilesystem("dev-storage", spec, ssh_key(), api_password=pulumi.Output.secret("W3KA-PASS"))
    run = record(program)
    commands = {r.name: r for r in run.records if r.type == "command:remote:Command"}
    directories = commands["dev-storage-directories"]
    stdin = directories.inputs["stdin"]       # a secret: Pulumi's secret signature wraps the value
    assert stdin["value"] == "W3KA-PASS" and "4dabf18193072939515e22adb298388d" in stdin
    assert not directories.inputs.get("triggers")           # converges: a quota change updates it in place
    assert commands["dev-storage-gpu-dev-01"].urn in directories.dependencies
    assert "W3KA-PASS" not in directories.inputs["create"]
    assert "dev-storage-gpu-dev-01-member" not in commands


def test_the_roll_brings_a_site_clusters_client_back_after_a_driver_change_and_checks_its_mount():
    from components.nodes import NodePoolArgs
    from components.nodes.node_pool import render_pool_preparation
    for storage, restart in ((WEKA, "timeout 300 weka local restart client"),
                             (SCALE, "timeout 600 /usr/lpp/mmfs/bin/mmstartup")):
        spec = spec_of(storage)
        args = NodePoolArgs.from_spec(spec, spec.node_pools[0])
        roll = render_pool_preparation(args).roll_for_host(spec.node_pools[0].hosts[0], "a" * 64).create
        guarded = roll[roll.index('if [[ " ${due[*]} " == *" driver "* ]]; then'):]
        assert restart in guarded.split("\nfi\n")[0]
        assert f"findmnt -rn {spec.storage.mount_point}" in roll
        assert roll.index("is mounted and answers") < roll.index("the health monitors judge this host again")
    dev = NodePoolArgs.from_spec(parse_spec(yaml.safe_dump(with_storage(WEKA))), spec.node_pools[0])
    assert dev.filesystem is not None and dev.filesystem.kind == "wekafs"


# --- WEKA's CSI plugin ------------------------------------------------------------------------------------

# weka/csi-wekafs v2.8.8: the dir/v1 StorageClass parameters the driver reads
# (examples/dynamic_directory/storageclass-wekafs-dir-api.yaml) and the API secret's keys
# (examples/common/csi-wekafs-api-secret.yaml).
DIR_V1_PARAMETERS = {"volumeType", "filesystemName", "ownerUid", "ownerGid", "permissions", "capacityEnforcement"} | {
    f"csi.storage.k8s.io/{use}-secret-{key}" for use in ("provisioner", "controller-publish", "controller-expand",
                                                          "node-stage", "node-publish") for key in ("name", "namespace")}
API_SECRET_KEYS = {"username", "password", "organization", "endpoints", "scheme", "localContainerName",
                   "autoUpdateEndpoints", "nfsTargetIps", "caCertificate"}


def go_parse_int_base0(value: str) -> int:
    """Go's strconv.ParseInt(value, 0, 32), which the driver reads `permissions` with: a leading 0 is octal."""
    if value.startswith(("0x", "0X")):
        return int(value[2:], 16)
    if value.startswith(("0o", "0O")):
        return int(value[2:], 8)
    return int(value, 8) if value.startswith("0") and len(value) > 1 else int(value, 10)


def test_each_tenant_gets_a_storage_class_of_directory_volumes_owned_by_its_group_with_a_hard_quota():
    from components.storage.csi import render_storage_classes
    spec = spec_of(WEKA)
    layout = plan_layout(spec)
    [sc] = render_storage_classes(spec, layout.project_ids)
    params = sc.obj["parameters"]
    assert set(params) <= DIR_V1_PARAMETERS and sc.obj["provisioner"] == "csi.weka.io"
    assert params["capacityEnforcement"] == "HARD" and params["volumeType"] == "dir/v1"
    assert params["ownerGid"] == str(layout.project_ids["team-b"]) and params["filesystemName"] == "wfs"
    assert go_parse_int_base0(params["permissions"]) == 0o770       # "2770" would be decimal, 0o5322
    assert sc.obj["metadata"]["name"] == "wfs-team-b" and sc.obj["reclaimPolicy"] == "Retain"


def test_the_csi_api_secret_names_the_backends_and_takes_https_from_weka_4_3():
    from components.storage.csi import api_secret_data
    data = api_secret_data(spec_of(WEKA))
    assert set(data) | {"password"} <= API_SECRET_KEYS
    assert data["endpoints"] == "10.10.0.41:14000,10.10.0.42:14000" and data["scheme"] == "https"
    old = with_storage(WEKA)
    old["storage"]["version"] = "4.2"
    assert api_secret_data(parse_spec(yaml.safe_dump(old)))["scheme"] == "http"


def test_the_csi_chart_pulls_every_image_through_the_mirror():
    from components.k8s.images import through_mirror
    from components.storage.csi import chart_images, render_values
    data = with_storage(WEKA)
    data["kubernetes"]["image_registry"] = "registry.lab.example.internal/mirror"
    spec = parse_spec(yaml.safe_dump(data))
    images = through_mirror(render_values(spec), spec, chart_images(spec))["images"]
    assert all(v.startswith("registry.lab.example.internal/mirror/") for k, v in images.items() if k != "csidriverTag")


def test_the_csi_plugin_comes_after_the_clients_and_its_password_stays_secret(record):
    spec = spec_of(WEKA)

    def program():
        ParallelFilesystem("dev-storage", spec, ssh_key(), api_password=pulumi.Output.secret("W3KA-PASS"))
    run = record(program)
    by_name = {r.name: r for r in run.records}
    plugin = by_name["dev-storage-csi"]
    assert {by_name["dev-storage-gpu-dev-01"].urn, by_name["dev-storage-csi-api-secret"].urn} <= set(
        plugin.dependencies)
    assert plugin.urn in by_name["dev-storage-sc-team-b"].dependencies
    secret = by_name["dev-storage-csi-api-secret"].inputs["stringData"]
    assert "4dabf18193072939515e22adb298388d" in secret      # the whole map is a secret


def test_the_csi_plugin_needs_the_api_user_even_without_quotas():
    data = with_storage(WEKA, api_username=None)
    data["storage"]["quotas"] = False
    assert any("storage.weka.api_username: WEKA's CSI plugin logs in to its API" in p for p in problems_of(data))
    data["storage"]["weka"]["csi"] = {"enabled": False}
    assert problems_of(data) == []


def test_no_tenant_may_claim_from_another_tenants_storage_class():
    from components.k8s.tenancy.tenant import TenantArgs, render_resource_quota, tenancy_of
    data = with_storage(WEKA)
    data["tenants"][0]["storage"] = {"quota_gib": 4096, "filesystem_gib": 1024}
    spec = parse_spec(yaml.safe_dump(data))
    assert tenancy_of(spec).storage_classes == {"team-a": "wfs-team-a", "team-b": "wfs-team-b"}
    hard = {t.name: render_resource_quota(TenantArgs.from_spec(spec, t))["spec"]["hard"] for t in spec.tenants}
    assert hard["team-a"]["wfs-team-b.storageclass.storage.k8s.io/persistentvolumeclaims"] == "0"
    assert not any("wfs-team-a" in k for k in hard["team-a"])
    plain = parse_spec(yaml.safe_dump(with_storage(WEKA, csi={"enabled": False})))
    assert tenancy_of(plain).storage_classes == {}


# --- Storage Scale's CSI driver ---------------------------------------------------------------------------

# IBM/ibm-spectrum-scale-csi v2.14.3: the CRD as pinned for the e2e tests (its source in the file's head), and
# driver/csiplugin/controllerserver.go: the StorageClass parameters the driver accepts.
SCALE_CRD = Path(__file__).resolve().parents[2] / "e2e" / "crds" / "csi.ibm.com_csiscaleoperators.yaml"
SCALE_SC_PARAMETERS = {"volBackendFs", "volDirBasePath", "uid", "gid", "permissions", "clusterId", "filesetType",
                       "parentFileset", "inodeLimit", "nodeClass"}
SCALE_CSI = {"enabled": True, "gui_host": "scale-gui-01.example.internal", "gui_username": "csiadmin"}


def test_the_scale_operator_runs_the_driver_on_the_client_nodes_against_the_sites_gui():
    from components.storage import csi
    spec = spec_of(SCALE, csi=SCALE_CSI)
    cr = csi.render_scale_operator(spec).obj
    [cluster] = cr["spec"]["clusters"]
    assert cluster["restApi"] == [{"guiHost": "scale-gui-01.example.internal", "guiPort": 443}]
    assert cluster["id"] == "4711471147114711" and cluster["primary"] == {"primaryFs": "gpfs0"}
    assert cluster["secureSslMode"] is False and "cacert" not in cluster
    assert cr["spec"]["pluginNodeSelector"] == [{"key": "gpucluster.io/filesystem-client", "value": "scale"}]
    verified = csi.render_scale_operator(spec_of(SCALE, csi={**SCALE_CSI, "gui_ca_config_map": "scale-gui-ca"}))
    assert verified.obj["spec"]["clusters"][0]["secureSslMode"] is True
    assert csi.scale_operator_source(spec).endswith("/v2.14.3/generated/installer/ibm-spectrum-scale-csi-operator.yaml")
    metadata, data = csi.scale_gui_secret(spec)
    assert metadata["labels"] == {"product": "ibm-spectrum-scale-csi"} and data == {"username": "csiadmin"}



def test_every_scale_cr_passes_the_crd(shared_dir, tmp_path):
    """Schema only, unknown fields refused (the real apiserver of `make e2e` takes the plan's CR too)."""
    crs = [mirrored_cr(spec) for spec in (
        spec_of(SCALE, csi=SCALE_CSI), spec_of(SCALE, csi={**SCALE_CSI, "gui_ca_config_map": "scale-gui-ca"}),
        mirrored_scale(operator_path="vendor/op.yaml", version="v2.10.10"), mirrored_scale(operator_path="op.yaml"))]
    (tmp_path / "crs.yaml").write_text(yaml.safe_dump_all(crs))
    out = subprocess.run([sys.executable, str(shared_dir / "tools" / "validate_crs.py"), "--crds", str(SCALE_CRD),
                          "--strict-kinds", str(tmp_path / "crs.yaml")], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip().splitlines()[-1] == f"{len(crs)} validated, 0 errors", \
        out.stdout

def test_scale_tenants_get_independent_fileset_classes_of_their_group():
    from components.storage.csi import render_storage_classes
    spec = spec_of(SCALE, csi=SCALE_CSI)
    [sc] = render_storage_classes(spec, plan_layout(spec).project_ids)
    assert sc.obj["provisioner"] == "spectrumscale.csi.ibm.com" and set(sc.obj["parameters"]) <= SCALE_SC_PARAMETERS
    assert sc.obj["parameters"]["filesetType"] == "independent"
    assert sc.obj["parameters"]["gid"] == str(plan_layout(spec).project_ids["team-b"])
    assert spec.storage.secret_settings == ("storageApiPassword",)
    assert spec_of(SCALE).storage.secret_settings == ()


def test_the_scale_driver_comes_after_the_nodes_joined_and_labels_them(record):
    from components.nodes import NodePoolArgs
    from components.nodes.node_pool import node_labels
    spec = spec_of(SCALE, csi=SCALE_CSI)

    def program():
        ParallelFilesystem("dev-storage", spec, ssh_key(), api_password=pulumi.Output.secret("GUI-PASS"))
    by_name = {r.name: r for r in record(program).records}
    driver = by_name["dev-storage-csi-operator-cr"]
    assert {by_name["dev-storage-gpu-dev-01-member"].urn, by_name["dev-storage-csi-operator"].urn,
            by_name["dev-storage-csi-gui-secret"].urn} <= set(driver.dependencies)
    assert driver.urn in by_name["dev-storage-sc-team-b"].dependencies
    pool = spec.node_pools[0]
    assert node_labels(NodePoolArgs.from_spec(spec, pool), pool.hosts[0])["gpucluster.io/filesystem-client"] == "scale"


@pytest.mark.parametrize("settings, expected", [
    ({"csi": {"enabled": True, "gui_username": "csiadmin"}}, "storage.scale.csi.gui_host: the CSI driver needs"),
    ({"csi": {**SCALE_CSI, "operator_url": "https://m.example.internal/op.yaml", "operator_path": "op.yaml"}},
     "storage.scale.csi.operator_path: set operator_url or operator_path, not both"),
])
def test_scale_csi_bad_input_names_the_field(settings, expected):
    found = problems_of(with_storage(SCALE, **settings))
    assert any(expected in p for p in found), found


# --- Storage Scale's CSI images through the site's mirror ---------------------------------------------------

MIRROR = "registry.lab.example.internal/mirror"
# Shaped as IBM's generated/installer/ibm-spectrum-scale-csi-operator.yaml is (a CRD, RBAC, the operator's
# Deployment whose env names the images it starts), written here with made-up references.
INSTALLER = """\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: csiscaleoperators.csi.ibm.com}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: ibm-spectrum-scale-csi-operator, namespace: ibm-spectrum-scale-csi-driver}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: ibm-spectrum-scale-csi-operator, namespace: ibm-spectrum-scale-csi-driver}
spec:
  template:
    spec:
      containers:
      - name: operator
        image: quay.io/ibm-spectrum-scale/ibm-spectrum-scale-csi-operator@sha256:0123
        env:
        - {name: METRICS_BIND_ADDRESS, value: "8383"}
        - name: WATCH_NAMESPACE
          valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
        - {name: CSI_DRIVER_IMAGE, value: "quay.io/ibm-spectrum-scale/ibm-spectrum-scale-csi-driver@sha256:4567"}
        - {name: CSI_ATTACHER_IMAGE, value: "registry.k8s.io/sig-storage/csi-attacher@sha256:89ab"}
"""


def mirrored_cr(spec):
    """The CR as the stack registers it (through the spec's mirror, if any)."""
    from components.k8s.images import through_mirror
    from components.storage import csi
    return through_mirror(csi.render_scale_operator(spec).obj, spec, csi.scale_image_settings(spec))


def mirrored_scale(**csi_settings):
    data = with_storage(SCALE, csi={**SCALE_CSI, **csi_settings})
    data["kubernetes"]["image_registry"] = MIRROR
    return parse_spec(yaml.safe_dump(data))


@pytest.mark.parametrize("version", ["v2.10.10", "v2.14.3"])
def test_through_a_mirror_the_scale_cr_names_every_image_of_its_release_in_the_mirror(version):
    from components.k8s.images import mirrored
    from components.storage import csi
    spec = mirrored_scale(operator_path="vendor/op.yaml", version=version)
    cr = mirrored_cr(spec)["spec"]
    fields = {"spectrumScale", "driverRegistrar", "livenessprobe", "attacher", "provisioner", "snapshotter", "resizer"}
    assert {f: cr[f] for f in fields} == {
        f: mirrored(ref, spec) for f, ref in csi.SCALE_CSI_IMAGES[version].items()}
    assert all(cr[f].startswith(f"{MIRROR}/") and "@sha256:" in cr[f] for f in fields)   # pinned as IBM pins them
    assert not fields & set(mirrored_cr(spec_of(SCALE, csi=SCALE_CSI))["spec"])      # no mirror: IBM's defaults


def test_the_scale_installer_comes_through_the_mirror_with_the_images_it_starts():
    from components.k8s.images import mirrored, through_mirror
    from components.storage import csi
    spec = mirrored_scale(operator_path="vendor/op.yaml")
    objects = through_mirror(csi.scale_operator_objects(INSTALLER), spec)
    assert [o["kind"] for o in objects] == ["CustomResourceDefinition", "ServiceAccount", "Deployment"]
    [operator] = objects[2]["spec"]["template"]["spec"]["containers"]
    assert operator["image"] == mirrored("quay.io/ibm-spectrum-scale/ibm-spectrum-scale-csi-operator@sha256:0123", spec)
    env = {e["name"]: e.get("value") for e in operator["env"]}
    assert env["CSI_DRIVER_IMAGE"] == mirrored("quay.io/ibm-spectrum-scale/ibm-spectrum-scale-csi-driver@sha256:4567",
                                               spec)
    assert env["CSI_ATTACHER_IMAGE"] == mirrored("registry.k8s.io/sig-storage/csi-attacher@sha256:89ab", spec)
    assert all(v.startswith(f"{MIRROR}/") for k, v in env.items() if k.endswith("_IMAGE"))
    assert env["METRICS_BIND_ADDRESS"] == "8383" and env["WATCH_NAMESPACE"] is None
    assert through_mirror(csi.scale_operator_objects(INSTALLER), spec_of(SCALE, csi=SCALE_CSI)) == \
        list(yaml.safe_load_all(INSTALLER))


@pytest.mark.parametrize("text, expected", [
    ("kind: [unclosed", "is not YAML"),
    ("- a list\n", "holds a document that is not a Kubernetes object"),
    ("apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: x}\n", "has no Deployment"),
])
def test_a_file_that_is_not_the_scale_installer_is_refused_saying_why(text, expected):
    from components.storage import csi
    with pytest.raises(ValueError, match=expected):
        csi.scale_operator_objects(text)


def test_a_mirror_needs_the_scale_installer_as_a_file_the_program_rewrites():
    data = with_storage(SCALE, csi=dict(SCALE_CSI))
    data["kubernetes"]["image_registry"] = MIRROR
    found = problems_of(data)
    assert any("storage.scale.csi.operator_path: images come through the mirror" in p and
               "set operator_path" in p for p in found), found
    data["storage"]["scale"]["csi"]["operator_url"] = "https://m.lab.example.internal/op.yaml"
    assert any("installer from https://m.lab.example.internal/op.yaml" in p for p in problems_of(data))
    data["storage"]["scale"]["csi"] = {**SCALE_CSI, "operator_path": "vendor/op.yaml"}
    assert not any("operator_path" in p for p in problems_of(data))


def test_an_installer_file_is_applied_as_its_objects_and_keeps_a_configfiles_objects(record, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "vendor").mkdir()
    (tmp_path / "vendor" / "op.yaml").write_text(INSTALLER)
    spec = mirrored_scale(operator_path="vendor/op.yaml")

    def program():
        ParallelFilesystem("dev-storage", spec, ssh_key(), api_password=pulumi.Output.secret("GUI-PASS"))
    [group] = [r for r in record(program).records if r.name == "dev-storage-csi-operator"]
    assert group.type == "kubernetes:yaml/v2:ConfigGroup"
    images = [c["image"] for o in group.inputs["objs"] if o["kind"] == "Deployment"
              for c in o["spec"]["template"]["spec"]["containers"]]
    assert len(images) == 1 and images[0].startswith(f"{MIRROR}/") and images[0].endswith("-operator@sha256:0123")
    assert any(a.get("spec", {}).get("type") == "kubernetes:yaml/v2:ConfigFile" for a in group.options["aliases"])


def test_the_plan_shows_each_object_of_the_installer_as_a_manifest(record, tmp_path, monkeypatch):
    from components.offline.plan import build_plan
    monkeypatch.chdir(tmp_path)
    (tmp_path / "op.yaml").write_text(INSTALLER)
    spec = mirrored_scale(operator_path="op.yaml")

    def program():
        ParallelFilesystem("dev-storage", spec, ssh_key(), api_password=pulumi.Output.secret("GUI-PASS"))
    files = build_plan(record(program)).files
    deployment = yaml.safe_load(files["manifests/ibm-spectrum-scale-csi-driver/deployment-ibm-spectrum-scale-csi-"
                                      "operator.yaml"])
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"].startswith(f"{MIRROR}/")
    assert "manifests/_cluster/customresourcedefinition-csiscaleoperators.csi.ibm.com.yaml" in files
    cr = yaml.safe_load(files["manifests/ibm-spectrum-scale-csi-driver/csiscaleoperator-ibm-spectrum-scale-csi.yaml"])
    assert cr["spec"]["attacher"].startswith(f"{MIRROR}/")


@pytest.mark.parametrize("content, expected", [
    (None, "storage.scale.csi.operator_path: cannot read vendor/op.yaml (FileNotFoundError"),
    ("apiVersion: v1\nkind: ConfigMap\n", "storage.scale.csi.operator_path: vendor/op.yaml has no Deployment"),
])
def test_an_unreadable_installer_file_fails_the_run_naming_the_field(record, tmp_path, monkeypatch, content, expected):
    monkeypatch.chdir(tmp_path)
    if content is not None:
        (tmp_path / "vendor").mkdir()
        (tmp_path / "vendor" / "op.yaml").write_text(content)
    spec = mirrored_scale(operator_path="vendor/op.yaml")

    def program():
        ParallelFilesystem("dev-storage", spec, ssh_key(), api_password=pulumi.Output.secret("GUI-PASS"))
    with pytest.raises(Exception, match=expected.replace("(", r"\(")):
        record(program)


def test_with_an_operator_driver_gds_comes_from_the_operator_and_the_host_step_does_not_wait_for_it():
    from components.k8s.platform.gpu_operator import render_gpu_operator_values
    host_driver = spec_of(SCALE, gds=True)
    assert "nvidia_fs" in render_scale_node(host_driver, plan_layout(host_driver), host_driver.node_pools[0],
                                            "gpu-dev-01").create
    assert "gds" not in render_gpu_operator_values(host_driver)
    data = with_storage(SCALE, gds=True)
    data["kubernetes"]["gpu_operator"] = {"driver_managed": True}
    for pool in data["node_pools"]:             # both need a host driver
        pool["burn_in"] = {"enabled": False}
        pool.setdefault("tuning", {})["persistence"] = False
    managed = parse_spec(yaml.safe_dump(data))
    text = render_scale_node(managed, plan_layout(managed), managed.node_pools[0], "gpu-dev-01").create
    assert "nvidia_fs" not in text and "rdma_dev_addr_list" in text
    assert render_gpu_operator_values(managed)["gds"] == {"enabled": True}
    assert "gds" not in render_gpu_operator_values(spec_of(SCALE))


def test_vendored_storage_files_missing_from_the_project_are_refused_with_their_lines(tmp_path):
    from components.spec import SpecError, load_spec
    (tmp_path / "Pulumi.yaml").write_text("name: gpucluster\nruntime: python\n")
    (tmp_path / "stacks").mkdir()
    scale = with_storage(SCALE, csi={**SCALE_CSI, "operator_path": "vendor/scale/op.yaml"})
    scale["kubernetes"]["image_registry"] = MIRROR
    weka = with_storage(WEKA, csi={"enabled": True, "chart_path": "vendor/csi-wekafsplugin"})
    for name, data, expected in (
            ("scale", scale, "storage.scale.csi.operator_path: vendor/scale/op.yaml is not a file in the project"),
            ("weka", weka, "storage.weka.csi.chart_path: vendor/csi-wekafsplugin has no Chart.yaml in the project")):
        spec_file = tmp_path / "stacks" / f"{name}.yaml"
        spec_file.write_text(yaml.safe_dump(data, sort_keys=False))
        with pytest.raises(SpecError) as e:
            load_spec(spec_file)
        [problem] = e.value.problems
        assert problem.startswith(f"{spec_file}:") and expected in problem, problem
    scale_problem = str(load_problem(tmp_path / "stacks" / "scale.yaml"))
    assert "download the release's generated/installer/" in scale_problem and "or set operator_url" not in \
        scale_problem       # a mirror takes only a file
    (tmp_path / "vendor" / "scale").mkdir(parents=True)
    (tmp_path / "vendor" / "scale" / "op.yaml").write_text(INSTALLER)
    assert load_spec(tmp_path / "stacks" / "scale.yaml").storage.scale.csi.operator_path == "vendor/scale/op.yaml"


def load_problem(path):
    from components.spec import SpecError, load_spec
    try:
        load_spec(path)
    except SpecError as e:
        return e
    return None
