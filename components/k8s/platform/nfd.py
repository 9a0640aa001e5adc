"""Node Feature Discovery, installed once for both NVIDIA operators (their bundled copies are turned off)."""

from __future__ import annotations

from typing import Any

from ...spec import ClusterSpec
from ...spec.cluster import OPERATOR_NAMESPACES
from ..helm import Chart
from ..images import NFD_REPOSITORIES, ChartImages, chart_from
from ..labels import system_tolerations

NAMESPACE = OPERATOR_NAMESPACES["nfd"]


def chart(spec: ClusterSpec) -> Chart:
    n = spec.kubernetes.nfd
    return chart_from(n, "oci://registry.k8s.io/nfd/charts/node-feature-discovery", n.chart_version, None)


def chart_images(spec: ClusterSpec) -> ChartImages:
    return ChartImages(NFD_REPOSITORIES)


def render_nfd_values(spec: ClusterSpec) -> dict[str, Any]:
    # The operators select nodes by feature.node.kubernetes.io/pci-<vendor>.present: label PCI devices by
    # vendor for network (02xx) and display (03xx) classes, as the GPU Operator's bundled NFD does.
    return {
        "worker": {
            "config": {"sources": {"pci": {"deviceClassWhitelist": ["02", "0200", "0207", "0300", "0302"],
                                           "deviceLabelFields": ["vendor"]}}},
            "tolerations": system_tolerations(spec),
        },
        "prometheus": {"enable": spec.kubernetes.monitoring.enabled},
    }
