"""Checks to run after `pulumi up`: every rail of every host at line rate, then NCCL across nodes.

- Links: ib_write_bw between neighbours in a ring of the pool's hosts (each host is server once and client
  once, so every NIC is exercised twice with n pairs, not n^2), one rail at a time, run from the operator's
  machine over SSH like Pulumi itself. RoCE runs use the GID index the fabric script found and the RoCE
  traffic class, so they prove the lossless class end to end. (../shared/reference/node-commands.md 3.5)
- NCCL: an MPIJob (Kubeflow MPI operator) running all_reduce_perf with one rank per GPU; its launcher fails
  when the average bus bandwidth is below the threshold. (reference 3.6) A Slurm pool gets the same run as an
  sbatch script for its partition instead.
"""

from __future__ import annotations

from typing import Any

from ..bash import call, fill, script
from ..k8s.labels import POOL_LABEL, pool_tolerations
from ..k8s.mpijob import mpijob
from ..k8s.rails import pod_networks, rdma_resource
from ..spec import ClusterSpec, NodePool
from .nccl import LARGEST_BUSBW_AWK, NCCL_CONF, batch_exports, nccl_envs, pod_env

NCCL_TESTS = "/opt/nccl_tests/build/all_reduce_perf"
CHECKS_NAMESPACE = "gpucluster-checks"
PERFTEST = "-i 1 -F --report_gbits -D 10 -q 4 -s 1048576"
# ib_write_bw's result row (#bytes #iterations BW-peak BW-average MsgRate): the average, in Gb/s.
IB_BW_AWK = "awk '$1 ~ /^[0-9]+$/ && NF >= 4 { v = $4 } END { print v + 0 }'"


# Link tests at once from the operator's machine (two SSH sessions each): a 128-node pool of 8 rails in a few
# minutes instead of hours one after another, without opening thousands of sessions.
LINK_CHECKS_AT_ONCE = 32
PERFTEST_PORT = 18515       # perftest's default; each rail of a host gets its own, since they run together


def _pairs(hosts: list[str]) -> list[tuple[str, str]]:
    """Each host with its next one in a ring; two hosts make one pair, not the same pair twice."""
    if len(hosts) == 2:
        return [(hosts[0], hosts[1])]
    return [(hosts[i], hosts[(i + 1) % len(hosts)]) for i in range(len(hosts))] if len(hosts) > 2 else []


def link_waves(hosts: list[str]) -> list[list[tuple[str, str]]]:
    """The ring's pairs in waves where no host is in two pairs, so tests of one wave run together without
    sharing a NIC: two waves for an even ring, three for an odd one."""
    pairs = _pairs(hosts)
    if len(pairs) < 2:
        return [pairs] if pairs else []
    waves = [pairs[0::2], pairs[1::2]]
    if len(pairs) % 2:          # odd ring: the last pair meets the first one's host
        waves = [pairs[0:-1:2], pairs[1::2], [pairs[-1]]]
    return waves


def render_link_check(spec: ClusterSpec, pool: NodePool) -> str | None:
    """A script for the operator's machine; exits non-zero naming every slow or broken link."""
    if not spec.fabric.rdma or not pool.nics or len(pool.hosts) < 2:
        return None
    roce = spec.fabric.effective_roce
    percent = spec.fabric.checks.link_min_percent
    extra = f" --tclass={roce.tos}" if roce else ""
    # evaluated on each host: the GID index its fabric script found (perftest's -x), none on InfiniBand
    gid = f"\"'$(sed -n \"s/^NCCL_IB_GID_INDEX=/-x /p\" {NCCL_CONF})'\"" if roce else ""
    by_name = {h.hostname: h for h in pool.hosts}
    lines = []
    for wave in link_waves([h.hostname for h in pool.hosts]):
        for server, client in wave:
            for nic in sorted(pool.nics, key=lambda n: n.rail):
                floor = nic.speed_gbps * percent / 100
                lines.append(call("launch", server, by_name[server].address, client, by_name[client].address,
                                  nic.device, nic.rail, f"{floor:g}"))
        lines.append("wait_all")
    template = r'''
# How the hosts are reached, as the program reaches them: user, port, bastion and pinned host keys.
SSH_DIR=$(mktemp -d)
trap 'rm -rf "$SSH_DIR"' EXIT
printf '%s\n' "$(cat @SSH_CONFIG_DOC@)" > "$SSH_DIR/config"
printf '%s\n' "$(cat @KNOWN_HOSTS_DOC@)" > "$SSH_DIR/known_hosts"
remote() {
  ssh -F "$SSH_DIR/config" -o BatchMode=yes -o ConnectTimeout=10 \
    -o UserKnownHostsFile="$SSH_DIR/known_hosts ~/.ssh/known_hosts" "$1" "$2"
}
# check_link SERVER SERVER_ADDRESS CLIENT CLIENT_ADDRESS DEVICE RAIL MIN_GBPS: one line, ok or FAIL.
check_link() {
  local cmd out bw
  # shellcheck disable=SC2016  # the $(...) runs on the remote host
  cmd="ib_write_bw -d $5 -p $((@PORT@ + $6)) @GID@@PERFTEST@@EXTRA@"
  remote "$2" "timeout 60 $cmd" >/dev/null 2>&1 &
  sleep 2
  if ! out=$(remote "$4" "timeout 60 $cmd $2" 2>&1); then
    note "FAIL rail $6 $3 -> $1 ($5): ib_write_bw failed: $(printf '%s' "$out" | tail -n 1)"; wait || true; return 0
  fi
  wait || true
  bw=$(printf '%s\n' "$out" | IB_BW_AWK)
  if awk -v bw="$bw" -v min="$7" 'BEGIN { exit !(bw >= min) }'; then
    note "ok   rail $6 $3 -> $1 ($5): $bw Gb/s (>= $7)"
  else
    note "FAIL rail $6 $3 -> $1 ($5): $bw Gb/s, below $7 Gb/s (@PERCENT@% of line rate)"
  fi
}
# Tests of a wave run together, at most @AT_ONCE@ at a time; each writes its line to a file of its own.
RESULTS="$SSH_DIR/results"
mkdir -p "$RESULTS"
RUNNING=0
launch() {
  LAUNCHED=$((LAUNCHED + 1))
  check_link "$@" > "$RESULTS/$(printf '%06d' "$LAUNCHED")" 2>&1 &
  RUNNING=$((RUNNING + 1))
  if (( RUNNING >= @AT_ONCE@ )); then wait -n || true; RUNNING=$((RUNNING - 1)); fi
}
wait_all() { wait || true; RUNNING=0; }
LAUNCHED=0
@CHECKS@
cat "$RESULTS"/*
if grep -q ": FAIL " "$RESULTS"/*; then fail "some links are below @PERCENT@% of line rate or broken (see FAIL lines)"; fi
'''
    for key, raw in {"@GID@": gid + " " if gid else "", "@PERFTEST@": PERFTEST, "@EXTRA@": extra,
                     "IB_BW_AWK": IB_BW_AWK, "@CHECKS@": "\n".join(lines)}.items():     # shell text, not values to quote
        template = template.replace(key, raw)
    body = fill(template, {"SSH_CONFIG_DOC": _ssh_config(spec, pool), "KNOWN_HOSTS_DOC": _known_hosts(spec, pool)},
                PERCENT=percent, AT_ONCE=LINK_CHECKS_AT_ONCE, PORT=PERFTEST_PORT)
    return script(f"Fabric link check of pool {pool.name}: ib_write_bw per rail, at least {percent}% of line rate",
                  f"links-{pool.name}", body)


def _ssh_config(spec: ClusterSpec, pool: NodePool) -> str:
    """ssh_config for the pool's hosts: each host's user and port, through the bastion when the spec has one."""
    ssh, lines = spec.ssh, []
    for h in pool.hosts:
        lines += [f"Host {h.address}", f"  User {h.ssh_user or ssh.user}", f"  Port {h.ssh_port or ssh.port}"]
        if h.host_key:
            lines.append("  StrictHostKeyChecking yes")
        if ssh.bastion is not None:
            lines.append(f"  ProxyJump {ssh.bastion.user}@{ssh.bastion.host}:{ssh.bastion.port}")
    return "\n".join(lines)


def _known_hosts(spec: ClusterSpec, pool: NodePool) -> str:
    """The host keys the spec pins (the bastion's too), in known_hosts form."""
    def entry(host: str, port: int, key: str) -> str:
        return f"{host if port == 22 else f'[{host}]:{port}'} {key}"
    out = [entry(h.address, h.ssh_port or spec.ssh.port, h.host_key) for h in pool.hosts if h.host_key]
    b = spec.ssh.bastion
    if b is not None and b.host_key:
        out.append(entry(b.host, b.port, b.host_key))
    return "\n".join(out) or "# no host keys pinned in the spec"


def nccl_floor_gb_per_s(spec: ClusterSpec, pool: NodePool) -> float:
    """The pool's floor, the fabric's, or nccl_min_percent (85%) of the slower of NVLink (the model's bus bandwidth)
    and the NICs the ranks use (all of the node's, or the fastest one for a single rank per host)."""
    wanted = pool.nccl_min_busbw_gb_per_s or spec.fabric.checks.nccl_min_busbw_gb_per_s
    if wanted is not None:
        return wanted
    return round(spec.fabric.checks.nccl_min_percent / 100 * pool.nccl_line_rate_gb_per_s, 1)


# all_reduce from 512 MiB to 8 GiB at one rank per GPU (`LAUNCH` starts the ranks); fails below the floor at 8 GiB.
_NCCL_RUN = r'''out=$(LAUNCH -b 512M -e 8G -f 2 -g 1 | tee /dev/stderr)
busbw=$(printf '%s\n' "$out" | LARGEST_BUSBW)
echo "bus bandwidth at 8 GiB ${busbw:-none} GB/s, floor @FLOOR@ GB/s"
awk -v b="${busbw:-0}" -v f=@FLOOR@ 'BEGIN { exit !(b >= f) }'
'''


def _nccl_run(launch: str, floor: float) -> str:
    return fill(_NCCL_RUN.replace("LAUNCH", launch).replace("LARGEST_BUSBW", LARGEST_BUSBW_AWK), FLOOR=floor)


def nccl_hosts(spec: ClusterSpec, pool: NodePool) -> int:
    return min(spec.fabric.checks.nccl_hosts or len(pool.hosts), len(pool.hosts))


def render_nccl_batch(spec: ClusterSpec, pool: NodePool) -> str | None:
    """A Slurm pool's NCCL check: the MPIJob's all_reduce as an sbatch script for the pool's partition (Slurm
    holds the pool's GPUs, so a Kubernetes job there would wait forever). None below two hosts and on MIG pools."""
    hosts = nccl_hosts(spec, pool)
    if hosts < 2 or pool.sharing.mig_config:
        return None
    gpus, floor = pool.nccl_ranks_per_host, nccl_floor_gb_per_s(spec, pool)
    return (f"#!/bin/bash\n#SBATCH --job-name=nccl-check-{pool.name}\n#SBATCH --partition={pool.name}\n"
            f"#SBATCH --nodes={hosts}\n#SBATCH --ntasks-per-node={gpus}\n#SBATCH --gpus-per-node={gpus}\n"
            "#SBATCH --exclusive\n#SBATCH --time=00:30:00\n"
            f"# {pool.name}'s NCCL check (generated by gpucluster): all_reduce at one rank per GPU across {hosts} "
            f"hosts, failing\n# below {floor:g} GB/s of bus bandwidth at 8 GiB. After `pulumi up`, on an idle "
            "partition: sbatch -A <account> <this file>.\n"
            "# The ranks get the pool's NCCL settings from here: a job's tasks do not see the slurmd pod's.\n"
            f"# nccl-tests comes from the slurmd image ({NCCL_TESTS}; NCCL_TESTS_BIN names another).\n"
            "set -euo pipefail\n" + batch_exports(nccl_envs(spec)[pool.name])
            + _nccl_run(f'srun --mpi=pmix "${{NCCL_TESTS_BIN:-{NCCL_TESTS}}}"', floor))


def render_nccl_job(spec: ClusterSpec, pool: NodePool) -> list[dict[str, Any]]:
    """The check's namespace and MPIJob, to `kubectl apply` after `pulumi up` (empty below two hosts, and on
    MIG pools: NCCL does not run across MIG instances).

    Its own namespace, outside Kueue's tenant namespaces: the MPI operator's workers run sshd as root, which
    the tenants' restricted pod security refuses; run it before tenants start or on a drained pool.
    """
    hosts = nccl_hosts(spec, pool)
    if hosts < 2 or pool.sharing.mig_config:
        return []
    gpus, floor = pool.nccl_ranks_per_host, nccl_floor_gb_per_s(spec, pool)
    env = [{"name": k, "value": v} for k, v in pod_env(nccl_envs(spec)[pool.name]).items()]
    exports = " ".join(f"-x {e['name']}" for e in env)
    launcher = "set -euo pipefail\n" + _nccl_run(
        f"mpirun --allow-run-as-root -N {gpus} --bind-to none {exports} {NCCL_TESTS}", floor)
    limits = {pool.gpu_resource_name: gpus}
    if spec.fabric.rdma and pool.nics:
        limits[rdma_resource(spec)] = 1
    image = spec.fabric.checks.nccl_tests_image
    # The launcher goes where the workers go: the spec's nodes all carry their pool's taints, and a cluster may
    # have no untainted node for it.
    placement = {"nodeSelector": {POOL_LABEL: pool.name}, "tolerations": pool_tolerations(pool)}
    networks = pod_networks(spec, pool)
    worker = {**({"metadata": {"annotations": networks}} if networks else {}), "spec": {
        **placement,
        # ready once sshd listens: the launcher is created only then (launcherCreationPolicy)
        "containers": [{"name": "worker", "image": image, "command": ["/usr/sbin/sshd", "-De"], "env": env,
                        "readinessProbe": {"tcpSocket": {"port": 22}, "periodSeconds": 5},
                        "resources": {"limits": limits},
                        "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}]}],
        "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}]}}
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": CHECKS_NAMESPACE, "labels": {"pod-security.kubernetes.io/enforce": "baseline"}}}
    # mpirun takes its ranks from the hostfile: the runner may start fewer workers where hosts are cordoned.
    return [namespace, mpijob(
        {"name": f"nccl-check-{pool.name}", "namespace": CHECKS_NAMESPACE,
         "annotations": {"gpucluster.io/min-busbw-gb-per-s": f"{floor:g}"}},
        slots_per_worker=gpus, worker=worker, workers=hosts,
        launcher={"spec": {**placement, "containers": [{
            "name": "launcher", "image": image, "command": ["/bin/bash", "-c", launcher], "env": env}]}})]
