"""The Kubernetes GPU stack: which operators are on, at which pinned chart versions."""

from __future__ import annotations

from pydantic import Field

from .common import DnsLabel, LabelKey, SpecModel

VERSION = r"^v?[0-9]+\.[0-9]+\.[0-9]+$"


class GpuOperatorSettings(SpecModel):
    enabled: bool = Field(True, description="Omitted: the GPU Operator is installed.")
    chart_version: str = Field("v26.7.0", pattern=VERSION, description="Omitted: v26.7.0.")
    driver_managed: bool = Field(
        True, description="Omitted: the operator installs the driver; false uses the driver preinstalled on hosts.")


class NetworkOperatorSettings(SpecModel):
    enabled: bool | None = Field(None, description="Omitted: installed when the fabric is InfiniBand or RoCE.")
    chart_version: str = Field("26.4.1", pattern=VERSION, description="Omitted: 26.4.1.")


class NfdSettings(SpecModel):
    chart_version: str = Field("0.19.0", pattern=VERSION, description="Omitted: 0.19.0.")


class PriorityClass(SpecModel):
    name: DnsLabel
    value: int = Field(ge=-(2**31), le=10**9)
    description: str = Field("", description="Omitted: no description.")


class KueueSettings(SpecModel):
    chart_version: str = Field("0.19.2", pattern=VERSION, description="Omitted: 0.19.2.")
    cohort: DnsLabel = Field("gpu-cluster", description="Cohort every tenant ClusterQueue joins. Omitted: gpu-cluster.")
    fair_sharing: bool = Field(False, description="Omitted: borrowing is first come, first served.")
    priority_classes: list[PriorityClass] = Field(
        default_factory=list, description="WorkloadPriorityClasses. Omitted: none; every workload has priority 0.")
    topology_levels: list[LabelKey] = Field(
        default_factory=lambda: ["gpucluster.io/block", "gpucluster.io/rack", "kubernetes.io/hostname"],
        min_length=1,
        description="Node labels from widest to narrowest for topology-aware scheduling. Omitted: block, rack, host.")


class MonitoringSettings(SpecModel):
    enabled: bool = Field(True, description="Omitted: DCGM metrics, alert rules and dashboards are installed.")
    namespace: DnsLabel = Field("monitoring", description="Namespace of the Prometheus stack. Omitted: monitoring.")
    gpu_temperature_limit_c: int = Field(85, ge=40, le=110, description="Omitted: alert above 85 C.")


class KubernetesSpec(SpecModel):
    version: str = Field("1.33", pattern=r"^1\.[0-9]+$",
                         description="Kubernetes minor version objects are validated against. Omitted: 1.33.")
    gpu_operator: GpuOperatorSettings = Field(default_factory=GpuOperatorSettings)
    network_operator: NetworkOperatorSettings = Field(default_factory=NetworkOperatorSettings)
    nfd: NfdSettings = Field(default_factory=NfdSettings)
    kueue: KueueSettings = Field(default_factory=KueueSettings)
    monitoring: MonitoringSettings = Field(default_factory=MonitoringSettings)
    dns_namespace: DnsLabel = Field("kube-system", description="Namespace of cluster DNS. Omitted: kube-system.")
    allow_unknown_versions: bool = Field(
        False, description="Accept chart versions outside the known-good table. Omitted: they are an error.")
