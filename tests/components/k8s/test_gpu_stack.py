"""The GPU stack's objects, their validity against the upstream CRDs, and the component under mocks."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import kubernetes_validate
import pytest
import yaml

from components.cluster import GpuCluster
from components.k8s import rails
from components.k8s.platform import kueue, monitoring, network_operator
from components.k8s.gpu_stack import GpuKubernetesStack, render_namespaces
from components.k8s.gpu_stack import network_images_row
from tests.components.k8s.conftest import infiniband
from tests.conftest import problems_of, ssh_key


def all_objects(spec) -> list[dict]:
    row = network_images_row(spec)
    manifests = [*render_namespaces(spec), network_operator.render_nic_cluster_policy(spec, row),
                 *network_operator.render_secondary_networks(spec), *kueue.render_kueue_objects(spec),
                 monitoring.render_prometheus_rule(spec, "monitoring"), monitoring.render_dashboard(spec, "monitoring")]
    return [m.obj for m in manifests]


VARIANTS = {
    "dev": lambda d: None,
    "infiniband": infiniband,
    "sriov": lambda d: d["kubernetes"].update(network_operator={"rdma_device_plugin": "sriov",
                                                                "rail_subnets": ["10.201.0.0/16", "10.202.0.0/16"]}),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_custom_resources_pass_the_upstream_crds(variant, make_spec, shared_dir, tmp_path):
    objs = [o for o in all_objects(make_spec(VARIANTS[variant])) if "." in o["apiVersion"].split("/")[0]]
    (tmp_path / "objs.yaml").write_text(yaml.safe_dump_all(objs))
    out = subprocess.run([sys.executable, str(shared_dir / "tools" / "validate_crs.py"), str(tmp_path / "objs.yaml")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    checked = [o for o in objs if o["apiVersion"].split("/")[0] in ("kueue.x-k8s.io", "mellanox.com")]
    assert out.stdout.strip().splitlines()[-1] == f"{len(checked)} validated, 0 errors"


def test_core_objects_are_valid_kubernetes(dev_spec):
    for obj in all_objects(dev_spec):
        if obj["apiVersion"] == "v1":
            kubernetes_validate.validate(obj, dev_spec.kubernetes.version, strict=True)


def test_system_namespaces_get_the_pod_security_they_need(dev_spec):
    levels = {m.obj["metadata"]["name"]: m.obj["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
              for m in render_namespaces(dev_spec)}
    assert levels == {"node-feature-discovery": "privileged", "gpu-operator": "privileged",
                      "network-operator": "privileged", "kueue-system": "baseline", "mpi-operator": "restricted",
                      "nrr-system": "restricted", "gpu-health-checks": "privileged"}


def test_no_network_operator_namespace_on_plain_ethernet(make_spec):
    spec = make_spec(lambda d: d.update(fabric={"kind": "ethernet"}))
    assert "network-operator" not in {m.obj["metadata"]["name"] for m in render_namespaces(spec)}


def test_rdma_shared_device_plugin_selects_the_pools_nics(dev_spec):
    policy = network_operator.render_nic_cluster_policy(dev_spec, network_images_row(dev_spec)).obj
    assert policy["metadata"] == {"name": "nic-cluster-policy"}
    config = json.loads(policy["spec"]["rdmaSharedDevicePlugin"]["config"])
    assert config == {"configList": [{"resourceName": "rdma_shared_devices", "rdmaHcaMax": 63, "selectors": {
        "vendors": ["15b3"], "ifNames": ["ens1f0np0", "ens2f0np0"], "linkTypes": ["ether"]}}]}
    assert policy["spec"]["rdmaSharedDevicePlugin"]["version"] == "network-operator-v26.4.1"
    assert rails.rdma_resource(dev_spec) == "rdma/rdma_shared_devices"
    assert rails.network_names(dev_spec) == ["default/rail-0", "default/rail-1"]


def test_roce_requires_secondary_networks_and_its_pods_attach_to_their_rails(dev_spec, dev_data):
    """RoCE GIDs belong to a netdev: a pod with the RDMA device but without the rail's netdev has no GID."""
    from components.fabric.checks import render_nccl_job
    from components.k8s.tenancy.jobs import render_example_jobs
    networks = {"k8s.v1.cni.cncf.io/networks": "default/rail-0,default/rail-1"}
    _, job = render_nccl_job(dev_spec, dev_spec.node_pools[0])
    assert job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["metadata"]["annotations"] == networks
    for example in render_example_jobs(dev_spec).values():
        pods = example["spec"]["mpiReplicaSpecs"]["Worker"] if example["kind"] == "MPIJob" else example["spec"]
        annotations = pods["template"]["metadata"]["annotations"]
        assert annotations["k8s.v1.cni.cncf.io/networks"] == networks["k8s.v1.cni.cncf.io/networks"]
    del dev_data["kubernetes"]["network_operator"]
    (msg,) = problems_of(dev_data)
    assert ("kubernetes.network_operator.rail_subnets: the fabric is RoCE but no rail has a secondary network, so "
            "pods of h100 get the RDMA devices without their netdevs and no RoCE GID") in msg


def test_sriov_uses_devices_plugin_and_host_device_networks(make_spec):
    spec = make_spec(VARIANTS["sriov"])
    policy = network_operator.render_nic_cluster_policy(spec, network_images_row(spec)).obj["spec"]
    assert "rdmaSharedDevicePlugin" not in policy
    resources = json.loads(policy["sriovDevicePlugin"]["config"])["resourceList"]
    assert resources[0]["selectors"]["pfNames"] == ["ens1f0np0", "ens2f0np0"] and "deviceIDs" not in \
        resources[0]["selectors"]
    kinds = {m.obj["kind"] for m in network_operator.render_secondary_networks(spec)}
    assert kinds == {"IPPool", "HostDeviceNetwork"}
    assert rails.rdma_resource(spec) == "nvidia.com/rdma_shared_devices"


def test_roce_rails_get_macvlan_networks_with_the_fabric_mtu(dev_spec):
    spec = dev_spec
    nets = {m.obj["metadata"]["name"] + "/" + m.obj["kind"]: m.obj for m in network_operator.render_secondary_networks(spec)}
    rail0 = nets["rail-0/MacvlanNetwork"]["spec"]
    assert rail0["master"] == "ens1f0np0" and rail0["mtu"] == 9000 and rail0["networkNamespace"] == "default"
    assert json.loads(rail0["ipam"]) == {"type": "nv-ipam", "poolName": "rail-0"}
    assert nets["rail-1/IPPool"]["spec"]["subnet"] == "10.202.0.0/16"
    assert rails.network_names(spec) == ["default/rail-0", "default/rail-1"]


def test_infiniband_rails_get_ipoib_networks(make_spec):
    spec = make_spec(infiniband)
    kinds = sorted(m.obj["kind"] for m in network_operator.render_secondary_networks(spec))
    assert kinds == ["IPPool", "IPPool", "IPoIBNetwork", "IPoIBNetwork"]
    policy = network_operator.render_nic_cluster_policy(spec, network_images_row(spec)).obj["spec"]
    assert "ipoib" in policy["secondaryNetwork"]
    assert json.loads(policy["rdmaSharedDevicePlugin"]["config"])["configList"][0]["selectors"]["linkTypes"] == \
        ["infiniband"]


def test_kueue_objects_map_quota_onto_node_pools(dev_spec):
    objs = {(m.obj["kind"], m.obj["metadata"]["name"]): m.obj for m in kueue.render_kueue_objects(dev_spec)}
    assert [name for kind, name in objs if kind == "ResourceFlavor"] == ["h100"]   # a flavor is a pool
    h100 = objs[("ResourceFlavor", "h100")]["spec"]
    assert h100["nodeLabels"] == {"gpucluster.io/pool": "h100"} and h100["topologyName"] == "gpu-topology"
    assert h100["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "present",
                                    "effect": "NoSchedule"}]
    assert [lv["nodeLabel"] for lv in objs[("Topology", "gpu-topology")]["spec"]["levels"]] == [
        "gpucluster.io/block", "gpucluster.io/leaf", "kubernetes.io/hostname"]
    assert ("Cohort", "gpu-cluster") in objs
    assert objs[("WorkloadPriorityClass", "production")]["value"] == 1000


def test_alerts_use_only_metrics_dcgm_exports(dev_spec):
    exported = {f for f, _, _ in monitoring.DCGM_FIELDS}
    rules = monitoring.render_alert_rules(dev_spec)
    for rule in rules:
        used = {w for w in rule["expr"].replace("(", " ").replace(")", " ").replace("[", " ").split()
                if w.startswith("DCGM_")}
        assert used <= exported, rule["alert"]
    assert {r["alert"] for r in rules} == {"GpuTemperatureHigh", "GpuXidError", "GpuEccDoubleBitError",
                                           "GpuThermalThrottling", "GpuPowerThrottling", "GpusMissingH100",
                                           "GpuHardwareFault", "GpuNodeUnhealthy", "GpuNodeQuarantined",
                                           "GpuHealthCheckFailed", "GpuHealthCheckBlind"}
    assert next(r for r in rules if r["alert"] == "GpuTemperatureHigh")["expr"].endswith("> 85")
    assert next(r for r in rules if r["alert"] == "GpusMissingH100")["expr"].endswith("< 8")


def test_missing_gpu_alert_counts_time_sliced_replicas(make_spec):
    spec = make_spec(lambda d: d["node_pools"][0].update(sharing={"time_slicing_replicas": 4}))
    rule = next(r for r in monitoring.render_alert_rules(spec) if r["alert"] == "GpusMissingH100")
    assert rule["expr"].endswith("< 32")


def test_temperature_limit_comes_from_the_spec(make_spec):
    spec = make_spec(lambda d: d["kubernetes"].update(monitoring={"gpu_temperature_limit_c": 80}))
    assert monitoring.render_alert_rules(spec)[0]["expr"].endswith("> 80")


def test_dashboard_is_valid_json_grafana_loads(dev_spec):
    cm = monitoring.render_dashboard(dev_spec, "monitoring").obj
    assert cm["metadata"]["labels"] == {"grafana_dashboard": "1"}
    dashboard = json.loads(cm["data"]["gpucluster-gpu.json"])
    # with the quarantine and the health checks
    assert dashboard["uid"] == "gpucluster-dev" and len(dashboard["panels"]) == 12


# --- bad input ------------------------------------------------------------------------------------------

def test_rejects_an_unknown_version_combination(dev_data):
    dev_data["kubernetes"]["kueue"]["chart_version"] = "0.13.0"
    (msg,) = problems_of(dev_data)
    assert "kubernetes: gpu_operator v26.7.0, network_operator 26.4.1, kueue 0.13.0 and nfd 0.19.0 are not a " \
           "known-good combination; known: gpu_operator v26.7.0, network_operator 26.4.1, kueue 0.19.2, nfd 0.19.0" in msg


def test_an_unknown_combination_can_be_allowed_explicitly(dev_data):
    dev_data["kubernetes"]["kueue"]["chart_version"] = "0.13.0"
    dev_data["kubernetes"]["allow_unknown_versions"] = True
    assert problems_of(dev_data) == []


def test_rejects_an_rdma_resource_name_with_a_hyphen(dev_data):
    dev_data["kubernetes"]["network_operator"]["rdma_resource_name"] = "rdma-shared"
    (msg,) = problems_of(dev_data)
    assert "kubernetes.network_operator.rdma_resource_name: 'rdma-shared' is not a device plugin resource name" in msg
    assert "(e.g. 'rdma_shared')" in msg


def test_rejects_mig_on_a_gpu_without_mig(dev_data):
    dev_data["node_pools"][0]["gpu"] = {"model": "L40S-48GB", "count": 8}
    dev_data["node_pools"][0]["sharing"] = {"mig_config": "all-1g.10gb"}
    dev_data["tenants"] = []
    (msg,) = problems_of(dev_data)
    assert "node_pools[0].sharing.mig_config: L40S-48GB has no MIG" in msg


def test_rejects_rail_subnets_that_do_not_match_the_rails(dev_data):
    dev_data["kubernetes"]["network_operator"] = {"rail_subnets": ["10.201.0.0/16"]}
    (msg,) = problems_of(dev_data)
    assert "kubernetes.network_operator.rail_subnets: 1 subnet(s) for 2 rail(s) (0, 1)" in msg


def test_quota_capacity_counts_time_sliced_replicas(dev_data):
    dev_data["node_pools"][0]["sharing"] = {"time_slicing_replicas": 2}
    dev_data["tenants"][0]["gpu_quota"]["h100"]["nominal"] = 26     # 26 + 6 = 32 = 2 hosts x 8 x 2
    assert problems_of(dev_data) == []
    dev_data["tenants"][0]["gpu_quota"]["h100"]["nominal"] = 27
    (msg,) = problems_of(dev_data)
    assert "node pool 'h100' holds 32 (2 hosts x 8, shared as 16 per host)" in msg


# --- the component under mocks ----------------------------------------------------------------------------

def short(urn: str) -> str:
    return urn.rsplit("::", 1)[-1]


@pytest.fixture
def stack_run(dev_spec, record):
    return record(lambda: GpuCluster("dev", dev_spec, ssh_key()))


def test_stack_children_are_named_by_role_under_the_stack(stack_run):
    stack = next(r for r in stack_run.records if r.type == GpuKubernetesStack.TYPE)
    children = {short(r.urn) for r in stack_run.records if r.parent == stack.urn}
    assert {"dev-k8s-node-feature-discovery", "dev-k8s-gpu-operator", "dev-k8s-network-operator", "dev-k8s-kueue",
            "dev-k8s-nic-policy", "dev-k8s-flavor-h100", "dev-k8s-topology", "dev-k8s-cohort",
            "dev-k8s-gpu-alerts", "dev-k8s-gpu-dashboard"} <= children
    assert stack_run.duplicates == []


def test_exactly_one_nfd_is_installed(stack_run):
    releases = [r for r in stack_run.records if r.type == "kubernetes:helm.sh/v3:Release"]
    charts = sorted(r.inputs["chart"].rsplit("/", 1)[-1] for r in releases)
    assert charts == ["gpu-operator", "kueue", "network-operator", "node-feature-discovery"]
    by_chart = {r.inputs["chart"].rsplit("/", 1)[-1]: r.inputs for r in releases}
    assert by_chart["gpu-operator"]["values"]["nfd"]["enabled"] is False
    assert by_chart["network-operator"]["values"]["nfd"]["enabled"] is False


def test_releases_are_pinned_awaited_and_named(stack_run):
    for r in (r for r in stack_run.records if r.type == "kubernetes:helm.sh/v3:Release"):
        assert r.inputs["version"] and r.inputs["skipAwait"] is False
        assert r.inputs["name"] == short(r.urn).removeprefix("dev-k8s-")


def test_every_kueue_object_waits_for_the_kueue_release(stack_run):
    urns = {short(r.urn): r for r in stack_run.records}
    kueue_release = urns["dev-k8s-kueue"].urn
    kueue_objects = [r for r in stack_run.records if r.type.startswith("kubernetes:kueue.x-k8s.io")]
    # a flavor, topology, cohort, 2 priorities, 2 tenants' CQs and LQs, the health checks' CQ and LQ
    assert len(kueue_objects) == 11
    for r in kueue_objects:
        assert kueue_release in r.dependencies, short(r.urn)


def test_operators_wait_for_nfd_and_their_namespace(stack_run):
    urns = {short(r.urn): r for r in stack_run.records}
    gpu = urns["dev-k8s-gpu-operator"].dependencies
    assert urns["dev-k8s-node-feature-discovery"].urn in gpu and urns["dev-k8s-ns-gpu-operator"].urn in gpu
    assert urns["dev-k8s-network-operator"].urn in urns["dev-k8s-nic-policy"].dependencies


def test_cluster_exposes_what_job_templates_need(dev_spec, record):
    import pulumi

    def program():
        cluster = GpuCluster("dev", dev_spec, ssh_key())
        pulumi.export("rdma", cluster.kubernetes.rdma_resource)
        pulumi.export("flavors", cluster.kubernetes.flavors)
    run = record(program)
    assert run.outputs["rdma"] == ("rdma/rdma_shared_devices", False)
    assert run.outputs["flavors"] == ({"h100": "h100"}, False)


PROMTOOL = pytest.mark.skipif(shutil.which("promtool") is None,
                              reason="promtool is not installed (.ci/run installs prometheus)")


def promtool(spec, tmp_path, series: list[dict], alerts: list[dict]) -> None:
    """Prometheus's own rule engine over the stack's alert rules: `promtool check rules`, then `test rules`
    with these input series and expected alerts."""
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(
        {"groups": [{"name": "gpu", "rules": monitoring.render_alert_rules(spec)}]}))
    (tmp_path / "test.yaml").write_text(yaml.safe_dump({
        "rule_files": ["rules.yaml"], "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": alerts}]}))
    for command in (["check", "rules", "rules.yaml"], ["test", "rules", "test.yaml"]):
        out = subprocess.run(["promtool", *command], cwd=tmp_path, capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr


@PROMTOOL
def test_the_xid_alert_fires_on_a_new_hardware_xid_only(dev_spec, tmp_path):
    """DCGM's XID gauge keeps the last XID for good. An application XID (13, the job's fault) never fires; a
    hardware XID (79, fell off the bus) fires when it appears and stops once it has stood unchanged, instead of
    paging forever."""
    labels = 'Hostname="gpu-dev-01", gpu="3"'
    promtool(dev_spec, tmp_path, [
        {"series": f"DCGM_FI_DEV_XID_ERRORS{{{labels}}}", "values": "0 0 13 13 13 13 13 13 79 79 " + "79 " * 20},
    ], [
        {"eval_time": "5m", "alertname": "GpuXidError", "exp_alerts": []},                 # application XID
        {"eval_time": "9m", "alertname": "GpuXidError", "exp_alerts": [{
            "exp_labels": {"severity": "critical", "Hostname": "gpu-dev-01", "gpu": "3"},
            "exp_annotations": {"summary": "GPU 3 on gpu-dev-01 reported hardware XID 79; drain the node"}}]},
        {"eval_time": "25m", "alertname": "GpuXidError", "exp_alerts": []},                # unchanged since
    ])


@PROMTOOL
def test_the_hardware_fault_alert_holds_while_a_node_carries_the_detectors_condition(dev_spec, tmp_path):
    """Over kube-state-metrics' node condition series: it fires while GpuHardwareFault is true."""
    series = 'kube_node_status_condition{{node="gpu-dev-02", condition="GpuHardwareFault", status="{}"}}'
    promtool(dev_spec, tmp_path, [
        {"series": series.format("true"), "values": "0 0 0 1 1 1 0 0"},
        {"series": series.format("false"), "values": "1 1 1 0 0 0 1 1"},
    ], [
        {"eval_time": "2m", "alertname": "GpuHardwareFault", "exp_alerts": []},
        {"eval_time": "4m", "alertname": "GpuHardwareFault", "exp_alerts": [{
            "exp_labels": {"severity": "critical", "node": "gpu-dev-02"},
            "exp_annotations": {"summary": "node gpu-dev-02 logged a GPU hardware XID (GpuHardwareFault); "
                                           "`kubectl describe node gpu-dev-02` shows which GPU and XID: take "
                                           "it out of service"}}]},
        {"eval_time": "7m", "alertname": "GpuHardwareFault", "exp_alerts": []},
    ])


@PROMTOOL
def test_the_blind_check_alert_fires_once_a_check_has_read_nothing_for_a_quarter_hour(dev_spec, tmp_path):
    series = 'kube_node_status_condition{{node="gpu-dev-01", condition="GpuHealthCheckBlind", status="{}"}}'
    promtool(dev_spec, tmp_path, [{"series": series.format("true"), "values": "0 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 0"}],
             [{"eval_time": "10m", "alertname": "GpuHealthCheckBlind", "exp_alerts": []},     # a restart's blip
              {"eval_time": "17m", "alertname": "GpuHealthCheckBlind", "exp_alerts": [{
                  "exp_labels": {"severity": "warning", "node": "gpu-dev-01"},
                  "exp_annotations": {"summary": "node gpu-dev-01: a GPU health check cannot read its inputs and "
                                                 "keeps its last verdict (GpuHealthCheckBlind); `kubectl describe "
                                                 "node gpu-dev-01` says which and why. The node is left as it "
                                                 "was: fix the detector"}}]}])


@PROMTOOL
def test_the_quarantine_alert_holds_while_the_node_carries_the_quarantine_taint(dev_spec, tmp_path):
    """Over kube-state-metrics' taint series: the taint's key is the rule's, and the alert says what releases it."""
    series = ('kube_node_spec_taint{node="gpu-dev-01", key="readiness.k8s.io/gpucluster-gpu-health", '
              'value="gpu-fault", effect="NoExecute"}')
    promtool(dev_spec, tmp_path, [{"series": series, "values": "_ _ 1 1 1 stale _"}], [
        {"eval_time": "1m", "alertname": "GpuNodeQuarantined", "exp_alerts": []},
        {"eval_time": "3m", "alertname": "GpuNodeQuarantined", "exp_alerts": [{
            "exp_labels": {"severity": "warning", "node": "gpu-dev-01"},
            "exp_annotations": {"summary": "node gpu-dev-01 is quarantined (readiness.k8s.io/gpucluster-gpu-health): "
                                           "a GPU fault not yet followed by a passing burn-in; after the repair and a "
                                           "reboot, burn it in again with `pulumi up --replace` of its "
                                           "<pool>-<host>-burn-in resource"}}]},
        {"eval_time": "6m", "alertname": "GpuNodeQuarantined", "exp_alerts": []},    # the taint is gone
    ])


@PROMTOOL
def test_the_unhealthy_alert_names_each_nvml_condition_a_node_carries(dev_spec, tmp_path):
    """Over kube-state-metrics' node condition series: one alert per node and condition of the NVML detector;
    the kernel detector's conditions have alerts of their own."""
    series = 'kube_node_status_condition{{node="gpu-dev-01", condition="{}", status="{}"}}'
    promtool(dev_spec, tmp_path, [
        {"series": series.format("GpuOverheating", "true"), "values": "0 1 1 0"},
        {"series": series.format("GpuNvlinkDown", "true"), "values": "0 0 1 1"},
        {"series": series.format("GpuBurnInRequired", "true"), "values": "1 1 1 1"},
    ], [
        {"eval_time": "0m", "alertname": "GpuNodeUnhealthy", "exp_alerts": []},
        {"eval_time": "2m", "alertname": "GpuNodeUnhealthy", "exp_alerts": [
            {"exp_labels": {"severity": "critical", "node": "gpu-dev-01", "condition": c},
             "exp_annotations": {"summary": f"node gpu-dev-01: {c} (a GPU above the temperature limit for too "
                                            "long, or an NVLink down); `kubectl describe node gpu-dev-01` says "
                                            "which GPU"}} for c in ("GpuOverheating", "GpuNvlinkDown")]},
    ])


@PROMTOOL
def test_a_failed_health_check_alerts_for_a_day_and_a_passed_one_never(dev_spec, tmp_path):
    """Over kube-state-metrics' Job series in the checks' namespace (the failed Job is kept for its history)."""
    job = 'namespace="gpu-health-checks", job_name="gpu-check-gpu-dev-01-29410920"'
    ok = 'namespace="gpu-health-checks", job_name="gpu-check-gpu-dev-02-29410920"'
    old = 'namespace="gpu-health-checks", job_name="gpu-check-gpu-dev-02-29409480"'
    promtool(dev_spec, tmp_path, [
        {"series": f'kube_job_status_failed{{{job}, reason="BackoffLimitExceeded"}}', "values": "0 0 1x30"},
        {"series": f"kube_job_status_start_time{{{job}}}", "values": "60x32"},
        {"series": f'kube_job_status_failed{{{ok}, reason="BackoffLimitExceeded"}}', "values": "0x32"},
        {"series": f"kube_job_status_start_time{{{ok}}}", "values": "60x32"},
        # a failure more than a day old: its node has been seen to since
        {"series": f'kube_job_status_failed{{{old}, reason="DeadlineExceeded"}}', "values": "1x32"},
        {"series": f"kube_job_status_start_time{{{old}}}", "values": "-86340x32"},
    ], [
        {"eval_time": "1m", "alertname": "GpuHealthCheckFailed", "exp_alerts": []},
        {"eval_time": "3m", "alertname": "GpuHealthCheckFailed", "exp_alerts": [{
            "exp_labels": {"severity": "warning", "job_name": "gpu-check-gpu-dev-01-29410920"},
            "exp_annotations": {"summary": "GPU health check gpu-check-gpu-dev-01-29410920 failed: a failed test "
                                           "holds its node in quarantine until a burn-in passes; without one the "
                                           "check could not run. `kubectl -n gpu-health-checks logs "
                                           "job/gpu-check-gpu-dev-01-29410920` says which"}}]},
    ])


def panel_query(spec, tmp_path, title: str, series: list[dict], eval_time: str, samples: list[dict]) -> dict:
    """Prometheus's own engine over the query of the dashboard's panel whose title holds `title`; the panel."""
    cm = monitoring.render_dashboard(spec, "monitoring").obj
    (panel,) = [p for p in json.loads(cm["data"]["gpucluster-gpu.json"])["panels"] if title in p["title"]]
    (tmp_path / "test.yaml").write_text(yaml.safe_dump({"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series, "promql_expr_test": [{
            "expr": panel["targets"][0]["expr"], "eval_time": eval_time, "exp_samples": samples}]}]}))
    out = subprocess.run(["promtool", "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    return panel


@PROMTOOL
def test_the_quarantine_panel_lists_each_quarantined_node_with_the_condition_that_holds_it(dev_spec, tmp_path):
    """Prometheus's own engine over the panel's query: a tainted node once per true condition; a node with a
    condition but no taint (observe mode, or not yet acted on) is not quarantined."""
    condition = 'kube_node_status_condition{{node="{}", condition="{}", status="{}"}}'
    taint = 'kube_node_spec_taint{{node="{}", key="readiness.k8s.io/gpucluster-gpu-health", value="gpu-fault", ' \
            'effect="NoExecute"}}'
    series = [{"series": condition.format("gpu-dev-01", "GpuBurnInRequired", "true"), "values": "1 1"},
              {"series": condition.format("gpu-dev-01", "GpuHardwareFault", "true"), "values": "0 0"},
              {"series": taint.format("gpu-dev-01"), "values": "1 1"},
              {"series": condition.format("gpu-dev-02", "GpuHardwareFault", "true"), "values": "1 1"}]
    panel = panel_query(dev_spec, tmp_path, "Quarantined", series, "1m",
                        [{"labels": '{condition="GpuBurnInRequired", node="gpu-dev-01"}', "value": 1}])
    assert panel["targets"][0]["legendFormat"] == "{{node}}: {{condition}}"


@PROMTOOL
def test_the_health_check_panel_shows_the_hours_since_each_nodes_last_passing_check(dev_spec, tmp_path):
    last = 'kube_cronjob_status_last_successful_time{{namespace="{}", cronjob="{}"}}'
    series = [{"series": last.format("gpu-health-checks", "gpu-check-gpu-dev-01"), "values": "0x60"},
              {"series": last.format("gpu-health-checks", "gpu-check-gpu-dev-02"), "values": "-7200x60"},
              {"series": last.format("team-a", "nightly"), "values": "0x60"}]         # a tenant's CronJob: not ours
    panel = panel_query(dev_spec, tmp_path, "health check", series, "60m",
                        [{"labels": '{cronjob="gpu-check-gpu-dev-01"}', "value": 1},
                         {"labels": '{cronjob="gpu-check-gpu-dev-02"}', "value": 3}])
    assert panel["targets"][0]["legendFormat"] == "{{cronjob}}" and panel["fieldConfig"]["defaults"]["unit"] == "h"
