"""The isolated example (examples/isolated-tenants.yaml), cut to the rails a test's hosts have."""

from __future__ import annotations

from typing import Any, Callable

import yaml

from components.spec import ClusterSpec, parse_spec
from tests.conftest import ROOT

EXAMPLE = ROOT / "examples" / "isolated-tenants.yaml"


def isolated_example(rails: int = 8, change: Callable[[dict[str, Any]], None] = lambda d: None) -> ClusterSpec:
    """The example with `rails` rails per host (their leaves only), changed by `change`."""
    data = yaml.safe_load(EXAMPLE.read_text())
    for pool in data["node_pools"]:
        pool["nics"] = pool["nics"][:rails]
    data["fabric"]["switches"] = [s for s in data["fabric"]["switches"] if s.get("rails", [0])[0] < rails]
    change(data)
    return parse_spec(yaml.safe_dump(data))


def hand_b_to_team_a(data: dict[str, Any]) -> None:
    """Day 2: team-b's dedicated pool handed to team-a, with its quota."""
    pools = {p["name"]: p for p in data["node_pools"]}
    pools["h100-b"]["dedicated_to"] = "team-a"
    tenants = {t["name"]: t for t in data["tenants"]}
    tenants["team-a"]["gpu_quota"]["h100-b"] = tenants["team-b"]["gpu_quota"].pop("h100-b")
