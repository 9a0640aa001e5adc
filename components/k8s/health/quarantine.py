"""Quarantine: node-readiness-controller (kubernetes-sigs) taints a GPU node while its health conditions say so.

A second rule, `gpucluster-gpu-reset`, taints a node NoSchedule while GpuResetRequired is True (an XID that NVIDIA's
catalog resolves by a GPU reset or a reboot): new work waits, the jobs there run on, the reboot releases it.

One NodeReadinessRule on every GPU node, in continuous enforcement: its NoSchedule taint stays while GpuHardwareFault,
GpuBurnInRequired or FabricPortFault (detector.py), or GpuOverheating or GpuNvlinkDown (nvml.py, when the spec
quarantines on them) is anything but False, and goes once all are False again. A condition the
detector has not yet reported counts as False (the rule's defaultStatus; upstream's "problem gate" pattern), so
a new node waits only for its burn-in taint. Draining is Kubernetes' own: a second rule, `gpucluster-gpu-evict`,
with the same conditions and the same taint key, taints NoExecute, so the taint eviction controller evicts every
pod that does not tolerate it, and Kueue (TASReplaceNodeOnNodeTaints and TASFailedNodeReplacement, on by default
in 0.19) requeues the workloads whose pods were there.

The circuit breaker: the evict rule selects only the nodes the breaker grants (label gpucluster.io/quarantine-
evict=granted), and the breaker (a Deployment beside the controller, breaker.sh below) grants at most
evict_at_most_percent of a pool at once, among the nodes the first rule holds. The rest stay NoSchedule, marked
why (annotation gpucluster.io/quarantine-held), and alerted: a fault on many nodes at once is more often a
detector's, a driver's or the site's than the GPUs', and evicting a pool's jobs for it would be the outage. The
breaker only grants and takes back grants; node-readiness-controller alone adds and removes taints, so a node
recovers (its conditions False, both taints off) whether or not the breaker runs, and a breaker that is down or
cannot reach the apiserver evicts nothing (its own failure is never a verdict). It takes a grant back only once
the node carries neither taint: a rule leaves its taint on a node it no longer selects (ruleAppliesTo in v0.5.0).

Upstream ships no chart for it yet (registry.k8s.io OCI is "WIP"), only release manifests: the CRD is applied
from the pinned release's crds.yaml (or the site's copy); the namespace, RBAC and Deployment are rendered here
from its config/ (rbac/role.yaml, rbac/leader_election_role.yaml, manager/manager.yaml of v0.5.0), without the
optional webhook and secure metrics, which need cert-manager.

The rule's conditions, taint, selector and mode are immutable (CEL in its CRD), and its deletion removes its
taint from every node (the controller's cleanup finalizer). A rule deleted before its replacement would lift
every quarantine until the new one reconciled, so each rule's name ends in a digest of its spec: a change is a
new rule, created first (its taints go on), and the old one deleted after. `gpucluster diff` flags any
delete-first replacement of a taint-owning object (diff.TAINT_OWNERS).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ...bash import fill
from ...spec import ClusterSpec
from ...spec.cluster import OPERATOR_NAMESPACES
from ...spec.kubernetes import QuarantineSettings
from . import nvml as health_nvml
from .detector import QUARANTINE_CONDITIONS, RESET_CONDITION
from ..labels import POOL_LABEL, QUARANTINE_TAINT, RESET_TAINT, TOLERATE_EVERY_TAINT
from ..objects import Manifest, rbac_rule

NAMESPACE = OPERATOR_NAMESPACES["node_readiness"]
NAME = "nrr-controller-manager"
RULE = "gpucluster-gpu-health"
RESET_RULE = "gpucluster-gpu-reset"
EVICT_RULE = "gpucluster-gpu-evict"
RULE_LABEL = "gpucluster.io/readiness-rule"     # which rule a digest-named NodeReadinessRule is (RULE, ...)
GRANT_LABEL = "gpucluster.io/quarantine-evict"  # the breaker's grant: the evict rule selects these nodes
GRANTED = "granted"
HELD_ANNOTATION = "gpucluster.io/quarantine-held"   # why the breaker holds a quarantined node NoSchedule only
BREAKER = "gpucluster-quarantine-breaker"
IMAGE = "registry.k8s.io/node-readiness-controller/node-readiness-controller"
GROUP = "readiness.node.x-k8s.io"
_LABELS = {"app.kubernetes.io/name": "node-readiness-controller", "app.kubernetes.io/managed-by": "pulumi"}


def enabled(spec: ClusterSpec) -> bool:
    return spec.quarantines


def crd_source(q: QuarantineSettings) -> str:
    """Where the NodeReadinessRule CRD comes from: the project file, the site's URL, or the pinned release."""
    return q.crd_path or q.crd_url or \
        f"https://github.com/kubernetes-sigs/node-readiness-controller/releases/download/{q.version}/crds.yaml"


def conditions(spec: ClusterSpec) -> tuple[str, ...]:
    """The conditions that hold a node: the kernel detector's, and those of the NVML detector the spec
    quarantines on (health.gpu_monitor.quarantine_on)."""
    return QUARANTINE_CONDITIONS + health_nvml.quarantine_conditions(spec)


def image(q: QuarantineSettings) -> str:
    return f"{IMAGE}:{q.version}"


def breaker_enabled(spec: ClusterSpec) -> bool:
    """A breaker runs where a rule evicts for real and not every faulty node may be evicted."""
    q = spec.kubernetes.health.quarantine
    return q.mode == "enforce" and q.drain and q.evict_at_most_percent < 100


def rule_name(base: str, rule_spec: dict[str, Any]) -> str:
    """`<base>-<digest of the spec>`: a changed rule is a new object, created before the old one is deleted."""
    return f"{base}-{hashlib.sha256(json.dumps(rule_spec, sort_keys=True).encode()).hexdigest()[:8]}"


def _rule(spec: ClusterSpec, role: str, base: str, conditions: tuple[str, ...], taint: dict[str, str],
          granted_only: bool = False) -> Manifest:
    selector = [{"key": POOL_LABEL, "operator": "Exists"}] + \
        ([{"key": GRANT_LABEL, "operator": "In", "values": [GRANTED]}] if granted_only else [])
    rule_spec = {
        "conditions": [{"type": c, "requiredStatus": "False", "defaultStatus": "False"} for c in conditions],
        "taint": taint,
        "enforcementMode": "continuous",
        "nodeSelector": {"matchExpressions": selector},
        "dryRun": spec.kubernetes.health.quarantine.mode == "observe"}
    return Manifest(role, {
        "apiVersion": f"{GROUP}/v1alpha1", "kind": "NodeReadinessRule",
        "metadata": {"name": rule_name(base, rule_spec), "labels": {**_LABELS, RULE_LABEL: base}},
        "spec": rule_spec})


def render_rule(spec: ClusterSpec) -> Manifest:
    """The quarantine: a fault that needs NVIDIA's diagnosis, or one not yet followed by a passing burn-in. No
    new work lands on the node; the evict rule drains it."""
    return _rule(spec, "quarantine-rule", RULE, conditions(spec),
                 {"key": QUARANTINE_TAINT, "value": "gpu-fault", "effect": "NoSchedule"})


def render_evict_rule(spec: ClusterSpec) -> Manifest:
    """The drain: the same conditions, NoExecute, on the nodes the breaker granted (every GPU node without one)."""
    return _rule(spec, "evict-rule", EVICT_RULE, conditions(spec),
                 {"key": QUARANTINE_TAINT, "value": "gpu-fault", "effect": "NoExecute"},
                 granted_only=breaker_enabled(spec))


def render_reset_rule(spec: ClusterSpec) -> Manifest:
    """A GPU that needs a reset (GpuResetRequired): NoSchedule whatever `drain` says, so the jobs already there
    run on and new work waits; the reboot that resets the GPU clears the condition and the taint."""
    return _rule(spec, "reset-rule", RESET_RULE, (RESET_CONDITION,),
                 {"key": RESET_TAINT, "value": "gpu-reset", "effect": "NoSchedule"})


def render_rules(spec: ClusterSpec) -> list[Manifest]:
    drain = [render_evict_rule(spec)] if spec.kubernetes.health.quarantine.drain else []
    return [render_rule(spec), *drain, render_reset_rule(spec)]


def render_controller(spec: ClusterSpec) -> list[Manifest]:
    """Service account, its cluster role (nodes and rules) and leader-election role, and the Deployment."""
    meta = {"namespace": NAMESPACE, "labels": dict(_LABELS)}
    cluster_rules = [
        rbac_rule([""], ["nodes"], ["get", "list", "patch", "update", "watch"]),
        rbac_rule([""], ["nodes/status"], ["get"]),
        rbac_rule(["", "events.k8s.io"], ["events"], ["create", "patch"]),
        rbac_rule([GROUP], ["nodereadinessrules"], ["get", "list", "patch", "update", "watch"]),
        rbac_rule([GROUP], ["nodereadinessrules/finalizers"], ["update"]),
        rbac_rule([GROUP], ["nodereadinessrules/status"], ["get", "patch", "update"])]
    election_rules = [
        rbac_rule(["coordination.k8s.io"], ["leases"], ["get", "list", "watch", "create", "update", "patch", "delete"]),
        rbac_rule([""], ["events"], ["create", "patch"])]
    subject = [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]
    selector = {"app.kubernetes.io/name": "node-readiness-controller", "control-plane": "controller-manager"}
    probe = lambda path, delay, period: {"httpGet": {"path": path, "port": 8081},  # noqa: E731
                                         "initialDelaySeconds": delay, "periodSeconds": period}
    container = {
        "name": "manager", "image": image(spec.kubernetes.health.quarantine), "command": ["/manager"],
        "args": ["--leader-elect", "--health-probe-bind-address=:8081"],
        "ports": [{"containerPort": 8081, "name": "http"}],
        "securityContext": {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]}},
        "livenessProbe": probe("/healthz", 15, 20), "readinessProbe": probe("/readyz", 5, 10),
        "resources": {"limits": {"cpu": "500m", "memory": "128Mi"}, "requests": {"cpu": "10m", "memory": "64Mi"}}}
    return [
        Manifest("quarantine-sa", {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": NAME, **meta}}),
        Manifest("quarantine-role", {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                                     "metadata": {"name": NAME, "labels": dict(_LABELS)}, "rules": cluster_rules}),
        Manifest("quarantine-binding", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": NAME, "labels": dict(_LABELS)},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
            "subjects": subject}),
        Manifest("quarantine-election-role", {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                                              "metadata": {"name": f"{NAME}-leader-election", **meta},
                                              "rules": election_rules}),
        Manifest("quarantine-election-binding", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": f"{NAME}-leader-election", **meta},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"{NAME}-leader-election"},
            "subjects": subject}),
        Manifest("quarantine-controller", {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": NAME, **meta},
            "spec": {"replicas": 1, "selector": {"matchLabels": selector}, "template": {
                "metadata": {"labels": {**_LABELS, **selector},
                             "annotations": {"kubectl.kubernetes.io/default-container": "manager"}},
                "spec": {
                    # Cluster-critical, as upstream: without it no node leaves quarantine.
                    "priorityClassName": "system-cluster-critical", "serviceAccountName": NAME,
                    "terminationGracePeriodSeconds": 10,
                    "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                    # Upstream tolerates every taint, so it runs on control-plane nodes too; here it also stays
                    # off GPU nodes, whose allocatable the job templates hand out whole (its memory there would
                    # keep a job that takes a whole node from fitting). A cluster without a node outside the
                    # pools (control-plane nodes count) leaves it pending, and `pulumi up`, which awaits it, fails
                    # naming it.
                    "tolerations": [dict(t) for t in TOLERATE_EVERY_TAINT], "affinity": _off_gpu_nodes(),
                    "containers": [container]}}}}),
    ]


def _off_gpu_nodes() -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": POOL_LABEL, "operator": "DoesNotExist"}]}]}}}


# The breaker's loop (kubectl, bash and jq; its image is quarantine.kubectl_image). Every pass reads the GPU
# nodes once and, per pool, counts the nodes in use (NoExecute-tainted, or granted and still quarantined), takes
# back the grants of nodes that carry neither taint, and grants the quarantined nodes waiting, by name, while the
# pool is under its share; the rest it marks held, with why. Every call is time-bound; a pass that cannot read
# the nodes changes nothing. BREAKER_ONCE=1: one pass (the tests).
BREAKER_SCRIPT = r'''#!/bin/bash
set -euo pipefail
readonly POOL_LABEL=@POOL_LABEL@ TAINT=@TAINT@ GRANT=@GRANT@ GRANTED=@GRANTED@ HELD=@HELD@
readonly PERCENT=${EVICT_AT_MOST_PERCENT:?} PERIOD_S=${PERIOD_S:-15} HEARTBEAT=${HEARTBEAT:-/tmp/heartbeat}

log() { echo "quarantine breaker: $*" >&2; }
kube() { timeout 30 kubectl --request-timeout=20s "$@"; }

# One line per change: "grant|release|unhold <node>" or "hold <node> <why>".
decide() {
  jq -r --arg pool "$POOL_LABEL" --arg taint "$TAINT" --arg grant "$GRANT" --arg granted "$GRANTED" \
     --arg held "$HELD" --argjson percent "$PERCENT" '
    def tainted($effect): any(.spec.taints[]?; .key == $taint and .effect == $effect);
    [.items[] | {name: .metadata.name, pool: .metadata.labels[$pool],
                 quarantined: tainted("NoSchedule"), evicting: tainted("NoExecute"),
                 granted: (.metadata.labels[$grant] == $granted), held: (.metadata.annotations[$held] // "")}]
    | group_by(.pool)[]
    | . as $nodes | length as $size
    | ([1, ($size * $percent / 100 | floor)] | max) as $cap
    | [$nodes[] | select(.evicting or (.granted and .quarantined))] as $inuse
    | [$nodes[] | select(.quarantined and (.granted | not) and (.evicting | not))] as $waiting
    | ([$cap - ($inuse | length), 0] | max) as $room
    | ($waiting[$room:] | map(.name)) as $holding
    | ($inuse[] | select(.granted | not) | "grant \(.name)"),
      ($nodes[] | select(.granted and (.quarantined | not) and (.evicting | not)) | "release \(.name)"),
      ($waiting[:$room][] | "grant \(.name)"),
      ($waiting[$room:][]
       | "breaker open: \(($inuse | length) + $room) of the \($size) nodes of pool \(.pool) evicted at once, at most \($cap) (\($percent)%); \($holding | length) more held NoSchedule, their jobs running: check the detectors before the GPUs" as $why
       | select(.held != $why) | "hold \(.name) \($why)"),
      ($nodes[] | select(.held != "" and (.name as $n | $holding | any(. == $n) | not)) | "unhold \(.name)")'
}

act() {
  local verb=$1 node=$2 why=${3:-}
  case $verb in
    grant) kube label node "$node" "$GRANT=$GRANTED" --overwrite >/dev/null ;;
    release) kube label node "$node" "$GRANT-" >/dev/null ;;
    hold) kube annotate node "$node" --overwrite "$HELD=$why" >/dev/null ;;
    unhold) kube annotate node "$node" "$HELD-" >/dev/null ;;
    *) log "unknown action $verb"; return 1 ;;
  esac
}

pass() {
  local nodes actions verb node why
  if ! nodes=$(kube get nodes -l "$POOL_LABEL" -o json); then
    log "cannot read the GPU nodes: no node granted or released this pass"
    return 0
  fi
  if ! actions=$(decide <<<"$nodes"); then
    log "cannot read the node list kubectl returned: no node granted or released this pass"
    return 0
  fi
  while read -r verb node why; do
    [[ -n $verb ]] || continue
    if act "$verb" "$node" "$why"; then
      log "$verb $node${why:+: $why}"
    else
      log "could not $verb $node: left for the next pass"
    fi
  done <<<"$actions"
}

while :; do
  pass
  touch "$HEARTBEAT"
  [[ -z ${BREAKER_ONCE:-} ]] || break
  sleep "$PERIOD_S"
done
'''


def breaker_script() -> str:
    return fill(BREAKER_SCRIPT, POOL_LABEL=POOL_LABEL, TAINT=QUARANTINE_TAINT, GRANT=GRANT_LABEL, GRANTED=GRANTED,
                HELD=HELD_ANNOTATION)


def render_breaker(spec: ClusterSpec) -> list[Manifest]:
    """Its service account, a cluster role that reads and labels nodes, the script, and a Deployment of one
    (Recreate: two breakers at once could each grant the last room) placed as the controller is."""
    if not breaker_enabled(spec):
        return []
    q = spec.kubernetes.health.quarantine
    labels = {**_LABELS, "app.kubernetes.io/name": BREAKER}
    meta = {"namespace": NAMESPACE, "labels": labels}
    data = {"breaker.sh": breaker_script()}
    checksum = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
    container = {
        "name": "breaker", "image": q.kubectl_image, "command": ["/bin/bash", "/config/breaker.sh"],
        "env": [{"name": "EVICT_AT_MOST_PERCENT", "value": str(q.evict_at_most_percent)},
                {"name": "HOME", "value": "/tmp"}],
        # Every pass touches the heartbeat, even one that could not reach the apiserver: a loop that stops is
        # restarted, an apiserver that is away is not the breaker's to fix.
        "livenessProbe": {"exec": {"command": ["/bin/bash", "-c", '[[ -n $(find /tmp/heartbeat -mmin -3) ]]']},
                          "initialDelaySeconds": 60, "periodSeconds": 60},
        "securityContext": {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]}},
        "resources": {"limits": {"cpu": "200m", "memory": "128Mi"}, "requests": {"cpu": "10m", "memory": "32Mi"}},
        "volumeMounts": [{"name": "config", "mountPath": "/config", "readOnly": True},
                         {"name": "tmp", "mountPath": "/tmp"}]}
    subject = [{"kind": "ServiceAccount", "name": BREAKER, "namespace": NAMESPACE}]
    return [
        Manifest("quarantine-breaker-sa", {"apiVersion": "v1", "kind": "ServiceAccount",
                                           "metadata": {"name": BREAKER, **meta}}),
        Manifest("quarantine-breaker-role", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": BREAKER, "labels": labels},
            "rules": [rbac_rule([""], ["nodes"], ["get", "list", "patch"])]}),
        Manifest("quarantine-breaker-binding", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": BREAKER, "labels": labels},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": BREAKER},
            "subjects": subject}),
        Manifest("quarantine-breaker-config", {"apiVersion": "v1", "kind": "ConfigMap",
                                               "metadata": {"name": BREAKER, **meta}, "data": data}),
        Manifest("quarantine-breaker", {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": BREAKER, **meta},
            "spec": {"replicas": 1, "strategy": {"type": "Recreate"},
                     "selector": {"matchLabels": {"app.kubernetes.io/name": BREAKER}}, "template": {
                "metadata": {"labels": labels, "annotations": {"gpucluster.io/config-sha256": checksum}},
                "spec": {
                    "priorityClassName": "system-cluster-critical", "serviceAccountName": BREAKER,
                    "terminationGracePeriodSeconds": 5,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 65534, "runAsGroup": 65534,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "tolerations": [dict(t) for t in TOLERATE_EVERY_TAINT], "affinity": _off_gpu_nodes(),
                    "containers": [container],
                    "volumes": [{"name": "config", "configMap": {"name": BREAKER, "defaultMode": 0o555}},
                                {"name": "tmp", "emptyDir": {"sizeLimit": "16Mi"}}]}}}}),
    ]
