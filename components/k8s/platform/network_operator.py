"""NVIDIA Network Operator: chart values, the NicClusterPolicy and the secondary networks pods attach to."""

from __future__ import annotations

import json
from typing import Any

from ...spec import ClusterSpec
from ...spec.cluster import OPERATOR_NAMESPACES
from ...spec.versions import StackVersions
from ..helm import NVIDIA_REPO, Chart
from ..images import NETWORK_OPERATOR_REPOSITORIES, NETWORK_OPERATOR_SRIOV_IMAGES, ChartImages, chart_from
from ..labels import POOL_LABEL, system_tolerations
from ..objects import Manifest
from ..rails import NETWORK_NAMESPACE, rail_networks, rdma_resource, tenant_networks

NAMESPACE = OPERATOR_NAMESPACES["network_operator"]
POLICY_NAME = "nic-cluster-policy"      # the operator ignores a NicClusterPolicy of any other name
IMAGE_REPOSITORY = "nvcr.io/nvidia/mellanox"
MELLANOX_VENDOR = "15b3"
API = "mellanox.com/v1alpha1"


def chart(spec: ClusterSpec) -> Chart:
    n = spec.kubernetes.network_operator
    return chart_from(n, "network-operator", n.chart_version, NVIDIA_REPO)


def chart_images(spec: ClusterSpec) -> ChartImages:
    """The SR-IOV sub-chart's images are whole references, tagged with the operator's release."""
    version = f"v{spec.kubernetes.network_operator.chart_version.lstrip('v')}"
    return ChartImages(NETWORK_OPERATOR_REPOSITORIES, {f"sriov-network-operator.images.{k}": ref.format(v=version)
                                                       for k, ref in NETWORK_OPERATOR_SRIOV_IMAGES.items()})


def render_network_operator_values(spec: ClusterSpec) -> dict[str, Any]:
    n = spec.kubernetes.network_operator
    values: dict[str, Any] = {
        # The stack's own NFD serves both operators; the operator still ships its NodeFeatureRules for NICs.
        "nfd": {"enabled": False, "deployNodeFeatureRules": True},
        "sriovNetworkOperator": {"enabled": n.rdma_device_plugin == "sriov"},
    }
    return values


def _image(name: str, versions: StackVersions) -> dict[str, str]:
    return {"image": name, "repository": IMAGE_REPOSITORY, "version": versions.network_images}


def render_nic_cluster_policy(spec: ClusterSpec, versions: StackVersions) -> Manifest:
    n = spec.kubernetes.network_operator
    interfaces = sorted({nic.interface for p in spec.node_pools for nic in p.nics})
    link_type = "infiniband" if spec.fabric.kind == "infiniband" else "ether"
    body: dict[str, Any] = {"tolerations": system_tolerations(spec)}
    if n.ofed_driver_version:
        body["ofedDriver"] = {"image": "doca-driver", "repository": IMAGE_REPOSITORY,
                              "version": n.ofed_driver_version}
    if n.rdma_device_plugin == "shared":
        config = {"configList": [{"resourceName": n.rdma_resource_name, "rdmaHcaMax": n.rdma_hca_max,
                                  "selectors": {"vendors": [MELLANOX_VENDOR], "ifNames": interfaces,
                                                "linkTypes": [link_type]}}]}
        body["rdmaSharedDevicePlugin"] = {**_image("k8s-rdma-shared-dev-plugin", versions),
                                          "config": json.dumps(config, sort_keys=True)}
    else:
        config = {"resourceList": [{"resourcePrefix": "nvidia.com", "resourceName": n.rdma_resource_name,
                                    "selectors": {"vendors": [MELLANOX_VENDOR], "pfNames": interfaces,
                                                  "isRdma": True}}]}
        body["sriovDevicePlugin"] = {**_image("sriov-network-device-plugin", versions),
                                     "config": json.dumps(config, sort_keys=True)}
    if n.rail_subnets:
        secondary: dict[str, Any] = {"cniPlugins": _image("plugins", versions), "multus": _image("multus-cni", versions)}
        if spec.fabric.kind == "infiniband":
            secondary["ipoib"] = _image("ipoib-cni", versions)
        body["secondaryNetwork"] = secondary
        body["nvIpam"] = {**_image("nvidia-k8s-ipam", versions), "enableWebhook": False}
    return Manifest("nic-policy", {"apiVersion": API, "kind": "NicClusterPolicy",
                                   "metadata": {"name": POLICY_NAME}, "spec": body})


def render_secondary_networks(spec: ClusterSpec) -> list[Manifest]:
    """Per rail: an nv-ipam IPPool and the network kind the fabric and device plugin call for, shared; then each
    isolated tenant's own of its pools' rails, in its namespace (rails.tenant_networks), from the same pool of
    addresses: the fabric (its partition or VLAN) keeps tenants apart, the namespace keeps their pods to
    their own (tenancy/networks.py)."""
    n = spec.kubernetes.network_operator
    if not n.rail_subnets:
        return []
    rails = sorted({nic.rail for p in spec.node_pools for nic in p.nics})
    out: list[Manifest] = []
    for (rail, interface), name in rail_networks(spec).items():
        if f"ippool-rail-{rail}" not in {m.role for m in out}:
            # one address pool per rail, on the nodes of every pool with that rail
            subnet = n.rail_subnets[rails.index(rail)]
            pools = sorted(p.name for p in spec.node_pools if any(nic.rail == rail for nic in p.nics))
            out.append(Manifest(f"ippool-rail-{rail}", {
                "apiVersion": "nv-ipam.nvidia.com/v1alpha1", "kind": "IPPool",
                "metadata": {"name": f"rail-{rail}", "namespace": NAMESPACE},
                "spec": {"subnet": subnet, "perNodeBlockSize": n.ips_per_node, "nodeSelector": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": POOL_LABEL, "operator": "In", "values": pools}]}]}}}))
        out.append(_network(spec, rail, interface, name, NETWORK_NAMESPACE))
    for namespace, networks in tenant_networks(spec).items():
        out += [_network(spec, rail, interface, name, namespace) for (rail, interface), name in networks.items()]
    return out


def _network(spec: ClusterSpec, rail: int, interface: str, name: str, namespace: str) -> Manifest:
    """One rail's network object, its NetworkAttachmentDefinition `name` in `namespace`."""
    ipam = json.dumps({"type": "nv-ipam", "poolName": f"rail-{rail}"})
    if spec.kubernetes.network_operator.rdma_device_plugin == "sriov":
        kind, spec_ = "HostDeviceNetwork", {"resourceName": rdma_resource(spec), "ipam": ipam}
    elif spec.fabric.kind == "infiniband":
        kind, spec_ = "IPoIBNetwork", {"master": interface, "ipam": ipam}
    else:
        kind, spec_ = "MacvlanNetwork", {"master": interface, "mode": "bridge",
                                         "mtu": spec.fabric.effective_mtu_bytes, "ipam": ipam}
    return Manifest(f"net-{name}", {"apiVersion": API, "kind": kind, "metadata": {"name": name},
                                    "spec": {"networkNamespace": namespace, **spec_}})
