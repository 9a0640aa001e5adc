"""Active health checks between jobs: a short DCGM diagnostic (and the NVLinks of an NVSwitch board), then an NCCL
all_reduce across the node's GPUs, on each idle GPU node, queued through Kueue.

Kueue is the engine that knows when a node is idle, so the check is a Kueue workload, not a timer of our own:
- one CronJob per host queues a Job that asks for all of the host's GPUs, on that host only (a nodeSelector that
  Kueue's topology-aware scheduling honours), so it is admitted only while no tenant's pod holds a GPU there;
- its ClusterQueue is in the tenants' cohort with no quota of its own: it borrows what tenants leave unused, and
  never preempts (reclaimWithinCohort, borrowWithinCohort and withinClusterQueue all Never), while tenants reclaim
  their lent GPUs from it as from any borrower (their default reclaimWithinCohort Any);
- its PriorityClass is below every workload priority of the spec and never preempts pods (preemptionPolicy
  Never), so neither Kueue nor the kube-scheduler puts it before a tenant.
Kueue manages jobs only in namespaces that carry the tenant label (its managedJobsNamespaceSelector), so the
check's namespace carries it too, with its own name as the value; no tenant can have that namespace (it is a
system namespace), and the policies treat it as the platform's, not a tenant's. It enforces Pod Security
privileged: the check writes its failure on the host (a hostPath), beside the burn-in's verdict, where the
detector's custom plugin (detector.py) reads it and holds the node in quarantine until a burn-in passes.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from pathlib import PurePosixPath
from typing import Any

from ...bash import fill
from ...spec import ClusterSpec, Host, NodePool
from ...spec.cluster import OPERATOR_NAMESPACES, checked_pools
from ...spec.kubernetes import LOWEST_PRIORITY, cron_fields
from ...spec.hardware import GPU_RESOURCE
from ...fabric.checks import NCCL_TESTS
from ...fabric.nccl import LARGEST_BUSBW_AWK
from ...records import PUT_RECORD, min_busbw
from .detector import CHECK_RECORD, DCGM_FAILED, DCGM_RESULTS, NVLINK_DOWN, STATE_DIR, STATE_VOLUME
from ..tenancy.jobs import QUEUE_LABEL
from ..labels import POOL_LABEL
from ..objects import Manifest
from ..tenancy.tenant import KUEUE_API, LOCAL_QUEUE, QUEUE_RESOURCES, TENANT_LABEL

NAMESPACE = OPERATOR_NAMESPACES["health_checks"]
NAME = "gpucluster-health-checks"         # the ClusterQueue and the PriorityClass
# On a ClusterQueue that is not a dedicated pool's owner's but names its flavor: why (the policies read it).
ISOLATION_EXCEPTION = "gpucluster.io/isolation-exception"
HOST_LABEL = "gpucluster.io/host"         # on each CronJob, its Jobs and their pods: which node a result is for
SCRIPT = "run-check.sh"
NCCL_SCRIPT = "run-nccl.sh"
HOSTNAME = "kubernetes.io/hostname"
_LABELS = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/managed-by": "pulumi"}
_CRONJOB_NAME_MAX = 52                    # the API server's limit: the controller appends 11 characters


def namespace_labels() -> dict[str, str]:
    """What makes Kueue manage the check's Jobs (and the policies tell it from a tenant's namespace)."""
    return {TENANT_LABEL: NAMESPACE}


def cronjob_name(hostname: str) -> str:
    """gpu-check-<host>, shortened with a hash of the host where the API server's 52 characters do not hold it."""
    name = f"gpu-check-{hostname}"
    if len(name) <= _CRONJOB_NAME_MAX:
        return name
    digest = hashlib.sha256(hostname.encode()).hexdigest()[:8]
    return f"{name[:_CRONJOB_NAME_MAX - 9].rstrip('.-')}-{digest}"


# A failed test, recorded on the host where the detector reads it and holds the node until a burn-in passes.
_FAIL = PUT_RECORD + r'''record=$state/@RECORD@
fail() {
  put_record "$record" "check $(date -u +%Y-%m-%dT%H:%M:%SZ) failed" "active check failed: $1"
  echo "FAILED: $1; the node stays quarantined until a burn-in passes"
  exit 1
}
'''

# Run in validation.dcgm_image (Ubuntu, bash and awk) with every GPU of the host. Exit 0: passed; 1: a test
# failed or, on an NVSwitch board, an NVLink is down or trained below full speed, recorded on the host so that
# the node is quarantined; 2: no verdict (the diagnostic did not run or
# printed no result), which fails the Job (an alert) but holds no node: a tool's failure is not the GPU's.
_CHECK = r'''#!/bin/bash
set -euo pipefail
state=$1     # the host's /var/lib/gpucluster, where the detector reads the record
level=$2     # dcgmi diag -r <level>
nvlink=$3    # 1: an NVSwitch board, where every NVLink of every GPU must be up at full speed
RECORD_FAILURE
nv-hostengine >/dev/null || { echo "nv-hostengine did not start: no verdict on the GPUs"; exit 2; }
status=0
out=$(dcgmi diag -r "$level" 2>&1) || status=$?
printf '%s\n' "$out"
# dcgmi's result table: "| test | result |" rows; a test's further rows (per GPU) leave the name blank.
rows() {
  awk -F'|' @DCGM_RESULTS@ <<<"$out"
}
ran=$(rows | cut -d'|' -f1 | sort -u | grep -c . || true)
failed=$(rows | awk -F'|' @DCGM_FAILED@)
failed=${failed:+dcgmi diag -r $level: $failed}
if (( nvlink )) && (( ran > 0 )); then
  # nvidia-smi's "GPU <n>: <name> (UUID: ...)" then "Link <n>: <speed> GB/s" or "<inactive>" per link; a link
  # trained down runs below the others' speed; NVML says when a GPU has no active link at all.
  links=$(nvidia-smi nvlink -s 2>&1) || { echo "nvidia-smi nvlink -s failed: no verdict on the GPUs"; exit 2; }
  printf '%s\n' "$links"
  down=$(awk @NVLINK@ <<<"$links")
  if [[ -n $down ]]; then
    failed="${failed:+$failed; }NVLink: $down"
  fi
fi
if [[ -n $failed ]]; then
  fail "$failed"
fi
if (( status != 0 || ran == 0 )); then
  echo "dcgmi diag -r $level exited $status with no failed test among $ran: no verdict on the GPUs"
  exit 2
fi
echo "passed: dcgmi diag -r $level, $ran tests"
'''


# Run in fabric.checks.nccl_tests_image once the DCGM diagnostic passed, with every GPU of the host in one
# process: all_reduce at 8 GiB only, the size whose bus bandwidth the burn-in judges (seconds, not the burn-in's
# sweep). Exit 1: values came back wrong (nccl-tests' own check, "Out of bounds values : N FAILED", which also
# makes it exit 1: data corruption) or the bus bandwidth is below the pool's burn-in minimum, recorded like a
# failed test; 2: no verdict (it did not run or printed no bandwidth).
_NCCL = r'''#!/bin/bash
set -euo pipefail
state=$1     # the host's /var/lib/gpucluster, where the detector reads the record
gpus=$2      # every GPU of the host
min=$3       # GB/s: the pool's burn-in minimum at 8 GiB
RECORD_FAILURE
status=0
out=$(@BIN@ -b 8G -e 8G -g "$gpus" 2>&1) || status=$?
printf '%s\n' "$out"
wrong=$(sed -n 's/^[# ]*Out of bounds values : \([0-9]*\) FAILED.*/\1/p' <<<"$out")
if [[ -n $wrong ]]; then
  fail "NCCL all_reduce on $gpus GPUs returned $wrong wrong value(s)"
fi
busbw=$(LARGEST_BUSBW <<<"$out")
if (( status != 0 )) || [[ -z $busbw ]]; then
  echo "all_reduce_perf exited $status with no bus bandwidth: no verdict on the GPUs"
  exit 2
fi
if awk -v b="$busbw" -v min="$min" 'BEGIN { exit !(b < min) }'; then
  fail "NCCL all_reduce bus bandwidth $busbw GB/s at 8 GiB on $gpus GPUs is below $min GB/s"
fi
echo "passed: NCCL all_reduce bus bandwidth $busbw GB/s at 8 GiB on $gpus GPUs (minimum $min)"
'''


def check_script() -> str:
    return fill(_CHECK.replace("RECORD_FAILURE\n", _FAIL), RECORD=PurePosixPath(CHECK_RECORD).name,
                NVLINK=NVLINK_DOWN, DCGM_RESULTS=DCGM_RESULTS,
                DCGM_FAILED=DCGM_FAILED)


def nccl_script() -> str:
    return fill(_NCCL.replace("RECORD_FAILURE\n", _FAIL).replace("LARGEST_BUSBW", LARGEST_BUSBW_AWK),
                RECORD=PurePosixPath(CHECK_RECORD).name, BIN=NCCL_TESTS)


def _cluster_queue(spec: ClusterSpec, pools: list[NodePool]) -> dict[str, Any]:
    resources = [*QUEUE_RESOURCES[:2], GPU_RESOURCE]
    dedicated = sorted(p.name for p in pools if p.dedicated_to)
    exception = {"annotations": {ISOLATION_EXCEPTION: f"active GPU checks on dedicated pool(s) {', '.join(dedicated)} "
                                                      "(kubernetes.health.active_checks.dedicated_pools)"}} \
        if dedicated else {}
    return {"apiVersion": KUEUE_API, "kind": "ClusterQueue",
            "metadata": {"name": NAME, "labels": dict(_LABELS), **exception},
            "spec": {"cohortName": spec.kubernetes.kueue.cohort,
                     "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}},
                     # One host's check waiting for its host must not hold back another host's.
                     "queueingStrategy": "BestEffortFIFO",
                     "resourceGroups": [{"coveredResources": resources, "flavors": [
                         {"name": p.name, "resources": [{"name": r, "nominalQuota": "0"} for r in resources]}
                         for p in pools]}],
                     "preemption": {"reclaimWithinCohort": "Never", "borrowWithinCohort": {"policy": "Never"},
                                    "withinClusterQueue": "Never"}}}


def spread(schedule: str, hostname: str) -> str:
    """The host's own time within the schedule's interval, so that a fleet's checks (and their image pulls and
    Kueue admissions) do not all start in one minute: a fixed minute becomes the host's minute, and a stepped
    hour or minute (`*/6`) starts at the host's offset within the step (`3-23/6`). Derived from the host's name:
    the same on every apply. A list, a range or a fixed hour is the site's choice and kept."""
    minute, hour, *rest = cron_fields(schedule)
    h = int.from_bytes(hashlib.sha256(hostname.encode()).digest()[:8], "big")
    if (step := re.fullmatch(r"\*/([0-9]+)", minute)) and int(step[1]) > 1:
        n = int(step[1])
        minute, h = f"{h % n}-59/{n}", h // n
    elif minute.isdigit():
        minute, h = str(h % 60), h // 60
    if minute.isdigit() and (step := re.fullmatch(r"\*/([0-9]+)", hour)) and int(step[1]) > 1:
        hour = f"{h % int(step[1])}-23/{step[1]}"
    return " ".join([minute, hour, *rest])


def _cronjob(spec: ClusterSpec, pool: NodePool, host: Host) -> Manifest:
    a = spec.kubernetes.health.active_checks
    labels = {**_LABELS, HOST_LABEL: host.hostname, POOL_LABEL: pool.name}
    # Every GPU of the host: admitted only while none is in use. DCGM's host engine and the diagnostic's plugins
    # want a few GiB of host memory; no limit, so a large host never kills the check for it.
    step = {"resources": {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {GPU_RESOURCE: pool.gpu.count}},
            "volumeMounts": [{"name": "state", "mountPath": STATE_DIR},
                             {"name": "check", "mountPath": "/check", "readOnly": True}]}
    dcgm = {"name": "dcgm-diag", "image": spec.validation.dcgm_image,
            "command": ["/bin/bash", f"/check/{SCRIPT}", STATE_DIR, str(a.dcgm_level), str(int(pool.gpu.nvswitch))],
            # nvidia-smi comes with the driver's utilities, which the container toolkit mounts on request.
            "env": [{"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"}], **step}
    # The NCCL test runs once the diagnostic passed: an init container's failure ends the pod before it.
    nccl = {"name": "nccl-all-reduce", "image": spec.fabric.checks.nccl_tests_image,
            "command": ["/bin/bash", f"/check/{NCCL_SCRIPT}", STATE_DIR, str(pool.gpu.count), str(min_busbw(pool))],
            **step}
    pod = {
        "restartPolicy": "Never", "priorityClassName": NAME, "nodeSelector": {HOSTNAME: host.hostname},
        **({"initContainers": [dcgm], "containers": [nccl]} if a.nccl else {"containers": [dcgm]}),
        "volumes": [dict(STATE_VOLUME),
                    {"name": "check", "configMap": {"name": "gpu-check", "defaultMode": 0o555}}]}
    return Manifest(f"gpu-check-{host.hostname}", {
        "apiVersion": "batch/v1", "kind": "CronJob",
        "metadata": {"name": cronjob_name(host.hostname), "namespace": NAMESPACE, "labels": dict(labels)},
        "spec": {"schedule": spread(a.schedule, host.hostname), "timeZone": "Etc/UTC",
                 # A check waiting for its host to be idle is the next one too; a missed run is not made up.
                 "concurrencyPolicy": "Forbid", "startingDeadlineSeconds": 600,
                 "successfulJobsHistoryLimit": 1, "failedJobsHistoryLimit": 3,
                 "jobTemplate": {"metadata": {"labels": {**labels, QUEUE_LABEL: LOCAL_QUEUE}}, "spec": {
                     # Counted from admission: a Job suspended in its queue has not started.
                     "backoffLimit": 0, "activeDeadlineSeconds": a.timeout_s,
                     "template": {"metadata": {"labels": dict(labels)}, "spec": pod}}}}})


def render_host_checks(spec: ClusterSpec, pools: Sequence[NodePool]) -> list[Manifest]:
    """The CronJob of each host of `pools` that gets the check."""
    names = {p.name for p in pools}
    return [_cronjob(spec, pool, host) for pool in checked_pools(spec) if pool.name in names for host in pool.hosts]


def render_health_checks(spec: ClusterSpec, pools: Sequence[NodePool] | None = None) -> list[Manifest]:
    """The PriorityClass, ClusterQueue and LocalQueue the checks go through, their script, and the CronJob of
    each host of `pools` (omitted: every pool's)."""
    checked = checked_pools(spec)
    if not checked:
        return []
    return [
        Manifest("health-check-priority", {
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": NAME, "labels": dict(_LABELS)},
            # Below every job: the spec's WorkloadPriorityClasses start one above it. A fixed value, since a
            # PriorityClass's value is immutable and one derived from the spec would need replacing on day 2.
            "value": LOWEST_PRIORITY,
            "preemptionPolicy": "Never", "globalDefault": False,
            "description": "gpucluster's active GPU health checks: below every tenant's job, never preempting"}),
        Manifest("health-check-queue", _cluster_queue(spec, checked)),
        Manifest("health-check-local-queue", {
            "apiVersion": KUEUE_API, "kind": "LocalQueue",
            "metadata": {"name": LOCAL_QUEUE, "namespace": NAMESPACE, "labels": dict(_LABELS)},
            "spec": {"clusterQueue": NAME}}),
        # The check talks to nothing but its own host engine, over the pod's loopback.
        Manifest("health-check-deny", {
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "default-deny", "namespace": NAMESPACE, "labels": dict(_LABELS)},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}}),
        Manifest("health-check-script", {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "gpu-check", "namespace": NAMESPACE, "labels": dict(_LABELS)},
            "data": {SCRIPT: check_script(), NCCL_SCRIPT: nccl_script()}}),
        *render_host_checks(spec, spec.node_pools if pools is None else pools),
    ]
