"""Slurm's node check on a real SSH test host: its nvidia-smi a double that reports a fault, its scontrol the real
one, reaching a real slurmctld across the test bridge, which drains the host's node with the check's reason."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from components.k8s.slurm import node_check as slurm_health
from tests.slurm_site import MISSING, WHY_MISSING, drained, slurm_site, slurm_spec

pytestmark = pytest.mark.skipif(MISSING is not None, reason=WHY_MISSING)

SAMPLES = Path(__file__).resolve().parents[1] / "samples"
QUERY = (SAMPLES / "nvidia_smi_q_h800.txt").read_text()          # real `nvidia-smi -q`, its row remapper healthy
PENDING = QUERY.replace("Pending                           : No", "Pending                           : Yes")
LINKS = (SAMPLES / "nvidia_smi_nvlink_s_8xh100.txt").read_text()    # every NVLink up at full speed
BIN = "/opt/slurm-check/bin"


@pytest.fixture(scope="module")
def site(test_hosts, tmp_path_factory):
    spec, work = slurm_spec(), tmp_path_factory.mktemp("slurm-site")
    with slurm_site(spec, work, address=f"198.18.{test_hosts.octet}.1") as env:
        yield spec, env, work


def run_check(test_hosts, host, spec, work: Path, when: str, query: str):
    host.put(f"{BIN}/query.txt", query)
    host.put(f"{BIN}/links.txt", LINKS)
    host.put(f"{BIN}/nvidia-smi",
             f"#!/bin/bash\nif [[ $1 == nvlink ]]; then cat {BIN}/links.txt; else cat {BIN}/query.txt; fi\n")
    host.put(f"/opt/slurm-check/{when}.sh", slurm_health.render_node_check(spec, when))
    host.sh(f"chmod 755 {BIN}/nvidia-smi")
    env = f"SLURM_CONF={shlex.quote(str(work / 'slurm.conf'))} SLURMD_NODENAME=gpu-slurm-01 PATH={BIN}:$PATH"
    return test_hosts.ssh(host, f"{env} bash /opt/slurm-check/{when}.sh")


def test_an_epilog_on_a_faulty_host_drains_its_node_and_a_healthy_one_leaves_it(site, test_hosts):
    spec, env, work = site
    host = test_hosts.hosts["gpu-dev-01"]
    ok = run_check(test_hosts, host, spec, work, "epilog", QUERY)
    assert ok.returncode == 0, ok.stderr
    assert drained(env, "gpu-slurm-01") is None
    bad = run_check(test_hosts, host, spec, work, "epilog", PENDING)
    assert bad.returncode == 0 and "gpu-slurm-01 drained" in bad.stderr, bad.stderr
    assert drained(env, "gpu-slurm-01") == "gpucluster: GPU 00000000:18:00.0: row remapping pending"


def test_a_prolog_on_a_faulty_host_fails_after_draining(site, test_hosts):
    spec, env, work = site
    out = run_check(test_hosts, test_hosts.hosts["gpu-dev-02"], spec, work, "prolog", PENDING)
    assert out.returncode == 1, out.stderr
    assert drained(env, "gpu-slurm-01") == "gpucluster: GPU 00000000:18:00.0: row remapping pending"
