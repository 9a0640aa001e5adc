"""Slurm's node check: the burn-in's short form before and after every job, draining a node that fails it.

Slurm runs it as Prolog and Epilog in each slurmd pod of the job's nodes (as root, with every GPU of the node,
nvidia-smi from the driver). It checks what a job would trip over next: every GPU of the node visible (one that
fell off the bus is not), no XID of `kubernetes.health.fault_xids` in the kernel log since boot (the detector's
list: a reboot clears it), no uncorrectable ECC error since the driver loaded, no row remapping pending or failed,
on NVSwitch boards every NVLink up at full speed, and after a job, where the slurmd image has DCGM,
`dcgmi diag -r 1` (tens of seconds: not before every job, where slurm.conf(5) wants the prolog done "in less time
than MessageTimeout").

It has three outcomes. Pass. Fail: the node is drained with the reason (`scontrol update ... state=drain
reason="gpucluster: ..."`), so it takes no new job and `sinfo -R` says why; a failing prolog also exits 1, so Slurm
requeues the job it was about to start (not held: extraConf's `nohold_on_prolog_fail`). No verdict: the check
itself could not run (a tool missing or timed out, the controller unreachable, DCGM's host engine not answering);
that is never the node's fault, so the node is left in service, and the node's Comment and slurmd's log say what
could not be checked. A drained node returns with `scontrol update nodename=<node> state=resume`, once repaired
and burned in again (the pool's burn-in, `pulumi up --replace` of the host's burn-in).

Nothing is read back from the controller: what the check expects of a node (its GPU count, an NVSwitch board) is
known when the script is rendered, per Slurm node, so a controller restart (the operator reconfigures on every
Helm upgrade) cannot turn into a verdict. Every command has a time bound, and their sum stays under
`PrologEpilogTimeout` (extraConf), past which Slurm would kill the script and drain the node itself.
"""

from __future__ import annotations

import shlex

from ...bash import fill
from ...spec import ClusterSpec
from ...spec.hardware import xid_pattern
from ...spec.xids import XidAction
from ..health.detector import DCGM_FAILED, DCGM_RESULTS, NVLINK_DOWN

# The script's key in the chart's prologScripts and epilogScripts; the chart stores it as prolog-<key> and
# epilog-<key>, the file names slurm.conf's Prolog and Epilog lines get from the operator.
SCRIPT = "90-gpucluster-node-check.sh"
DRAIN_PREFIX = "gpucluster: "
NO_VERDICT = f"{DRAIN_PREFIX}no verdict"     # how the node's Comment starts while the check cannot run
# Each command's time bound (seconds). nvidia-smi answers in seconds on a healthy 8-GPU host; dcgmi diag -r 1
# runs its quick tests (seconds to a minute); scontrol is one RPC to slurmctld.
BOUNDS_S = {"nvidia-smi": 30, "dcgmi": 120, "scontrol": 10, "dmesg": 10}
_KILL_AFTER_S = 5                            # timeout's grace before SIGKILL


def script_bound_s(when: str) -> int:
    """The longest the check can take: each bounded command once (dmesg; dcgmi after jobs; nvidia-smi twice: -q
    and nvlink -s; scontrol twice: the drain or the comment, and clearing it), with timeout's grace."""
    calls = {"nvidia-smi": 2, "scontrol": 2, "dmesg": 1, "dcgmi": 1 if when == "epilog" else 0}
    return sum(n * (BOUNDS_S[tool] + _KILL_AFTER_S) for tool, n in calls.items())


# slurm.conf's PrologEpilogTimeout: above the longer of the two scripts' bounds, so Slurm never kills the check.
PROLOG_EPILOG_TIMEOUT_S = max(script_bound_s("prolog"), script_bound_s("epilog")) + 30

_CHECK = r'''#!/bin/bash
# gpucluster's node check as Slurm's @WHEN@ (generated; see components/k8s/slurm/node_check.py). Three outcomes:
# pass; fail (the node drained with the reason; a failing prolog also exits 1, so Slurm requeues the job); no
# verdict (the check could not run: a tool missing or timed out, the controller unreachable), which leaves the
# node in service and says so in its Comment.
set -euo pipefail
# slurmd starts a prolog or epilog with no PATH: bash looks commands up on a default of its own, but exports none,
# so the programs it starts (timeout) would look only in /bin and /usr/bin.
export PATH=${PATH:-/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin}
node=${SLURMD_NODENAME:-}
prefix=@PREFIX@
no_verdict=@NO_VERDICT@
mark=${TMPDIR:-/tmp}/gpucluster-node-check-no-verdict.$node
reasons=()     # faults: the node is drained
unknown=()     # what could not be checked
out=
# run SECONDS COMMAND...: COMMAND's output in $out; returns 0 when it succeeded, 1 when it ran and failed, 2 when
# there is no verdict (not installed, not runnable, timed out).
run() {
  local limit=$1 rc=0
  shift
  if ! command -v "$1" >/dev/null 2>&1; then
    out="$1 is not installed"
    return 2
  fi
  out=$(timeout -k @KILL_AFTER@ "$limit" "$@" 2>&1) || rc=$?
  case $rc in
    0) return 0 ;;
    124 | 137) out="$1 did not answer within $limit s"; return 2 ;;
    126 | 127) out="$1 could not run: $(sed -n 1p <<<"$out")"; return 2 ;;
    *) return 1 ;;
  esac
}
if ! command -v timeout >/dev/null 2>&1; then
  echo "gpucluster node check: timeout (coreutils) is not installed: no verdict, nothing checked" >&2
  exit 0
fi
# What each Slurm node of the pools is: its GPU count and whether its GPUs hang off NVSwitches.
gpus=
nvswitch=0
case $node in
@NODES@
  *) unknown+=("node '$node' is none of the Slurm pools' hosts: GPU count and NVLinks not checked") ;;
esac
status=0
run @SMI_S@ nvidia-smi -q || status=$?
if (( status == 0 )); then
  # "Attached GPUs : N" is what the driver sees; each "GPU <bus id>" section holds the GPU's ECC counters and row
  # remapper: a volatile uncorrectable count above 0, or "Pending : Yes" / "Remapping Failure Occurred : Yes".
  seen=$(awk -F': *' '/^Attached GPUs/ { print $2 + 0 }' <<<"$out")
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
      printf "%sGPU %s: row remapping failed", sep, gpu; sep = "; " }' <<<"$out")
  if [[ -z $seen ]]; then
    unknown+=("nvidia-smi -q printed no 'Attached GPUs' line")
  elif [[ -n $gpus ]] && (( seen != gpus )); then
    reasons+=("$seen of $gpus GPUs visible")
  fi
  if [[ -n $faults ]]; then
    reasons+=("$faults")
  fi
elif (( status == 1 )); then
  reasons+=("nvidia-smi -q failed: $(sed -n 1p <<<"$out")")
else
  unknown+=("$out")
fi
if (( nvswitch )); then
  status=0
  run @SMI_S@ nvidia-smi nvlink -s || status=$?
  if (( status == 0 )); then
    down=$(awk @NVLINK@ <<<"$out")
    if [[ -n $down ]]; then
      reasons+=("NVLink: $down")
    fi
  elif (( status == 1 )); then
    reasons+=("nvidia-smi nvlink -s failed: $(sed -n 1p <<<"$out")")
  else
    unknown+=("$out")
  fi
fi
# XIDs the driver logged since boot that take the node out of service (kubernetes.health.fault_xids, as the
# Kubernetes detector reads them): those needing NVIDIA's diagnosis, and those a GPU reset (a reboot) clears.
service_xids=@SERVICE_XIDS@
status=0
run @DMESG_S@ dmesg || status=$?
if (( status == 0 )); then
  xids=$(grep -oE @XID_PATTERN@ <<<"$out" | sed -E 's/.*: ([0-9]+),$/\1/' | sort -un | tr '\n' ' ' || true)
  for xid in $xids; do
    if [[ " $service_xids " == *" $xid "* ]]; then
      reasons+=("XID $xid since boot: repair (NVIDIA's diagnosis), reboot and burn in")
    else
      reasons+=("XID $xid since boot: reboot to reset the GPU")
    fi
  done
else
  unknown+=("kernel log not read: ${out:0:120}")
fi
if (( @DCGM@ )) && command -v dcgmi >/dev/null 2>&1; then
  status=0
  run @DCGMI_S@ dcgmi diag -r 1 || status=$?
  if (( status == 2 )); then
    unknown+=("$out")
  else
    # dcgmi's result table: "| test | result |" rows; none when it could not reach its host engine.
    results=$(awk -F'|' @DCGM_RESULTS@ <<<"$out")
    failed=$(awk -F'|' @DCGM_FAILED@ <<<"$results")
    if [[ -n $failed ]]; then
      reasons+=("dcgmi diag -r 1: $failed")
    elif [[ -z $results ]]; then
      unknown+=("dcgmi diag -r 1 gave no result: $(sed -n 1p <<<"$out")")
    fi
  fi
fi
if (( ${#unknown[@]} )); then
  note=$(printf '%s\n' "${unknown[@]}" | awk '!seen[$0]++ { printf "%s%s", sep, $0; sep = "; " }')
  echo "gpucluster node check (@WHEN@) on ${node:-this node}: no verdict: $note" >&2
fi
if (( ${#reasons[@]} )); then
  why=$(printf '%s; ' "${reasons[@]}")
  why=${why%; }
  if [[ -n $node ]] && run @SCONTROL_S@ scontrol update nodename="$node" state=drain reason="$prefix${why:0:200}"; then
    echo "$node drained: $why" >&2
    exit @FAIL_STATUS@
  fi
  # Slurm drains a node whose prolog or epilog fails, with a reason of its own.
  echo "${node:-this node} failed the check but could not be drained (${out:-no node name}): $why" >&2
  exit 1
fi
if (( ${#unknown[@]} )); then
  if [[ -n $node ]] && run @SCONTROL_S@ scontrol update nodename="$node" \
    comment="$no_verdict ($(date -u +%Y-%m-%dT%H:%M:%SZ), @WHEN@): ${note:0:200}"; then
    : > "$mark"
  else
    echo "the node's comment could not be set: $out" >&2
  fi
elif [[ -e $mark ]] && run @SCONTROL_S@ scontrol update nodename="$node" comment=""; then
  rm -f "$mark"      # checked again: the no-verdict comment goes
fi
exit 0
'''


def node_table(spec: ClusterSpec) -> str:
    """The case arms that give each Slurm node its GPU count and NVSwitch flag (a pool's hosts in one arm)."""
    from .cluster import node_name, slurm_pools          # cluster.py renders this module's scripts into its values
    return "\n".join(f"  {'|'.join(shlex.quote(node_name(h.hostname)) for h in pool.hosts)}) "
                     f"gpus={pool.gpu.count} nvswitch={int(pool.gpu.nvswitch)} ;;" for pool in slurm_pools(spec))


def render_scripts(spec: ClusterSpec) -> dict[str, dict[str, str]]:
    """The slurm chart's prologScripts and epilogScripts (file name -> script)."""
    return {"prologScripts": {SCRIPT: render_node_check(spec, "prolog")},
            "epilogScripts": {SCRIPT: render_node_check(spec, "epilog")}}


def render_node_check(spec: ClusterSpec, when: str) -> str:
    """The check as `when` ("prolog" or "epilog"): a failing prolog exits 1 (Slurm requeues the job), an epilog
    0 (the job is over; the drain is what matters); only the epilog runs DCGM's diagnostic."""
    prolog, health = when == "prolog", spec.kubernetes.health
    return fill(_CHECK.replace("@NODES@", node_table(spec)), WHEN=when, NVLINK=NVLINK_DOWN,
                DCGM_RESULTS=DCGM_RESULTS, DCGM_FAILED=DCGM_FAILED, PREFIX=DRAIN_PREFIX, NO_VERDICT=NO_VERDICT,
                FAIL_STATUS=int(prolog), DCGM=int(not prolog), KILL_AFTER=_KILL_AFTER_S,
                SMI_S=BOUNDS_S["nvidia-smi"], DCGMI_S=BOUNDS_S["dcgmi"], SCONTROL_S=BOUNDS_S["scontrol"],
                DMESG_S=BOUNDS_S["dmesg"], XID_PATTERN=xid_pattern(health.fault_xids),
                SERVICE_XIDS=" ".join(map(str, health.xids[XidAction.SERVICE])))
