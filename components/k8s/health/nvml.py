"""The GPUs read through NVML while jobs run: a second node-problem-detector on every GPU node runs nvidia-smi each
minute, for what the kernel log does not say. A GPU above the spec's temperature limit at every look for
`temperature_for_s` sets GpuOverheating (a cooling fault: a fan, a blocked inlet, a failing cold plate); an NVLink
of an NVSwitch board that is inactive or trained below the others' speed sets GpuNvlinkDown (a link that fails
training after a reset logs no XID). A fault the spec quarantines on is also recorded under /var/lib/gpucluster,
so that on a pool that burns in the node stays held (GpuBurnInRequired, detector.py) until a burn-in passes after
the fault is gone.

The pod runs in the GPU Operator's runtime class with NVIDIA_VISIBLE_DEVICES=all and the `utility` capability,
as the operator's own DCGM exporter does: the container toolkit mounts nvidia-smi and the driver's NVML library
into it without a GPU being allocated, so tenants keep every GPU. A detector of its own, apart from the kernel
monitor, so that a node where that runtime cannot start it (a driver not yet loaded) still has its XIDs and
fabric ports watched. A driver upgrade leaves the mounted library stale: the liveness probe (nvidia-smi -L)
restarts the container with the driver's new one, and meanwhile the last verdict stands. A reading that fails
is not a GPU fault, so it never taints a node (an Unknown condition would, fleet-wide if the runtime broke).
"""

from __future__ import annotations

import json
from pathlib import PurePosixPath
from typing import Any

from ...bash import fill
from ...spec import ClusterSpec
from .detector import (FENCE, LAST_VERDICT, NAMESPACE, NVLINK_DOWN, NVML_RECORD, STATE_DIR, STATE_VOLUME, LABELS,
                     PluginRule, detector, detector_container, plugin_monitor)
from ..objects import Manifest

NAME = "gpucluster-gpu-nvml"
MONITOR = "gpu-nvml-monitor.json"
CHECK = "check-gpus.sh"
TEMPERATURE_CONDITION = "GpuOverheating"
NVLINK_CONDITION = "GpuNvlinkDown"
CONDITIONS = {"temperature": TEMPERATURE_CONDITION, "nvlink": NVLINK_CONDITION}
# The hosts on NVSwitch boards, in a ConfigMap of their own outside the config checksum (read on every look), so
# that a host added to a pool rolls no detector.
HOSTS_CONFIG = f"{NAME}-hosts"
HOSTS_DIR = "/hosts"
HOSTS_FILE = "nvlink-hosts.txt"
LAST = "gpu-nvml-last"         # -<kind>, in the state directory: each check's last verdict (exit status, message)
HOT_SINCE = "gpu-hot-since"     # "<gpu> <since> <last look>" for each GPU above the limit
# A look missed for longer than this (the detector restarting) starts a GPU's time above the limit again.
_GAP_S = 300
_PLUGIN_TIMEOUT_S = 30           # the detector's: past it, the condition turns Unknown
_SMI_S = 20                      # nvidia-smi's bound, under the plugin's

# Run by the detector every minute in its own image (bash, awk, sed, grep; nvidia-smi from the toolkit). Exit 0:
# healthy; 1: the fault (the condition is True, this output its message).
_CHECK = r'''#!/bin/bash
set -euo pipefail
state=$1     # the host's /var/lib/gpucluster: the last verdicts, the hot GPUs' times, the fault record
record=$2    # 1: a fault is recorded there, so a pool that burns in holds the node until a burn-in passes
kind=$3      # temperature LIMIT_C FOR_S, or nvlink HOSTS_FILE
last=$state/@LAST@-$kind
node=${NODE_NAME:-}
# A reading that fails or does not answer (the driver reloading, a library left stale by a driver upgrade) says
# nothing of the GPUs: the last verdict stands, and the liveness probe restarts this detector with the driver's
# current library. A fault is also recorded, so that a pool that burns in holds the node until a burn-in passes.
LAST_VERDICT
FENCE
fault() {
  if (( record )); then
    put_record "$state/@RECORD@" "nvml $(date -u +%Y-%m-%dT%H:%M:%SZ)" "$1"
  fi
  verdict 1 "$1"
}
[[ -n $node ]] || stale "NODE_NAME is not set"
if in_maintenance; then
  keep "$maintenance under way on $node: its GPUs are not judged until it ends"
fi
case $kind in
  temperature)
    limit=$4
    for_s=$5
    since=$state/@SINCE@
    out=$(timeout @SMI_S@ nvidia-smi -q -d TEMPERATURE 2>&1) || stale "nvidia-smi -q failed or did not answer in @SMI_S@ s: $(sed -n 1p <<<"$out")"
    # nvidia-smi -q: "GPU <bus id>" opens each GPU's section, "GPU Current Temp : <n> C" is in it (N/A if unread).
    temps=$(awk '/^GPU [0-9A-Fa-f]+:/ { gpu = $2 }
      /^ +GPU Current Temp +:/ { print gpu, ($NF == "C" ? $(NF - 1) : "N/A") }' <<<"$out")
    [[ -n $temps ]] || stale "nvidia-smi -q printed no GPU temperature"
    now=$(date +%s)
    hot=()
    kept=()
    while read -r gpu t; do
      if [[ ! $t =~ ^[0-9]+$ ]] || (( t <= limit )); then
        continue
      fi
      from=$(awk -v g="$gpu" -v now="$now" '$1 == g && now - $3 <= @GAP@ { print $2 }' "$since" 2>/dev/null || true)
      from=${from:-$now}
      kept+=("$gpu $from $now")
      if (( now - from >= for_s )); then
        hot+=("GPU $gpu at $t C for $(( (now - from) / 60 )) min")
      fi
    done <<<"$temps"
    mkdir -p "$state"
    printf '%s\n' "${kept[@]}" > "$since.new"
    mv -f "$since.new" "$since"
    if (( ${#hot[@]} > 0 )); then
      joined=$(printf '%s; ' "${hot[@]}")
      fault "GPU above $limit C for ${for_s}s on $node: ${joined%; }"
    fi
    verdict 0 "no GPU of $node above $limit C for ${for_s}s"
    ;;
  nvlink)
    hosts=$4
    [[ -r $hosts ]] || stale "cannot read $hosts"
    grep -qxF "$node" "$hosts" || verdict 0 "$node has no NVSwitch board: no NVLink to watch"
    out=$(timeout @SMI_S@ nvidia-smi nvlink -s 2>&1) || stale "nvidia-smi nvlink -s failed or did not answer in @SMI_S@ s: $(sed -n 1p <<<"$out")"
    down=$(awk @NVLINK@ <<<"$out")
    [[ -z $down ]] || fault "NVLink down on $node: $down"
    verdict 0 "every NVLink of $node is up at full speed"
    ;;
  *)
    echo "unknown check $kind (temperature or nvlink)"
    exit 2
    ;;
esac
'''


def check_script() -> str:
    return fill(_CHECK.replace("LAST_VERDICT\n", LAST_VERDICT).replace("FENCE\n", FENCE), LAST=LAST,
                SINCE=HOT_SINCE, GAP=_GAP_S,
                RECORD=PurePosixPath(NVML_RECORD).name, NVLINK=NVLINK_DOWN, SMI_S=_SMI_S)


def enabled(spec: ClusterSpec) -> bool:
    h = spec.kubernetes.health
    return h.enabled and h.gpu_monitor.enabled


def quarantine_conditions(spec: ClusterSpec) -> tuple[str, ...]:
    """The conditions of this detector that quarantine a node, in a fixed order (the rule's list is immutable)."""
    if not enabled(spec):
        return ()
    on = spec.kubernetes.health.gpu_monitor.quarantine_on
    return tuple(c for kind, c in CONDITIONS.items() if kind in on)


def nvlink_hosts(spec: ClusterSpec) -> str:
    """One line per host on an NVSwitch board, where every NVLink of every GPU must be up."""
    return "".join(f"{h.hostname}\n" for p in spec.node_pools if p.gpu.nvswitch for h in p.hosts)


def monitor_config(spec: ClusterSpec) -> dict[str, Any]:
    m, limit = spec.kubernetes.health.gpu_monitor, spec.kubernetes.monitoring.gpu_temperature_limit_c
    record = lambda kind: "1" if kind in m.quarantine_on else "0"  # noqa: E731
    rules: list[PluginRule] = [
        (TEMPERATURE_CONDITION, ("GpuTemperatureNormal", f"no GPU above {limit} C for {m.temperature_for_s}s"),
         "GpuAboveTemperatureLimit", CHECK,
         [STATE_DIR, record("temperature"), "temperature", str(limit), str(m.temperature_for_s)]),
        (NVLINK_CONDITION, ("NvlinksUp", "every NVLink up at full speed, or no NVSwitch board"),
         "NvlinkDownOrDegraded", CHECK, [STATE_DIR, record("nvlink"), "nvlink", f"{HOSTS_DIR}/{HOSTS_FILE}"])]
    # nvidia-smi takes a few seconds on an eight-GPU node; once a minute costs a running job nothing measurable.
    return plugin_monitor("gpu-nvml-monitor", rules, interval="60s", timeout=f"{_PLUGIN_TIMEOUT_S}s")


def render_gpu_nvml(spec: ClusterSpec) -> list[Manifest]:
    """The NVSwitch hosts' ConfigMap, the monitor's ConfigMap and the DaemonSet (the kernel detector's service
    account and role, detector.py)."""
    if not enabled(spec):
        return []
    m = spec.kubernetes.health.gpu_monitor
    container = detector_container(
        spec, [f"--config.custom-plugin-monitor=/config/{MONITOR}"],
        [{"name": "state", "mountPath": STATE_DIR}, {"name": "hosts", "mountPath": HOSTS_DIR, "readOnly": True}],
        livenessProbe={"exec": {"command": ["nvidia-smi", "-L"]}, "initialDelaySeconds": 60, "periodSeconds": 60,
                       "timeoutSeconds": 30, "failureThreshold": 3})
    # The toolkit's own variables: every GPU visible, only the utility (nvidia-smi, NVML) driver libraries.
    container["env"] += [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                         {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"}]
    data = {MONITOR: json.dumps(monitor_config(spec), indent=2) + "\n", CHECK: check_script()}
    volumes = [STATE_VOLUME, {"name": "hosts", "configMap": {"name": HOSTS_CONFIG}}]
    return [
        Manifest("gpu-nvml-hosts", {"apiVersion": "v1", "kind": "ConfigMap",
                                    "metadata": {"name": HOSTS_CONFIG, "namespace": NAMESPACE,
                                                 "labels": {**LABELS, "app.kubernetes.io/name": NAME}},
                                    "data": {HOSTS_FILE: nvlink_hosts(spec)}}),
        *detector(spec, "gpu-nvml", NAME, container, volumes, data, runtimeClassName=m.runtime_class),
    ]
