"""What node-readiness-controller does with the plan's NodeReadinessRules, for the control plane here, and one
pass of the plan's own circuit breaker between them.

No version of node-readiness-controller is served by the Go module proxy (v0.1.0 to v0.5.0 refused), so it
cannot run here: this is the one stand-in of the quarantine chain, and that part stays unproven. It follows
v0.5.0's evaluateRuleForNode (internal/controller/nodereadinessrule_controller.go), getConditionStatus and
ruleAppliesTo (node_controller.go): a rule acts only on the nodes its nodeSelector matches (and leaves its taint
on a node it no longer matches); a condition the node lacks takes the rule's defaultStatus; a rule is satisfied
when every condition has its requiredStatus; in continuous mode the taint is added while it is not and removed
once it is; in dry run nothing changes on the node. Everything else in the chain is real: the detector that sets
the conditions, the rules as the apiserver accepted them, the breaker's script with the real kubectl and jq, the
taint eviction controller and Kueue.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Any

from components.k8s.health.quarantine import BREAKER, EVICT_RULE, RULE, RULE_LABEL

from .controlplane import ControlPlane


def satisfied(rule: dict[str, Any], node: dict[str, Any]) -> bool:
    status = {c["type"]: c["status"] for c in node["status"].get("conditions", [])}
    return all(status.get(c["type"], c.get("defaultStatus", "Unknown")) == c["requiredStatus"]
               for c in rule["spec"]["conditions"])


def applies(rule: dict[str, Any], node: dict[str, Any]) -> bool:
    """metav1.LabelSelectorAsSelector(rule.spec.nodeSelector).Matches(node labels), for what the plan writes."""
    labels = node["metadata"].get("labels") or {}
    selector = rule["spec"].get("nodeSelector") or {}
    ops = {"Exists": lambda e: e["key"] in labels, "DoesNotExist": lambda e: e["key"] not in labels,
           "In": lambda e: labels.get(e["key"]) in e["values"],
           "NotIn": lambda e: labels.get(e["key"]) not in e["values"]}
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items()) and \
        all(ops[e["operator"]](e) for e in selector.get("matchExpressions") or [])


def reconcile(cp: ControlPlane, rule: dict[str, Any] | Quarantine, node_name: str) -> bool:
    """One evaluation of the rule for the node; returns whether the node carries the rule's taint after it. For
    the plan's whole quarantine, whether the node is quarantined (Quarantine.reconcile)."""
    if isinstance(rule, Quarantine):
        return rule.reconcile(cp, node_name)
    node = cp.get("node", node_name)
    spec = rule["spec"]
    taint = spec["taint"]
    taints = node["spec"].get("taints") or []
    has = any(t["key"] == taint["key"] and t["effect"] == taint["effect"] for t in taints)
    if spec.get("dryRun") or not applies(rule, node):
        return has
    want = not satisfied(rule, node)
    if want != has:
        new = [t for t in taints if not (t["key"] == taint["key"] and t["effect"] == taint["effect"])] + \
            ([dict(taint)] if want else [])
        cp.kubectl("patch", "node", node_name, "--type=merge", "-p", json.dumps({"spec": {"taints": new}}))
    return want


@dataclass(frozen=True)
class Quarantine:
    """The plan's quarantine rule, its evict rule (drain) and its breaker (script and share), if any."""
    hold: dict[str, Any]
    evict: dict[str, Any] | None
    breaker: str | None
    percent: int

    @classmethod
    def of(cls, objects: list[dict[str, Any]]) -> Quarantine:
        rules = {o["metadata"]["labels"][RULE_LABEL]: o for o in objects if o["kind"] == "NodeReadinessRule"}
        script = next((o["data"]["breaker.sh"] for o in objects
                       if o["kind"] == "ConfigMap" and o["metadata"]["name"] == BREAKER), None)
        percent = next((int(e["value"]) for o in objects if o["kind"] == "Deployment"
                        and o["metadata"]["name"] == BREAKER
                        for e in o["spec"]["template"]["spec"]["containers"][0]["env"]
                        if e["name"] == "EVICT_AT_MOST_PERCENT"), 100)
        return cls(rules[RULE], rules.get(EVICT_RULE), script, percent)

    def settle(self, cp: ControlPlane, nodes: list[str]) -> str:
        """The quarantine rule on each node, one breaker pass, the evict rule on each node; the breaker's log."""
        for node in nodes:
            reconcile(cp, self.hold, node)
        log = self.run_breaker(cp) if self.breaker else ""
        for node in nodes if self.evict else []:
            reconcile(cp, self.evict, node)
        return log

    def reconcile(self, cp: ControlPlane, node: str) -> bool:
        self.settle(cp, [node])
        return reconcile(cp, self.hold, node)

    def run_breaker(self, cp: ControlPlane) -> str:
        """One pass of the plan's breaker.sh with the control plane's kubectl (and this machine's bash and jq)."""
        assert self.breaker is not None
        with tempfile.TemporaryDirectory() as d:
            env = {**os.environ, "PATH": f"{cp.bin}:{os.environ['PATH']}", "KUBECONFIG": str(cp.kubeconfig),
                   "EVICT_AT_MOST_PERCENT": str(self.percent), "BREAKER_ONCE": "1", "HEARTBEAT": f"{d}/heartbeat"}
            out = subprocess.run(["bash", "-c", self.breaker], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stderr
