"""The NVML detector: sustained temperature and NVLinks read while jobs run, over real nvidia-smi output."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import kubernetes_validate
import pytest

from components.k8s.health import nvml as health_nvml, quarantine
from components.k8s.health.detector import NVML_RECORD, STATE_DIR
from components.k8s.health.nvml import (CHECK, HOSTS_CONFIG, HOSTS_FILE, MONITOR, NVLINK_CONDITION,
                                        TEMPERATURE_CONDITION, check_script, monitor_config, nvlink_hosts,
                                        render_gpu_nvml)
from components.k8s.platform.monitoring import render_alert_rules
from components.spec import ClusterSpec
from tests.components.k8s.health.test_detector import Host
from tests.conftest import ROOT, problems_of
from tests.doubles import nvidia_smi
from components.records import MAINTENANCE

SAMPLES = ROOT / "tests" / "samples"
# `nvidia-smi -q -i 0` on an 8x H800 HGX node (driver 525.105.17), a published capture trimmed to whole
# sections: the GPU's header, identity, throttle reasons, remapped rows, temperature (35 C now; its own limits
# 87, 89 and 92 C) and fabric.
QUERY = (SAMPLES / "nvidia_smi_q_h800.txt").read_text()
NVLINK_OK = (SAMPLES / "nvidia_smi_nvlink_s_8xh100.txt").read_text()
NVLINK_DEGRADED = (SAMPLES / "nvidia_smi_nvlink_s_degraded.txt").read_text()
# What nvidia-smi prints while the mounted library no longer matches the loaded driver (after a driver upgrade).
MISMATCH = "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 550.90\n"


def at(temp: int, bus: str = "00000000:18:00.0") -> str:
    """The real capture with this GPU's current temperature (and bus id): the line as nvidia-smi aligns it."""
    return QUERY.replace("GPU Current Temp                  : 35 C", f"GPU Current Temp                  : {temp} C") \
        .replace("GPU 00000000:18:00.0", f"GPU {bus}")


class Gpus:
    """The detector's check as node-problem-detector runs it (the rule's args, a host's state dir), with an
    nvidia-smi double that prints what the test gives it."""

    def __init__(self, tmp_path: Path, spec: ClusterSpec, node: str = "gpu-dev-01"):
        self.spec, self.node, self.state = spec, node, tmp_path / "state"
        self.script = tmp_path / CHECK
        self.script.write_text(check_script())
        self.script.chmod(0o755)
        self.hosts = tmp_path / HOSTS_FILE
        self.hosts.write_text(nvlink_hosts(spec))
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        self.calls = tmp_path / "calls"
        self.smi(QUERY, NVLINK_OK)

    def smi(self, query: str, links: str, code: int = 0) -> None:
        nvidia_smi(self.bin, query, links, code, self.calls)

    def check(self, kind: str, node: str | None = None) -> tuple[int, str]:
        (rule,) = [r for r in monitor_config(self.spec)["rules"] if r["args"][2] == kind]
        args = [str(self.state), *rule["args"][1:]]
        if kind == "nvlink":
            args[3] = str(self.hosts)
        env = {"PATH": f"{self.bin}:/usr/bin:/bin", **({"NODE_NAME": node or self.node} if node != "" else {})}
        out = subprocess.run([str(self.script), *args], capture_output=True, text=True, timeout=10, env=env)
        return out.returncode, out.stdout.strip()

    def hot_since(self, gpu: str, seconds_ago: int, last_look_ago: int = 60) -> None:
        """A GPU the detector has seen above the limit since `seconds_ago`, last at `last_look_ago`."""
        now = int(time.time())
        self.state.mkdir(exist_ok=True)
        (self.state / health_nvml.HOT_SINCE).write_text(f"{gpu} {now - seconds_ago} {now - last_look_ago}\n")

    @property
    def record(self) -> Path:
        return self.state / Path(NVML_RECORD).name


@pytest.fixture
def gpus(tmp_path, dev_spec) -> Gpus:
    return Gpus(tmp_path, dev_spec)


def test_a_gpu_at_its_usual_temperature_is_healthy(gpus):
    assert gpus.check("temperature") == (0, "no GPU of gpu-dev-01 above 85 C for 600s")
    assert not gpus.record.exists()


def test_a_gpu_above_the_limit_is_a_fault_only_once_it_stayed_there_long_enough(gpus):
    gpus.smi(at(91), NVLINK_OK)
    assert gpus.check("temperature")[0] == 0                       # a first look above the limit: a spike so far
    since = (gpus.state / health_nvml.HOT_SINCE).read_text().split()
    assert since[0] == "00000000:18:00.0" and since[1] == since[2]
    gpus.hot_since("00000000:18:00.0", 660)                        # above it at every look for 11 minutes
    code, message = gpus.check("temperature")
    assert (code, message) == (1, "GPU above 85 C for 600s on gpu-dev-01: GPU 00000000:18:00.0 at 91 C for 11 min")
    assert gpus.record.read_text().splitlines()[1] == message      # held for a burn-in on a pool that burns in


def test_the_limit_is_the_gpus_current_temperature_not_its_other_readings(gpus):
    # 85 C exactly is not above the limit; the capture's T.Limit, shutdown and memory readings are not the GPU's.
    gpus.smi(at(85), NVLINK_OK)
    gpus.hot_since("00000000:18:00.0", 3600)
    assert gpus.check("temperature")[0] == 0
    assert (gpus.state / health_nvml.HOT_SINCE).read_text().strip() == ""   # cooled: its time starts again


def test_a_gap_in_the_looks_starts_the_count_again(gpus):
    gpus.smi(at(95), NVLINK_OK)
    gpus.hot_since("00000000:18:00.0", 3600, last_look_ago=400)    # the detector was down for minutes
    assert gpus.check("temperature")[0] == 0


def test_each_hot_gpu_is_named_and_a_gpu_that_reads_na_is_skipped(gpus):
    two = at(93) + at(97, "00000000:2A:00.0").split("Attached GPUs")[1].split("\n", 1)[1]
    gpus.smi(two.replace("GPU Current Temp                  : 93 C", "GPU Current Temp                  : N/A"),
             NVLINK_OK)
    now = int(time.time())
    gpus.state.mkdir()
    (gpus.state / health_nvml.HOT_SINCE).write_text(f"00000000:18:00.0 {now - 900} {now - 60}\n"
                                                     f"00000000:2A:00.0 {now - 900} {now - 60}\n")
    assert gpus.check("temperature") == (1, "GPU above 85 C for 600s on gpu-dev-01: GPU 00000000:2A:00.0 at 97 C "
                                            "for 15 min")


def test_a_reading_that_fails_keeps_the_last_verdict_and_never_makes_a_fault_of_its_own(gpus):
    gpus.smi(MISMATCH, MISMATCH, code=18)
    code, message = gpus.check("temperature")                      # nothing read yet: no fault
    assert code == 0 and message.startswith("no reading yet: nvidia-smi -q failed or did not answer in 20 s: "
                                            "Failed to init")
    gpus.smi(at(91), NVLINK_OK)
    gpus.hot_since("00000000:18:00.0", 700)
    fault = gpus.check("temperature")[1]
    gpus.smi(MISMATCH, MISMATCH, code=18)
    code, message = gpus.check("temperature")
    assert code == 1 and message.startswith(f"{fault} (no new reading: nvidia-smi -q failed")
    gpus.smi(QUERY, NVLINK_OK)
    assert gpus.check("temperature")[0] == 0


def test_a_hung_nvidia_smi_is_cut_off_before_the_detectors_timeout_and_keeps_the_last_verdict(gpus, monkeypatch):
    """node-problem-detector reads its own timeout as Unknown, which quarantines: the check's bound comes first."""
    assert health_nvml._SMI_S < int(monitor_config(gpus.spec)["pluginConfig"]["timeout"].rstrip("s"))
    monkeypatch.setattr(health_nvml, "_SMI_S", 1)
    gpus.script.write_text(check_script())
    gpus.smi(at(91), NVLINK_OK)
    gpus.hot_since("00000000:18:00.0", 700)
    fault = gpus.check("temperature")[1]
    tool = gpus.bin / "nvidia-smi"
    tool.write_text(tool.read_text().replace("\n", "\nsleep 30\n", 1))
    code, message = gpus.check("temperature")
    assert code == 1 and message == f"{fault} (no new reading: nvidia-smi -q failed or did not answer in 1 s: )"
    assert (gpus.state / f"{health_nvml.LAST}-temperature.blind").exists()     # GpuHealthCheckBlind reads it


def test_a_roll_under_way_fences_the_nvml_check_so_a_fabric_manager_restart_records_nothing(gpus):
    assert gpus.check("nvlink")[0] == 0
    gpus.state.mkdir(exist_ok=True)
    (gpus.state / Path(MAINTENANCE).name).write_text(f"roll {int(time.time())}\n")
    gpus.smi(QUERY, NVLINK_DEGRADED)                      # links still training after the restart
    code, message = gpus.check("nvlink")
    assert code == 0 and message.endswith("(roll under way on gpu-dev-01: its GPUs are not judged until it ends)")
    assert not gpus.record.exists()


def test_an_nvlink_down_on_an_nvswitch_board_is_a_fault_with_the_link_named(gpus):
    assert gpus.check("nvlink") == (0, "every NVLink of gpu-dev-01 is up at full speed")
    gpus.smi(QUERY, NVLINK_DEGRADED)
    code, message = gpus.check("nvlink")
    assert code == 1 and message.startswith("NVLink down on gpu-dev-01: GPU ") and "inactive" in message
    assert gpus.record.exists()


def test_a_node_without_nvswitch_is_not_asked_for_its_nvlinks(gpus):
    gpus.smi(QUERY, NVLINK_DEGRADED)
    assert gpus.check("nvlink", node="cpu-01") == (0, "cpu-01 has no NVSwitch board: no NVLink to watch")
    assert not gpus.calls.exists()


def test_without_its_node_name_the_check_holds_no_verdict(gpus):
    assert gpus.check("nvlink", node="") == (0, "no reading yet: NODE_NAME is not set")


def test_a_fault_the_spec_only_alerts_on_sets_its_condition_but_records_nothing(make_spec, tmp_path):
    spec = make_spec(lambda d: d["kubernetes"].setdefault("health", {}).update(
        gpu_monitor={"quarantine_on": ["temperature"]}))
    g = Gpus(tmp_path, spec)
    g.smi(QUERY, NVLINK_DEGRADED)
    assert g.check("nvlink")[0] == 1 and not g.record.exists()
    assert quarantine.conditions(spec)[-1] == TEMPERATURE_CONDITION
    assert NVLINK_CONDITION not in quarantine.conditions(spec)


def test_a_recorded_fault_holds_the_node_until_a_burn_in_passes_after_it(gpus, tmp_path, dev_spec):
    host = Host(tmp_path, dev_spec)          # the kernel detector's burn-in plugin, on the same state directory
    assert host.state == gpus.state
    host.burn_in()
    gpus.smi(QUERY, NVLINK_DEGRADED)
    message = gpus.check("nvlink")[1]
    assert host.check() == (1, f"no burn-in passed since this GPU fault: {message}")
    gpus.smi(QUERY, NVLINK_OK)
    assert gpus.check("nvlink")[0] == 0 and host.check()[0] == 1       # repaired, not yet burned in
    host.burn_in()
    assert host.check() == (0, "a burn-in passed after the last GPU hardware fault")


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed (.ci/run installs it)")
def test_the_check_passes_shellcheck(gpus):
    out = subprocess.run(["shellcheck", "-S", "style", str(gpus.script)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout


# --- the objects ---------------------------------------------------------------------------------------------

def _objects(spec: ClusterSpec) -> dict[str, dict]:
    return {m.role: m.obj for m in render_gpu_nvml(spec)}


def test_the_detector_sees_every_gpu_through_the_runtime_without_taking_one(dev_spec):
    objs = _objects(dev_spec)
    pod = objs["gpu-nvml"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["runtimeClassName"] == "nvidia"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert "resources" not in container                             # no GPU request: tenants keep every GPU
    assert container["livenessProbe"]["exec"]["command"] == ["nvidia-smi", "-L"]
    assert {t["effect"] for t in pod["tolerations"]} == {"NoSchedule", "NoExecute"}
    assert container["command"][-1] == f"--config.custom-plugin-monitor=/config/{MONITOR}"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    for rule in monitor_config(dev_spec)["rules"]:
        assert rule["path"] == f"{mounts['config']}/{CHECK}" and rule["args"][0] == mounts["state"] == STATE_DIR
    assert volumes["state"]["hostPath"]["path"] == STATE_DIR
    assert volumes["hosts"]["configMap"]["name"] == objs["gpu-nvml-hosts"]["metadata"]["name"] == HOSTS_CONFIG
    nvlink = next(r for r in monitor_config(dev_spec)["rules"] if r["condition"] == NVLINK_CONDITION)
    assert nvlink["args"][3] == f"{mounts['hosts']}/{HOSTS_FILE}"
    data = objs["gpu-nvml-config"]["data"]
    assert json.loads(data[MONITOR]) == monitor_config(dev_spec) and data[CHECK] == check_script()


def test_the_nvlink_hosts_are_those_on_nvswitch_boards(make_spec):
    spec = make_spec(lambda d: None)
    assert nvlink_hosts(spec) == "".join(f"{h.hostname}\n" for p in spec.node_pools if p.gpu.nvswitch
                                         for h in p.hosts)
    assert nvlink_hosts(spec)


def test_the_objects_are_valid_kubernetes(dev_spec):
    for obj in _objects(dev_spec).values():
        kubernetes_validate.validate(obj, dev_spec.kubernetes.version, strict=True)


def test_the_quarantine_rule_holds_a_node_on_both_faults_by_default(dev_spec):
    assert quarantine.conditions(dev_spec)[-2:] == (TEMPERATURE_CONDITION, NVLINK_CONDITION)
    rule = quarantine.render_rule(dev_spec).obj
    assert [c["type"] for c in rule["spec"]["conditions"]] == list(quarantine.conditions(dev_spec))
    assert "GpuNodeUnhealthy" in {r["alert"] for r in render_alert_rules(dev_spec)}


def test_the_monitor_off_renders_nothing_and_holds_no_node_for_it(make_spec):
    spec = make_spec(lambda d: d["kubernetes"].setdefault("health", {}).update(gpu_monitor={"enabled": False}))
    assert render_gpu_nvml(spec) == []
    assert not set(quarantine.conditions(spec)) & {TEMPERATURE_CONDITION, NVLINK_CONDITION}
    assert "GpuNodeUnhealthy" not in {r["alert"] for r in render_alert_rules(spec)}


@pytest.mark.parametrize("settings, message", [
    ({"quarantine_on": ["fan"]},
     "kubernetes.health.gpu_monitor.quarantine_on[0]: Input should be 'temperature' or 'nvlink' (got 'fan')"),
    ({"temperature_for_s": 30}, "kubernetes.health.gpu_monitor.temperature_for_s"),
    ({"runtime_class": "Nvidia_RT"}, "kubernetes.health.gpu_monitor.runtime_class"),
    ({"temperature_for_s": "600"}, "kubernetes.health.gpu_monitor.temperature_for_s")])
def test_bad_monitor_settings_are_refused_with_the_field(dev_data, settings, message):
    dev_data["kubernetes"].setdefault("health", {})["gpu_monitor"] = settings
    assert any(message in p for p in problems_of(dev_data)), problems_of(dev_data)
