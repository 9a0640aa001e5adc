"""The data plane as registered: hosts, switches and NCCL agree on QoS and MTU; leaves are not oversubscribed.

The Fabric component registers what it sets per pool's hosts and per switch (`data_plane`), its NCCL settings
(`nccl_env`) and leaf figures (`topology`); tenants carry NCCL settings in ConfigMaps. These checks hold across all
of them, including objects written by other components or programs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from pulumi_policy import EnforcementLevel, ReportViolation, StackValidationArgs, StackValidationPolicy

from .common import CONFIG_MAP, FABRIC, NODE_POOL, intent, metadata, of_type, schema, settings


def _ends(fabric: Any) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(what, settings) of each pool's hosts, the storage servers (when their RDMA rides RoCE) and each managed
    switch."""
    plane = fabric.props.get("data_plane") or {}
    for pool, s in sorted((plane.get("pools") or {}).items()):
        yield f"pool {pool}'s hosts", s
    if plane.get("storage_servers"):
        yield "the storage servers", plane["storage_servers"]
    for switch, s in sorted((plane.get("switches") or {}).items()):
        yield f"switch {switch}", s


def _nccl_settings(resources) -> Iterator[tuple[str, Any, Mapping[str, Any]]]:
    """(where, resource, NCCL settings) from the fabric's outputs and from ConfigMaps that carry them."""
    for fabric in of_type(resources, FABRIC):
        for pool, env in sorted((fabric.props.get("nccl_env") or {}).items()):
            yield f"the fabric's NCCL settings of pool {pool}", fabric, env
    for cm in of_type(resources, CONFIG_MAP):
        data = cm.props.get("data") or {}
        if any(k.startswith("NCCL_") for k in data):
            yield f"ConfigMap {metadata(cm.props).get('namespace')}/{metadata(cm.props).get('name')}", cm, data


def _pfc_single_priority(args: StackValidationArgs, report: ReportViolation) -> None:
    for fabric in of_type(args.resources, FABRIC):
        for what, s in _ends(fabric):
            pfc = list(s.get("pfc_priorities") or [])
            if "priority" in s and pfc != [s["priority"]]:
                report(f"{what} have PFC on priorities {', '.join(f'{p:g}' for p in pfc) or 'none'} but RoCE uses "
                       f"priority {s['priority']:g}; "
                       f"enable PFC on exactly that one priority", fabric.urn)


def _qos_consistent(args: StackValidationArgs, report: ReportViolation) -> None:
    for fabric in of_type(args.resources, FABRIC):
        ends = [(what, s) for what, s in _ends(fabric) if "priority" in s]
        if not ends:
            continue
        first_what, first = ends[0]
        for what, s in ends[1:]:
            for key in ("priority", "dscp"):
                if s.get(key) != first.get(key):
                    report(f"{what} use RoCE {key} {s.get(key):g} but {first_what} use {first.get(key):g}; one "
                           f"{key} on every host and switch", fabric.urn)
        dscp = int(first.get("dscp"))
        for where, resource, env in _nccl_settings(args.resources):
            tc = env.get("NCCL_IB_TC")
            if tc is not None and (int(tc) >> 2) != dscp:
                report(f"{where} set NCCL_IB_TC={tc} (DSCP {int(tc) >> 2}) but hosts and switches carry RoCE on "
                       f"DSCP {dscp}; set NCCL_IB_TC={dscp << 2 | 2}", resource.urn)


def _mtu_consistent(args: StackValidationArgs, report: ReportViolation) -> None:
    for fabric in of_type(args.resources, FABRIC):
        plane = fabric.props.get("data_plane") or {}
        pools = sorted((plane.get("pools") or {}).items())
        if plane.get("storage_servers"):
            pools.append(("storage servers", plane["storage_servers"]))
        if not pools:
            continue
        mtus = {p: s.get("mtu_bytes") for p, s in pools}
        host_mtu = pools[0][1].get("mtu_bytes")
        if len(set(mtus.values())) > 1:
            report("hosts of the data plane use different MTUs ("
                   + ", ".join(f"{p}: {m:g}" for p, m in mtus.items()) + "); use one MTU on every host", fabric.urn)
        for switch, s in sorted((plane.get("switches") or {}).items()):
            if (s.get("mtu_bytes") or 0) < max(m or 0 for m in mtus.values()):
                report(f"switch {switch} has MTU {s.get('mtu_bytes') or 0:g}, below the hosts' {host_mtu:g}: it drops "
                       "their largest frames; give every switch at least the hosts' MTU", fabric.urn)


def _nccl_hca_exact(args: StackValidationArgs, report: ReportViolation) -> None:
    for where, resource, env in _nccl_settings(args.resources):
        hca = env.get("NCCL_IB_HCA")
        if hca is not None and not str(hca).startswith("="):
            report(f"{where} set NCCL_IB_HCA={hca}, a prefix match (mlx5_1 also matches mlx5_10 and up); prefix "
                   f"it with '=' for exact names: NCCL_IB_HCA={'=' + str(hca).lstrip('^')}", resource.urn)


def _oversubscription(max_default: float, advice: str):
    config_schema = schema(maxRatio={"type": "number", "minimum": 1, "default": max_default,
                                     "description": "Highest downlink:uplink ratio of a leaf serving training pools."})

    def validate(args: StackValidationArgs, report: ReportViolation) -> None:
        limit = settings(args, config_schema)["maxRatio"]
        training = {intent(p).get("pool", {}).get("name") for p in of_type(args.resources, NODE_POOL)
                    if (intent(p).get("pool") or {}).get("workload", "training") == "training"}
        for fabric in of_type(args.resources, FABRIC):
            for leaf, s in sorted(((fabric.props.get("topology") or {}).get("leaves") or {}).items()):
                ratio = s.get("oversubscription")
                pools = sorted(set(s.get("pools") or []) & training)
                if ratio is not None and pools and ratio > limit:
                    report(f"leaf {leaf} is oversubscribed {ratio:g}:1 ({s.get('down_gbps'):g} Gb/s down, "
                           f"{s.get('up_gbps'):g} Gb/s up) and serves training pool(s) {', '.join(pools)}; "
                           f"{advice} at most {limit:g}:1", fabric.urn)
    return validate, config_schema


_OVER, _OVER_SCHEMA = _oversubscription(2.0, "add uplinks or spread the hosts for")
_BLOCKING, _BLOCKING_SCHEMA = _oversubscription(1.0, "a non-blocking fabric (add uplinks) gives collectives")

FABRIC_POLICIES = [
    StackValidationPolicy(
        name="fabric-pfc-single-priority",
        description="Checks that hosts and switches enable PFC on exactly the one RoCE priority.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=_pfc_single_priority),
    StackValidationPolicy(
        name="fabric-qos-consistent",
        description="Checks that hosts, switches and NCCL_IB_TC use the same RoCE priority and DSCP.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=_qos_consistent),
    StackValidationPolicy(
        name="fabric-mtu-consistent",
        description="Checks that every host of the data plane has the same MTU and no switch has a smaller one.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=_mtu_consistent),
    StackValidationPolicy(
        name="fabric-nccl-hca-exact",
        description="Checks that NCCL_IB_HCA names devices exactly ('=' prefix).",
        enforcement_level=EnforcementLevel.MANDATORY, validate=_nccl_hca_exact),
    StackValidationPolicy(
        name="fabric-leaf-oversubscription",
        description="Checks that leaves serving training pools are oversubscribed at most 2:1.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=_OVER, config_schema=_OVER_SCHEMA),
    StackValidationPolicy(
        name="fabric-leaf-nonblocking",
        description="Checks that leaves serving training pools are non-blocking (1:1).",
        enforcement_level=EnforcementLevel.ADVISORY, validate=_BLOCKING, config_schema=_BLOCKING_SCHEMA),
]
