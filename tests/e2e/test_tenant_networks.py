"""Issue 58, the Kubernetes side: a tenant's pod cannot attach another tenant's secondary network. The isolated
example's own networks (the Network Operator's objects, taken by the real CRDs) and its admission fence are
applied to the real apiserver beside dev's stack, whose tenant namespaces (team-a, team-b) are the example's
too; each pod is created server-side in dry-run, so it meets every admission step and is not kept."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from components.k8s.platform.network_operator import render_secondary_networks
from components.k8s.rails import NETWORKS_ANNOTATION, pod_networks
from components.k8s.tenancy.jobs import render_job
from components.k8s.tenancy.networks import DEFAULT_NETWORK_ANNOTATION, POLICY, render_network_fence
from components.k8s.tenancy.tenant import TENANT_LABEL
from components.spec import load_spec

from .conftest import Cluster, wait_for

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
OUTSIDE = "fence-outside"        # a namespace of no tenant


@pytest.fixture(scope="module")
def fenced(cluster: Cluster) -> Iterator[tuple[Cluster, Any]]:
    spec = load_spec(ROOT / "examples" / "isolated-tenants.yaml")
    fence = [m.obj for m in render_network_fence(spec)]
    networks = [m.obj for m in render_secondary_networks(spec) if m.obj["kind"] != "IPPool"]
    cluster.cp.apply_objects([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OUTSIDE}},
                              *networks, *fence])
    # The policy takes effect once the apiserver's informers have it: until a foreign network is refused.
    probe = _pod("team-a", {NETWORKS_ANNOTATION: "team-b/team-b-rail-0"}, _template(spec, "team-a", "h100-a"))
    wait_for(lambda: POLICY in _create(cluster, probe).stderr, timeout_s=60,
             describe=lambda: "the tenant-networks policy never refused a foreign network")
    try:
        yield cluster, spec
    finally:
        for obj in [*fence, *networks]:
            cluster.cp.kubectl("delete", obj["kind"], obj["metadata"]["name"], "--ignore-not-found", check=False)
        cluster.cp.kubectl("delete", "namespace", OUTSIDE, "--ignore-not-found", "--wait=false", check=False)


def _pod(namespace: str, annotations: dict[str, str], template: dict[str, Any] | None = None) -> dict[str, Any]:
    """A pod of the tenant's own job template where one is given (Pod Security `restricted` takes it), else a
    bare one."""
    spec = (template or {}).get("spec") or {"containers": [{"name": "c", "image": "busybox"}]}
    labels = ((template or {}).get("metadata") or {}).get("labels", {})
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "fence-", "namespace": namespace, "labels": labels,
                         "annotations": annotations}, "spec": spec}


def _create(c: Cluster, pod: dict[str, Any]):
    return c.cp.kubectl("create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(pod), check=False)


def _template(spec, tenant: str, pool: str) -> dict[str, Any]:
    t = next(x for x in spec.tenants if x.name == tenant)
    p = next(x for x in spec.node_pools if x.name == pool)
    return render_job(spec, t, p, name="fence", filesystem=False)["spec"]["template"]


@pytest.mark.one_stack
def test_the_tenant_networks_and_the_fence_are_taken_by_the_real_apiserver(fenced):
    c, spec = fenced
    kinds = {o["kind"] for o in c.cp.get("ipoibnetworks")["items"]}
    assert kinds == {"IPoIBNetwork"}
    own = {o["metadata"]["name"]: o["spec"]["networkNamespace"] for o in c.cp.get("ipoibnetworks")["items"]}
    assert own["team-a-rail-0"] == "team-a" and own["team-b-rail-7"] == "team-b" and own["rail-0"] == "default"
    binding = c.cp.get("validatingadmissionpolicybindings", POLICY)
    assert binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"][0]["key"] == TENANT_LABEL
    ns = c.cp.get("namespaces", "team-a")
    assert TENANT_LABEL in ns["metadata"]["labels"]          # the label each Tenant's namespace carries


@pytest.mark.one_stack
def test_a_tenants_own_job_attaches_its_own_networks_and_not_another_tenants(fenced):
    """team-a's job on its isolated pool names team-a's networks and is admitted in team-a's namespace; team-b's
    job, the same template naming team-b's networks, is refused there, naming team-b."""
    c, spec = fenced
    own = _template(spec, "team-a", "h100-a")
    assert own["metadata"]["annotations"][NETWORKS_ANNOTATION].startswith("team-a/team-a-rail-0,")
    ok = _create(c, _pod("team-a", own["metadata"]["annotations"], own))
    assert ok.returncode == 0, ok.stderr
    theirs = _template(spec, "team-b", "h100-b")
    refused = _create(c, _pod("team-a", theirs["metadata"]["annotations"], own))
    assert refused.returncode != 0
    assert f"ValidatingAdmissionPolicy '{POLICY}'" in refused.stderr, refused.stderr
    assert "names a network of namespace team-b" in refused.stderr and "never another tenant's" in refused.stderr
    shared = next(p for p in spec.node_pools if p.name == "h100")
    assert _create(c, _pod("team-a", pod_networks(spec, shared), own)).returncode == 0     # the shared ones


# (annotations, admitted): every form Multus reads the annotations in (k8sclient.go, parsePodNetworkAnnotation)
CASES = [
    ({NETWORKS_ANNOTATION: "team-a-rail-0"}, True),                            # no namespace: the pod's own
    ({NETWORKS_ANNOTATION: " team-a/team-a-rail-0@net1 , default/rail-1"}, True),
    ({NETWORKS_ANNOTATION: "team-a-rail-0, team-b / team-b-rail-0"}, False),    # Multus trims the namespace
    ({NETWORKS_ANNOTATION: "kube-system/anything"}, False),
    ({NETWORKS_ANNOTATION: json.dumps([{"name": "team-a-rail-0", "namespace": "team-a"}])}, True),
    ({NETWORKS_ANNOTATION: json.dumps([{"name": "team-a-rail-0"}, {"name": "x", "namespace": "team-b"}])}, False),
    ({NETWORKS_ANNOTATION: '[{"name": "x", "NameSpace" : "team-b"}]'}, False),  # Go's JSON keys ignore case
    ({NETWORKS_ANNOTATION: '[{"name": "x", "name\\u0073pace": "team-b"}]'}, False),   # an escape, refused whole
    ({NETWORKS_ANNOTATION: '{"name": "x", "namespace": "team-b"}'}, False),     # JSON by any of [ { "
    ({DEFAULT_NETWORK_ANNOTATION: "team-b/team-b-rail-0"}, False),             # the default network too
    ({}, True),
]


@pytest.mark.one_stack
@pytest.mark.parametrize("annotations,admitted", CASES, ids=[str(i) for i in range(len(CASES))])
def test_every_form_of_the_multus_annotations_is_read_as_multus_reads_it(fenced, annotations, admitted):
    c, spec = fenced
    out = _create(c, _pod("team-a", annotations, _template(spec, "team-a", "h100-a")))
    assert (out.returncode == 0) == admitted, out.stderr


@pytest.mark.one_stack
def test_a_namespace_of_no_tenant_is_left_to_its_owners(fenced):
    c, _ = fenced
    out = _create(c, _pod(OUTSIDE, {NETWORKS_ANNOTATION: "team-b/team-b-rail-0"}))
    assert out.returncode == 0, out.stderr
