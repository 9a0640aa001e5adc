"""GPU health detection on the real control plane: node-problem-detector, built from its Go module at the version
the stack deploys, runs with the plan's own monitor config against a KWOK GPU node and is fed the driver's real
XID lines. On a node its kernel monitor reads /dev/kmsg; here it reads the same lines from a file (its filelog
plugin: the config's `plugin` and `logPath` are the only change), so the rules, the condition and the look
back are the plan's."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from components.k8s.health import CONDITION, MONITOR, NAME

from .conftest import Cluster, wait_for
from .controlplane import TOOLS, free_port

pytestmark = pytest.mark.e2e

SAMPLE = (Path(__file__).resolve().parents[1] / "samples" / "xid_kernel_log.txt").read_text().splitlines()
JOB_XID = next(line for line in SAMPLE if "): 13, pid=" in line)         # a job's own fault
FELL_OFF = next(line for line in SAMPLE if "): 79, pid=1582259" in line)  # the GPU fell off the bus


def plan_monitor(c: Cluster) -> dict[str, Any]:
    (config,) = [o for o in c.plan.objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == NAME]
    return json.loads(config["data"][MONITOR])


class Detector:
    """node-problem-detector for one node, its kernel log a file this test appends the driver's lines to."""

    def __init__(self, c: Cluster, node: str, work: Path):
        self.c, self.node, self.log = c, node, work / "kern.log"
        self.log.touch()
        config = {**plan_monitor(c), "plugin": "filelog", "logPath": str(self.log),
                  "pluginConfig": {"timestamp": "^.{15}", "message": r"kernel: \[.*\] (.*)",
                                   "timestampFormat": "Jan _2 15:04:05"}}
        self.config = work / MONITOR
        self.config.write_text(json.dumps(config))
        self.out = work / "npd.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [str(TOOLS / "bin" / "node-problem-detector"), "--logtostderr", f"--hostname-override={self.node}",
             f"--config.system-log-monitor={self.config}",
             f"--apiserver-override={self.c.cp.server}?inClusterConfig=false&auth={self.c.cp.kubeconfig}",
             "--address=127.0.0.1", f"--port={free_port()}", "--prometheus-address=127.0.0.1",
             f"--prometheus-port={free_port()}"], stdout=self.out.open("ab"), stderr=subprocess.STDOUT)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)

    def kernel(self, line: str) -> None:
        """The driver's line as syslog writes the kernel's messages (kern.log), stamped now."""
        message = line[line.index("NVRM:"):]
        with self.log.open("a") as f:
            f.write(f"{time.strftime('%b %e %H:%M:%S')} {self.node} kernel: [12345.678901] {message}\n")

    def condition(self) -> dict[str, Any] | None:
        node = self.c.cp.get("node", self.node)
        return next((x for x in node["status"].get("conditions", []) if x["type"] == CONDITION), None)

    def wait_condition(self, status: str, reason: str) -> dict[str, Any]:
        return wait_for(lambda: (x := self.condition()) and x["status"] == status and x["reason"] == reason and x,
                        60, lambda: f"{CONDITION} on {self.node}: {self.condition()}\n"
                                    f"{self.out.read_text()[-2000:]}")

    def events(self) -> list[str]:
        return [e["reason"] for e in self.c.cp.get("events")["items"]
                if e["involvedObject"].get("name") == self.node and e["reason"].startswith("GpuXid")]


@pytest.fixture
def detector(clean: Cluster, tmp_path: Path) -> Iterator[Detector]:
    node = sorted(h.hostname for _, h in clean.spec.hosts())[0]
    d = Detector(clean, node, tmp_path)
    d.start()
    try:
        yield d
    finally:
        d.stop()
        # the condition is the detector's; a later test's node starts without it, as a new node would
        clean.cp.kubectl("patch", "node", node, "--subresource=status", "--type=json", "-p", json.dumps(
            [{"op": "remove", "path": f"/status/conditions/{i}"} for i, x in reversed(list(enumerate(
                clean.cp.get("node", node)["status"].get("conditions", [])))) if x["type"] == CONDITION]),
            check=False)


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
    detector.stop()
    detector.log.write_text("")                # a reboot: a new kernel log
    detector.start()
    detector.wait_condition("False", "NoGpuHardwareXid")


def test_the_detector_runs_on_every_gpu_node(clean: Cluster):
    gpu_nodes = {h.hostname for _, h in clean.spec.hosts()}
    pods = lambda: {p["spec"].get("nodeName") for p in clean.cp.get(  # noqa: E731
        "pods", namespace="kube-system", selector=f"app.kubernetes.io/name={NAME}")["items"]}
    wait_for(lambda: pods() == gpu_nodes, 60, lambda: f"detector pods on {sorted(pods())}, GPU nodes {sorted(gpu_nodes)}")
