"""What node-readiness-controller does with one NodeReadinessRule and one node, for the control plane here.

No version of node-readiness-controller is served by the Go module proxy (v0.1.0 to v0.5.0 refused), so it
cannot run here: this is the one stand-in of the quarantine chain, and that part stays unproven. It follows
v0.5.0's evaluateRuleForNode (internal/controller/nodereadinessrule_controller.go) and getConditionStatus
(node_controller.go): a condition the node lacks takes the rule's defaultStatus; a rule is satisfied when every
condition has its requiredStatus; in continuous mode the taint is added while it is not and removed once it
is; in dry run nothing changes on the node. Everything else in the chain is real: the detector that sets the
conditions, the rule as the apiserver accepted it, the taint eviction controller and Kueue.
"""

from __future__ import annotations

import json
from typing import Any

from .controlplane import ControlPlane


def satisfied(rule: dict[str, Any], node: dict[str, Any]) -> bool:
    status = {c["type"]: c["status"] for c in node["status"].get("conditions", [])}
    return all(status.get(c["type"], c.get("defaultStatus", "Unknown")) == c["requiredStatus"]
               for c in rule["spec"]["conditions"])


def reconcile(cp: ControlPlane, rule: dict[str, Any], node_name: str) -> bool:
    """One evaluation of the rule for the node; returns whether the node carries the rule's taint after it."""
    node = cp.get("node", node_name)
    spec = rule["spec"]
    taint = spec["taint"]
    taints = node["spec"].get("taints") or []
    has = any(t["key"] == taint["key"] and t["effect"] == taint["effect"] for t in taints)
    if spec.get("dryRun"):
        return has
    want = not satisfied(rule, node)
    if want != has:
        new = [t for t in taints if t["key"] != taint["key"]] + ([dict(taint)] if want else [])
        cp.kubectl("patch", "node", node_name, "--type=merge", "-p", json.dumps({"spec": {"taints": new}}))
    return want
