"""Interrupted applies (issue 28): a generated script killed (SIGKILL of its shell) at many points while moving a
host from one spec to the next converges on the next run, judged by the files and by what is running: each
daemon's loaded configuration (the systemctl double records what it read at its last start) is what is on disk,
and no action is left owed."""

from __future__ import annotations

import re

import pytest

from components.ssh import as_command
from tests.realssh.doubles import STATE_DIR
from tests.realssh.test_node_scripts import preparation

_TRAP = ('set -o functrace; __steps=0\n'
         "trap '__steps=$((__steps + 1)); if (( __steps == @K@ )); then kill -9 $$; fi; "
         "if (( @K@ < 0 )); then printf \"step %s: %s\\\\n\" \"$__steps\" \"$BASH_COMMAND\" >&2; fi' DEBUG\n")
# Where a cut hurts: right after a file changes or a daemon is stopped or restarted (a cut before one is a cut
# after the step before it).
_RISKY = re.compile(r"^(mv -f|rm -f|sed -i|systemctl (stop|start|restart|daemon-reload)|lnetctl import|owe |paid )")


def killed_at(script: str, k: int) -> str:
    """The script with a DEBUG trap that SIGKILLs its shell before its k-th command (functions included); with
    k < 0, it traces every command instead."""
    head, sep, body = script.partition("set -euo pipefail\n")
    return head + sep + _TRAP.replace("@K@", str(k)) + body


def cut_points(hosts, host, script: str) -> list[int]:
    """Steps to kill at: around every step that changes a file or a daemon, and a few evenly spread."""
    traced = run(hosts, host, killed_at(script, -1))
    assert traced.returncode == 0, traced.stderr
    steps = [(int(n), cmd) for n, cmd in re.findall(r"^step (\d+): (.*)$", traced.stderr, re.M)]
    last = steps[-1][0] - 8          # the closing report and change count: nothing left to cut
    after_risky = {n + 1 for n, cmd in steps if _RISKY.match(cmd) and n < last}
    return sorted(after_risky | {1 + i * (last - 1) // 5 for i in range(6)})


def run(hosts, host, script: str):
    return hosts.ssh(host, as_command(script, "root"))


def loaded_matches_disk(host, unit: str, files: str) -> bool:
    loaded = host.read(f"{STATE_DIR}/loaded/{unit}").split()[0]
    host.sh(f"cat {files} 2>/dev/null | md5sum | cut -d' ' -f1 > {STATE_DIR}/disk-md5")
    return host.read(f"{STATE_DIR}/disk-md5").strip() == loaded


A = {"kubelet_topology_policy": "restricted"}
B = {"kubelet_topology_policy": "best-effort", "gpu_power_limit_w": 600}


def test_host_preparation_killed_anywhere_converges_on_the_next_run(test_hosts):
    """Both ways between two specs that change the kubelet drop-in (a kubelet restart) and the power cap (the
    tuning unit's restart); every cut around a change, then a full run."""
    host = test_hosts.hosts["gpu-dev-03"]
    to_a, to_b = preparation(host.name, **A).create, preparation(host.name, **B).create
    for target, other in ((to_b, to_a), (to_a, to_b)):
        assert run(test_hosts, host, other).returncode == 0
        points = cut_points(test_hosts, host, target)
        assert run(test_hosts, host, other).returncode == 0
        for k in points:
            cut = run(test_hosts, host, killed_at(target, k))
            assert cut.returncode != 0, f"step {k}: the kill did not happen"
            again = run(test_hosts, host, target)
            assert again.returncode == 0, (k, again.stderr)
            assert host.exists(f"{STATE_DIR}/active/kubelet"), f"step {k}: kubelet left stopped"
            owed = host.upper("/var/lib/gpucluster/owed")
            assert not owed.exists() or not any(owed.iterdir()), (k, sorted(p.name for p in owed.iterdir()))
            assert loaded_matches_disk(host, "kubelet",
                                       "/etc/kubernetes/kubelet.conf.d/* /etc/default/kubelet /etc/sysconfig/kubelet"), \
                f"step {k}: kubelet runs an older configuration than the one on disk"
            if target is to_b:
                assert loaded_matches_disk(host, "gpucluster-node-tuning",
                                           "/etc/systemd/system/gpucluster-node-tuning.service "
                                           "/usr/local/sbin/gpucluster-node-tuning"), \
                    f"step {k}: the power cap on disk was never applied"
            assert run(test_hosts, host, other).returncode == 0       # back, for the next cut
