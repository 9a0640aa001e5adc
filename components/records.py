"""What a host keeps under /var/lib/gpucluster between the scripts that act on it (nodes/: preparation, burn-in,
the rollout's roll) and the health monitors that judge it (k8s/health/: the detectors, the active checks): the
burn-in's verdict they share, the fault records, and the one bash writer of a record. Below both, so that neither
imports the other for a path, a verdict or a writer."""

from __future__ import annotations

from .spec import NodePool

STATE_DIR = "/var/lib/gpucluster"
# "<what> <epoch seconds>": a disruptive action of the library's own is under way on the host (links bounced, the
# driver reloaded); while it lasts the monitors keep their last verdict and record no fault.
MAINTENANCE = f"{STATE_DIR}/maintenance"
# A marker older than this fences nothing: a roll that died leaves the host to its monitors again.
MAINTENANCE_MAX_S = 7200
PORT_SEEN = f"{STATE_DIR}/fabric-ports"     # "<device>/<port> <link_downed>" at the port monitor's last look
# The burn-in's verdict: its output line's prefix, and the file that keeps the last one, which stands while
# tenants' pods run (the detector reads it).
RESULT = "GPUCLUSTER_BURN_IN="
VERDICT_FILE = f"{STATE_DIR}/burn-in"
# The fault records, each "<head>\n<message>\n": the burn-in monitor holds a node while the newest of them is
# newer than the last passing burn-in (k8s/health/detector.py), so a record is only ever replaced whole.
FAULT_RECORD = f"{STATE_DIR}/gpu-fault"                 # an XID that needs NVIDIA's diagnosis (the XID monitor)
CHECK_RECORD = f"{STATE_DIR}/gpu-check"                 # a failed active check (k8s/health/checks.py)
PORT_RECORD = f"{STATE_DIR}/fabric-fault"               # a fabric port that went down or flapped
NVML_RECORD = f"{STATE_DIR}/gpu-nvml-fault"             # a GPU overheated or an NVLink down (k8s/health/nvml.py)
# The one writer of a two-line host record, for every monitor and check: `put_record FILE FIRST SECOND` (a verdict:
# its exit status and message; a fault: its head and message). The new record is whole before it replaces the old
# one, so a reader never sees half of one, and its time is the writing's.
PUT_RECORD = r'''put_record() {
  mkdir -p "${1%/*}"
  printf '%s\n%s\n' "$2" "$3" > "$1.new"
  mv -f "$1.new" "$1"
}
'''


def rdma_ports(pool: NodePool) -> list[str]:
    """`<device>/1` for each of a host's RDMA NICs (one port per ConnectX function), by rail: what the port
    monitor watches and the roll waits for."""
    return [f"{n.device}/1" for n in sorted(pool.nics, key=lambda n: n.rail)]


def min_busbw(pool: NodePool) -> float:
    """The NCCL bus bandwidth (GB/s) a burn-in and an active check must reach: the spec's, or 80% of typical."""
    b = pool.burn_in
    return b.nccl_min_busbw_gb_per_s or round(0.8 * pool.gpu.info.busbw_gb_per_s, 1)
