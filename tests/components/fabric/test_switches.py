"""Switch backends: golden scripts per network OS, shellcheck, and the same lossless class as the hosts."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml


from components.fabric.switches import BACKENDS, render_switch
from components.spec import parse_spec
from components.spec.cluster import LOSSLESS_PRIORITIES, SWITCH_VENDORS
from tests.conftest import problems_of

GOLDEN = Path(__file__).parent / "golden"
# A non-default RoCE class, so a backend that ignores the spec and prints its vendor's defaults fails.
CUSTOM = {"priority": 5, "pfc_priorities": [5], "dscp": 46, "cnp_dscp": 56, "cnp_priority": 7,
          "ecn": {"min_threshold_kb": 200, "max_threshold_kb": 2000, "probability_percent": 50}}


def spec_with(dev_data, vendor: str, roce: dict | None = None, **switch):
    dev_data["fabric"]["switches"][0].update(vendor=vendor, ports=4, **switch)
    if roce is CUSTOM and vendor in LOSSLESS_PRIORITIES:      # the highest priority the backend makes lossless
        prio = LOSSLESS_PRIORITIES[vendor][-1]
        roce = {**CUSTOM, "priority": prio, "pfc_priorities": [prio]}
    if roce:
        dev_data["fabric"]["roce"] = roce
    return parse_spec(yaml.safe_dump(dev_data))


def test_every_vendor_the_spec_accepts_has_a_backend():
    assert set(SWITCH_VENDORS) == set(BACKENDS)


@pytest.mark.parametrize("vendor", sorted(BACKENDS))
def test_rendered_switch_script_matches_its_golden_file(vendor, dev_data):
    """To accept an intended change: GOLDEN_UPDATE=1 pytest tests/components/fabric/test_switches.py"""
    spec = spec_with(dev_data, vendor, CUSTOM)
    text = render_switch(spec.fabric.switches[0], spec.fabric).create
    golden = GOLDEN / f"{vendor}.sh"
    if os.environ.get("GOLDEN_UPDATE"):
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text()


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed (.ci/run installs it)")
@pytest.mark.parametrize("vendor", sorted(BACKENDS))
@pytest.mark.parametrize("roce", [None, CUSTOM], ids=["defaults", "custom"])
def test_switch_scripts_pass_shellcheck(vendor, roce, dev_data, tmp_path):
    spec = spec_with(dev_data, vendor, roce)
    path = tmp_path / f"{vendor}.sh"
    path.write_text(render_switch(spec.fabric.switches[0], spec.fabric).create)
    out = subprocess.run(["shellcheck", "-S", "style", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout


@pytest.mark.parametrize("vendor", sorted(BACKENDS))
def test_pfc_is_lossless_on_the_roce_priority_only(vendor, dev_data):
    spec = spec_with(dev_data, vendor, CUSTOM)
    text = render_switch(spec.fabric.switches[0], spec.fabric).create
    pfc = {"cumulus": r"nv set qos pfc default-global switch-priority (\d+)",
           "sonic": r'config interface pfc priority "\$1" (\d+) on',
           "eos": r"priority-flow-control priority (\d+) no-drop"}[vendor]
    assert re.findall(pfc, text) == [str(spec.fabric.roce.priority)] and spec.fabric.roce.priority != 3
    if vendor == "cumulus":      # NVUE's RoCE mode enables PFC on 3; it must come off
        assert "nv unset qos pfc default-global switch-priority 3" in text


@pytest.mark.parametrize("vendor", sorted(BACKENDS))
def test_dscp_map_ecn_and_mtu_come_from_the_spec(vendor, dev_data):
    spec = spec_with(dev_data, vendor, CUSTOM, mtu_bytes=9100)
    text = render_switch(spec.fabric.switches[0], spec.fabric).create
    maps = {"cumulus": r"dscp (\d+) switch-priority (\d+)", "sonic": r"dscp_tc (\d+) (\d+)",
            "eos": r"qos map dscp (\d+) to traffic-class (\d+)"}[vendor]
    assert sorted(re.findall(maps, text)) == [("46", str(spec.fabric.roce.priority)), ("56", "7")]
    assert "9100" in text and ("200000" in text or "200 kbytes" in text) and ("2000000" in text or "2000 kbytes" in text)


@pytest.mark.parametrize("vendor", sorted(BACKENDS))
def test_pfc_watchdog_follows_the_spec(vendor, dev_data):
    on = render_switch(*(lambda s: (s.fabric.switches[0], s.fabric))(spec_with(dev_data, vendor))).create
    dev_data["fabric"]["roce"] = {"pfc_watchdog": False}
    off = render_switch(*(lambda s: (s.fabric.switches[0], s.fabric))(parse_spec(yaml.safe_dump(dev_data)))).create
    assert "watchdog" in on.lower() and "pfcwd" not in off and "pfc-watchdog" not in off and "pause watchdog" not in off


def test_the_vendor_jumbo_mtu_is_used_when_the_switch_sets_none(dev_data):
    for vendor, mtu in (("cumulus", "link mtu 9216"), ("sonic", "!= 9100"), ("eos", "mtu 9214")):
        spec = spec_with(dev_data, vendor)
        assert mtu in render_switch(spec.fabric.switches[0], spec.fabric).create


def test_port_names_from_the_spec_replace_the_vendor_naming(dev_data):
    spec = spec_with(dev_data, "sonic", port_names=["Ethernet0", "Ethernet4", "Ethernet8", "Ethernet12"])
    assert "for port in Ethernet0 Ethernet4 Ethernet8 Ethernet12; do" in \
        render_switch(spec.fabric.switches[0], spec.fabric).create


def test_switches_are_left_as_they_are_on_destroy(dev_spec):
    assert render_switch(dev_spec.fabric.switches[0], dev_spec.fabric).delete is None


def test_sonic_refuses_a_roce_priority_its_buffers_do_not_make_lossless(dev_data):
    """SONiC's default buffer profiles, TC-to-PG map and WRED queues are lossless on priorities 3 and 4 only."""
    dev_data["fabric"]["switches"][0]["vendor"] = "sonic"
    dev_data["fabric"]["roce"] = {"priority": 5, "pfc_priorities": [5]}
    (msg,) = problems_of(dev_data)
    assert ("fabric.roce.priority: switch leaf-dev-01 runs sonic, whose default buffer configuration is lossless "
            "only on priorities 3 and 4, but RoCE uses priority 5") in msg and "use priority 3" in msg
    dev_data["fabric"]["roce"] = {"priority": 4, "pfc_priorities": [4]}
    assert problems_of(dev_data) == []
    dev_data["fabric"]["switches"][0]["vendor"] = "eos"            # EOS sizes no-drop buffers for any priority
    dev_data["fabric"]["roce"] = {"priority": 5, "pfc_priorities": [5]}
    assert problems_of(dev_data) == []
