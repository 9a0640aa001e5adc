"""The parallel filesystem: Lustre or BeeGFS servers and clients over SSH, exposed to Kubernetes."""

from .filesystem import ParallelFilesystem
from .layout import Layout, plan_layout

__all__ = ["Layout", "ParallelFilesystem", "plan_layout"]
