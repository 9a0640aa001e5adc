"""The filesystem layout planner on random layouts: names and IDs follow the spec's indexes, never positions."""

from __future__ import annotations

import copy

import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from components.spec import parse_spec
from components.spec.storage import quota_id
from components.storage.layout import ROLE_ORDER, plan_layout
from tests.conftest import _DEV


@st.composite
def lustre_specs(draw):
    """One MDS (MGS+MDT, optionally a failover partner) and 1-6 OSS with 1-3 OSTs each, indexes shuffled."""
    oss = draw(st.integers(1, 6))
    per = [draw(st.integers(1, 3)) for _ in range(oss)]
    indexes = draw(st.permutations(list(range(sum(per)))))
    failover = draw(st.booleans())
    data = copy.deepcopy(_DEV)
    data["sites"][0]["racks"].append({"name": "r02", "pdu_capacity_kw": 20})
    servers = [{"hostname": "mds-01", "address": "10.10.9.1", "data_address": "10.11.9.1", "rack": "r02",
                "failover": "mds-02" if failover else None,
                "targets": [{"role": "mgs-mdt", "device": "/dev/md0", "raid_level": "raid10", "size_tib": 4}]}]
    if failover:
        servers.append({"hostname": "mds-02", "address": "10.10.9.2", "data_address": "10.11.9.2", "rack": "r02",
                        "failover": "mds-01", "targets": [{"role": "mdt", "index": 1, "device": "/dev/md0",
                                                           "raid_level": "raid10", "size_tib": 4}]})
    it = iter(indexes)
    for n, count in enumerate(per):
        servers.append({"hostname": f"oss-{n:02d}", "address": f"10.10.9.{20 + n}", "data_address": f"10.11.9.{20 + n}",
                        "rack": "r02", "targets": [{"role": "ost", "index": next(it), "device": f"/dev/md{k}",
                                                    "raid_level": "raid6", "size_tib": 100} for k in range(count)]})
    for s in servers:
        if s.get("failover", 0) is None:
            del s["failover"]
    data["storage"] = {"kind": "lustre", "fs_name": "labfs", "server_interface": "ib0",
                       "read_gb_per_s_per_server": 50, "servers": servers, "failover_mounted_by_ha": failover}
    return data


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lustre_specs())
def test_every_target_has_its_own_name_and_mount_and_the_start_order_holds(data):
    layout = plan_layout(parse_spec(yaml.safe_dump(data)))
    labels = [t.label for t in layout.targets]
    assert len(set(labels)) == len(labels) and len({(t.server, t.mount) for t in layout.targets}) == len(labels)
    assert [ROLE_ORDER[t.role] for t in layout.targets] == sorted(ROLE_ORDER[t.role] for t in layout.targets)
    osts = [t for t in layout.targets if t.role == "ost"]
    assert {t.label for t in osts} == {f"labfs-OST{i:04x}" for i in range(len(osts))}
    assert layout.read_gb_per_s == 50 * layout.data_servers
    failover = any(s.failover for s in layout.servers)
    assert layout.manager == ("10.11.9.1@o2ib:10.11.9.2@o2ib" if failover else "10.11.9.1@o2ib")
    assert layout.client_source == f"{layout.manager}:/labfs"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lustre_specs())
def test_adding_a_server_renames_no_other_target(data):
    before = plan_layout(parse_spec(yaml.safe_dump(data)))
    taken = max(t["index"] for s in data["storage"]["servers"] for t in s["targets"] if t["role"] == "ost")
    data["storage"]["servers"].insert(1, {"hostname": "oss-new", "address": "10.10.9.99", "data_address": "10.11.9.99",
                                          "rack": "r02", "targets": [{"role": "ost", "index": taken + 1,
                                                                      "device": "/dev/md9", "raid_level": "raid6",
                                                                      "size_tib": 100}]})
    after = plan_layout(parse_spec(yaml.safe_dump(data)))
    assert set(before.targets) <= set(after.targets)


def test_beegfs_node_ids_come_from_target_ids_and_quota_ids_from_names():
    data = copy.deepcopy(_DEV)
    data["storage"]["servers"][0]["targets"][2]["index"] = 7
    layout = plan_layout(parse_spec(yaml.safe_dump(data)))
    assert layout.node_ids == {"stor-dev-01": {"meta": 1, "storage": 7}}
    assert layout.manager == layout.client_source == "10.10.1.31"
    assert layout.project_ids == {"team-b": quota_id("team-b")} and quota_id("team-b") == quota_id("team-b")
    assert 100_000 <= quota_id("team-b") < 1_000_100_000
