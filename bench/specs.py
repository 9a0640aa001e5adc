"""Synthetic cluster specs the way a platform team at that size would write them: N nodes of 8 H100 in racks of
four (DGX H100, 10.2 kW each, on 60 kW PDUs), a rail-optimized two-tier NDR fat tree (8 rails; per rail one 64-port
leaf per 32 nodes, with that rail's spines above it), Lustre sized to 0.15 GB/s per GPU, one tenant per 16 nodes."""

from __future__ import annotations

import copy
import math

import yaml
from typing import Any

RAILS, PER_RACK, RACKS_PER_LEAF, PORTS, SPINE_PORTS = 8, 4, 7, 64, 128
PER_LEAF = PER_RACK * RACKS_PER_LEAF          # 28 hosts on a 64-port leaf: 32 up, 4 spare for growth


def synthetic(nodes: int) -> dict[str, Any]:
    racks = math.ceil(nodes / PER_RACK)
    hosts = [{"hostname": f"gpu-{i:05d}", "address": f"10.{64 + i // 65000}.{(i // 250) % 256}.{i % 250 + 2}",
              "rack": f"r{i // PER_RACK:04d}"} for i in range(nodes)]
    groups = math.ceil(nodes / PER_LEAF)                 # leaves per rail
    spines_per_rail = min(32, max(1, math.ceil(groups * 32 / SPINE_PORTS)))
    links = 32 // spines_per_rail
    racks_per_group = RACKS_PER_LEAF
    switches: list[dict[str, Any]] = []
    for rail in range(RAILS):
        spines = [f"spine-r{rail}-{s:02d}" for s in range(spines_per_rail)]
        for g in range(groups):
            switches.append({"name": f"leaf-r{rail}-g{g:03d}", "role": "leaf", "vendor": "mlnx-os",
                             "address": f"10.60.{rail}.{g + 2}", "ports": PORTS, "port_speed_gbps": 400,
                             "rails": [rail], "managed": False, "uplinks": spines, "links_per_uplink": links,
                             "racks": [f"r{r:04d}" for r in range(g * racks_per_group,
                                                                 min(racks, (g + 1) * racks_per_group))]})
        switches += [{"name": s, "role": "spine", "vendor": "mlnx-os", "address": f"10.61.{rail}.{i + 2}",
                      "ports": SPINE_PORTS, "port_speed_gbps": 400, "managed": False} for i, s in enumerate(spines)]
    gpus = nodes * 8
    oss = max(2, math.ceil(gpus * 0.15 / 60))
    servers = [{"hostname": "mds-01", "address": "10.62.0.2", "data_address": "10.63.0.2", "rack": "rstor",
                "targets": [{"role": "mgs-mdt", "index": 0, "device": "/dev/disk/by-id/nvme-mdt0",
                             "raid_level": "raid10", "size_tib": 30}]}]
    servers += [{"hostname": f"oss-{s:03d}", "address": f"10.62.{1 + s // 250}.{s % 250 + 2}",
                 "data_address": f"10.63.{1 + s // 250}.{s % 250 + 2}", "rack": "rstor",
                 "targets": [{"role": "ost", "index": 2 * s + j, "device": f"/dev/disk/by-id/dm-ost{2 * s + j}",
                              "raid_level": "raid6", "size_tib": 150} for j in range(2)]} for s in range(oss)]
    tenants = [{"name": f"team-{t:04d}", "groups": {"edit": [f"oidc:team-{t:04d}"]},
                "gpu_quota": {"h100": {"nominal": 128, "borrowing_limit": 128}}}
               for t in range(max(1, nodes // 16))]
    return {
        "name": f"bench{nodes}", "environment": "prod",
        "sites": [{"name": "dc", "racks": [{"name": f"r{r:04d}", "pdu_capacity_kw": 60} for r in range(racks)]
                   + [{"name": "rstor", "pdu_capacity_kw": 60}]}],
        "ssh": {"user": "ubuntu"},
        "node_pools": [{"name": "h100", "host_model": "dgx-h100", "gpu": {"model": "H100-SXM5-80GB", "count": 8},
                        "cpu_cores_per_host": 112, "memory_gib_per_host": 2048, "host_base_power_w": 4600,
                        "hosts": hosts,
                        "nics": [{"rail": r, "device": f"mlx5_{r}", "interface": f"ibp{r}s0", "speed_gbps": 400}
                                 for r in range(RAILS)]}],
        "fabric": {"kind": "infiniband", "control_interface": "enp90s0f0",
                   "infiniband": {"subnet_managers": [hosts[0]["hostname"], hosts[-1]["hostname"]]},
                   "switches": switches},
        "storage": {"kind": "lustre", "version": "2.15", "fs_name": "benchfs", "mount_point": "/mnt/benchfs",
                    "server_interface": "ib0", "read_gb_per_s_per_server": 60, "servers": servers},
        "tenants": tenants,
    }


def add_node(spec: dict[str, Any]) -> dict[str, Any]:
    """One more host in the first rack (its PDU and leaf have room): what a team does to grow the cluster."""
    hosts = spec["node_pools"][0]["hosts"]
    i = len(hosts)
    hosts.append({"hostname": f"gpu-{i:05d}", "address": f"10.{64 + i // 65000}.{(i // 250) % 256}.{i % 250 + 2}",
                  "rack": hosts[0]["rack"]})
    return spec


def split(spec: dict[str, Any], shards: int) -> dict[str, Any]:
    """The same cluster as a platform stack and `shards` stacks of GPU hosts (README: Split stacks): its hosts in
    `shards` pools of a shard each, each tenant's quota on one pool, and the subnet managers on two storage
    servers, since one on a GPU host keeps its pool in the platform stack, whose preparation and burn-in would
    then come before every shard's."""
    data = copy.deepcopy(spec)
    pool, tenants = data["node_pools"][0], data["tenants"]
    hosts = pool["hosts"]
    if len(hosts) % shards or len(tenants) % shards:
        raise SystemExit(f"{len(hosts)} nodes and {len(tenants)} tenants do not divide into {shards} shards")
    per = len(hosts) // shards
    names = [f"{pool['name']}-s{i:02d}" for i in range(shards)]
    data["node_pools"] = [{**pool, "name": name, "hosts": hosts[i * per:(i + 1) * per]} for i, name in enumerate(names)]
    for t, tenant in enumerate(tenants):
        tenant["gpu_quota"] = {names[t * shards // len(tenants)]: tenant["gpu_quota"][pool["name"]]}
    data["fabric"]["infiniband"]["subnet_managers"] = [s["hostname"] for s in data["storage"]["servers"][:2]]
    data["shards"] = [{"name": f"s{i:02d}", "node_pools": [name]} for i, name in enumerate(names)]
    return data


class _NoAliases(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def to_yaml(spec: dict[str, Any]) -> str:
    """Plain YAML (no anchors: the loader allows few aliases, as a hand-written spec needs few)."""
    return yaml.dump(spec, Dumper=_NoAliases, sort_keys=False, width=200)
