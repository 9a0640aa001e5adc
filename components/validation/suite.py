"""The validation suite of a spec: what to apply, what to read back, and the verdict.

Thresholds come from the spec, defaults from the reference designs: NCCL at 85% of what the slower of NVLink
and the NICs carries (fabric.checks), every rail at 90% of line rate (fabric.checks), the filesystem's parallel
read at 70% of its expected aggregate (validation), and DCGM diagnostics at each pool's burn-in level.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Literal

from ..fabric.checks import CHECKS_NAMESPACE, nccl_floor_gb_per_s, render_link_check, render_nccl_job
from ..bash import fill
from ..k8s.images import through_mirror
from ..k8s.labels import every_pool_tolerations, pool_tolerations
from ..spec import ClusterSpec, NodePool
from ..storage.layout import plan_layout
from ..yamltext import to_yaml_all
from . import parse

HOSTNAME = "kubernetes.io/hostname"
SUITE_LABEL = "gpucluster.io/validation"
FIO_MOUNT = "/data"


@dataclass(frozen=True)
class Check:
    name: str
    kind: Literal["nodes", "links", "nccl", "storage", "dcgm"]
    what: str
    threshold: float                 # Gb/s per link, GB/s bus bandwidth, GB/s aggregate read, or 0 failures
    unit: str
    manifests: list[dict[str, Any]] = field(default_factory=list)   # applied to the cluster
    script: str | None = None        # run on the operator's machine (links, over SSH)
    workload: str = ""               # "<kind>/<name>" in the checks namespace, waited for and read back
    file: str = ""                   # validation/<file>.yaml that holds its manifests; omitted: its name
    expect: dict[str, Any] = field(default_factory=dict)   # nodes: hosts and what each must offer pods


@dataclass(frozen=True)
class Result:
    check: str
    passed: bool
    measured: str
    detail: str


def _namespace() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": CHECKS_NAMESPACE, "labels": {"pod-security.kubernetes.io/enforce": "baseline"}}}


def _job(name: str, pod_spec: dict[str, Any], timeout_s: int, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": CHECKS_NAMESPACE, "labels": {SUITE_LABEL: name}},
            "spec": {"backoffLimit": 0, "activeDeadlineSeconds": timeout_s, "ttlSecondsAfterFinished": 86400,
                     **spec, "template": {"metadata": {"labels": {SUITE_LABEL: name}},
                                          "spec": {"restartPolicy": "Never", **pod_spec}}}}


# One client's run (POSIX sh: the fio image need not have bash). Markers carry the Job's uid, so a run never
# waits on, or reads, an earlier run's files; each client removes its files once its reader is done with them.
_FIO_RUN = r"""set -eu
i=$JOB_COMPLETION_INDEX n=@CLIENTS@ d=@DIR@/run-$RUN
next=$(( (i + 1) % n )) prev=$(( (i + n - 1) % n ))
await() {
  waited=0
  until [ -e "$d/$1" ]; do
    sleep 5; waited=$((waited + 5))
    if [ "$waited" -ge @LIMIT@ ]; then echo "storage-read: $2" >&2; exit 1; fi
  done
}
mkdir -p "$d"
# The test data sits outside every tenant's quota: never start writing it where it would fill the filesystem.
set -- $(df -Pk "$d" | awk 'NR == 2 { print int($4 / 1048576), int($2 / 10485760) }')
free_gib=${1:-0} reserve_gib=${2:-0}
if [ "$free_gib" -lt $((@TOTAL_GIB@ + reserve_gib)) ]; then
  echo "storage-read: the test writes @TOTAL_GIB@ GiB and keeps a tenth of the filesystem free, but only $free_gib GiB are free: lower validation.storage_test_gib_per_server or free space" >&2
  exit 1
fi
fio --name=write --directory="$d" --filename_format="c$i.\$jobnum" --rw=write @COMMON@ --output=/dev/null
touch "$d/written.$i"
await "written.$next" "client $next never wrote its files"
fio --name=read --directory="$d" --filename_format="c$next.\$jobnum" --rw=read @COMMON@ --time_based   --runtime=@SECONDS@ --ramp_time=10 --group_reporting --output-format=json
touch "$d/read.$i"
await "read.$prev" "client $prev never finished reading"
rm -f "$d/c$i".*
"""


def _storage_check(spec: ClusterSpec) -> Check | None:
    layout = plan_layout(spec)
    v = spec.validation
    if layout is None or layout.read_gb_per_s is None or v.fio_image is None:
        return None
    hosts = [h for _, h in spec.hosts()]
    floor = round(layout.read_gb_per_s * v.storage_min_read_percent / 100, 2)
    path = f"{spec.storage.mount_point}/.gpucluster-validation"
    pv = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"{spec.name}-validation-read",
                                                                        "labels": {SUITE_LABEL: "storage-read"}},
          "spec": {"capacity": {"storage": "1Ti"}, "accessModes": ["ReadWriteMany"],
                   "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                   "hostPath": {"path": path, "type": "DirectoryOrCreate"},
                   "claimRef": {"namespace": CHECKS_NAMESPACE, "name": "storage-read"}}}
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
           "metadata": {"name": "storage-read", "namespace": CHECKS_NAMESPACE},
           "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": pv["metadata"]["name"],
                    "resources": {"requests": {"storage": "1Ti"}}}}
    # Each client writes its share, then reads the share its neighbour wrote (direct I/O: no client cache), and
    # the share is sized past the servers' memory (no server cache): what it measures is the disks and fabric.
    # A site's cluster (WEKA, Scale) counts its backends as its servers; Scale, whose servers are not listed, as one.
    clients, jobs = len(hosts), 4
    servers = layout.data_servers or (len(spec.storage.weka.backends) if spec.storage.weka else 1)
    per_job_gib = max(1, -(-v.storage_test_gib_per_server * servers // (clients * jobs)))
    common = f"--bs=4m --numjobs={jobs} --iodepth=16 --ioengine=libaio --direct=1 --size={per_job_gib}g"
    run = fill(_FIO_RUN, CLIENTS=clients, DIR=FIO_MOUNT, COMMON=common, SECONDS=v.storage_test_seconds,
               LIMIT=v.timeout_s, TOTAL_GIB=per_job_gib * jobs * clients)
    fio = ["/bin/sh", "-c", run]
    pod = {"tolerations": every_pool_tolerations(spec),
           "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
               "labelSelector": {"matchLabels": {SUITE_LABEL: "storage-read"}}, "topologyKey": HOSTNAME}]}},
           "containers": [{"name": "fio", "image": v.fio_image, "command": fio, "env": [
               {"name": "RUN", "valueFrom": {"fieldRef": {
                   "fieldPath": "metadata.labels['batch.kubernetes.io/controller-uid']"}}}],
                           "resources": {"requests": {"cpu": "4", "memory": "8Gi"}, "limits": {"memory": "8Gi"}},
                           "volumeMounts": [{"name": "data", "mountPath": FIO_MOUNT}]}],
           "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "storage-read"}}]}
    job = _job("storage-read", pod, v.timeout_s, completionMode="Indexed", completions=len(hosts),
               parallelism=len(hosts))
    return Check("storage-read", "storage",
                 f"fio sequential read from {len(hosts)} GPU nodes at once on {spec.storage.kind} "
                 f"{spec.storage.fs_name}, each of another node's {per_job_gib * jobs} GiB "
                 f"({v.storage_min_read_percent}% of {layout.read_gb_per_s:g} GB/s expected)",
                 floor, "GB/s", [_namespace(), pv, pvc, job], workload="job/storage-read",
                 expect={"clients": clients})


def _dcgm_checks(spec: ClusterSpec) -> list[Check]:
    v, out = spec.validation, []
    for pool in spec.kueue_pools:    # a Slurm pool's GPUs are its slurmd pods', so no check pod would get them
        if pool.sharing.time_slicing_replicas or pool.sharing.mig_config:
            continue                 # the diagnostics need whole GPUs; shared pools are diagnosed at burn-in
        level = pool.burn_in.dcgm_level
        for host in pool.hosts:
            name = f"dcgm-{host.hostname}"
            pod = {"nodeSelector": {HOSTNAME: host.hostname}, "tolerations": pool_tolerations(pool),
                   "containers": [{"name": "diag", "image": v.dcgm_image,
                                   "command": ["/bin/bash", "-c", f"nv-hostengine && dcgmi diag -r {level}"],
                                   "resources": {"limits": {"nvidia.com/gpu": pool.gpu.count}}}]}
            out.append(Check(name, "dcgm", f"dcgmi diag -r {level} on {host.hostname}'s {pool.gpu.count} GPUs", 0,
                             "failed tests", [_namespace(), _job(name, pod, v.timeout_s)], workload=f"job/{name}",
                             file=f"dcgm-{pool.name}"))
    return out


def _nodes_check(pool: NodePool) -> Check:
    """Every host of the pool is a Node that offers pods what the spec's job templates and quotas assume: its
    allocatable CPU and memory (below capacity on every real host) and its GPUs as the device plugin gives them."""
    units = pool.gpu_units_per_host
    expect = {"hosts": sorted(h.hostname for h in pool.hosts), "cpu": pool.allocatable_cpu_cores_per_host,
              "memory_mib": pool.allocatable_memory_mib_per_host, "gpu_resource": pool.gpu_resource_name,
              "gpus": units}
    return Check(f"nodes-{pool.name}", "nodes",
                 f"every {pool.name} node offers pods {expect['cpu']} cores, {expect['memory_mib'] // 1024} GiB and "
                 f"{units} {pool.gpu_resource_name} (allocatable), as the job templates assume", len(pool.hosts),
                 "nodes",
                 workload=f"nodes/{pool.name}", expect=expect)


def plan_suite(spec: ClusterSpec) -> list[Check]:
    """The checks, their images pulled through the spec's mirror."""
    return [replace(c, manifests=through_mirror(c.manifests, spec)) for c in _plan_suite(spec)]


def _plan_suite(spec: ClusterSpec) -> list[Check]:
    checks: list[Check] = [_nodes_check(pool) for pool in spec.node_pools]
    kueue = {p.name for p in spec.kueue_pools}
    for pool in spec.node_pools:
        links = render_link_check(spec, pool)
        if links:
            floor = min(n.speed_gbps for n in pool.nics) * spec.fabric.checks.link_min_percent / 100
            checks.append(Check(f"links-{pool.name}", "links",
                                f"ib_write_bw per rail between neighbouring hosts of {pool.name}", floor, "Gb/s",
                                script=links))
        nccl = render_nccl_job(spec, pool) if pool.name in kueue else None
        if nccl:
            checks.append(Check(f"nccl-{pool.name}", "nccl", f"all_reduce_perf across {pool.name}",
                                nccl_floor_gb_per_s(spec, pool), "GB/s", nccl,
                                workload=f"mpijob/{nccl[1]['metadata']['name']}"))
    storage = _storage_check(spec)
    if storage:
        checks.append(storage)
    return checks + _dcgm_checks(spec)


def unique_manifests(checks: Iterable[Check]) -> list[dict[str, Any]]:
    """The checks' objects, each once (the namespace they share), in the order they name them."""
    unique: dict[tuple[str, str | None, str], dict[str, Any]] = {}
    for c in checks:
        for m in c.manifests:
            unique.setdefault((m["kind"], m["metadata"].get("namespace"), m["metadata"]["name"]), m)
    return list(unique.values())


def render_suite_files(spec: ClusterSpec) -> dict[str, str]:
    """validation/: every check's manifests or script, and a table of what each must reach."""
    files, rows = {}, []
    by_file: dict[str, list[Check]] = {}
    for c in plan_suite(spec):
        if c.manifests:     # a pool's per-host jobs share one file (one to review, one to apply)
            by_file.setdefault(c.file or c.name, []).append(c)
        if c.script:
            files[f"validation/{c.name}.sh"] = c.script
        wanted = "no failed test" if c.kind == "dcgm" else f">= {c.threshold:g} {c.unit}"
        rows.append(f"| {c.name} | {c.what} | {wanted} |")
    files.update({f"validation/{name}.yaml": to_yaml_all(unique_manifests(group)) for name, group in by_file.items()})
    files["validation/README.md"] = "\n".join([
        f"# Validation suite of {spec.name}", "",
        f"Run after `pulumi up`: `gpucluster validate {spec.name} --kubeconfig KUBECONFIG` applies the manifests "
        f"(namespace {CHECKS_NAMESPACE}), runs the link scripts over SSH from this machine, waits, reads the "
        "results and exits non-zero when a check fails.", "",
        "| check | what | must reach |", "| --- | --- | --- |", *rows]) + "\n"
    return files


def judge(check: Check, output: str, completed: bool = True) -> Result:
    """The verdict on one check from what it printed (`completed`: the workload finished without failing)."""
    if check.kind == "nodes":
        return _judge_nodes(check, output)
    if check.kind == "links":
        lines = parse.link_lines(output)
        bad = [line for ok, line in lines if not ok]
        if not lines:
            return Result(check.name, False, "-", "the link check measured nothing: " + _tail(output))
        return Result(check.name, not bad, f"{len(lines) - len(bad)}/{len(lines)} links ok",
                      "; ".join(bad) or f"every rail at least {check.threshold:g} Gb/s")
    if check.kind == "nccl":
        busbw = parse.nccl_busbw(output)
        if busbw is None:
            return Result(check.name, False, "-", "all_reduce_perf printed no bus bandwidth: " + _tail(output))
        ok = busbw >= check.threshold
        return Result(check.name, ok, f"{busbw:g} GB/s",
                      f"{'at least' if ok else 'below'} the floor {check.threshold:g} GB/s")
    if check.kind == "storage":
        gb, clients = parse.fio_read_gb_per_s(output)
        if not clients:
            return Result(check.name, False, "-", "fio reported nothing: " + _tail(output))
        wanted = check.expect.get("clients", clients)
        if clients < wanted:      # a sum over fewer clients says nothing about the aggregate
            return Result(check.name, False, f"{gb:g} GB/s from {clients} nodes",
                          f"only {clients} of {wanted} clients reported: {_tail(output)}")
        ok = gb >= check.threshold
        return Result(check.name, ok, f"{gb:g} GB/s from {clients} nodes",
                      f"{'at least' if ok else 'below'} {check.threshold:g} GB/s")
    failures, ran = parse.dcgm_failures(output)
    if not ran:
        return Result(check.name, False, "-", "dcgmi diag printed no results: " + _tail(output))
    ok = not failures and completed
    return Result(check.name, ok, f"{ran - len(failures)}/{ran} passed", "; ".join(failures) or "all passed")


def _judge_nodes(check: Check, output: str) -> Result:
    """`output`: `kubectl get nodes -o json` of the pool's nodes."""
    try:
        items = {n["metadata"]["name"]: n for n in json.loads(output).get("items", [])}
    except (ValueError, AttributeError, TypeError, KeyError):
        return Result(check.name, False, "-", "kubectl printed no node list: " + _tail(output))
    e, problems, bad = check.expect, [], set()
    missing = [h for h in e["hosts"] if h not in items]
    if missing:
        problems.append(f"no Node for {', '.join(missing[:5])}")
        bad.update(missing)
    for name in (h for h in e["hosts"] if h in items):
        got = items[name].get("status", {}).get("allocatable", {})
        cpu, memory_mib = parse.quantity(got.get("cpu", "0")), parse.quantity(got.get("memory", "0")) / 2**20
        gpus = parse.quantity(got.get(e["gpu_resource"], "0"))
        found = []
        if cpu < e["cpu"]:
            found.append(f"{name} offers {cpu:g} cores, the spec assumes {e['cpu']} (cpu_cores_per_host, "
                         "kubelet_reserved_cpus)")
        if memory_mib < e["memory_mib"]:
            found.append(f"{name} offers {memory_mib / 1024:.1f} GiB, the spec assumes {e['memory_mib'] / 1024:.1f} "
                         "(memory_gib_per_host is the Node's status.capacity.memory)")
        if gpus != e["gpus"]:
            found.append(f"{name} offers {gpus:g} {e['gpu_resource']}, the spec {e['gpus']}")
        if found:
            problems += found
            bad.add(name)
    hosts = len(e["hosts"])
    return Result(check.name, not problems, f"{hosts - len(bad)}/{hosts} nodes as the spec",
                  "; ".join(problems[:6]) or "allocatable as the spec assumes on every node")


def _tail(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return " / ".join(lines[-2:]) if lines else "(no output)"
