"""The benchmark's own pieces: its synthetic clusters are valid specs, and its graph depth is right."""

from __future__ import annotations

import sys

import pytest

from components.spec import parse_spec
from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from bench import graph_depth  # noqa: E402
from specs import add_node, synthetic, to_yaml  # noqa: E402


@pytest.mark.parametrize("nodes", [16, 128])
def test_the_synthetic_cluster_and_its_grown_copy_are_valid(nodes):
    spec = parse_spec(to_yaml(synthetic(nodes)))
    assert (len(spec.node_pools[0].hosts), spec.gpus, len(spec.tenants)) == (nodes, nodes * 8, max(1, nodes // 16))
    grown = parse_spec(to_yaml(add_node(synthetic(nodes))))
    assert len(grown.node_pools[0].hosts) == nodes + 1


def test_graph_depth_follows_dependencies_through_components():
    r = lambda urn, custom=True, parent=None, deps=(), props=None: {  # noqa: E731
        "urn": urn, "custom": custom, "parent": parent, "dependsOn": list(deps), "propertyDependencies": props or {}}
    resources = [r("a"), r("comp", custom=False), r("b", parent="comp", deps=["a"]),
                 r("c", parent="comp", deps=["a"]), r("d", deps=["comp"]), r("e", props={"x": ["d"]}), r("f")]
    assert graph_depth(resources) == 4          # a -> b (or c) -> d (waits for the whole component) -> e
