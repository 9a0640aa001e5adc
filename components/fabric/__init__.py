"""The data-plane fabric: hosts and switches configured together, and NCCL settings to match."""

from .fabric import Fabric

__all__ = ["Fabric"]
