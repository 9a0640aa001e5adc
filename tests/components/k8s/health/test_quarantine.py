"""Quarantine: node-readiness-controller's rule over the detector's conditions, its controller, and what every
node agent must tolerate so that a drained node keeps what its burn-in needs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import kubernetes_validate
import pytest
import yaml

from components.k8s.images import through_mirror
from components.k8s.platform import gpu_operator, network_operator, nfd
from components.k8s.health import detector as health, nvml as health_nvml, quarantine
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


def _rules(spec):
    return {r.obj["metadata"]["labels"][quarantine.RULE_LABEL]: r.obj["spec"] for r in quarantine.render_rules(spec)}


def test_the_rule_holds_the_taint_until_every_health_condition_is_false(dev_spec):
    rules = _rules(dev_spec)
    rule, reset = rules[quarantine.RULE], rules[quarantine.RESET_RULE]
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


GRANTED_ONLY = {"key": quarantine.GRANT_LABEL, "operator": "In", "values": [quarantine.GRANTED]}


@pytest.mark.parametrize("settings, evict_selector, dry_run, breaker", [
    ({"mode": "enforce"}, [GRANTED_ONLY], False, True),
    ({"mode": "enforce", "evict_at_most_percent": 100}, [], False, False),
    ({"mode": "enforce", "drain": False}, None, False, False),
    ({"mode": "observe"}, [], True, False)])
def test_every_faulty_node_is_held_and_only_the_breakers_grants_are_drained(make_spec, settings, evict_selector,
                                                                           dry_run, breaker):
    """The quarantine rule stops new work on every faulty node; the evict rule, same conditions and key, drains
    the nodes the breaker granted (every faulty node where no breaker runs: 100%, or observe's dry run)."""
    spec = with_quarantine(make_spec, **settings)
    rules = _rules(spec)
    assert rules[quarantine.RULE]["taint"]["effect"] == "NoSchedule"
    evict = rules.get(quarantine.EVICT_RULE)
    if evict_selector is None:
        assert evict is None
    else:
        assert evict["taint"] == {**rules[quarantine.RULE]["taint"], "effect": "NoExecute"}
        assert evict["conditions"] == rules[quarantine.RULE]["conditions"]
        assert evict["nodeSelector"]["matchExpressions"] == [{"key": POOL_LABEL, "operator": "Exists"},
                                                             *evict_selector]
    assert {r["dryRun"] for r in rules.values()} == {dry_run}
    assert quarantine.breaker_enabled(spec) is breaker and bool(quarantine.render_breaker(spec)) is breaker


def test_the_rules_pass_the_pinned_crd(make_spec, shared_dir, tmp_path):
    """Schema only here (the CEL rules run in the real apiserver of `make e2e`)."""
    rules = [r.obj for s in ({}, {"drain": False}, {"mode": "observe"}, {"mode": "enforce"})
             for r in quarantine.render_rules(with_quarantine(make_spec, **s))]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump_all(rules))
    out = subprocess.run([sys.executable, str(shared_dir / "tools" / "validate_crs.py"), "--crds", str(PINNED_CRD),
                          "--strict-kinds", str(tmp_path / "rules.yaml")], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip().splitlines()[-1] == f"{len(rules)} validated, 0 errors", \
        out.stdout


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
    assert quarantine.crd_source(make_spec(lambda d: None).kubernetes.health.quarantine) == (
        "https://github.com/kubernetes-sigs/node-readiness-controller/releases/download/v0.5.0/crds.yaml")
    mirror = "https://mirror.example.internal/nrr/v0.5.0/crds.yaml"
    assert quarantine.crd_source(with_quarantine(make_spec, crd_url=mirror).kubernetes.health.quarantine) == mirror


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
    breaker = {f"dev-k8s-quarantine-breaker{role}": "create" for role in ("", "-sa", "-role", "-binding", "-config")}
    rules = dict.fromkeys(("dev-k8s-quarantine-rule", "dev-k8s-evict-rule", "dev-k8s-reset-rule"), "replace")
    for settings, actions in (({"mode": "enforce"}, {**rules, **breaker, "dev-k8s-gpu-alerts": "update"}),
                              ({"mode": "observe", "drain": False}, {"dev-k8s-evict-rule": "delete"})):
        dev_data["kubernetes"]["health"] = {"quarantine": settings}
        assert _actions(before, _stack_plan(record, dev_data)) == actions


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
    assert quarantine.crd_source(load_spec(spec_file).kubernetes.health.quarantine) == "vendor/nrr/crds.yaml"


# --- the circuit breaker ---------------------------------------------------------------------------------------

def test_the_breaker_is_restricted_off_gpu_nodes_and_may_only_read_and_label_nodes(make_spec):
    spec = with_quarantine(make_spec, mode="enforce", evict_at_most_percent=25)
    objs = {m.obj["kind"]: m.obj for m in quarantine.render_breaker(spec)}
    for obj in objs.values():
        kubernetes_validate.validate(obj, spec.kubernetes.version, strict=True)
    assert objs["ClusterRole"]["rules"] == [{"apiGroups": [""], "resources": ["nodes"],
                                             "verbs": ["get", "list", "patch"]}]
    deployment = objs["Deployment"]["spec"]
    assert deployment["replicas"] == 1 and deployment["strategy"] == {"type": "Recreate"}   # one breaker at a time
    pod = deployment["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "registry.k8s.io/kubectl:v1.33.5"
    assert {"name": "EVICT_AT_MOST_PERCENT", "value": "25"} in container["env"]
    assert pod["securityContext"]["runAsNonRoot"] and container["securityContext"]["readOnlyRootFilesystem"]
    term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term == [{"matchExpressions": [{"key": POOL_LABEL, "operator": "DoesNotExist"}]}]
    assert objs["ConfigMap"]["data"]["breaker.sh"] == quarantine.breaker_script()


def test_the_breaker_image_goes_through_the_mirror(make_spec):
    spec = make_spec(lambda d: (d["kubernetes"].update(image_registry="mirror.example.internal/k8s"),
                                d["kubernetes"].setdefault("health", {}).update(quarantine={"mode": "enforce"})))
    (dep,) = [through_mirror(m.obj, spec) for m in quarantine.render_breaker(spec) if m.obj["kind"] == "Deployment"]
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == \
        "mirror.example.internal/k8s/registry.k8s.io/kubectl:v1.33.5"


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed (.ci/run installs it)")
def test_the_breaker_script_is_clean(tmp_path):
    (tmp_path / "breaker.sh").write_text(quarantine.breaker_script())
    out = subprocess.run(["shellcheck", "-S", "style", str(tmp_path / "breaker.sh")], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout


def _node(name, pool, quarantined=False, evicting=False, granted=False, held=None):
    taints = [{"key": QUARANTINE_TAINT, "value": "gpu-fault", "effect": e}
              for e, on in (("NoSchedule", quarantined), ("NoExecute", evicting)) if on]
    labels = {POOL_LABEL: pool, **({quarantine.GRANT_LABEL: quarantine.GRANTED} if granted else {})}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels,
                         "annotations": {quarantine.HELD_ANNOTATION: held} if held else {}},
            "spec": {"taints": taints}}


# A kubectl double for one pass: `get nodes` prints NODES (or fails when it is absent), every other call is
# recorded and fails for the nodes in FAIL. The real apiserver and kubectl judge it in tests/e2e/test_quarantine.py.
_KUBECTL = r'''#!/bin/bash
args=" $* "
if [[ $args == *" get nodes "* ]]; then
  [[ -f $NODES ]] || { echo "The connection to the server was refused" >&2; exit 1; }
  cat "$NODES"; exit 0
fi
echo "$*" >>"$CALLS"
for n in ${FAIL:-}; do [[ $args != *" $n "* ]] || { echo "conflict" >&2; exit 1; }; done
'''


def _one_pass(tmp_path, nodes, percent, fail=""):
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    (bin_ / "kubectl").write_text(_KUBECTL)
    (bin_ / "kubectl").chmod(0o755)
    (tmp_path / "script.sh").write_text(quarantine.breaker_script())
    calls = tmp_path / "calls"
    calls.write_text("")
    if nodes is not None:
        (tmp_path / "nodes.json").write_text(json.dumps({"kind": "List", "items": nodes}))
    env = {"PATH": f"{bin_}:/usr/bin:/bin", "NODES": str(tmp_path / "nodes.json"), "CALLS": str(calls),
           "FAIL": fail, "EVICT_AT_MOST_PERCENT": str(percent), "BREAKER_ONCE": "1",
           "HEARTBEAT": str(tmp_path / "heartbeat")}
    out = subprocess.run(["bash", str(tmp_path / "script.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "heartbeat").exists()
    return [line.split(" ", 4)[1:4] for line in calls.read_text().splitlines()], out.stderr


GRANT = f"{quarantine.GRANT_LABEL}={quarantine.GRANTED}"
needs_jq = pytest.mark.skipif(shutil.which("jq") is None, reason="jq is not installed (.ci/run installs it)")


@needs_jq
def test_the_breaker_grants_at_most_its_share_of_a_pool_and_holds_the_rest_saying_why(tmp_path):
    a = [_node(f"a-{i:02}", "a", quarantined=i in (3, 5, 7, 9)) for i in range(10)]
    b = [_node("b-01", "b", quarantined=True)]             # one node: the share rounds down to none, at least one
    calls, log = _one_pass(tmp_path, a + b, percent=20)
    assert [c for c in calls if c[0] == "label"] == [
        ["label", "node", "a-03"], ["label", "node", "a-05"], ["label", "node", "b-01"]]
    held = [c[2] for c in calls if c[0] == "annotate"]
    assert held == ["a-07", "a-09"]
    assert "hold a-07: breaker open: 2 of the 10 nodes of pool a evicted at once, at most 2 (20%); 2 more held " \
           "NoSchedule, their jobs running: check the detectors before the GPUs" in log


@needs_jq
def test_a_grant_is_taken_back_only_once_the_node_carries_neither_taint(tmp_path):
    """The rule leaves its taint on a node it no longer selects: a grant goes only after both taints are off."""
    nodes = [_node("a-01", "a", granted=True),                                        # recovered: released
             _node("a-02", "a", evicting=True, granted=True),                         # NoSchedule off first
             _node("a-03", "a", quarantined=True, evicting=True),                     # its grant lost: given back
             _node("a-04", "a", quarantined=True)]                                    # no room: held
    calls, _ = _one_pass(tmp_path, nodes, percent=50)
    assert calls[:2] == [["label", "node", "a-03"], ["label", "node", "a-01"]]
    assert f"{quarantine.GRANT_LABEL}-" in (tmp_path / "calls").read_text().splitlines()[1]
    assert [c[2] for c in calls if c[0] == "annotate"] == ["a-04"]
    assert not any(c[2] == "a-02" for c in calls)


@needs_jq
def test_a_held_node_is_marked_once_and_unmarked_when_granted(tmp_path):
    why = ("breaker open: 1 of the 2 nodes of pool a evicted at once, at most 1 (50%); 1 more held NoSchedule, "
           "their jobs running: check the detectors before the GPUs")
    nodes = [_node("a-01", "a", quarantined=True, evicting=True, granted=True),
             _node("a-02", "a", quarantined=True, held=why)]
    assert _one_pass(tmp_path, nodes, percent=50)[0] == []                      # nothing to write again
    nodes[0] = _node("a-01", "a", granted=True)                                 # a-01 recovered
    calls, _ = _one_pass(tmp_path, nodes, percent=50)
    assert calls == [["label", "node", "a-01"], ["label", "node", "a-02"], ["annotate", "node", "a-02"]]
    assert (tmp_path / "calls").read_text().splitlines()[2].endswith(f"{quarantine.HELD_ANNOTATION}-")


@needs_jq
def test_the_breakers_own_trouble_changes_no_node(tmp_path):
    """An apiserver it cannot reach is no verdict: the pass changes nothing, says so, and the loop goes on."""
    calls, log = _one_pass(tmp_path, None, percent=10)
    assert calls == [] and "cannot read the GPU nodes: no node granted or released this pass" in log
    nodes = [_node("a-01", "a", quarantined=True), _node("b-01", "b", quarantined=True)]
    calls, log = _one_pass(tmp_path, nodes, percent=10, fail="a-01")
    assert [c[2] for c in calls] == ["a-01", "b-01"]
    assert "could not grant a-01: left for the next pass" in log and "grant b-01" in log
