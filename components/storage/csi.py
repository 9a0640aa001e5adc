"""WEKA's CSI plugin (`csi.weka.io`) in Kubernetes: its pinned chart, the API secret it logs in with, and a
StorageClass per tenant for directory volumes (dir/v1) owned by the tenant's group, with a hard quota each.

Facts, from weka/csi-wekafs v2.8.8: the chart `csi-wekafsplugin` (repository https://weka.github.io/csi-wekafs)
and its values (`images.*`, `nodeSelector`, `nodePluginTolerations`, `pluginConfig.allowInsecureHttps`); the
API secret's keys (examples/common/csi-wekafs-api-secret.yaml: username, password, organization, endpoints as
`<ip>:<port>,...`, scheme; HTTPS is mandatory from WEKA 4.3); the dir/v1 StorageClass parameters
(examples/dynamic_directory/storageclass-wekafs-dir-api.yaml: volumeType, filesystemName, ownerUid, ownerGid,
permissions, capacityEnforcement, and the five csi.storage.k8s.io/*-secret-name/-namespace pairs).
"""

from __future__ import annotations

from typing import Any

from ..k8s.helm import Chart
from ..k8s.images import ChartImages, chart_from
from ..k8s.labels import POOL_LABEL, pool_tolerations
from ..k8s.objects import Manifest
from ..spec import ClusterSpec

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
    tolerations = [dict(t) for t in {tuple(sorted(t.items())): t for p in spec.node_pools
                                     for t in pool_tolerations(p)}.values()]
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
    """Per tenant with a filesystem directory: dir/v1 volumes owned by its group and writable by it, each with
    a hard quota at the claim's size. Reclaim Retain: a deleted claim keeps its data
    for an operator to remove."""
    weka = spec.storage.weka
    assert weka is not None
    secrets = {f"csi.storage.k8s.io/{use}-secret-{key}": value for use in _SECRET_USES
               for key, value in (("name", API_SECRET), ("namespace", NAMESPACE))}
    out = []
    for namespace, gid in sorted(group_ids.items()):
        name = spec.storage.storage_class(namespace)
        out.append(Manifest(f"sc-{namespace}", {
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": name, "labels": {"gpucluster.io/tenant-namespace": namespace}},
            "provisioner": DRIVER, "reclaimPolicy": "Retain", "volumeBindingMode": "Immediate",
            "allowVolumeExpansion": True,
            "parameters": {"volumeType": "dir/v1", "filesystemName": spec.storage.remote_name,
                           "ownerUid": "0", "ownerGid": str(gid), "permissions": PERMISSIONS,
                           "capacityEnforcement": "HARD", **secrets}}))
    return out

