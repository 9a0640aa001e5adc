"""Air-gapped sites: every image through one registry mirror, every chart from the source the spec names.

The charts' image settings are listed here as the pinned charts' default values carry them (checked against
those defaults in the tests), so a mirror rewrites each one explicitly instead of trusting a global knob that
not every sub-chart honours.
"""

from __future__ import annotations

from typing import Any

from ..spec import ClusterSpec
from ..spec.kubernetes import ChartSource
from .helm import Chart

# value path -> the image repository the pinned chart uses there
GPU_OPERATOR_REPOSITORIES = {
    "validator": "nvcr.io/nvidia", "operator": "nvcr.io/nvidia", "driver": "nvcr.io/nvidia",
    "driver.manager": "nvcr.io/nvidia/cloud-native", "toolkit": "nvcr.io/nvidia/k8s",
    "devicePlugin": "nvcr.io/nvidia", "dcgm": "nvcr.io/nvidia/cloud-native", "dcgmExporter": "nvcr.io/nvidia/k8s",
    "gfd": "nvcr.io/nvidia", "migManager": "nvcr.io/nvidia/cloud-native", "nodeStatusExporter": "nvcr.io/nvidia",
    "gds": "nvcr.io/nvidia/cloud-native", "gdrcopy": "nvcr.io/nvidia/cloud-native",
    "vgpuManager.driverManager": "nvcr.io/nvidia/cloud-native", "vgpuDeviceManager": "nvcr.io/nvidia/cloud-native",
    "vfioManager": "nvcr.io/nvidia/cloud-native", "vfioManager.driverManager": "nvcr.io/nvidia/cloud-native",
    "sandboxDevicePlugin": "nvcr.io/nvidia", "kataSandboxDevicePlugin": "nvcr.io/nvidia/cloud-native",
    "ccManager": "nvcr.io/nvidia/cloud-native", "draDriver": "nvcr.io/nvidia",
}
NETWORK_OPERATOR_REPOSITORIES = {
    "operator": "nvcr.io/nvidia/cloud-native", "operator.ofedDriver.initContainer": "nvcr.io/nvidia/mellanox",
    "maintenance-operator-chart.operator.image": "nvcr.io/nvidia/mellanox",
    "node-feature-discovery.image": "nvcr.io/nvidia/mellanox/node-feature-discovery",
}
NETWORK_OPERATOR_SRIOV_IMAGES = {      # sriov-network-operator.images.<key>: full references
    "operator": "nvcr.io/nvidia/mellanox/sriov-network-operator:network-operator-{v}",
    "sriovConfigDaemon": "nvcr.io/nvidia/mellanox/sriov-network-operator-config-daemon:network-operator-{v}",
    "sriovCni": "nvcr.io/nvidia/mellanox/sriov-cni:network-operator-{v}",
    "ibSriovCni": "nvcr.io/nvidia/mellanox/ib-sriov-cni:network-operator-{v}",
    "ovsCni": "nvcr.io/nvidia/mellanox/ovs-cni-plugin:network-operator-{v}",
    "rdmaCni": "nvcr.io/nvidia/mellanox/rdma-cni:network-operator-{v}",
    "sriovDevicePlugin": "nvcr.io/nvidia/mellanox/sriov-network-device-plugin:network-operator-{v}",
    "sriovDraDriver": "nvcr.io/nvidia/mellanox/dra-driver-sriov:network-operator-{v}",
    "resourcesInjector": "ghcr.io/k8snetworkplumbingwg/network-resources-injector:v1.7.0",
    "webhook": "nvcr.io/nvidia/mellanox/sriov-network-operator-webhook:network-operator-{v}",
}
NFD_REPOSITORIES = {"image": "registry.k8s.io/nfd/node-feature-discovery"}
KUEUE_REPOSITORIES = {"controllerManager.manager.image": "registry.k8s.io/kueue/kueue",
                      "kueueViz.backend.image": "registry.k8s.io/kueue/kueueviz-backend",
                      "kueueViz.frontend.image": "registry.k8s.io/kueue/kueueviz-frontend"}


def mirrored(reference: str, spec: ClusterSpec) -> str:
    """An image (or image repository) as pulled through the spec's mirror; unchanged without one, and unchanged
    when it is already in the mirror's registry (an image the site builds itself, such as its fio image)."""
    k = spec.kubernetes
    if not k.image_registry or reference.startswith(f"{k.image_registry.split('/')[0]}/"):
        return reference
    first, _, rest = reference.partition("/")
    has_host = bool(rest) and ("." in first or ":" in first or first == "localhost")
    host, path = (first, rest) if has_host else ("docker.io", reference)
    return f"{k.image_registry}/{host}/{path}" if k.keep_source_registry else f"{k.image_registry}/{path}"


def _set(values: dict[str, Any], path: str, key: str, value: str) -> None:
    node = values
    for part in path.split(".") if path else []:
        node = node.setdefault(part, {})
    node[key] = value


def with_mirror(values: dict[str, Any], repositories: dict[str, str], spec: ClusterSpec) -> dict[str, Any]:
    """`values` with each listed image repository pulled through the mirror (nothing changes without one)."""
    if spec.kubernetes.image_registry:
        for path, repository in repositories.items():
            _set(values, path, "repository", mirrored(repository, spec))
    return values


def chart_from(source: ChartSource, name: str, version: str, upstream_repo: str | None) -> Chart:
    """The chart as the spec sources it: a vendored directory, a mirror repository or OCI path, or upstream.
    `name` is the chart's name, or its full oci:// reference upstream."""
    if source.chart_path:
        return Chart(f"./{source.chart_path}", None)
    if source.chart_repository:
        short = name.rsplit("/", 1)[-1]
        if source.chart_repository.startswith("oci://"):
            return Chart(f"{source.chart_repository.rstrip('/')}/{short}", version)
        return Chart(short, version, source.chart_repository)
    return Chart(name, version, upstream_repo)
