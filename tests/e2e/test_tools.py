"""The control plane's pinned versions agree with the stack's (runs in `make test`, needs no tools)."""

from __future__ import annotations

import re

from components.spec.kubernetes import KubernetesSpec
from components.spec.slurm import SLINKY_KNOWN
from components.spec.versions import KNOWN_GOOD, MPI_OPERATOR_KNOWN

from .controlplane import ROOT

TOOLS = ROOT / "e2e" / "tools"


def _required(module: str, path: str) -> str:
    m = re.search(rf"^require {re.escape(path)} v([0-9.]+)$", (TOOLS / module / "go.mod").read_text(), re.M)
    assert m, f"e2e/tools/{module}/go.mod requires no exact version of {path}"
    return m.group(1)


def test_kueue_is_built_at_the_version_the_stack_installs():
    assert _required("kueue", "sigs.k8s.io/kueue") == KNOWN_GOOD[-1].kueue == KubernetesSpec().kueue.chart_version


def test_every_kubernetes_staging_module_is_pinned_to_the_release():
    text = (TOOLS / "kubernetes" / "go.mod").read_text()
    release = _required("kubernetes", "k8s.io/kubernetes")
    staging = re.findall(r"^\t(k8s\.io/[a-z-]+) => \1 v0\.([0-9.]+)$", text, re.M)
    assert len(staging) >= 30
    assert {v for _, v in staging} == {release.split(".", 1)[1]}


def test_the_mpi_operator_is_built_at_the_version_the_stack_installs():
    """The control plane runs the controller and CRD of the release the stack installs, the one Kueue's MPIJob
    integration is built against (Kueue's go.mod)."""
    version = _required("mpi-operator", "github.com/kubeflow/mpi-operator")
    assert f"v{version}" == KubernetesSpec().mpi_operator.version
    assert f"v{version}" in MPI_OPERATOR_KNOWN


def test_slinky_charts_are_those_of_the_release_the_stack_installs():
    version = _required("slinky", "github.com/SlinkyProject/slurm-operator")
    assert version == KubernetesSpec().slurm.version and version in SLINKY_KNOWN


def test_node_problem_detector_is_built_at_the_version_the_stack_deploys():
    assert _required("node-problem-detector", "k8s.io/node-problem-detector") == \
        KubernetesSpec().health.npd_version.lstrip("v")


def test_the_engine_and_the_sdk_generator_are_one_pulumi_release():
    """The CLI that runs the engine test, the generator of the TypeScript SDK and the pinned package metaschema
    (tests/components/pulumi_package_metaschema.json) come from one github.com/pulumi/pulumi/pkg/v3 release."""
    cli = _required("pulumi", "github.com/pulumi/pulumi/pkg/v3")
    generator = re.search(r"^require github\.com/pulumi/pulumi/pkg/v3 v([0-9.]+)$",
                          (ROOT / "e2e" / "sdkgen" / "go.mod").read_text(), re.M)
    assert generator and generator.group(1) == cli == "3.274.1"
