"""Slurm's node check: the burn-in's short form before and after every job, draining a node that fails it.

Slurm runs it as Prolog and Epilog in each slurmd pod of the job's nodes (as root, with every GPU of the node,
nvidia-smi from the driver). It checks what a job would trip over next: every GPU of the node visible (one that
fell off the bus is not), no uncorrectable ECC error since the driver loaded, no row remapping pending or failed,
on NVSwitch boards every NVLink up at full speed, and where the slurmd image has DCGM, `dcgmi diag -r 1`. A
failure drains the node with the reason (`scontrol update ... state=drain reason="gpucluster: ..."`), so it takes
no new job and `sinfo -R` and `scontrol show node` say why; a failing prolog also exits 1, so Slurm requeues
the job it was about to start. A drained node returns with `scontrol update nodename=<node> state=resume`, once
repaired and burned in again (the pool's burn-in, `pulumi up --replace` of the host's burn-in).
"""

from __future__ import annotations

from ..bash import fill
from ..spec import ClusterSpec
from .health import DCGM_FAILED, DCGM_RESULTS, NVLINK_DOWN

# The script's key in the chart's prologScripts and epilogScripts; the chart stores it as prolog-<key> and
# epilog-<key>, the file names slurm.conf's Prolog and Epilog lines get from the operator.
SCRIPT = "90-gpucluster-node-check.sh"
DRAIN_PREFIX = "gpucluster: "

_CHECK = r'''#!/bin/bash
# gpucluster's node check as Slurm's @WHEN@ (generated; see components/k8s/slurm_health.py)
set -euo pipefail
node=${SLURMD_NODENAME:?Slurm sets SLURMD_NODENAME for a prolog or epilog}
nvswitch_pools=@NVSWITCH_POOLS@
prefix=@PREFIX@
reasons=()
info=$(scontrol show node "$node" -o)
gpus=$(sed -n 's/.* Gres=gpu:[^ ]*:\([0-9][0-9]*\).*/\1/p' <<<"$info")
pool=$(sed -n 's/.* AvailableFeatures=\([^, ]*\).*/\1/p' <<<"$info")
if query=$(nvidia-smi -q 2>&1); then
  # "Attached GPUs : N" is what the driver sees; each "GPU <bus id>" section holds the GPU's ECC counters and row
  # remapper: a volatile uncorrectable count above 0, or "Pending : Yes" / "Remapping Failure Occurred : Yes".
  seen=$(awk -F': *' '/^Attached GPUs/ { print $2 + 0 }' <<<"$query")
  faults=$(awk '
    /^GPU [0-9A-Fa-f]+:/ { gpu = $2; section = ""; block = ""; next }
    /^    [^ ]/ { section = $0; sub(/^ +/, "", section); sub(/ *:.*$/, "", section); block = ""; next }
    /^        [^ ]/ { block = $0; sub(/^ +/, "", block); sub(/ *:.*$/, "", block) }
    section == "ECC Errors" && block == "Volatile" && /^            [^ ].*Uncorrectable/ && $NF ~ /^[1-9][0-9]*$/ {
      name = $0; sub(/^ +/, "", name); sub(/ *:.*$/, "", name)
      printf "%sGPU %s: %s %s errors", sep, gpu, $NF, name; sep = "; " }
    section == "Remapped Rows" && block == "Pending" && $NF == "Yes" {
      printf "%sGPU %s: row remapping pending", sep, gpu; sep = "; " }
    section == "Remapped Rows" && block == "Remapping Failure Occurred" && $NF == "Yes" {
      printf "%sGPU %s: row remapping failed", sep, gpu; sep = "; " }' <<<"$query")
  if [[ -n $gpus ]] && [[ ${seen:-0} -ne $gpus ]]; then
    reasons+=("${seen:-0} of $gpus GPUs visible")
  fi
  if [[ -n $faults ]]; then
    reasons+=("$faults")
  fi
else
  reasons+=("nvidia-smi -q failed: $(sed -n 1p <<<"$query")")
fi
if [[ " $nvswitch_pools " == *" $pool "* ]]; then
  if links=$(nvidia-smi nvlink -s 2>&1); then
    down=$(awk @NVLINK@ <<<"$links")
    if [[ -n $down ]]; then
      reasons+=("NVLink: $down")
    fi
  else
    reasons+=("nvidia-smi nvlink -s failed: $(sed -n 1p <<<"$links")")
  fi
fi
if command -v dcgmi >/dev/null 2>&1; then
  diag=$(dcgmi diag -r 1 2>&1 || true)
  failed=$(awk -F'|' @DCGM_RESULTS@ <<<"$diag" |
    awk -F'|' @DCGM_FAILED@)
  if [[ -n $failed ]]; then
    reasons+=("dcgmi diag -r 1: $failed")
  fi
fi
if (( ${#reasons[@]} )); then
  why=$(printf '%s; ' "${reasons[@]}")
  why=${why%; }
  scontrol update nodename="$node" state=drain reason="$prefix${why:0:200}"
  echo "$node drained: $why" >&2
  exit @FAIL_STATUS@
fi
'''


def render_scripts(spec: ClusterSpec) -> dict[str, dict[str, str]]:
    """The slurm chart's prologScripts and epilogScripts (file name -> script)."""
    return {"prologScripts": {SCRIPT: render_node_check(spec, "prolog")},
            "epilogScripts": {SCRIPT: render_node_check(spec, "epilog")}}


def render_node_check(spec: ClusterSpec, when: str) -> str:
    """The check as `when` ("prolog" or "epilog"): a failing prolog exits 1 (Slurm requeues the job), an epilog
    0 (the job is over; the drain is what matters)."""
    pools = spec.pools
    nvswitch = " ".join(sorted(name for name in spec.kubernetes.slurm.pools if pools[name].gpu.nvswitch))
    return fill(_CHECK, WHEN=when, NVSWITCH_POOLS=nvswitch, NVLINK=NVLINK_DOWN, DCGM_RESULTS=DCGM_RESULTS,
                DCGM_FAILED=DCGM_FAILED, PREFIX=DRAIN_PREFIX, FAIL_STATUS=1 if when == "prolog" else 0)
