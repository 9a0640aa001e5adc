"""Active health checks between jobs: the check's script over dcgmi's real output, the detector that turns its
failure into quarantine, and the Kueue objects that keep it off busy nodes and below every tenant."""

from __future__ import annotations

import json
import shutil
from collections import Counter
import subprocess
import time
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from components.fabric.checks import NCCL_TESTS
from components.k8s.health import checks as health_checks
from components.k8s.gpu_stack import GpuKubernetesStack, render_namespaces
from components.k8s.health.detector import CHECK_RECORD, STATE_DIR, burn_in_monitor_config
from components.k8s.tenancy.jobs import QUEUE_LABEL
from components.k8s.tenancy.tenant import TENANT_LABEL
from components.offline.diff import diff_plans
from components.offline.plan import build_plan
from components.spec import parse_spec
from components.spec.cluster import checked_pools
from components.spec.kubernetes import LOWEST_PRIORITY, _cron
from components.records import min_busbw
from tests.components.k8s.health.test_detector import Host
from tests.conftest import ROOT, problems_of

SAMPLES = ROOT / "tests" / "samples"
# dcgmi diag -r 2 on an HGX H100 with a GPU whose memory test failed, and the same run's level-1 part (the
# deployment tests: what `-r 1` prints), all passing.
FAILED = (SAMPLES / "dcgmi_diag_r2_fail.txt").read_text()
PASSED = (SAMPLES / "dcgmi_diag_r1_pass.txt").read_text()
# What dcgmi prints when no host engine answers (DCGM's dcgmi/CommandLineParser and dcgmi_common messages).
# `nvidia-smi nvlink -s` on an 8-GPU HGX H100 in the format of real captures (per GPU its name and UUID line, then
# one tab-indented line per link: 18 links at 26.562 GB/s each on Hopper); and the same board with GPU 5's link 2
# trained down to 1.562 GB/s and its link 10 `<inactive>`, as captures of degraded boards show them.
NVLINK_OK = (SAMPLES / "nvidia_smi_nvlink_s_8xh100.txt").read_text()
NVLINK_DEGRADED = (SAMPLES / "nvidia_smi_nvlink_s_degraded.txt").read_text()
# What nvidia-smi prints for a GPU none of whose links came up (a real RTX A6000 capture's form).
NVLINK_NONE = ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-02c05ee3-bdb5-aac7-f9e8-a4c8f3f725b3)\n"
               "NVML: Unable to retrieve NVLink information as all links are inActive\n")
NO_ENGINE = ("Error: unable to establish a connection to the specified host: localhost\n"
             "Error: Unable to connect to host engine. Host engine connection invalid/disconnected.\n")


class Node:
    """One host's /var/lib/gpucluster, the check as its CronJob runs it (doubles for nv-hostengine and dcgmi, the
    tools that need a GPU), and the detector's plugin reading the same directory."""

    def __init__(self, tmp_path: Path, spec):
        self.host = Host(tmp_path, spec)               # the detector's plugin over this host's directory
        self.state, self.bin = self.host.state, tmp_path / "bin"
        self.bin.mkdir()
        self.script = tmp_path / health_checks.SCRIPT
        self.script.write_text(health_checks.check_script())
        self.engine(0)
        self.links(NVLINK_OK, 0)

    def links(self, output: str, code: int) -> None:
        self._tool("nvidia-smi", output, code)

    def engine(self, code: int) -> None:
        self._tool("nv-hostengine", "Started host engine version 3.3.9 using port number: 5555\n", code)

    def dcgmi(self, output: str, code: int) -> None:
        self._tool("dcgmi", output, code)

    def _tool(self, name: str, output: str, code: int) -> None:
        (self.bin / f"{name}.out").write_text(output)
        tool = self.bin / name
        tool.write_text(f'#!/bin/bash\ncat "{self.bin}/{name}.out"\nexit {code}\n')
        tool.chmod(0o755)

    def check(self, level: int = 1, nvlink: int = 1) -> tuple[int, str]:
        out = subprocess.run(["/bin/bash", str(self.script), str(self.state), str(level), str(nvlink)],
                             capture_output=True, text=True, timeout=30, env={"PATH": f"{self.bin}:/usr/bin:/bin"})
        return out.returncode, out.stdout.strip().splitlines()[-1]

    def detector(self) -> tuple[int, str]:
        assert burn_in_monitor_config()["rules"][0]["args"][0] == STATE_DIR     # where the check writes
        return self.host.check()

    def burn_in(self, verdict: str = "passed") -> None:
        self.host.burn_in(verdict)


@pytest.fixture
def node(tmp_path, dev_spec) -> Node:
    n = Node(tmp_path, dev_spec)
    n.burn_in()                        # the burn-in that admitted the node
    return n


def test_a_failed_test_is_recorded_and_holds_the_node_until_a_burn_in_passes(node):
    node.dcgmi(FAILED, 226)
    code, last = node.check(2)
    assert code == 1 and "GPU Memory: Fail - GPU: 3" in last
    record = node.state / Path(CHECK_RECORD).name
    assert record.read_text().splitlines()[1] == "active check failed: dcgmi diag -r 2: GPU Memory: Fail - GPU: 3"
    code, message = node.detector()
    assert code == 1 and message == "no burn-in passed since this GPU fault: active check failed: dcgmi diag -r 2: " \
                                    "GPU Memory: Fail - GPU: 3"
    node.burn_in("failed: dcgmi diag -r 2 failed")
    assert node.detector()[0] == 1
    node.burn_in()
    assert node.detector() == (0, "a burn-in passed after the last GPU hardware fault")


def test_a_passing_check_writes_nothing_and_leaves_the_node_alone(node):
    node.dcgmi(PASSED, 0)
    assert node.check() == (0, "passed: dcgmi diag -r 1, 9 tests")
    assert not (node.state / Path(CHECK_RECORD).name).exists()
    assert node.detector() == (0, "no GPU hardware fault recorded on this host")


@pytest.mark.parametrize("links, nvlink, message", [
    (NVLINK_DEGRADED, 1, "NVLink: GPU 5 link 10: inactive, GPU 5 link 2: 1.562 of 26.562 GB/s"),
    (NVLINK_NONE, 1, "NVLink: GPU 0: no active link"),
    ("", 1, "NVLink: no NVLink reported")])
def test_an_nvlink_down_or_trained_down_on_an_nvswitch_board_fails_the_check(node, links, nvlink, message):
    node.dcgmi(PASSED, 0)
    node.links(links, 0)
    code, last = node.check(nvlink=nvlink)
    assert code == 1 and last == f"FAILED: {message}; the node stays quarantined until a burn-in passes"
    assert node.detector()[0] == 1


def test_a_board_without_nvswitch_is_not_asked_for_nvlink(node):
    node.dcgmi(PASSED, 0)
    node.links(NVLINK_NONE, 0)            # PCIe cards: no NVLink, or only a bridge between two
    assert node.check(nvlink=0) == (0, "passed: dcgmi diag -r 1, 9 tests")


@pytest.mark.parametrize("engine, output, code", [(1, PASSED, 0), (0, NO_ENGINE, 255), (0, "", 0)])
def test_a_check_that_gets_no_verdict_fails_without_quarantining(node, engine, output, code):
    """A tool's failure is not the GPU's: the Job fails (an alert), the node keeps working."""
    node.engine(engine)
    node.dcgmi(output, code)
    assert node.check()[0] == 2
    assert not (node.state / Path(CHECK_RECORD).name).exists()
    assert node.detector()[0] == 0


def test_the_newer_of_a_fault_and_a_failed_check_is_the_one_a_burn_in_must_follow(node):
    node.dcgmi(FAILED, 226)
    node.check()
    node.burn_in()
    assert node.detector()[0] == 0
    time.sleep(0.01)
    node.check()                        # fails again after that burn-in
    assert node.detector()[0] == 1


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed (.ci/run installs it)")
def test_the_check_passes_shellcheck(node):
    out = subprocess.run(["shellcheck", "-S", "style", str(node.script)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout


# --- the NCCL step: all_reduce across the host's GPUs after the diagnostic --------------------------------------

# all_reduce_perf's table at 8 GiB on 8 H100s (the sample's last row: 473.39 GB/s out of place), as `-b 8G -e 8G`
# prints it; the same row at a third of the bandwidth (a GPU's NVLinks trained down); and nccl-tests' verdict
# when values come back wrong (it exits 1 then: common.cu).
NCCL_ROWS = (SAMPLES / "all_reduce_perf_8xh100.txt").read_text().splitlines()[2:]     # past the file's note
_TABLE = next(i for i, line in enumerate(NCCL_ROWS) if not line.startswith("#"))
NCCL_OK = "\n".join([*NCCL_ROWS[:_TABLE], NCCL_ROWS[-4], "# Out of bounds values : 0 OK",
                      "# Avg bus bandwidth    : 473.39", "#"]) + "\n"
NCCL_SLOW = NCCL_OK.replace("473.39      0", "157.80      0")
NCCL_WRONG = NCCL_OK.replace("# Out of bounds values : 0 OK", "# Out of bounds values : 12 FAILED")


class Nccl:
    """The NCCL step as its container runs it, all_reduce_perf a double printing nccl-tests' output (the
    script's path to it is the one change), and the detector's plugin over the same host directory."""

    def __init__(self, tmp_path: Path, spec):
        self.pool = spec.node_pools[0]
        self.host = Host(tmp_path, spec)
        self.tool = tmp_path / "all_reduce_perf"
        self.script = tmp_path / health_checks.NCCL_SCRIPT
        self.script.write_text(health_checks.nccl_script().replace(NCCL_TESTS, str(self.tool)))

    def run(self, output: str, code: int = 0) -> tuple[int, str]:
        (self.tool.parent / "nccl.out").write_text(output)
        self.tool.write_text(f'#!/bin/bash\n[[ "$*" == "-b 8G -e 8G -g {self.pool.gpu.count}" ]] || exit 9\n'
                             f'cat "{self.tool.parent}/nccl.out"\nexit {code}\n')
        self.tool.chmod(0o755)
        out = subprocess.run(["/bin/bash", str(self.script), str(self.host.state), str(self.pool.gpu.count),
                              str(min_busbw(self.pool))], capture_output=True, text=True, timeout=30)
        return out.returncode, out.stdout.strip().splitlines()[-1]


@pytest.fixture
def nccl(tmp_path, dev_spec) -> Nccl:
    n = Nccl(tmp_path, dev_spec)
    n.host.burn_in()
    return n


def test_the_nccl_step_passes_at_the_burn_ins_bandwidth(nccl):
    minimum = min_busbw(nccl.pool)
    assert nccl.run(NCCL_OK) == (0, f"passed: NCCL all_reduce bus bandwidth 473.39 GB/s at 8 GiB on 8 GPUs "
                                    f"(minimum {minimum})")
    assert not (nccl.host.state / Path(CHECK_RECORD).name).exists() and nccl.host.check()[0] == 0


@pytest.mark.parametrize("output, code, failure", [
    (NCCL_SLOW, 0, "NCCL all_reduce bus bandwidth 157.80 GB/s at 8 GiB on 8 GPUs is below {min} GB/s"),
    (NCCL_WRONG, 1, "NCCL all_reduce on 8 GPUs returned 12 wrong value(s)")])
def test_slow_or_wrong_all_reduce_holds_the_node_until_a_burn_in_passes(nccl, output, code, failure):
    failure = failure.format(min=min_busbw(nccl.pool))
    assert nccl.run(output, code) == (1, f"FAILED: {failure}; the node stays quarantined until a burn-in passes")
    assert nccl.host.check() == (1, f"no burn-in passed since this GPU fault: active check failed: {failure}")
    nccl.host.burn_in()
    assert nccl.host.check()[0] == 0


@pytest.mark.parametrize("output, code", [("", 1), ("NCCL failure common.cu:1011 'unhandled cuda error'\n", 1),
                                          ("\n".join(NCCL_ROWS[:_TABLE]) + "\n", 0)])     # the header only
def test_an_nccl_step_that_gets_no_bandwidth_fails_without_quarantining(nccl, output, code):
    got, message = nccl.run(output, code)
    assert got == 2 and message.endswith("with no bus bandwidth: no verdict on the GPUs")
    assert nccl.host.check()[0] == 0


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed (.ci/run installs it)")
def test_the_nccl_step_passes_shellcheck(nccl):
    out = subprocess.run(["shellcheck", "-S", "style", str(nccl.script)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout


def test_without_nccl_the_diagnostic_is_the_whole_check(make_spec):
    spec = make_spec(lambda d: d["kubernetes"].setdefault("health", {}).update(active_checks={"nccl": False}))
    pod = next(o for (kind, _), o in _objects(spec).items() if kind == "CronJob")["spec"]["jobTemplate"]["spec"][
        "template"]["spec"]
    assert "initContainers" not in pod and [c["name"] for c in pod["containers"]] == ["dcgm-diag"]


# --- what Kueue and the kube-scheduler are told --------------------------------------------------------------

def _objects(spec) -> dict[tuple[str, str], dict]:
    return {(m.obj["kind"], m.obj["metadata"]["name"]): m.obj for m in health_checks.render_health_checks(spec)}


def test_the_queue_borrows_only_and_never_preempts(dev_spec):
    cq = _objects(dev_spec)[("ClusterQueue", health_checks.NAME)]["spec"]
    assert cq["cohortName"] == dev_spec.kubernetes.kueue.cohort
    assert cq["preemption"] == {"reclaimWithinCohort": "Never", "borrowWithinCohort": {"policy": "Never"},
                                "withinClusterQueue": "Never"}
    assert cq["queueingStrategy"] == "BestEffortFIFO"
    (group,) = cq["resourceGroups"]
    assert [f["name"] for f in group["flavors"]] == [p.name for p in dev_spec.node_pools]
    assert all(r["nominalQuota"] == "0" and "borrowingLimit" not in r for f in group["flavors"]
               for r in f["resources"])
    assert cq["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": health_checks.NAMESPACE}}


def test_the_check_is_below_every_tenants_job_and_never_preempts_a_pod(dev_spec):
    pc = _objects(dev_spec)[("PriorityClass", health_checks.NAME)]
    assert pc["value"] == LOWEST_PRIORITY and pc["preemptionPolicy"] == "Never" and not pc["globalDefault"]
    assert all(c.value > pc["value"] for c in dev_spec.kubernetes.kueue.priority_classes)


def test_each_host_has_a_check_asking_for_all_its_gpus_on_that_host_only(dev_spec):
    objs = _objects(dev_spec)
    for pool in dev_spec.node_pools:
        for host in pool.hosts:
            cron = objs[("CronJob", f"gpu-check-{host.hostname}")]
            assert cron["spec"]["concurrencyPolicy"] == "Forbid"
            job = cron["spec"]["jobTemplate"]
            assert job["metadata"]["labels"][QUEUE_LABEL] == "default"
            assert job["spec"]["activeDeadlineSeconds"] == dev_spec.kubernetes.health.active_checks.timeout_s
            pod = job["spec"]["template"]["spec"]
            assert pod["nodeSelector"] == {"kubernetes.io/hostname": host.hostname}
            assert pod["priorityClassName"] == health_checks.NAME
            # The diagnostic first (an init container: its failure ends the pod), then the NCCL test.
            (c,), (nccl,) = pod["initContainers"], pod["containers"]
            assert c["resources"]["limits"] == nccl["resources"]["limits"] == {"nvidia.com/gpu": pool.gpu.count}
            assert c["command"][-3:] == [STATE_DIR, "1", "1"]          # level 1; an NVSwitch board (HGX H100)
            assert {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"} in c["env"]
            assert nccl["image"] == dev_spec.fabric.checks.nccl_tests_image
            assert nccl["command"][1:] == [f"/check/{health_checks.NCCL_SCRIPT}", STATE_DIR, str(pool.gpu.count),
                                           str(min_busbw(pool))]      # the burn-in's own minimum
            volumes = {v["name"]: v for v in pod["volumes"]}
            assert volumes["state"]["hostPath"]["path"] == STATE_DIR == str(Path(CHECK_RECORD).parent)
    assert objs[("LocalQueue", "default")]["spec"] == {"clusterQueue": health_checks.NAME}


def test_the_namespace_is_kueue_managed_privileged_and_the_platforms(dev_spec):
    (ns,) = [m.obj for m in render_namespaces(dev_spec) if m.obj["metadata"]["name"] == health_checks.NAMESPACE]
    labels = ns["metadata"]["labels"]
    assert labels[TENANT_LABEL] == health_checks.NAMESPACE         # Kueue's managedJobsNamespaceSelector
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    assert health_checks.NAMESPACE in dev_spec.system_namespaces and \
        health_checks.NAMESPACE in dev_spec.reserved_namespaces
    # ... but the check holds GPUs like a job: a burn-in or a rollout waits for it or drains it.
    assert health_checks.NAMESPACE not in dev_spec.agent_namespaces


def test_the_objects_are_valid_kubernetes(dev_spec):
    for obj in _objects(dev_spec).values():
        if not obj["apiVersion"].startswith("kueue.x-k8s.io"):
            kubernetes_validate.validate(obj, dev_spec.kubernetes.version, strict=True)


def test_a_long_host_name_gives_a_cronjob_name_the_api_server_takes():
    a, b = "x" * 50 + ".example.com", "x" * 50 + ".example.org"
    assert len(health_checks.cronjob_name(a)) <= 52 and health_checks.cronjob_name(a) != \
        health_checks.cronjob_name(b)
    assert health_checks.cronjob_name("gpu-01") == "gpu-check-gpu-01"


def _pool(make_spec, **changes):
    def edit(d):
        extra = json.loads(json.dumps(d["node_pools"][0]))
        extra.update(name="extra", hosts=[{"hostname": "gpu-dev-09", "address": "10.10.0.19", "rack": "r01"}],
                     **changes)
        d["node_pools"].append(extra)
        d["sites"][0]["racks"][0]["pdu_capacity_kw"] = 60
    return make_spec(edit)


@pytest.mark.parametrize("changes", [{"burn_in": {"enabled": False}}, {"sharing": {"time_slicing_replicas": 4}},
                                     {"sharing": {"mig_config": "all-1g.10gb"}}])
def test_pools_a_check_cannot_serve_are_left_out_with_a_warning(make_spec, changes):
    spec = _pool(make_spec, **changes)
    assert [p.name for p in checked_pools(spec)] == ["h100"]
    assert ("CronJob", "gpu-check-gpu-dev-09") not in _objects(spec)
    assert any("extra get no active health checks" in w for w in spec.warnings())


@pytest.mark.parametrize("health", [{"active_checks": {"enabled": False}}, {"enabled": False}])
def test_checks_off_install_nothing(make_spec, health):
    spec = make_spec(lambda d: d["kubernetes"].setdefault("health", {}).update(health))
    assert health_checks.render_health_checks(spec) == []
    assert health_checks.NAMESPACE not in {m.obj["metadata"]["name"] for m in render_namespaces(spec)}
    assert health_checks.NAMESPACE not in spec.system_namespaces


@pytest.mark.parametrize("settings, message", [
    ({"schedule": "0 */6 * *"}, "kubernetes.health.active_checks.schedule: '0 */6 * *' is not a cron schedule"),
    ({"schedule": "0 25 * * *"}, "'25' is not a valid hour"),
    ({"schedule": "*/0 * * * *"}, "'*/0' is not a valid minute"),
    ({"schedule": "CRON_TZ=UTC 0 * * * *"}, "is not a cron schedule"),
    ({"dcgm_level": 3}, "kubernetes.health.active_checks.dcgm_level"),
    ({"timeout_s": 10}, "kubernetes.health.active_checks.timeout_s"),
    ({"timeout_s": "900"}, "kubernetes.health.active_checks.timeout_s: Input should be a valid integer"),
    ({"enabled": "yes"}, "kubernetes.health.active_checks.enabled: Input should be a valid boolean"),
    ({"schedule": 6}, "kubernetes.health.active_checks.schedule: Input should be a valid string"),
    ({"dedicated_pools": "yes"}, "kubernetes.health.active_checks.dedicated_pools: Input should be a valid boolean"),
])
def test_bad_check_settings_are_refused_with_the_field(dev_data, settings, message):
    dev_data["kubernetes"].setdefault("health", {})["active_checks"] = settings
    assert any(message in p for p in problems_of(dev_data)), problems_of(dev_data)


def test_the_lowest_priority_is_kept_for_the_checks(dev_data):
    dev_data["kubernetes"]["kueue"]["priority_classes"] = [{"name": "idle", "value": LOWEST_PRIORITY}]
    assert any("kubernetes.kueue.priority_classes[0].value" in p for p in problems_of(dev_data))


@pytest.mark.parametrize("schedule", ["@daily", "15 1,13 * * 1-5", "0 */6 * * *"])
def test_schedules_the_api_server_takes_are_accepted(dev_data, schedule):
    dev_data["kubernetes"].setdefault("health", {})["active_checks"] = {"schedule": schedule}
    assert problems_of(dev_data) == []


def test_each_hosts_check_starts_at_its_own_time_so_a_fleet_does_not_start_at_once():
    """2,048 hosts on the default schedule, which every host had verbatim (2,048 workloads and image pulls in one
    minute): spread over the six-hour interval, at most a few a minute, each host the same on every apply, and
    every schedule one the API server's parser takes."""
    hosts = [f"gpu-{i:04d}.lab1.example" for i in range(2048)]
    schedules = [health_checks.spread("0 */6 * * *", h) for h in hosts]
    per_minute = Counter(schedules)
    assert len(per_minute) >= 300 and max(per_minute.values()) <= 16, per_minute.most_common(3)
    assert schedules == [health_checks.spread("0 */6 * * *", h) for h in hosts]
    for s in schedules[:50] + [health_checks.spread(x, hosts[7]) for x in ("*/30 * * * *", "@daily", "0 2 * * 1")]:
        assert _cron(s) == s
    assert health_checks.spread("@daily", hosts[7]).endswith(" 0 * * *")          # within the hour it names
    assert health_checks.spread("0 2 * * 1", hosts[7]).endswith(" 2 * * 1")
    assert health_checks.spread("15,45 1,13 * * 1-5", hosts[7]) == "15,45 1,13 * * 1-5"   # the site's own list


def test_the_cronjobs_carry_their_hosts_times(dev_spec):
    jobs = {o["metadata"]["labels"][health_checks.HOST_LABEL]: o["spec"]["schedule"]
            for (kind, _), o in _objects(dev_spec).items() if kind == "CronJob"}
    assert jobs and all(s == health_checks.spread(dev_spec.kubernetes.health.active_checks.schedule, h)
                        for h, s in jobs.items())
    assert len(set(jobs.values())) == len(jobs)


def test_a_dedicated_pool_gets_no_check_unless_the_spec_says_so_and_then_the_queue_says_why(dev_data):
    """The check's queue borrows whatever flavors it names, and its pods are privileged: on a pool dedicated to
    a tenant that breaks the isolation the README promises, so it is the site's stated choice."""
    dev_data["node_pools"][0]["dedicated_to"] = "team-a"
    dev_data["tenants"][1]["gpu_quota"].pop("h100", None)
    spec = parse_spec(yaml.safe_dump(dev_data))
    assert checked_pools(spec) == [] and health_checks.render_health_checks(spec) == []
    dev_data["kubernetes"].setdefault("health", {})["active_checks"] = {"dedicated_pools": True}
    spec = parse_spec(yaml.safe_dump(dev_data))
    queue = _objects(spec)[("ClusterQueue", health_checks.NAME)]
    assert queue["metadata"]["annotations"] == {health_checks.ISOLATION_EXCEPTION: (
        "active GPU checks on dedicated pool(s) h100 (kubernetes.health.active_checks.dedicated_pools)")}


# --- day 2 ----------------------------------------------------------------------------------------------------

def _actions(record, before_data, after_data):
    def plan(data):
        spec = parse_spec(yaml.safe_dump(data))
        return build_plan(record(lambda: GpuKubernetesStack("dev-k8s", spec), stack="dev")).document
    return {d.urn.rsplit("::", 1)[-1]: d.action for d in diff_plans(plan(before_data), plan(after_data))
            if GpuKubernetesStack.TYPE not in d.urn.rsplit("::", 2)[-2].rsplit("$", 1)[-1]}


def test_a_new_schedule_or_level_updates_only_the_cronjobs(record, dev_data):
    after = json.loads(json.dumps(dev_data))
    after["kubernetes"].setdefault("health", {})["active_checks"] = {"schedule": "@daily", "dcgm_level": 2}
    assert _actions(record, dev_data, after) == {f"dev-k8s-gpu-check-gpu-dev-0{i}": "update" for i in (1, 2)}


def test_a_new_priority_class_leaves_the_checks_priority_alone(record, dev_data):
    """A PriorityClass's value is immutable: a value derived from the spec would need a replacement."""
    after = json.loads(json.dumps(dev_data))
    after["kubernetes"]["kueue"]["priority_classes"].append({"name": "scavenger", "value": -1000})
    assert _actions(record, dev_data, after) == {"dev-k8s-priority-scavenger": "create"}
