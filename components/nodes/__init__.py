from .node_pool import GpuNodePool, NodePoolArgs

__all__ = ["GpuNodePool", "NodePoolArgs"]
