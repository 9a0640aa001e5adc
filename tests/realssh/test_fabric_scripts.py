"""The RoCE host script over real SSH: real interfaces (veth) get their MTU, a fake device tree stands in for
the ConnectX sysfs/configfs entries, and mlnx_qos, ethtool and systemctl are recording doubles."""

from __future__ import annotations

import subprocess

import yaml

from components.fabric.host import APPLY, APPLY_UNIT, render_fabric_host
from components.fabric.nccl import NCCL_CONF, nccl_envs
from components.spec import parse_spec
from components.ssh import as_command
from tests.conftest import _DEV


def fabric_script(host, **nic_changes):
    data = yaml.safe_load(yaml.safe_dump(_DEV))
    for nic in data["node_pools"][0]["nics"]:
        nic.update(nic_changes.get(nic["device"], {}))
    spec = parse_spec(yaml.safe_dump(data))
    pool = spec.node_pools[0]
    return render_fabric_host(spec, host.name, pool.nics, nccl_envs(spec)[pool.name])


def storage_server_script(host):
    """The dev stack's storage server (BeeGFS over RDMA on RoCE), as the host runs it: its storage NIC only."""
    from components.fabric.fabric import fabric_hosts
    spec = parse_spec(yaml.safe_dump(_DEV))
    server = next(h for h in fabric_hosts(spec) if h.hostname == spec.storage.servers[0].hostname)
    assert server.nics == [] and server.storage_interfaces == ["ens1f0np0"]
    return render_fabric_host(spec, host.name, [], {}, server.storage_interfaces)


def run(hosts, host, script, step="create"):
    return hosts.ssh(host, as_command(getattr(script, step), "root"))


def mtu(hosts, host, ifname):
    out = subprocess.run(["ip", "netns", "exec", host.netns, "ip", "-o", "link", "show", ifname],
                         capture_output=True, text=True, check=True).stdout
    return int(out.split(" mtu ")[1].split()[0])


def test_roce_settings_are_applied_and_a_second_run_changes_nothing(test_hosts):
    host = test_hosts.hosts["gpu-dev-01"]
    assert mtu(test_hosts, host, "ens1f0np0") == 1500
    first = run(test_hosts, host, fabric_script(host))
    assert first.returncode == 0, first.stdout + first.stderr
    for ifname in ("ens1f0np0", "ens2f0np0"):
        assert mtu(test_hosts, host, ifname) == 9000
        assert f"gpu-dev-01: changed: {ifname}: MTU 1500 -> 9000" in first.stdout
        assert f"gpu-dev-01: changed: {ifname}: trust DSCP (was pcp)" in first.stdout
        for point in ("roce_np", "roce_rp"):
            assert host.sysfs(f"/sys/class/net/{ifname}/ecn/{point}/enable/3").read_text().strip() == "1"
            assert host.sysfs(f"/sys/class/net/{ifname}/ecn/{point}/enable/4").read_text().strip() == "0"
    for dev in ("mlx5_0", "mlx5_1"):
        cma = f"/sys/kernel/config/rdma_cm/{dev}/ports/1"
        assert host.sysfs(f"{cma}/default_roce_mode").read_text().strip() == "RoCE v2"
        assert host.sysfs(f"{cma}/default_roce_tos").read_text().strip() == "106"
    calls = host.calls()
    assert "mlnx_qos -i ens1f0np0 --pfc 0,0,0,1,0,0,0,0" in calls
    assert "ethtool -A ens2f0np0 autoneg off rx off tx off" in calls
    assert not any("--dscp2prio" in c for c in calls)      # DSCP 26 and 48 already land on 3 and 6
    assert f"ExecStart={APPLY} 180" in host.read(APPLY_UNIT) and host.exists(APPLY)
    conf = host.read(NCCL_CONF).splitlines()
    assert "NCCL_IB_HCA==mlx5_0:1,mlx5_1:1" in conf and "NCCL_IB_TC=106" in conf
    assert "NCCL_IB_GID_INDEX=3" in conf                  # read from the device: the IPv4 RoCE v2 entry
    host.clear_calls()
    second = run(test_hosts, host, fabric_script(host))
    assert second.returncode == 0, second.stderr
    assert "changed:" not in second.stdout and second.stdout.endswith("gpu-dev-01: 0 change(s)\n")
    assert not any(" --" in c or c.startswith("ethtool -A") for c in host.calls() if not c.startswith("systemctl"))


def test_the_boot_unit_reapplies_what_a_reboot_loses(test_hosts):
    host = test_hosts.hosts["gpu-dev-02"]
    assert run(test_hosts, host, fabric_script(host)).returncode == 0
    host.sh("ip link set dev ens1f0np0 mtu 1500; echo 0 > /sys/class/net/ens1f0np0/ecn/roce_np/enable/3")
    boot = test_hosts.ssh(host, "systemctl start gpucluster-fabric")      # the double runs ExecStart
    assert boot.returncode == 0, boot.stderr
    assert "changed: ens1f0np0: MTU 1500 -> 9000" in boot.stdout
    assert mtu(test_hosts, host, "ens1f0np0") == 9000
    assert host.sysfs("/sys/class/net/ens1f0np0/ecn/roce_np/enable/3").read_text().strip() == "1"


def test_a_missing_nic_fails_with_its_name_before_anything_changes(test_hosts):
    host = test_hosts.hosts["gpu-dev-03"]
    out = run(test_hosts, host, fabric_script(host, mlx5_1={"interface": "ens9f0np0"}))
    assert out.returncode != 0
    assert "gpu-dev-03: error: NIC ens9f0np0 (rail 1, mlx5_1) not found" in out.stderr
    assert mtu(test_hosts, host, "ens1f0np0") == 1500              # the NIC that exists was left alone
    assert not any(c.startswith("mlnx_qos") for c in host.calls())


def test_a_missing_tool_fails_with_its_name_before_anything_changes(test_hosts):
    host = test_hosts.hosts["gpu-dev-03"]
    with host.without("mlnx_qos"):
        out = run(test_hosts, host, fabric_script(host))
    assert out.returncode != 0
    assert "gpu-dev-03: error: mlnx_qos is missing (install DOCA-OFED or mlnx-tools" in out.stderr
    assert mtu(test_hosts, host, "ens1f0np0") == 1500 and mtu(test_hosts, host, "ens2f0np0") == 1500
    assert not any(c.startswith("ethtool -A") for c in host.calls())


def test_a_netdev_paired_with_the_wrong_rdma_device_is_refused(test_hosts):
    host = test_hosts.hosts["gpu-dev-03"]
    out = run(test_hosts, host, fabric_script(host, mlx5_0={"interface": "ens2f0np0"},
                                              mlx5_1={"interface": "ens1f0np0"}))
    assert out.returncode != 0 and "ens2f0np0 is not a port of mlx5_0 (rail 0)" in out.stderr


def test_undo_removes_the_boot_unit_and_the_nccl_config(test_hosts):
    host = test_hosts.hosts["gpu-dev-01"]
    script = fabric_script(host)
    assert run(test_hosts, host, script).returncode == 0
    out = run(test_hosts, host, script, "delete")
    assert out.returncode == 0, out.stderr
    assert not host.exists(APPLY_UNIT) and not host.exists(APPLY) and not host.exists(NCCL_CONF)


def test_a_storage_servers_roce_nic_joins_the_lossless_class_found_by_its_interface(test_hosts):
    """Storage over RDMA on RoCE rides the same priority as NCCL: the server's storage NIC gets trust, PFC,
    ECN, MTU and the RDMA-CM ToS, its RDMA device read from sysfs; no NCCL settings on a storage server."""
    host = test_hosts.hosts["gpu-dev-03"]
    script = storage_server_script(host)
    assert NCCL_CONF not in script.create
    first = run(test_hosts, host, script)
    assert first.returncode == 0, first.stdout + first.stderr
    assert mtu(test_hosts, host, "ens1f0np0") == 9000
    assert "mlnx_qos -i ens1f0np0 --trust dscp" in host.calls()
    assert "mlnx_qos -i ens1f0np0 --pfc 0,0,0,1,0,0,0,0" in host.calls()
    assert host.sysfs("/sys/kernel/config/rdma_cm/mlx5_0/ports/1/default_roce_tos").read_text().strip() == "106"
    assert not any("ens2f0np0" in c for c in host.calls())         # the rails are not the server's business
    second = run(test_hosts, host, script)
    assert second.returncode == 0 and "changed:" not in second.stdout, second.stdout


def test_a_storage_interface_without_an_rdma_device_fails_before_anything_changes(test_hosts):
    host = test_hosts.hosts["gpu-dev-03"]
    host.sysfs("/sys/class/net/ens1f0np0/device/infiniband/mlx5_0").rmdir()
    try:
        host.clear_calls()
        out = run(test_hosts, host, storage_server_script(host))
    finally:
        host.sysfs("/sys/class/net/ens1f0np0/device/infiniband/mlx5_0").mkdir()
    assert out.returncode == 1
    assert "ens1f0np0 has no RDMA device" in out.stderr and "fix storage.server_interface" in out.stderr
    assert not any(" --" in c for c in host.calls())
