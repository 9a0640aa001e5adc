"""The topology maths on random layouts: every NIC on exactly one leaf port, and the figures follow from links."""

from __future__ import annotations

import copy
from typing import Any

import yaml
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from components.spec import parse_spec
from components.spec.topology import plan_topology
from tests.conftest import _DEV, problems_of

SPEEDS = [100, 200, 400, 800]


@st.composite
def layouts(draw) -> dict[str, Any]:
    """A spec with R racks of H hosts, N rails, leaves either per rack (all rails) or per rail (all racks),
    S spines each leaf reaches with L links; ports sized to fit."""
    racks, hosts, rails = draw(st.integers(1, 3)), draw(st.integers(1, 6)), draw(st.integers(1, 4))
    spines, links = draw(st.integers(0, 2)), draw(st.integers(1, 4))
    per_rail = draw(st.booleans())
    nic_speed = draw(st.sampled_from(SPEEDS))
    port_speed = draw(st.sampled_from([s for s in SPEEDS if s >= nic_speed]))     # a faster NIC is refused
    data = copy.deepcopy(_DEV)
    data["sites"][0]["racks"] = [{"name": f"r{r}", "pdu_capacity_kw": 200} for r in range(racks)]
    data["node_pools"][0]["hosts"] = [{"hostname": f"h{r}-{i}", "address": f"10.1.{r}.{i + 10}", "rack": f"r{r}"}
                                      for r in range(racks) for i in range(hosts)]
    data["node_pools"][0]["nics"] = [{"rail": n, "device": f"mlx5_{n}", "interface": f"ens{n}np0",
                                      "speed_gbps": nic_speed} for n in range(rails)]
    data["kubernetes"]["network_operator"] = {"rail_subnets": [f"10.{200 + n}.0.0/16" for n in range(rails)]}
    uplinks = [f"spine-{s}" for s in range(spines)]
    if per_rail:
        leaves = [{"name": f"leaf-rail{n}", "rails": [n], "down": racks * hosts} for n in range(rails)]
    else:
        leaves = [{"name": f"leaf-{r}", "racks": [f"r{r}"], "down": hosts * rails} for r in range(racks)]
    switches = [{"name": leaf.pop("name"), "role": "leaf", "vendor": "cumulus", "address": f"10.9.0.{i + 10}",
                 "ports": leaf.pop("down") + spines * links + draw(st.integers(0, 3)), "port_speed_gbps": port_speed,
                 "uplinks": uplinks, "links_per_uplink": links, **leaf} for i, leaf in enumerate(leaves)]
    switches += [{"name": f"spine-{s}", "role": "spine", "vendor": "cumulus", "address": f"10.9.1.{s + 10}",
                  "ports": 512, "port_speed_gbps": port_speed} for s in range(spines)]
    data["fabric"]["switches"] = switches
    data["tenants"] = []
    data["storage"] = {"kind": "none"}       # the storage server's rack is gone with the layout
    return data


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts())
def test_every_nic_gets_one_distinct_port_on_a_leaf_that_serves_it(data):
    spec = parse_spec(yaml.safe_dump(data))
    topology, problems = plan_topology(spec)
    assert problems == []
    pool = spec.node_pools[0]
    assert len(topology.links) == len(pool.hosts) * len(pool.nics)
    assert {(link.host, link.rail) for link in topology.links} == {(h.hostname, n.rail) for h in pool.hosts
                                                                   for n in pool.nics}
    leaves = {s.name: s for s in spec.fabric.switches}
    racks = {h.hostname: h.rack for h in pool.hosts}
    seen = set()
    for link in topology.links:
        leaf = leaves[link.leaf]
        assert (not leaf.rails or link.rail in leaf.rails) and (not leaf.racks or racks[link.host] in leaf.racks)
        assert 1 <= link.port <= leaf.ports - len(leaf.uplinks) * leaf.links_per_uplink   # uplinks take the top
        assert (link.leaf, link.port) not in seen
        seen.add((link.leaf, link.port))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts())
def test_oversubscription_rail_optimization_and_bisection_follow_from_the_links(data):
    spec = parse_spec(yaml.safe_dump(data))
    topology, _ = plan_topology(spec)
    switches = {s.name: s for s in spec.fabric.switches}
    total = 0
    for name, leaf in topology.leaves.items():
        mine = [link for link in topology.links if link.leaf == name]
        sw = switches[name]
        up = len(sw.uplinks) * sw.links_per_uplink * sw.port_speed_gbps
        assert leaf.down_gbps == sum(link.speed_gbps for link in mine) and leaf.up_gbps == up
        assert leaf.oversubscription == (round(leaf.down_gbps / up, 3) if up else None)
        total += leaf.down_gbps
    rails = {link.rail for link in topology.links}
    per_rail_leaves = all(len({link.rail for link in topology.links if link.leaf == n}) == 1 for n in topology.leaves)
    assert topology.rail_optimized == (len(rails) > 1 and per_rail_leaves)
    assert 0 < topology.bisection_gbps <= total / 2
    if all(leaf.up_gbps == 0 or leaf.up_gbps >= leaf.down_gbps for leaf in topology.leaves.values()):
        assert topology.bisection_gbps == total / 2          # non-blocking: half the hosts talk to the other half


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts(), st.integers(1, 5))
def test_a_leaf_short_of_ports_is_reported_on_its_ports_field(data, short_by):
    leaf = data["fabric"]["switches"][0]
    load = plan_topology(parse_spec(yaml.safe_dump(data)))[0].leaves[leaf["name"]]
    assume(load.downlinks + load.uplinks - short_by >= 1)
    leaf["ports"] = load.downlinks + load.uplinks - short_by
    found = problems_of(data)
    assert any(f"fabric.switches[0].ports: leaf {leaf['name']} has {load.downlinks} downlinks and {load.uplinks} "
               f"uplinks but only {leaf['ports']} ports" in p for p in found), found


def test_adding_a_host_keeps_every_existing_port(dev_data):
    before = {(link.host, link.rail): link.port for link in plan_topology(parse_spec(yaml.safe_dump(dev_data)))[0].links}
    dev_data["node_pools"][0]["hosts"].append({"hostname": "gpu-dev-03", "address": "10.10.0.13", "rack": "r01"})
    after = {(link.host, link.rail): link.port
             for link in plan_topology(parse_spec(yaml.safe_dump(dev_data)))[0].links}
    assert {k: v for k, v in after.items() if k in before} == before and len(after) == len(before) + 2


def test_explicit_leaf_ports_are_kept_and_automatic_ones_avoid_them(dev_data):
    dev_data["node_pools"][0]["hosts"][1]["leaf_port"] = 1
    links = {(link.host, link.rail): link.port for link in plan_topology(parse_spec(yaml.safe_dump(dev_data)))[0].links}
    assert links == {("gpu-dev-02", 0): 1, ("gpu-dev-02", 1): 2, ("gpu-dev-01", 0): 3, ("gpu-dev-01", 1): 4}


def test_a_spine_short_of_ports_is_reported(dev_data):
    dev_data["fabric"]["switches"] = [
        {"name": "leaf-a", "role": "leaf", "vendor": "cumulus", "address": "10.10.0.2", "ports": 32,
         "port_speed_gbps": 400, "uplinks": ["spine-a"], "links_per_uplink": 8},
        {"name": "spine-a", "role": "spine", "vendor": "cumulus", "address": "10.10.0.3", "ports": 4,
         "port_speed_gbps": 400}]
    assert any("fabric.switches[1].ports: spine spine-a takes 8 uplinks from its leaves but has 4 ports" in p
               for p in problems_of(dev_data))
