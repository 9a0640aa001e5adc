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
    # a rollout's drain waits for the partition's longest job (Slinky's disruption budget)
    pool["rollout"] = {**pool.get("rollout", {}), "drain_timeout_s": 12 * 3600 + 300}
    data["kubernetes"]["slurm"] = {"pools": [SLURM_POOL], "partition_max_time_h": 12}
    # team-a's Slurm account: a share of 4 GPUs, at most 8; team-b's: 2, no limit
    data["tenants"][0]["gpu_quota"][SLURM_POOL] = {"nominal": 4, "borrowing_limit": 4}
    data["tenants"][1]["gpu_quota"][SLURM_POOL] = 2


H200_POOL = "h200-slurm"


def with_h200_pool(data: dict[str, Any]) -> None:
    """After with_slurm_pool: a one-host H200 pool for Slurm too (another GPU model, so another GRES type), in
    the new rack; team-b holds 2 of its GPUs and may borrow 2, team-a none, and a new team-c only these (2, no
    limit) and none of the H100 pools."""
    pool = copy.deepcopy(data["node_pools"][0])
    pool.update(name=H200_POOL, gpu={"model": "H200-SXM5-141GB", "count": 8},
                rollout={**pool.get("rollout", {}), "drain_timeout_s": 12 * 3600 + 300},
                hosts=[{"hostname": "gpu-h200-01.lab1.example", "address": "10.10.0.30", "rack": "r02"}])
    data["node_pools"].append(pool)
    data["kubernetes"]["slurm"]["pools"].append(H200_POOL)
    data["tenants"][1]["gpu_quota"][H200_POOL] = {"nominal": 2, "borrowing_limit": 2}
    data["tenants"].append({"name": "team-c", "groups": {"edit": ["oidc:team-c"]}, "gpu_quota": {H200_POOL: 2}})
