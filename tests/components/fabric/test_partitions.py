"""Tenants isolated on InfiniBand: the spec's refusals, the partitions.conf and step rendered from the hosts'
reported GUIDs, the reach report, and the components' graph under mocks (the real OpenSM judges the file in
test_isolation_real.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Any

import pytest
import yaml

from components.fabric import Fabric
from components.fabric.host import render_fabric_host, render_partitions
from components.fabric.fabric import fabric_hosts
from components.fabric.nccl import nccl_envs
from components.fabric.partitions import fabric_reach, port_guids, render_partition_step
from components.nodes.handover import render_handover
from components.offline.plan import build_plan
from components.offline.runner import run_program
from components.spec import ClusterSpec, load_spec, parse_spec
from tests.conftest import ROOT, problems_of, ssh_key

EXAMPLE = ROOT / "examples" / "isolated-tenants.yaml"


def data() -> dict[str, Any]:
    return yaml.safe_load(EXAMPLE.read_text())


def spec_of(d: dict[str, Any]) -> ClusterSpec:
    return parse_spec(yaml.safe_dump(d))


def guids(spec: ClusterSpec) -> dict[str, dict[str, str]]:
    return {h.hostname: {n.device: f"0x{i:04x}{n.rail:012x}" for n in p.nics}
            for i, (p, h) in enumerate(spec.hosts(), 1)}


def tenant(d: dict[str, Any], name: str) -> dict[str, Any]:
    return next(t for t in d["tenants"] if t["name"] == name)


def pool(d: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in d["node_pools"] if p["name"] == name)


# --- the spec -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("pkey, expected", [
    (0x7FFF, "tenants[0].infiniband_pkey: partition key 0x7fff is outside 0x0001-0x7ffe (0x7fff is the default"),
    (0x0000, "tenants[0].infiniband_pkey: partition key 0x0000 is outside 0x0001-0x7ffe"),
    (0x8B01, "tenants[0].infiniband_pkey: partition key 0x8b01 is outside 0x0001-0x7ffe (0x7fff is the default "
             "partition); drop the full-membership bit 0x8000 (use 0x0b01)"),
    (0x0A01, "tenants[0].infiniband_pkey: tenant 'team-a''s partition key (0x0a01) is already used at "
             "fabric.infiniband.partitions[0].pkey; each partition needs its own pkey"),
])
def test_a_reserved_or_taken_partition_key_is_refused_naming_the_tenant(pkey, expected):
    d = data()
    tenant(d, "team-a")["infiniband_pkey"] = pkey
    assert any(expected in p for p in problems_of(d)), problems_of(d)


def test_two_tenants_on_one_key_and_a_derived_key_that_collides_are_refused_with_the_fix():
    d = data()
    tenant(d, "team-b")["infiniband_pkey"] = 0x0B01           # team-a's
    assert any("tenants[1].infiniband_pkey: tenant 'team-b''s partition key (0x0b01) is already used at "
               "tenants[0].infiniband_pkey" in p for p in problems_of(d)), problems_of(d)
    d = data()
    derived = spec_of(d).tenant_pkeys["team-b"]
    d["fabric"]["infiniband"]["partitions"].append({"name": "other", "pkey": derived})
    assert any(f"tenants[1].infiniband_pkey: tenant 'team-b''s partition key (derived key {derived:#06x}) is already "
               "used at fabric.infiniband.partitions[1].pkey" in p and "set tenants[].infiniband_pkey to a free one"
               in p for p in problems_of(d)), problems_of(d)


def test_a_derived_key_stays_as_tenants_come_and_go():
    d = data()
    before = spec_of(d).tenant_pkeys["team-b"]
    d["tenants"] = [t for t in d["tenants"] if t["name"] != "team-c"]
    assert spec_of(d).tenant_pkeys["team-b"] == before and 0x4000 <= before <= 0x6FFF


def test_a_dedicated_pool_without_nics_or_with_storage_on_its_rails_is_refused():
    d = data()
    pool(d, "h100-b")["nics"] = []
    assert any("node_pools[2].dedicated_to: node pool 'h100-b' is dedicated to 'team-b' but has no InfiniBand NICs"
               in p for p in problems_of(d)), problems_of(d)
    d = data()
    del d["storage"]["client_interface"]               # the filesystem over rail 0 (ibp0s0)
    assert any("storage.client_interface: node pool 'h100-a' (dedicated to 'team-a') reaches the filesystem over "
               "its rail port ibp0s0" in p for p in problems_of(d)), problems_of(d)


def test_a_subnet_manager_on_an_isolated_host_is_refused():
    d = data()
    d["fabric"]["infiniband"]["subnet_managers"] = ["gpu-prod-01", "gpu-prod-07"]
    assert any("fabric.infiniband.subnet_managers[1]: subnet manager gpu-prod-07 is a host of node pool 'h100-b'"
               in p for p in problems_of(d)), problems_of(d)


def test_a_pkey_on_an_ethernet_fabric_and_isolation_with_shards_are_refused():
    dev = yaml.safe_load((ROOT / "stacks" / "dev.yaml").read_text())
    dev["tenants"][0]["infiniband_pkey"] = 0x0B01
    assert any("tenants[0].infiniband_pkey: tenant" in p and "the fabric is rocev2, not infiniband" in p
               for p in problems_of(dev)), problems_of(dev)
    d = data()
    d["shards"] = [{"name": "a", "node_pools": ["h100-a"]}]
    assert any("fabric.infiniband.isolate_dedicated_pools: isolating dedicated pools needs every port GUID in one "
               "stack" in p for p in problems_of(d)), problems_of(d)


def test_a_tenant_keeps_its_key_while_isolation_is_off():
    d = data()
    d["fabric"]["infiniband"]["isolate_dedicated_pools"] = False
    spec = spec_of(d)
    assert spec.isolated_pools == {} and spec.tenant_pkeys == {}
    assert "NCCL_IB_PKEY" not in nccl_envs(spec)["h100-a"]


# --- partitions.conf and the step -------------------------------------------------------------------------

def test_isolated_ports_are_limited_everywhere_but_in_their_tenants_partition_at_index_0():
    spec = spec_of(data())
    g = guids(spec)
    text = render_partitions(spec, g)
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    by_name = {d.strip().split("=", 1)[0]: d.strip() for d in body.split(";") if d.strip()}
    a_ports = {g[h][f"mlx5_{r}"] for h in ("gpu-prod-05", "gpu-prod-06") for r in range(8)}
    b_ports = {g[h][f"mlx5_{r}"] for h in ("gpu-prod-07", "gpu-prod-08") for r in range(8)}
    shared = {g[h]["mlx5_0"] for h in ("gpu-prod-01", "gpu-prod-02")}

    def members(name: str) -> dict[str, str]:
        return dict(m.strip().split("=") for m in by_name[name].split(":", 1)[1].split(","))

    for name in ("Default", "ipoib-data"):
        assert members(name) == {"ALL": "full", **({"ALL_SWITCHES": "full", "SELF": "full"} if name == "Default"
                                                   else {}), **{p: "limited" for p in a_ports | b_ports}}
    assert by_name["tenant-team-a"].startswith("tenant-team-a=0x0b01, indx0, ipoib, mtu=5, rate=7 :")
    assert members("tenant-team-a") == {p: "full" for p in a_ports}
    assert members("tenant-team-b") == {p: "full" for p in b_ports}
    assert not shared & set(re.findall(r"0x[0-9a-f]{16}", text))        # shared ports: ALL=full
    assert max(map(len, text.splitlines())) < 4096                   # OpenSM reads 4 KiB lines
    # before the hosts are read (a subnet manager's first start): the shared partitions alone
    assert render_partitions(spec) == render_partitions(spec_of({**data(), "fabric": {
        **data()["fabric"], "infiniband": {**data()["fabric"]["infiniband"], "isolate_dedicated_pools": False}}}))


def test_the_guids_a_host_reports_are_read_back_and_junk_is_ignored():
    out = ("gpu-prod-05: changed: ibp0s0: MTU 2044 -> 4092\ngpu-prod-05: port-guid mlx5_0 0xb83fd20300051010\n"
           "gpu-prod-05: port-guid mlx5_1 0xB83F\nport-guid mlx5_2 0xb83fd20300051012\n"
           "gpu-prod-05: port-guid mlx5_3 0xb83fd20300051013\n")
    assert port_guids(out) == {"mlx5_0": "0xb83fd20300051010", "mlx5_3": "0xb83fd20300051013"}
    assert port_guids(None) == {}


def test_only_isolated_hosts_report_guids_and_nccl_uses_index_0_there():
    spec = spec_of(data())
    scripts = {h.hostname: render_fabric_host(spec, h.hostname, h.nics, h.nccl, h.storage_interfaces).create
               for h in fabric_hosts(spec)}
    assert "port_guid mlx5_7" in scripts["gpu-prod-05"] and "port_guid" not in scripts["gpu-prod-03"]
    envs = nccl_envs(spec)
    assert envs["h100-a"]["NCCL_IB_PKEY"] == "0" and "NCCL_IB_PKEY" not in envs["h100"]
    # the subnet managers' own step leaves a partitions.conf with a tenant's partition to the partitions step,
    # and is the same text with isolation off: turning it off does not run it (the partitions step's delete,
    # after the tenants' Nodes are drained, puts the shared partitions back)
    assert "if grep -q '^tenant-.*, indx0,' /etc/opensm/partitions.conf" in scripts["gpu-prod-01"]
    flat = data()
    flat["fabric"]["infiniband"]["isolate_dedicated_pools"] = False
    host = next(h for h in fabric_hosts(spec_of(flat)) if h.hostname == "gpu-prod-01")
    assert render_fabric_host(spec_of(flat), host.hostname, host.nics, host.nccl).create == scripts["gpu-prod-01"]


def test_the_step_writes_the_file_resweeps_and_checks_each_tenant_port_from_the_master():
    spec = spec_of(data())
    g = guids(spec)
    step = render_partition_step(spec, "gpu-prod-01", g)
    assert render_partitions(spec, g) in step.create
    assert f"gpu-prod-05 mlx5_0 {g['gpu-prod-05']['mlx5_0']} 0x8b01" in step.create
    assert f"gpu-prod-07 mlx5_7 {g['gpu-prod-07']['mlx5_7']} {spec.tenant_pkeys['team-b'] | 0x8000:#06x}" \
        in step.create
    assert "resweep\n" in step.create and "put_file /etc/opensm/partitions.conf" in step.create
    # a port whose GUID is missing would stay a full member of the shared partitions: nothing is written
    del g["gpu-prod-06"]["mlx5_3"]
    short = render_partition_step(spec, "gpu-prod-01", g).create
    assert "fail 'no port GUID reported for gpu-prod-06 mlx5_3: their fabric step prints" in short
    assert "put_file /etc/opensm" not in short and "resweep" not in short
    # its delete (tenants no longer isolated) puts the shared partitions back, as the subnet manager's step last
    # wanted them where it kept them, and re-reads them
    assert step.delete is not None and render_partitions(spec) in step.delete
    assert "if [[ -e /etc/opensm/gpucluster-shared-partitions.conf ]]; then" in step.delete
    assert "put_file /etc/opensm/partitions.conf 0644" in step.delete and "\n  resweep\n" in step.delete


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed")
def test_the_partitions_steps_pass_shellcheck(tmp_path):
    spec = spec_of(data())
    step = render_partition_step(spec, "gpu-prod-01", guids(spec))
    for i, text in enumerate((step.create, step.delete, *render_handover(spec))):
        (tmp_path / f"{i}.sh").write_text(text)
        done = subprocess.run(["shellcheck", "-S", "warning", "-s", "bash", str(tmp_path / f"{i}.sh")],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stdout


def test_the_reach_report_cuts_tenants_off_from_each_other_only():
    reach = fabric_reach(spec_of(data()))
    groups = reach["groups"]
    assert groups["h100-a"] == {"tenant": "team-a", "reaches": ["h100", "h100-a", "storage"],
                                "cut_off_from": ["h100-b"]}
    assert groups["h100"]["cut_off_from"] == [] and groups["storage"]["cut_off_from"] == []
    assert reach["partitions"] == {"team-a": "0x0b01", "team-b": f"{spec_of(data()).tenant_pkeys['team-b']:#06x}"}


# --- the components' graph, under the offline plan's mocks --------------------------------------------------

@pytest.fixture(scope="module")
def plan():
    return build_plan(run_program(ROOT, "isolated-tenants", spec_file=EXAMPLE))


def test_the_partitions_steps_follow_every_isolated_preparation_and_nodes_open_after_them(plan):
    by_name = {r["urn"].rsplit("::", 1)[1]: r for r in plan.document["resources"]}
    def deps(r):
        return {d.rsplit("::", 1)[1] for d in [*r["dependsOn"], *r.get("propertyDependencies", {}).get("create", [])]}

    steps = {n: r for n, r in by_name.items() if n.startswith("prod-isolated-partitions-gpu-")}
    assert set(steps) == {"prod-isolated-partitions-gpu-prod-01", "prod-isolated-partitions-gpu-prod-02"}
    component = by_name["prod-isolated-partitions"]
    handover, reopen = by_name["prod-isolated-partitions-handover"], by_name["prod-isolated-partitions-reopen"]
    # every isolated host's preparation (its GUIDs) and the SMs' own, then the drain, the steps, the reopen
    assert {f"prod-isolated-h100-{p}-gpu-prod-0{i}-prepare" for p, i in (("a", 5), ("a", 6), ("b", 7), ("b", 8))} \
        | {"prod-isolated-h100-gpu-prod-01-prepare", "prod-isolated-h100-gpu-prod-02-prepare"} <= deps(handover)
    for step in steps.values():
        assert step["parent"] == component["urn"] and "prod-isolated-partitions-handover" in deps(step)
        assert {f"prod-isolated-h100-{p}-gpu-prod-0{i}-prepare" for p, i in
                (("a", 5), ("a", 6), ("b", 7), ("b", 8))} <= deps(step)
    assert set(steps) <= deps(reopen)
    # where isolation ends, pulumi deletes them dependents first: the reopen's delete drains the tenants' Nodes,
    # the steps' deletes give their ports the shared partitions, the handover's delete reopens the Nodes
    assert reopen["inputs"]["delete"] == render_handover(load_spec(EXAMPLE)).release
    assert handover["inputs"]["delete"] == render_handover(load_spec(EXAMPLE)).released
    opened = {n: deps(r) for n, r in by_name.items() if r["type"] == "kubernetes:core/v1:NodePatch"}
    isolated = [n for n in opened if n.startswith(("prod-isolated-h100-a-", "prod-isolated-h100-b-"))]
    assert isolated and all("prod-isolated-partitions-reopen" in opened[n] for n in isolated)
    assert not any("prod-isolated-partitions-reopen" in d for n, d in opened.items() if n not in isolated)
    assert "gpu-prod-07 team-b 3600" in handover["inputs"]["environment"]["GPUCLUSTER_PARTITIONS"]
    assert "gpu-prod-03 shared 3600" in handover["inputs"]["environment"]["GPUCLUSTER_PARTITIONS"]
    # every host is named (a Node in a fence no line names is leaving), and a leaving Node's bound is the longest
    named = handover["inputs"]["environment"]["GPUCLUSTER_PARTITIONS"].splitlines()
    spec = load_spec(EXAMPLE)
    assert sorted(line.split()[0] for line in named) == sorted(h.hostname for _, h in spec.hosts())
    assert handover["inputs"]["environment"]["GPUCLUSTER_LEAVING_DRAIN_S"] == str(
        max(p.rollout.drain_timeout_s for p in spec.node_pools))
    assert component["outputs"]["reach"]["groups"]["h100-a"]["cut_off_from"] == ["h100-b"]
    assert "<gpu-prod-05:mlx5_0>=full" in plan.files["fabric/partitions.conf"]
    assert "| h100-a | team-a | P_Key 0x0b01 | h100, h100-a, storage | h100-b |" in plan.files["report.md"]


def test_a_standalone_fabric_takes_the_guids_from_its_own_host_steps(record):
    spec = spec_of(data())
    made = {}
    run = record(lambda: made.setdefault("f", Fabric("f", spec, ssh_key())))
    by_name = {r.urn.rsplit("::", 1)[1]: r for r in run.records}
    assert by_name["f-partitions"].parent == by_name["f"].urn
    step = by_name["f-partitions-gpu-prod-01"]
    assert set(step.property_dependencies["create"]) == {by_name[f"f-gpu-prod-0{i}"].urn for i in (5, 6, 7, 8)}
    assert made["f"].partitions is not None and set(made["f"].partitions.steps) == {"gpu-prod-01", "gpu-prod-02"}
