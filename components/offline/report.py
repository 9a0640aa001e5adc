"""The plan report a reviewer reads: `report.md` (tables of what the spec builds against what it must meet) and
`topology.svg` (racks, nodes, rails, leaves, spines and storage servers, with link speeds and oversubscription).

Pure functions of the validated spec; thresholds come from the policy pack's settings (passed in by the CLI, so
the report and `gpucluster check` judge with the same numbers), and policy results when `check` ran.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from html import escape
from typing import Any, Sequence

from ..k8s.health import nvml as health_nvml
from ..k8s.health.quarantine import conditions as quarantine_conditions
from ..k8s.health.checks import HOST_LABEL, NAMESPACE as HEALTH_CHECKS
from ..k8s.labels import QUARANTINE_TAINT
from ..k8s.health.quarantine import RULE
from ..k8s.slurm.node_check import DRAIN_PREFIX, NO_VERDICT
from ..spec.xids import XidAction
from ..fabric.partitions import fabric_reach
from ..nodes.host_prep import DRIVER_INSTALL_MODEL_S
from ..nodes.rollout import rollout_batches, rollout_model
from ..spec import ClusterSpec, NodePool
from ..spec.cluster import checked_pools
from ..spec.topology import Topology, plan_topology
from ..storage.filesystem import filesystem_outputs
from ..storage.layout import plan_layout


@dataclass(frozen=True)
class Thresholds:
    """What the report measures against; the CLI fills these from the policy pack (its defaults or the stack's
    policy config)."""
    derating: float = 0.8
    min_read_gb_per_s_per_gpu: float = 0.15
    max_oversubscription: float = 2.0
    source: str = "the policy pack's defaults"


@dataclass(frozen=True)
class PolicyResults:
    mandatory: int
    advisory: int
    rows: list[tuple[str, str, str, str]] = field(default_factory=list)   # policy, level, resource, message


def _md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    cell = lambda v: str(v).replace("|", "\\|")  # noqa: E731
    return ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|",
            *["| " + " | ".join(cell(v) for v in r) + " |" for r in rows], ""]


def _driver_stack(pool: NodePool) -> str:
    """What the pool's software settings make preparation and the rollout do with the driver stack."""
    sw = pool.software
    versions = [f"driver {sw.driver_version}" + (" + Fabric Manager" if pool.gpu.nvswitch else "")
                if sw.driver_version else "", f"DOCA-OFED {sw.doca_ofed_version}" if sw.doca_ofed_version else ""]
    named = ", ".join(v for v in versions if v)
    if not named:
        return "-"
    return f"installs {named} from mirrors" if sw.package_repositories else f"checks {named}"


def _largest_job_hosts(spec: ClusterSpec, pool: NodePool) -> int:
    """The hosts of the pool the largest tenant guarantee in it fills (0 with none)."""
    per_host = pool.gpu.count * (pool.sharing.time_slicing_replicas or 1)
    gpus = max((t.gpu_quota[pool.name].nominal for t in spec.tenants if pool.name in t.gpu_quota), default=0)
    return min(len(pool.hosts), -(-gpus // per_host))


def render_report(spec: ClusterSpec, thresholds: Thresholds = Thresholds(),
                  policies: PolicyResults | None = None) -> str:
    topology = plan_topology(spec)[0]
    lines = [f"# Cluster {spec.name} ({spec.environment})", "",
             f"{len(list(spec.hosts()))} nodes, {spec.gpus} GPUs, fabric {spec.fabric.kind}, storage "
             f"{spec.storage.kind}. Thresholds: {thresholds.source}.", "", "![topology](topology.svg)", ""]
    warnings = spec.warnings()
    if warnings:     # legal but risky choices, as the plan's summary prints them
        lines += ["## Warnings", "", *(f"- {w}" for w in warnings), ""]
    lines += ["## GPUs and nodes per pool", ""]
    lines += _md_table(["pool", "workload", "GPU", "hosts", "GPUs", "data NICs", "tenants"], [
        [p.name, p.workload, f"{p.gpu.count} x {p.gpu.model} ({p.gpu.power_w} W)", len(p.hosts), p.gpus,
         f"{len(p.nics)} x {p.nics[0].speed_gbps} Gb/s" if p.nics else "-",
         f"only {p.dedicated_to}" if p.dedicated_to else "shared"] for p in spec.node_pools])

    lines += ["## Rollout per pool", "",
              "A change that restarts kubelet or containerd, or a new driver stack to install (the 'driver stack' "
              "column), reaches hosts where tenants' pods run a batch at a time "
              "(rack by rack): each is cordoned, drained (PodDisruptionBudgets honoured), changed, checked and "
              "given back before the next batch starts; hosts without tenants' pods take it at once. Hosts out of "
              "service already (cordoned, quarantined, not Ready, in a GPU Operator driver upgrade) count against "
              "max unavailable when a drain starts: a host that would exceed it is deferred, left in service. "
              "The GPU Operator's driver upgrades count the rollout's cordoned hosts the same way. A host whose "
              "drain or roll fails stays out, cordoned and tainted `gpucluster.io/rollout=failed`; up to the "
              "'failure budget' of such hosts the later batches go on, one more stops them. The apply ends by "
              "naming every host deferred or failed, and fails while there is any; the next apply tries just "
              "those again. 'Wall time at most' is every batch's drain to its timeout plus the roll's own bounds "
              "(kubelet's return, the fabric ports' return, `dcgmi diag -r 1`; a driver stack install modelled "
              f"at {DRIVER_INSTALL_MODEL_S // 60} min); a job on the largest tenant guarantee's hosts is "
              "stopped at most once per batch it has a host in. A host removed from the spec is drained the same "
              "way (tainted `gpucluster.io/rollout=retiring`), then undone, its kubelet stopped and its Node "
              "deleted; a drain that does not finish keeps it, cordoned, with everything in place.", ""]
    rows = []
    for p in spec.node_pools:
        m = rollout_model(p, rdma=spec.fabric.rdma, host_driver=not (
            spec.kubernetes.gpu_operator.enabled and spec.kubernetes.gpu_operator.driver_managed))
        job = _largest_job_hosts(spec, p)
        rows.append([p.name, len(p.hosts), p.rollout.max_unavailable, m.hosts_per_batch, m.batches,
                     p.rollout.failure_budget_hosts, f"{m.drain_s // 60} min", f"{m.roll_s // 60} min",
                     f"{m.at_most_s / 3600:.3g} h", f"{job} host(s): {m.interruptions(job)}" if job else "-",
                     _driver_stack(p)])
    lines += _md_table(["pool", "hosts", "max unavailable", "hosts a batch", "batches", "failure budget",
                        "drain timeout", "roll at most", "wall time at most", "largest job: stopped at most",
                        "driver stack"], rows)
    lines += ["In order (a batch's first and last host, by rack then name):", ""]
    lines += [f"- {p.name}: " + "; ".join(
        f"{i}) {b[0].hostname}" + (f" .. {b[-1].hostname} ({len(b)})" if len(b) > 1 else "")
        for i, b in enumerate(rollout_batches(p), 1)) for p in spec.node_pools]
    lines.append("")

    lines += ["## Power per rack", "",
              "Peak = each host's GPUs at TDP plus its base power (`host_base_power_w`, or its DGX model's), "
              "storage servers and switches mounted in the rack; budget = PDU capacity (one feed of an A+B pair) "
              f"x {thresholds.derating:.0%}. A rack whose devices' power or PDU redundancy the spec does not give "
              "is unknown, not ok.", ""]
    rows = []
    for name, p in spec.rack_power().items():
        budget = p.capacity_kw * thresholds.derating
        verdict = p.verdict(budget)
        rows.append([name, p.listing(), f"{'>= ' if p.unknown else ''}{p.peak_kw:g}", f"{p.capacity_kw:g}",
                     p.redundancy or "not stated", f"{budget:g}", f"{p.peak_kw / p.capacity_kw:.0%}",
                     verdict if verdict == "ok" else f"**{verdict}**"])
    lines += _md_table(["rack", "at peak", "peak kW", "PDU kW", "redundancy", "budget kW", "PDU load", ""], rows)
    gpu_kw = sum(p.gpus * p.gpu.power_w for p in spec.node_pools) / 1000
    lines += [f"GPUs alone: {gpu_kw:g} kW at TDP.", ""]

    layout = plan_layout(spec)
    if layout is not None:
        o = filesystem_outputs(spec, layout)
        lines += ["## Storage bandwidth per GPU", ""]
        per_gpu = o["read_gb_per_s_per_gpu"]
        verdict = "not estimated" if per_gpu is None else \
            ("ok" if per_gpu >= thresholds.min_read_gb_per_s_per_gpu else "**below target**")
        lines += _md_table(["filesystem", "data servers", "capacity TiB", "aggregate read GB/s", "GPUs",
                            "GB/s per GPU", "target GB/s per GPU", ""],
                           [[f"{o['kind']} {o['version']} {o['fs_name']}", o["data_servers"], f"{o['capacity_tib']:g}",
                             "-" if o["read_gb_per_s"] is None else f"{o['read_gb_per_s']:g}", o["gpus"],
                             "-" if per_gpu is None else f"{per_gpu:g}", f"{thresholds.min_read_gb_per_s_per_gpu:g}",
                             verdict]])
        lines += ["Reference designs aim at 10 GB/s in all for a standard cluster and 100 GB/s for a large one.", ""]

    if spec.tenants:
        lines += ["## Tenants' GPU quotas per flavour", ""]
        rows = []
        for t in spec.tenants:
            for flavor, q in t.gpu_quota.items():
                rows.append([t.name, flavor, q.nominal, "no limit" if q.borrowing_limit is None else q.borrowing_limit,
                             "all" if q.lending_limit is None else q.lending_limit])
        lines += _md_table(["tenant", "flavour", "guaranteed", "may borrow", "may lend"], rows)
        lines += _md_table(["flavour", "guaranteed in all", "capacity"], [
            [p.name, sum(t.gpu_quota[p.name].nominal for t in spec.tenants if p.name in t.gpu_quota),
             (p.gpu_resources if p.gpu_resources is not None else p.gpus) if p.gpu_unit_word == "GPUs"
             else f"{p.gpu_resources if p.gpu_resources is not None else '?'} slices of {p.gpus} GPUs"]
            for p in spec.node_pools])

    lines += ["## Fabric", ""]
    f, roce = spec.fabric, spec.fabric.effective_roce
    over = [leaf.oversubscription for leaf in topology.leaves.values() if leaf.oversubscription is not None]
    lines += _md_table(["kind", "MTU", "PFC priority", "DSCP", "rail-optimized", "host links", "bisection Gb/s",
                        "worst leaf oversubscription"],
                       [[f.kind, f.effective_mtu_bytes, roce.priority if roce else "-", roce.dscp if roce else "-",
                         "yes" if topology.rail_optimized else "no", len(topology.links),
                         f"{topology.bisection_gbps:g}",
                         f"{max(over):g}:1 (limit {thresholds.max_oversubscription:g}:1)" if over else "no uplinks"]])
    lines += ["", *_reach_lines(spec)]
    h = spec.kubernetes.health
    lines += ["", "## GPU health", ""]
    listed = lambda xids: ", ".join(map(str, xids)) or "none"  # noqa: E731
    lines += [f"node-problem-detector {h.npd_version} watches the kernel log of all {len(list(spec.hosts()))} GPU "
              f"nodes, each XID of `fault_xids` as NVIDIA's catalog resolves it: one that needs NVIDIA's diagnosis "
              f"({listed(h.xids[XidAction.SERVICE])}) sets the node condition `GpuHardwareFault` (reason "
              "`GpuXid<n>`, the driver's line as message)"
              + (" and fires the `GpuHardwareFault` alert" if spec.kubernetes.monitoring.enabled else "")
              + f"; one that needs a GPU reset or a reboot ({listed(h.xids[XidAction.RESET])}) sets "
              "`GpuResetRequired`; every XID is a Node event. Host preparation, the rollout's preflight"
              + (" and Slurm's node check" if spec.kubernetes.slurm.enabled else "")
              + " stop at the same XIDs. `kubectl get nodes -o custom-columns="
              "NAME:.metadata.name,FAULT:'.status.conditions[?(@.type==\"GpuHardwareFault\")].reason',"
              "RESET:'.status.conditions[?(@.type==\"GpuResetRequired\")].reason'` lists them.", "",
              _nvml_line(spec), "", _quarantine_line(spec), "", _active_checks_line(spec), ""] \
        if h.enabled else \
        ["Off (`kubernetes.health.enabled: false`): a GPU fault after burn-in shows only in DCGM's alerts.", ""]
    lines += [_slurm_health_line(spec), ""] if spec.kubernetes.slurm.enabled else []
    if policies is not None:
        lines += ["## Policy results", "",
                  f"{policies.mandatory} mandatory and {policies.advisory} advisory finding(s).", ""]
        if policies.rows:
            lines += _md_table(["policy", "level", "resource", "finding"], policies.rows)
    return "\n".join(lines).rstrip("\n") + "\n"


def _reach_lines(spec: ClusterSpec) -> list[str]:
    """Who reaches whom on the data-plane fabric, per pool: what a tenant's privileged pod could send RDMA to."""
    if not spec.fabric.rdma:
        return []
    reach = fabric_reach(spec)
    if not reach["isolated"]:
        dedicated = [p.name for p in spec.node_pools if p.dedicated_to]
        shared = "every port shares the default partition" if spec.fabric.kind == "infiniband" \
            else "the rails carry no tenant VLANs"
        return [f"Fabric reach: {shared}, so every host reaches every other"
                + (f"; dedicated pool(s) {', '.join(dedicated)} are not isolated on the fabric" if dedicated else "")
                + "."]
    how = ("a tenant's partition at P_Key index 0 of its pool's rail ports; limited members of every other "
           "partition") if spec.fabric.kind == "infiniband" else \
        "a tenant's VLAN on its pool's leaf ports; the other cabled ports in the shared VLAN"
    return [f"Fabric reach per pool ({how}):", "",
            *_md_table(["pool", "tenant", "fence", "reaches", "cut off from"],
                       [[g, r["tenant"] or "shared", reach["fences"].get(r["tenant"], "shared"),
                         ", ".join(r["reaches"]), ", ".join(r["cut_off_from"]) or "-"]
                        for g, r in reach["groups"].items()])]


def _nvml_line(spec: ClusterSpec) -> str:
    m = spec.kubernetes.health.gpu_monitor
    if not m.enabled:
        return ("No GPU is read while jobs run (`kubernetes.health.gpu_monitor.enabled: false`): a GPU that "
                "overheats or loses an NVLink shows only in DCGM's alerts.")
    limit = spec.kubernetes.monitoring.gpu_temperature_limit_c
    nvswitch = sum(len(p.hosts) for p in spec.node_pools if p.gpu.nvswitch)
    held = health_nvml.quarantine_conditions(spec)
    alone = [c for c in health_nvml.CONDITIONS.values() if c not in held]
    return (f"A second detector reads every GPU through NVML each minute (runtime class `{m.runtime_class}`): "
            f"`{health_nvml.TEMPERATURE_CONDITION}` when a GPU stays above {limit} C for {m.temperature_for_s} s, "
            f"`{health_nvml.NVLINK_CONDITION}` when an NVLink of the {nvswitch} NVSwitch node(s) is down or "
            "trained below full speed. "
            + " ".join([f"{' and '.join(f'`{c}`' for c in held)} quarantine the node."] * bool(held)
                       + [f"{' and '.join(f'`{c}`' for c in alone)} only alert (`quarantine_on`)."] * bool(alone)))


def _slurm_health_line(spec: ClusterSpec) -> str:
    pools = ", ".join(spec.kubernetes.slurm.pools)
    alert = " The `SlurmNodesDrained` alert fires while a partition has one (slurmctld's own metrics)." \
        if spec.kubernetes.monitoring.enabled else ""
    return (f"Slurm's pools ({pools}) run the node check before and after every job: every GPU visible, no "
            "uncorrectable ECC error, no row remapping pending or failed, NVLinks at full speed on NVSwitch boards, "
            "and after each job `dcgmi diag -r 1` where the slurmd image has DCGM. A failure drains the node with a "
            f"reason starting `{DRAIN_PREFIX.strip()}` (a failing prolog also requeues the job, unheld). `sinfo -R` "
            "lists the drained nodes with their reasons; after the repair and a burn-in, `scontrol update "
            "nodename=<node> state=resume`. When the check cannot run (a tool missing or not answering, the "
            "controller unreachable) the node stays in service and its Comment starts "
            f"`{NO_VERDICT}` (`sinfo -N -O nodelist,comment`).{alert}")


def _quarantine_line(spec: ClusterSpec) -> str:
    q = spec.kubernetes.health.quarantine
    if q.mode == "off":
        return "Quarantine is off (`kubernetes.health.quarantine.mode: off`): a faulty node stays schedulable."
    share = f"at most {q.evict_at_most_percent}% of a pool at once (at least one node; the circuit breaker " \
        "holds the rest NoSchedule and alerts GpuQuarantineHeld)" if q.evict_at_most_percent < 100 else \
        "every faulty node"
    effect = f"NoSchedule, and NoExecute on {share}: its pods are evicted and Kueue requeues their jobs" \
        if q.drain else "NoSchedule: running jobs finish, no new pod lands there"
    held = quarantine_conditions(spec)
    when = "while " + ", ".join(f"`{c}`" for c in held[:-1]) + f" or `{held[-1]}` is true"
    what = (f"node-readiness-controller {q.version} taints a GPU node `{QUARANTINE_TAINT}` ({effect}) {when}"
            if q.mode == "enforce" else
            f"Observe only: node-readiness-controller {q.version} taints no node; the status of the "
            f"NodeReadinessRule `{RULE}` lists the GPU nodes it would taint `{QUARANTINE_TAINT}` {when}")
    return (f"{what}. `GpuBurnInRequired` keeps a fault "
            "past the reboot until a burn-in passes after it (`pulumi up --replace` of the host's burn-in). "
            f"`kubectl get nodes -o custom-columns=NAME:.metadata.name,"
            f"QUARANTINE:'.spec.taints[?(@.key==\"{QUARANTINE_TAINT}\")].effect',"
            "WHY:'.status.conditions[?(@.type==\"GpuBurnInRequired\")].message'` lists them.")


def _active_checks_line(spec: ClusterSpec) -> str:
    a, pools = spec.kubernetes.health.active_checks, checked_pools(spec)
    if not pools:
        return ("No active checks between jobs" + (" (`kubernetes.health.active_checks.enabled: false`)."
                                                   if not a.enabled else ": no pool burns in with whole GPUs."))
    hosts = sum(len(p.hosts) for p in pools)
    nccl = ", then an NCCL all_reduce at 8 GiB across the node's GPUs at its burn-in minimum," if a.nccl else ""
    return (f"Active checks between jobs: `dcgmi diag -r {a.dcgm_level}` (and the NVLinks of NVSwitch boards){nccl} "
            f"on each of the {hosts} nodes of "
            f"{', '.join(p.name for p in pools)} (`{a.schedule}`, UTC), queued by Kueue in `{HEALTH_CHECKS}` at the "
            "lowest priority and admitted only while every GPU of the node is free; it never preempts a tenant, "
            "and tenants reclaim their GPUs from it. A failed test is recorded on the host and holds the node "
            "like a fault until a burn-in passes. `kubectl -n " + HEALTH_CHECKS + " get jobs -L " + HOST_LABEL
            + "` lists each node's latest results.")


# --- topology.svg: the project's own writer (no Graphviz needed) -----------------------------------------------

_BOX_W, _BOX_H, _GAP, _MIN_WIDTH = 150, 40, 16, 760
_LABELLED_LINKS = 40      # above this many leaf-rack bundles, speeds move to hover titles only


def _text(x: float, y: float, s: str, size: int = 11, anchor: str = "middle", weight: str = "normal") -> str:
    return (f'<text x="{x:g}" y="{y:g}" font-size="{size}" text-anchor="{anchor}" font-weight="{weight}">'
            f"{escape(s)}</text>")


def _box(x: float, y: float, w: float, h: float, fill: str, title: str) -> str:
    return (f'<rect x="{x:g}" y="{y:g}" width="{w:g}" height="{h:g}" rx="4" fill="{fill}" stroke="#333">'
            f"<title>{escape(title)}</title></rect>")


def render_topology_svg(spec: ClusterSpec, topology: Topology | None = None) -> str:
    topology = topology or plan_topology(spec)[0]
    switches = {s.name: s for s in spec.fabric.switches}
    spines = [s for s in spec.fabric.switches if s.role == "spine"]
    leaves = list(topology.leaves.values())
    racks = list(spec.racks)
    rack_hosts: dict[str, list[tuple[str, str]]] = {r: [] for r in racks}
    for pool, host in spec.hosts():
        rack_hosts.setdefault(host.rack, []).append((host.hostname, pool.name))
    servers = list(spec.storage.servers)
    per_row = max(len(spines), len(leaves), len(racks), len(servers), 1)
    width = max(per_row * (_BOX_W + _GAP) + _GAP, _MIN_WIDTH)
    node_h = 14
    rack_h = 24 + max((len(h) for h in rack_hosts.values()), default=0) * (node_h + 2)
    top = 40 if spines else -90          # no spine row: the leaves move up
    rows_y = {"spine": top, "leaf": top + 130, "rack": top + 280}
    storage_y = rows_y["rack"] + rack_h + 60
    height = storage_y + (_BOX_H + 40 if servers else 0) + 20

    def xs(n: int) -> list[float]:
        offset = (width - n * (_BOX_W + _GAP) + _GAP) / 2
        return [offset + i * (_BOX_W + _GAP) for i in range(n)]

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:g}" height="{height:g}" '
           f'viewBox="0 0 {width:g} {height:g}" font-family="sans-serif">',
           '<rect width="100%" height="100%" fill="white"/>',
           _text(_GAP, 20, f"{spec.name}: {spec.fabric.kind}, {len(topology.links)} host links, bisection "
                 f"{topology.bisection_gbps:g} Gb/s{', rail-optimized' if topology.rail_optimized else ''}",
                 13, "start", "bold")]
    spine_x = dict(zip((s.name for s in spines), xs(len(spines))))
    leaf_x = dict(zip((leaf.name for leaf in leaves), xs(len(leaves))))
    rack_x = dict(zip(racks, xs(len(racks))))
    lines: list[str] = []
    for leaf in leaves:
        sw = switches[leaf.name]
        for up in sw.uplinks:
            if up in spine_x:
                lines.append(f'<line x1="{leaf_x[leaf.name] + _BOX_W / 2:g}" y1="{rows_y["leaf"]:g}" '
                             f'x2="{spine_x[up] + _BOX_W / 2:g}" y2="{rows_y["spine"] + _BOX_H:g}" stroke="#8a8a8a">'
                             f"<title>{escape(f'{leaf.name} - {up}: {sw.links_per_uplink} x ')}"
                             f"{sw.effective_uplink_speed_gbps} Gb/s"
                             "</title></line>")
    cabled: dict[tuple[str, str], list[int]] = {}
    host_rack = {h.hostname: h.rack for _, h in spec.hosts()}
    for link in topology.links:
        cabled.setdefault((link.leaf, host_rack[link.host]), []).append(link.speed_gbps)
    for (leaf, rack), speeds in sorted(cabled.items()):
        x1, y1 = leaf_x[leaf] + _BOX_W / 2, rows_y["leaf"] + _BOX_H
        x2, y2 = rack_x[rack] + _BOX_W / 2, rows_y["rack"]
        lines.append(f'<line x1="{x1:g}" y1="{y1:g}" x2="{x2:g}" y2="{y2:g}" stroke="#4a7ab5">'
                     f"<title>{escape(f'{leaf} - rack {rack}: {len(speeds)} x {max(speeds)} Gb/s')}</title></line>")
        if len(cabled) <= _LABELLED_LINKS:
            lines.append(_text((x1 + x2) / 2, (y1 + y2) / 2, f"{len(speeds)} x {max(speeds)}G", 9))
    out += lines
    for s in spines:
        x = spine_x[s.name]
        out += [_box(x, rows_y["spine"], _BOX_W, _BOX_H, "#f2e3c6",
                     f"spine {s.name}: {s.ports} x {s.port_speed_gbps} Gb/s"),
                _text(x + _BOX_W / 2, rows_y["spine"] + 17, s.name), _text(x + _BOX_W / 2, rows_y["spine"] + 31,
                                                                           f"{s.ports} x {s.port_speed_gbps}G", 10)]
    for leaf in leaves:
        x, sw = leaf_x[leaf.name], switches[leaf.name]
        ratio = "no uplinks" if leaf.oversubscription is None else f"{leaf.oversubscription:g}:1"
        rails = "rails " + ",".join(map(str, leaf.rails)) if leaf.rails else "all rails"
        out += [_box(x, rows_y["leaf"], _BOX_W, _BOX_H, "#d6e6f5",
                     f"leaf {leaf.name}: {leaf.downlinks} down ({leaf.down_gbps} Gb/s), {leaf.uplinks} up "
                     f"({leaf.up_gbps} Gb/s), {ratio}"),
                _text(x + _BOX_W / 2, rows_y["leaf"] + 15, leaf.name),
                _text(x + _BOX_W / 2, rows_y["leaf"] + 29, f"{rails}; {sw.port_speed_gbps}G; {ratio}", 8)]
    for rack in racks:
        x, hosts = rack_x[rack], rack_hosts.get(rack, [])
        pdu = spec.racks[rack].pdu_capacity_kw
        out += [_box(x, rows_y["rack"], _BOX_W, rack_h, "#f5f5f5", f"rack {rack}: PDU {pdu:g} kW"),
                _text(x + _BOX_W / 2, rows_y["rack"] + 15, f"{rack} ({pdu:g} kW)", 11, weight="bold")]
        for i, (hostname, pool) in enumerate(hosts):
            y = rows_y["rack"] + 22 + i * (node_h + 2)
            p = spec.pools[pool]
            out += [_box(x + 6, y, _BOX_W - 12, node_h, "#c9e7c9",
                         f"{hostname}: {p.gpu.count} x {p.gpu.model}, {len(p.nics)} NICs"),
                    _text(x + _BOX_W / 2, y + 11, f"{hostname} {p.gpu.count}x{p.gpu.model.split('-')[0]}", 9)]
    for x, server in zip(xs(len(servers)), servers):
        roles = ", ".join(sorted({t.role for t in server.targets}))
        out += [_box(x, storage_y, _BOX_W, _BOX_H, "#e6d6f0",
                     f"{spec.storage.kind} server {server.hostname}: {roles}"),
                _text(x + _BOX_W / 2, storage_y + 17, server.hostname),
                _text(x + _BOX_W / 2, storage_y + 31, roles, 9)]
    if servers:
        out.append(_text(_GAP, storage_y - 12, f"storage: {spec.storage.kind} {spec.storage.version} "
                                              f"{spec.storage.fs_name}", 12, "start", "bold"))
    out.append(_text(_GAP, height - 8, "blue: host links (rack to leaf), grey: leaf to spine uplinks; hover a box or "
                                       "line for its ports, speeds and oversubscription", 10, "start"))
    out.append("</svg>")
    return "\n".join(out) + "\n"
