"""Specs with Slurm pools, shared by the Slurm component's tests and its daemon tests."""

from __future__ import annotations

import copy
from typing import Any

SLURM_POOL = "h100-slurm"


def with_slurm_pool(data: dict[str, Any], hosts: int = 2, two_leaves: bool = True) -> None:
    """The dev spec plus a second H100 pool for Slurm, its hosts alternating between a new rack and dev's; with
    `two_leaves` the new rack has its own leaf and both leaves reach a spine, so the pool spans two leaves."""
    data["sites"][0]["racks"].append({"name": "r02", "pdu_capacity_kw": 34, "pdu_redundancy": "a+b"})
    pool = copy.deepcopy(data["node_pools"][0])
    pool["name"] = SLURM_POOL
    pool["hosts"] = [{"hostname": f"gpu-slurm-{i:02d}.lab1.example", "address": f"10.10.0.{20 + i}",
                      "rack": "r02" if i % 2 else "r01"}
                     for i in range(1, hosts + 1)]
    data["node_pools"].append(pool)
    if two_leaves:
        switches = data["fabric"]["switches"]
        switches[0].update(racks=["r01"], uplinks=["spine-dev-01"])
        switches.append({**copy.deepcopy(switches[0]), "name": "leaf-dev-02", "racks": ["r02"], "rack": "r02",
                         "address": "10.10.0.3"})
        switches.append({"name": "spine-dev-01", "role": "spine", "vendor": "cumulus", "address": "10.10.0.4",
                         "ports": 32, "port_speed_gbps": 400, "rack": "r02", "power_w": 1500})
    data["kubernetes"]["slurm"] = {"pools": [SLURM_POOL]}
    # team-a's Slurm account: a share of 4 GPUs, at most 8; team-b's: 2, no limit
    data["tenants"][0]["gpu_quota"][SLURM_POOL] = {"nominal": 4, "borrowing_limit": 4}
    data["tenants"][1]["gpu_quota"][SLURM_POOL] = 2
