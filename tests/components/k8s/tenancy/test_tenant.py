"""Tenant: rendered objects, their validity upstream, and the component's graph under mocks."""

from __future__ import annotations

import subprocess
import sys

import kubernetes_validate
import pulumi
import pytest
import yaml

from components.k8s.tenancy.tenant import (KUEUE_API, LOCAL_QUEUE, Tenant, TenantArgs, render_cluster_queue,
                                   render_limit_range, render_network_policies, render_resource_quota,
                                   render_role_bindings, render_tenant)
from components.spec import parse_spec


def args_for(spec, index=0) -> TenantArgs:
    return TenantArgs.from_spec(spec, spec.tenants[index])


def by_name(manifests):
    return {m.obj["metadata"]["name"]: m.obj for m in manifests}


def test_namespace_enforces_restricted_pod_security(dev_spec):
    ns = render_tenant(args_for(dev_spec))[0].obj
    labels = ns["metadata"]["labels"]
    assert ns["kind"] == "Namespace" and ns["metadata"]["name"] == "team-a"
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    assert labels["gpucluster.io/tenant"] == "team-a"


def test_binds_groups_to_namespace_roles_only(dev_spec):
    bindings = [m.obj for m in render_role_bindings(args_for(dev_spec))]
    assert [(b["metadata"]["name"], b["roleRef"]["name"], [s["name"] for s in b["subjects"]]) for b in bindings] == [
        ("tenant-admin", "admin", ["oidc:ml-platform-admins"]), ("tenant-edit", "edit", ["oidc:team-a"])]
    assert all(b["roleRef"]["kind"] == "ClusterRole" for b in bindings)


def test_network_policies_deny_by_default_and_allow_dns_and_monitoring(dev_spec):
    policies = by_name(render_network_policies(args_for(dev_spec)))
    assert policies["default-deny"]["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    dns = policies["allow-dns"]["spec"]["egress"][0]
    assert dns["to"][0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "kube-system"}
    assert {(p["protocol"], p["port"]) for p in dns["ports"]} == {("UDP", 53), ("TCP", 53)}
    ingress = policies["allow-ingress-from-namespaces"]["spec"]["ingress"][0]["from"]
    assert ingress == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    assert "allow-egress-cidrs" not in policies


def test_no_monitoring_allow_when_monitoring_is_off(dev_data):
    dev_data["kubernetes"]["monitoring"] = {"enabled": False}
    dev_data["tenants"][0]["allow_egress_cidrs"] = ["10.20.0.0/16"]
    spec = parse_spec(yaml.safe_dump(dev_data))
    policies = by_name(render_network_policies(args_for(spec)))
    assert "allow-ingress-from-namespaces" not in policies
    assert policies["allow-egress-cidrs"]["spec"]["egress"] == [{"to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}]}]


def test_resource_quota_leaves_gpus_cpu_and_memory_to_kueue(dev_spec):
    hard = render_resource_quota(args_for(dev_spec, 1))["spec"]["hard"]
    assert hard["requests.storage"] == "4Ti" and hard["services.loadbalancers"] == "0"
    assert not [k for k in hard if "gpu" in k or k.split(".")[-1] in ("cpu", "memory")]


def test_cluster_queue_carries_the_tenant_quota(dev_spec):
    cq = render_cluster_queue(args_for(dev_spec))
    spec = cq["spec"]
    assert cq["apiVersion"] == KUEUE_API and cq["metadata"]["name"] == "team-a" and "namespace" not in cq["metadata"]
    assert spec["cohortName"] == "gpu-cluster"
    assert spec["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "team-a"}}
    [group] = spec["resourceGroups"]
    assert group == {"coveredResources": ["cpu", "memory", "nvidia.com/gpu"], "flavors": [{"name": "h100", "resources": [
        {"name": "cpu", "nominalQuota": "140", "borrowingLimit": "84"},
        {"name": "memory", "nominalQuota": "2560Gi", "borrowingLimit": "1536Gi"},
        {"name": "nvidia.com/gpu", "nominalQuota": "10", "borrowingLimit": "6"}]}]}
    assert spec["preemption"] == {"reclaimWithinCohort": "Any", "borrowWithinCohort": {"policy": "Never"},
                                  "withinClusterQueue": "LowerPriority"}


def test_lending_limit_and_fair_sharing_weight_reach_the_cluster_queue(dev_data):
    dev_data["tenants"][1]["fair_sharing_weight"] = 2
    spec = parse_spec(yaml.safe_dump(dev_data))
    cq = render_cluster_queue(args_for(spec, 1))["spec"]
    cpu, memory, gpu = cq["resourceGroups"][0]["flavors"][0]["resources"]
    assert (cpu["lendingLimit"], memory["lendingLimit"], gpu["lendingLimit"]) == ("28", "512Gi", "2")
    assert cq["fairSharing"] == {"weight": "2.0"}


def test_a_tenant_without_gpus_gets_no_resource_group(dev_data):
    dev_data["tenants"][1]["gpu_quota"] = {}
    spec = parse_spec(yaml.safe_dump(dev_data))
    assert render_cluster_queue(args_for(spec, 1))["spec"]["resourceGroups"] == []


def test_each_pool_flavor_carries_the_cpu_and_memory_of_its_gpus(dev_data):
    """Two pools: CPU and memory per GPU follow each pool's hosts; an explicit total is shared by nominal GPUs."""
    pool = dict(dev_data["node_pools"][0], name="l40s", cpu_cores_per_host=64, memory_gib_per_host=512,
                gpu={"model": "L40S-48GB", "count": 4}, sharing={"time_slicing_replicas": 2},
                hosts=[dict(dev_data["node_pools"][0]["hosts"][1], hostname="l40s-01", address="10.10.0.21")])
    dev_data["node_pools"][0]["hosts"].pop(1)
    dev_data["node_pools"].append(pool)
    dev_data["tenants"][0]["gpu_quota"] = {"h100": 4, "l40s": {"nominal": 6, "borrowing_limit": 2}}
    dev_data["tenants"][1]["gpu_quota"] = {"h100": 4}
    spec = parse_spec(yaml.safe_dump(dev_data))
    flavors = render_cluster_queue(args_for(spec))["spec"]["resourceGroups"][0]["flavors"]
    assert [f["name"] for f in flavors] == ["h100", "l40s"]
    # Whole GPUs and renamed slices are two resources: each flavor has quota for its own, none of the other.
    assert flavors[0]["resources"] == [{"name": "cpu", "nominalQuota": "56"}, {"name": "memory", "nominalQuota": "1Ti"},
                                       {"name": "nvidia.com/gpu", "nominalQuota": "4"},
                                       {"name": "nvidia.com/gpu.shared", "nominalQuota": "0"}]
    # 4 L40S x 2 slices per host: quotas count slices, so 6 slices bring 6/8 of the host, not 6/4.
    assert flavors[1]["resources"] == [{"name": "cpu", "nominalQuota": "48", "borrowingLimit": "16"},
                                       {"name": "memory", "nominalQuota": "384Gi", "borrowingLimit": "128Gi"},
                                       {"name": "nvidia.com/gpu", "nominalQuota": "0"},
                                       {"name": "nvidia.com/gpu.shared", "nominalQuota": "6", "borrowingLimit": "2"}]
    group = render_cluster_queue(args_for(spec))["spec"]["resourceGroups"][0]
    assert group["coveredResources"] == ["cpu", "memory", "nvidia.com/gpu", "nvidia.com/gpu.shared"]
    dev_data["tenants"][0]["cpu_cores"] = 100
    spec = parse_spec(yaml.safe_dump(dev_data))
    cpus = [f["resources"][0]["nominalQuota"] for f in render_cluster_queue(args_for(spec))["spec"]["resourceGroups"][0]["flavors"]]
    assert cpus == ["40", "60"]


def test_limit_range_sets_default_requests_and_never_a_default_limit(dev_spec):
    """A default limit below what a container requests would make a big GPU job's pod invalid."""
    [limits] = render_limit_range(args_for(dev_spec))["spec"]["limits"]
    assert limits == {"type": "Container", "defaultRequest": {"cpu": "500m", "memory": "1Gi"}}


def test_local_queue_is_the_namespace_default(dev_spec):
    lq = next(m.obj for m in render_tenant(args_for(dev_spec)) if m.role == "lq")
    assert lq["kind"] == "LocalQueue" and lq["metadata"] == {**lq["metadata"], "name": LOCAL_QUEUE,
                                                              "namespace": "team-a"}
    assert lq["spec"] == {"clusterQueue": "team-a"}


def test_core_objects_are_valid_kubernetes(dev_spec):
    for i in range(len(dev_spec.tenants)):
        for m in render_tenant(args_for(dev_spec, i)):
            if m.obj["apiVersion"] != KUEUE_API:
                kubernetes_validate.validate(m.obj, dev_spec.kubernetes.version, strict=True)


def test_kueue_objects_pass_the_upstream_crds(dev_spec, shared_dir, tmp_path):
    docs = [m.obj for i in range(len(dev_spec.tenants)) for m in render_tenant(args_for(dev_spec, i))
            if m.obj["apiVersion"] == KUEUE_API]
    (tmp_path / "kueue.yaml").write_text(yaml.safe_dump_all(docs))
    out = subprocess.run([sys.executable, str(shared_dir / "tools" / "validate_crs.py"), "--strict-kinds",
                          str(tmp_path / "kueue.yaml")], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip().splitlines()[-1] == f"{len(docs)} validated, 0 errors"


# --- the component under mocks ---------------------------------------------------------------------------

def short(urn: str) -> str:
    return urn.rsplit("::", 1)[-1]


def test_children_are_named_by_role_and_parented_to_the_tenant(dev_spec, record):
    run = record(lambda: Tenant("t", args_for(dev_spec)))
    tenant = next(r for r in run.records if r.type == Tenant.TYPE)
    children = sorted(short(r.urn) for r in run.records if r.parent == tenant.urn)
    assert children == sorted(["t-ns", "t-rb-admin", "t-rb-edit", "t-np-deny", "t-np-same-ns", "t-np-dns",
                               "t-np-ingress", "t-limits", "t-quota", "t-cq", "t-lq", "t-nccl-h100"])
    assert run.duplicates == []


def test_jobs_get_the_fabric_nccl_settings_of_the_pools_they_may_use(dev_spec):
    cm = next(m.obj for m in render_tenant(args_for(dev_spec)) if m.role == "nccl-h100")
    assert cm["kind"] == "ConfigMap" and cm["metadata"]["name"] == "nccl-h100"
    assert cm["metadata"]["namespace"] == "team-a"
    assert cm["data"]["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1" and cm["data"]["NCCL_IB_TC"] == "106"
    # The host's control interface (eno1) does not exist in a pod's network namespace.
    assert "NCCL_SOCKET_IFNAME" not in cm["data"]


def test_namespaced_objects_depend_on_the_namespace(dev_spec, record):
    run = record(lambda: Tenant("t", args_for(dev_spec)))
    urns = {short(r.urn): r for r in run.records}
    ns = urns["t-ns"].urn
    for name in ("t-rb-admin", "t-np-deny", "t-limits", "t-quota", "t-lq"):
        assert urns[name].property_dependencies.get("metadata") == [ns], name
    assert ns not in urns["t-cq"].dependencies


def test_kueue_objects_wait_for_kueue_and_the_local_queue_for_its_cluster_queue(dev_spec, record):
    def program():
        ready = pulumi.CustomResource("test:index:KueueWebhook", "kueue-ready")
        Tenant("t", args_for(dev_spec), kueue_ready=[ready])
    urns = {short(r.urn): r for r in record(program).records}
    webhook = urns["kueue-ready"].urn
    assert webhook in urns["t-cq"].dependencies and webhook in urns["t-lq"].dependencies
    assert urns["t-cq"].urn in urns["t-lq"].dependencies
    assert webhook not in urns["t-ns"].dependencies


def test_namespace_is_protected_outside_dev(dev_data, record):
    dev_data["environment"] = "prod"
    spec = parse_spec(yaml.safe_dump(dev_data))
    urns = {short(r.urn): r for r in record(lambda: Tenant("t", args_for(spec))).records}
    assert urns["t-ns"].options["protect"] is True
    assert urns["t-quota"].options["protect"] is False


def test_outputs_name_the_namespace_and_queues(dev_spec, record):
    run = record(lambda: pulumi.export("lq", Tenant("t", args_for(dev_spec)).local_queue))
    assert run.outputs["lq"] == ("default", False)
    tenant = next(r for r in run.records if r.type == Tenant.TYPE)
    outputs = run.component_outputs[tenant.urn]
    assert {k: outputs[k] for k in ("namespace", "local_queue", "cluster_queue")} == {
        "namespace": "team-a", "local_queue": "default", "cluster_queue": "team-a"}
    assert outputs["spec"] == tenant.inputs["spec"] and outputs["spec"]["tenant"]["name"] == "team-a"  # for policies


def test_unknown_invokes_fail_loudly(record):
    with pytest.raises(Exception, match="no answer for invoke kubernetes:helm:template"):
        record(lambda: pulumi.runtime.invoke("kubernetes:helm:template", {}))
