"""Recording doubles for tools that need hardware this machine lacks (GPUs, DCGM, systemd as PID 1).

Each double appends its command line to /var/lib/gpucluster-doubles/calls.log and reads the host's simulated
hardware from /var/lib/gpucluster-doubles/state.env; everything else the scripts run is real.
"""

from __future__ import annotations

STATE_DIR = "/var/lib/gpucluster-doubles"

_RECORD = f'''#!/usr/bin/env bash
set -euo pipefail
S={STATE_DIR}
printf '%s %s\\n' "$(basename "$0")" "$*" >> "$S/calls.log"
# shellcheck disable=SC1091
source "$S/state.env"
'''

DOUBLES: dict[str, str] = {
    "nvidia-smi": _RECORD + r'''
query=""
for a in "$@"; do case "$a" in --query-gpu=*) query=${a#--query-gpu=} ;; esac; done
for ((i = 0; i < GPU_COUNT; i++)); do
  case "$query" in
    index) echo "$i" ;;
    name) echo "$GPU_NAME" ;;
    driver_version) echo "$DRIVER" ;;
    index,ecc.errors.uncorrected.volatile.total) echo "$i, $ECC" ;;
    index,power.min_limit,power.max_limit) echo "$i, 200.00, 700.00" ;;
    "") break ;;
    *) echo "nvidia-smi double: unknown query $query" >&2; exit 2 ;;
  esac
done
''',
    "systemctl": _RECORD + r'''
args=()
for a in "$@"; do case "$a" in --*) ;; *) args+=("${a%.service}") ;; esac; done
verb=${args[0]:-}; unit=${args[1]:-}
mkdir -p "$S/enabled" "$S/active"
now=0; case " $* " in *" --now "*) now=1 ;; esac
case "$verb" in
  is-enabled) if [[ -e "$S/enabled/$unit" ]]; then echo enabled; else echo disabled; exit 1; fi ;;
  is-active) [[ -e "$S/active/$unit" ]] ;;
  enable) touch "$S/enabled/$unit"; if (( now )); then touch "$S/active/$unit"; fi ;;
  disable) rm -f "$S/enabled/$unit"; if (( now )); then rm -f "$S/active/$unit"; fi ;;
  start|restart)
    touch "$S/active/$unit"
    # run the unit's command, as systemd would for a oneshot unit
    exec_start=$(sed -n 's/^ExecStart=//p' "/etc/systemd/system/$unit.service" 2>/dev/null || true)
    if [[ -n "$exec_start" ]]; then $exec_start; fi ;;
  stop) rm -f "$S/active/$unit" ;;
  daemon-reload) ;;
  *) echo "systemctl double: unknown verb $verb" >&2; exit 2 ;;
esac
''',
    "nv-fabricmanager": _RECORD + 'echo "Fabric Manager version is : $FM_VERSION"\n',
    "nvidia-persistenced": _RECORD,
    "cpupower": _RECORD,
    "dcgmi": _RECORD + r'''
if [[ "$DCGM" == pass ]]; then echo "Diagnostic | Result: Pass"; else echo "Memory | Fail - GPU 3 row remap pending"; exit 226; fi
''',
}

ALL_REDUCE = _RECORD + r'''
echo "# nccl-tests all_reduce_perf double"
echo "# Avg bus bandwidth    : $BUSBW "
'''

HEALTHY = {"GPU_COUNT": "8", "GPU_NAME": "NVIDIA H100 80GB HBM3", "DRIVER": "550.54.15",
           "FM_VERSION": "550.54.15", "ECC": "0", "DCGM": "pass", "BUSBW": "451.20"}


def state_env(state: dict[str, str]) -> str:
    return "".join(f"{k}={v!r}\n".replace("'", '"') for k, v in state.items())
