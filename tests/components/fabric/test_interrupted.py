"""Fabric scripts cut short (issue 28). The subnet manager host's OpenSM runs the files on disk after any cut.
Switch scripts: each network OS's script, killed at every step that changes the switch
while moving it from one RoCE class to another, converges on the next run: the running configuration is the
new class and the one the switch boots from (saved, startup) is the running one. The switches are simulated by
doubles that keep a running and a saved configuration, as the real CLIs do (SONiC's CONFIG_DB and `config
save`, NVUE's pending/applied revisions and `nv config save`, EOS sessions and `copy running-config
startup-config`)."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from components.fabric.fabric import fabric_hosts
from components.fabric.host import (OPENSM_CONF, OPENSM_LOG, OPENSM_UNIT, PARTITIONS_CONF, SHARED_PARTITIONS,
                                    render_fabric_host, render_partitions)
from components.fabric.partitions import render_partition_step
from tests.components.fabric.isolated_specs import hand_b_to_team_a, isolated_example
from components.fabric.switches import render_switch
from tests.components.fabric.test_host_and_component import spec_for
from tests.components.fabric.test_switches import spec_with
from tests.cutting import cut_everywhere
from tests.doubles import SWITCH_CLIS as DOUBLES

_OWED = "OWED_DIR=/var/lib/gpucluster/owed"
@pytest.fixture
def switch(tmp_path):
    for tool, text in DOUBLES.items():
        (tmp_path / tool).write_text(text)
        (tmp_path / tool).chmod(0o755)
    state = tmp_path / "state.json"

    def run(script: str) -> subprocess.CompletedProcess:
        assert _OWED in script, "the shared prelude keeps owed actions elsewhere now"
        text = script.replace(_OWED, f"OWED_DIR={tmp_path / 'owed'}")      # not this machine's /var/lib
        return subprocess.run(["bash", "-c", text], capture_output=True, text=True,
                              env={"PATH": f"{tmp_path}:/usr/bin:/bin", "SWITCH_STATE": str(state)})

    def reset(ports: int) -> None:
        shutil.rmtree(f"{state}.d", ignore_errors=True)
        for where in ("running", "saved"):
            for i in range(ports):
                (tmp_path / "state.json.d" / where / f"PORT|Ethernet{4 * i}").mkdir(parents=True)
                (tmp_path / "state.json.d" / where / f"PORT|Ethernet{4 * i}" / "mtu").write_text("1500")
        state.write_text(json.dumps({"running": [], "saved": []}))

    def read() -> dict:
        if run.vendor != "sonic":
            return json.loads(state.read_text())
        return {where: {k.name: {f.name: f.read_text() for f in k.iterdir()}
                        for k in (tmp_path / "state.json.d" / where).iterdir()} for where in ("running", "saved")}
    run.reset, run.state, run.owed = reset, read, tmp_path / "owed"
    return run


A = {"priority": 3, "pfc_priorities": [3], "dscp": 26, "cnp_dscp": 48, "cnp_priority": 6}
B = {"priority": 4, "pfc_priorities": [4], "dscp": 24, "cnp_dscp": 48, "cnp_priority": 6,
     "ecn": {"min_threshold_kb": 300, "max_threshold_kb": 3000, "probability_percent": 20}}


@pytest.mark.parametrize("vendor", ["sonic", "cumulus", "eos"])
def test_a_switch_script_killed_anywhere_converges_and_boots_into_what_runs(vendor, dev_data, switch):
    switch.vendor = vendor
    scripts = []
    for roce in (A, B):
        spec = spec_with(json.loads(json.dumps(dev_data)), vendor, roce)
        scripts.append(render_switch(spec.fabric.switches[0], spec.fabric).create)
    to_a, to_b = scripts
    switch.reset(4)
    assert switch(to_a).returncode == 0
    at_a = switch.state()
    assert switch(to_b).returncode == 0
    at_b = switch.state()
    assert at_b["running"] != at_a["running"] and at_b["saved"] == at_b["running"]
    for target, other in ((to_b, to_a), (to_a, to_b)):
        ok(switch(other))
        ok(switch(target))
        want = switch.state()["running"]        # what an uncut run leaves, on this path

        def check(k, want=want):
            now = switch.state()
            assert now["running"] == want, f"step {k}: the running configuration is not the spec's"
            assert now["saved"] == now["running"], f"step {k}: the switch would boot into an older configuration"
        points = cut_everywhere(switch, target, lambda other=other: ok(switch(other)), check)
        assert len(points) > 6, points



@pytest.mark.parametrize("vendor", ["sonic", "cumulus", "eos"])
def test_a_vlan_step_killed_anywhere_converges_and_boots_into_what_runs(vendor, switch):
    """A leaf's tenant VLANs from nothing, then a dedicated pool handed to the other tenant and back: after a
    cut at any step, the next run leaves each port in its VLAN, and the saved configuration the running one."""
    from components.fabric.vlans import plan_vlans, render_vlan_step
    from tests.components.fabric.isolated_specs import roce_isolated
    from tests.components.fabric.test_vlans import VENDORS
    switch.vendor = vendor

    def step(*changes):
        spec = roce_isolated(change=lambda d: [c(d) for c in (VENDORS[vendor], *changes)] and None)
        leaf = next(s for s in spec.fabric.switches if s.name == "ib-leaf-0")
        return render_vlan_step(leaf, plan_vlans(spec)["ib-leaf-0"], 1).create
    isolated, handed = step(), step(hand_b_to_team_a)

    def fresh():
        switch.reset(64)
        (switch.owed / "save-config").unlink(missing_ok=True)
    for target, back in ((isolated, fresh), (handed, lambda: ok(switch(isolated))),
                         (isolated, lambda: ok(switch(handed)))):
        back()
        ok(switch(target))
        want = switch.state()["running"]
        again = switch(target)
        assert again.returncode == 0 and again.stdout.strip().endswith(": 0 change(s)"), again.stdout

        def check(k, want=want):
            now = switch.state()
            assert now["running"] == want, f"step {k}: the ports are not in their VLANs"
            assert now["saved"] == now["running"], f"step {k}: the switch would boot into other VLANs"
        points = cut_everywhere(switch, target, back, check)
        assert len(points) > 2, points


@pytest.mark.parametrize("vendor", ["sonic", "cumulus", pytest.param("eos", marks=pytest.mark.skip(
    reason="the EOS double replaces the running configuration with a session's lines, where EOS merges them: "
           "a delete that touches some ports cannot be judged on it"))])
def test_turning_isolation_off_puts_the_tenants_ports_back_in_the_shared_vlan(vendor, switch):
    """The step's delete (isolation turned off deletes the steps) leaves the leaf as a step that puts every host
    port in the shared VLAN would, and saved; killed anywhere, it converges on the next run."""
    from components.fabric.vlans import SwitchVlans, plan_vlans, render_vlan_step
    from tests.components.fabric.isolated_specs import roce_isolated
    from tests.components.fabric.test_vlans import VENDORS
    switch.vendor = vendor
    spec = roce_isolated(change=lambda d: VENDORS[vendor](d))
    leaf = next(s for s in spec.fabric.switches if s.name == "ib-leaf-0")
    planned = plan_vlans(spec)["ib-leaf-0"]
    step = render_vlan_step(leaf, planned, 1)
    everything_shared = render_vlan_step(leaf, SwitchVlans({p: 1 for p in planned.access}), 1).create

    def isolated():
        switch.reset(64)
        (switch.owed / "save-config").unlink(missing_ok=True)
        ok(switch(step.create))
    isolated()
    ok(switch(everything_shared))
    want = switch.state()["running"]
    isolated()
    left = switch(step.delete)
    assert left.returncode == 0 and "changed" in left.stdout, left.stdout + left.stderr
    assert switch.state()["running"] == want and switch.state()["saved"] == want

    def check(k):
        now = switch.state()
        assert now["running"] == want and now["saved"] == want, f"step {k}: a tenant's port is not back"
    assert len(cut_everywhere(switch, step.delete, isolated, check)) > 2


# systemd and OpenSM for the subnet manager's section: a restart records what the daemon runs (its conf and
# partitions, and the unit as systemd last loaded it at daemon-reload).
SM_DOUBLES = {
    "systemctl": r'''#!/bin/bash
set -eu
D=$SM_STATE
args=(); for a in "$@"; do case $a in --*) ;; *) args+=("$a") ;; esac; done
case ${args[0]} in
  daemon-reload) md5sum < "$D/etc/gpucluster-opensm.service" > "$D/reloaded" 2>/dev/null || rm -f "$D/reloaded" ;;
  is-active) [[ -e "$D/active-${args[1]}" ]] ;;
  is-enabled) if [[ -e "$D/enabled-${args[1]}" ]]; then echo enabled; else echo disabled; exit 1; fi ;;
  enable) touch "$D/enabled-${args[1]}" ;;
  disable) rm -f "$D/enabled-${args[1]}" "$D/active-${args[1]}" ;;
  restart|start) touch "$D/active-${args[1]}"
    cp "$D/etc/opensm.conf" "$D/running.conf"; cp "$D/etc/partitions.conf" "$D/running.partitions"
    { cat "$D/running.conf" "$D/running.partitions" | md5sum; cat "$D/reloaded"; } > "$D/loaded"
    echo "0x02 -> SUBNET UP" >> "$D/opensm.log" ;;          # as OpenSM logs it once master
  # ExecReload (SIGHUP): the master's heavy sweep re-reads the partitions alone
  reload) [[ -e "$D/active-${args[1]}" ]] || { echo "not active, cannot reload" >&2; exit 1; }
    cp "$D/etc/partitions.conf" "$D/running.partitions"
    { cat "$D/running.conf" "$D/running.partitions" | md5sum; cat "$D/reloaded"; } > "$D/loaded"
    echo "0x02 -> SUBNET UP" >> "$D/opensm.log" ;;
  *) echo "systemctl double: $*" >&2; exit 2 ;;
esac
''',
    "opensm": "#!/bin/sh\n", "sminfo": "#!/bin/sh\nexit 1\n",      # no other subnet manager answers
}


def sm_host(where):
    """A subnet manager's host under `where`: the doubles on PATH, its files in `where`/etc; runs a script there."""
    for tool, text in SM_DOUBLES.items():
        (where / tool).write_text(text)
        (where / tool).chmod(0o755)
    (where / "etc").mkdir()

    def run(text: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", text], capture_output=True, text=True,
                              env={"PATH": f"{where}:/usr/bin:/bin", "SM_STATE": str(where)})
    return run


def sm_section(spec, where, hostname: str | None = None) -> str:
    """A subnet manager host's script, its OpenSM section alone, with its files under `where`. `hostname`: one of
    the spec's fabric hosts. Omitted: dev's primary, gpu-dev-01."""
    if hostname is None:
        text = render_fabric_host(spec, "gpu-dev-01", spec.node_pools[0].nics, {}).create
    else:
        host = next(h for h in fabric_hosts(spec) if h.hostname == hostname)
        text = render_fabric_host(spec, host.hostname, host.nics, host.nccl).create
    head, rest = text.split("# --- subnet manager", 1)
    return relocated(head + "# --- subnet manager" + rest.split("# --- the settings", 1)[0] + "finish\n", where)


def port_guids(spec) -> dict[str, dict[str, str]]:
    """Host -> device -> a port GUID of its own, as the hosts' fabric steps would report them."""
    return {h.hostname: {n.device: f"0x{i:04x}{n.rail:012x}" for n in p.nics} for i, (p, h) in enumerate(spec.hosts())}


def relocated(text: str, where) -> str:
    """A subnet manager host's script with its files under `where`."""
    for path, name in ((OPENSM_CONF, "opensm.conf"), (PARTITIONS_CONF, "partitions.conf"),
                       (SHARED_PARTITIONS, "gpucluster-shared-partitions.conf"),
                       (OPENSM_UNIT, "gpucluster-opensm.service"), ("/var/lib/gpucluster/owed", "owed"),
                       (OPENSM_LOG, "opensm.log")):
        text = text.replace(path, f"{where}/etc/{name}" if name not in ("owed", "opensm.log") else f"{where}/{name}")
    return text


def test_opensm_killed_anywhere_runs_the_partitions_on_disk(dev_data, tmp_path):
    """From no partitions to one and back: OpenSM restarted (after a daemon-reload) whenever a cut left it
    running an older opensm.conf or unit, hung up on (it re-reads its partitions) whenever a cut left it running
    older partitions, and started when a cut left it stopped."""
    run = sm_host(tmp_path)
    scripts = [sm_section(spec_for(json.loads(json.dumps(dev_data)), variant), tmp_path)
               for variant in ("infiniband", "infiniband-partitions")]

    def runs_the_disk() -> bool:
        files = [tmp_path / "etc" / n for n in ("opensm.conf", "partitions.conf", "gpucluster-opensm.service")]
        disk = subprocess.run("cat etc/opensm.conf etc/partitions.conf | md5sum; md5sum < etc/gpucluster-opensm.service",
                              shell=True, cwd=tmp_path, capture_output=True, text=True).stdout
        return all(f.exists() for f in files) and (tmp_path / "loaded").read_text() == disk
    def check(k):
        assert (tmp_path / "active-gpucluster-opensm").exists(), f"step {k}: OpenSM left stopped"
        assert runs_the_disk(), f"step {k}: OpenSM runs older files than those on disk"
        assert not (tmp_path / "owed").exists() or not any((tmp_path / "owed").iterdir()), k
    for target, other in ((scripts[1], scripts[0]), (scripts[0], scripts[1])):
        cut_everywhere(run, target, lambda other=other: ok(run(other)), check)


def test_the_partitions_step_killed_anywhere_leaves_opensm_on_the_file_on_disk(tmp_path):
    """Issue 58: the tenants' partitions step, from one GUID set to another (a pool handed to the other tenant)
    and back, cut at every line: OpenSM is hung up on whenever a cut left it on older partitions."""
    run = sm_host(tmp_path)
    spec = isolated_example()
    setup = sm_section(spec, tmp_path, "gpu-prod-01")
    guids = port_guids(spec)
    moved = isolated_example(change=hand_b_to_team_a)
    steps = [relocated(render_partition_step(s, "gpu-prod-01", guids).create, tmp_path) for s in (spec, moved)]

    ok(run(setup))

    def check(k):
        running = (tmp_path / "running.partitions").read_text()
        assert running == (tmp_path / "etc" / "partitions.conf").read_text(), f"step {k}: OpenSM runs older partitions"
        assert "tenant-team-a" in running, k
        assert not (tmp_path / "owed").exists() or not any((tmp_path / "owed").iterdir()), k
    for target, other in ((steps[1], steps[0]), (steps[0], steps[1])):
        cut_everywhere(run, target, lambda other=other: ok(run(other)), check)


def test_turning_infiniband_isolation_off_gives_the_shared_partitions_back_at_the_end(tmp_path):
    """Issue 58: turned off in the same run as a new shared partition. The subnet manager's own step (it runs:
    its partitions changed) leaves the tenants' file to the partitions step and keeps what it wants beside it;
    the partitions step's delete (after the tenants' Nodes are drained) puts that in, cut at every line:
    OpenSM runs the file on disk, and in the end every port is back in the new shared partitions."""
    run = sm_host(tmp_path)
    spec = isolated_example()

    def flat_with_storage_net(d):
        d["fabric"]["infiniband"]["isolate_dedicated_pools"] = False
        d["fabric"]["infiniband"]["partitions"].append({"name": "ipoib-storage", "pkey": 0x0a02})
    flat = isolated_example(change=flat_with_storage_net)

    def sm_step(s):
        return sm_section(s, tmp_path, "gpu-prod-01")
    step = render_partition_step(spec, "gpu-prod-01", port_guids(spec))
    create, delete = (relocated(s, tmp_path) for s in (step.create, step.delete))
    conf, kept = tmp_path / "etc" / "partitions.conf", tmp_path / "etc" / "gpucluster-shared-partitions.conf"

    def isolated_then_turned_off():
        ok(run(sm_step(spec)))
        ok(run(create))
        assert "tenant-team-a" in conf.read_text()
        left = run(sm_step(flat))
        assert left.returncode == 0 and "partitions.conf holds the tenants' partitions" in left.stdout, left.stdout
        assert "tenant-team-a" in conf.read_text() and "ipoib-storage" in kept.read_text()
    isolated_then_turned_off()
    gone = run(delete)
    assert gone.returncode == 0 and "re-read" in gone.stdout, gone.stdout + gone.stderr
    assert conf.read_text() == kept.read_text() and kept.read_text().rstrip("\n") == render_partitions(flat)
    again = run(delete)
    assert again.returncode == 0 and again.stdout.endswith(": 0 change(s)\n"), again.stdout

    def check(k):
        running = (tmp_path / "running.partitions").read_text()
        assert running == conf.read_text(), f"step {k}: OpenSM runs older partitions"
        assert running.rstrip("\n") == render_partitions(flat), f"step {k}: not the shared partitions"
        assert not (tmp_path / "owed").exists() or not any((tmp_path / "owed").iterdir()), k
    assert len(cut_everywhere(run, delete, isolated_then_turned_off, check)) > 2
    # the subnet manager's step, where it runs again, writes the file itself and drops what it kept
    ok(run(sm_step(flat)))
    assert not kept.exists() and conf.read_text().rstrip("\n") == render_partitions(flat)


def ok(out: subprocess.CompletedProcess) -> None:
    assert out.returncode == 0, (out.stdout, out.stderr)
