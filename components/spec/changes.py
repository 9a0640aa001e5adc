"""Breaking changes to the spec, by release: an error about a field that a release made required, renamed or
removed says which release did it and how to migrate, so a spec written for an earlier release is not met by a
wall of bare "required field is missing". CHANGELOG.md tells the same changes in prose (a test keeps them
together). 0.1.0 is the state the first field review read; 0.2.0 is this one, unreleased."""

from __future__ import annotations

import re
from typing import Literal, NamedTuple

from .common import Loc


class SpecChange(NamedTuple):
    release: str
    field: str                    # dotted, `[]` for any list item: storage.servers[].targets[].raid_level
    kind: Literal["required", "renamed", "removed"]
    migration: str


SPEC_CHANGES: tuple[SpecChange, ...] = (
    SpecChange("0.2.0", "storage.package_repository", "renamed",
               "it is now storage.package_repositories, a list with one repository per OS family: move the mapping "
               "into the list and add os_family (el for a dnf repository, debian for an apt one)"),
    SpecChange("0.2.0", "storage.package_repositories[].os_family", "required",
               "el for a dnf repository, debian for an apt one (one repository served both and pointed apt at RPMs)"),
    SpecChange("0.2.0", "storage.servers[].targets[].raid_level", "required",
               "give the device's redundancy (raid6, raid10, raid1, ...), which the RAID rules check"),
    SpecChange("0.2.0", "storage.servers[].targets[].size_tib", "required",
               "give the device's usable size in TiB (the RAID-5 and capacity rules need it)"),
    SpecChange("0.1.0", "node_pools[].tuning.kubelet_topology_single_numa", "renamed",
               "it is now kubelet_topology_policy: single-numa-node for true (refused where a pod's GPUs span NUMA "
               "nodes), restricted is the usual choice; omit it for none"),
    SpecChange("0.1.0", "fabric.infiniband.partitions[].tenants", "removed",
               "partitions are IPoIB networks and do not isolate tenants' RDMA traffic; remove the field"),
    SpecChange("0.1.0", "fabric.infiniband.partitions[].ipoib", "removed",
               "every partition is an IPoIB network now; remove the field"),
)

_BY_FIELD = {c.field: c for c in SPEC_CHANGES}


def pattern(loc: Loc) -> str:
    """A path as SPEC_CHANGES writes fields: list indexes as `[]`."""
    return re.sub(r"^\.", "", "".join("[]" if isinstance(p, int) else f".{p}" for p in loc))


def change_at(loc: Loc, kinds: tuple[str, ...]) -> SpecChange | None:
    change = _BY_FIELD.get(pattern(loc))
    return change if change is not None and change.kind in kinds else None


def explained(change: SpecChange) -> str:
    verb = {"required": "required since", "renamed": "renamed in", "removed": "removed in"}[change.kind]
    return f"{verb} release {change.release} (CHANGELOG.md): {change.migration}"
