"""Derived views of the spec and the warnings the plan shows."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from components.k8s.platform.kueue import render_kueue_objects
from components.k8s.tenancy.tenant import tenancy_of
from components.nodes.node_pool import managed_taint_keys, node_taints
from components.spec import parse_spec
from components.spec.hardware import GPU_MODELS
from components.spec.tenants import Tenant, tenancy_problems
from tests.conftest import _DEV, problems_of


def test_cpu_and_memory_follow_the_guaranteed_gpus(dev_spec):
    team_a = dev_spec.tenants[0]          # 10 of 8-GPU hosts with 112 cores and 2048 GiB
    assert dev_spec.tenant_cpu_cores(team_a) == 10 * 112 // 8
    assert dev_spec.tenant_memory_gib(team_a) == 10 * 2048 // 8


def test_explicit_cpu_quota_wins(dev_data):
    dev_data["tenants"][0]["cpu_cores"] = 16
    spec = parse_spec(yaml.safe_dump(dev_data))
    assert spec.tenant_cpu_cores(spec.tenants[0]) == 16


def test_an_explicit_cpu_quota_stays_when_no_gpu_is_guaranteed(dev_data):
    """A tenant that only borrows GPUs but asks for CPU and memory of its own keeps them."""
    dev_data["tenants"][1]["gpu_quota"] = {"h100": {"nominal": 0, "borrowing_limit": 8}}
    dev_data["tenants"][1].update(cpu_cores=16, memory_gib=256)
    dev_data["tenants"][1]["storage"]["quota_gib"] = 4096
    spec = parse_spec(yaml.safe_dump(dev_data))
    assert spec.tenant_cpu_cores(spec.tenants[1]) == 16 and spec.tenant_memory_gib(spec.tenants[1]) == 256


def new_warnings(data) -> list[str]:
    """Warnings a change adds to the dev spec's own (dev's BeeGFS runs without quotas, which it says)."""
    before = parse_spec(yaml.safe_dump(_DEV)).warnings()
    return [w for w in parse_spec(yaml.safe_dump(data)).warnings() if w not in before]


def test_warns_about_unpinned_host_keys(dev_data):
    del dev_data["node_pools"][0]["hosts"][1]["host_key"]
    assert new_warnings(dev_data) == ["1 host(s) have no host_key, so SSH does not verify them: gpu-dev-02"]


def test_warns_about_a_tenant_without_groups(dev_data):
    dev_data["tenants"][1]["groups"] = {}
    assert new_warnings(dev_data) == ["tenant team-b binds no identity group; only cluster admins can use it"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=20), min_size=1, max_size=5))
def test_guaranteed_gpus_fit_the_pool_exactly_when_their_sum_does(nominals):
    data = yaml.safe_load(yaml.safe_dump(_DEV))
    data["tenants"] = [{"name": f"t{i}", "gpu_quota": {"h100": n}} for i, n in enumerate(nominals)]
    found = problems_of(data)
    if sum(nominals) <= 16:
        assert found == []
    else:
        assert len(found) == 1 and f"tenants are guaranteed {sum(nominals)} h100 GPUs" in found[0]


@pytest.mark.parametrize("value", [0, 4097, "0%", "101%", "10", "ten percent", 2.5, True, None])
def test_a_rollout_takes_a_count_of_hosts_or_a_percentage_and_says_which_when_neither(dev_data, value):
    dev_data["node_pools"][0]["rollout"] = {"max_unavailable": value, "drain_timeout_s": 0}
    first, second = problems_of(dev_data)
    assert first.endswith(f"node_pools[0].rollout.max_unavailable: {value!r} is neither a count of hosts from 1 to "
                          "4096 nor a percentage from 1% to 100% (e.g. 2 or '10%')")
    assert "node_pools[0].rollout.drain_timeout_s: Input should be greater than or equal to 1 (got 0)" in second


@pytest.mark.parametrize("value", [60, 119])
def test_a_drain_timeout_that_cannot_cover_one_eviction_is_refused_saying_what_one_takes(dev_data, value):
    """60 s was the schema's minimum: an evicted pod kept by a Job's tracking finalizer holds a drain for its
    30 s grace and 60 s more, so such a drain always failed, blaming a disruption budget."""
    dev_data["node_pools"][0]["rollout"] = {"drain_timeout_s": value}
    (problem,) = problems_of(dev_data)
    assert problem.endswith(f"node_pools[0].rollout.drain_timeout_s: {value} s cannot cover one eviction: a pod's "
                            "30 s grace period (Kubernetes' default), then up to 60 s while a finalizer keeps it (a "
                            "Job's tracking one), and the drain's own requests; give at least 120"), problem
    dev_data["node_pools"][0]["rollout"] = {"drain_timeout_s": 120}
    assert problems_of(dev_data) == []


@pytest.mark.parametrize("rollout, words", [
    ({"failure_budget_hosts": -1}, "node_pools[0].rollout.failure_budget_hosts: Input should be greater than or "
                                   "equal to 0 (got -1)"),
    ({"failure_budget_hosts": "one"}, "node_pools[0].rollout.failure_budget_hosts: "),
    ({"failure_budget_hosts": 1.5}, "node_pools[0].rollout.failure_budget_hosts: "),
    ({"drain_timeout_s": 604801}, "node_pools[0].rollout.drain_timeout_s: Input should be less than or equal to "
                                  "604800 (got 604801)"),
])
def test_a_bad_failure_budget_or_a_drain_over_a_week_is_refused_naming_the_field(dev_data, rollout, words):
    dev_data["node_pools"][0]["rollout"] = rollout
    (problem,) = problems_of(dev_data)
    assert words in problem, problem


@pytest.mark.parametrize("value", [1, 4096, "1%", "100%", "25%"])
def test_a_rollout_count_or_percentage_in_range_is_taken(dev_data, value):
    dev_data["node_pools"][0]["rollout"] = {"max_unavailable": value}
    assert problems_of(dev_data) == []


def test_a_data_nic_cannot_be_the_control_interface(dev_data):
    dev_data["fabric"]["control_interface"] = "ens2f0np0"
    [problem] = problems_of(dev_data)
    assert "node_pools[0].nics[1].interface: ens2f0np0 is fabric.control_interface and also the rail 1 data NIC " \
           "of node pool h100" in problem and "set fabric.control_interface to the management interface" in problem


def test_a_rail_subnet_holding_hosts_servers_or_switches_addresses_is_refused_naming_them(dev_data):
    dev_data["kubernetes"]["network_operator"] = {"rail_subnets": ["10.10.0.0/24", "10.202.0.0/16"]}
    [problem] = problems_of(dev_data)
    assert problem.split(": ", 1)[1] == (
        "kubernetes.network_operator.rail_subnets[0]: 10.10.0.0/24 (rail 0's pod addresses) holds 4 address(es) "
        "already in use: host gpu-dev-01's SSH address 10.10.0.11, host gpu-dev-02's SSH address 10.10.0.12, "
        "storage server stor-dev-01's address 10.10.0.31, switch leaf-dev-01's address 10.10.0.2; pods would be "
        "given them, and SSH would run over a data NIC: move the rail subnet to a range no host uses (or, if that "
        "is a data NIC's address, give the management address instead)")


@pytest.mark.parametrize("subnets, message", [
    (["224.1.0.0/16", "10.202.0.0/16"], "rail_subnets[0]: 224.1.0.0/16 is a multicast range, which no pod can be "
                                        "given; use a private unicast range (e.g. 10.201.0.0/16)"),
    (["10.201.0.0/16", "10.201.128.0/17"], "rail_subnets[1]: 10.201.128.0/17 overlaps rail_subnets[0] "
                                           "10.201.0.0/16: two rails would hand out the same pod addresses; give "
                                           "each rail its own range"),
    (["10.201.0.0/28", "10.202.0.0/16"], "rail_subnets[0]: 10.201.0.0/28 holds 14 pod addresses but rail 0's 2 "
                                         "node(s) take a block of 32 (ips_per_node) each, 64 in all; use a larger "
                                         "range or fewer ips_per_node"),
])
def test_rail_subnets_are_unicast_apart_and_large_enough(dev_data, subnets, message):
    dev_data["kubernetes"]["network_operator"] = {"rail_subnets": subnets}
    [problem] = problems_of(dev_data)
    assert problem.split(": ", 1)[1] == "kubernetes.network_operator." + message


@pytest.mark.parametrize("model, count, product, nvswitch", [
    ("A100-SXM4-40GB", 8, "NVIDIA-A100-SXM4-40GB", True), ("A100-PCIE-80GB", 4, "NVIDIA-A100-80GB-PCIe", False),
    ("A100-PCIE-40GB", 2, "NVIDIA-A100-PCIE-40GB", False), ("H100-PCIE-80GB", 8, "NVIDIA-H100-PCIe", False),
    ("H100-NVL-94GB", 4, "NVIDIA-H100-NVL", False), ("H200-SXM5-141GB", 8, "NVIDIA-H200", True),
    ("H200-NVL-141GB", 8, "NVIDIA-H200-NVL", False), ("B200-SXM6-180GB", 8, "NVIDIA-B200", True),
    ("L4-24GB", 8, "NVIDIA-L4", False), ("GH200-96GB", 4, "NVIDIA-GH200-480GB", False),
])
def test_customer_gpu_models_plan_with_their_product_label_and_board(dev_data, model, count, product, nvswitch):
    """The label host preparation checks against nvidia-smi, and Fabric Manager only on NVSwitch boards."""
    dev_data["node_pools"][0]["gpu"] = {"model": model, "count": count}
    dev_data["node_pools"][0]["tuning"]["kubelet_topology_policy"] = "none"
    dev_data["tenants"] = []
    pool = parse_spec(yaml.safe_dump(dev_data)).node_pools[0]
    assert pool.gpu.info.product == product and pool.gpu.nvswitch is nvswitch
    assert pool.gpu.power_w == GPU_MODELS[model].tdp_w


def test_a_gpu_count_no_board_has_is_refused(dev_data):
    dev_data["node_pools"][0]["gpu"] = {"model": "GH200-96GB", "count": 8}
    (msg,) = problems_of(dev_data)
    assert "node_pools[0].gpu.count: GH200-96GB hosts carry 1 or 2 or 4 GPUs, not 8" in msg


def test_warns_when_storage_shares_a_training_rail_with_nccl(dev_data):
    assert any("storage traffic of training pool(s) h100 (ens1f0np0) rides the rail-0 NIC" in w
               for w in parse_spec(yaml.safe_dump(dev_data)).warnings())
    dev_data["storage"]["client_interface"] = "ens9f0"
    assert not any("rides the rail-0 NIC" in w for w in parse_spec(yaml.safe_dump(dev_data)).warnings())


def test_rack_power_counts_hosts_storage_servers_and_switches(dev_spec):
    r01 = dev_spec.rack_power()["r01"]
    assert r01.listing() == "2 x 10.2 kW (h100 host) + 1 x 1.5 kW (leaf switch) + 1 x 1.5 kW (storage server)"
    assert r01.peak_kw == pytest.approx(23.4) and r01.unknown == () and r01.redundancy == "a+b"
    assert r01.verdict(34 * 0.8) == "ok" and r01.verdict(20) == "over budget"


def test_a_dgx_host_model_gives_the_base_power_the_spec_omits(dev_data):
    del dev_data["node_pools"][0]["host_base_power_w"]
    dev_data["node_pools"][0]["host_model"] = "dgx-h100"
    assert parse_spec(yaml.safe_dump(dev_data)).rack_power()["r01"].peak_kw == pytest.approx(23.4)


def test_a_rack_with_a_device_of_unknown_power_is_never_called_ok(dev_data):
    del dev_data["node_pools"][0]["host_base_power_w"]
    del dev_data["storage"]["servers"][0]["power_w"]
    r01 = parse_spec(yaml.safe_dump(dev_data)).rack_power()["r01"]
    assert r01.peak_kw == pytest.approx(1.5)                      # a floor: the leaf switch alone is known
    assert r01.unknown == ("h100 host", "storage server")
    assert r01.listing() == "2 x ? kW (h100 host) + 1 x 1.5 kW (leaf switch) + 1 x ? kW (storage server)"
    assert r01.verdict(100) == "unknown: no power figure for h100 host, storage server"
    assert new_warnings(dev_data) == [
        "rack power of r01 (h100 host, storage server) cannot be called within budget: give each pool's "
        "host_base_power_w (or a DGX host_model), storage servers' and switches' power_w and rack, and each rack's "
        "pdu_redundancy"]


def test_a_rack_whose_pdu_redundancy_is_not_stated_is_unknown(dev_data):
    del dev_data["sites"][0]["racks"][0]["pdu_redundancy"]
    assert parse_spec(yaml.safe_dump(dev_data)).rack_power()["r01"].verdict(100) == "unknown: pdu_redundancy not stated"
    assert any(w.startswith("rack power of r01 (pdu_redundancy)") for w in new_warnings(dev_data))


def test_warns_about_a_switch_in_no_rack(dev_data):
    del dev_data["fabric"]["switches"][0]["rack"]
    assert new_warnings(dev_data) == [
        f"switch(es) {dev_data['fabric']['switches'][0]['name']} have no rack, so no rack's power counts them"]


def _dedicate(data, owner="team-a"):
    data["node_pools"][0]["dedicated_to"] = owner
    return data


def test_a_dedicated_pool_taints_its_nodes_and_only_its_tenants_flavor_tolerates_it(dev_data):
    for t in dev_data["tenants"][1:]:
        t["gpu_quota"].pop("h100")
    spec = parse_spec(yaml.safe_dump(_dedicate(dev_data)))
    pool = spec.node_pools[0]
    own = {"key": "gpucluster.io/tenant", "value": "team-a", "effect": "NoSchedule"}
    assert own in node_taints(pool, (True, "")) and "gpucluster.io/tenant" in managed_taint_keys(pool)
    flavor = next(m.obj for m in render_kueue_objects(spec) if m.obj["kind"] == "ResourceFlavor")
    assert {**own, "operator": "Equal"} in flavor["spec"]["tolerations"]
    assert spec.pool_capacities()["h100"].dedicated_to == "team-a"


def test_a_dedicated_pool_names_a_tenant_and_no_other_tenant_has_quota_on_it(dev_data):
    problems = problems_of(_dedicate(dev_data, "team-z"))
    assert any("node_pools[0].dedicated_to" in p and "no tenant named 'team-z'" in p for p in problems), problems
    problems = problems_of(_dedicate(dev_data))
    assert any("tenants[1].gpu_quota.h100" in p and "dedicated to tenant 'team-a'" in p for p in problems), problems


def test_the_dedicated_taint_key_is_the_platforms(dev_data):
    dev_data["node_pools"][0]["taints"] = [{"key": "gpucluster.io/tenant", "value": "x"}]
    assert any("taints[0].key" in p and "use dedicated_to" in p for p in problems_of(dev_data))


def test_a_tenants_project_gets_no_quota_on_a_platform_tenants_dedicated_pool(dev_data):
    for t in dev_data["tenants"][1:]:
        t["gpu_quota"].pop("h100")
    tenancy = tenancy_of(parse_spec(yaml.safe_dump(_dedicate(dev_data))))
    newcomer = Tenant(name="team-x", gpu_quota={"h100": 2})
    assert [p.message for p in tenancy_problems(tenancy, [newcomer])] == [
        "node pool 'h100' of cluster dev is dedicated to the platform's tenant 'team-a'; give this tenant quota on "
        "a shared pool"]
