"""Helm releases: a pinned chart and values rendered by a pure function."""

from __future__ import annotations

from typing import Any, NamedTuple

import pulumi
import pulumi_kubernetes as k8s

NVIDIA_REPO = "https://helm.ngc.nvidia.com/nvidia"


class Chart(NamedTuple):
    name: str                 # chart name in `repo`, or a full oci:// reference when repo is None
    version: str | None      # None for a chart directory in the project
    repo: str | None = None


def release(resource_name: str, release_name: str, chart: Chart, namespace: str, values: dict[str, Any],
            opts: pulumi.ResourceOptions) -> k8s.helm.v3.Release:
    """A Helm release with a fixed name that Pulumi awaits (Helm's --wait): it completes only once the chart's
    own workloads are ready, so resources that depend on it see a serving operator, not applied manifests."""
    return k8s.helm.v3.Release(
        resource_name, name=release_name, chart=chart.name, version=chart.version,
        repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=chart.repo) if chart.repo else None,
        namespace=namespace, create_namespace=False, values=values, skip_await=False, timeout=600, opts=opts)
