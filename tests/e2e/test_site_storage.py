"""A WEKA and a Storage Scale cluster's tenants on the real control plane: the plan's StorageClasses and quotas
accepted by the apiserver, a tenant's claim from its own class bound, and one from another tenant's class refused
by the real ResourceQuota admission. WEKA's chart, pinned in tests/e2e/charts (no proxy reachable from CI serves
it), rendered by the real helm with the values the plan wrote and applied: its CSIDriver registered, its node
plugin placed on every client host by the DaemonSet controller. Scale's CSIScaleOperator, as the plan renders it,
taken by the apiserver under the CRD of the pinned release (tests/e2e/crds).

What stands in: the drivers' controllers. WEKA's external-provisioner would answer a claim of a `csi.weka.io` class with a PersistentVolume for a dir/v1
volume (volume handle `dir/v1/<filesystem>/<directory>`); the test makes that PersistentVolume, and the real PV
controller binds the claim to it. The chart's pods are KWOK's (nothing runs in them), so no node plugin mounts
anything and no pod uses the claim. IBM's operator, which would turn the CR into the driver's pods, is not run
(its image is not here); its fileset classes take a claim as WEKA's do.
"""

from __future__ import annotations

import copy
import os
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from components.storage import csi
from tests.components.storage.client_specs import SCALE, WEKA, with_storage

from .conftest import Cluster, running_cluster
from .controlplane import TOOLS

WEKA_CHART = Path(os.environ.get("GPUCLUSTER_E2E_WEKA_CHART") or Path(__file__).parent / "charts" / "csi-wekafsplugin")

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


@pytest.fixture(scope="module")
def scale(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    work: Path = tmp_path_factory.mktemp("e2e-scale")
    data = with_storage(SCALE, csi={"enabled": True, "gui_host": "scale-gui-01.example.internal",
                                    "gui_username": "csiadmin"})
    data["tenants"][0]["storage"] = {"quota_gib": 4096, "filesystem_gib": 1024, "group_id": 20001}
    data["kubernetes"]["mpi_operator"] = {"enabled": False}
    path = work / "dev-scale.yaml"
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


def test_wekas_chart_takes_the_plans_values_and_runs_its_node_plugin_on_every_client(weka: Cluster):
    """The real chart: helm checks the values against the chart's values.schema.json, the apiserver takes what
    it renders, and the DaemonSet controller places the node plugin on each GPU host (its pool's taint tolerated)
    and nowhere else."""
    chart, cp, spec = WEKA_CHART, weka.cp, weka.spec
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    assert (meta["name"], meta["version"]) == (csi.chart(spec).name, csi.chart(spec).version)
    values = weka.plan.dir / "helm" / f"{csi.NAMESPACE}-{csi.RELEASE}.values.yaml"
    proc = subprocess.run([str(TOOLS / "bin" / "helm"), "template", csi.RELEASE, str(chart), "--namespace",
                           csi.NAMESPACE, "--kube-version", f"{spec.kubernetes.version}.0", "--values", str(values)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    objects = [o for o in yaml.safe_load_all(proc.stdout) if o]
    cp.apply_objects(copy.deepcopy(objects), dry_run=True)
    cp.apply_objects(objects)
    assert cp.get("csidriver", csi.DRIVER)["spec"]["fsGroupPolicy"] == "File"    # what PERMISSIONS relies on
    clients = {h.hostname for p in spec.node_pools for h in p.hosts}
    deadline = time.monotonic() + 90
    while True:
        pods = cp.get("pods", namespace=csi.NAMESPACE, selector="component=csi-wekafs-node")["items"]
        placed = {p["spec"].get("nodeName") for p in pods}
        if placed == clients or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert placed == clients, (placed, clients)
    assert cp.get("daemonset", "csi-wekafs-node", namespace=csi.NAMESPACE)["status"]["desiredNumberScheduled"] == \
        len(clients)

    images = {c["image"] for o in objects if o["kind"] in ("Deployment", "DaemonSet")
              for c in o["spec"]["template"]["spec"]["containers"]}
    assert images == {f"{csi.WEKA_CSI_IMAGES['images.csidriver']}:v{csi.chart(spec).version}",
                      *(v for k, v in csi.WEKA_CSI_IMAGES.items() if k != "images.csidriver")}


def test_the_scale_cr_is_taken_whole_and_a_tenant_claims_only_from_its_own_fileset_class(scale: Cluster):
    from components.storage.csi import SCALE_NAMESPACE, SCALE_OPERATOR_CR, render_scale_operator
    cp, spec = scale.cp, scale.spec
    stored = cp.get("csiscaleoperator", SCALE_OPERATOR_CR, namespace=SCALE_NAMESPACE)
    assert stored["spec"] == render_scale_operator(spec).obj["spec"]       # nothing pruned or defaulted away
    classes = {sc["metadata"]["name"]: sc for sc in cp.get("storageclasses")["items"]
               if sc["provisioner"] == "spectrumscale.csi.ibm.com"}
    assert set(classes) == {"gpfs0-team-a", "gpfs0-team-b"}, set(classes)
    assert classes["gpfs0-team-a"]["parameters"]["filesetType"] == "independent"
    assert classes["gpfs0-team-a"]["parameters"]["gid"] == "20001"
    refused = cp.apply_objects([claim("team-a", "theirs", "gpfs0-team-b")], check=False)
    assert refused.returncode != 0 and "gpfs0-team-b.storageclass.storage.k8s.io/persistentvolumeclaims" in \
        refused.stderr, refused.stderr
    cp.apply_objects([claim("team-a", "ours", "gpfs0-team-a")])
    # the stand-in for the driver's provisioner: a fileset volume for this claim
    volume = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pvc-team-a-ours"},
              "spec": {"capacity": {"storage": "100Gi"}, "accessModes": ["ReadWriteMany"],
                       "persistentVolumeReclaimPolicy": classes["gpfs0-team-a"]["reclaimPolicy"],
                       "storageClassName": "gpfs0-team-a",
                       "csi": {"driver": "spectrumscale.csi.ibm.com", "volumeHandle": "team-a-ours"},
                       "claimRef": {"namespace": "team-a", "name": "ours"}}}
    cp.apply_objects([volume])
    deadline = time.monotonic() + 60
    while cp.get("pvc", "ours", namespace="team-a")["status"].get("phase") != "Bound":
        assert time.monotonic() < deadline, cp.get("pvc", "ours", namespace="team-a")["status"]
        time.sleep(1)
