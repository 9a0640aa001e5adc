"""The subnet manager's files and probes against the real OpenSM and infiniband-diags (Debian's opensm 3.3,
infiniband-diags 44), on a fabric ibsim simulates (ibsim-utils: the programs reach it through libumad2sim
instead of a kernel's umad devices): prod's opensm.conf and partitions.conf are what OpenSM accepts, the
primary becomes master at its priority and programs every port with the spec's partitions, and the master
detection the host script runs reads what sminfo and smpquery really print."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from components.bash import fill
from components.fabric.host import (OPENSM_UP, PARTITIONS_CONF, SM_MASTER, render_opensm_conf, render_partitions,
                                    sm_priority)
from components.spec import load_spec
from tests.components.fabric.ibsim import FULL, missing, on, opensm, pkey_table, port_guid, simulated, wait
from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(missing() is not None, reason=missing() or "")
SPEC = load_spec(ROOT / "stacks" / "prod.yaml")
HOSTS = [h.hostname for p in SPEC.node_pools for h in p.hosts]


@pytest.fixture(scope="module")
def fabric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One leaf with prod's GPU hosts (an HCA each, named as the host: its node description)."""
    with simulated(tmp_path_factory.mktemp("ibsim"), HOSTS) as work:
        yield work


def _sm_master(host: str) -> subprocess.CompletedProcess[str]:
    """The host script's master detection, run on `host`."""
    return on(host, "bash", "-c", f"set -euo pipefail\n{SM_MASTER}\nsm_master")


def _opensm(fabric: Path, host: str, partitions: str | None = None) -> subprocess.Popen[str]:
    """OpenSM on `host` as its unit starts it, with the files the host script writes for it (paths moved under
    the test's folder); `partitions`: another partitions.conf than the spec's."""
    priority = sm_priority(SPEC, host)
    assert priority is not None
    return opensm(fabric, host, render_opensm_conf(SPEC, priority), partitions or render_partitions(SPEC))


def _up(fabric: Path, host: str, since: int = 0) -> subprocess.CompletedProcess[str]:
    """The host script's check that OpenSM took its files, on `host`'s log from byte `since` (its size before
    OpenSM started)."""
    script = ('set -euo pipefail\nnote() { printf "%s\\n" "$*"; }\nfail() { printf "error: %s\\n" "$*" >&2; exit 1; }\n'
              + fill(OPENSM_UP, PARTITIONS=PARTITIONS_CONF) + f"\nopensm_up {fabric / host / 'opensm.log'} {since}\n")
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=90)


def _master_is(host: str) -> bool:
    """`host`'s OpenSM is the fabric's master within a minute."""
    return bool(wait(lambda: (r := _sm_master(HOSTS[-1])).returncode == 0 and r.stdout.split(" ", 1)[1].strip()
                      == host, 60))


def test_a_fabric_without_a_subnet_manager_has_no_master_to_respect(fabric):
    out = _sm_master(HOSTS[-1])
    assert out.returncode == 1 and out.stdout == ""


def test_prods_subnet_managers_take_the_fabric_primary_first_with_every_port_in_its_partitions(fabric):
    primary, standby = SPEC.fabric.infiniband.subnet_managers
    # The primary first: started together on a busy machine, the standby can win the first election and stays
    # master for over a minute here (both stay ours: the step accepts either as the fabric's master).
    sms = [_opensm(fabric, primary)]
    try:
        assert _master_is(primary), _sm_master(HOSTS[-1]).stdout
        sms.append(_opensm(fabric, standby))
        info = on(HOSTS[-1], "sminfo").stdout
        assert f"priority {sm_priority(SPEC, primary)} state 3 SMINFO_MASTER" in info, info
        for sm in sms:
            assert sm.poll() is None, "an OpenSM exited: it refused its files"
        # the state each last entered, as the step reads it (a standby's reload waits for no sweep)
        assert _state(fabric, primary) == "MASTER" and wait(lambda: _state(fabric, standby) == "STANDBY")
        # a partitions.conf it cannot parse does not stop OpenSM: it says so and runs the default partition alone
        for sm in (primary, standby):           # the script's check: master or standby, partitions taken
            up = _up(fabric, sm)
            assert up.returncode == 0 and up.stdout == "", up.stdout + up.stderr
        for sm in (primary, standby):
            log = (fabric / sm / "opensm.log").read_text() + (fabric / sm / "out.log").read_text()
            assert "PARSE ERROR" not in log and "Partition configuration in error" not in log, log[-3000:]
        # every HCA port: the default partition and each of the spec's, as a full member (IPoIB over them)
        wanted = {0xFFFF, *(p.pkey | FULL for p in SPEC.fabric.infiniband.partitions)}
        for host in HOSTS:
            assert _pkeys(host) == wanted, host
    finally:
        for sm in sms:
            sm.terminate()
            sm.wait(timeout=10)


def _pkeys(host: str) -> set[int]:
    """The P_Keys the subnet manager programmed into `host`'s port (its P_Key table, read over the fabric)."""
    return set(pkey_table(host, HOSTS[-1])) - {0}


def test_every_option_of_the_generated_opensm_conf_is_one_opensm_has(tmp_path):
    """OpenSM takes an option it does not know without a word: each of ours is in the template it writes."""
    subprocess.run(["opensm", "--create-config", str(tmp_path / "template.conf")], capture_output=True, timeout=30)
    known = {line.split()[0] for line in (tmp_path / "template.conf").read_text().splitlines()
             if line.strip() and not line.startswith("#")}
    ours = {line.split()[0] for line in render_opensm_conf(SPEC, 15).splitlines() if not line.startswith("#")}
    assert ours and ours <= known, ours - known


def test_a_partitions_file_opensm_cannot_parse_fails_the_step_though_opensm_runs_on(fabric):
    host = SPEC.fabric.infiniband.subnet_managers[0]
    log = fabric / host / "opensm.log"
    since = log.stat().st_size if log.exists() else 0        # OpenSM appends to its log: this start's part
    sm = _opensm(fabric, host, partitions=render_partitions(SPEC) + "\nteam-x 0x0b01 ipoib\n")   # no = or :
    try:
        up = _up(fabric, host, since)
        assert sm.poll() is None, "OpenSM stopped: it does not, on a bad partitions.conf"
        assert up.returncode == 1 and "OpenSM could not parse /etc/opensm/partitions.conf and runs the default " \
            "partition alone: " in up.stderr and "PARSE ERROR" in up.stderr, up.stdout + up.stderr
    finally:
        sm.terminate()
        sm.wait(timeout=10)


def _state(fabric: Path, host: str) -> str:
    """The host script's reading of the state `host`'s OpenSM last entered, from its log."""
    script = 'set -euo pipefail\n' + fill(OPENSM_UP, PARTITIONS=PARTITIONS_CONF) + '\nopensm_state "$1"\n'
    return subprocess.run(["bash", "-c", script, "-", str(fabric / host / "opensm.log")], capture_output=True,
                          text=True, timeout=30).stdout.strip()


def test_a_partition_change_reaches_the_ports_on_a_hangup_without_a_restart(fabric):
    """The step's reload on a partitions.conf change (the unit's ExecReload: SIGHUP): the master's next heavy
    sweep programs the new partition into its member's port with no restart, and the step's check sees it take
    the file. A file it cannot parse, hung up on, fails the check as at a start. (A standby sweeps nothing on a
    hangup: the step reads its state instead, checked in the test above.)"""
    primary = SPEC.fabric.infiniband.subnet_managers[0]
    log = fabric / primary / "opensm.log"
    start = log.stat().st_size if log.exists() else 0
    sm = _opensm(fabric, primary)
    try:
        assert _up(fabric, primary, start).returncode == 0           # swept: every port has its LID
        assert _master_is(primary) and _state(fabric, primary) == "MASTER"
        member, other = HOSTS[2], HOSTS[3]
        before = _pkeys(member)
        since = log.stat().st_size
        (fabric / primary / "partitions.conf").write_text(
            render_partitions(SPEC) + f"\nteam-x=0x0b01 : {port_guid(member)}=full ;\n")
        sm.send_signal(signal.SIGHUP)
        up = _up(fabric, primary, since)
        assert up.returncode == 0 and up.stdout == "", up.stdout + up.stderr
        assert wait(lambda: _pkeys(member) == before | {0x0B01 | FULL}), _pkeys(member)
        assert 0x0B01 | FULL not in _pkeys(other)
        assert sm.poll() is None and "Entering" not in log.read_text()[since:]      # the same OpenSM, no election
        since = log.stat().st_size
        with (fabric / primary / "partitions.conf").open("a") as f:
            f.write("team-y 0x0b02 ipoib\n")                           # no = or :
        sm.send_signal(signal.SIGHUP)
        bad = _up(fabric, primary, since)
        assert bad.returncode == 1 and "OpenSM could not parse" in bad.stderr, bad.stdout + bad.stderr
    finally:
        sm.terminate()
        sm.wait(timeout=10)
