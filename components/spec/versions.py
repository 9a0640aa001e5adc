"""The one place that says which operator versions are known to work together.

Each row was read from the upstream release tags listed in ../shared/schemas/crds/SOURCES.md; a row is added
only after its charts' values and CRDs are checked the same way.
"""

from __future__ import annotations

from typing import NamedTuple


class StackVersions(NamedTuple):
    gpu_operator: str
    network_operator: str
    kueue: str
    nfd: str
    network_images: str          # tag of the Network Operator's component images in nvcr.io/nvidia/mellanox
    notes: str


KNOWN_GOOD: tuple[StackVersions, ...] = (
    StackVersions(
        gpu_operator="v26.7.0", network_operator="26.4.1", kueue="0.19.2", nfd="0.19.0",
        network_images="network-operator-v26.4.1",
        notes="GPU Operator driver managed or preinstalled; OFED from the host (useHostMofed) or DOCA-OFED "
              "through the Network Operator; Kueue API kueue.x-k8s.io/v1beta2"),
)


# MPI operator releases known to work with the Kueue above: Kueue 0.19.2's MPIJob integration is built against
# github.com/kubeflow/mpi-operator v0.8.2 (its go.mod), whose kubeflow.org/v2beta1 MPIJob it suspends and admits.
MPI_OPERATOR_KNOWN: tuple[str, ...] = ("v0.8.2",)


def find(gpu_operator: str, network_operator: str | None, kueue: str, nfd: str) -> StackVersions | None:
    """The known-good row matching these versions; the Network Operator is ignored when it is not installed."""
    for row in KNOWN_GOOD:
        if (row.gpu_operator, row.kueue, row.nfd) == (gpu_operator, kueue, nfd) and \
                network_operator in (None, row.network_operator):
            return row
    return None


def describe_known() -> str:
    return "; ".join(f"gpu_operator {r.gpu_operator}, network_operator {r.network_operator}, kueue {r.kueue}, "
                     f"nfd {r.nfd}" for r in KNOWN_GOOD)
