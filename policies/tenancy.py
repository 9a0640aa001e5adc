"""Tenant isolation: what must hold for every tenant namespace, however its objects were written."""

from __future__ import annotations

from pulumi_policy import (
    EnforcementLevel,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

NAMESPACE = "kubernetes:core/v1:Namespace"
NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
ROLE_BINDING = "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding"
CLUSTER_ROLE_BINDING = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding"
CLUSTER_QUEUE = "kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue"
TENANT_LABEL = "gpucluster.io/tenant"


def _labels(props) -> dict:
    return ((props.get("metadata") or {}).get("labels")) or {}


def _no_cluster_admin(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type not in (ROLE_BINDING, CLUSTER_ROLE_BINDING):
        return
    ref = args.props.get("roleRef") or {}
    if ref.get("kind") == "ClusterRole" and ref.get("name") == "cluster-admin":
        subjects = ", ".join(s.get("name", "?") for s in args.props.get("subjects") or [])
        report(f"{args.name} binds cluster-admin to {subjects or 'nobody'}; bind admin, edit or view instead")


def _tenant_namespace_restricted(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type != NAMESPACE or TENANT_LABEL not in _labels(args.props):
        return
    level = _labels(args.props).get("pod-security.kubernetes.io/enforce")
    if level != "restricted":
        report(f"tenant namespace {(args.props.get('metadata') or {}).get('name')} enforces Pod Security "
               f"level {level or '(none)'}; tenant namespaces enforce restricted")


def _cluster_queue_selects_namespaces(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type != CLUSTER_QUEUE:
        return
    selector = (args.props.get("spec") or {}).get("namespaceSelector")
    if selector is None:
        report(f"{args.name} has no namespaceSelector, so Kueue admits nothing through it; select the "
               "tenant's namespace")
    elif not (selector.get("matchLabels") or selector.get("matchExpressions")):
        report(f"{args.name} selects every namespace, so any tenant can use its quota; select the tenant's "
               "namespace")


def _tenant_default_deny(args: StackValidationArgs, report: ReportViolation) -> None:
    denied = set()
    for r in args.resources:
        if r.resource_type == NETWORK_POLICY:
            spec = r.props.get("spec") or {}
            if spec.get("podSelector") == {} and set(spec.get("policyTypes") or []) == {"Ingress", "Egress"} \
                    and not spec.get("ingress") and not spec.get("egress"):
                denied.add((r.props.get("metadata") or {}).get("namespace"))
    for r in args.resources:
        if r.resource_type == NAMESPACE and TENANT_LABEL in _labels(r.props):
            name = (r.props.get("metadata") or {}).get("name")
            if name not in denied:
                report(f"tenant namespace {name} has no default-deny NetworkPolicy (empty podSelector, Ingress and "
                       "Egress, no rules); add one so only explicit allows pass", r.urn)


TENANCY_POLICIES = [
    ResourceValidationPolicy(
        name="tenancy-no-cluster-admin",
        description="Checks that no RoleBinding or ClusterRoleBinding grants cluster-admin.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=_no_cluster_admin),
    ResourceValidationPolicy(
        name="tenancy-namespace-restricted",
        description="Checks that tenant namespaces enforce the restricted Pod Security level.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=_tenant_namespace_restricted),
    ResourceValidationPolicy(
        name="tenancy-clusterqueue-namespace-selector",
        description="Checks that each Kueue ClusterQueue selects specific namespaces, not none or all.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=_cluster_queue_selects_namespaces),
    StackValidationPolicy(
        name="tenancy-default-deny",
        description="Checks that every tenant namespace has a default-deny NetworkPolicy.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=_tenant_default_deny),
]
