"""GPU health detection: node-problem-detector's kernel monitor over real XID lines, on every GPU node."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import kubernetes_validate
import pytest

from components.k8s.images import through_mirror
from components.k8s.health.detector import (BLIND_CHECK, BLIND_CONDITION, BURN_IN_CHECK, BURN_IN_MONITOR, CONDITION, MONITOR,
                                   RESET_CONDITION, PORT_CHECK, PORT_MONITOR, PORTS_CONFIG, PORTS_FILE, burn_in_check, burn_in_monitor_config, expected_ports, monitor_config,
                                   port_check, port_monitor_config, render_gpu_health)
from components.records import RESULT, VERDICT_FILE
from components.k8s.labels import POOL_LABEL
from components.spec import ClusterSpec
from components.spec import load_spec
from tests.conftest import ROOT, problems_of
from tests.doubles import DOUBLE_BIT_XID
from components.nodes.node_pool import NodePoolArgs, render_pool_preparation
from components.records import MAINTENANCE, MAINTENANCE_MAX_S

# Real lines, each as its source prints it: leptonai/gpud's docs (dmesg --ctime; an XID 79 with the NVSwitch
# SXid it came with), NVIDIA's open-gpu-kernel-modules (kern_gpu_ga100.c's comment on the error-containment XIDs
# 94 and 95, with the MIG instance form `PCI:... GPU-I:05`), an older driver's form without `PCI:` (gpud's xid
# regex comment, from NVIDIA's XID document), NVIDIA/NVSentinel's syslog monitor tests and fault injection.
SAMPLE = (ROOT / "tests" / "samples" / "xid_kernel_log.txt").read_text().splitlines()


def _message(line: str) -> str:
    """The kernel message as node-problem-detector's kmsg reader has it: without dmesg's or syslog's prefix."""
    return line[line.index("NVRM:"):]


def fired(config: dict, message: str) -> list[tuple[str, str]]:
    """(rule type, reason) of every rule that matches a new message: the detector matches each rule's pattern
    against the end of its log buffer (pkg/systemlogmonitor/log_buffer.go: `expr + \\z`)."""
    return [(r["type"], r["reason"]) for r in config["rules"] if re.search(r["pattern"] + r"\Z", message)]


def load_stack(name: str) -> ClusterSpec:
    return load_spec(ROOT / "stacks" / f"{name}.yaml")


@pytest.fixture(scope="module")
def dev() -> ClusterSpec:
    return load_stack("dev")


def test_a_hardware_xid_in_real_kernel_lines_sets_the_condition_of_nvidias_resolution_and_every_xid_is_an_event(
        dev):
    """79 (fell off the bus) and 95 (uncontained ECC) need a reset or a reboot: GpuResetRequired. 94 (contained
    ECC: only the faulting process dies) and the jobs' own 13 and 31 are events only."""
    config = monitor_config(dev)
    got = {line: fired(config, _message(line)) for line in SAMPLE}
    assert {reason for rules in got.values() for kind, reason in rules if kind == "permanent"} == {
        "GpuXid79", "GpuXid95"}
    conditions = {r["reason"]: r["condition"] for r in config["rules"] if r["type"] == "permanent"}
    assert conditions["GpuXid79"] == conditions["GpuXid95"] == conditions["GpuXid64"] == RESET_CONDITION
    assert conditions["GpuXid48"] == conditions["GpuXid74"] == CONDITION
    assert not {"GpuXid63", "GpuXid92", "GpuXid94", "GpuXid13"} & set(conditions)
    for line, rules in got.items():
        if "Xid" not in line:
            assert rules == [], line                                 # the driver's other lines: nothing
            continue
        xid = int(re.search(r"\): (\d+),", line).group(1))
        expected = [("temporary", "GpuXid")]
        if xid in dev.kubernetes.health.fault_xids:
            expected.append(("permanent", f"GpuXid{xid}"))
        assert rules == expected, line


def test_the_fault_list_comes_from_the_spec_and_a_change_rolls_the_detector(dev):
    narrow = dev.model_copy(update={"kubernetes": dev.kubernetes.model_copy(update={
        "health": dev.kubernetes.health.model_copy(update={"fault_xids": [79, 79, 48]})})})
    assert [(r["reason"], r.get("condition")) for r in monitor_config(narrow)["rules"]] == [
        ("GpuXid", None), ("GpuXid48", CONDITION), ("GpuXid79", RESET_CONDITION)]
    assert "(48)," in burn_in_check(narrow) and "79" not in burn_in_check(narrow).split("fault=")[1].split("\n")[0]
    before, after = ({m.role: m.obj for m in render_gpu_health(s)} for s in (dev, narrow))
    config = json.loads(after["gpu-health-config"]["data"][MONITOR])
    assert config == monitor_config(narrow) and config["plugin"] == "kmsg" and config["logPath"] == "/dev/kmsg"
    annotation = lambda objs: objs["gpu-health"]["spec"]["template"]["metadata"]["annotations"]  # noqa: E731
    assert annotation(before) != annotation(after)          # the detector reads its config at start only


def test_the_detector_runs_on_every_gpu_node_whatever_it_is_tainted_with(dev):
    objs = {m.role: m.obj for m in render_gpu_health(dev)}
    pod = objs["gpu-health"]["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": POOL_LABEL, "operator": "Exists"}]}]
    assert pod["tolerations"] == [{"operator": "Exists", "effect": "NoSchedule"},
                                  {"operator": "Exists", "effect": "NoExecute"}]
    # it requests nothing: beside a job that took the node's whole allocatable it still lands, preempting no one
    assert [c.get("resources") for c in pod["containers"]] == [None]
    assert pod["priorityClassName"] == "system-node-critical"
    binding = objs["gpu-health-binding"]
    assert binding["roleRef"]["name"] == "system:node-problem-detector"      # the apiserver's bootstrap role
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": pod["serviceAccountName"],
                                    "namespace": "kube-system"}]


def test_an_air_gapped_stack_pulls_the_detector_through_its_mirror():
    prod = load_stack("prod")
    [container] = through_mirror({m.role: m.obj for m in render_gpu_health(prod)}["gpu-health"], prod)["spec"][
        "template"]["spec"]["containers"]
    assert container["image"] == (f"{prod.kubernetes.image_registry}/registry.k8s.io/node-problem-detector/"
                                  "node-problem-detector:v1.34.0")


@pytest.mark.parametrize("xids,problem", [
    ([], "kubernetes.health.fault_xids"), ([0], "kubernetes.health.fault_xids[0]"),
    (["79"], "kubernetes.health.fault_xids[0]"), ([1000], "kubernetes.health.fault_xids[0]"),
    ([79, 13], "kubernetes.health.fault_xids[1]: XID 13 (graphics engine exception) is the job's own fault"),
    ([94], "kubernetes.health.fault_xids[0]: XID 94 (contained ECC error) is the job's own fault")])
def test_a_fault_list_that_is_empty_or_holds_no_xid_is_refused_naming_the_field(dev_data, xids, problem):
    dev_data.setdefault("kubernetes", {})["health"] = {"fault_xids": xids}
    assert any(p.startswith(problem) or f"{problem}:" in p for p in problems_of(dev_data)), problems_of(dev_data)


def test_the_preparations_preflight_and_the_detector_read_xid_lines_alike(dev):
    """The XID pattern both use, run by GNU grep -E as the preflight runs it over dmesg: every device form the
    driver prints (the MIG instance form and the older one without `PCI:` included)."""
    import subprocess

    from components.spec.hardware import xid_pattern
    out = subprocess.run(["grep", "-E", xid_pattern(dev.kubernetes.health.fault_xids)],
                         input="\n".join(SAMPLE) + "\n", capture_output=True, text=True)
    assert [re.search(r"\): (\d+),", line).group(1) for line in out.stdout.splitlines()] == ["79", "95", "79"]
    legacy = subprocess.run(["grep", "-E", xid_pattern([14])], input="\n".join(SAMPLE) + "\n",
                            capture_output=True, text=True)
    assert legacy.stdout == "NVRM: Xid (0000:03:00): 14, Channel 00000001\n"


# --- the burn-in monitor: a fault outlives the reboot until a burn-in passes after it -------------------------

FELL_OFF = next(line for line in SAMPLE if "): 79, pid=" in line)    # needs a reset (a reboot): no burn-in
DBE = DOUBLE_BIT_XID                                                  # needs NVIDIA's diagnosis: a burn-in
JOB_XID = next(line for line in SAMPLE if "): 13, pid=" in line)


class Host:
    """The check as node-problem-detector runs it (the rule's path and args, the state dir and kernel log of a
    host here), with real bash and grep over the driver's real lines."""

    def __init__(self, tmp_path, spec: ClusterSpec):
        self.script = tmp_path / BURN_IN_CHECK
        self.script.write_text(burn_in_check(spec))
        self.script.chmod(0o755)
        self.state, self.log, self.boot = tmp_path / "state", tmp_path / "kern.log", tmp_path / "boot_id"
        self.log.write_text("")
        self.boot.write_text("b1\n")

    def check(self) -> tuple[int, str]:
        rule = burn_in_monitor_config()["rules"][0]
        args = [str(self.state), str(self.log), str(self.boot)]
        assert len(rule["args"]) == len(args)
        out = subprocess.run([str(self.script), *args], capture_output=True, text=True, timeout=10)
        return out.returncode, out.stdout.strip()

    def kernel(self, line: str) -> None:
        with self.log.open("a") as f:
            f.write(line + "\n")

    def burn_in(self, verdict: str = "passed") -> None:
        time.sleep(0.01)              # the verdict is written after the record, as a burn-in run later is
        self.state.mkdir(exist_ok=True)
        (self.state / "burn-in").write_text(f"{RESULT}{verdict}\n")

    def reboot(self, boot: str) -> None:
        self.log.write_text("")
        self.boot.write_text(boot + "\n")


@pytest.fixture
def host(tmp_path, dev) -> Host:
    return Host(tmp_path, dev)


def test_a_host_without_faults_needs_no_burn_in_and_a_jobs_xid_changes_nothing(host):
    host.burn_in()
    assert host.check() == (0, "no GPU hardware fault recorded on this host")
    host.kernel(JOB_XID)
    assert host.check() == (0, "no GPU hardware fault recorded on this host")
    assert not (host.state / "gpu-fault").exists()


def test_a_fault_needs_a_burn_in_after_it_even_across_the_reboot_that_clears_the_log(host):
    host.burn_in()                                              # the burn-in that admitted the node
    host.kernel(DBE)
    code, message = host.check()
    assert code == 1 and message.endswith(_message(DBE)), message   # the condition names the GPU
    host.reboot("b2")                                           # the kernel log is clean again
    assert host.check()[0] == 1
    host.burn_in("failed: dcgmi diag -r 2 failed")
    assert host.check()[0] == 1
    host.burn_in()
    assert host.check() == (0, "a burn-in passed after the last GPU hardware fault")


def test_each_new_fault_needs_a_new_burn_in_and_a_rerun_check_writes_nothing(host):
    host.kernel(DBE)
    host.burn_in()                      # after a GPU reset, before any reboot
    assert host.check()[0] == 1         # the record is written now, after that verdict: a fault it did not see
    host.burn_in()
    assert host.check()[0] == 0
    record = host.state / "gpu-fault"
    before = (record.read_text(), record.stat().st_mtime_ns)
    assert host.check()[0] == 0 and (record.read_text(), record.stat().st_mtime_ns) == before
    host.kernel(DBE)                # one more in the same boot
    assert host.check()[0] == 1


def test_an_xid_that_needs_only_a_reset_records_no_fault_for_a_burn_in(host):
    host.burn_in()
    host.kernel(FELL_OFF)                # GpuResetRequired holds the node until the reboot; no burn-in after it
    assert host.check() == (0, "no GPU hardware fault recorded on this host")
    assert not (host.state / "gpu-fault").exists()


def test_a_pool_without_burn_in_is_released_by_the_reboot_alone(host):
    host.kernel(DBE)
    code, message = host.check()
    assert code == 0 and "keeps no burn-in verdict" in message       # the kernel monitor's condition holds it


def blind(tmp_path, state) -> tuple[int, str]:
    """The blind check as the detector runs it (its rule's args), over `state`."""
    script = tmp_path / BLIND_CHECK
    (config,) = [m.obj for m in render_gpu_health(load_stack("dev")) if m.role == "gpu-health-config"]
    script.write_text(config["data"][BLIND_CHECK])
    rule = burn_in_monitor_config()["rules"][1]
    assert rule["condition"] == BLIND_CONDITION and rule["path"].endswith(BLIND_CHECK) and len(rule["args"]) == 1
    out = subprocess.run(["bash", str(script), str(state)], capture_output=True, text=True, timeout=10)
    return out.returncode, out.stdout.strip()


def test_a_check_that_cannot_read_the_host_keeps_its_last_verdict_and_says_it_is_blind(host, tmp_path):
    """Never Unknown (which the quarantine rule holds as unhealthy, fleet-wide for a broken image): a healthy node
    stays in service, a faulty one stays held, and GpuHealthCheckBlind (no quarantine) says why."""
    host.burn_in()
    assert host.check() == (0, "no GPU hardware fault recorded on this host")
    host.boot.unlink()
    code, message = host.check()
    assert (code, message) == (0, "no GPU hardware fault recorded on this host (no new reading: cannot read the "
                                  f"boot id from {host.boot})")
    assert blind(tmp_path, host.state) == (1, "health checks without a new reading, their last verdicts kept: "
                                              f"gpu-burn-in-last: cannot read the boot id from {host.boot}")
    host.boot.write_text("b1\n")
    host.kernel(DBE)
    assert host.check()[0] == 1
    assert blind(tmp_path, host.state) == (0, "every health check reads its inputs")
    host.log.unlink()
    code, message = host.check()
    assert code == 1 and message.endswith(f"(no new reading: cannot read the kernel log {host.log})"), message


def test_a_check_that_never_read_its_inputs_reports_healthy_as_the_rules_default(host, tmp_path):
    host.log.unlink()
    assert host.check() == (0, f"no reading yet: cannot read the kernel log {host.log}")
    assert blind(tmp_path, host.state)[0] == 1


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed (.ci/run installs it)")
def test_every_script_of_the_detector_passes_shellcheck(dev, tmp_path):
    (config,) = [m.obj for m in render_gpu_health(dev) if m.role == "gpu-health-config"]
    scripts = {name: text for name, text in config["data"].items() if name.endswith(".sh")}
    assert set(scripts) == {BURN_IN_CHECK, PORT_CHECK, BLIND_CHECK}
    for name, text in scripts.items():
        (tmp_path / name).write_text(text)
        out = subprocess.run(["shellcheck", "-S", "style", str(tmp_path / name)], capture_output=True, text=True)
        assert out.returncode == 0, out.stdout


def test_the_detector_runs_the_check_with_the_hosts_state_and_kernel_log(dev):
    objs = {m.role: m.obj for m in render_gpu_health(dev)}
    pod = objs["gpu-health"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert f"--config.custom-plugin-monitor=/config/{BURN_IN_MONITOR},/config/{PORT_MONITOR}" in container["command"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    rule = burn_in_monitor_config()["rules"][0]
    assert rule["path"] == f"{mounts['config']['mountPath']}/{BURN_IN_CHECK}"
    assert volumes["config"]["configMap"]["defaultMode"] == 0o555          # executable, as the detector runs it
    state = rule["args"][0]
    assert mounts["state"]["mountPath"] == volumes["state"]["hostPath"]["path"] == state
    assert not mounts["state"].get("readOnly")                             # the record is written there
    assert f"{state}/burn-in" == VERDICT_FILE                              # where the burn-in writes its verdict
    assert json.loads(objs["gpu-health-config"]["data"][BURN_IN_MONITOR]) == burn_in_monitor_config()


def test_the_detectors_objects_are_valid_kubernetes(dev):
    """Strict schema of the stack's Kubernetes version: the hostPath type, the executable config mode."""
    for m in render_gpu_health(dev):
        kubernetes_validate.validate(m.obj, dev.kubernetes.version, strict=True)


# --- the fabric port monitor: a port down or flapping holds the node until a burn-in after it -----------------

class Ports:
    """A host's /sys/class/infiniband as the RDMA core writes it (port state "4: ACTIVE", phys_state "5: LinkUp",
    the link_downed counter), the plugin's script as the detector runs it, and the burn-in plugin beside it."""

    def __init__(self, tmp_path, spec: ClusterSpec, node: str = "gpu-dev-01"):
        self.spec, self.node, self.sysfs = spec, node, tmp_path / "infiniband"
        self.script = tmp_path / PORT_CHECK
        self.script.write_text(port_check())
        self.script.chmod(0o755)
        self.ports = tmp_path / PORTS_FILE
        self.ports.write_text(expected_ports(spec))
        self.host = Host(tmp_path, spec)
        for dev in ("mlx5_0", "mlx5_1"):
            self.set(dev, "4: ACTIVE", "5: LinkUp", 0)

    def set(self, dev: str, state: str | None = None, phys: str | None = None, downed: int | None = None) -> None:
        port = self.sysfs / dev / "ports" / "1"
        (port / "counters").mkdir(parents=True, exist_ok=True)
        for name, value in (("state", state), ("phys_state", phys), ("counters/link_downed", downed)):
            if value is not None:
                (port / name).write_text(f"{value}\n")

    def check(self, node: str | None = None) -> tuple[int, str]:
        rule = port_monitor_config()["rules"][0]
        assert rule["args"][1] == "/sys/class/infiniband" and rule["args"][2].endswith(PORTS_FILE)
        env = {"PATH": "/usr/bin:/bin", **({"NODE_NAME": node or self.node} if node != "" else {})}
        out = subprocess.run([str(self.script), str(self.host.state), str(self.sysfs), str(self.ports)],
                             capture_output=True, text=True, timeout=10, env=env)
        return out.returncode, out.stdout.strip()


@pytest.fixture
def ports(tmp_path, dev) -> Ports:
    p = Ports(tmp_path, dev)
    p.host.burn_in()
    return p


def test_the_expected_ports_are_each_hosts_rdma_nics():
    assert expected_ports(load_stack("dev")) == "gpu-dev-01 mlx5_0/1 mlx5_1/1\ngpu-dev-02 mlx5_0/1 mlx5_1/1\n"


def test_active_ports_are_healthy_and_a_port_down_holds_the_node_until_it_is_back_and_burned_in(ports):
    assert ports.check() == (0, "every fabric port of gpu-dev-01 is active")
    ports.set("mlx5_1", "1: DOWN", "3: Disabled", 1)
    code, message = ports.check()
    assert code == 1 and message == "fabric port down or flapping on gpu-dev-01: mlx5_1/1: DOWN/Disabled; " \
                                    "mlx5_1/1: link went down 1 time(s)"
    assert ports.host.check() == (1, f"no burn-in passed since this GPU fault: {message}")
    ports.host.burn_in()                 # a burn-in while the port is still down does not count
    assert ports.check()[0] == 1 and ports.host.check()[0] == 1
    ports.set("mlx5_1", "4: ACTIVE", "5: LinkUp")
    assert ports.check()[0] == 0
    assert ports.host.check()[0] == 1    # back, but not yet burned in
    ports.host.burn_in()
    assert ports.host.check() == (0, "a burn-in passed after the last GPU hardware fault")


def test_a_port_that_flapped_between_two_looks_is_caught_by_its_counter(ports):
    ports.check()
    ports.set("mlx5_0", downed=3)        # went down and came back three times; ACTIVE again by now
    code, message = ports.check()
    assert code == 1 and message.endswith("mlx5_0/1: link went down 3 time(s)")
    assert ports.check()[0] == 0         # the condition clears; the record holds the node for a burn-in
    assert ports.host.check()[0] == 1


def test_a_reboot_that_resets_the_counters_is_no_flap(ports):
    ports.set("mlx5_0", downed=7)
    ports.check()
    ports.host.burn_in()
    ports.set("mlx5_0", downed=0)
    assert ports.check()[0] == 0 and ports.host.check()[0] == 0


@pytest.mark.parametrize("node, code, message", [
    ("gpu-dev-09", 0, "no fabric port is expected on gpu-dev-09"),
    ("", 0, "no reading yet: NODE_NAME is not set: cannot tell this node's ports")])
def test_a_node_without_ports_or_a_name_is_no_fault(ports, node, code, message):
    assert ports.check(node) == (code, message)


def test_a_roll_under_way_fences_the_port_check_and_its_own_bounces_are_no_flap(ports):
    """The roll writes the maintenance marker before it bounces links and, once its ports are up again, their
    counters as the baseline (the roll's _UNFENCE, as rendered) before it lifts the marker: the node comes back
    from its roll without a fault recorded."""
    assert ports.check()[0] == 0
    marker = ports.host.state / Path(MAINTENANCE).name
    marker.write_text(f"roll {int(time.time())}\n")
    ports.set("mlx5_1", "1: DOWN", "3: Disabled", 1)            # the roll's MTU change bounces the link
    code, message = ports.check()
    assert code == 0 and message.endswith("(roll under way on gpu-dev-01: its ports are not judged until it ends)")
    assert not (ports.host.state / "fabric-fault").exists()
    ports.set("mlx5_1", "4: ACTIVE", "5: LinkUp", 2)             # up again, having gone down twice
    out = _roll_end(ports)
    assert out.returncode == 0, out.stdout + out.stderr
    assert not marker.exists()
    assert ports.check() == (0, "every fabric port of gpu-dev-01 is active")
    assert ports.host.check()[0] == 0                            # nothing for a burn-in to follow


def _roll_end(ports, wait_s: int = 180) -> subprocess.CompletedProcess:
    """The roll's last part, as rendered, over this host's stand-ins for sysfs and the state directory."""
    roll_end = [p for p in render_pool_preparation(NodePoolArgs.from_spec(ports.spec, ports.spec.node_pools[0]))
                .roll.split("\n# --- ") if p.startswith("the health monitors again")]
    assert len(roll_end) == 1
    script = ("set -euo pipefail\nnote() { echo \"$*\"; }\nfail() { echo \"$*\"; exit 1; }\n# --- " + roll_end[0]) \
        .replace("/sys/class/infiniband", str(ports.sysfs)).replace("/var/lib/gpucluster", str(ports.host.state)) \
        .replace("$(seq 180)", f"$(seq {wait_s})")
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)


def test_a_port_still_down_after_the_roll_is_the_monitors_to_judge_not_the_rolls(ports):
    marker = ports.host.state / Path(MAINTENANCE).name
    marker.write_text(f"roll {int(time.time())}\n")
    ports.set("mlx5_1", "1: DOWN", "3: Disabled", 1)
    out = _roll_end(ports, wait_s=1)
    assert out.returncode == 0 and "fabric port mlx5_1/1 is not active 180 s after the roll" in out.stdout, out
    assert not marker.exists()
    assert ports.check()[0] == 1                              # a real fault: quarantined as any other


def test_a_marker_left_by_a_roll_that_died_fences_nothing_after_its_time(ports):
    marker = ports.host.state / Path(MAINTENANCE).name
    marker.write_text(f"roll {int(time.time()) - MAINTENANCE_MAX_S - 1}\n")
    ports.set("mlx5_1", "1: DOWN", "3: Disabled")
    assert ports.check()[0] == 1


def test_a_port_check_that_cannot_read_its_inputs_keeps_the_last_verdict(ports):
    ports.set("mlx5_1", "1: DOWN", "3: Disabled")
    assert ports.check()[0] == 1
    ports.ports.unlink()                  # its ConfigMap gone
    code, message = ports.check()
    assert code == 1 and message.endswith(f"(no new reading: cannot read {ports.ports})"), message
    ports.ports.write_text(expected_ports(ports.spec))
    ports.set("mlx5_1", "4: ACTIVE", "5: LinkUp")
    assert ports.check()[0] == 0
    shutil.rmtree(ports.sysfs)            # no RDMA device at all: sysfs not mounted, or the driver not loaded
    code, message = ports.check()
    assert code == 0 and "(no new reading: cannot read " in message, message


def test_a_missing_rdma_device_is_a_fault(ports):
    shutil.rmtree(ports.sysfs / "mlx5_1")
    assert ports.check() == (1, "fabric port down or flapping on gpu-dev-01: mlx5_1/1: no such port")


def test_the_detector_runs_the_port_check_with_the_hosts_sysfs_and_its_own_node_name(dev):
    objs = {m.role: m.obj for m in render_gpu_health(dev)}
    (container,) = objs["gpu-health"]["spec"]["template"]["spec"]["containers"]
    assert f"--config.custom-plugin-monitor=/config/{BURN_IN_MONITOR},/config/{PORT_MONITOR}" in container["command"]
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in container["env"]
    assert container["securityContext"] == {"privileged": True}      # reads the host's /sys
    assert objs["gpu-health-ports"]["metadata"]["name"] == PORTS_CONFIG
    assert objs["gpu-health-ports"]["data"] == {PORTS_FILE: expected_ports(dev)}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    rule = port_monitor_config()["rules"][0]
    assert rule["args"][2] == f"{mounts['ports']}/{PORTS_FILE}"
