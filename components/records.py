"""What a host keeps under /var/lib/gpucluster between the scripts that act on it (nodes/: preparation, burn-in,
the rollout's roll) and the health monitors that judge it (k8s/health/: the detectors, the active checks), and the
burn-in's verdict they share: below both, so that neither imports the other for a path or a verdict."""

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


def rdma_ports(pool: NodePool) -> list[str]:
    """`<device>/1` for each of a host's RDMA NICs (one port per ConnectX function), by rail: what the port
    monitor watches and the roll waits for."""
    return [f"{n.device}/1" for n in sorted(pool.nics, key=lambda n: n.rail)]


def min_busbw(pool: NodePool) -> float:
    """The NCCL bus bandwidth (GB/s) a burn-in and an active check must reach: the spec's, or 80% of typical."""
    b = pool.burn_in
    return b.nccl_min_busbw_gb_per_s or round(0.8 * pool.gpu.info.busbw_gb_per_s, 1)
