"""Air-gapped sites: with mirrors set, nothing in a plan points outside them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from components.k8s.images import (GPU_OPERATOR_REPOSITORIES, KUEUE_REPOSITORIES, NETWORK_OPERATOR_REPOSITORIES,
                                   NETWORK_OPERATOR_SRIOV_IMAGES, NFD_REPOSITORIES, chart_from, mirrored)
from components.offline.plan import build_plan, write_plan
from components.offline.runner import run_program
from tests.components.k8s.slurm_specs import with_slurm_pool
from tests.conftest import ROOT, problems_of

REGISTRY = "registry.prod.example.internal/mirror/"
MIRROR_HOSTS = {"registry.prod.example.internal", "charts.prod.example.internal", "repo.prod.example.internal"}
SITE_FIO = "registry.prod.example.internal/tools/fio:3.33"      # the site's own build, pulled as named
VALUES = Path(__file__).resolve().parents[4] / "shared" / "schemas" / "helm-values"


@pytest.fixture(scope="module")
def prod_plan(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("prod")
    write_plan(build_plan(run_program(ROOT, "prod")), out)
    return out


def _walk(value, key=""):
    if isinstance(value, dict):
        yield key, value
        for k, v in value.items():
            yield from _walk(v, k)
    elif isinstance(value, list):
        for v in value:
            yield from _walk(v, key)
    else:
        yield key, value


def images(doc) -> list[str]:
    """Every image a document names: container images, `repository` settings, and full references in lists."""
    found = []
    for key, value in _walk(doc):
        if isinstance(value, dict) and isinstance(value.get("repository"), str):
            found.append(value["repository"])
        elif key == "image" and isinstance(value, str) and "/" in value:
            found.append(value)
        elif key == "images" and isinstance(value, dict):
            found += [v for v in value.values() if isinstance(v, str)]
    return found


def test_every_url_in_the_prod_plan_is_a_mirror(prod_plan):
    hosts = set()
    for path in prod_plan.rglob("*"):
        if path.is_file() and path.name != "topology.svg":            # the SVG namespace is not fetched
            hosts |= set(re.findall(r"(?:https?|oci)://([A-Za-z0-9.-]+)", path.read_text()))
    assert hosts and hosts <= MIRROR_HOSTS, hosts - MIRROR_HOSTS


def plan_images(plan: Path) -> list[tuple[str, str]]:
    """(file, image) for every image every YAML document of a plan names."""
    seen = []
    for path in sorted(plan.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            for image in images(doc or {}):
                seen.append((str(path.relative_to(plan)), image))
    return seen


def test_every_image_in_the_prod_plan_comes_through_the_registry_mirror(prod_plan):
    seen = plan_images(prod_plan)
    outside = [(p, i) for p, i in seen if not i.startswith(REGISTRY) and i != SITE_FIO]
    assert len(seen) > 20 and outside == []
    kinds = {p.split("/")[0] for p, _ in seen}
    assert {"helm", "manifests", "validation", "checks", "jobs"} <= kinds


LAB_MIRROR = "registry.lab.example.internal/mirror"


def _slurm_dev(data: dict) -> None:
    with_slurm_pool(data)
    data["kubernetes"]["mpi_operator"] = {"enabled": True}


def _sriov_staging(data: dict) -> None:
    data["kubernetes"].update(keep_source_registry=False)
    data["kubernetes"]["network_operator"]["rdma_device_plugin"] = "sriov"


@pytest.mark.parametrize("stack, edit", [("dev", _slurm_dev), ("staging", _sriov_staging)],
                         ids=["dev-with-slurm-and-mpi", "staging-with-sriov-flat"])
def test_no_image_in_any_plan_escapes_the_mirror(tmp_path, stack, edit):
    """The mirror is one pass over what a stack registers and writes, so an image a renderer adds is pulled
    through it without the renderer knowing: every stack's plan, Slurm's charts and the SR-IOV sub-chart too."""
    data = yaml.safe_load((ROOT / "stacks" / f"{stack}.yaml").read_text())
    data["kubernetes"]["image_registry"] = LAB_MIRROR
    edit(data)
    spec_file = tmp_path / f"{stack}.yaml"
    spec_file.write_text(yaml.safe_dump(data, sort_keys=False))
    plan = tmp_path / "plan"
    write_plan(build_plan(run_program(ROOT, stack, spec_file=spec_file)), plan)
    seen = plan_images(plan)
    outside = [(p, i) for p, i in seen if not i.startswith(f"{LAB_MIRROR}/")]
    assert len(seen) > 20 and outside == []
    assert {"helm", "manifests", "validation", "checks", "jobs"} <= {p.split("/")[0] for p, _ in seen}


# Where a stack registers or writes out what it rendered: the only modules that apply the mirror.
MIRROR_BOUNDARIES = {"k8s/images.py", "k8s/gpu_stack.py", "k8s/slurm/cluster.py", "k8s/tenancy/jobs.py",
                     "fabric/fabric.py", "validation/suite.py", "storage/filesystem.py"}


def test_renderers_name_images_as_published_and_leave_the_mirror_to_where_the_stack_registers_them():
    applying = set()
    for path in sorted((ROOT / "components").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("images") and \
                    {a.name for a in node.names} & {"mirrored", "through_mirror"}:
                applying.add(str(path.relative_to(ROOT / "components")))
    assert applying <= MIRROR_BOUNDARIES, applying - MIRROR_BOUNDARIES


@pytest.mark.skipif(not VALUES.exists(), reason="../shared/schemas/helm-values is not here")
@pytest.mark.parametrize("values_file,release_file,table", [
    ("gpu-operator_v26.7.0_values.yaml", "gpu-operator-gpu-operator.values.yaml", GPU_OPERATOR_REPOSITORIES),
    ("network-operator_v26.4.1_values.yaml", "network-operator-network-operator.values.yaml",
     NETWORK_OPERATOR_REPOSITORIES),
    ("node-feature-discovery_v0.19.0_values.yaml", "node-feature-discovery-node-feature-discovery.values.yaml",
     NFD_REPOSITORIES),
    ("kueue_v0.19.2_values.yaml", "kueue-system-kueue.values.yaml", KUEUE_REPOSITORIES),
])
def test_no_image_of_a_pinned_chart_escapes_the_mirror(prod_plan, values_file, release_file, table):
    """The chart's own defaults, overlaid with the plan's values as Helm merges them: every image the chart can
    run is pulled through the mirror, so a default this project never mentions cannot slip out."""
    def merge(base, over):
        if isinstance(base, dict) and isinstance(over, dict):
            return {**base, **{k: merge(base.get(k), v) for k, v in over.items()}}
        return over
    defaults = yaml.safe_load((VALUES / values_file).read_text())
    ours = yaml.safe_load((prod_plan / "helm" / release_file).read_text())
    effective = merge(defaults, ours)
    outside = [i for i in images(effective) if i and not i.startswith(REGISTRY)]
    assert outside == []
    for path in table:                                      # the table names real settings of the chart
        node = defaults
        for part in path.split("."):
            node = node[part]
        assert "repository" in node, path


@pytest.mark.skipif(not VALUES.exists(), reason="../shared/schemas/helm-values is not here")
def test_the_sriov_images_are_the_charts_own():
    defaults = yaml.safe_load((VALUES / "network-operator_v26.4.1_values.yaml").read_text())
    assert {k: v.format(v="v26.4.1") for k, v in NETWORK_OPERATOR_SRIOV_IMAGES.items()} == \
        defaults["sriov-network-operator"]["images"]


def test_an_image_keeps_or_drops_its_source_registry(dev_spec):
    mirror = dev_spec.model_copy(update={"kubernetes": dev_spec.kubernetes.model_copy(
        update={"image_registry": "mirror.example:5000/hub"})})
    assert mirrored("nvcr.io/nvidia/pytorch:25.01-py3", dev_spec) == "nvcr.io/nvidia/pytorch:25.01-py3"
    assert mirrored("nvcr.io/nvidia/pytorch:25.01-py3", mirror) == \
        "mirror.example:5000/hub/nvcr.io/nvidia/pytorch:25.01-py3"
    assert mirrored("busybox:1.36", mirror) == "mirror.example:5000/hub/docker.io/busybox:1.36"
    assert mirrored("mirror.example:5000/tools/fio:3.33", mirror) == "mirror.example:5000/tools/fio:3.33"
    assert mirrored("mirror.example/tools/fio:3.33", mirror) == "mirror.example:5000/hub/mirror.example/tools/fio:3.33"
    flat = mirror.model_copy(update={"kubernetes": mirror.kubernetes.model_copy(
        update={"keep_source_registry": False})})
    assert mirrored("nvcr.io/nvidia/pytorch:25.01-py3", flat) == "mirror.example:5000/hub/nvidia/pytorch:25.01-py3"


def test_a_chart_comes_from_its_mirror_or_a_vendored_directory(dev_spec):
    k = dev_spec.kubernetes
    assert chart_from(k.gpu_operator.model_copy(update={"chart_path": "charts/gpu-operator"}), "gpu-operator",
                      "v26.7.0", "https://helm.ngc.nvidia.com/nvidia") == ("./charts/gpu-operator", None, None)
    assert chart_from(k.kueue.model_copy(update={"chart_repository": "oci://mirror.example/charts"}),
                      "oci://registry.k8s.io/kueue/charts/kueue", "0.19.2", None) == \
        ("oci://mirror.example/charts/kueue", "0.19.2", None)
    assert chart_from(k.nfd, "oci://registry.k8s.io/nfd/charts/node-feature-discovery", "0.19.0", None) == \
        ("oci://registry.k8s.io/nfd/charts/node-feature-discovery", "0.19.0", None)


def test_bad_mirror_settings_name_the_field(dev_data):
    dev_data["kubernetes"].update(image_registry="https://mirror.example", gpu_operator={
        "chart_repository": "ftp://charts.example", "chart_path": "../charts"},
        kueue={"chart_repository": "oci://m.example/charts", "chart_path": "charts/kueue"})
    text = "\n".join(problems_of(dev_data))
    assert "kubernetes.image_registry: " in text and "is not a registry host[:port][/path]" in text
    assert "kubernetes.gpu_operator.chart_repository: " in text and "kubernetes.gpu_operator.chart_path: " in text
    assert "kubernetes.kueue.chart_path: set chart_repository or chart_path, not both" in text
