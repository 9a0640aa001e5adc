"""An isolated pool's host over real SSH (issue 58): its fabric step reports each rail's port GUID as the real
ibstat reads it from the device tree (the fake tree mlx5_ib publishes, hosts.py), the partitions step reads those
lines back, and NCCL uses P_Key index 0, where the tenant's partition sits. The partitions file itself is judged
by the real OpenSM in tests/components/fabric/test_isolation_real.py."""

from __future__ import annotations

import pytest

from components.fabric.fabric import fabric_hosts
from components.fabric.host import render_fabric_host
from components.fabric.nccl import NCCL_CONF
from components.fabric.partitions import port_guids
from components.ssh import as_command
from tests.components.fabric.isolated_specs import isolated_example

from .hosts import TestHosts, unavailable

RAILS = (("mlx5_0", "ibp0s0"), ("mlx5_1", "ibp1s0"))


def two_rail_spec():
    """The isolated example with two rails per host, as the test host has."""
    return isolated_example(len(RAILS))


@pytest.fixture(scope="module")
def ib_hosts(tmp_path_factory):
    why = unavailable()
    if why:
        pytest.skip(why)
    names = ["gpu-prod-05", "gpu-prod-03"]           # team-a's dedicated pool, the shared pool
    hosts = TestHosts(tmp_path_factory.mktemp("ibhosts"), names,
                      {n: tuple((d, i, "InfiniBand") for d, i in RAILS) for n in names})
    try:
        yield hosts.start()
    finally:
        hosts.stop()


def test_an_isolated_hosts_fabric_step_reports_its_port_guids_as_ibstat_reads_them(ib_hosts):
    spec = two_rail_spec()
    by_name = {h.hostname: h for h in fabric_hosts(spec)}
    for name, isolated in (("gpu-prod-05", True), ("gpu-prod-03", False)):
        host, fh = ib_hosts.hosts[name], by_name[name]
        step = render_fabric_host(spec, name, fh.nics, fh.nccl)
        done = ib_hosts.ssh(host, as_command(step.create, "root"), timeout_s=180)
        assert done.returncode == 0, done.stdout + done.stderr
        # the fake tree's GUIDs (gids/0's low 64 bits), as the real ibstat prints them
        wanted = {d: host.port_guid(d) for d, _ in RAILS}
        assert port_guids(done.stdout) == (wanted if isolated else {}), done.stdout
        nccl = host.read(NCCL_CONF)
        assert ("NCCL_IB_PKEY=0" in nccl) == isolated, nccl
        again = ib_hosts.ssh(host, as_command(step.create, "root"), timeout_s=180)
        assert again.returncode == 0 and f"{name}: 0 change(s)" in again.stdout, again.stdout + again.stderr
        assert port_guids(again.stdout) == port_guids(done.stdout)      # reported on every run, not on change


def test_a_port_ibstat_shows_no_guid_for_fails_the_step_naming_it(ib_hosts):
    spec = two_rail_spec()
    fh = next(h for h in fabric_hosts(spec) if h.hostname == "gpu-prod-05")
    host = ib_hosts.hosts["gpu-prod-05"]
    gids = host.sysfs("/sys/class/infiniband/mlx5_1/ports/1/gids/0")
    kept = gids.read_text()
    host.sh("echo 0000:0000:0000:0000:0000:0000:0000:0000 > /sys/class/infiniband/mlx5_1/ports/1/gids/0")
    try:
        done = ib_hosts.ssh(host, as_command(render_fabric_host(spec, "gpu-prod-05", fh.nics, fh.nccl).create, "root"),
                            timeout_s=180)
    finally:
        host.put("/sys/class/infiniband/mlx5_1/ports/1/gids/0", kept)
    assert done.returncode != 0 and "mlx5_1: ibstat shows no port GUID" in done.stderr, done.stdout + done.stderr
