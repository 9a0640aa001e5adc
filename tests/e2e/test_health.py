"""GPU health detection on the real control plane: node-problem-detector (detector.py), with the plan's own
monitors against a KWOK GPU node, fed the driver's real XID lines."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator

import pytest

from components.k8s import health_nvml
from components.k8s.health import BURN_IN_CONDITION, NAME

from .conftest import Cluster, wait_for
from .detector import FELL_OFF, JOB_XID, Detector

pytestmark = pytest.mark.e2e


@pytest.fixture
def detector(clean: Cluster, tmp_path: Path) -> Iterator[Detector]:
    node = sorted(h.hostname for _, h in clean.spec.hosts())[0]
    d = Detector(clean, node, tmp_path)
    d.start()
    try:
        yield d
    finally:
        d.forget()


def test_a_hardware_xid_sets_the_fault_condition_and_a_jobs_xid_is_only_an_event(detector: Detector):
    healthy = detector.wait_condition("False", "NoGpuHardwareXid")
    assert healthy["message"] == "no GPU hardware XID in the kernel log since boot"
    detector.kernel(JOB_XID)
    wait_for(lambda: "GpuXid" in detector.events(), 60, lambda: f"events: {detector.events()}")
    assert detector.condition()["status"] == "False"                   # a job's XID leaves the GPU in service
    detector.kernel(FELL_OFF)
    fault = detector.wait_condition("True", "GpuXid79")
    assert fault["message"] == FELL_OFF[FELL_OFF.index("NVRM:"):]      # the driver's own line says which GPU


def test_a_restarted_detector_finds_the_fault_again_until_the_kernel_log_is_cleared(detector: Detector):
    detector.wait_condition("False", "NoGpuHardwareXid")
    detector.kernel(FELL_OFF)
    detector.wait_condition("True", "GpuXid79")
    detector.stop()
    detector.start()           # a new detector (a rolled DaemonSet, a restarted pod) reads the log back
    time.sleep(3)
    assert detector.wait_condition("True", "GpuXid79")
    detector.reboot()                          # a new kernel log
    detector.wait_condition("False", "NoGpuHardwareXid")


def test_the_burn_in_monitor_holds_a_fault_past_the_reboot_until_a_burn_in_passes(detector: Detector):
    healthy = detector.wait_condition("False", "NoFaultSinceBurnIn", BURN_IN_CONDITION)
    assert healthy["message"] == "no GPU hardware fault after the last passing burn-in"
    detector.burn_in()                         # the verdict that admitted the node
    detector.kernel(FELL_OFF)
    held = detector.wait_condition("True", "FaultSinceBurnIn", BURN_IN_CONDITION)
    assert held["message"].endswith(FELL_OFF[FELL_OFF.index("NVRM:"):])
    detector.reboot()
    detector.wait_condition("False", "NoGpuHardwareXid")
    time.sleep(3)
    assert detector.condition(BURN_IN_CONDITION)["status"] == "True"      # the reboot alone does not release it
    detector.burn_in()
    detector.wait_condition("False", "NoFaultSinceBurnIn", BURN_IN_CONDITION)


@pytest.mark.parametrize("name", [NAME, health_nvml.NAME])
def test_each_detector_runs_on_every_gpu_node(clean: Cluster, name: str):
    """The NVML detector's pods pass the RuntimeClass admission with the GPU Operator's runtime class."""
    gpu_nodes = {h.hostname for _, h in clean.spec.hosts()}
    pods = lambda: {p["spec"].get("nodeName") for p in clean.cp.get(  # noqa: E731
        "pods", namespace="kube-system", selector=f"app.kubernetes.io/name={name}")["items"]}
    wait_for(lambda: pods() == gpu_nodes, 60, lambda: f"{name} pods on {sorted(pods())}, GPU nodes {sorted(gpu_nodes)}")
