"""Pulumi components for on-premises GPU clusters; `gpucluster` is the command-line tool.

The components load Pulumi's SDK on first use, so `gpucluster validate` and `schema` start in a fraction of a
second."""

from __future__ import annotations

from typing import Any

from .spec import ClusterSpec, SpecError, load_spec, parse_spec

_LAZY = {"GpuCluster": ".cluster", "Fabric": ".fabric", "Tenant": ".k8s.tenancy.tenant", "TenantArgs": ".k8s.tenancy.tenant",
         "trim_stack_traces": ".stack_traces"}

__all__ = ["ClusterSpec", "Fabric", "GpuCluster", "SpecError", "Tenant", "TenantArgs", "load_spec", "parse_spec",
           "trim_stack_traces"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
