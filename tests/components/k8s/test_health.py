"""GPU health detection: node-problem-detector's kernel monitor over real XID lines, on every GPU node."""

from __future__ import annotations

import json
import re

import pytest

from components.k8s.health import CONDITION, MONITOR, monitor_config, render_gpu_health
from components.k8s.labels import POOL_LABEL
from components.spec import ClusterSpec
from components.spec import load_spec
from tests.conftest import ROOT, problems_of

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


def test_a_hardware_xid_in_real_kernel_lines_sets_the_fault_condition_and_every_xid_is_an_event(dev):
    config = monitor_config(dev)
    got = {line: fired(config, _message(line)) for line in SAMPLE}
    assert {reason for rules in got.values() for kind, reason in rules if kind == "permanent"} == {
        "GpuXid79", "GpuXid94", "GpuXid95"}
    for line, rules in got.items():
        if "Xid" not in line:
            assert rules == [], line                                 # the driver's other lines: nothing
            continue
        xid = int(re.search(r"\): (\d+),", line).group(1))
        expected = [("temporary", "GpuXid")]
        if xid in dev.kubernetes.health.fault_xids:
            expected.append(("permanent", f"GpuXid{xid}"))
        assert rules == expected, line
    assert all(r["condition"] == CONDITION for r in config["rules"] if r["type"] == "permanent")


def test_the_fault_list_comes_from_the_spec_and_a_change_rolls_the_detector(dev):
    narrow = dev.model_copy(update={"kubernetes": dev.kubernetes.model_copy(update={
        "health": dev.kubernetes.health.model_copy(update={"fault_xids": [79, 79, 48]})})})
    assert [r["reason"] for r in monitor_config(narrow)["rules"]] == ["GpuXid", "GpuXid48", "GpuXid79"]
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
    [container] = {m.role: m.obj for m in render_gpu_health(prod)}["gpu-health"]["spec"]["template"]["spec"][
        "containers"]
    assert container["image"] == (f"{prod.kubernetes.image_registry}/registry.k8s.io/node-problem-detector/"
                                  "node-problem-detector:v1.34.0")


@pytest.mark.parametrize("xids,problem", [
    ([], "kubernetes.health.fault_xids"), ([0], "kubernetes.health.fault_xids[0]"),
    (["79"], "kubernetes.health.fault_xids[0]"), ([1000], "kubernetes.health.fault_xids[0]")])
def test_a_fault_list_that_is_empty_or_holds_no_xid_is_refused_naming_the_field(dev_data, xids, problem):
    dev_data.setdefault("kubernetes", {})["health"] = {"fault_xids": xids}
    assert any(p.startswith(problem) or f"{problem}:" in p for p in problems_of(dev_data)), problems_of(dev_data)


def test_the_preparations_preflight_and_the_detector_read_xid_lines_alike(dev):
    """The XID pattern both use, run by GNU grep -E as the preflight runs it over dmesg: every device form the
    driver prints (the MIG instance form and the older one without `PCI:` included)."""
    import subprocess

    from components.spec.hardware import HARDWARE_XIDS, xid_pattern
    out = subprocess.run(["grep", "-E", xid_pattern(HARDWARE_XIDS)], input="\n".join(SAMPLE) + "\n",
                         capture_output=True, text=True)
    assert [re.search(r"\): (\d+),", line).group(1) for line in out.stdout.splitlines()] == \
        ["79", "94", "95", "94", "79"]
    legacy = subprocess.run(["grep", "-E", xid_pattern([14])], input="\n".join(SAMPLE) + "\n",
                            capture_output=True, text=True)
    assert legacy.stdout == "NVRM: Xid (0000:03:00): 14, Channel 00000001\n"
