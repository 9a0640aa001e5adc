"""Tenant isolation: what must hold for every tenant namespace, however its objects were written."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from pulumi_policy import (
    EnforcementLevel,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from .common import (CLUSTER_ROLE, CLUSTER_ROLE_BINDING, GPU, KUEUE, NETWORK_POLICY, NODE_POOL, ROLE,
                     ROLE_BINDING, TENANT_LABEL, environment, guarded, intent, is_kind, labels, mapping, maps, name_of,
                     namespace_of, of_type, strings, system_namespaces, tenant_namespaces, text)

# Verbs that hand out more than the role holds: granting any role (bind), editing roles beyond one's own rights
# (escalate), acting as another user or service account (impersonate). kubernetes.io/docs/concepts/security/
# rbac-good-practices, "Privilege escalation risks".
ESCALATING_VERBS = ("bind", "escalate", "impersonate")


def _no_cluster_admin(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type not in (ROLE_BINDING, CLUSTER_ROLE_BINDING):
        return
    ref = mapping(args.props.get("roleRef"))
    if ref.get("kind") == "ClusterRole" and ref.get("name") == "cluster-admin":
        subjects = ", ".join(str(s.get("name", "?")) for s in maps(args.props.get("subjects")))
        report(f"{args.name} binds cluster-admin to {subjects or 'nobody'}; bind admin, edit or view instead")


def _tenant_namespace_restricted(args: StackValidationArgs, report: ReportViolation) -> None:
    for name, ns in sorted(tenant_namespaces(args.resources).items()):
        level = labels(ns.props).get("pod-security.kubernetes.io/enforce")
        if level != "restricted":
            report(f"tenant namespace {name} enforces Pod Security level {level or '(none)'}; tenant namespaces "
                   "enforce restricted", ns.urn)


def _cluster_queue_selects_namespaces(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if not is_kind(args.resource_type, KUEUE, "ClusterQueue"):
        return
    selector = mapping(args.props.get("spec")).get("namespaceSelector")
    if selector is None:
        report(f"{args.name} has no namespaceSelector, so Kueue admits nothing through it; select the "
               "tenant's namespace")
    elif not selector_narrows(selector):
        report(f"{args.name} selects every namespace, so any tenant can use its quota; select the tenant's "
               "namespace")


def selector_narrows(selector: Any) -> bool:
    """A label selector with something in it: an empty one (or none) selects every object."""
    s = mapping(selector)
    return bool(mapping(s.get("matchLabels")) or maps(s.get("matchExpressions")))


def selects(selector: Mapping[str, Any], object_labels: Mapping[str, Any]) -> bool:
    """A Kubernetes label selector (matchLabels and matchExpressions) against one object's labels."""
    if any(object_labels.get(k) != v for k, v in mapping(selector.get("matchLabels")).items()):
        return False
    for e in maps(selector.get("matchExpressions")):
        key, op, values = e.get("key"), e.get("operator"), strings(e.get("values"))
        present = key in object_labels
        if not {"In": present and object_labels.get(key) in values,
                "NotIn": not present or object_labels.get(key) not in values,
                "Exists": present, "DoesNotExist": not present}.get(text(op) or "", False):
            return False
    return True


def _namespace_labels(resources) -> dict[str, Mapping[str, Any]]:
    """Tenant namespace -> its labels, with the name label the API server adds to every namespace."""
    return {name: {**labels(ns.props), "kubernetes.io/metadata.name": name}
            for name, ns in tenant_namespaces(resources).items()}


def _cluster_queue_selects_one_tenant(args: StackValidationArgs, report: ReportViolation) -> None:
    tenants = _namespace_labels(args.resources)
    for q in args.resources:
        if not is_kind(q.resource_type, KUEUE, "ClusterQueue"):
            continue
        selector = mapping(mapping(q.props.get("spec")).get("namespaceSelector"))
        chosen = sorted(n for n, l in tenants.items() if selector and selects(selector, l))
        if len(chosen) > 1:
            report(f"{q.name} selects the namespaces of {len(chosen)} tenants ({', '.join(chosen[:5])}), so each "
                   "can spend the others' quota; select one tenant's namespace", q.urn)


def _gpu_flavors(resources) -> set[str]:
    """ResourceFlavors of GPU node pools: those the stack's node pools are named by."""
    pools = {text(mapping(intent(r).get("pool")).get("name")) for r in of_type(resources, NODE_POOL)}
    return {n for r in resources if is_kind(r.resource_type, KUEUE, "ResourceFlavor")
            and (n := name_of(r.props)) in pools}


def _cluster_queue_covers_gpus(args: StackValidationArgs, report: ReportViolation) -> None:
    """A group of a GPU pool's flavor without a GPU resource admits no GPU job there (Kueue has no quota for
    what a queue does not cover), and the tenant's GPUs on that pool are unusable."""
    gpu_flavors = _gpu_flavors(args.resources)
    for q in args.resources:
        if not is_kind(q.resource_type, KUEUE, "ClusterQueue"):
            continue
        for group in maps(mapping(q.props.get("spec")).get("resourceGroups")):
            flavors = sorted(f for fl in maps(group.get("flavors")) if (f := text(fl.get("name"))) in gpu_flavors)
            if flavors and not any(r.startswith(GPU) for r in strings(group.get("coveredResources"))):
                report(f"{q.name} gives quota on GPU pool flavor(s) {', '.join(flavors)} but covers no GPU "
                       f"resource ({', '.join(strings(group.get('coveredResources'))) or 'none'}), so none of its "
                       f"GPU jobs is ever admitted there; cover {GPU} (or the pool's shared resource) with the "
                       "tenant's quota", q.urn)


# Why a ClusterQueue other than its owner's may name a dedicated pool's flavor, stated on the queue (the active
# health checks' with kubernetes.health.active_checks.dedicated_pools).
ISOLATION_EXCEPTION = "gpucluster.io/isolation-exception"


def _dedicated_flavors_stay_their_owners(args: StackValidationArgs, report: ReportViolation) -> None:
    """A dedicated pool is its tenant's alone: a queue of anyone else that names its flavor can borrow its GPUs,
    and its pods (privileged ones, for the health checks) run on the tenant's nodes."""
    owners = {text(pool.get("name")): text(pool.get("dedicated_to")) for r in of_type(args.resources, NODE_POOL)
              if (pool := mapping(intent(r).get("pool"))).get("dedicated_to")}
    if not owners:
        return
    tenants = _namespace_labels(args.resources)
    for q in args.resources:
        if not is_kind(q.resource_type, KUEUE, "ClusterQueue"):
            continue
        spec = mapping(q.props.get("spec"))
        named = sorted({f for g in maps(spec.get("resourceGroups")) for fl in maps(g.get("flavors"))
                        if (f := text(fl.get("name"))) in owners})
        selector = mapping(spec.get("namespaceSelector"))
        served = {text(ls.get(TENANT_LABEL)) for ls in tenants.values() if selector and selects(selector, ls)}
        why = text(mapping(mapping(q.props.get("metadata")).get("annotations")).get(ISOLATION_EXCEPTION))
        for flavor in named:
            if served != {owners[flavor]} and not why:
                report(f"{q.name} names the flavor of pool {flavor}, which is dedicated to tenant {owners[flavor]}, "
                       f"but serves {', '.join(sorted(served)) or 'no tenant'}: it can borrow that tenant's GPUs "
                       f"and its pods run on that tenant's nodes; remove the flavor, or state why on the queue "
                       f"({ISOLATION_EXCEPTION})", q.urn)


def _peers(spec: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """(direction, the rule's peers as written) of each rule of a NetworkPolicy."""
    for direction, key in (("ingress", "from"), ("egress", "to")):
        for rule in maps(spec.get(direction)):
            yield direction, rule.get(key)


def _tenant_network_policies(resources, tenants: Collection[str]) -> Iterator[tuple[Any, str, Mapping[str, Any]]]:
    for r in of_type(resources, NETWORK_POLICY):
        ns = namespace_of(r.props)
        if ns in tenants:
            yield r, ns, mapping(r.props.get("spec"))


def _no_open_network_policy(args: StackValidationArgs, report: ReportViolation) -> None:
    """NetworkPolicies add up: one rule open to everyone beside the default-deny undoes it."""
    for r, ns, spec in _tenant_network_policies(args.resources, tenant_namespaces(args.resources)):
        for direction, peers in _peers(spec):
            way = "from" if direction == "ingress" else "to"
            # Missing or an empty list (the SDK hands lists over as Sequence proxies, not lists): every peer.
            if peers is None or (isinstance(peers, Sequence) and not isinstance(peers, str) and not peers):
                report(f"{r.name} in tenant namespace {ns} has an {direction} rule with no peers, which allows "
                       f"traffic {way} every pod, namespace and address; name the peers it needs", r.urn)
                continue
            for peer in maps(peers):
                if "namespaceSelector" in peer and not selector_narrows(peer["namespaceSelector"]):
                    report(f"{r.name} in tenant namespace {ns} allows {direction} {way} pods of every namespace "
                           "(an empty namespaceSelector), other tenants' included; select the namespaces by name",
                           r.urn)


def _anywhere(cidr: Any) -> bool:
    try:
        return ipaddress.ip_network(str(cidr), strict=False).prefixlen == 0
    except ValueError:
        return False


def _prod_network_bounds(args: StackValidationArgs, report: ReportViolation) -> None:
    """In prod a tenant's pods reach named networks only, and no other tenant's pods reach them."""
    if environment(args.resources) != "prod":
        return
    tenants = _namespace_labels(args.resources)
    for r, ns, spec in _tenant_network_policies(args.resources, tenants):
        for direction, peers in _peers(spec):
            for peer in maps(peers):
                block = mapping(peer.get("ipBlock"))
                if direction == "egress" and _anywhere(block.get("cidr")):
                    report(f"{r.name} lets tenant {ns}'s pods reach every address ({block.get('cidr')}); in prod "
                           "list the networks they need (tenants[].allow_egress_cidrs)", r.urn)
                selector = peer.get("namespaceSelector")
                if direction == "ingress" and selector_narrows(selector):
                    others = sorted(o for o, l in tenants.items() if o != ns and selects(mapping(selector), l))
                    if others:
                        report(f"{r.name} lets tenant(s) {', '.join(others[:5])} reach tenant {ns}'s pods; in prod "
                               "tenants do not reach each other (tenants[].allow_ingress_from_namespaces)", r.urn)


def _tenant_default_deny(args: StackValidationArgs, report: ReportViolation) -> None:
    denied = set()
    for r in of_type(args.resources, NETWORK_POLICY):
        spec = mapping(r.props.get("spec"))
        if spec.get("podSelector") == {} and set(strings(spec.get("policyTypes"))) == {"Ingress", "Egress"} \
                and not spec.get("ingress") and not spec.get("egress"):
            denied.add(namespace_of(r.props))
    for name, ns in sorted(tenant_namespaces(args.resources).items()):
        if name not in denied:
            report(f"tenant namespace {name} has no default-deny NetworkPolicy (empty podSelector, Ingress and "
                   "Egress, no rules); add one so only explicit allows pass", ns.urn)


def _tenant_local_queue(args: StackValidationArgs, report: ReportViolation) -> None:
    queued = {namespace_of(r.props) for r in args.resources if is_kind(r.resource_type, KUEUE, "LocalQueue")}
    for name, ns in sorted(tenant_namespaces(args.resources).items()):
        if name not in queued:
            report(f"tenant namespace {name} has no Kueue LocalQueue, so its jobs cannot be admitted; create one "
                   "pointing at the tenant's ClusterQueue", ns.urn)


def _wildcards(rules) -> list[str]:
    return sorted({field for rule in maps(rules) for field in ("verbs", "resources", "apiGroups")
                   if "*" in strings(rule.get(field))})


def _escalating(rules) -> list[str]:
    verbs = {v for rule in maps(rules) for v in strings(rule.get("verbs"))}
    return [v for v in ESCALATING_VERBS if v in verbs]


class _Grant(NamedTuple):
    binding: Any
    where: str            # "in tenant namespace team-a" or "cluster-wide"
    ref: Mapping[str, Any]
    role: Any             # the Role or ClusterRole this stack registers, None for one it does not


def _tenant_grants(resources) -> list[_Grant]:
    """Bindings that grant tenants something: RoleBindings in tenant namespaces, and ClusterRoleBindings to
    anyone but the platform's own service accounts. Roles are read from what the stack registers (built-in
    admin, edit and view have no wildcards and no escalating verbs)."""
    roles = {("Role", namespace_of(r.props), name_of(r.props)): r for r in of_type(resources, ROLE)}
    roles.update({("ClusterRole", None, name_of(r.props)): r for r in of_type(resources, CLUSTER_ROLE)})
    tenants, system = tenant_namespaces(resources), system_namespaces(resources)
    out = []
    for b in of_type(resources, ROLE_BINDING, CLUSTER_ROLE_BINDING):
        ref = mapping(b.props.get("roleRef"))
        ns = namespace_of(b.props) if b.resource_type == ROLE_BINDING else None
        if b.resource_type == ROLE_BINDING and ns not in tenants:
            continue
        if b.resource_type == CLUSTER_ROLE_BINDING and all(
                s.get("kind") == "ServiceAccount" and text(s.get("namespace")) in system
                for s in maps(b.props.get("subjects"))):
            continue
        role = roles.get((text(ref.get("kind")), ns if ref.get("kind") == "Role" else None, text(ref.get("name"))))
        out.append(_Grant(b, f"in tenant namespace {ns}" if ns else "cluster-wide", ref, role))
    return out


def _granted(resources, find: Callable[[Any], list[str]]) -> Iterator[tuple[_Grant, list[str]]]:
    """Each grant to tenants whose role's rules `find` something in, with what it found."""
    for g in _tenant_grants(resources):
        found = find(g.role.props.get("rules")) if g.role is not None else []
        if found:
            yield g, found


def _no_wildcard_verbs(args: StackValidationArgs, report: ReportViolation) -> None:
    for g, wild in _granted(args.resources, _wildcards):
        report(f"{g.binding.name} grants {g.ref.get('kind')} {g.ref.get('name')} {g.where}, whose rules use '*' in "
               f"{', '.join(wild)}; list the verbs and resources the tenant needs", g.binding.urn)


def _no_escalating_verbs(args: StackValidationArgs, report: ReportViolation) -> None:
    for g, verbs in _granted(args.resources, _escalating):
        report(f"{g.binding.name} grants {g.ref.get('kind')} {g.ref.get('name')} {g.where}, which allows "
               f"{', '.join(verbs)}: whoever holds it can grant themselves more than it; drop those verbs",
               g.binding.urn)


def _tenants_bound_cluster_wide(args: StackValidationArgs, report: ReportViolation) -> None:
    """A tenant's identity (a subject the stack binds in a tenant namespace) bound by a ClusterRoleBinding holds
    that role in every namespace, other tenants' included."""
    tenants = tenant_namespaces(args.resources)
    identities = {(text(s.get("kind")), text(s.get("name"))) for b in of_type(args.resources, ROLE_BINDING)
                  if namespace_of(b.props) in tenants for s in maps(b.props.get("subjects"))
                  if s.get("kind") in ("Group", "User")}
    for b in of_type(args.resources, CLUSTER_ROLE_BINDING):
        found = [f"{s.get('kind')} {s.get('name')}" for s in maps(b.props.get("subjects"))
                 if (text(s.get("kind")), text(s.get("name"))) in identities]
        if found:
            ref = mapping(b.props.get("roleRef"))
            report(f"{b.name} binds {', '.join(found)}, a tenant's identity, to ClusterRole {text(ref.get('name'))} "
                   "in every namespace, other tenants' included; bind it with a RoleBinding in the tenant's "
                   "namespace", b.urn)


TENANCY_POLICIES = [
    ResourceValidationPolicy(
        name="tenancy-no-cluster-admin",
        description="Checks that no RoleBinding or ClusterRoleBinding grants cluster-admin.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_no_cluster_admin)),
    StackValidationPolicy(
        name="tenancy-namespace-restricted",
        description="Checks that tenant namespaces enforce the restricted Pod Security level.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_tenant_namespace_restricted)),
    ResourceValidationPolicy(
        name="tenancy-clusterqueue-namespace-selector",
        description="Checks that each Kueue ClusterQueue selects specific namespaces, not none or all.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_cluster_queue_selects_namespaces)),
    StackValidationPolicy(
        name="tenancy-local-queue",
        description="Checks that every tenant namespace has a Kueue LocalQueue.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_tenant_local_queue)),
    StackValidationPolicy(
        name="tenancy-no-wildcard-verbs",
        description="Checks that no role granted to tenants uses wildcard verbs, resources or API groups.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_no_wildcard_verbs)),
    StackValidationPolicy(
        name="tenancy-no-escalating-verbs",
        description="Checks that no role granted to tenants allows the bind, escalate or impersonate verbs.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_no_escalating_verbs)),
    StackValidationPolicy(
        name="tenancy-no-cluster-wide-tenant-grants",
        description="Checks that no ClusterRoleBinding grants a tenant's identity a role in every namespace.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_tenants_bound_cluster_wide)),
    StackValidationPolicy(
        name="tenancy-clusterqueue-one-tenant",
        description="Checks that no Kueue ClusterQueue selects the namespaces of more than one tenant.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_cluster_queue_selects_one_tenant)),
    StackValidationPolicy(
        name="tenancy-dedicated-flavor-owner",
        description="Checks that only its tenant's ClusterQueue names a dedicated pool's flavor, unless the queue "
                    "states why.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_dedicated_flavors_stay_their_owners)),
    StackValidationPolicy(
        name="tenancy-clusterqueue-gpu-quota",
        description="Checks that every ClusterQueue group on a GPU pool's flavor covers a GPU resource.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_cluster_queue_covers_gpus)),
    StackValidationPolicy(
        name="tenancy-no-open-network-policy",
        description="Checks that no NetworkPolicy in a tenant namespace allows every peer or every namespace.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_no_open_network_policy)),
    StackValidationPolicy(
        name="tenancy-prod-network-bounds",
        description="Checks that in prod no tenant reaches every address and no tenant reaches another's pods.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_prod_network_bounds)),
    StackValidationPolicy(
        name="tenancy-default-deny",
        description="Checks that every tenant namespace has a default-deny NetworkPolicy.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_tenant_default_deny)),
]
