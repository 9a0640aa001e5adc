"""Spec variants the stack tests share: the dev stack changed one area at a time."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import yaml

from components.spec import ClusterSpec, parse_spec


@pytest.fixture
def make_spec(dev_data) -> Callable[..., ClusterSpec]:
    """Build a spec from the dev stack after `edit(data)` changes it."""
    def build(edit: Callable[[dict[str, Any]], None] = lambda d: None) -> ClusterSpec:
        edit(dev_data)
        return parse_spec(yaml.safe_dump(dev_data))
    return build


def infiniband(data: dict[str, Any]) -> None:
    data["fabric"] = {"kind": "infiniband", "infiniband": {"subnet_managers": ["gpu-dev-01", "gpu-dev-02"]}}
    data["node_pools"][0]["nics"] = [{"rail": r, "device": f"mlx5_{r}", "interface": f"ibp{r}s0", "speed_gbps": 400}
                                     for r in range(2)]
    data["kubernetes"]["network_operator"] = {"rail_subnets": ["10.201.0.0/16", "10.202.0.0/16"]}
