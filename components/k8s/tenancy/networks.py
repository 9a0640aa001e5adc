"""The fence around tenants' secondary networks: a pod of a tenant namespace attaches its own networks or the
shared ones, never another tenant's.

Multus resolves `namespace/name` in a pod's k8s.v1.cni.cncf.io/networks across namespaces unless its own
namespaceIsolation is on, which the Network Operator does not set; and it acts on the node, after the pod is
admitted. A ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1, Kubernetes 1.30+) refuses such a pod
at the apiserver, with a message that names the network, before it exists. Multus reads the annotation in two
forms (its docs, "How to use": a comma list of `[namespace/]name[@interface]`, or a JSON list of objects with
`namespace` and `name`); Go's JSON reader matches keys without regard to case and decodes escapes, so a JSON
form with an escape is refused whole and keys are matched without case.
"""

from __future__ import annotations

import json

from ...spec import ClusterSpec
from ..objects import Manifest
from ..rails import NETWORK_NAMESPACE, NETWORKS_ANNOTATION, tenant_networks
from .tenant import TENANT_LABEL

POLICY = "gpucluster-tenant-networks"
API = "admissionregistration.k8s.io/v1"
DEFAULT_NETWORK_ANNOTATION = "v1.multus-cni.io/default-network"   # Multus reads it the same way


_JSON_FORM = "matches('[\\\\[{\"]')"   # Multus: JSON when the value holds any of [ { "


def _annotation(annotation: str) -> tuple[str, str]:
    """CEL: (whether the pod carries `annotation`, its value)."""
    key = json.dumps(annotation)
    return (f"has(object.metadata.annotations) && {key} in object.metadata.annotations",
            f"object.metadata.annotations[{key}]")


def _foreign(annotation: str) -> str:
    """CEL: the namespaces other than the pod's own and the shared one that `annotation` names, read as Multus
    reads it (k8sclient.go, parsePodNetworkAnnotation): JSON when it holds any of `[{"`, its `namespace` keys
    matched without case as Go's JSON reader matches them; else a comma list whose items name a namespace
    before a `/`, both trimmed of spaces."""
    present, value = _annotation(annotation)
    named = (f"({value}.{_JSON_FORM} ? "
             f"{value}.findAll('(?i)\"namespace\"\\\\s*:\\\\s*\"[^\"]*\"').map(m, m.split('\"')[3]) : "
             f"{value}.split(',').filter(n, n.contains('/')).map(n, n.trim().split('/')[0].trim()))")
    return f"{present} ? {named}.filter(ns, ns != request.namespace && ns != {json.dumps(NETWORK_NAMESPACE)}) : []"


def _escaped(annotation: str) -> str:
    """CEL: `annotation` is absent, in the comma form, or JSON without an escape."""
    present, value = _annotation(annotation)
    return f"!({present}) || !{value}.{_JSON_FORM} || !{value}.contains('\\\\')"


def render_network_fence(spec: ClusterSpec) -> list[Manifest]:
    """The policy and its binding to every tenant namespace (the label each Tenant's namespace carries, which a
    tenant's own roles cannot change); none where no tenant has networks of its own."""
    if not tenant_networks(spec):
        return []
    annotations = (NETWORKS_ANNOTATION, DEFAULT_NETWORK_ANNOTATION)
    policy = {
        "apiVersion": API, "kind": "ValidatingAdmissionPolicy", "metadata": {"name": POLICY},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                    "operations": ["CREATE"], "resources": ["pods"]}]},
            "variables": [{"name": "foreign", "expression": " + ".join(f"({_foreign(a)})" for a in annotations)}],
            "validations": [
                *({"expression": _escaped(a),
                   "message": f"{a} in the JSON form may not hold an escape (a backslash) in a tenant namespace: "
                              "write its names plainly, or use the form namespace/name[@interface],...",
                   "reason": "Forbidden"} for a in annotations),
                {"expression": "size(variables.foreign) == 0",
                 "messageExpression": "'the pod names a network of namespace ' + variables.foreign[0] + "
                                      "' in its Multus annotations: a pod of tenant namespace ' + request.namespace"
                                      " + ' may attach its own networks (' + request.namespace + '/NAME) or the "
                                      f"shared ones ({NETWORK_NAMESPACE}/NAME), never another tenant\\'s'",
                 "reason": "Forbidden"},
            ],
        },
    }
    binding = {
        "apiVersion": API, "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": POLICY},
        "spec": {"policyName": POLICY, "validationActions": ["Deny"],
                 "matchResources": {"namespaceSelector": {"matchExpressions": [
                     {"key": TENANT_LABEL, "operator": "Exists"}]}}},
    }
    return [Manifest("tenant-networks-policy", policy), Manifest("tenant-networks-binding", binding)]
