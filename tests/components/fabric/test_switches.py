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
    if vendor == "eos":          # a session merges: a class's earlier lossless priority is set back to drop
        assert re.findall(r"priority-flow-control priority (\d+) drop", text) == \
            [str(p) for p in range(8) if p != spec.fabric.roce.priority]


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
    assert "ports=(Ethernet0 Ethernet4 Ethernet8 Ethernet12)" in \
        render_switch(spec.fabric.switches[0], spec.fabric).create


def sonic_run(script: str, tmp_path, table: list[str]):
    """The script under real bash, with sonic-db-cli answering from a PORT table and recording every change."""
    log = tmp_path / "calls"
    (tmp_path / "sonic-db-cli").write_text("#!/usr/bin/env bash\necho \"sonic-db-cli $*\" >> " + str(log) + "\n"
                                           "if [[ $2 == keys ]]; then printf 'PORT|%s\\n' " + " ".join(table)
                                           + "; fi\n")
    (tmp_path / "config").write_text("#!/usr/bin/env bash\necho \"config $*\" >> " + str(log) + "\n")
    for tool in ("sonic-db-cli", "config"):
        (tmp_path / tool).chmod(0o755)
    script = script.replace("OWED_DIR=/var/lib/gpucluster/owed", f"OWED_DIR={tmp_path / 'owed'}")
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                         env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    changes = [c for c in (log.read_text().splitlines() if log.exists() else []) if " hset " in c or
               c.startswith("config ")]
    return out, changes


def test_sonic_takes_its_port_names_from_the_switch_and_refuses_before_any_change(dev_data, tmp_path):
    """A platform of 4 lanes per port names its ports Ethernet0, Ethernet4...: the script covers the PORT
    table's ports, and a table that does not match the spec stops it before the DSCP map or ECN change."""
    spec = spec_with(dev_data, "sonic")
    script = render_switch(spec.fabric.switches[0], spec.fabric).create
    ports = spec.fabric.switches[0].ports
    runs = iter(tmp_path / f"run{i}" for i in range(3))

    def run(text, table):
        where = next(runs)
        where.mkdir()
        return sonic_run(text, where, table)
    out, changes = run(script, [f"Ethernet{4 * i}" for i in range(ports)])
    assert out.returncode == 0, out.stderr
    assert f"config interface mtu Ethernet{4 * (ports - 1)} 9100" in changes and \
        f"config interface mtu Ethernet{8 * (ports - 1)} 9100" not in changes
    out, changes = run(script, [f"Ethernet{4 * i}" for i in range(ports * 2)])       # broken out: twice the ports
    assert out.returncode == 1 and f"the PORT table lists {ports * 2} ports but the spec says {ports}" in out.stderr
    assert changes == []
    named = spec_with(dev_data, "sonic", port_names=["Ethernet0", "Ethernet4", "Ethernet8", "Ethernet9"])
    out, changes = run(render_switch(named.fabric.switches[0], named.fabric).create,
                       ["Ethernet0", "Ethernet4", "Ethernet8", "Ethernet12"])
    assert out.returncode == 1 and "port Ethernet9 is not in this switch's PORT table" in out.stderr
    assert changes == []
