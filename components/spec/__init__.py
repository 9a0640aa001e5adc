"""The cluster spec: one validated model of a whole environment, loaded from stacks/<stack>.yaml."""

from .cluster import SYSTEM_NAMESPACES, ClusterSpec
from .fabric import FabricSpec, RoceSettings
from .hardware import GPU_MODELS, Host, NodePool
from .kubernetes import KubernetesSpec
from .loader import SpecError, load_spec, parse_spec
from .storage import StorageSpec
from .tenants import FlavorQuota, GpuQuota, Share, Tenant

__all__ = [
    "GPU_MODELS", "SYSTEM_NAMESPACES", "ClusterSpec", "FabricSpec", "GpuQuota", "Host", "KubernetesSpec",
    "FlavorQuota", "NodePool", "RoceSettings", "Share", "SpecError", "StorageSpec", "Tenant", "load_spec", "parse_spec",
]
