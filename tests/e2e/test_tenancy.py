"""Tenant isolation judged by the real authorizer (RBAC) and the real Pod Security admission."""

from __future__ import annotations

import pytest

from .conftest import Cluster

pytestmark = pytest.mark.e2e

# What each bound role may do in its own namespace: (verb, resource) -> allowed.
ROLE_RIGHTS = {
    "admin": {("create", "jobs.batch"): True, ("create", "rolebindings.rbac.authorization.k8s.io"): True,
              ("delete", "resourcequotas"): False, ("update", "clusterqueues.kueue.x-k8s.io"): False},
    "edit": {("create", "jobs.batch"): True, ("get", "pods"): True, ("create", "rolebindings.rbac.authorization.k8s.io"): False,
             ("delete", "limitranges"): False, ("delete", "resourcequotas"): False},
    "view": {("get", "pods"): True, ("create", "jobs.batch"): False, ("get", "secrets"): False},
}


def can_i(c: Cluster, verb: str, resource: str, namespace: str, user: str, groups: list[str]) -> bool:
    args = ["auth", "can-i", verb, resource, "-n", namespace, f"--as={user}"]
    args += [f"--as-group={g}" for g in [*groups, "system:authenticated"]]
    proc = c.cp.kubectl(*args, check=False)
    assert proc.stdout.strip() in ("yes", "no"), proc.stderr
    return proc.stdout.strip() == "yes"


def test_each_bound_group_has_its_role_in_its_namespace_and_nothing_elsewhere(cluster: Cluster):
    tenants = cluster.spec.tenants
    checked = 0
    for t in tenants:
        for role in ("admin", "edit", "view"):
            for group in getattr(t.groups, role):
                for (verb, resource), allowed in ROLE_RIGHTS[role].items():
                    assert can_i(cluster, verb, resource, t.namespace_name, "someone", [group]) is allowed, \
                        f"{group} ({role} of {t.name}): {verb} {resource} should be {'allowed' if allowed else 'denied'}"
                others = [o for o in tenants if o is not t and group not in
                          (*o.groups.admin, *o.groups.edit, *o.groups.view)]
                for o in others:
                    for verb, resource in (("get", "pods"), ("create", "jobs.batch"), ("list", "secrets")):
                        assert not can_i(cluster, verb, resource, o.namespace_name, "someone", [group]), \
                            f"{group} of {t.name} may {verb} {resource} in {o.name}'s namespace"
                checked += 1
    assert checked or not tenants


def test_a_tenant_service_account_cannot_reach_another_tenants_namespace(cluster: Cluster):
    for t in cluster.spec.tenants:
        sa = f"system:serviceaccount:{t.namespace_name}:default"
        groups = ["system:serviceaccounts", f"system:serviceaccounts:{t.namespace_name}"]
        for o in cluster.spec.tenants:
            if o is t:
                continue
            for verb, resource in (("get", "pods"), ("list", "configmaps"), ("create", "jobs.batch"),
                                   ("delete", "pods"), ("create", "pods")):
                assert not can_i(cluster, verb, resource, o.namespace_name, sa, groups), \
                    f"{sa} may {verb} {resource} in {o.namespace_name}"


def test_a_privileged_pod_is_refused_in_every_tenant_namespace(cluster: Cluster):
    for t in cluster.spec.tenants:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "escape", "namespace": t.namespace_name},
               "spec": {"containers": [{"name": "c", "image": "busybox",
                                        "securityContext": {"privileged": True}}],
                        "hostNetwork": True}}
        proc = cluster.cp.apply_objects([pod], dry_run=True, check=False)
        assert proc.returncode != 0, f"a privileged pod was accepted in {t.namespace_name}"
        assert 'violates PodSecurity "restricted:latest"' in proc.stderr, proc.stderr
        assert "privileged" in proc.stderr and "hostNetwork" in proc.stderr, proc.stderr
