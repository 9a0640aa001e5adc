"""The data plane as registered: hosts, switches and NCCL agree on QoS and MTU; leaves are not oversubscribed.

The Fabric component registers what it sets per pool's hosts and per switch (`data_plane`), its NCCL settings
(`nccl_env`) and leaf figures (`topology`); tenants carry NCCL settings in ConfigMaps. These checks hold across all
of them, including objects written by other components or programs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

from pulumi_policy import EnforcementLevel, ReportViolation, StackValidationArgs, StackValidationPolicy

from .common import (CONFIG_MAP, FABRIC, NODE_POOL, PARTITIONS, TENANT_LABEL, VLANS, containers, dig, environment, guarded,
                     intent, items, labels, mapping, name_of, namespace_of, number, of_type, pod_specs, schema,
                     settings, shown, strings, tenant_namespaces, text)


def _ends(fabric: Any) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(what, settings) of each pool's hosts, the storage servers (when their RDMA rides RoCE) and each managed
    switch."""
    plane = mapping(fabric.props.get("data_plane"))
    for pool, s in sorted(mapping(plane.get("pools")).items()):
        yield f"pool {pool}'s hosts", mapping(s)
    if mapping(plane.get("storage_servers")):
        yield "the storage servers", mapping(plane["storage_servers"])
    for switch, s in sorted(mapping(plane.get("switches")).items()):
        yield f"switch {switch}", mapping(s)


def _nccl_settings(resources) -> Iterator[tuple[str, Any, Mapping[str, Any]]]:
    """(where, resource, NCCL settings) from the fabric's outputs and from ConfigMaps that carry them."""
    for fabric in of_type(resources, FABRIC):
        for pool, env in sorted(mapping(fabric.props.get("nccl_env")).items()):
            yield f"the fabric's NCCL settings of pool {pool}", fabric, mapping(env)
    for cm in of_type(resources, CONFIG_MAP):
        data = mapping(cm.props.get("data"))
        if any(str(k).startswith("NCCL_") for k in data):
            yield f"ConfigMap {namespace_of(cm.props)}/{name_of(cm.props)}", cm, data


def nccl_integer(value: Any) -> int | None:
    """An integer setting as NCCL reads it (src/misc/param.cc: strtoll(value, NULL, 0)): decimal, 0x hex or
    0-led octal, leading blanks and a sign allowed, reading stops at the first other character (none: 0).
    None: unset or empty (NCCL keeps its default)."""
    if number(value) is not None:
        return int(value)
    if not isinstance(value, str) or not value:
        return None
    m = _C_INTEGER.match(value)
    sign, digits = m.group(1), m.group(2) or "0"
    magnitude = int(digits, 16 if digits[:2].lower() == "0x" else 8 if digits.startswith("0") else 10)
    return -magnitude if sign == "-" else magnitude


_C_INTEGER = re.compile(r"\s*([+-]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)?")


def _pfc_single_priority(args: StackValidationArgs, report: ReportViolation) -> None:
    for fabric in of_type(args.resources, FABRIC):
        for what, s in _ends(fabric):
            pfc = list(items(s.get("pfc_priorities")))
            if "priority" in s and pfc != [s["priority"]]:
                report(f"{what} have PFC on priorities {', '.join(shown(p) for p in pfc) or 'none'} but RoCE uses "
                       f"priority {shown(s['priority'])}; enable PFC on exactly that one priority", fabric.urn)


def _qos_consistent(args: StackValidationArgs, report: ReportViolation) -> None:
    for fabric in of_type(args.resources, FABRIC):
        ends = [(what, s) for what, s in _ends(fabric) if "priority" in s]
        if not ends:
            continue
        first_what, first = ends[0]
        for what, s in ends[1:]:
            for key in ("priority", "dscp"):
                if s.get(key) != first.get(key):
                    report(f"{what} use RoCE {key} {shown(s.get(key))} but {first_what} use {shown(first.get(key))}; "
                           f"one {key} on every host and switch", fabric.urn)
        dscp = number(first.get("dscp"))
        if dscp is None:
            continue
        dscp = int(dscp)
        for where, resource, env in _nccl_settings(args.resources):
            given = env.get("NCCL_IB_TC")
            tc = nccl_integer(given)
            if tc is None or (tc & 0xFF) >> 2 == dscp:
                continue
            read = f"={shown(given)}" if given == str(tc) or number(given) is not None else \
                f"={given!r}, which NCCL reads as {tc}"
            meaning = " (DSCP 0, best effort)" if (tc & 0xFF) >> 2 == 0 else f" (DSCP {(tc & 0xFF) >> 2})"
            report(f"{where} set NCCL_IB_TC{read}{meaning} but hosts and switches carry RoCE on DSCP {dscp}; set "
                   f"NCCL_IB_TC={dscp << 2 | 2}", resource.urn)


def _mtu_consistent(args: StackValidationArgs, report: ReportViolation) -> None:
    for fabric in of_type(args.resources, FABRIC):
        plane = mapping(fabric.props.get("data_plane"))
        pools = sorted((p, mapping(s)) for p, s in mapping(plane.get("pools")).items())
        if mapping(plane.get("storage_servers")):
            pools.append(("storage servers", mapping(plane["storage_servers"])))
        mtus = {p: number(s.get("mtu_bytes")) for p, s in pools}
        if not [m for m in mtus.values() if m is not None]:
            continue
        if len(set(mtus.values())) > 1:
            report("hosts of the data plane use different MTUs ("
                   + ", ".join(f"{p}: {shown(m)}" for p, m in mtus.items()) + "); use one MTU on every host",
                   fabric.urn)
        host_mtu = max(m for m in mtus.values() if m is not None)
        for switch, s in sorted(mapping(plane.get("switches")).items()):
            mtu = number(mapping(s).get("mtu_bytes")) or 0
            if mtu < host_mtu:
                report(f"switch {switch} has MTU {shown(mtu)}, below the hosts' {shown(host_mtu)}: it drops their "
                       "largest frames; give every switch at least the hosts' MTU", fabric.urn)


def _nccl_hca_exact(args: StackValidationArgs, report: ReportViolation) -> None:
    """NCCL_IB_HCA (src/misc/utils.cc parseStringList): a leading '^' excludes the list, then a leading '='
    matches names exactly; without '=' each name is a prefix. '^=mlx5_2' is the exact exclude form."""
    for where, resource, env in _nccl_settings(args.resources):
        hca = env.get("NCCL_IB_HCA")
        if not isinstance(hca, str) or not hca:
            continue
        exclude = "^" if hca.startswith("^") else ""
        names = hca[len(exclude):]
        if not names.startswith("="):
            report(f"{where} set NCCL_IB_HCA={hca}, a prefix match (mlx5_1 also matches mlx5_10 and up); put '=' "
                   f"before the names for exact matches: NCCL_IB_HCA={exclude}={names}", resource.urn)


_POOL_LABEL = "gpucluster.io/pool"


def _pinned_pool(pod: Mapping[str, Any]) -> str | None:
    """The node pool a pod spec selects by the pool label (nodeSelector or a required node affinity), if one."""
    pool = text(mapping(pod.get("nodeSelector")).get(_POOL_LABEL))
    terms = dig(pod, "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution",
                "nodeSelectorTerms")
    for term in items(terms):
        for e in items(mapping(term).get("matchExpressions")):
            e = mapping(e)
            values = list(strings(e.get("values")))
            if e.get("key") == _POOL_LABEL and e.get("operator") == "In" and len(values) == 1:
                pool = pool or values[0]
    return pool


def _workload_nccl(args: StackValidationArgs, report: ReportViolation) -> None:
    """A workload's own NCCL setting where the fabric sets that variable: a different value sends its traffic on
    another class, device or interface than the hosts and switches carry (judged by what the resource sets, in
    every pod template of every workload kind the pack knows, whoever registered it). The pool it pins is compared with that pool's settings; one that pins none,
    with every pool's."""
    fabric_env: dict[str, Mapping[str, Any]] = {}
    for fabric in of_type(args.resources, FABRIC):
        fabric_env.update({str(p): mapping(env) for p, env in mapping(fabric.props.get("nccl_env")).items()})
    managed = {k for env in fabric_env.values() for k in env}
    if not managed:
        return
    for r in args.resources:
        for _, pod in pod_specs(r.resource_type, r.props):
            pool = _pinned_pool(pod)
            pools = [pool] if pool in fabric_env else sorted(fabric_env)
            for c in containers(pod):
                for e in items(c.get("env")):
                    name, value = text(mapping(e).get("name")), mapping(e).get("value")
                    if name not in managed or value is None:
                        continue
                    expected = {shown(fabric_env[p][name]) for p in pools if name in fabric_env[p]}
                    if expected and shown(value) not in expected:
                        where = f"{name_of(r.props) or r.name}" + (f" in {namespace_of(r.props)}"
                                                                   if namespace_of(r.props) else "")
                        report(f"{where} (container {text(c.get('name'))}) sets {name}={shown(value)}, but the "
                               f"fabric sets {name}={' or '.join(sorted(expected))} for "
                               f"{'pool ' + pools[0] if len(pools) == 1 else 'its pools'}: remove it and take the "
                               "pool's NCCL settings (its ConfigMap nccl-<pool>, envFrom)", r.urn)


def _oversubscription(max_default: float, advice: str):
    config_schema = schema(maxRatio={"type": "number", "minimum": 1, "default": max_default,
                                     "description": "Highest downlink:uplink ratio of a leaf serving training pools."})

    def validate(args: StackValidationArgs, report: ReportViolation) -> None:
        limit = settings(args, config_schema)["maxRatio"]
        training = {text(dig(p.props, "spec", "pool", "name")) for p in of_type(args.resources, NODE_POOL)
                    if mapping(dig(p.props, "spec", "pool")).get("workload", "training") == "training"}
        for fabric in of_type(args.resources, FABRIC):
            for leaf, s in sorted(mapping(dig(fabric.props, "topology", "leaves")).items()):
                s = mapping(s)
                ratio = number(s.get("oversubscription"))
                pools = sorted(set(strings(s.get("pools"))) & training)
                if ratio is not None and pools and ratio > limit:
                    report(f"leaf {leaf} is oversubscribed {shown(ratio)}:1 ({shown(s.get('down_gbps'))} Gb/s down, "
                           f"{shown(s.get('up_gbps'))} Gb/s up) and serves training pool(s) {', '.join(pools)}; "
                           f"{advice} at most {limit:g}:1", fabric.urn)
    return validate, config_schema


_ISOLATED_SCHEMA = schema(requiredEnvironments={
    "type": "array", "items": {"type": "string"}, "default": ["prod"],
    "description": "Environments whose dedicated pools must be isolated on the fabric."})


_PKEY = re.compile(r"0x[0-9a-fA-F]{1,4}")                 # a partition key as written: 0x and up to 4 hex digits


def _whole(value: Any) -> int | None:
    """A whole number as registered: the engine carries every number as a float."""
    n = number(value)
    return int(n) if n is not None and float(n).is_integer() else None


def _isolated(resources) -> tuple[dict[str, str], dict[str, int], dict[str, int]]:
    """(pool -> tenant it is cut off for, tenant -> partition key, tenant -> VLAN), as the partitions and VLANs
    components registered."""
    pools: dict[str, str] = {}
    pkeys: dict[str, int] = {}
    vlans: dict[str, int] = {}
    for part in [*of_type(resources, PARTITIONS), *of_type(resources, VLANS)]:
        reach = mapping(part.props.get("reach"))
        pools.update({str(g): t for g, r in mapping(reach.get("groups")).items() if (t := text(mapping(r).get("tenant")))})
        pkeys.update({str(t): int(k, 16) for t, k in mapping(reach.get("partitions")).items()
                      if isinstance(k, str) and _PKEY.fullmatch(k)})
        vlans.update({str(t): n for t, v in mapping(reach.get("vlans")).items() if (n := _whole(v)) is not None})
    return pools, pkeys, vlans


def _dedicated_pool_isolated(args: StackValidationArgs, report: ReportViolation) -> None:
    """A dedicated pool's RDMA ports in the shared partition reach every other tenant's hosts: a privileged pod on
    the tenant's own host can send RDMA traffic to anyone's."""
    env = environment(args.resources)
    if env not in settings(args, _ISOLATED_SCHEMA)["requiredEnvironments"]:
        return
    kinds = {text(dig(f.props, "spec", "kind")) for f in of_type(args.resources, FABRIC)}
    if not kinds & {"infiniband", "rocev2"}:
        return
    cut = _isolated(args.resources)[0]
    for r in of_type(args.resources, NODE_POOL):
        pool = mapping(intent(r).get("pool"))
        owner, name = text(pool.get("dedicated_to")), text(pool.get("name"))
        if owner and list(items(pool.get("nics"))) and cut.get(name) != owner:
            fix = "set fabric.{}.isolate_dedicated_pools: true".format("infiniband" if "infiniband" in kinds
                                                                     else "roce")
            report(f"node pool {name} is dedicated to tenant {owner} in {env} but its RDMA ports share the fabric "
                   f"with every other tenant's hosts; {fix}", r.urn)


_PKEY_IN_NAME = re.compile(r"\.([0-9a-fA-F]{4})\b")        # an IPoIB child: <parent>.<pkey>, as the kernel names it
_VLAN_IN_NAME = re.compile(r"\.([0-9]{1,4})$")             # a VLAN device: <parent>.<vid>, as `ip link` names it
# The Network Operator's and the SR-IOV operator's network objects, which render an attachment per namespace.
_NETWORKS = (":NetworkAttachmentDefinition", ":IPoIBNetwork", ":MacvlanNetwork", ":HostDeviceNetwork",
             ":SriovNetwork", ":SriovIBNetwork")


def _named(value: Any, vlans: bool) -> set[int]:
    """The partition keys (or, `vlans`, the VLANs) a network object's settings name: ib-sriov-cni's `pkey` or an
    IPoIB child as master; sriov-cni's and the SR-IOV operator's `vlan` or a VLAN device as master."""
    key, pattern = ("vlan", _VLAN_IN_NAME) if vlans else ("pkey", _PKEY_IN_NAME)

    def number(v: Any) -> int | None:
        if vlans:
            return int(v) if isinstance(v, str) and v.isdigit() else _whole(v)
        return int(v, 16) & 0x7FFF if isinstance(v, str) and _PKEY.fullmatch(v) else None

    def in_name(v: str) -> set[int]:
        return {int(m) if vlans else int(m, 16) & 0x7FFF for m in pattern.findall(v)}

    found: set[int] = set()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return in_name(value)
    if isinstance(value, Mapping):
        for k, v in value.items():
            if k == key and (n := number(v)) is not None:
                found.add(n)
            elif k == "master" and isinstance(v, str):
                found |= in_name(v)
            else:
                found |= _named(v, vlans)
    elif isinstance(value, list):
        for v in value:
            found |= _named(v, vlans)
    return found


def _no_foreign_partition(args: StackValidationArgs, report: ReportViolation) -> None:
    """A tenant's network attachment or NCCL settings for another tenant's partition or VLAN would put its pods
    in it."""
    cut, pkeys, vlans = _isolated(args.resources)
    if not pkeys and not vlans:
        return
    fence = "partition" if pkeys else "VLAN"
    owner_of = {k: t for t, k in (pkeys or vlans).items()}
    tenant_of = {ns: text(labels(r.props).get(TENANT_LABEL)) for ns, r in tenant_namespaces(args.resources).items()}
    for r in args.resources:
        kind = r.resource_type
        if kind.endswith(_NETWORKS):
            spec = mapping(r.props.get("spec"))
            ns = text(spec.get("networkNamespace")) or namespace_of(r.props)
            for key in sorted(_named(dict(spec), bool(vlans)) & set(owner_of)):
                if tenant_of.get(ns) != owner_of[key]:
                    shown = f"{key:#06x}" if pkeys else str(key)
                    report(f"{kind.rsplit(':', 1)[1]} {name_of(r.props) or r.name} puts namespace {ns or 'default'}'s "
                           f"pods in tenant {owner_of[key]}'s {fence} {shown}; create it in "
                           f"{owner_of[key]}'s namespace only", r.urn)
        elif kind == CONFIG_MAP:
            name, ns = name_of(r.props), namespace_of(r.props)
            pool = name[len("nccl-"):] if name and name.startswith("nccl-") else None
            if pool in cut and ns in tenant_of and tenant_of[ns] != cut[pool]:
                where = "P_Key index 0 is" if pkeys else "ports are in"
                report(f"ConfigMap {ns}/{name} gives tenant {tenant_of[ns]} the NCCL settings of pool {pool}, whose "
                       f"{where} tenant {cut[pool]}'s {fence}; remove it", r.urn)


_OVER, _OVER_SCHEMA = _oversubscription(2.0, "add uplinks or spread the hosts for")
_BLOCKING, _BLOCKING_SCHEMA = _oversubscription(1.0, "a non-blocking fabric (add uplinks) gives collectives")

FABRIC_POLICIES = [
    StackValidationPolicy(
        name="fabric-pfc-single-priority",
        description="Checks that hosts and switches enable PFC on exactly the one RoCE priority.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_pfc_single_priority)),
    StackValidationPolicy(
        name="fabric-qos-consistent",
        description="Checks that hosts, switches and NCCL_IB_TC use the same RoCE priority and DSCP.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_qos_consistent)),
    StackValidationPolicy(
        name="fabric-mtu-consistent",
        description="Checks that every host of the data plane has the same MTU and no switch has a smaller one.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_mtu_consistent)),
    StackValidationPolicy(
        name="fabric-nccl-hca-exact",
        description="Checks that NCCL_IB_HCA names devices exactly ('=' prefix).",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_nccl_hca_exact)),
    StackValidationPolicy(
        name="fabric-nccl-workload-settings",
        description="Checks that no workload sets an NCCL variable the fabric sets to another value.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_workload_nccl)),
    StackValidationPolicy(
        name="fabric-dedicated-pool-isolated",
        description="Checks that a pool dedicated to a tenant has its own partition or VLAN on the RDMA fabric in prod.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_dedicated_pool_isolated),
        config_schema=_ISOLATED_SCHEMA),
    StackValidationPolicy(
        name="fabric-no-foreign-partition",
        description="Checks that no network attachment or NCCL settings give a tenant another tenant's partition or "
                    "VLAN.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_no_foreign_partition)),
    StackValidationPolicy(
        name="fabric-leaf-oversubscription",
        description="Checks that leaves serving training pools are oversubscribed at most 2:1.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_OVER), config_schema=_OVER_SCHEMA),
    StackValidationPolicy(
        name="fabric-leaf-nonblocking",
        description="Checks that leaves serving training pools are non-blocking (1:1).",
        enforcement_level=EnforcementLevel.ADVISORY, validate=guarded(_BLOCKING), config_schema=_BLOCKING_SCHEMA),
]
