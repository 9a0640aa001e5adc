"""Turn a recorded program run into files a person can review: resources, manifests, scripts, summary."""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from pulumi.runtime import rpc as _rpc

from ..cluster import GpuCluster
from ..fabric import Fabric
from ..fabric.partitions import FabricPartitions
from ..fabric.nccl import nccl_envs
from ..k8s.tenancy.jobs import render_example_batch_jobs, render_example_jobs
from ..k8s.rails import rdma_resource
from ..k8s.slurm.cluster import slurm_pools, slurm_release
from ..spec import ClusterSpec
from ..spec.cluster import network_operator_enabled
from ..spec.loader import loaded_specs
from ..spec.topology import plan_topology
from ..ssh import unwrap
from ..validation import render_suite_files
from ..storage.filesystem import filesystem_outputs
from ..storage.layout import plan_layout
from ..yamltext import to_yaml
from .report import Thresholds, render_report, render_topology_svg
from .recorder import COMPUTED, SECRET, STACK_TYPE, Record, redact
from .runner import ProgramRun

HONESTY = ("Offline plan: what the program registers under Pulumi's mock runtime, not the state of a cluster. "
           "Values known only after a real apply show as <computed>; secrets show as [secret].")
HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
REMOTE_COMMAND = "command:remote:Command"
CONFIG_GROUP = "kubernetes:yaml/v2:ConfigGroup"
LOCAL_COMMAND = "command:local:Command"
LOCAL_SCRIPTS = "_local"      # where pulumi runs; no host is named so (a hostname has no underscore)
_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass
class Plan:
    document: dict[str, Any]
    files: dict[str, str]                       # relative path -> content
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    summary: str = ""
    clusters: list[ClusterSpec] = field(default_factory=list)   # the spec of each GpuCluster the program built


def _k8s_document(inputs: dict[str, Any]) -> dict[str, Any]:
    """A Kubernetes object as reviewed: `inputs` redacted and ordered, apiVersion, kind and metadata first."""
    head = {k: inputs[k] for k in ("apiVersion", "kind", "metadata") if k in inputs}
    return {**head, **{k: v for k, v in inputs.items() if k not in head}}


def _resource_entry(r: Record, component_outputs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    explicit = set(r.dependencies) - {u for us in r.property_dependencies.values() for u in us}
    entry: dict[str, Any] = {
        "urn": r.urn, "type": r.type, "name": r.name, "parent": r.parent or None,
        "custom": r.custom, "dependsOn": sorted(explicit), "propertyDependencies": r.property_dependencies,
        "provider": r.provider or None, "inputs": redact(r.inputs, ordered=True),
        "options": {k: v for k, v in sorted(r.options.items()) if v},
    }
    if r.kind == "read":
        entry["read"] = True
    if r.urn in component_outputs:
        entry["outputs"] = redact(component_outputs[r.urn], ordered=True)
    return entry


def _manifest_path(inputs: dict[str, Any]) -> str:
    meta = inputs.get("metadata") or {}
    scope = meta.get("namespace") or "_cluster"
    return f"manifests/{_SAFE.sub('_', str(scope))}/{inputs['kind'].lower()}-{_SAFE.sub('_', str(meta.get('name')))}.yaml"


def _release_files(r: Record) -> tuple[str, str]:
    i = redact(r.inputs, ordered=True)
    name = i.get("name") or r.name
    header = (f"# Helm release {name}: chart {i.get('chart')} {i.get('version', '')} from "
              f"{(i.get('repositoryOpts') or {}).get('repo', 'the chart reference')} into namespace "
              f"{i.get('namespace', 'default')}\n")
    path = f"helm/{_SAFE.sub('_', str(i.get('namespace', 'default')))}-{_SAFE.sub('_', str(name))}.values.yaml"
    return path, header + to_yaml(i.get("values") or {})


def _script_files(r: Record, names: dict[str, str]) -> dict[str, str]:
    """One file per script of a command, under the host it runs on (only the host is revealed), named as the
    spec names it when the address is known, or under _local/ for a local command (it runs where pulumi runs);
    `.update.sh` only where an update runs another script than `create` (a converging script, such as a host's
    preparation, runs its create script again)."""
    if r.type == LOCAL_COMMAND:
        host = LOCAL_SCRIPTS
    else:
        conn = r.inputs.get("connection") or {}
        host = str(redact((_rpc.unwrap_rpc_secret(conn) if _rpc.is_rpc_secret(conn) else conn).get("host", "unknown")))
        host = _SAFE.sub("_", names.get(host, host))
    out = {}
    for step in ("create", "update", "delete"):
        script = redact(r.inputs.get(step))
        if script is None or (step == "update" and r.inputs.get("update") == r.inputs.get("create")):
            continue                # a converging script runs its create script again on update
        script = unwrap(script) if script != SECRET else script
        suffix = "" if step == "create" else f".{step}"
        text = {SECRET: "# [secret]: this script embeds a secret and is not shown offline\n",
                COMPUTED: "# <computed>: this script is built from a value known only after apply (a generated "
                         "secret, or what another step reads on its host) and is not shown offline\n"}.get(script, script)
        out[f"scripts/{host}/{_SAFE.sub('_', r.name)}{suffix}.sh"] = text if text.endswith("\n") else text + "\n"
    return out


def _machine_names(clusters: list[ClusterSpec]) -> dict[str, str]:
    names = {}
    for spec in clusters:
        names.update({h.address: h.hostname for _, h in spec.hosts()})
        names.update({s.address: s.hostname for s in spec.storage.servers})
        if spec.storage.scale is not None:      # the site's Scale admin node, which joins the clients
            names[spec.storage.scale.admin_node.address] = spec.storage.scale.admin_node.hostname
        names.update({s.address: s.name for s in spec.fabric.switches})
    return names


# ConfigMaps and Secrets hold at most 1 MiB; etcd refuses any request over 1.5 MiB.
MAX_OBJECT_BYTES = 1024 * 1024


def cluster_specs(run: ProgramRun) -> list[ClusterSpec]:
    """The spec of each GpuCluster, from its registered output `spec_json`: the program's own spec object when
    it loaded the same one (already validated and planned), else validated again from the text."""
    texts = [t for r in run.records if r.type == GpuCluster.TYPE
             for t in [run.component_outputs.get(r.urn, {}).get("spec_json")] if isinstance(t, str)]
    loaded = {c.model_dump_json(): c for c in loaded_specs()} if texts else {}
    # strict=False: in JSON, DSCP map keys are strings
    return [loaded.get(t) or ClusterSpec.model_validate(json.loads(t), strict=False) for t in texts]


def build_plan(run: ProgramRun, thresholds: Thresholds = Thresholds()) -> Plan:
    files: dict[str, str] = {}
    clusters = cluster_specs(run)
    names = _machine_names(clusters)
    errors = [f"duplicate resource URN {u}: the real engine refuses this" for u in run.duplicates]
    owners: dict[str, str] = {}
    entries = [_resource_entry(r, run.component_outputs) for r in run.records]
    for r, entry in zip(run.records, entries):
        if r.type.startswith("kubernetes:") and not r.type.startswith("pulumi:providers") \
                and "apiVersion" in r.inputs and "kind" in r.inputs:
            objects = [entry["inputs"]]
        elif r.type == CONFIG_GROUP:        # objects the program read itself (an operator's installer)
            objects = [o for o in entry["inputs"].get("objs") or [] if isinstance(o, dict) and "kind" in o]
        else:
            objects = []
        for obj in objects:
            path = _manifest_path(obj)
            if path in owners:
                errors.append(f"{r.name} and {owners[path]} both manage the Kubernetes object {path}; "
                              "one would overwrite the other")
            owners[path] = r.name
            files[path] = to_yaml(_k8s_document(obj))
            size = len(json.dumps(obj, ensure_ascii=False).encode())
            if size > MAX_OBJECT_BYTES:
                errors.append(f"{path} is {size:,} bytes; the API server refuses objects over {MAX_OBJECT_BYTES:,} "
                              "(a ConfigMap's limit): split it or make the spec that produces it smaller")
        if objects:
            continue
        if r.type == HELM_RELEASE:
            path, text = _release_files(r)
            files[path] = text
        elif r.type in (REMOTE_COMMAND, LOCAL_COMMAND):
            files.update(_script_files(r, names))
        elif r.type == FabricPartitions.TYPE:
            files["fabric/partitions.conf"] = run.component_outputs.get(r.urn, {}).get("preview", "") + "\n"
        elif r.type == Fabric.TYPE:
            checks = run.component_outputs.get(r.urn, {}).get("checks") or {}
            files.update({f"checks/{_SAFE.sub('_', n)}": text for n, text in checks.items()})
    for spec in clusters:
        files["report.md"] = render_report(spec, thresholds)
        files["topology.svg"] = render_topology_svg(spec)
        files.update(render_suite_files(spec))
        files.update({f"jobs/{_SAFE.sub('_', n)}.yaml": to_yaml(job) for n, job in render_example_jobs(spec).items()})
        files.update({f"jobs/{_SAFE.sub('_', n)}.sbatch": text for n, text in render_example_batch_jobs(spec).items()})
    document = {
        "note": HONESTY, "project": run.project, "stack": run.stack,
        "unresolvedSecrets": run.unresolved_secrets,
        "outputs": {k: (SECRET if secret else redact(v)) for k, (v, secret) in run.outputs.items()},
        "resources": entries,
    }
    files["resources.json"] = _resources_json(document)
    warnings = [f"secret config {k} is encrypted or not set; a placeholder stands in for it offline"
                for k in run.unresolved_secrets]
    for spec in clusters:
        warnings += spec.warnings()
    plan = Plan(document, files, errors, warnings, clusters=clusters)
    plan.summary = render_summary(run, plan, clusters)
    files["summary.txt"] = plan.summary
    return plan


def _resources_json(document: dict[str, Any]) -> str:
    """The plan as JSON, one resource per line (sorted keys): a diff of two plans shows the resources that
    differ, and json's C encoder writes it (an indented dump goes through its slow pure-Python path). One join
    of all the parts: chained `+` would copy the whole text once per operator, the largest transient of a plan."""
    if not document["resources"]:
        return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    head = json.dumps({k: v for k, v in document.items() if k != "resources"}, indent=2, sort_keys=True,
                      ensure_ascii=False)
    parts = [head[:-2], ',\n  "resources": [\n    ']
    for i, r in enumerate(document["resources"]):
        parts += [",\n    "] if i else []
        parts.append(json.dumps(r, sort_keys=True, ensure_ascii=False))
    parts.append("\n  ]\n}\n")
    return "".join(parts)


def _table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" if i < len(widths) - 1 else f"{{:>{w}}}" for i, w in enumerate(widths))
    return [fmt.format(*headers), fmt.format(*("-" * w for w in widths))] + [fmt.format(*map(str, r)) for r in rows]


def _fabric_summary(spec: ClusterSpec) -> list[str]:
    topology = plan_topology(spec)[0]
    f = spec.fabric
    mtu = f"MTU {f.effective_mtu_bytes}"
    roce = f.effective_roce
    qos = f", RoCE priority {roce.priority} (PFC), DSCP {roce.dscp}, ToS {roce.tos}" if roce else ""
    lines = [f"Fabric {f.kind}: {mtu}{qos}; {len(topology.links)} host links, "
             f"{'rail-optimized' if topology.rail_optimized else 'not rail-optimized'}, "
             f"bisection {topology.bisection_gbps:g} Gb/s"]
    if topology.leaves:
        lines += _table(["leaf", "rails", "downlinks", "uplinks", "ports", "down Gb/s", "up Gb/s", "oversubscription"], [
            [leaf.name, ",".join(map(str, leaf.rails)) or "-", leaf.downlinks, leaf.uplinks, leaf.ports,
             leaf.down_gbps, leaf.up_gbps,
             f"{leaf.oversubscription:g}:1" if leaf.oversubscription is not None else "no uplinks"]
            for leaf in topology.leaves.values()])
    for pool, env in nccl_envs(spec).items():
        lines.append(f"NCCL ({pool}): " + " ".join(f"{k}={v}" for k, v in env.items()))
    return lines


def _slurm_summary(spec: ClusterSpec) -> list[str]:
    s = spec.kubernetes.slurm
    if not s.enabled:
        return []
    parts = [f"{p.name}{' (default)' if p.name == s.default else ''}: {len(p.hosts)} nodes, {p.gpus} GPUs"
             for p in slurm_pools(spec)]
    return ["", f"Slurm (Slinky {s.version}, Slurm {slurm_release(s)}) in namespace {s.namespace}, "
                f"scheduling these pools instead of Kueue: {'; '.join(parts)}"]


def _storage_summary(spec: ClusterSpec) -> list[str]:
    layout = plan_layout(spec)
    if layout is None:
        return []
    o = filesystem_outputs(spec, layout)
    hint = f"storage.{'weka' if spec.storage.weka else 'scale'}.read_gb_per_s" if spec.storage.client_only \
        else "storage.read_gb_per_s_per_server"
    read = (f"read bandwidth not estimated (set {hint})" if o["read_gb_per_s"] is None
            else f"expected read {o['read_gb_per_s']:g} GB/s for {o['gpus']} GPUs ({o['read_gb_per_s_per_gpu']:g} "
                 "GB/s per GPU; reference designs aim at 10 GB/s in all for a standard cluster, 100 GB/s for a "
                 "large one)")
    if spec.storage.client_only:        # the site's own cluster: its clients alone are built here
        size = "size unknown" if o["capacity_tib"] is None else f"{o['capacity_tib']:g} TiB"
        return ["", f"Storage: {o['kind']} {o['version']} {spec.storage.remote_name} of the site's cluster "
                    f"({o['manager']}), mounted at {o['mount_point']}; clients only, {size}", f"  {read}"]
    return ["", f"Storage: {o['kind']} {o['version']} {o['fs_name']} at {o['mount_point']}, managed by "
                f"{o['manager']}; {o['data_servers']} data server(s), {o['data_targets']} data target(s), "
                f"{o['capacity_tib']:g} TiB", f"  {read}"]


def render_summary(run: ProgramRun, plan: Plan, clusters: list[ClusterSpec]) -> str:
    by_urn = {r.urn: r for r in run.records}
    counts: Counter[tuple[str, str]] = Counter()
    for r in run.records:
        if r.type == STACK_TYPE:
            continue
        parent = by_urn.get(r.parent)
        kind = f"{r.type} (read)" if r.kind == "read" else r.type
        counts[(parent.type if parent and parent.type != STACK_TYPE else "(stack)", kind)] += 1
    reads = sum(n for (_, t), n in counts.items() if t.endswith(" (read)"))
    lines = [HONESTY, "", f"Stack {run.stack} of project {run.project}: {sum(counts.values()) - reads} resources"
             + (f" and {reads} read(s) of live objects" if reads else ""), ""]
    lines += _table(["component", "resource type", "count"],
                    [[c, t, n] for (c, t), n in sorted(counts.items())])
    for spec in clusters:
        lines += ["", f"Cluster {spec.name} ({spec.environment}): {sum(len(p.hosts) for p in spec.node_pools)} nodes, "
                      f"{spec.gpus} GPUs, fabric {spec.fabric.kind}, storage {spec.storage.kind}"]
        k = spec.kubernetes
        network = (f"Network Operator {k.network_operator.chart_version}" if network_operator_enabled(spec)
                   else "no Network Operator")
        lines.append(f"Kubernetes: GPU Operator {k.gpu_operator.chart_version}, {network}, Kueue "
                     f"{k.kueue.chart_version}, NFD {k.nfd.chart_version}; RDMA resource "
                     f"{rdma_resource(spec) if network_operator_enabled(spec) else 'none'}")
        lines += _table(["node pool", "GPU", "hosts", "GPUs", "pods ask for"],
                        [[p.name, f"{p.gpu.count} x {p.gpu.model}", len(p.hosts), p.gpus,
                          f"{p.gpu_resource_name} ({p.gpu_resources if p.gpu_resources is not None else '?'} "
                          f"{p.gpu_unit_word})"] for p in spec.node_pools])
        lines += ["", "Power at peak (GPUs at TDP plus base power, storage servers, switches) per rack, against "
                      "its PDUs:"]
        lines += _table(["rack", "at peak", "peak kW", "PDU kW", "redundancy", "load"], [
            [name, p.listing(), f"{'>= ' if p.unknown else ''}{p.peak_kw:g}", f"{p.capacity_kw:g}",
             p.redundancy or "not stated", f"{p.peak_kw / p.capacity_kw:.0%}"]
            for name, p in spec.rack_power().items()])
        lines += ["", *_fabric_summary(spec), *_storage_summary(spec), *_slurm_summary(spec)]
        if spec.tenants:
            lines.append("")
            lines += _table(["tenant", "namespace", "guaranteed GPUs", "borrowing limit", "CPU", "memory"], [
                [t.name, t.namespace_name,
                 ", ".join(f"{f}: {q.nominal}{'' if spec.pools[f].gpu_unit_word == 'GPUs' else ' slices'}"
                           for f, q in t.gpu_quota.items() if f in spec.pools) or "none",
                 ", ".join(f"{f}: {'no limit' if q.borrowing_limit is None else q.borrowing_limit}"
                           for f, q in t.gpu_quota.items()) or "-",
                 spec.tenant_cpu_cores(t), f"{spec.tenant_memory_gib(t)}Gi"] for t in spec.tenants])
    lines += ["", f"Warnings ({len(plan.warnings)}):"] + [f"  - {w}" for w in plan.warnings or ["none"]]
    if plan.errors:
        lines += ["", f"Errors ({len(plan.errors)}):"] + [f"  - {e}" for e in plan.errors]
    return "\n".join(lines) + "\n"


def write_plan(plan: Plan, out_dir: Path) -> None:
    """Replace the previous plan in `out_dir`; refuse a non-empty folder that holds no plan."""
    if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / "resources.json").exists():
        raise FileExistsError(f"{out_dir} is not empty and holds no plan (no resources.json); "
                              "choose an empty or new folder with --out")
    # Rewritten in place, not removed and made again: a re-plan of thousands of files rewrites only what
    # changed, and whatever the new plan does not have is removed.
    stale = {p for p in out_dir.rglob("*") if not p.is_dir()} if out_dir.exists() else set()
    folders: set[Path] = set()
    for rel, text in sorted(plan.files.items()):
        path = out_dir / rel
        if path.parent not in folders:
            path.parent.mkdir(parents=True, exist_ok=True)
            folders.add(path.parent)
        if path in stale:         # only a file the last plan wrote can be unchanged
            stale.discard(path)
            if path.is_symlink():
                path.unlink()
            elif path.is_file() and _same_text(path, text):
                continue
        with path.open("wb") as f:
            f.writelines(_encoded(text))
    for path in stale:
        path.unlink()
    if stale:       # folders only the last plan had are empty now
        for folder in sorted((p for p in out_dir.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            if not any(folder.iterdir()):
                folder.rmdir()


_CHUNK = 1 << 18


def _encoded(text: str) -> Iterator[bytes]:
    """The UTF-8 of `text` a slice at a time: encoding a large text whole (resources.json) doubles it in memory,
    more where the text holds a non-ASCII character (CPython over-allocates the buffer, then shrinks it)."""
    for i in range(0, len(text), _CHUNK):
        yield text[i:i + _CHUNK].encode("utf-8")


def _same_text(path: Path, text: str) -> bool:
    with path.open("rb") as f:
        return all(f.read(len(chunk)) == chunk for chunk in _encoded(text)) and not f.read(1)
