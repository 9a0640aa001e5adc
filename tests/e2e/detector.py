"""node-problem-detector, built from its Go module at the version the stack deploys, run for one KWOK GPU node with
the plan's own monitors: the kernel monitor (kmsg swapped for its filelog plugin over a file this test appends
the driver's lines to: `plugin`, `logPath` and the parser are the only change) and the custom plugins (the
plan's scripts, their args pointed at this host's stand-ins for /var/lib/gpucluster, the kernel log, the boot
id, /sys/class/infiniband; they run every second instead of every 30 so the tests do not wait). The NVML
detector (components/k8s/health/nvml.py) is a second node-problem-detector for the same node and state directory, its
nvidia-smi a double that prints real output (no GPU here)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from components.k8s.health import nvml as health_nvml
from components.k8s.health.detector import (BLIND_CONDITION, BOOT_ID, BURN_IN_CHECK, BURN_IN_CONDITION, BURN_IN_MONITOR,
                                   CONDITION, MONITOR, NAME, PORT_CHECK, PORT_CONDITION, PORT_MONITOR, PORTS_CONFIG,
                                   PORTS_DIR, PORTS_FILE, RESET_CONDITION, STATE_DIR, SYSFS_RDMA)
from components.records import RESULT

from ..doubles import DOUBLE_BIT_XID, nvidia_smi
from .conftest import Cluster, wait_for
from .controlplane import TOOLS, free_port

SAMPLE = (Path(__file__).resolve().parents[1] / "samples" / "xid_kernel_log.txt").read_text().splitlines()
JOB_XID = next(line for line in SAMPLE if "): 13, pid=" in line)         # a job's own fault
FELL_OFF = next(line for line in SAMPLE if "): 79, pid=1582259" in line)  # the GPU fell off the bus: a reset
DBE = DOUBLE_BIT_XID                                                       # NVIDIA's diagnosis: quarantined


def plan_config(c: Cluster, name: str = NAME) -> dict[str, str]:
    (config,) = [o for o in c.plan.objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == name]
    return config["data"]


def _plugin(work: Path, data: dict[str, str], monitor: str, script: str, stand_ins: dict[str, Path]) -> Path:
    """One custom plugin monitor of the plan (`script` among its rules'), each rule's script and the host paths
    among its args swapped for this host's stand-ins, run every second; the monitor's config file."""
    config = json.loads(data[monitor])
    config["pluginConfig"]["invoke_interval"] = "1s"
    assert script in {Path(rule["path"]).name for rule in config["rules"]}
    for rule in config["rules"]:
        path = work / Path(rule["path"]).name
        path.write_text(data[path.name])
        path.chmod(0o755)
        rule.update(path=str(path), args=[str(stand_ins.get(a, a)) for a in rule["args"]])
    (work / monitor).write_text(json.dumps(config))
    return work / monitor


def _npd(c: Cluster, node: str, configs: dict[str, str], out: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """node-problem-detector for `node`, with the DaemonSet's NODE_NAME (from spec.nodeName)."""
    return subprocess.Popen(
        [str(TOOLS / "bin" / "node-problem-detector"), "--logtostderr", f"--hostname-override={node}",
         *(f"--config.{kind}={path}" for kind, path in configs.items()),
         f"--apiserver-override={c.cp.server}?inClusterConfig=false&auth={c.cp.kubeconfig}",
         "--address=127.0.0.1", f"--port={free_port()}", "--prometheus-address=127.0.0.1",
         f"--prometheus-port={free_port()}"], stdout=out.open("ab"), stderr=subprocess.STDOUT,
        env={**os.environ, **env, "NODE_NAME": node})


class Detector:
    """node-problem-detector for one node; `state` stands for the host's /var/lib/gpucluster."""

    def __init__(self, c: Cluster, node: str, work: Path):
        self.c, self.node, self.log = c, node, work / "kern.log"
        self.state, self.boot_id = work / "state", work / "boot_id"
        self.log.touch()
        self.boot_id.write_text("boot-1\n")
        data = plan_config(c)
        kernel = {**json.loads(data[MONITOR]), "plugin": "filelog", "logPath": str(self.log),
                  "pluginConfig": {"timestamp": "^.{15}", "message": r"kernel: \[.*\] (.*)",
                                   "timestampFormat": "Jan _2 15:04:05"}}
        burn_in = _plugin(work, data, BURN_IN_MONITOR, BURN_IN_CHECK,
                          {STATE_DIR: self.state, "kmsg": self.log, BOOT_ID: self.boot_id})
        # The fabric port plugin: this node's ports in a stand-in for /sys/class/infiniband, every one ACTIVE.
        self.sysfs, ports_file = work / "infiniband", work / PORTS_FILE
        (ports_config,) = [o for o in c.plan.objects if o["kind"] == "ConfigMap"
                           and o["metadata"]["name"] == PORTS_CONFIG]
        listed = ports_config["data"][PORTS_FILE]
        ports_file.write_text(listed)
        self.ports = next((line.split()[1:] for line in listed.splitlines() if line.split()[0] == node), [])
        for port in self.ports:
            self.port(port, "4: ACTIVE", "5: LinkUp", 0)
        ports = _plugin(work, data, PORT_MONITOR, PORT_CHECK,
                        {STATE_DIR: self.state, SYSFS_RDMA: self.sysfs, f"{PORTS_DIR}/{PORTS_FILE}": ports_file})
        (work / MONITOR).write_text(json.dumps(kernel))
        self.configs = {"system-log-monitor": str(work / MONITOR), "custom-plugin-monitor": f"{burn_in},{ports}"}
        self.out = work / "npd.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = _npd(self.c, self.node, self.configs, self.out, {})

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)

    def port(self, port: str, state: str | None = None, phys: str | None = None, downed: int | None = None) -> None:
        """One RDMA port (`mlx5_0/1`) as the RDMA core shows it under /sys/class/infiniband."""
        dev, number = port.split("/")
        d = self.sysfs / dev / "ports" / number
        (d / "counters").mkdir(parents=True, exist_ok=True)
        for name, value in (("state", state), ("phys_state", phys), ("counters/link_downed", downed)):
            if value is not None:
                (d / name).write_text(f"{value}\n")

    def kernel(self, line: str) -> None:
        """The driver's line as syslog writes the kernel's messages (kern.log), stamped now."""
        message = line[line.index("NVRM:"):]
        with self.log.open("a") as f:
            f.write(f"{time.strftime('%b %e %H:%M:%S')} {self.node} kernel: [12345.678901] {message}\n")

    def burn_in(self, verdict: str = "passed") -> None:
        """The verdict file as the burn-in writes it on the host."""
        self.state.mkdir(exist_ok=True)
        (self.state / "burn-in").write_text(f"{RESULT}{verdict}\n")

    def reboot(self) -> None:
        """A new boot: a clean kernel log, a new boot id, the detector started again by the kubelet."""
        self.stop()
        self.log.write_text("")
        self.boot_id.write_text(f"boot-{time.monotonic_ns()}\n")
        self.start()

    def condition(self, kind: str = CONDITION) -> dict[str, Any] | None:
        node = self.c.cp.get("node", self.node)
        return next((x for x in node["status"].get("conditions", []) if x["type"] == kind), None)

    def wait_condition(self, status: str, reason: str, kind: str = CONDITION) -> dict[str, Any]:
        return wait_for(lambda: (x := self.condition(kind)) and x["status"] == status and x["reason"] == reason and x,
                        60, lambda: f"{kind} on {self.node}: {self.condition(kind)}\n{self.out.read_text()[-2000:]}")

    def events(self) -> list[str]:
        return [e["reason"] for e in self.c.cp.get("events")["items"]
                if e["involvedObject"].get("name") == self.node and e["reason"].startswith("GpuXid")]

    def forget(self) -> None:
        """Stop, and remove the conditions it set: a later test's node starts without them, as a new node would."""
        self.stop()
        conditions = self.c.cp.get("node", self.node)["status"].get("conditions", [])
        self.c.cp.kubectl("patch", "node", self.node, "--subresource=status", "--type=json", "-p", json.dumps(
            [{"op": "remove", "path": f"/status/conditions/{i}"} for i, x in reversed(list(enumerate(conditions)))
             if x["type"] in (CONDITION, RESET_CONDITION, BURN_IN_CONDITION, PORT_CONDITION, BLIND_CONDITION,
                              *health_nvml.CONDITIONS.values())]),
            check=False)


class NvmlDetector:
    """The NVML detector for a Detector's node and state directory: the plan's monitor and script, with an
    nvidia-smi double on PATH that prints what the test gives it (real captures)."""

    def __init__(self, d: Detector, work: Path):
        self.d, self.bin = d, work / "nvml-bin"
        self.bin.mkdir()
        hosts = work / health_nvml.HOSTS_FILE
        hosts.write_text(plan_config(d.c, health_nvml.HOSTS_CONFIG)[health_nvml.HOSTS_FILE])
        monitor = _plugin(work, plan_config(d.c, health_nvml.NAME), health_nvml.MONITOR, health_nvml.CHECK,
                          {STATE_DIR: d.state, f"{health_nvml.HOSTS_DIR}/{health_nvml.HOSTS_FILE}": hosts})
        self.configs = {"custom-plugin-monitor": str(monitor)}
        self.out = work / "npd-nvml.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def smi(self, query: str, links: str) -> None:
        """What `nvidia-smi -q ...` and `nvidia-smi nvlink -s` print from now on."""
        nvidia_smi(self.bin, query, links)

    def start(self) -> None:
        self.proc = _npd(self.d.c, self.d.node, self.configs, self.out,
                         {"PATH": f"{self.bin}:{os.environ['PATH']}"})

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
