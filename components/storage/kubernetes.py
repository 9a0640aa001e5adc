"""The parallel filesystem in Kubernetes: static PersistentVolumes on the clients' mount, bound one to one to
claims in the tenants' namespaces.

Every GPU host mounts the filesystem (the client scripts), so a volume is a directory of that mount, reachable
from the GPU pools' nodes only. A tenant gets its own directory (read-write, with its quota) and every dataset
(read-only). The claims count against the tenant's ResourceQuota, which the spec checks they fit.
"""

from __future__ import annotations

from typing import Any

from ..k8s.labels import POOL_LABEL
from ..k8s.objects import Manifest
from ..k8s.quantities import binary
from ..spec import ClusterSpec
from .layout import Layout

CLAIM_LABEL = "gpucluster.io/filesystem"


def render_volumes(spec: ClusterSpec, layout: Layout) -> list[Manifest]:
    pools = sorted(p.name for p in spec.node_pools)
    affinity = {"required": {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": POOL_LABEL, "operator": "In", "values": pools}]}]}}
    out = []
    for tenant in spec.tenants:
        ns = tenant.namespace_name
        for claim, path, gib, read_only, _ in spec.filesystem_claims(tenant):
            pv = f"{ns}-{claim}"
            mode = "ReadOnlyMany" if read_only else "ReadWriteMany"
            labels = {CLAIM_LABEL: layout.fs_name}
            volume: dict[str, Any] = {
                "apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": pv, "labels": labels},
                "spec": {"capacity": {"storage": binary(gib, "Gi")}, "accessModes": [mode],
                         "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                         "hostPath": {"path": path, "type": "Directory"},
                         "claimRef": {"namespace": ns, "name": claim}, "nodeAffinity": affinity}}
            claim_obj = {
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": claim, "namespace": ns, "labels": labels},
                "spec": {"accessModes": [mode], "storageClassName": "", "volumeName": pv,
                         "resources": {"requests": {"storage": binary(gib, "Gi")}}}}
            out += [Manifest(f"pv-{pv}", volume), Manifest(f"pvc-{ns}-{claim}", claim_obj)]
    return out
