"""Runtime GPU health: node-problem-detector on every GPU node, watching the kernel log for the driver's XIDs.

node-problem-detector (kubernetes/node-problem-detector, SIG Node) is the maintained engine for node problems:
its kernel monitor reads /dev/kmsg and sets node conditions and events by pattern, which is all a GPU XID needs
(the driver logs `NVRM: Xid (PCI:...): <n>, ...` for every one). An XID of `fault_xids` sets a permanent
condition, as NVIDIA's catalog resolves it (spec/xids.py): GpuHardwareFault for one that needs NVIDIA's diagnosis
(the quarantine), GpuResetRequired for one that needs a GPU reset or a reboot (new work waits); every XID is a
Node event. The monitor looks back over the whole boot, so a restarted monitor
finds the fault again (a reboot clears the kernel log, and the condition with it). The manifests are upstream's
deployment (deployment/node-problem-detector.yaml and rbac.yaml of the release) with our monitor config, on GPU
nodes only, tolerating every taint: a monitor must keep running on a quarantined node.

A second monitor, a custom plugin of the same detector, keeps the fault beyond the boot: it records the host's
GpuHardwareFault XIDs (per boot, with their count) under /var/lib/gpucluster, beside the burn-in's verdict, and sets
GpuBurnInRequired while the latest recorded fault is newer than the last passing burn-in. The active check
between jobs (checks.py) writes its failures there too, as a record of its own. The quarantine rule
(quarantine.py) needs both conditions False, so a node leaves quarantine only after the reboot that clears the
fault and a burn-in that passes after it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import PurePosixPath
from typing import Any

from ...bash import fill
from ...records import (CHECK_RECORD, FAULT_RECORD, MAINTENANCE, MAINTENANCE_MAX_S, NVML_RECORD, PORT_RECORD, PORT_SEEN,
                        PUT_RECORD, RESULT, STATE_DIR, VERDICT_FILE, rdma_ports)
from ...spec import ClusterSpec
from ...spec.hardware import XID_LINE, xid_pattern
from ...spec.kubernetes import HealthSettings
from ...spec.xids import XidAction
from ..labels import POOL_LABEL, TOLERATE_EVERY_TAINT
from ..objects import Manifest

NAMESPACE = "kube-system"            # where upstream deploys it, beside the node's other system agents
NAME = "gpucluster-gpu-health"       # not upstream's name: a distribution's own detector may run there too
IMAGE = "registry.k8s.io/node-problem-detector/node-problem-detector"
CONDITION = "GpuHardwareFault"            # an XID that needs NVIDIA's diagnosis: quarantined until a burn-in
RESET_CONDITION = "GpuResetRequired"      # an XID that needs a GPU reset or a reboot: new work waits for it
MONITOR = "gpu-xid-monitor.json"
BURN_IN_CONDITION = "GpuBurnInRequired"
BURN_IN_MONITOR = "gpu-burn-in-monitor.json"
BURN_IN_CHECK = "check-burn-in.sh"
assert STATE_DIR == str(PurePosixPath(VERDICT_FILE).parent)   # the host's; mounted at the same path
PORT_CONDITION = "FabricPortFault"
PORT_MONITOR = "fabric-port-monitor.json"
PORT_CHECK = "check-fabric-ports.sh"
PORTS_FILE = "fabric-ports.txt"
# The hosts' ports in a ConfigMap of their own, outside the config checksum: the check reads it on every look, so
# a host added to a pool updates it without restarting the detector anywhere.
PORTS_DIR = "/ports"
PORTS_CONFIG = f"{NAME}-fabric-ports"
# A check that cannot read its inputs keeps its last verdict and says so in a marker beside it (<last>.blind);
# this condition (never a quarantine: a monitor's trouble is not the GPU's) is True while any check has one.
BLIND_CONDITION = "GpuHealthCheckBlind"
BLIND_CHECK = "check-blind.sh"
BURN_IN_LAST = f"{STATE_DIR}/gpu-burn-in-last"           # the checks' last verdicts (exit status, message)
PORT_LAST = f"{STATE_DIR}/fabric-ports-last"
# What the quarantine holds a node for: a hardware XID this boot, a fault (XID, failed check, port) not yet
# followed by a passing burn-in, and a fabric port down now (on a pool without burn-in too).
QUARANTINE_CONDITIONS = (CONDITION, BURN_IN_CONDITION, PORT_CONDITION)
SYSFS_RDMA = "/sys/class/infiniband"
BOOT_ID = "/proc/sys/kernel/random/boot_id"             # not namespaced: the host's boot, seen from the pod
# The bootstrap ClusterRole every apiserver creates for node-problem-detector: read nodes, patch their status,
# write events (kubernetes/plugin/pkg/auth/authorizer/rbac/bootstrappolicy).
CLUSTER_ROLE = "system:node-problem-detector"
LABELS = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/managed-by": "pulumi"}
_ANY_XID = XID_LINE + "[0-9]+,"
STATE_VOLUME = {"name": "state", "hostPath": {"path": STATE_DIR, "type": "DirectoryOrCreate"}}


def monitor_config(spec: ClusterSpec) -> dict[str, Any]:
    """The kernel monitor's configuration (node-problem-detector's system-log-monitor format): each XID of
    `fault_xids` sets the condition of what NVIDIA's catalog asks of the node (spec/xids.py)."""
    xids = spec.kubernetes.health.xids
    return {
        "plugin": "kmsg", "logPath": "/dev/kmsg",
        # The whole boot: a fault stays reported when the monitor restarts, until a reboot clears the kernel log.
        "lookback": "87600h", "bufferSize": 10, "source": "gpu-xid-monitor", "metricsReporting": True,
        "conditions": [{"type": CONDITION, "reason": "NoGpuHardwareXid",
                        "message": "no GPU hardware XID in the kernel log since boot"},
                       {"type": RESET_CONDITION, "reason": "NoGpuResetPending",
                        "message": "no XID asking for a GPU reset in the kernel log since boot"}],
        "rules": [{"type": "temporary", "reason": "GpuXid", "pattern": _ANY_XID + ".*"},
                  *({"type": "permanent", "condition": condition, "reason": f"GpuXid{x}",
                     "pattern": xid_pattern([x]) + ".*"}
                    for condition, action in ((CONDITION, XidAction.SERVICE), (RESET_CONDITION, XidAction.RESET))
                    for x in xids[action])],
    }


# What every custom plugin check does with its own trouble (an input it cannot read, a command that fails or does
# not answer): that says nothing of the node, so the last verdict stands (`stale`: its exit status and message,
# kept in $last on the host by `verdict`), and a marker beside it (<last>.blind) says why, which BLIND_CHECK turns
# into GpuHealthCheckBlind. A check that never judged reports healthy, as the quarantine rule's defaultStatus
# does. node-problem-detector reads any other exit status, and its own timeout, as Unknown, which the quarantine
# rule holds as unhealthy (fleet-wide, for a broken image or a missing input): every command a check runs is
# bounded (`timeout`) below the plugin's timeout.
LAST_VERDICT = PUT_RECORD + r"""keep() {     # keep WHY [WHY_WITHOUT_ONE]
  local status
  status=$(sed -n 1p "$last" 2>/dev/null || true)
  if [[ $status == [01] ]]; then
    echo "$(sed -n 2p "$last") ($1)"
    exit "$status"
  fi
  echo "${2:-$1}"
  exit 0
}
stale() {
  { mkdir -p "$state" && printf '%s\n' "$1" > "$last.blind"; } || true
  keep "no new reading: $1" "no reading yet: $1"
}
verdict() {
  put_record "$last" "$1" "$2"
  rm -f "$last.blind"
  echo "$2"
  exit "$1"
}
"""
# A disruptive action of the library's own (a roll: links bounced, the driver reloaded) fences the checks with a
# marker (MAINTENANCE): while it is fresh, a check keeps its last verdict and records nothing; the action leaves
# the host as its own checks found it (ports up, counters as the new baseline) before it lifts the marker.
FENCE = r"""in_maintenance() {
  local what since
  [[ -f $state/@MAINTENANCE@ ]] || return 1
  read -r what since < "$state/@MAINTENANCE@" || return 1
  [[ $since =~ ^[0-9]+$ ]] && (( $(date +%s) - since < @MAINTENANCE_MAX_S@ )) && maintenance=$what
}
""".replace("@MAINTENANCE@", PurePosixPath(MAINTENANCE).name).replace("@MAINTENANCE_MAX_S@", str(MAINTENANCE_MAX_S))

# The custom plugin's check, run by the detector every interval in its own image (bash, grep, sed, coreutils and
# util-linux's dmesg: node-problem-detector's Dockerfile installs them). Exit 0: no fault since the last passing
# burn-in; 1: a fault not yet followed by one (the condition is True, with the driver's line).
_BURN_IN_CHECK = r'''#!/bin/bash
set -euo pipefail
state=$1     # the host's /var/lib/gpucluster: the burn-in's verdict and this check's fault record
log=$2       # kmsg: the kernel's ring buffer; otherwise a file of kernel log lines
boot_id=$3   # a file holding this boot's id
record=$state/@RECORD@
verdict=$state/@VERDICT@
last=$state/@LAST@
fault=@PATTERN@
LAST_VERDICT
boot=$(cat "$boot_id" 2>/dev/null) || stale "cannot read the boot id from $boot_id"
if [[ $log == kmsg ]]; then
  lines=$(timeout 5 dmesg 2>/dev/null) || stale "cannot read the kernel log (dmesg)"
else
  lines=$(cat "$log" 2>/dev/null) || stale "cannot read the kernel log $log"
fi
count=$(grep -cE "$fault" <<<"$lines" || true)
# A new fault (a first one this boot, or one more) rewrites the record, so it is newer than any verdict so far.
if (( count > 0 )) && ! grep -qx "boot $boot faults $count" "$record" 2>/dev/null; then
  newest=$(grep -E "$fault" <<<"$lines" | tail -n 1)
  put_record "$record" "boot $boot faults $count" "NVRM:${newest#*NVRM:}"
fi
# The newest record is the fault a burn-in must follow: this check's XIDs, a failed active check between jobs,
# a fabric port that went down, a GPU that overheated or lost an NVLink while jobs ran.
latest=$record
for other in @CHECK@ @PORT@ @NVML@; do
  if [[ -f $state/$other && ( ! -f $latest || $state/$other -nt $latest ) ]]; then
    latest=$state/$other
  fi
done
record=$latest
if [[ ! -f $record ]]; then
  verdict 0 "no GPU hardware fault recorded on this host"
fi
if [[ ! -f $verdict ]]; then     # a pool without burn-in: the reboot that clears the fault releases the node
  verdict 0 "a GPU hardware fault is recorded and this host keeps no burn-in verdict (its pool runs none)"
fi
if [[ $verdict -nt $record ]] && grep -qx @RESULT@passed "$verdict"; then
  verdict 0 "a burn-in passed after the last GPU hardware fault"
fi
verdict 1 "no burn-in passed since this GPU fault: $(sed -n 2p "$record")"
'''.replace("LAST_VERDICT\n", LAST_VERDICT)

# GpuHealthCheckBlind: True while a check keeps its last verdict because it cannot read its inputs (the markers
# `stale` leaves, the NVML detector's too: the state directory is the host's).
_BLIND_CHECK = r'''#!/bin/bash
set -euo pipefail
state=$1
shopt -s nullglob
[[ -d $state && -r $state ]] || { echo "cannot read $state, where the checks keep their verdicts"; exit 1; }
markers=("$state"/*.blind)
if (( ${#markers[@]} == 0 )); then
  echo "every health check reads its inputs"
  exit 0
fi
blind=
for m in "${markers[@]}"; do
  name=${m##*/}
  blind+="${name%.blind}: $(sed -n 1p "$m" 2>/dev/null || true); "
done
echo "health checks without a new reading, their last verdicts kept: ${blind%; }"
exit 1
'''


# dcgmi diag's result table (awk -F'|'): "| test | result |" rows, printed as "test|result"; a test's further
# rows (per GPU) leave the name blank. DCGM_FAILED (awk -F'|') over those rows: the failed tests, "; "-joined.
# Used between jobs (checks.py) and around Slurm jobs (slurm/node_check.py).
DCGM_RESULTS = '''NF == 4 { name = $2; result = $3; gsub(/^ +| +$/, "", name); gsub(/^ +| +$/, "", result)
    if (name != "") test = name
    if (result ~ /^(Pass|Fail|Skip|Warn)/) print test "|" result }'''
DCGM_FAILED = '''$2 ~ /^Fail/ { printf "%s%s: %s", sep, $1, $2; sep = "; " }'''

# awk over `nvidia-smi nvlink -s`: "GPU <n>: <name> (UUID: ...)" then "Link <n>: <speed> GB/s" or "<inactive>"
# per link. A link trained down runs below the others' speed; NVML says when a GPU has no active link at all.
# Prints the links that are down, comma-separated, or nothing. Used between jobs (checks.py) and while
# they run (nvml.py).
NVLINK_DOWN = '''/^GPU [0-9]+:/ { gpu = $2; sub(/:$/, "", gpu) }
    /all links are inActive/ { bad[++b] = "GPU " gpu ": no active link" }
    $1 == "Link" { link = $2; sub(/:$/, "", link); n++
      if ($3 == "<inactive>") bad[++b] = "GPU " gpu " link " link ": inactive"
      else { speed[n] = $3 + 0; where[n] = "GPU " gpu " link " link; if (speed[n] > top) top = speed[n] } }
    END { for (i = 1; i <= n; i++)
        if (i in speed && speed[i] < top) bad[++b] = where[i] ": " speed[i] " of " top " GB/s"
      if (n == 0 && b == 0) bad[++b] = "no NVLink reported"
      for (i = 1; i <= b; i++) printf "%s%s", (i > 1 ? ", " : ""), bad[i] }'''


def burn_in_check(spec: ClusterSpec) -> str:
    """The custom plugin's script: the XIDs of the kernel monitor's GpuHardwareFault (a reset needs no burn-in)."""
    pattern = xid_pattern(spec.kubernetes.health.xids[XidAction.SERVICE])
    return fill(_BURN_IN_CHECK, PATTERN=pattern, RESULT=RESULT, RECORD=PurePosixPath(FAULT_RECORD).name,
                VERDICT=PurePosixPath(VERDICT_FILE).name, LAST=PurePosixPath(BURN_IN_LAST).name,
                CHECK=PurePosixPath(CHECK_RECORD).name,
                PORT=PurePosixPath(PORT_RECORD).name, NVML=PurePosixPath(NVML_RECORD).name)


# One permanent condition of a custom plugin monitor: its type, (reason, message) while healthy, the reason
# while the script exits 1 (its output the message), the script in /config and its arguments.
PluginRule = tuple[str, tuple[str, str], str, str, list[str]]


def plugin_monitor(source: str, rules: list[PluginRule], interval: str = "30s",
                   timeout: str = "10s") -> dict[str, Any]:
    """A custom plugin monitor (node-problem-detector's custom-plugin-monitor format): each rule's script sets
    its condition by its exit status every `interval`."""
    return {
        "plugin": "custom",
        "pluginConfig": {"invoke_interval": interval, "timeout": timeout, "max_output_length": 300,
                         "concurrency": 1},
        "source": source, "metricsReporting": True,
        "conditions": [{"type": c, "reason": reason, "message": message} for c, (reason, message), *_ in rules],
        "rules": [{"type": "permanent", "condition": c, "reason": fault, "path": f"/config/{script}", "args": args,
                   "timeout": timeout} for c, _, fault, script, args in rules],
    }


def burn_in_monitor_config() -> dict[str, Any]:
    return plugin_monitor("gpu-burn-in-monitor", [
        (BURN_IN_CONDITION, ("NoFaultSinceBurnIn", "no GPU hardware fault after the last passing burn-in"),
         "FaultSinceBurnIn", BURN_IN_CHECK, [STATE_DIR, "kmsg", BOOT_ID]),
        (BLIND_CONDITION, ("HealthChecksReading", "every health check reads its inputs"),
         "HealthCheckWithoutReading", BLIND_CHECK, [STATE_DIR])])


# The fabric port plugin: every RDMA port the spec gives this host (its NICs' devices, port 1) must be ACTIVE and
# LinkUp, and its link_downed counter (the times the link went down) must not have grown since the last look: a
# port that flapped between two looks is caught by the counter. A fault rewrites the record on every look while
# it lasts, so a burn-in can only follow it once the port is back. A reboot resets the counters: a lower count
# is a new baseline. The node's name comes from the detector's environment (NODE_NAME, its pod's node).
_PORT_CHECK = r'''#!/bin/bash
set -euo pipefail
state=$1     # the host's /var/lib/gpucluster: this check's record and counts
sysfs=$2     # /sys/class/infiniband
ports=$3     # "<host> <device>/<port> ..." for each GPU host with RDMA NICs
record=$state/@RECORD@
seen=$state/@SEEN@
last=$state/@LAST@
LAST_VERDICT
FENCE
host=${NODE_NAME:-}
[[ -n $host ]] || stale "NODE_NAME is not set: cannot tell this node's ports"
wanted=$(awk -v h="$host" '$1 == h { $1 = ""; print }' "$ports" 2>/dev/null) || stale "cannot read $ports"
if [[ -z ${wanted// } ]]; then
  verdict 0 "no fabric port is expected on $host"
fi
if in_maintenance; then
  keep "$maintenance under way on $host: its ports are not judged until it ends"
fi
[[ -d $sysfs ]] || stale "cannot read $sysfs: no RDMA device seen, the driver not loaded or sysfs not mounted"
faults=()
counts=()
for p in $wanted; do
  dir=$sysfs/${p%/*}/ports/${p#*/}
  if ! state_now=$(cat "$dir/state" 2>/dev/null) || ! phys=$(cat "$dir/phys_state" 2>/dev/null); then
    faults+=("$p: no such port")
    continue
  fi
  if [[ $state_now != *ACTIVE* || $phys != *LinkUp* ]]; then
    faults+=("$p: ${state_now#*: }/${phys#*: }")
  fi
  downed=$(cat "$dir/counters/link_downed" 2>/dev/null || echo "")
  [[ $downed =~ ^[0-9]+$ ]] || continue
  before=$(awk -v p="$p" '$1 == p { print $2 }' "$seen" 2>/dev/null || true)
  if [[ $before =~ ^[0-9]+$ ]] && (( downed > before )); then
    faults+=("$p: link went down $((downed - before)) time(s)")
  fi
  counts+=("$p $downed")
done
mkdir -p "$state"
printf '%s\n' "${counts[@]}" > "$seen.new"
mv -f "$seen.new" "$seen"
if (( ${#faults[@]} > 0 )); then
  joined=$(printf '%s; ' "${faults[@]}")
  message="fabric port down or flapping on $host: ${joined%; }"
  put_record "$record" "fabric $(date -u +%Y-%m-%dT%H:%M:%SZ)" "$message"
  verdict 1 "$message"
fi
verdict 0 "every fabric port of $host is active"
'''.replace("LAST_VERDICT\n", LAST_VERDICT).replace("FENCE\n", FENCE)


def port_check() -> str:
    return fill(_PORT_CHECK, RECORD=PurePosixPath(PORT_RECORD).name, SEEN=PurePosixPath(PORT_SEEN).name,
                LAST=PurePosixPath(PORT_LAST).name)


def expected_ports(spec: ClusterSpec) -> str:
    """`<host> <device>/1 ...` for every GPU host with RDMA NICs (port 1: one port per ConnectX function)."""
    if not spec.fabric.rdma:
        return ""
    return "".join(f"{h.hostname} {' '.join(rdma_ports(p))}\n" for p in spec.node_pools if p.nics for h in p.hosts)


def port_monitor_config() -> dict[str, Any]:
    return plugin_monitor("fabric-port-monitor", [(
        PORT_CONDITION, ("FabricPortsActive", "every fabric port of this node is active and has not gone down"),
        "FabricPortDownOrFlapping", PORT_CHECK, [STATE_DIR, SYSFS_RDMA, f"{PORTS_DIR}/{PORTS_FILE}"])])


def image(health: HealthSettings) -> str:
    return f"{IMAGE}:{health.npd_version}"


def detector(spec: ClusterSpec, role: str, name: str, container: dict[str, Any], volumes: list[dict[str, Any]],
             data: dict[str, str], **pod: Any) -> list[Manifest]:
    """A node-problem-detector DaemonSet on every GPU node, tolerating every taint (a monitor must keep running on
    a quarantined node), and its ConfigMap of monitors and scripts mounted at /config. The detector reads its
    config once, at start: a changed config rolls the pods (the look back finds any fault again, and the record
    on the host outlives the pod)."""
    selector = {"app.kubernetes.io/name": name}
    meta = {"namespace": NAMESPACE, "labels": {**LABELS, **selector}}
    checksum = {"gpucluster.io/config-sha256": hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()}
    gpu_nodes = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": POOL_LABEL, "operator": "Exists"}]}]}}}
    return [
        Manifest(f"{role}-config", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, **meta},
                                    "data": data}),
        Manifest(role, {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name, **meta},
                        "spec": {"selector": {"matchLabels": selector}, "template": {
                            "metadata": {"labels": {**LABELS, **selector}, "annotations": checksum},
                            "spec": {
                                "serviceAccountName": NAME, "priorityClassName": "system-node-critical",
                                "affinity": gpu_nodes, **pod, "containers": [container],
                                "tolerations": [dict(t) for t in TOLERATE_EVERY_TAINT],
                                "volumes": [*volumes, {"name": "config",
                                                       "configMap": {"name": name, "defaultMode": 0o555}}]}}}}),
    ]


def detector_container(spec: ClusterSpec, flags: list[str], mounts: list[dict[str, Any]],
                       **extra: Any) -> dict[str, Any]:
    """node-problem-detector's container: privileged (it reads /dev/kmsg and writes the host's state, as
    upstream's deployment runs it), the node's name in NODE_NAME, the config at /config."""
    return {
        "name": "node-problem-detector", "image": image(spec.kubernetes.health),
        "command": ["/node-problem-detector", "--logtostderr", *flags],
        "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
        # No requests (nor limits, which would set them): a GPU job may take a node's whole allocatable, and a
        # request would leave the detector pending there or, at its critical priority, preempt the tenant's pod.
        # Upstream's 10m and 80Mi are what it uses; the priority keeps the kubelet from evicting it first.
        "securityContext": {"privileged": True},
        "volumeMounts": [*mounts, {"name": "config", "mountPath": "/config", "readOnly": True}], **extra}


def render_gpu_health(spec: ClusterSpec) -> list[Manifest]:
    """Service account bound to the bootstrap role, the monitors' ConfigMap, the hosts' fabric ports and the
    DaemonSet on GPU nodes."""
    meta = {"namespace": NAMESPACE, "labels": dict(LABELS)}
    container = detector_container(
        spec, [f"--config.system-log-monitor=/config/{MONITOR}",
               f"--config.custom-plugin-monitor=/config/{BURN_IN_MONITOR},/config/{PORT_MONITOR}"],
        [{"name": "kmsg", "mountPath": "/dev/kmsg", "readOnly": True},
         {"name": "state", "mountPath": STATE_DIR},
         {"name": "localtime", "mountPath": "/etc/localtime", "readOnly": True},
         {"name": "ports", "mountPath": PORTS_DIR, "readOnly": True}])
    data = {MONITOR: json.dumps(monitor_config(spec), indent=2) + "\n",
            BURN_IN_MONITOR: json.dumps(burn_in_monitor_config(), indent=2) + "\n",
            BURN_IN_CHECK: burn_in_check(spec), PORT_MONITOR: json.dumps(port_monitor_config(), indent=2) + "\n",
            PORT_CHECK: port_check(), BLIND_CHECK: _BLIND_CHECK}
    volumes = [{"name": "kmsg", "hostPath": {"path": "/dev/kmsg", "type": "CharDevice"}},
               {"name": "localtime", "hostPath": {"path": "/etc/localtime", "type": "File"}},
               STATE_VOLUME,
               {"name": "ports", "configMap": {"name": PORTS_CONFIG}}]
    return [
        Manifest("gpu-health-sa", {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": NAME, **meta}}),
        Manifest("gpu-health-binding", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": NAME, "labels": dict(LABELS)},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": CLUSTER_ROLE},
            "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]}),
        Manifest("gpu-health-ports", {"apiVersion": "v1", "kind": "ConfigMap",
                                      "metadata": {"name": PORTS_CONFIG, **meta},
                                      "data": {PORTS_FILE: expected_ports(spec)}}),
        *detector(spec, "gpu-health", NAME, container, volumes, data),
    ]
