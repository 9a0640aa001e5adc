"""Tenants isolated on RoCE (fabric/vlans.py): each isolated host port in its tenant's VLAN, the others in the
shared one, the tenants' VLANs carried between the switches; refused where they would clash or fence nothing."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from components.fabric.partitions import fabric_reach
from components.fabric.vlans import plan_vlans, render_vlan_step
from components.spec.topology import plan_topology
from tests.components.fabric.isolated_specs import hand_b_to_team_a, roce_isolated
from tests.conftest import problems_of


def sonic(data):
    for s in data["fabric"]["switches"]:
        s["vendor"] = "sonic"
        s["port_names"] = [f"Ethernet{4 * i}" for i in range(s["ports"])]


def eos(data):
    for s in data["fabric"]["switches"]:
        s["vendor"] = "eos"


VENDORS = {"cumulus": lambda d: None, "sonic": sonic, "eos": eos}


def test_each_isolated_hosts_leaf_port_is_in_its_tenants_vlan_and_every_other_in_the_shared_one():
    spec = roce_isolated()
    vlans, owner = spec.tenant_vlans, spec.isolated_hosts
    assert set(vlans) == {"team-a", "team-b"} and len(set(vlans.values())) == 2
    assert all(spec.fabric.roce.tenant_vlan_first <= v <= spec.fabric.roce.tenant_vlan_last for v in vlans.values())
    plan = plan_vlans(spec)
    topology = plan_topology(spec)[0]
    for link in topology.links:
        port = f"swp{link.port}"
        want = vlans[owner[link.host]] if link.host in owner else spec.fabric.roce.shared_vlan
        assert plan[link.leaf].access[port] == want, (link, plan[link.leaf].access)
    leaf = plan["ib-leaf-0"]
    assert leaf.trunks == tuple(f"swp{n}" for n in range(57, 65))       # the top 8 ports: 2 spines x 4 links
    assert leaf.tagged == tuple(sorted(vlans.values())) and leaf.vlans == (1, *sorted(vlans.values()))
    assert plan["ib-spine-1"].access == {} and plan["ib-spine-1"].tagged == leaf.tagged
    assert plan_vlans(roce_isolated(change=lambda d: d["fabric"]["roce"].update(isolate_dedicated_pools=False))) == {}


def test_a_switch_kept_in_the_topology_only_gets_no_vlan_step():
    """`managed: false` (a spine here, which no pool's port needs) keeps it out of the steps."""
    spec = roce_isolated(change=lambda d: d["fabric"]["switches"][-1].update(managed=False))
    unmanaged = spec.fabric.switches[-1]
    assert unmanaged.role == "spine" and not unmanaged.managed
    assert unmanaged.name not in plan_vlans(spec) and "ib-leaf-0" in plan_vlans(spec)


def test_a_tenants_vlan_is_derived_from_its_name_alone_and_a_given_one_wins():
    import zlib
    base = roce_isolated().tenant_vlans
    assert base["team-b"] == 3000 + zlib.crc32(b"team-b") % 1000      # the name alone, in 3000-3999
    given = roce_isolated(change=lambda d: d["tenants"][0].update(roce_vlan=3500)).tenant_vlans
    assert given["team-a"] == 3500 and given["team-b"] == base["team-b"]


def test_who_reaches_whom_follows_the_vlans():
    reach = fabric_reach(roce_isolated())
    groups = reach["groups"]
    assert groups["h100-a"]["reaches"] == ["h100-a"] and groups["h100-b"]["reaches"] == ["h100-b"]
    assert groups["h100"]["cut_off_from"] == ["h100-a", "h100-b"] and groups["h100-a"]["tenant"] == "team-a"
    assert reach["fences"]["team-a"].startswith("VLAN ")


def _data_change(**fields):
    def change(data):
        for path, value in fields.items():
            node = data
            *parents, key = path.split(".")
            for part in parents:
                node = node[int(part)] if part.isdigit() else node[part]
            node[int(key) if key.isdigit() else key] = value
    return change


def _problems(change) -> list[str]:
    import yaml
    from tests.components.fabric import isolated_specs
    captured = {}

    def keep(data):
        change(data)
        captured["data"] = data
    try:
        isolated_specs.roce_isolated(change=keep)
    except Exception:     # the spec error itself: read every problem through problems_of
        pass
    return problems_of(yaml.safe_load(yaml.safe_dump(captured["data"])))


@pytest.mark.parametrize("change, expected", [
    (_data_change(**{"tenants.0.roce_vlan": 3100, "tenants.1.roce_vlan": 3100}),
     "tenants[1].roce_vlan: tenant 'team-b''s VLAN 3100 is already used at tenants[0].roce_vlan"),
    (_data_change(**{"fabric.roce.shared_vlan": 100, "tenants.0.roce_vlan": 100}),
     "tenant 'team-a''s VLAN 100 is already used at fabric.roce.shared_vlan"),
    (_data_change(**{"fabric.roce.site_vlans": [3100], "tenants.0.roce_vlan": 3100}),
     "is already used at fabric.roce.site_vlans[0]"),
    (_data_change(**{"fabric.roce.tenant_vlan_first": 3999, "fabric.roce.tenant_vlan_last": 3000}),
     "fabric.roce.tenant_vlan_last: tenant_vlan_last (3000) is below tenant_vlan_first (3999)"),
    (_data_change(**{"fabric.roce.shared_vlan": 3001}), "fabric.roce.shared_vlan: shared_vlan 3001 lies in the"),
    (lambda d: d["fabric"]["switches"].pop(0), "fabric.roce.isolate_dedicated_pools: node pool 'h100-a' (dedicated "
                                               "to 'team-a') has ports on no leaf this library configures"),
    (_data_change(**{"tenants.0.roce_vlan": 4095}),
     "tenants[0].roce_vlan: Input should be less than or equal to 4094 (got 4095)"),
    (_data_change(**{"fabric.roce.shared_vlan": "x"}), "fabric.roce.shared_vlan: Input should be a valid integer"),
    (_data_change(**{"fabric.roce.site_vlans": [5000]}), "fabric.roce.site_vlans[0]: 5000 is not a VLAN (1-4094)"),
    (_data_change(**{"fabric.roce.tenant_vlan_first": 1}),
     "fabric.roce.tenant_vlan_first: Input should be greater than or equal to 2 (got 1)"),
    (lambda d: d["fabric"]["switches"][0].update(managed=False),
     "fabric.roce.isolate_dedicated_pools: node pool 'h100-a' (dedicated to 'team-a') has ports on no leaf this "
     "library configures"),
    (sonic_without_names := (lambda d: (sonic(d), d["fabric"]["switches"][0].pop("port_names"))),
     "fabric.switches[0].port_names: SONiC switch ib-leaf-0 names its ports by lanes"),
])
def test_a_vlan_that_clashes_or_a_port_nothing_fences_is_refused_naming_the_field(change, expected):
    found = _problems(change)
    assert any(expected in p for p in found), found


def test_a_roce_vlan_on_infiniband_is_refused():
    from tests.components.fabric.isolated_specs import isolated_example
    from components.spec import SpecError
    with pytest.raises(SpecError, match=r"tenants\[0\]\.roce_vlan: tenant 'team-a' has a roce_vlan but the fabric "
                                        r"is infiniband"):
        isolated_example(change=lambda d: d["tenants"][0].update(roce_vlan=3100))


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed (.ci/run installs it)")
@pytest.mark.parametrize("vendor", sorted(VENDORS))
def test_vlan_steps_pass_shellcheck(vendor, tmp_path):
    spec = roce_isolated(change=VENDORS[vendor])
    switches = {s.name: s for s in spec.fabric.switches}
    for name, vlans in plan_vlans(spec).items():
        path = tmp_path / f"{name}.sh"
        step = render_vlan_step(switches[name], vlans, 1)
        for text in (step.create, step.delete):
            path.write_text(text)
            out = subprocess.run(["shellcheck", "-S", "style", str(path)], capture_output=True, text=True)
            assert out.returncode == 0, out.stdout


def test_a_pool_handed_to_another_tenant_moves_its_ports_to_that_tenants_vlan():
    before, after = roce_isolated(), roce_isolated(change=hand_b_to_team_a)
    b_hosts = {h.hostname for p in after.node_pools if p.name == "h100-b" for h in p.hosts}
    for link in plan_topology(after)[0].links:
        if link.host in b_hosts:
            port = f"swp{link.port}"
            assert plan_vlans(before)[link.leaf].access[port] == before.tenant_vlans["team-b"]
            assert plan_vlans(after)[link.leaf].access[port] == after.tenant_vlans["team-a"]


# --- the components' graph, under the offline plan's mocks --------------------------------------------------

@pytest.fixture(scope="module")
def roce_plan(tmp_path_factory):
    import yaml
    from components.offline.plan import build_plan
    from components.offline.runner import run_program
    from tests.components.fabric.isolated_specs import roce_isolated_data
    from tests.conftest import ROOT
    path = tmp_path_factory.mktemp("roce") / "roce.yaml"
    path.write_text(yaml.safe_dump(roce_isolated_data()))
    return build_plan(run_program(ROOT, "roce-isolated", spec_file=path))


def test_the_vlan_steps_follow_the_drain_and_the_switches_own_steps_and_nodes_open_after_them(roce_plan):
    by_name = {r["urn"].rsplit("::", 1)[1]: r for r in roce_plan.document["resources"]}

    def deps(r):
        return {d.rsplit("::", 1)[1] for d in [*r["dependsOn"], *r.get("propertyDependencies", {}).get("create", [])]}

    component = by_name["prod-isolated-vlans"]
    steps = {n: r for n, r in by_name.items() if n.startswith("prod-isolated-vlans-") and r["parent"] == component["urn"]}
    assert set(steps) == {"prod-isolated-vlans-ib-leaf-0", "prod-isolated-vlans-ib-leaf-1",
                          "prod-isolated-vlans-ib-spine-1", "prod-isolated-vlans-ib-spine-2"}
    handover, reopen = by_name["prod-isolated-vlans-handover"], by_name["prod-isolated-vlans-reopen"]
    for name, step in steps.items():
        switch = name.removeprefix("prod-isolated-vlans-")
        # after the drain, and after the switch's own settings (one configuration session at a time)
        assert {"prod-isolated-vlans-handover", f"prod-isolated-fabric-{switch}"} <= deps(step), deps(step)
    assert set(steps) <= deps(reopen)
    assert "Drain the nodes whose ports change VLAN" in handover["inputs"]["create"]
    assert "gpu-prod-07 team-b 3600" in handover["inputs"]["environment"]["GPUCLUSTER_PARTITIONS"]
    opened = {n: deps(r) for n, r in by_name.items() if r["type"] == "kubernetes:core/v1:NodePatch"}
    isolated = [n for n in opened if n.startswith(("prod-isolated-h100-a-", "prod-isolated-h100-b-"))]
    assert isolated and all("prod-isolated-vlans-reopen" in opened[n] for n in isolated)
    assert not any("prod-isolated-vlans-reopen" in d for n, d in opened.items() if n not in isolated)
    assert "prod-isolated-partitions" not in by_name
    vlan = roce_isolated().tenant_vlans["team-a"]
    assert f"| h100-a | team-a | VLAN {vlan} | h100-a | h100, h100-b |" in roce_plan.files["report.md"]


def test_a_standalone_fabric_pushes_the_vlans_after_its_switches(record):
    from components.fabric import Fabric
    from tests.conftest import ssh_key
    spec = roce_isolated()
    run = record(lambda: Fabric("f", spec, ssh_key()))
    by_name = {r.urn.rsplit("::", 1)[1]: r for r in run.records}
    assert by_name["f-vlans"].parent == by_name["f"].urn
    for switch in plan_vlans(spec):
        assert by_name[f"f-vlans-{switch}"].parent == by_name["f-vlans"].urn
        assert by_name[f"f-{switch}"].urn in by_name[f"f-vlans-{switch}"].dependencies


@pytest.mark.parametrize("vendor", sorted(VENDORS))
def test_rendered_vlan_step_matches_its_golden_file(vendor):
    """To accept an intended change: GOLDEN_UPDATE=1 pytest tests/components/fabric/test_vlans.py"""
    import os
    from pathlib import Path
    from components.fabric.vlans import SwitchVlans
    switch = roce_isolated(change=VENDORS[vendor]).fabric.switches[0]
    first, second = ("Ethernet0", "Ethernet4") if vendor == "sonic" else ("swp1", "swp2") if vendor == "cumulus" \
        else ("Ethernet1", "Ethernet2")
    uplink = {"sonic": "Ethernet252", "cumulus": "swp64", "eos": "Ethernet64"}[vendor]
    vlans = SwitchVlans({first: 3001, second: 1}, (uplink,), (3001,))
    text = render_vlan_step(switch, vlans, 1).create
    golden = Path(__file__).parent / "golden" / f"{vendor}-vlans.sh"
    if os.environ.get("GOLDEN_UPDATE"):
        golden.write_text(text)
    assert text == golden.read_text()
