"""Air-gapped sites: every image through one registry mirror, every chart from the source the spec names.

Renderers name images as upstream publishes them; the mirror is applied once, where a stack registers what
it rendered or writes it out (`through_mirror`: GpuKubernetesStack, the Slurm cluster, the fabric's and the
validation suite's checks, the example jobs). The charts' image settings are listed here as the pinned charts'
default values carry them (checked against those defaults in the tests), so a mirror rewrites each one
explicitly instead of trusting a global knob that not every sub-chart honours.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

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


class ChartImages(NamedTuple):
    """A pinned chart's image settings, which its own defaults fill where the values leave them out."""

    repositories: Mapping[str, str] = {}   # value path -> the image repository the chart's defaults hold there
    references: Mapping[str, str] = {}     # value path of a whole image reference -> the chart's default


def _set(values: dict[str, Any], path: str, value: str) -> None:
    *parents, key = path.split(".")
    node = values
    for part in parents:
        node = node.setdefault(part, {})
    node[key] = value


_CONTAINER_LISTS = frozenset({"containers", "initContainers", "ephemeralContainers"})


def _through(node: Any, image: Callable[[str], str], key: str = "") -> Any:
    """A copy of `node` with each image it names rewritten: a container's `image`, the value of a container's
    environment variable named `*_IMAGE` (how operators are told the images they start), and the `repository`
    of an image setting (a chart's `image: {repository, tag}`, or an operator's `{image, repository, version}`)."""
    if isinstance(node, list):
        return [_through(v, image, key) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _through(v, image, k) for k, v in node.items()}
    if key in _CONTAINER_LISTS and isinstance(out.get("image"), str):
        out["image"] = image(out["image"])
    if key in _CONTAINER_LISTS and isinstance(out.get("env"), list):
        out["env"] = [{**e, "value": image(e["value"])} if isinstance(e, dict) and str(e.get("name", "")).endswith(
            "_IMAGE") and isinstance(e.get("value"), str) and e["value"] else e for e in out["env"]]
    if isinstance(out.get("repository"), str) and (key == "image" or isinstance(out.get("image"), str)):
        out["repository"] = image(out["repository"])
    return out


def through_mirror(doc: Any, spec: ClusterSpec, chart: ChartImages | None = None) -> Any:
    """What a stack renders (a manifest, or a chart's values with `chart`, its image settings) with every image
    pulled through the spec's mirror; the very same document without one."""
    if not spec.kubernetes.image_registry:
        return doc
    out = _through(doc, lambda reference: mirrored(reference, spec))
    if chart is not None:
        for path, reference in chart.references.items():
            _set(out, path, mirrored(reference, spec))
        for path, repository in chart.repositories.items():
            _set(out, f"{path}.repository", mirrored(repository, spec))
    return out


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
