"""Quarantine: node-readiness-controller's rule over the detector's conditions, its controller, and what every
node agent must tolerate so that a drained node keeps what its burn-in needs."""

from __future__ import annotations

import json
import subprocess
import sys

import kubernetes_validate
import pytest
import yaml

from components.k8s import gpu_operator, health, health_nvml, network_operator, nfd, quarantine
from components.k8s.gpu_stack import GpuKubernetesStack, render_namespaces
from components.k8s.labels import POOL_LABEL, QUARANTINE_TAINT, RESET_TAINT, system_tolerations
from components.offline.diff import diff_plans
from components.offline.plan import build_plan
from components.spec import load_spec, parse_spec
from components.spec.loader import SpecError
from components.spec.cluster import SYSTEM_NAMESPACES
from tests.conftest import ROOT, problems_of

PINNED_CRD = ROOT / "tests" / "e2e" / "crds" / "readiness.node.x-k8s.io_nodereadinessrules.yaml"


def with_quarantine(make_spec, **settings):
    return make_spec(lambda d: d["kubernetes"].setdefault("health", {}).update(quarantine=settings))


def test_the_rule_holds_the_taint_until_every_health_condition_is_false(dev_spec):
    rule, reset = (r.obj["spec"] for r in quarantine.render_rules(dev_spec))
    detector = {c["type"] for cfg in (health.monitor_config(dev_spec), health.burn_in_monitor_config(),
                                      health.port_monitor_config(), health_nvml.monitor_config(dev_spec))
                for c in cfg["conditions"]}
    # a check's own trouble is never a taint; a GPU that needs a reset has a rule of its own
    assert detector - {c["type"] for c in rule["conditions"]} == {health.BLIND_CONDITION, health.RESET_CONDITION}
    detector -= {health.BLIND_CONDITION, health.RESET_CONDITION}
    # exactly the conditions the detectors set; one not yet reported counts as healthy (a new node)
    assert {c["type"] for c in rule["conditions"]} == detector == {
        health.CONDITION, health.BURN_IN_CONDITION, health.PORT_CONDITION, health_nvml.TEMPERATURE_CONDITION,
        health_nvml.NVLINK_CONDITION}
    assert all(c["requiredStatus"] == "False" == c["defaultStatus"] for c in rule["conditions"])
    assert rule["enforcementMode"] == "continuous"        # v0.5.0 requires every condition (no conditionPolicy)
    assert rule["taint"]["key"] == QUARANTINE_TAINT
    assert rule["nodeSelector"] == {"matchExpressions": [{"key": POOL_LABEL, "operator": "Exists"}]}
    # new work waits for the reset, whatever `drain` says: the jobs there run on
    assert reset["conditions"] == [{"type": health.RESET_CONDITION, "requiredStatus": "False",
                                    "defaultStatus": "False"}]
    assert reset["taint"] == {"key": RESET_TAINT, "value": "gpu-reset", "effect": "NoSchedule"}
    assert reset["nodeSelector"] == rule["nodeSelector"] and reset["dryRun"] == rule["dryRun"]


@pytest.mark.parametrize("settings, effect, dry_run", [
    ({}, "NoExecute", False), ({"drain": False}, "NoSchedule", False), ({"mode": "observe"}, "NoExecute", True)])
def test_drain_and_mode_choose_the_taint_effect_and_the_dry_run(make_spec, settings, effect, dry_run):
    rule = quarantine.render_rule(with_quarantine(make_spec, **settings)).obj["spec"]
    assert (rule["taint"]["effect"], rule["dryRun"]) == (effect, dry_run)


def test_the_rule_passes_the_pinned_crd(make_spec, shared_dir, tmp_path):
    """Schema only here (the CEL rules run in the real apiserver of `make e2e`)."""
    rules = [quarantine.render_rule(with_quarantine(make_spec, **s)).obj
             for s in ({}, {"drain": False}, {"mode": "observe"})]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump_all(rules))
    out = subprocess.run([sys.executable, str(shared_dir / "tools" / "validate_crs.py"), "--crds", str(PINNED_CRD),
                          "--strict-kinds", str(tmp_path / "rules.yaml")], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip().splitlines()[-1] == "3 validated, 0 errors", out.stdout


def test_the_taint_key_meets_the_crds_own_rules(dev_spec):
    """The CRD's CEL on spec.taint, as written there: the key is in readiness.k8s.io/ and one name of 1-63."""
    crd = yaml.safe_load(PINNED_CRD.read_text())
    (version,) = crd["spec"]["versions"]
    taint = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["taint"]
    assert any("readiness.k8s.io/" in v["rule"] for v in taint["x-kubernetes-validations"])
    prefix, _, name = QUARANTINE_TAINT.partition("/")
    assert prefix == "readiness.k8s.io" and 0 < len(name) <= 63 and "/" not in name
    assert len(quarantine.render_rule(dev_spec).obj["spec"]["taint"]["value"]) <= 63


@pytest.mark.parametrize("health_settings, installed", [
    ({"quarantine": {"mode": "off"}}, False), ({"enabled": False}, False), ({"quarantine": {"mode": "observe"}}, True)])
def test_off_or_no_detector_installs_no_controller_and_no_rule(make_spec, health_settings, installed):
    spec = make_spec(lambda d: d["kubernetes"].update(health=health_settings))
    assert quarantine.enabled(spec) is installed
    assert (quarantine.NAMESPACE in {m.obj["metadata"]["name"] for m in render_namespaces(spec)}) is installed


def test_the_controller_is_upstreams_restricted_and_off_gpu_nodes(dev_spec):
    objs = {m.obj["kind"]: m.obj for m in quarantine.render_controller(dev_spec)}
    for obj in objs.values():
        kubernetes_validate.validate(obj, dev_spec.kubernetes.version, strict=True)
    pod = objs["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"].endswith(f"node-readiness-controller:{dev_spec.kubernetes.health.quarantine.version}")
    assert pod["securityContext"]["runAsNonRoot"] and container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term == [{"matchExpressions": [{"key": POOL_LABEL, "operator": "DoesNotExist"}]}]
    verbs = {(g, r): set(rule["verbs"]) for rule in objs["ClusterRole"]["rules"] for g in rule["apiGroups"]
             for r in rule["resources"]}
    assert {"patch", "update"} <= verbs[("", "nodes")]                      # it writes the taints
    assert "update" in verbs[(quarantine.GROUP, "nodereadinessrules/finalizers")]   # and lifts them on delete
    assert quarantine.NAMESPACE in SYSTEM_NAMESPACES
    levels = {m.obj["metadata"]["name"]: m.obj["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
              for m in render_namespaces(dev_spec)}
    assert levels[quarantine.NAMESPACE] == "restricted"


def test_every_node_agent_tolerates_the_quarantine_both_ways(dev_spec):
    """A drained node keeps its driver, device plugin, NFD and the detector: the burn-in that releases it
    needs them, and the detector must keep reporting."""
    wanted = {(QUARANTINE_TAINT, "NoSchedule"), (QUARANTINE_TAINT, "NoExecute")}
    tolerated = {(t["key"], t["effect"]) for t in system_tolerations(dev_spec)}
    assert wanted <= tolerated
    assert gpu_operator.render_gpu_operator_values(dev_spec)["daemonsets"]["tolerations"] == \
        system_tolerations(dev_spec)
    assert nfd.render_nfd_values(dev_spec)["worker"]["tolerations"] == system_tolerations(dev_spec)
    ds = next(m.obj for m in health.render_gpu_health(dev_spec) if m.obj["kind"] == "DaemonSet")
    assert {"operator": "Exists", "effect": "NoExecute"} in ds["spec"]["template"]["spec"]["tolerations"]
    assert network_operator.NAMESPACE      # its NicClusterPolicy takes system_tolerations too (test_network_operator)


def test_the_crd_comes_from_the_pinned_release_or_the_sites_copy(make_spec):
    assert quarantine.crd_source(make_spec(lambda d: None)) == (
        "https://github.com/kubernetes-sigs/node-readiness-controller/releases/download/v0.5.0/crds.yaml")
    mirror = "https://mirror.example.internal/nrr/v0.5.0/crds.yaml"
    assert quarantine.crd_source(with_quarantine(make_spec, crd_url=mirror)) == mirror


@pytest.mark.parametrize("settings, message", [
    ({"mode": "strict"}, "kubernetes.health.quarantine.mode: Input should be 'enforce', 'observe' or 'off'"),
    ({"crd_url": "file:///srv/crds.yaml"}, "kubernetes.health.quarantine.crd_url: 'file:///srv/crds.yaml' is not "
                                           "an http(s) URL"),
    ({"version": "latest"}, "kubernetes.health.quarantine.version"),
    ({"drain": "yes"}, "kubernetes.health.quarantine.drain: Input should be a valid boolean"),
    ({"crd_url": "https://m.example/crds.yaml", "crd_path": "vendor/crds.yaml"},
     "kubernetes.health.quarantine.crd_path: set crd_url or crd_path, not both"),
])
def test_bad_quarantine_settings_are_refused_with_the_field(dev_data, settings, message):
    data = json.loads(json.dumps(dev_data))
    data["kubernetes"].setdefault("health", {})["quarantine"] = settings
    assert any(message in p for p in problems_of(data)), problems_of(data)


# --- day 2: a second `pulumi up` with one value changed -------------------------------------------------------

def _stack_plan(record, data):
    spec = parse_spec(yaml.safe_dump(data))
    return build_plan(record(lambda: GpuKubernetesStack("dev-k8s", spec), stack="dev")).document


def _actions(before, after):
    """What changes on the cluster: the component's own recorded intent aside."""
    return {d.urn.rsplit("::", 1)[-1]: d.action for d in diff_plans(before, after)
            if GpuKubernetesStack.TYPE not in d.urn.rsplit("::", 2)[-2].rsplit("$", 1)[-1]}


def test_a_new_drain_or_mode_is_a_new_rule_created_before_the_old_one_goes(record, dev_data):
    """The rule's spec is immutable in its CRD and deleting a rule lifts its taints (the controller's
    finalizer): its name carries its spec's digest, so a change is a new object, which the engine creates
    before it deletes the old one (no delete-first option)."""
    before = _stack_plan(record, dev_data)
    rule = next(r for r in before["resources"] if r["urn"].endswith("::dev-k8s-quarantine-rule"))
    assert not rule["options"].get("deleteBeforeReplace") and not rule["options"].get("replaceOnChanges")
    assert rule["inputs"]["metadata"]["name"].startswith("gpucluster-gpu-health-")
    assert rule["inputs"]["metadata"]["labels"]["gpucluster.io/readiness-rule"] == "gpucluster-gpu-health"
    for settings, replaced in (({"mode": "enforce"}, {"dev-k8s-quarantine-rule", "dev-k8s-reset-rule"}),
                               ({"mode": "observe", "drain": False}, {"dev-k8s-quarantine-rule"})):
        dev_data["kubernetes"]["health"] = {"quarantine": settings}
        assert _actions(before, _stack_plan(record, dev_data)) == dict.fromkeys(replaced, "replace")


def test_new_fault_xids_roll_the_detector_and_leave_the_rule_alone(record, dev_data):
    before = _stack_plan(record, dev_data)
    dev_data["kubernetes"]["health"]["fault_xids"] = [48, 79]
    assert _actions(before, _stack_plan(record, dev_data)) == {
        "dev-k8s-gpu-health-config": "update", "dev-k8s-gpu-health": "update", "dev-k8s-gpu-alerts": "update"}


def test_a_vendored_crd_that_is_not_in_the_project_is_refused_with_its_line(tmp_path):
    (tmp_path / "Pulumi.yaml").write_text("name: gpucluster\nruntime: python\n")
    (tmp_path / "stacks").mkdir()
    data = yaml.safe_load((ROOT / "stacks" / "dev.yaml").read_text())
    data["kubernetes"]["health"]["quarantine"] = {"crd_path": "vendor/nrr/crds.yaml"}
    spec_file = tmp_path / "stacks" / "dev.yaml"
    spec_file.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(SpecError) as e:
        load_spec(spec_file)
    [problem] = e.value.problems
    assert problem.startswith(f"{spec_file}:") and problem.split(":")[1].isdigit()
    assert ": kubernetes.health.quarantine.crd_path: vendor/nrr/crds.yaml is not a file in the project" in problem
    assert "vendor the release's crds.yaml there or set crd_url" in problem
    (tmp_path / "vendor" / "nrr").mkdir(parents=True)
    (tmp_path / "vendor" / "nrr" / "crds.yaml").write_text(PINNED_CRD.read_text())
    assert quarantine.crd_source(load_spec(spec_file)) == "vendor/nrr/crds.yaml"
