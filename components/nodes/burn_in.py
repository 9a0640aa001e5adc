"""Burn-in: DCGM diagnostics and a single-node NCCL all-reduce before a node takes work.

It runs on a new node, and again on a change only where no tenant's pod runs (or the node is quarantined):
elsewhere the last verdict, kept on the host, stands, so a spec change never puts a burn-in next to jobs.

The script exits 0 whether the node passes or not and prints one result line; the node pool turns that line
into taints, so a failed node stays quarantined with the reason on the node, instead of failing the whole
deployment. It exits non-zero only when it cannot test at all (tools missing).
"""

from __future__ import annotations

from typing import Sequence

from ..bash import fill, script
from ..fabric.nccl import LARGEST_BUSBW_AWK
from ..records import RESULT, VERDICT_FILE, min_busbw
from ..spec import Host, NodePool
from ..ssh import Script
from .host_prep import render_busy


def burn_in_identity(pool: NodePool, host: Host) -> str:
    """What a burn-in stands for: the host, its GPUs and its hardware. Only a change to these replaces it (runs
    it anew); a changed script or threshold updates it in place, and the script itself decides where it may run."""
    hardware = f" on {host.hardware_id}" if host.hardware_id else ""
    return f"burn-in {host.hostname} {pool.gpu.count} x {pool.gpu.model}{hardware}"

# A verdict stands while tenants' pods run on the node: the burn-in saturates every GPU and NVLink, so it runs
# again only where that disturbs nobody: a new node (no verdict yet), a quarantined one, or an idle one.
_RERUN = r'''
need crictl "it lists the pods on this node, so a burn-in never runs next to tenants' work; install cri-tools"
mapfile -t pods < <(tenant_pods)
if [[ -f @VERDICT@ ]] && grep -qx "@RESULT@passed" @VERDICT@ && (( ${#pods[@]} )); then
  note "not burned in again: ${#pods[@]} tenant pod(s) run here (${pods[*]:0:3}); the verdict of $(date -r @VERDICT@ -u +%FT%TZ) stands"
  cat @VERDICT@
  finish
  exit 0
fi
'''

_BODY = r'''
need dcgmi "install NVIDIA DCGM (datacenter-gpu-manager) and start nvidia-dcgm"
need timeout "coreutils"
allreduce=@DIR@/all_reduce_perf
[[ -x "$allreduce" ]] || fail "all_reduce_perf is missing at $allreduce (build NVIDIA nccl-tests there)"
reasons=()
if ! diag=$(timeout @TIMEOUT@ dcgmi diag -r @LEVEL@ 2>&1); then
  reasons+=("dcgmi diag -r @LEVEL@ failed: $(printf '%s\n' "$diag" | grep -iE 'fail|error' | sed -n 1,3p | tr '\n' ' ')")
fi
if nccl=$(timeout @TIMEOUT@ "$allreduce" -b 8 -e 8G -f 2 -g @GPUS@ 2>&1); then
  busbw=$(printf '%s\n' "$nccl" | LARGEST_BUSBW)
  if [[ -z "$busbw" ]]; then
    reasons+=("all_reduce_perf printed no bus bandwidth")
  elif ! awk -v b="$busbw" -v min=@MIN@ 'BEGIN { exit !(b >= min) }'; then
    reasons+=("NCCL all_reduce bus bandwidth $busbw GB/s at 8 GiB is below @MIN@ GB/s")
  else
    note "NCCL all_reduce bus bandwidth $busbw GB/s at 8 GiB (minimum @MIN@)"
  fi
else
  reasons+=("all_reduce_perf failed: $(printf '%s\n' "$nccl" | tail -n 2 | tr '\n' ' ')")
fi
if (( ${#reasons[@]} )); then
  verdict="@RESULT@failed: ${reasons[*]}"
else
  verdict=@RESULT@passed
fi
mkdir -p "$(dirname @VERDICT@)"
printf '%s\n' "$verdict" > @VERDICT@
printf '%s\n' "$verdict"
'''


def render_burn_in(pool: NodePool, host: Host, system_namespaces: Sequence[str] = ("kube-system",)) -> Script:
    """`system_namespaces`: pods there are node agents, not tenants' work a burn-in would disturb."""
    b = pool.burn_in
    body = render_busy(system_namespaces) + fill(_RERUN, VERDICT=VERDICT_FILE, RESULT=RESULT) + fill(
        _BODY.replace("LARGEST_BUSBW", LARGEST_BUSBW_AWK), DIR=b.nccl_tests_dir, TIMEOUT=b.timeout_s,
        LEVEL=b.dcgm_level, GPUS=pool.gpu.count, MIN=min_busbw(pool), RESULT=RESULT, VERDICT=VERDICT_FILE)
    return Script(script(f"Burn in {host.hostname}: dcgmi diag -r {b.dcgm_level}, NCCL all_reduce on "
                         f"{pool.gpu.count} GPUs", host.hostname, body, shared=True))


def parse_result(stdout: str | None) -> tuple[bool, str]:
    """(passed, why) from the script's output; no result line is a failure that says so."""
    for line in reversed((stdout or "").splitlines()):
        if line.startswith(RESULT):
            verdict = line[len(RESULT):].strip()
            return verdict == "passed", verdict
    return False, "failed: the burn-in printed no result"
