"""GPU health detection on the real control plane: node-problem-detector (detector.py), with the plan's own
monitors against a KWOK GPU node, fed the driver's real XID lines."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator

import pytest

from components.k8s.health import nvml as health_nvml
from components.k8s.health.detector import BURN_IN_CONDITION, NAME, RESET_CONDITION

from .conftest import Cluster, wait_for
from .detector import DBE, FELL_OFF, JOB_XID, Detector

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


def test_each_xid_sets_the_condition_of_its_resolution_and_a_jobs_xid_is_only_an_event(detector: Detector):
    healthy = detector.wait_condition("False", "NoGpuHardwareXid")
    assert healthy["message"] == "no GPU hardware XID in the kernel log since boot"
    detector.wait_condition("False", "NoGpuResetPending", RESET_CONDITION)
    detector.kernel(JOB_XID)
    wait_for(lambda: "GpuXid" in detector.events(), 60, lambda: f"events: {detector.events()}")
    assert detector.condition()["status"] == "False"                   # a job's XID leaves the GPU in service
    detector.kernel(FELL_OFF)                                          # NVIDIA: restart the machine
    reset = detector.wait_condition("True", "GpuXid79", RESET_CONDITION)
    assert reset["message"] == FELL_OFF[FELL_OFF.index("NVRM:"):]      # the driver's own line says which GPU
    assert detector.condition()["status"] == "False"                   # not a fault to quarantine on
    detector.kernel(DBE)                                               # NVIDIA: its diagnosis workflow
    fault = detector.wait_condition("True", "GpuXid48")
    assert fault["message"] == DBE[DBE.index("NVRM:"):]


def test_a_restarted_detector_finds_the_fault_again_until_the_kernel_log_is_cleared(detector: Detector):
    detector.wait_condition("False", "NoGpuHardwareXid")
    detector.kernel(DBE)
    detector.wait_condition("True", "GpuXid48")
    detector.stop()
    detector.start()           # a new detector (a rolled DaemonSet, a restarted pod) reads the log back
    time.sleep(3)
    assert detector.wait_condition("True", "GpuXid48")
    detector.reboot()                          # a new kernel log
    detector.wait_condition("False", "NoGpuHardwareXid")


def test_the_burn_in_monitor_holds_a_fault_past_the_reboot_until_a_burn_in_passes(detector: Detector):
    healthy = detector.wait_condition("False", "NoFaultSinceBurnIn", BURN_IN_CONDITION)
    assert healthy["message"] == "no GPU hardware fault after the last passing burn-in"
    detector.burn_in()                         # the verdict that admitted the node
    detector.kernel(DBE)
    held = detector.wait_condition("True", "FaultSinceBurnIn", BURN_IN_CONDITION)
    assert held["message"].endswith(DBE[DBE.index("NVRM:"):])
    detector.reboot()
    detector.wait_condition("False", "NoGpuHardwareXid")
    time.sleep(3)
    assert detector.condition(BURN_IN_CONDITION)["status"] == "True"      # the reboot alone does not release it
    detector.burn_in()
    detector.wait_condition("False", "NoFaultSinceBurnIn", BURN_IN_CONDITION)


def test_an_xid_that_needs_a_reset_is_cleared_by_the_reboot_without_a_burn_in(detector: Detector):
    detector.burn_in()
    detector.kernel(FELL_OFF)
    detector.wait_condition("True", "GpuXid79", RESET_CONDITION)
    time.sleep(3)
    assert detector.condition(BURN_IN_CONDITION)["status"] == "False"
    detector.reboot()
    detector.wait_condition("False", "NoGpuResetPending", RESET_CONDITION)
    assert detector.condition(BURN_IN_CONDITION)["status"] == "False"


@pytest.mark.parametrize("name", [NAME, health_nvml.NAME])
def test_each_detector_runs_on_every_gpu_node(clean: Cluster, name: str):
    """The NVML detector's pods pass the RuntimeClass admission with the GPU Operator's runtime class."""
    gpu_nodes = {h.hostname for _, h in clean.spec.hosts()}
    pods = lambda: {p["spec"].get("nodeName") for p in clean.cp.get(  # noqa: E731
        "pods", namespace="kube-system", selector=f"app.kubernetes.io/name={name}")["items"]}
    wait_for(lambda: pods() == gpu_nodes, 60, lambda: f"{name} pods on {sorted(pods())}, GPU nodes {sorted(gpu_nodes)}")
