"""NVIDIA's XIDs by what they ask of the node: the one table that the detector, the quarantine, host preparation
and the rollout's preflight, the alerts and Slurm's node check all read, so that they agree.

Source: NVIDIA's XID catalog for Ampere and newer GPUs (docs.nvidia.com/deploy/xid-errors/
analyzing-xid-catalog.html), its column "Resolution Bucket (Immediate Action)", as NVIDIA ships it with
NVSentinel (distros/kubernetes/nvsentinel/charts/gpu-health-monitor/xiderrorsmapping.csv). Only the XIDs of
data-centre GPUs that the catalog does not resolve by restarting the application are listed; every other XID is
an event. The bucket becomes what the library does:
- RESET_GPU and RESTART_BM (reboot): the GPU is not to be trusted until it is reset. New work waits (the node is
  tainted NoSchedule under Kubernetes, drained under Slurm) while the jobs already there run on; the reboot
  that resets the GPU (a reset alone leaves the driver's line in the kernel log) clears the fault. No burn-in.
- WORKFLOW_XID_48 (a double-bit ECC error), WORKFLOW_NVLINK_ERR and WORKFLOW_NVLINK5_ERR (NVLink faults):
  NVIDIA's own diagnosis, ending in a reset or an RMA: the node is quarantined (its pods evicted, with
  `quarantine.drain`) until the reboot and a burn-in that passes after it.
- RESTART_APP and IGNORE: the job's own fault or one it survives (13, 31, 43: a user's bug; 94, a contained ECC
  error: only the faulting process dies; 63, a row remap recorded, and 92, a high single-bit rate: the GPU
  keeps working). A Node event only. A site may still take a node out on an IGNORE XID (`fault_xids`): it then
  waits for a reset; a RESTART_APP XID says nothing of the GPU and is refused there.
"""

from __future__ import annotations

from enum import Enum


class XidAction(str, Enum):
    RESET = "reset"          # new work waits; the reboot that resets the GPU clears it
    SERVICE = "service"      # quarantined until a reboot and a passing burn-in


# XID -> (NVIDIA's immediate-action bucket, the catalog's mnemonic).
NVIDIA_XIDS: dict[int, tuple[str, str]] = {
    46: ("RESET_GPU", "GPU stopped processing"),
    48: ("WORKFLOW_XID_48", "double-bit ECC error"),
    62: ("RESET_GPU", "internal micro-controller halt"),
    63: ("IGNORE", "row remapping recorded, pending a reset"),
    64: ("RESET_GPU", "row remapping failed"),
    74: ("WORKFLOW_NVLINK_ERR", "NVLink error"),
    79: ("RESTART_BM", "GPU fell off the bus"),
    92: ("IGNORE", "high single-bit ECC error rate"),
    94: ("RESTART_APP", "contained ECC error"),
    95: ("RESET_GPU", "uncontained ECC error"),
    109: ("RESET_GPU", "context switch timeout"),
    110: ("RESET_GPU", "security fault"),
    119: ("RESET_GPU", "GSP RPC timeout"),
    120: ("RESET_GPU", "GSP error"),
    136: ("RESET_GPU", "link training failed"),
    140: ("RESET_GPU", "unrecoverable ECC error escaped"),
    143: ("RESET_GPU", "GPU initialization failed"),
    **{x: ("WORKFLOW_NVLINK5_ERR", "NVLink 5 error") for x in range(144, 151)},
    155: ("RESET_GPU", "NVLink software-defined error"),
    156: ("RESET_GPU", "resource retirement event"),
    158: ("RESET_GPU", "GPU fatal timeout"),
    160: ("RESTART_BM", "channel retirement event"),
}
# XIDs that are the job's own fault (NVIDIA: RESTART_APP), which `fault_xids` refuses: the common ones.
APPLICATION_XIDS: dict[int, str] = {
    13: "graphics engine exception", 31: "GPU memory page fault", 32: "invalid push buffer stream",
    43: "GPU stopped processing (a channel reset)", 45: "preemptive cleanup after a job's fault",
    94: "contained ECC error"}

_RESET_BUCKETS = {"RESET_GPU", "RESTART_BM", "IGNORE"}

# What a node's health monitor takes a node out for when the spec says nothing: every XID above but those NVIDIA
# resolves by restarting the application or ignores.
DEFAULT_FAULT_XIDS = tuple(sorted(x for x, (bucket, _) in NVIDIA_XIDS.items()
                                  if bucket not in ("RESTART_APP", "IGNORE")))


def action(xid: int) -> XidAction:
    """What the node gets for `xid` when it takes it out: a reset, or service; an XID the table does not know
    waits for a reset (the milder, which a burn-in is not needed to lift)."""
    bucket = NVIDIA_XIDS.get(xid, ("RESET_GPU", ""))[0]
    return XidAction.RESET if bucket in _RESET_BUCKETS else XidAction.SERVICE


def split(xids: list[int] | tuple[int, ...]) -> dict[XidAction, tuple[int, ...]]:
    """`xids` by action, each sorted and once."""
    return {a: tuple(sorted({x for x in xids if action(x) is a})) for a in XidAction}


def describe(xid: int) -> str:
    bucket, name = NVIDIA_XIDS.get(xid, ("", ""))
    return f"XID {xid} ({name}; NVIDIA: {bucket})" if name else f"XID {xid}"
