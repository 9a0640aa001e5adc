"""Tenants' own secondary networks on the pools the fabric isolates for them, and the admission fence that keeps
each tenant's pods to its own and the shared ones (the real apiserver judges the fence: tests/e2e/
test_tenant_networks.py)."""

from __future__ import annotations

import subprocess
import sys

import yaml

from components.k8s.platform.network_operator import render_secondary_networks
from components.k8s.rails import NETWORK_NAMESPACE, NETWORKS_ANNOTATION, pod_networks, tenant_networks
from components.k8s.tenancy.networks import DEFAULT_NETWORK_ANNOTATION, render_network_fence
from components.k8s.tenancy.tenant import TENANT_LABEL, TenantArgs, render_namespace
from tests.components.fabric.isolated_specs import isolated_example, roce_isolated


def _networks(spec) -> dict[str, dict]:
    return {m.obj["metadata"]["name"]: m.obj for m in render_secondary_networks(spec) if m.obj["kind"] != "IPPool"}


def test_an_isolated_pools_pods_attach_their_tenants_own_networks_and_a_shared_pools_the_shared_ones():
    spec = isolated_example(rails=2)
    pools = {p.name: p for p in spec.node_pools}
    assert pod_networks(spec, pools["h100-a"]) == {NETWORKS_ANNOTATION: "team-a/team-a-rail-0,team-a/team-a-rail-1"}
    assert pod_networks(spec, pools["h100-b"]) == {NETWORKS_ANNOTATION: "team-b/team-b-rail-0,team-b/team-b-rail-1"}
    assert pod_networks(spec, pools["h100"]) == {NETWORKS_ANNOTATION: "default/rail-0,default/rail-1"}
    assert tenant_networks(spec) == {"team-a": {(0, "ibp0s0"): "team-a-rail-0", (1, "ibp1s0"): "team-a-rail-1"},
                                     "team-b": {(0, "ibp0s0"): "team-b-rail-0", (1, "ibp1s0"): "team-b-rail-1"}}


def test_a_tenants_networks_live_in_its_namespace_on_the_shared_address_pools_in_the_fabrics_kind():
    """One address pool per rail (nv-ipam hands each node its own block), so a tenant's and the shared network
    on one node never hand out the same address; the fabric's partition or VLAN keeps the tenants apart."""
    for spec, kind in ((isolated_example(rails=2), "IPoIBNetwork"), (roce_isolated(rails=2), "MacvlanNetwork")):
        nets = _networks(spec)
        assert {o["kind"] for o in nets.values()} == {kind}
        for tenant in ("team-a", "team-b"):
            for rail in (0, 1):
                own, shared = nets[f"{tenant}-rail-{rail}"]["spec"], nets[f"rail-{rail}"]["spec"]
                assert own["networkNamespace"] == tenant and shared["networkNamespace"] == NETWORK_NAMESPACE
                assert own == {**shared, "networkNamespace": tenant}
        assert "team-c-rail-0" not in nets                     # team-c owns no isolated pool


def test_the_tenants_networks_pass_the_upstream_crds(shared_dir, tmp_path):
    objs = [o for s in (isolated_example(rails=2), roce_isolated(rails=2)) for o in _networks(s).values()]
    (tmp_path / "objs.yaml").write_text(yaml.safe_dump_all(objs))
    out = subprocess.run([sys.executable, str(shared_dir / "tools" / "validate_crs.py"), str(tmp_path / "objs.yaml")],
                         capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip().splitlines()[-1] == f"{len(objs)} validated, 0 errors", \
        out.stdout + out.stderr


def test_no_tenant_network_and_no_fence_without_isolation_or_without_networks(dev_spec):
    assert tenant_networks(dev_spec) == {} and render_network_fence(dev_spec) == []
    off = isolated_example(rails=2, change=lambda d: d["fabric"]["infiniband"].update(isolate_dedicated_pools=False))
    assert tenant_networks(off) == {} and render_network_fence(off) == []
    assert set(_networks(off)) == {"rail-0", "rail-1"}
    bare = isolated_example(rails=2, change=lambda d: d["kubernetes"]["network_operator"].pop("rail_subnets"))
    assert tenant_networks(bare) == {} and render_network_fence(bare) == [] and _networks(bare) == {}


def test_the_fence_binds_to_every_namespace_a_tenant_is_given_and_reads_both_multus_annotations():
    spec = isolated_example(rails=2)
    policy, binding = (m.obj for m in render_network_fence(spec))
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"] and policy["spec"]["failurePolicy"] == "Fail"
    selector = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert selector == [{"key": TENANT_LABEL, "operator": "Exists"}]
    for tenant in spec.tenants:
        labels = render_namespace(TenantArgs.from_spec(spec, tenant))["metadata"]["labels"]
        assert labels[TENANT_LABEL] == tenant.name
    foreign = policy["spec"]["variables"][0]["expression"]
    assert f'"{NETWORKS_ANNOTATION}"' in foreign and f'"{DEFAULT_NETWORK_ANNOTATION}"' in foreign
    assert f'ns != "{NETWORK_NAMESPACE}"' in foreign and "ns != request.namespace" in foreign
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["operations"] == ["CREATE"]
