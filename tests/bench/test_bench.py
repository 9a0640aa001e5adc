"""The benchmark's own pieces: its synthetic clusters are valid specs, and its graph depth is right."""

from __future__ import annotations

import sys

import pytest

from components.spec import parse_spec
from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from bench import graph_depth  # noqa: E402
from specs import add_node, split, synthetic, to_yaml  # noqa: E402


@pytest.mark.parametrize("nodes", [16, 128])
def test_the_synthetic_cluster_and_its_grown_copy_are_valid(nodes):
    spec = parse_spec(to_yaml(synthetic(nodes)))
    assert (len(spec.node_pools[0].hosts), spec.gpus, len(spec.tenants)) == (nodes, nodes * 8, max(1, nodes // 16))
    grown = parse_spec(to_yaml(add_node(synthetic(nodes))))
    assert len(grown.node_pools[0].hosts) == nodes + 1


def test_the_split_cluster_is_valid_and_its_platform_holds_no_gpu_host():
    spec = parse_spec(to_yaml(split(synthetic(128), 4)))
    assert [len(p.hosts) for p in spec.node_pools] == [32] * 4 and spec.gpus == 128 * 8
    assert spec.pools_of("platform") == [] and [p.name for p in spec.pools_of("s03")] == ["h100-s03"]
    assert set(spec.fabric.subnet_managers) <= {s.hostname for s in spec.storage.servers}


def test_graph_depth_follows_dependencies_through_components():
    r = lambda urn, custom=True, parent=None, deps=(), props=None: {  # noqa: E731
        "urn": urn, "custom": custom, "parent": parent, "dependsOn": list(deps), "propertyDependencies": props or {}}
    resources = [r("a"), r("comp", custom=False), r("b", parent="comp", deps=["a"]),
                 r("c", parent="comp", deps=["a"]), r("d", deps=["comp"]), r("e", props={"x": ["d"]}), r("f")]
    assert graph_depth(resources) == 4          # a -> b (or c) -> d (waits for the whole component) -> e


def row(nodes, **over):
    base = {"nodes": nodes, "time_x_floor": 1.1, "memory_x_floor": 1.1, "resources_per_added_node": 4, "reads_per_added_node": 1,
            "commands_per_host": 3, "plan_s": nodes / 10, "graph_depth": 5, "validate_s": 1.0,
            "blast_radius": {"add a node": {"resources": [], "components": [f"bench{nodes}-h100"]},
                             "tenant quota": {"resources": [f"bench{nodes}-team-0000-cq"],
                                              "components": [f"bench{nodes}-team-0000"]},
                             "GPU Operator bump": {"resources": [f"bench{nodes}-k8s-gpu-operator"],
                                                   "components": [f"bench{nodes}-k8s"]}}}
    return {**base, **over}


def test_verdicts_pass_only_when_every_size_meets_every_target():
    from bench import verdicts
    assert all(met for _, met, _ in verdicts([row(16), row(128), row(2048)]))
    slow = {t: met for t, met, _ in verdicts([row(16), row(2048, time_x_floor=1.3, plan_s=1000)])}
    assert not slow["plan time <= 1.25x the floor"] and not slow["linear: 2,048 nodes <= 140x the time of 16"]
    wide = row(128)
    wide["blast_radius"]["tenant quota"]["components"].append("bench128")
    assert not dict((t, m) for t, m, _ in verdicts([wide]))["blast radius exact"]


def test_rollout_retirement_and_the_scripts_copy_may_add_their_resources_and_ssh_sessions_per_host_and_no_more():
    from bench import verdicts
    ok = dict((t, m) for t, m, _ in verdicts([row(16, resources_per_added_node=12, commands_per_host=6)]))
    assert ok["<= 12 resources per GPU node"] and ok["<= 6 SSH sessions per host"]
    over = dict((t, m) for t, m, _ in verdicts([row(16, resources_per_added_node=13, commands_per_host=7)]))
    assert not over["<= 12 resources per GPU node"] and not over["<= 6 SSH sessions per host"]


def test_the_apply_benchmarks_critical_path_is_the_longest_chain_of_modelled_commands():
    from apply import MODEL, critical_path_s, modelled_s
    seconds = {suffix: s for suffix, s, _ in MODEL}
    r = lambda name, kind="command:remote:Command", deps=(): {  # noqa: E731
        "urn": f"urn:pulumi:bench::gpucluster::{kind}::{name}", "type": kind,
        "dependencies": [f"urn:pulumi:bench::gpucluster::command:remote:Command::{d}" for d in deps]}
    state = [r("c-h1-leave"), r("c-h1-prepare", deps=["c-h1-leave"]), r("c-h1-burn-in", deps=["c-h1-prepare"]),
             r("c-h2-prepare"), r("c-storage-h2", deps=["c-h2-prepare"]), r("ns", kind="kubernetes:core/v1:Namespace")]
    assert modelled_s("c-storage-oss-001") > modelled_s("c-storage-gpu-00001") > 0
    assert critical_path_s(state) == seconds["-leave"] + seconds["-prepare"] + seconds["-burn-in"]


def test_the_apply_benchmark_counts_a_hosts_own_resources_by_role_and_by_what_they_store():
    """A host's own resources are those named after it, whatever their place in the name; gpu-00001 is not
    gpu-000010's, nor a name that merely starts the same."""
    from apply import per_host_kib
    r = lambda name, **fields: {"urn": f"urn:pulumi:bench::gpucluster::t::{name}", **fields}  # noqa: E731
    kib = "x" * 1022                     # json.dumps: 1,024 bytes with its quotes
    state = [r("b16-h100-gpu-00001-prepare", inputs=kib, outputs=kib, stackTrace=kib),
             r("b16-storage-gpu-00001", inputs=kib), r("b16-k8s-gpu-check-gpu-00001", inputs=kib),
             r("b16-h100-gpu-000010-prepare", inputs=kib), r("b16-storage-mds-01", inputs=kib),
             r("b16-h100-gpu-00002-prepare", inputs=kib)]
    got = per_host_kib(state, ["gpu-00001", "gpu-00002"])
    assert list(got["by_role"])[0] == "h100-<host>-prepare"           # the largest first
    assert set(got["by_role"]) == {"h100-<host>-prepare", "storage-<host>", "k8s-gpu-check-<host>"}
    assert got["by_role"]["h100-<host>-prepare"] > 2 and got["by_role"]["storage-<host>"] < 1
    assert (got["by_part"]["inputs"], got["by_part"]["outputs"], got["by_part"]["stackTrace"]) == (2.0, 0.5, 0.5)
    assert 0 < got["by_part"]["rest"] < 0.5             # the URNs, here
