"""GpuKubernetesStack: NFD, the GPU and Network Operators, Kueue, GPU health and monitoring, from spec.kubernetes.

NFD is installed once by this stack and both operators' bundled copies are turned off: one owner, one
version, and neither operator's upgrade can remove the other's node labels.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pulumi
import pulumi_kubernetes as k8s

from ..spec import ClusterSpec
from ..spec.cluster import checked_pools, network_operator_enabled
from ..spec.versions import StackVersions, find
from ..split import part_intent
from ..types import token, with_aliases
from .health import checks as health_checks, detector as health, nvml as health_nvml, quarantine
from .platform import gpu_operator, kueue, monitoring, mpi_operator, network_operator, nfd
from .slurm import cluster as slurm
from .tenancy import networks as tenant_networks
from . import rails
from .helm import release
from .images import through_mirror
from .objects import Manifest, register

# Pod Security level each system namespace really needs: node agents load drivers and read host devices.
NAMESPACE_SECURITY = {nfd.NAMESPACE: "privileged", gpu_operator.NAMESPACE: "privileged",
                      network_operator.NAMESPACE: "privileged", kueue.NAMESPACE: "baseline",
                      mpi_operator.NAMESPACE: "restricted", quarantine.NAMESPACE: "restricted",
                      health_checks.NAMESPACE: "privileged"}      # the check writes its failure on the host


def render_namespaces(spec: ClusterSpec) -> list[Manifest]:
    wanted = [nfd.NAMESPACE, gpu_operator.NAMESPACE, kueue.NAMESPACE]
    if network_operator_enabled(spec):
        wanted.insert(2, network_operator.NAMESPACE)
    if spec.kubernetes.mpi_operator.enabled:
        wanted.append(mpi_operator.NAMESPACE)
    if quarantine.enabled(spec):
        wanted.append(quarantine.NAMESPACE)
    if checked_pools(spec):
        wanted.append(health_checks.NAMESPACE)
    out = []
    for ns in wanted:
        level = NAMESPACE_SECURITY[ns]
        out.append(Manifest(f"ns-{ns}", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {
            "app.kubernetes.io/managed-by": "pulumi", "gpucluster.io/cluster": spec.name,
            "pod-security.kubernetes.io/enforce": level, "pod-security.kubernetes.io/warn": "restricted",
            "pod-security.kubernetes.io/audit": "restricted",
            **(health_checks.namespace_labels() if ns == health_checks.NAMESPACE else {})}}}))
    return out


def stack_versions(spec: ClusterSpec) -> StackVersions | None:
    k = spec.kubernetes
    return find(k.gpu_operator.chart_version, k.network_operator.chart_version if network_operator_enabled(spec)
                else None, k.kueue.chart_version, k.nfd.chart_version)


def network_images_row(spec: ClusterSpec) -> StackVersions:
    """Component images follow the operator's release; an allowed unknown version uses its own tag."""
    row = stack_versions(spec)
    if row is not None:
        return row
    version = spec.kubernetes.network_operator.chart_version
    return StackVersions("", version, "", "", f"network-operator-v{version.lstrip('v')}", "not in the table")


class GpuKubernetesStack(pulumi.ComponentResource):
    """Everything a GPU cluster needs on Kubernetes, installed in dependency order.

    Kueue objects wait for the Kueue release, which Pulumi awaits until the controller's readiness probe
    passes; Kueue's probe passes only once its webhook server is serving, so nothing is created too early.
    """

    TYPE: ClassVar[str] = token("GpuKubernetesStack")

    kueue_ready: list[pulumi.Resource]
    """Resources Kueue objects elsewhere (tenant queues) must depend on."""
    flavors: dict[str, str]
    """Kueue ResourceFlavor per node pool Kueue schedules (pool name -> flavor name)."""
    rdma_resource: str | None
    """Extended resource pods request for RDMA (e.g. rdma/rdma_shared_devices); None without the Network Operator."""
    networks: list[str]
    """Secondary network attachments, in rail order, for the k8s.v1.cni.cncf.io/networks annotation."""

    def __init__(self, name: str, spec: ClusterSpec, opts: pulumi.ResourceOptions | None = None, *,
                 slurm_directory_password: pulumi.Input[str] | None = None, part: str | None = None,
                 platform: pulumi.StackReference | None = None):
        """`slurm_directory_password`: the Slurm login set's directory bind_dn's password, a secret; needed
        where the spec has a bind_dn. `part` and `platform`: as GpuCluster's (README: Split stacks); a shard's
        stack holds its hosts' objects alone (their active checks), under the names the whole would give them."""
        super().__init__(self.TYPE, name, intent(spec), with_aliases(self.TYPE, opts))
        compose(self, name, spec, slurm_directory_password=slurm_directory_password, part=part, platform=platform)


def intent(spec: ClusterSpec) -> dict[str, Any]:
    """A GpuKubernetesStack's registered inputs: the spec's kubernetes section, for policies."""
    return {"spec": spec.kubernetes.model_dump(mode="json")}


def compose(stack: Any, name: str, spec: ClusterSpec, *,
            slurm_directory_password: pulumi.Input[str] | None = None, part: str | None = None,
            platform: pulumi.StackReference | None = None) -> None:
    """A GpuKubernetesStack's children and outputs, under `stack`: a GpuKubernetesStack, or the component
    provider's (provider.py)."""
    split = part_intent(spec, part, platform)
    stack.kueue_ready, stack.flavors, stack.rdma_resource, stack.networks = [], {}, None, []

    def put(m: Manifest, opts: pulumi.ResourceOptions) -> pulumi.Resource:
        """Every object registers here, its images pulled through the mirror: renderers name them as published."""
        return register(f"{name}-{m.role}", through_mirror(m.obj, spec), opts)

    if platform is not None:
        # A shard's: its hosts' checks, once the platform stack (their queue, namespace and script) is applied.
        for m in health_checks.render_host_checks(spec, spec.pools_of(part)):
            put(m, pulumi.ResourceOptions(parent=stack, depends_on=[platform]))
        stack.register_outputs({**intent(spec), **split})
        return
    namespaces = {m.obj["metadata"]["name"]: put(m, pulumi.ResourceOptions(parent=stack))
                  for m in render_namespaces(spec)}

    def after(*deps: pulumi.Resource) -> pulumi.ResourceOptions:
        return pulumi.ResourceOptions(parent=stack, depends_on=list(deps))

    def helm(role: str, module: Any, values: dict[str, Any], *deps: pulumi.Resource):
        return release(f"{name}-{role}", role, module.chart(spec), module.NAMESPACE,
                       through_mirror(values, spec, module.chart_images(spec)),
                       after(namespaces[module.NAMESPACE], *deps))

    nfd_release = helm("node-feature-discovery", nfd, nfd.render_nfd_values(spec))
    gpu_release = helm("gpu-operator", gpu_operator, gpu_operator.render_gpu_operator_values(spec), nfd_release)
    net = None
    if network_operator_enabled(spec):
        net = helm("network-operator", network_operator,
                   network_operator.render_network_operator_values(spec), nfd_release)
        for m in [network_operator.render_nic_cluster_policy(spec, network_images_row(spec)),
                  *network_operator.render_secondary_networks(spec)]:
            put(m, after(net))
        for m in tenant_networks.render_network_fence(spec):
            put(m, pulumi.ResourceOptions(parent=stack))
        stack.rdma_resource = rails.rdma_resource(spec)
        stack.networks = rails.network_names(spec)
    kueue_release = helm("kueue", kueue, kueue.render_kueue_values(spec))
    stack.kueue_ready = [kueue_release]
    for m in kueue.render_kueue_objects(spec):
        put(m, after(kueue_release))
    stack.flavors = {p.name: p.name for p in spec.kueue_pools}
    if spec.kubernetes.mpi_operator.enabled:
        # The CRD from the pinned release (upstream ships no chart); the controller starts once it exists.
        crd = k8s.yaml.v2.ConfigFile(f"{name}-mpijob-crd", file=mpi_operator.crd_source(spec.kubernetes.mpi_operator),
                                     opts=pulumi.ResourceOptions(parent=stack))
        for m in mpi_operator.render_mpi_operator(spec):
            put(m, after(namespaces[mpi_operator.NAMESPACE], crd))
    if spec.kubernetes.health.enabled:
        for m in [*health.render_gpu_health(spec), *health_nvml.render_gpu_nvml(spec)]:
            put(m, pulumi.ResourceOptions(parent=stack))
    if quarantine.enabled(spec):
        crd = k8s.yaml.v2.ConfigFile(f"{name}-nodereadinessrule-crd",
                                     file=quarantine.crd_source(spec.kubernetes.health.quarantine),
                                     opts=pulumi.ResourceOptions(parent=stack))
        for m in [*quarantine.render_controller(spec), *quarantine.render_breaker(spec)]:
            put(m, after(namespaces[quarantine.NAMESPACE]))
        for rule in quarantine.render_rules(spec):
            # Its spec is immutable and in its name: a change creates the new rule before the old one goes.
            put(rule, pulumi.ResourceOptions(parent=stack, depends_on=[crd]))
    for m in health_checks.render_health_checks(spec, spec.pools_of(part)):
        # Kueue's webhooks must be serving before a check's Job is created, so that it is queued.
        deps = [kueue_release] + ([namespaces[health_checks.NAMESPACE]]
                                  if m.obj["metadata"].get("namespace") else [])
        put(m, after(*deps))
    if spec.kubernetes.slurm.enabled:
        # After the GPU Operator and Network Operator: slurmd pods ask for the GPUs and RDMA devices they serve.
        stack.slurm = slurm.SlurmCluster(f"{name}-slurm", spec, pulumi.ResourceOptions(parent=stack, depends_on=[
            r for r in (gpu_release, net) if r is not None]), directory_password=slurm_directory_password)
    if spec.kubernetes.monitoring.enabled:
        ns = spec.kubernetes.monitoring.namespace
        for m in (monitoring.render_prometheus_rule(spec, ns), monitoring.render_dashboard(spec, ns)):
            put(m, pulumi.ResourceOptions(parent=stack))
    stack.register_outputs({**intent(spec), "known_good_versions": stack_versions(spec) is not None,
                            "flavors": stack.flavors, "rdma_resource": stack.rdma_resource,
                            "networks": stack.networks, "kueue_release": kueue_release.name, **split})
