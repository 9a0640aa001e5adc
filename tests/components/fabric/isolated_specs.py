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
    networks = data["kubernetes"]["network_operator"]
    networks["rail_subnets"] = networks["rail_subnets"][:rails]
    change(data)
    return parse_spec(yaml.safe_dump(data))


def hand_b_to_team_a(data: dict[str, Any]) -> None:
    """Day 2: team-b's dedicated pool handed to team-a, with its quota."""
    pools = {p["name"]: p for p in data["node_pools"]}
    pools["h100-b"]["dedicated_to"] = "team-a"
    tenants = {t["name"]: t for t in data["tenants"]}
    tenants["team-a"]["gpu_quota"]["h100-b"] = tenants["team-b"]["gpu_quota"].pop("h100-b")


def roce_isolated(rails: int = 2, change: Callable[[dict[str, Any]], None] = lambda d: None) -> ClusterSpec:
    """The isolated example on a RoCE fabric instead: Cumulus leaves (one per rail) and spines this library
    configures, dedicated pools isolated in their tenants' VLANs, no filesystem on the rails."""
    return parse_spec(yaml.safe_dump(roce_isolated_data(rails, change)))


def roce_isolated_data(rails: int = 2, change: Callable[[dict[str, Any]], None] = lambda d: None) -> dict[str, Any]:
    """roce_isolated's spec, as the YAML document's data."""
    data = yaml.safe_load(EXAMPLE.read_text())
    for pool in data["node_pools"]:
        pool["nics"] = [{**n, "interface": f"ens{n['rail'] + 1}np0"} for n in pool["nics"][:rails]]
    fabric = data["fabric"]
    fabric.pop("infiniband")
    fabric.update(kind="rocev2", mtu_bytes=9000, roce={"isolate_dedicated_pools": True})
    for s in fabric["switches"]:
        s.pop("managed", None)
        s["vendor"] = "cumulus"
    fabric["switches"] = [s for s in fabric["switches"] if s.get("rails", [0])[0] < rails]
    data["storage"] = {"kind": "none"}
    data["kubernetes"]["network_operator"]["rail_subnets"] = [f"10.{200 + r}.0.0/16" for r in range(rails)]
    for t in data["tenants"]:
        t.get("storage", {}).pop("filesystem_gib", None)
        t.pop("infiniband_pkey", None)
    change(data)
    return data
