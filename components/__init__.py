"""Pulumi components for on-premises GPU clusters; `gpucluster` is the command-line tool."""

from .cluster import GpuCluster
from .fabric import Fabric
from .k8s.tenant import Tenant, TenantArgs
from .spec import ClusterSpec, SpecError, load_spec, parse_spec

__all__ = ["ClusterSpec", "Fabric", "GpuCluster", "SpecError", "Tenant", "TenantArgs", "load_spec", "parse_spec"]
