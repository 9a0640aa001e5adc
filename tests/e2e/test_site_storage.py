"""A WEKA cluster's tenants on the real control plane: the plan's StorageClasses and quotas accepted by the
apiserver, a tenant's claim from its own class bound, and one from another tenant's class refused by the real
ResourceQuota admission.

What stands in: the CSI plugin itself (its chart is not reachable from here, README: the parallel filesystem).
Its external-provisioner would answer a claim of a `csi.weka.io` class with a PersistentVolume for a dir/v1
volume (volume handle `dir/v1/<filesystem>/<directory>`); the test makes that PersistentVolume, and the real PV
controller binds the claim to it. No node plugin mounts anything: no pod uses the claim.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from tests.components.storage.client_specs import WEKA, with_storage

from .conftest import Cluster, running_cluster

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def weka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    work: Path = tmp_path_factory.mktemp("e2e-weka")
    data = with_storage(WEKA)
    data["tenants"][0]["storage"] = {"quota_gib": 4096, "filesystem_gib": 1024, "group_id": 20001}
    data["kubernetes"]["mpi_operator"] = {"enabled": False}
    path = work / "dev-weka.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with running_cluster(path, work) as c:
        yield c


def claim(namespace: str, name: str, storage_class: str, gib: int = 100) -> dict:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": namespace},
            "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": storage_class,
                     "resources": {"requests": {"storage": f"{gib}Gi"}}}}


def test_a_tenant_claims_from_its_own_class_and_never_from_another_tenants(weka: Cluster):
    cp = weka.cp
    classes = {sc["metadata"]["name"]: sc for sc in cp.get("storageclasses")["items"]
               if sc["provisioner"] == "csi.weka.io"}
    assert set(classes) == {"wfs-team-a", "wfs-team-b"}
    assert classes["wfs-team-a"]["parameters"]["ownerGid"] == "20001"
    refused = cp.apply_objects([claim("team-a", "theirs", "wfs-team-b")], check=False)
    assert refused.returncode != 0
    assert "exceeded quota: tenant-quota" in refused.stderr and \
        "wfs-team-b.storageclass.storage.k8s.io/persistentvolumeclaims" in refused.stderr, refused.stderr
    cp.apply_objects([claim("team-a", "ours", "wfs-team-a")])
    # the stand-in for the plugin's provisioner: the volume it would make for this claim
    volume = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pvc-team-a-ours"},
              "spec": {"capacity": {"storage": "100Gi"}, "accessModes": ["ReadWriteMany"],
                       "persistentVolumeReclaimPolicy": classes["wfs-team-a"]["reclaimPolicy"],
                       "storageClassName": "wfs-team-a",
                       "csi": {"driver": "csi.weka.io", "volumeHandle": "dir/v1/wfs/csi-volumes/pvc-team-a-ours"},
                       "claimRef": {"namespace": "team-a", "name": "ours"}}}
    cp.apply_objects([copy.deepcopy(volume)])
    deadline = time.monotonic() + 60
    while cp.get("pvc", "ours", namespace="team-a")["status"].get("phase") != "Bound":
        assert time.monotonic() < deadline, cp.get("pvc", "ours", namespace="team-a")["status"]
        time.sleep(1)
    quota = cp.get("resourcequota", "tenant-quota", namespace="team-a")
    static = sum(c.size_gib for c in weka.spec.filesystem_claims(weka.tenant("team-a")))   # its directory, datasets
    assert quota["status"]["used"]["requests.storage"] == f"{static + 100}Gi"
