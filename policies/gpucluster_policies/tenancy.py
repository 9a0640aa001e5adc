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

from .common import (CLUSTER_QUEUE, CLUSTER_ROLE, CLUSTER_ROLE_BINDING, LOCAL_QUEUE, NAMESPACE, NETWORK_POLICY,
                     ROLE, ROLE_BINDING, TENANT_LABEL, labels, metadata, of_type, tenant_namespaces)


def _no_cluster_admin(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type not in (ROLE_BINDING, CLUSTER_ROLE_BINDING):
        return
    ref = args.props.get("roleRef") or {}
    if ref.get("kind") == "ClusterRole" and ref.get("name") == "cluster-admin":
        subjects = ", ".join(s.get("name", "?") for s in args.props.get("subjects") or [])
        report(f"{args.name} binds cluster-admin to {subjects or 'nobody'}; bind admin, edit or view instead")


def _tenant_namespace_restricted(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type != NAMESPACE or TENANT_LABEL not in labels(args.props):
        return
    level = labels(args.props).get("pod-security.kubernetes.io/enforce")
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
        if r.resource_type == NAMESPACE and TENANT_LABEL in labels(r.props):
            name = (r.props.get("metadata") or {}).get("name")
            if name not in denied:
                report(f"tenant namespace {name} has no default-deny NetworkPolicy (empty podSelector, Ingress and "
                       "Egress, no rules); add one so only explicit allows pass", r.urn)


def _tenant_local_queue(args: StackValidationArgs, report: ReportViolation) -> None:
    queued = {metadata(r.props).get("namespace") for r in of_type(args.resources, LOCAL_QUEUE)}
    for name, ns in sorted(tenant_namespaces(args.resources).items()):
        if name not in queued:
            report(f"tenant namespace {name} has no Kueue LocalQueue, so its jobs cannot be admitted; create one "
                   "pointing at the tenant's ClusterQueue", ns.urn)


def _wildcards(rules) -> list[str]:
    found = []
    for rule in rules or []:
        for field in ("verbs", "resources", "apiGroups"):
            if "*" in (rule.get(field) or []):
                found.append(field)
    return sorted(set(found))


def _no_wildcard_verbs(args: StackValidationArgs, report: ReportViolation) -> None:
    """Built-in admin, edit and view have no wildcards; a role the stack defines is read from what it registers."""
    roles = {("Role", metadata(r.props).get("namespace"), metadata(r.props).get("name")): r
             for r in of_type(args.resources, ROLE)}
    roles.update({("ClusterRole", None, metadata(r.props).get("name")): r
                  for r in of_type(args.resources, CLUSTER_ROLE)})
    tenants = tenant_namespaces(args.resources)
    for b in of_type(args.resources, ROLE_BINDING):
        ns = metadata(b.props).get("namespace")
        if ns not in tenants:
            continue
        ref = b.props.get("roleRef") or {}
        role = roles.get((ref.get("kind"), ns if ref.get("kind") == "Role" else None, ref.get("name")))
        wild = _wildcards(role.props.get("rules")) if role is not None else []
        if wild:
            report(f"{b.name} grants {ref.get('kind')} {ref.get('name')} in tenant namespace {ns}, whose rules use "
                   f"'*' in {', '.join(wild)}; list the verbs and resources the tenant needs", b.urn)


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
        name="tenancy-local-queue",
        description="Checks that every tenant namespace has a Kueue LocalQueue.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=_tenant_local_queue),
    StackValidationPolicy(
        name="tenancy-no-wildcard-verbs",
        description="Checks that no tenant RoleBinding grants a role with wildcard verbs, resources or API groups.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=_no_wildcard_verbs),
    StackValidationPolicy(
        name="tenancy-default-deny",
        description="Checks that every tenant namespace has a default-deny NetworkPolicy.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=_tenant_default_deny),
]
