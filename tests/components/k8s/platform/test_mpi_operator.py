"""The MPI operator: its CRD from the pinned release, its controller under restricted pod security, MPIJobs in the
tenants' built-in roles, and Kueue's MPIJob integration on."""

from __future__ import annotations

import kubernetes_validate
import pytest

from components.k8s.images import through_mirror
from components.k8s.platform import kueue, mpi_operator
from components.k8s.gpu_stack import GpuKubernetesStack
from tests.conftest import problems_of


def test_the_crd_comes_from_the_pinned_release_unless_the_site_gives_its_copy(make_spec):
    assert mpi_operator.crd_source(make_spec().kubernetes.mpi_operator) == \
        "https://raw.githubusercontent.com/kubeflow/mpi-operator/v0.8.2/manifests/base/kubeflow.org_mpijobs.yaml"
    mirror = "https://mirror.example.internal/mpi-operator/v0.8.2/kubeflow.org_mpijobs.yaml"
    assert mpi_operator.crd_source(make_spec(lambda d: d["kubernetes"].update(
        mpi_operator={"crd_url": mirror})).kubernetes.mpi_operator) == mirror


def test_the_controller_image_follows_the_version_and_the_mirror(make_spec):
    spec = make_spec(lambda d: d["kubernetes"].update(image_registry="registry.example.internal/mirror"))
    [deployment] = [m.obj for m in mpi_operator.render_mpi_operator(spec) if m.obj["kind"] == "Deployment"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "docker.io/mpioperator/mpi-operator:0.8.2"   # as published; the stack mirrors it
    [container] = through_mirror(deployment, spec)["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.example.internal/mirror/docker.io/mpioperator/mpi-operator:0.8.2"
    assert "--lock-namespace=mpi-operator" in container["args"]


def test_every_object_is_valid_kubernetes_and_the_pod_meets_the_restricted_profile(dev_spec):
    objs = [m.obj for m in mpi_operator.render_mpi_operator(dev_spec)]
    assert [o["kind"] for o in objs] == ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ClusterRole",
                                         "ClusterRole", "Deployment"]
    for obj in objs:
        kubernetes_validate.validate(obj, dev_spec.kubernetes.version, strict=True)
    pod = objs[-1]["spec"]["template"]["spec"]
    sc = pod["containers"][0]["securityContext"]      # Pod Security Standards, restricted profile
    assert sc["runAsNonRoot"] and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert all(set(v) <= {"name", "emptyDir"} for v in pod["volumes"])


def test_tenants_get_mpijobs_through_the_built_in_roles(dev_spec):
    roles = {o["metadata"]["name"]: o for o in (m.obj for m in mpi_operator.render_mpi_operator(dev_spec))
             if o["kind"] == "ClusterRole"}
    edit, view = roles["gpucluster-mpijobs-edit"], roles["gpucluster-mpijobs-view"]
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert "create" in edit["rules"][0]["verbs"] and edit["rules"][0]["resources"] == ["mpijobs", "mpijobs/status"]
    assert view["metadata"]["labels"] == {**view["metadata"]["labels"], "rbac.authorization.k8s.io/aggregate-to-view": "true"}
    assert view["rules"][0]["verbs"] == ["get", "list", "watch"]


def test_kueue_manages_mpijobs(dev_spec):
    assert "kubeflow.org/mpijob" in kueue.render_kueue_config(dev_spec)["integrations"]["frameworks"]


def test_the_controller_waits_for_its_crd_and_namespace(dev_spec, record):
    run = record(lambda: GpuKubernetesStack("dev-k8s", dev_spec), stack="dev")
    by_name = {r.urn.rsplit("::", 1)[-1]: r for r in run.records}
    crd, deployment = by_name["dev-k8s-mpijob-crd"], by_name["dev-k8s-mpi-operator"]
    assert crd.type == "kubernetes:yaml/v2:ConfigFile" and crd.inputs["file"].endswith("/kubeflow.org_mpijobs.yaml")
    assert {crd.urn, by_name["dev-k8s-ns-mpi-operator"].urn} <= set(deployment.dependencies)


def test_disabled_installs_nothing(make_spec, record):
    spec = make_spec(lambda d: d["kubernetes"].update(mpi_operator={"enabled": False}))
    names = [r.urn for r in record(lambda: GpuKubernetesStack("dev-k8s", spec), stack="dev").records]
    assert not [u for u in names if "mpi" in u.rsplit("::", 1)[-1]]


@pytest.mark.parametrize("change,message", [
    ({"version": "v0.5.0"}, "kubernetes.mpi_operator.version: MPI operator v0.5.0 is not known to work with Kueue "
                            "0.19.2's MPIJob integration; known: v0.8.2. Use a known one or set "
                            "allow_unknown_versions: true"),
    ({"crd_url": "file:///srv/crd.yaml"}, "kubernetes.mpi_operator.crd_url: 'file:///srv/crd.yaml' is not an "
                                          "http(s) URL, which Pulumi's ConfigFile fetches; give a file in the "
                                          "project as crd_path instead"),
    ({"crd_url": "https://m.example/crd.yaml", "crd_path": "vendor/crd.yaml"},
     "kubernetes.mpi_operator.crd_path: set crd_url or crd_path, not both"),
])
def test_bad_mpi_operator_settings_are_refused(dev_data, change, message):
    dev_data["kubernetes"]["mpi_operator"] = change
    (msg,) = problems_of(dev_data)
    assert msg.split(": ", 1)[1] == message
