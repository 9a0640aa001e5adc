"""Bad input: every invalid spec is rejected with its path, the bad value and the fix, all problems at once."""

from __future__ import annotations

import pytest

from components.spec import SpecError, load_spec, parse_spec
from tests.conftest import ROOT, problems_of


def one(data) -> str:
    found = problems_of(data)
    assert len(found) == 1, found
    return found[0]


def test_dev_stack_is_valid():
    spec = load_spec(ROOT / "stacks" / "dev.yaml")
    assert spec.gpus == 16 and [t.name for t in spec.tenants] == ["team-a", "team-b"]


def test_unknown_field_suggests_the_right_one(dev_data):
    dev_data["tenants"][0]["gpu_quot"] = dev_data["tenants"][0].pop("gpu_quota")
    msg = one(dev_data)
    assert "tenants[0].gpu_quot: unknown field 'gpu_quot'; did you mean 'gpu_quota'?" in msg


def test_duplicate_yaml_key_is_an_error_with_both_lines():
    text = (ROOT / "stacks" / "dev.yaml").read_text().replace("    gpu_quota:\n      h100: {nominal: 6",
                                                                "    gpu_quota: {}\n    gpu_quota:\n      h100: {nominal: 6")
    msg = one(text)
    assert "tenants[1].gpu_quota: key 'gpu_quota' appears twice" in msg and "first on line" in msg


def test_error_carries_the_line_of_the_field():
    text = (ROOT / "stacks" / "dev.yaml").read_text().replace("address: 10.10.0.12", "address: 10.10.0.312")
    line = next(i for i, l in enumerate(text.splitlines(), 1) if "10.10.0.312" in l)
    assert one(text).startswith(f"spec.yaml:{line}: node_pools[0].hosts[1].address: '10.10.0.312' is not an IPv4")


def test_rejects_duplicate_host_names(dev_data):
    dev_data["node_pools"][0]["hosts"][1]["hostname"] = "gpu-dev-01"
    assert "node_pools[0].hosts[1].hostname: host name 'gpu-dev-01' is already used at " \
           "node_pools[0].hosts[0].hostname" in one(dev_data)


def test_rejects_duplicate_addresses_across_hosts_and_switches(dev_data):
    dev_data["fabric"]["switches"][0]["address"] = "10.10.0.11"
    assert "fabric.switches[0].address: address '10.10.0.11' is already used at node_pools[0].hosts[0].address" \
        in one(dev_data)


def test_rejects_a_host_in_an_unknown_rack(dev_data):
    dev_data["node_pools"][0]["hosts"][0]["rack"] = "r99"
    assert "node_pools[0].hosts[0].rack: rack 'r99' is not defined in sites; known racks: r01" in one(dev_data)


def test_rejects_quota_for_a_missing_pool(dev_data):
    dev_data["tenants"][1]["gpu_quota"]["a100"] = 2
    assert "tenants[1].gpu_quota.a100: no node pool named 'a100'; GPU quotas are per node pool: h100" in one(dev_data)


def test_rejects_quotas_above_what_the_pools_hold(dev_data):
    dev_data["tenants"][0]["gpu_quota"]["h100"]["nominal"] = 12
    msg = one(dev_data)
    assert msg.split(": ", 1)[1].startswith("tenants[0].gpu_quota.h100: tenants are guaranteed 18 h100 GPUs in all "
                                            "(team-a: 12, team-b: 6) but node pool 'h100' holds 16 (2 hosts x 8)")


def test_rejects_a_tenant_in_a_system_namespace(dev_data):
    dev_data["tenants"][1]["namespace"] = "kube-system"
    assert "tenants[1].namespace: namespace 'kube-system' belongs to the platform" in one(dev_data)


def test_rejects_a_gpu_count_the_model_does_not_have(dev_data):
    dev_data["node_pools"][0]["gpu"]["count"] = 6
    assert "node_pools[0].gpu.count: H100-SXM5-80GB hosts carry 4 or 8 GPUs, not 6" in one(dev_data)


def test_rejects_a_host_key_that_is_not_an_authorized_keys_line(dev_data):
    dev_data["node_pools"][0]["hosts"][0]["host_key"] = "gpu-dev-01 ssh-ed25519 AAAAC3Nza"
    assert "node_pools[0].hosts[0].host_key: 'gpu-dev-01 ssh-ed25519 AAAAC3Nza' is not an authorized_keys line" \
        in one(dev_data)


def test_rejects_a_host_key_whose_data_is_another_type(dev_data):
    key = dev_data["node_pools"][0]["hosts"][0]["host_key"].split()[1]
    dev_data["node_pools"][0]["hosts"][0]["host_key"] = f"ssh-rsa {key}"
    assert "host key says ssh-rsa but its key data is a 'ssh-ed25519' key" in one(dev_data)


def test_rejects_pfc_on_more_than_the_roce_priority(dev_data):
    dev_data["fabric"]["roce"] = {"pfc_priorities": [3, 4]}
    assert "fabric.roce.pfc_priorities: pfc_priorities is [3, 4] but RoCE traffic uses priority 3" in one(dev_data)


def test_rejects_lending_more_than_nominal(dev_data):
    dev_data["tenants"][1]["gpu_quota"]["h100"]["lending_limit"] = 7
    assert "tenants[1].gpu_quota.h100.lending_limit: lending_limit 7 is above nominal 6" in one(dev_data)


def test_rejects_time_slicing_and_mig_on_one_pool(dev_data):
    dev_data["node_pools"][0]["sharing"] = {"time_slicing_replicas": 4, "mig_config": "all-1g.10gb"}
    assert "node_pools[0].sharing.mig_config: time_slicing_replicas and mig_config are both set" in one(dev_data)


def test_rejects_a_partition_key_out_of_range(dev_data):
    dev_data["fabric"] = {"kind": "infiniband", "infiniband": {"subnet_managers": ["gpu-dev-01"],
                                                               "partitions": [{"name": "p1", "pkey": 0x7FFF}]}}
    msg = one(dev_data)
    assert "fabric.infiniband.partitions[0].pkey: partition key 0x7fff is outside 0x0001-0x7ffe" in msg


def test_a_partition_key_with_the_membership_bit_gets_the_key_to_use(dev_data):
    dev_data["fabric"] = {"kind": "infiniband", "infiniband": {"subnet_managers": ["gpu-dev-01"],
                                                               "partitions": [{"name": "p1", "pkey": 0x8002}]}}
    assert "drop the full-membership bit 0x8000 (use 0x0002)" in one(dev_data)


def test_rejects_a_dscp_map_that_sends_roce_traffic_elsewhere(dev_data):
    dev_data["fabric"]["roce"] = {"dscp_map": {26: 2}}
    assert ("fabric.roce.dscp_map[26]: dscp_map sends DSCP 26 to priority 2, but RoCE traffic marked 26 must use "
            "priority 3") in one(dev_data)


def test_rejects_a_switch_mtu_below_the_hosts(dev_data):
    dev_data["fabric"]["switches"][0]["mtu_bytes"] = 1500
    assert "fabric.switches[0].mtu_bytes: switch leaf-dev-01 MTU 1500 is below the hosts' MTU 9000" in one(dev_data)


def test_rejects_a_leaf_with_more_downlinks_than_ports(dev_data):
    dev_data["fabric"]["switches"][0]["ports"] = 3
    assert "fabric.switches[0].ports: leaf leaf-dev-01 has 4 downlinks and 0 uplinks but only 3 ports" in one(dev_data)


def test_rejects_a_nic_that_reaches_no_leaf(dev_data):
    dev_data["fabric"]["switches"][0]["rails"] = [0]
    found = problems_of(dev_data)
    assert len(found) == 2 and "node_pools[0].hosts[0]: rail 1 of gpu-dev-01 (rack r01) reaches no leaf" in found[0]


def test_rejects_two_hosts_on_one_leaf_port(dev_data):
    for host in dev_data["node_pools"][0]["hosts"]:
        host["leaf_port"] = 5
    found = problems_of(dev_data)
    assert len(found) == 2       # both of gpu-dev-02's NICs (ports 5 and 6)
    assert "node_pools[0].hosts[1].leaf_port: leaf_port 5 of leaf-dev-01 is already cabled to gpu-dev-01" in found[0]


def test_rejects_a_managed_switch_without_a_backend(dev_data):
    dev_data["fabric"]["switches"][0]["vendor"] = "mlnx-os"
    assert "fabric.switches[0].vendor: no RoCE configuration backend for mlnx-os" in one(dev_data)


def test_rejects_a_subnet_manager_that_is_not_a_host(dev_data):
    dev_data["fabric"] = {"kind": "infiniband", "infiniband": {"subnet_managers": ["sm-01"]}}
    assert "fabric.infiniband.subnet_managers[0]: subnet manager host 'sm-01' is not a host" in one(dev_data)


def test_rejects_lustre_without_every_target_role(dev_data):
    dev_data["sites"][0]["racks"].append({"name": "r02", "pdu_capacity_kw": 20})
    dev_data["storage"] = {"kind": "lustre", "server_interface": "ib0", "lnet": "tcp", "servers": [{
        "hostname": "oss-01", "address": "10.10.1.1", "rack": "r02",
        "targets": [{"role": "ost", "device": "/dev/nvme0n1", "raid_level": "raid6", "size_tib": 50}]}]}
    assert "storage.servers: no mgs or mgs-mdt, mdt target: a lustre filesystem needs at least one of each" \
        in one(dev_data)


def test_reports_every_field_problem_at_once(dev_data):
    dev_data["name"] = "Dev"
    dev_data["node_pools"][0]["gpu"]["count"] = 6
    dev_data["tenants"][0]["gpu_quota"]["h100"]["nominal"] = -1
    found = problems_of(dev_data)
    assert [p.split(": ")[1] for p in found] == ["name", "node_pools[0].gpu.count", "tenants[0].gpu_quota.h100.nominal"]


def test_reports_every_cross_field_problem_at_once(dev_data):
    dev_data["node_pools"][0]["hosts"][1]["hostname"] = "gpu-dev-01"
    dev_data["node_pools"][0]["hosts"][0]["rack"] = "r99"
    dev_data["tenants"][1]["name"] = "team-a"
    assert len(problems_of(dev_data)) >= 3


def test_bad_yaml_names_the_line():
    msg = one("name: dev\nsites: [\n")
    assert msg.startswith("spec.yaml:3: not valid YAML")


def test_a_missing_required_field_says_what_it_is(dev_data):
    del dev_data["node_pools"][0]["cpu_cores_per_host"]
    assert ("node_pools[0].cpu_cores_per_host: required field is missing; add it (CPU cores (threads) of each "
            "host, as its Node reports them (status.capacity.cpu).)") \
        in one(dev_data)


def test_missing_file_is_a_spec_error(tmp_path):
    with pytest.raises(SpecError, match="cannot read the spec"):
        load_spec(tmp_path / "nope.yaml")


def test_a_bare_integer_quota_means_nominal(dev_data):
    dev_data["tenants"][1]["gpu_quota"] = {"h100": 4}
    spec = parse_spec(__import__("yaml").safe_dump(dev_data))
    assert spec.tenants[1].gpu_quota["h100"].nominal == 4 and spec.tenants[1].gpu_quota["h100"].borrowing_limit is None


def test_rejects_infiniband_leaves_without_spines(dev_data):
    dev_data["fabric"] = {"kind": "infiniband", "infiniband": {"subnet_managers": ["gpu-dev-01"]}, "switches": [
        {"name": f"ib-leaf-{r}", "role": "leaf", "vendor": "mlnx-os", "address": f"10.10.1.{r + 1}", "ports": 32,
         "port_speed_gbps": 400, "rails": [r], "managed": False} for r in range(2)]}
    found = problems_of(dev_data)
    assert len(found) == 2 and "fabric.switches[0].uplinks: InfiniBand leaf ib-leaf-0 has no uplinks" in found[0]


@pytest.mark.parametrize("text", [
    "a: 1\nb: [1, 2.5, true, null, ~, 0x1f, 0o17, 017, 1_000, 'x', 2001-01-01, 1:20, .inf, -.5, yes, off]\n",
    "? [1]\n: 2\n",                                     # a complex key: PyYAML's constructor decides
    "base: &b {x: 1}\nd:\n  <<: *b\n  y: 2\n",          # aliases and merge keys: PyYAML's constructor
    *[(ROOT / "stacks" / f"{s}.yaml").read_text() for s in ("dev", "staging", "prod")],
])
def test_fast_construction_gives_what_pyyamls_constructor_gives(text):
    """Specs are built from the composed tree without PyYAML's slower constructor where nothing unusual is in
    it; the values must be the same either way."""
    import yaml
    from components.spec import loader
    node, _ = loader._compose(text)
    try:
        want = yaml.constructor.SafeConstructor().construct_document(node)
    except yaml.YAMLError as e:
        want = type(e)
    try:
        got, _ = loader.read_mapping(text, "t.yaml", "a mapping")
    except SpecError:
        got = yaml.constructor.ConstructorError
    assert got == want
