"""Tenants isolated on InfiniBand, against the real OpenSM over a simulated fabric of the example stack's hosts
(two rails each), its storage servers and its subnet manager: the generated partitions.conf, with port GUIDs read
from the ports, is what OpenSM takes; it programs each isolated tenant's partition at P_Key index 0 of its ports,
and the subnet administrator's path records (what a job's connection setup asks for) reach exactly what the
plan's reach report says, also after a pool changes hands."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

from components.fabric.host import render_opensm_conf, render_partitions, sm_priority
from components.bash import script
from components.fabric.partitions import CHECK_TENANT_PORTS, VERIFY_S, fabric_reach, host_groups, render_partition_step
from components.spec import ClusterSpec
from tests.components.fabric.isolated_specs import hand_b_to_team_a, isolated_example
from tests.components.fabric.ibsim import FULL, UMAD2SIM, missing, on, opensm, path_between, pkey_table, port_guid, simulated, wait

pytestmark = pytest.mark.skipif(missing() is not None, reason=missing() or "")
RAILS = ("mlx5_0", "mlx5_1")


def _variant(change=lambda d: None) -> ClusterSpec:
    return isolated_example(len(RAILS), change)


SPEC = _variant()
HOSTS = [h.hostname for _, h in SPEC.hosts()]
STORAGE = [s.hostname for s in SPEC.storage.servers[:2]]
NODES = [f"{h}/{d}" for h in HOSTS for d in RAILS] + STORAGE
SM = f"{SPEC.fabric.infiniband.subnet_managers[0]}/mlx5_0"


@pytest.fixture(scope="module")
def fabric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with simulated(tmp_path_factory.mktemp("ibsim"), NODES) as work:
        yield work


def guids() -> dict[str, dict[str, str]]:
    """Host -> device -> port GUID, as the hosts' fabric steps report them."""
    return {h: {d: port_guid(f"{h}/{d}") for d in RAILS} for h in HOSTS}


def started(work: Path, spec: ClusterSpec):
    sm = opensm(work, SM, render_opensm_conf(spec, sm_priority(spec, SM.split("/")[0])),
                render_partitions(spec, guids()))
    assert wait(lambda: "SUBNET UP" in _log(work), 60), _log(work)
    return sm


def _log(work: Path) -> str:
    log = work / SM.replace("/", "_") / "opensm.log"
    return log.read_text() if log.exists() else ""


def _owner(spec: ClusterSpec, host: str) -> str | None:
    return next((spec.isolated_pools.get(p.name) for p, h in spec.hosts() if h.hostname == host), None)


def test_each_isolated_tenants_partition_sits_at_index_0_of_its_ports_and_the_others_are_limited(fabric):
    sm = started(fabric, SPEC)
    try:
        assert "Partition configuration in error" not in _log(fabric)
        pkeys = SPEC.tenant_pkeys
        for node in NODES:
            host = node.split("/")[0]
            table = wait(lambda: pkey_table(node, SM))
            owner = _owner(SPEC, host)
            if owner is None:            # shared hosts and storage: full members of the shared partitions only
                assert table[:2] == [0x7FFF | FULL, 0x0A01 | FULL] and len(table) == 2, (node, table)
            else:
                assert table[0] == pkeys[owner] | FULL, (node, [hex(k) for k in table])
                assert sorted(table[1:]) == [0x0A01, 0x7FFF], (node, [hex(k) for k in table])   # limited
        # the step's own check, run on the master's host with the real smpquery: every tenant port as it must be
        ports = _ports(SPEC, guids())
        done = _check(ports)
        assert done.returncode == 0 and "error" not in done.stderr and "not checked" not in done.stdout, \
            done.stdout + done.stderr
        swapped = ports.replace(f"{pkeys['team-a'] | FULL:#06x}", f"{pkeys['team-b'] | FULL:#06x}", 1)
        bad = _check(swapped)
        assert bad.returncode == 1 and f"has {pkeys['team-a'] | FULL:#06x} at P_Key index 0, not " \
            f"{pkeys['team-b'] | FULL:#06x}" in bad.stderr, bad.stdout + bad.stderr
        # ports the fabric does not know: one bound for them all, noted and not judged
        t0 = time.monotonic()
        gone = _check("".join(f"gone-{i} mlx5_0 0x{0xdead0000 + i:016x} 0x8b01\n" for i in range(10)))
        assert gone.returncode == 0 and "10 tenant port(s) could not be read from here within 60 s: not checked" \
            in gone.stdout.replace("within 4 s", "within 60 s"), gone.stdout + gone.stderr
        assert time.monotonic() - t0 < 4 + 10 * 2 * 2, "the bound is not one for all the ports"
        # what a job's connection setup gets from the subnet administrator is what the plan reports
        reach = fabric_reach(SPEC)
        for src in NODES:
            for dst in NODES:
                if src.split("/")[0] != dst.split("/")[0] and src.endswith(("mlx5_0", *STORAGE)) \
                        and dst.endswith(("mlx5_0", *STORAGE)):
                    assert path_between(src, dst) == _reaches(reach, src, dst), (src, dst)
    finally:
        sm.terminate()
        sm.wait(timeout=10)


def _ports(spec: ClusterSpec, found: dict[str, dict[str, str]]) -> str:
    """The step's list of tenant ports (HOST DEVICE GUID PKEY), as render_partition_step writes it."""
    step = render_partition_step(spec, SM.split("/")[0], found).create
    return "\n".join(line for line in step.splitlines() if re.fullmatch(r"\S+ mlx5_\d+ 0x[0-9a-f]{16} 0x[0-9a-f]{4}", line))


def _check(ports: str):
    """check_tenant_ports on the master's HCA, with a short retry budget (the sweep is done)."""
    text = script("check", "sm", CHECK_TENANT_PORTS.replace(f"SECONDS + {VERIFY_S}", "SECONDS + 4")
                  + "check_tenant_ports\n")
    env = {**os.environ, "SIM_HOST": SM, "LD_PRELOAD": str(UMAD2SIM)}
    return subprocess.run(["bash", "-c", text], input=ports, env=env, capture_output=True, text=True, timeout=300)


def _reaches(reach: dict, src: str, dst: str) -> bool:
    group = host_groups(SPEC)
    return group[dst.split("/")[0]] in reach["groups"][group[src.split("/")[0]]]["reaches"]


def test_a_pool_handed_to_another_tenant_takes_its_partition_at_index_0_on_a_hangup(fabric):
    """Day 2: the pool's ports take their new tenant's key at index 0 in the master's next sweep, with no
    restart; the old tenant's partition is gone from them, and the report's reach is the fabric's again.
    Where isolation ends, the partitions step's delete puts every port back as a full member of the shared
    partitions."""
    sm = started(fabric, SPEC)
    try:
        moved = _variant(hand_b_to_team_a)
        b_node, a_node = f"{HOSTS[6]}/mlx5_0", f"{HOSTS[4]}/mlx5_0"
        assert not path_between(a_node, b_node)
        (fabric / SM.replace("/", "_") / "partitions.conf").write_text(render_partitions(moved, guids()) + "\n")
        sm.send_signal(signal.SIGHUP)
        team_a = moved.tenant_pkeys["team-a"] | FULL
        assert wait(lambda: pkey_table(b_node, SM)[0] == team_a, 60), [hex(k) for k in pkey_table(b_node, SM)]
        assert SPEC.tenant_pkeys["team-b"] not in {k & 0x7FFF for k in pkey_table(b_node, SM)}
        assert path_between(a_node, b_node) and fabric_reach(moved)["groups"]["h100-a"]["cut_off_from"] == []
        assert sm.poll() is None and "Entering" not in _log(fabric).split("SUBNET UP")[-1]     # no election

        # what the partitions step's delete writes where isolation ends: the shared partitions alone
        shared = render_partitions(SPEC)
        assert shared in render_partition_step(SPEC, SM.split("/")[0], guids()).delete
        (fabric / SM.replace("/", "_") / "partitions.conf").write_text(shared + "\n")
        sm.send_signal(signal.SIGHUP)
        assert wait(lambda: pkey_table(b_node, SM) == [0x7FFF | FULL, 0x0A01 | FULL], 60), pkey_table(b_node, SM)
    finally:
        sm.terminate()
        sm.wait(timeout=10)
