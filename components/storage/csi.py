"""The site clusters' CSI drivers in Kubernetes, and a StorageClass per tenant with a directory of its own.

WEKA's plugin (`csi.weka.io`): its pinned chart, the API secret it logs in with, and dir/v1 directory volumes
owned by the tenant's group, with a hard quota each.

Facts, from weka/csi-wekafs v2.8.8: the chart `csi-wekafsplugin` (repository https://weka.github.io/csi-wekafs)
and its values (`images.*`, `nodeSelector`, `nodePluginTolerations`, `pluginConfig.allowInsecureHttps`); the
API secret's keys (examples/common/csi-wekafs-api-secret.yaml: username, password, organization, endpoints as
`<ip>:<port>,...`, scheme; HTTPS is mandatory from WEKA 4.3); the dir/v1 StorageClass parameters
(examples/dynamic_directory/storageclass-wekafs-dir-api.yaml: volumeType, filesystemName, ownerUid, ownerGid,
permissions, capacityEnforcement, and the five csi.storage.k8s.io/*-secret-name/-namespace pairs).

Storage Scale's driver (`spectrumscale.csi.ibm.com`), from IBM/ibm-spectrum-scale-csi: the operator's installer
manifest (generated/installer/ibm-spectrum-scale-csi-operator.yaml of the release, namespace
ibm-spectrum-scale-csi-driver), its CSIScaleOperator (operator/config/crd/bases: spec.clusters[] of id, secrets,
secureSslMode, cacert, restApi[] of guiHost and guiPort, primary.primaryFs; the *NodeSelector lists of key and
value; tolerations), the GUI secret (username, password, labelled product=ibm-spectrum-scale-csi) and fileset
StorageClasses (driver/csiplugin/connectors: volBackendFs, clusterId, filesetType, uid, gid, permissions). A
fileset volume's quota is its claim's size where the file system enforces quotas; lightweight volumes
(volDirBasePath) have none, and are not made here.
"""

from __future__ import annotations

from typing import Any

import yaml

from ..k8s.helm import Chart
from ..k8s.images import ChartImages, chart_from
from ..k8s.labels import FILESYSTEM_CLIENT_LABEL, POOL_LABEL, every_pool_tolerations
from ..k8s.objects import Manifest
from ..spec import ClusterSpec
from ..spec.storage import SCALE_CSI_VERSIONS

NAMESPACE = "csi-wekafs"
RELEASE = "csi-wekafs"
API_SECRET = "csi-wekafs-api-secret"
DRIVER = "csi.weka.io"
WEKA_CHART_REPO = "https://weka.github.io/csi-wekafs"
API_PORT = 14000
# The chart's image settings as its values.yaml carries them (full references: the mirror rewrites each one).
WEKA_CSI_IMAGES = {
    "images.livenessprobesidecar": "registry.k8s.io/sig-storage/livenessprobe:v2.18.0",
    "images.attachersidecar": "registry.k8s.io/sig-storage/csi-attacher:v4.11.0",
    "images.provisionersidecar": "registry.k8s.io/sig-storage/csi-provisioner:v6.2.0",
    "images.registrarsidecar": "registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.16.0",
    "images.resizersidecar": "registry.k8s.io/sig-storage/csi-resizer:v2.1.0",
    "images.snapshottersidecar": "registry.k8s.io/sig-storage/csi-snapshotter:v8.5.0",
    "images.csidriver": "quay.io/weka.io/csi-wekafs",
}
# The driver reads `permissions` with Go's strconv.ParseInt(value, 0, 32) (pkg/wekafs/volume.go): only a leading
# 0 makes it octal ("2770" would be decimal 2770), and os.Chmod keeps the permission bits alone, so no setgid:
# new files take the group from the pods' fsGroup, which the kubelet sets (the CSIDriver's fsGroupPolicy File).
PERMISSIONS = "0770"
_SECRET_USES = ("provisioner", "controller-publish", "controller-expand", "node-stage", "node-publish")


def chart(spec: ClusterSpec) -> Chart:
    weka = spec.storage.weka
    assert weka is not None
    return chart_from(weka.csi, "csi-wekafsplugin", weka.csi.chart_version, WEKA_CHART_REPO)


def chart_images(spec: ClusterSpec) -> ChartImages:
    return ChartImages({}, WEKA_CSI_IMAGES)


def api_scheme(spec: ClusterSpec) -> str:
    """http before WEKA 4.3, https from it (the API secret's example: HTTPS is mandatory since 4.3)."""
    return "http" if spec.storage.effective_version == "4.2" else "https"


def render_values(spec: ClusterSpec) -> dict[str, Any]:
    """The node plugin where the WEKA client runs (the GPU pools' nodes, whatever their taints), the controller
    anywhere; images as the chart pins them (the mirror rewrites them where the stack registers the release)."""
    pools = sorted(p.name for p in spec.node_pools)
    tolerations = every_pool_tolerations(spec)
    return {"images": {k.split(".", 1)[1]: v for k, v in WEKA_CSI_IMAGES.items()} | {"csidriverTag": "2.8.8"},
            "node": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": POOL_LABEL, "operator": "In",
                                                             "values": pools}]}]}}}},
            "nodePluginTolerations": tolerations,
            "pluginConfig": {"allowInsecureHttps": False}}


def api_secret_data(spec: ClusterSpec) -> dict[str, str]:
    """The API secret's keys but the password, which the stack's secret gives (a Pulumi secret)."""
    weka = spec.storage.weka
    assert weka is not None and weka.api_username is not None
    return {"username": weka.api_username, "organization": "Root", "scheme": api_scheme(spec),
            "endpoints": ",".join(f"{b}:{API_PORT}" for b in weka.backends)}


def render_storage_classes(spec: ClusterSpec, group_ids: dict[str, int]) -> list[Manifest]:
    """Per tenant with a filesystem directory: volumes owned by its group and writable by it, each with a quota
    at the claim's size (WEKA: dir/v1, HARD; Scale: an independent fileset). Reclaim Retain: a deleted claim
    keeps its data for an operator to remove."""
    storage = spec.storage
    out = []
    for namespace, gid in sorted(group_ids.items()):
        if storage.weka is not None:
            secrets = {f"csi.storage.k8s.io/{use}-secret-{key}": value for use in _SECRET_USES
                       for key, value in (("name", API_SECRET), ("namespace", NAMESPACE))}
            provisioner, parameters = DRIVER, {
                "volumeType": "dir/v1", "filesystemName": storage.remote_name, "ownerUid": "0",
                "ownerGid": str(gid), "permissions": PERMISSIONS, "capacityEnforcement": "HARD", **secrets}
        else:
            assert storage.scale is not None
            provisioner, parameters = SCALE_DRIVER, {
                "volBackendFs": storage.remote_name, "clusterId": storage.scale.cluster_id,
                "filesetType": "independent", "uid": "0", "gid": str(gid), "permissions": "770"}
        out.append(Manifest(f"sc-{namespace}", {
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": storage.storage_class(namespace),
                         "labels": {"gpucluster.io/tenant-namespace": namespace}},
            "provisioner": provisioner, "reclaimPolicy": "Retain", "volumeBindingMode": "Immediate",
            "allowVolumeExpansion": True, "parameters": parameters}))
    return out


# --- Storage Scale ----------------------------------------------------------------------------------------

SCALE_NAMESPACE = "ibm-spectrum-scale-csi-driver"
SCALE_DRIVER = "spectrumscale.csi.ibm.com"
SCALE_SECRET = "scale-gui"
SCALE_OPERATOR_CR = "ibm-spectrum-scale-csi"
# The images the operator runs for each pinned release, by the CSIScaleOperator field that sets each. A field
# set in the CR wins over the operator's CSI_*_IMAGE environment and over its compiled default
# (operator/controllers/syncer/csi_syncer.go getSidecarImage, csi_node.go getImage), so a mirror names each one
# there (scale_image_settings). Sources: the release's generated/installer/ibm-spectrum-scale-csi-operator.yaml (CSI_DRIVER_IMAGE;
# v2.14.3 lists every sidecar there too) and operator/controllers/config/constants.go (v2.10.10's sidecars).


def _sig(name: str, digest: str) -> str:
    return f"registry.k8s.io/sig-storage/{name}@sha256:{digest}"


SCALE_CSI_IMAGES = {
    "v2.10.10": {
        "spectrumScale": "quay.io/ibm-spectrum-scale/ibm-spectrum-scale-csi-driver@sha256:"
                         "fd707136a9c59b9bfc264b15f3df0248b5770e0da3ea3016b668d04ecaac39d5",
        "driverRegistrar": _sig("csi-node-driver-registrar",
                               "f6717ce72a2615c7fbc746b4068f788e78579c54c43b8716e5ce650d97af2df1"),
        "livenessprobe": _sig("livenessprobe", "4dc0b87ccd69f9865b89234d8555d3a614ab0a16ed94a3016ffd27f8106132ce"),
        "attacher": _sig("csi-attacher", "4eb73137b66381b7b5dfd4d21d460f4b4095347ab6ed4626e0199c29d8d021af"),
        "provisioner": _sig("csi-provisioner", "d078dc174323407e8cc6f0f9abd4efaac5db27838f1564d0253d5e3233e3f17f"),
        "snapshotter": _sig("csi-snapshotter", "becc53e25b96573f61f7469923a92fb3e9d3a3781732159954ce0d9da07233a2"),
        "resizer": _sig("csi-resizer", "2e2b44393539d744a55b9370b346e8ebd95a77573064f3f9a8caf18c22f4d0d0"),
    },
    "v2.14.3": {
        "spectrumScale": "quay.io/ibm-spectrum-scale/ibm-spectrum-scale-csi-driver@sha256:"
                         "47b29442f42f9eea44cee07d7ea78df67325953e66eecb69faeb6b4f9913fc6e",
        "driverRegistrar": _sig("csi-node-driver-registrar",
                               "d7138bcc3aa5f267403d45ad4292c95397e421ea17a0035888850f424c7de25d"),
        "livenessprobe": _sig("livenessprobe", "2c5f9dc4ea5ac5509d93c664ae7982d4ecdec40ca7b0638c24e5b16243b8360f"),
        "attacher": _sig("csi-attacher", "69888dba58159c8bc0d7c092b9fb97900c9ca8710d088b0b7ea7bd9052df86f6"),
        "provisioner": _sig("csi-provisioner", "d5e46da8aff7d73d6f00c761dae94472bcda6e78f4f17b3802dc89d44de0111b"),
        "snapshotter": _sig("csi-snapshotter", "5f4bb469fec51147ce157329dab598c758da1b018bad6dad26f0ff469326d769"),
        "resizer": _sig("csi-resizer", "8ddd178ba5d08973f1607f9b84619b58320948de494b31c9d7cd5375b316d6d4"),
    },
}


def scale_csi_version(spec: ClusterSpec) -> str:
    scale = spec.storage.scale
    assert scale is not None
    return scale.csi.version or SCALE_CSI_VERSIONS[spec.storage.effective_version]


def scale_operator_source(spec: ClusterSpec) -> str:
    """The operator's installer: the project's file, the site's URL, or the release's on GitHub."""
    scale = spec.storage.scale
    assert scale is not None
    return scale.csi.operator_path or scale.csi.operator_url or (
        "https://raw.githubusercontent.com/IBM/ibm-spectrum-scale-csi/"
        f"{scale_csi_version(spec)}/generated/installer/ibm-spectrum-scale-csi-operator.yaml")


def scale_gui_secret(spec: ClusterSpec) -> tuple[dict[str, Any], dict[str, str]]:
    """The GUI secret's metadata (the label the driver finds it by) and its keys but the password."""
    scale = spec.storage.scale
    assert scale is not None and scale.csi.gui_username is not None
    return ({"name": SCALE_SECRET, "namespace": SCALE_NAMESPACE, "labels": {"product": "ibm-spectrum-scale-csi"}},
            {"username": scale.csi.gui_username})


def render_scale_operator(spec: ClusterSpec) -> Manifest:
    """The driver's sidecars and node plugin on the client nodes only (IBM requires them on Scale nodes), with
    the GPU pools' taints tolerated."""
    scale = spec.storage.scale
    assert scale is not None and scale.csi.gui_host is not None
    csi = scale.csi
    on_clients = [{"key": FILESYSTEM_CLIENT_LABEL, "value": "scale"}]
    cluster: dict[str, Any] = {"id": scale.cluster_id, "secrets": SCALE_SECRET,
                               "secureSslMode": csi.gui_ca_config_map is not None,
                               "restApi": [{"guiHost": csi.gui_host, "guiPort": csi.gui_port}],
                               "primary": {"primaryFs": spec.storage.remote_name}}
    if csi.gui_ca_config_map:
        cluster["cacert"] = csi.gui_ca_config_map
    return Manifest("csi-operator-cr", {
        "apiVersion": "csi.ibm.com/v1", "kind": "CSIScaleOperator",
        "metadata": {"name": SCALE_OPERATOR_CR, "namespace": SCALE_NAMESPACE},
        "spec": {"clusters": [cluster], "tolerations": every_pool_tolerations(spec),
                 **{f"{part}NodeSelector": on_clients
                    for part in ("plugin", "attacher", "provisioner", "resizer", "snapshotter")}}})


def scale_image_settings(spec: ClusterSpec) -> ChartImages:
    """The CR's image fields, each the release's own image: what a mirror sets (the operator's defaults stand
    without one)."""
    return ChartImages(references={f"spec.{field}": ref
                                   for field, ref in SCALE_CSI_IMAGES[scale_csi_version(spec)].items()})


def scale_operator_objects(text: str) -> list[dict[str, Any]]:
    """The operator's installer (storage.scale.csi.operator_path) as its objects. Raises ValueError saying what
    is wrong with the file."""
    try:
        objects = [o for o in yaml.safe_load_all(text) if o is not None]
    except yaml.YAMLError as e:
        raise ValueError(f"is not YAML ({str(e).splitlines()[0]})") from None
    if not all(isinstance(o, dict) and isinstance(o.get("kind"), str) for o in objects):
        raise ValueError("holds a document that is not a Kubernetes object (no kind)")
    if not any(o["kind"] == "Deployment" for o in objects):
        raise ValueError("has no Deployment, so it is not the operator's installer "
                         "(generated/installer/ibm-spectrum-scale-csi-operator.yaml of the release)")
    return objects
