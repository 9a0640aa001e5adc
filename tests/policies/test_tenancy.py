"""Tenancy policies: one compliant fixture from the real dev plan, one changed field per test."""

from __future__ import annotations

import copy
import sys

import pytest
from pulumi_policy import (EnforcementLevel, PolicyCustomTimeouts, PolicyResource, PolicyResourceOptions,
                           ResourceValidationArgs, ResourceValidationPolicy, StackValidationArgs)

from components.offline.plan import build_plan
from components.offline.runner import run_program
from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "policies"))
from registry import POLICIES  # noqa: E402  (the pack's modules live in policies/, not in a package)

BY_NAME = {p.name: p for p in POLICIES}


def _opts() -> PolicyResourceOptions:
    return PolicyResourceOptions(False, [], None, [], PolicyCustomTimeouts(0, 0, 0), [])


@pytest.fixture(scope="module")
def resources() -> list[dict]:
    return build_plan(run_program(ROOT, "dev")).document["resources"]


def violations(policy_name: str, resources: list[dict]) -> list[str]:
    policy = BY_NAME[policy_name]
    found: list[str] = []
    report = lambda message, urn=None: found.append(message)  # noqa: E731
    if isinstance(policy, ResourceValidationPolicy):
        for r in resources:
            policy.validate(ResourceValidationArgs(r["type"], r["inputs"], r["urn"], r["name"], _opts(), None), report)
    else:
        policy.validate(StackValidationArgs([PolicyResource(r["type"], r["inputs"], r["urn"], r["name"], _opts(),
                                                            None, None, [], {}) for r in resources]), report)
    return found


def changed(resources, name, edit):
    out = copy.deepcopy(resources)
    edit(next(r for r in out if r["name"] == name)["inputs"])
    return out


def test_every_policy_is_declared_fully():
    assert len(BY_NAME) == len(POLICIES)
    for p in POLICIES:
        assert p.name.startswith("tenancy-") and p.description.startswith("Checks that")
        assert p.enforcement_level in (EnforcementLevel.MANDATORY, EnforcementLevel.ADVISORY)


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_the_dev_stack_complies(name, resources):
    assert violations(name, resources) == []


def test_cluster_admin_binding_is_refused(resources):
    bad = changed(resources, "dev-team-a-rb-admin", lambda i: i["roleRef"].update(name="cluster-admin"))
    assert violations("tenancy-no-cluster-admin", bad) == [
        "dev-team-a-rb-admin binds cluster-admin to oidc:ml-platform-admins; bind admin, edit or view instead"]


def test_baseline_tenant_namespace_is_refused(resources):
    bad = changed(resources, "dev-team-b-ns",
                  lambda i: i["metadata"]["labels"].update({"pod-security.kubernetes.io/enforce": "baseline"}))
    assert violations("tenancy-namespace-restricted", bad) == [
        "tenant namespace team-b enforces Pod Security level baseline; tenant namespaces enforce restricted"]


def test_cluster_queue_for_every_namespace_is_refused(resources):
    bad = changed(resources, "dev-team-a-cq", lambda i: i["spec"].update(namespaceSelector={}))
    assert violations("tenancy-clusterqueue-namespace-selector", bad) == [
        "dev-team-a-cq selects every namespace, so any tenant can use its quota; select the tenant's namespace"]


def test_missing_default_deny_is_refused(resources):
    bad = changed(resources, "dev-team-a-np-deny", lambda i: i["spec"].update(policyTypes=["Ingress"]))
    assert violations("tenancy-default-deny", bad) == [
        "tenant namespace team-a has no default-deny NetworkPolicy (empty podSelector, Ingress and Egress, no rules);"
        " add one so only explicit allows pass"]
