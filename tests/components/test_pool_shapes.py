"""Clusters whose pools differ: management interface, NIC names, NCCL floor per pool; uplinks faster than hosts."""

from __future__ import annotations

import yaml

from components.fabric.checks import nccl_floor_gb_per_s, render_nccl_job
from components.fabric.nccl import nccl_envs
from components.k8s import rails
from components.k8s.platform import network_operator
from components.spec import parse_spec
from components.spec.topology import plan_topology
from tests.conftest import problems_of


def with_l40s_pool(data):
    """A second pool of PCIe servers: other NIC names, another management interface, its own NCCL floor."""
    data["sites"][0]["racks"][0]["pdu_capacity_kw"] = 60
    data["node_pools"].append({
        "name": "l40s", "gpu": {"model": "L40S-48GB", "count": 4}, "cpu_cores_per_host": 64,
        "memory_gib_per_host": 512, "control_interface": "enp65s0f0", "nccl_min_busbw_gb_per_s": 15,
        "hosts": [{"hostname": f"l40s-0{i}", "address": f"10.10.0.{20 + i}", "rack": "r01"} for i in (1, 2)],
        "nics": [{"rail": 0, "device": "mlx5_0", "interface": "enp1s0np0", "speed_gbps": 200},
                 {"rail": 1, "device": "mlx5_1", "interface": "enp2s0np0", "speed_gbps": 200}]})
    return parse_spec(yaml.safe_dump(data))


def test_each_pool_has_its_own_management_interface_and_nccl_floor(dev_data):
    spec = with_l40s_pool(dev_data)
    envs = nccl_envs(spec)
    assert envs["h100"]["NCCL_SOCKET_IFNAME"] == "=eno1" and envs["l40s"]["NCCL_SOCKET_IFNAME"] == "=enp65s0f0"
    l40s = spec.pools["l40s"]
    assert nccl_floor_gb_per_s(spec, l40s) == 15
    assert render_nccl_job(spec, l40s)[1]["metadata"]["annotations"]["gpucluster.io/min-busbw-gb-per-s"] == "15"
    assert nccl_floor_gb_per_s(spec, spec.pools["h100"]) == 85.0     # 85% of two 400 Gb/s NICs


def test_a_pools_own_management_interface_must_not_be_one_of_its_data_nics(dev_data):
    with_l40s_pool(dev_data)
    dev_data["node_pools"][1]["control_interface"] = "enp2s0np0"
    (msg,) = problems_of(dev_data)
    assert ("node_pools[1].nics[1].interface: enp2s0np0 is node_pools[1].control_interface and also the rail 1 data "
            "NIC of node pool l40s") in msg


def test_pools_naming_a_rails_nic_differently_get_a_network_each_on_one_address_pool(dev_data):
    spec = with_l40s_pool(dev_data)
    objs = {(m.obj["kind"], m.obj["metadata"]["name"]): m.obj for m in network_operator.render_secondary_networks(spec)}
    assert objs["MacvlanNetwork", "rail-0-ens1f0np0"]["spec"]["master"] == "ens1f0np0"
    assert objs["MacvlanNetwork", "rail-0-enp1s0np0"]["spec"]["master"] == "enp1s0np0"
    pool0 = objs["IPPool", "rail-0"]["spec"]
    assert pool0["subnet"] == "10.201.0.0/16"
    assert pool0["nodeSelector"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["h100", "l40s"]
    assert sorted(kind for kind, _ in objs) == ["IPPool"] * 2 + ["MacvlanNetwork"] * 4
    assert rails.pod_networks(spec, spec.pools["l40s"]) == {
        "k8s.v1.cni.cncf.io/networks": "default/rail-0-enp1s0np0,default/rail-1-enp2s0np0"}


def test_uplinks_faster_than_host_ports_count_at_their_own_rate(dev_data):
    dev_data["fabric"]["switches"] = [
        {"name": "leaf-1", "role": "leaf", "vendor": "cumulus", "address": "10.10.0.2", "ports": 32,
         "port_speed_gbps": 400, "uplink_speed_gbps": 800, "uplinks": ["spine-1"]},
        {"name": "spine-1", "role": "spine", "vendor": "cumulus", "address": "10.10.0.3", "ports": 32,
         "port_speed_gbps": 800}]
    load = plan_topology(parse_spec(yaml.safe_dump(dev_data)))[0].leaves["leaf-1"]
    assert (load.down_gbps, load.up_gbps, load.oversubscription) == (1600, 800, 2.0)
