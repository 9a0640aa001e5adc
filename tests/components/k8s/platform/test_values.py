"""Chart values per option, and every rendered key exists in the chart's default values (typos fail here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from components.k8s.platform import gpu_operator, kueue, network_operator, nfd
from components.k8s.labels import BURN_IN_TAINT, QUARANTINE_TAINT, RESET_TAINT
from components.k8s.platform.monitoring import DCGM_METRICS_CONFIG
from tests.components.k8s.conftest import infiniband

# Keys the chart documents only as commented-out examples in its values.yaml (the template reads them).
DOCUMENTED_ONLY = {"gpu-operator": {("dcgmExporter", "config")}}


def unknown_keys(values: Any, defaults: Any, chart: str, path: tuple[str, ...] = ()) -> list[str]:
    """Paths in `values` that the chart's defaults do not have; free-form maps ({} by default) accept anything."""
    if not isinstance(values, dict) or not isinstance(defaults, dict) or not defaults:
        return []
    out = []
    for key, value in values.items():
        here = path + (key,)
        if here in DOCUMENTED_ONLY.get(chart, set()):
            continue
        if key not in defaults:
            out.append(".".join(here))
        else:
            out += unknown_keys(value, defaults[key], chart, here)
    return out


def chart_defaults(shared: Path, chart: str, version: str) -> dict[str, Any]:
    path = shared / "schemas" / "helm-values" / f"{chart}_v{version.lstrip('v')}_values.yaml"
    return yaml.safe_load(path.read_text())


@pytest.mark.parametrize("variant", ["dev", "infiniband", "time-sliced", "mig", "sriov", "no-monitoring",
                                     "operator-driver"])
def test_every_values_key_exists_in_the_chart(variant, make_spec, shared_dir):
    edits = {
        "dev": lambda d: None, "infiniband": infiniband,
        "time-sliced": lambda d: d["node_pools"][0].update(sharing={"time_slicing_replicas": 4}),
        "mig": lambda d: d["node_pools"][0].update(sharing={"mig_config": "all-1g.10gb"}),
        "sriov": lambda d: d["kubernetes"]["network_operator"].update(rdma_device_plugin="sriov"),
        "no-monitoring": lambda d: d["kubernetes"].update(monitoring={"enabled": False}),
        "operator-driver": lambda d: operator_driver(d),
    }
    spec = make_spec(edits[variant])
    for module, render in ((gpu_operator, gpu_operator.render_gpu_operator_values),
                           (network_operator, network_operator.render_network_operator_values),
                           (kueue, kueue.render_kueue_values), (nfd, nfd.render_nfd_values)):
        chart = module.chart(spec)
        name = chart.name.rsplit("/", 1)[-1]
        defaults = chart_defaults(shared_dir, name, chart.version)
        assert unknown_keys(render(spec), defaults, name) == [], name


def test_unknown_keys_catches_a_typo():
    assert unknown_keys({"driver": {"enabeld": True}}, {"driver": {"enabled": False}}, "gpu-operator") == \
        ["driver.enabeld"]


def test_gpu_operator_leaves_nfd_to_the_stack_and_tolerates_pool_burn_in_and_quarantine_taints(dev_spec):
    values = gpu_operator.render_gpu_operator_values(dev_spec)
    assert values["nfd"] == {"enabled": False}
    keys = {(t["key"], t["effect"]) for t in values["daemonsets"]["tolerations"]}
    assert keys == {("nvidia.com/gpu", "NoSchedule"), *((key, effect) for key in (BURN_IN_TAINT, QUARANTINE_TAINT, RESET_TAINT)
                                                        for effect in ("NoSchedule", "NoExecute"))}


OPERATOR_DRIVER = {"driver_managed": True}


def operator_driver(d):
    """An operator-managed driver, with the pool's host-level GPU work (which needs a host driver) off."""
    d["kubernetes"].update(gpu_operator=OPERATOR_DRIVER)
    d["node_pools"][0].update(tuning={"persistence": False}, burn_in={"enabled": False})


def test_the_operators_driver_upgrades_are_bounded_as_the_strictest_pools_rollout(make_spec):
    def two_pools(d):
        operator_driver(d)
        d["node_pools"][0]["rollout"] = {"max_unavailable": "50%", "drain_timeout_s": 900}
        second = {**d["node_pools"][0], "name": "h100b", "rollout": {"max_unavailable": 1, "drain_timeout_s": 7200}}
        second["hosts"] = [{**h, "hostname": h["hostname"] + "b", "address": h["address"][:-1] + "9"}
                           for h in d["node_pools"][0]["hosts"][:1]]
        d["node_pools"].append(second)
    policy = gpu_operator.render_gpu_operator_values(make_spec(two_pools))["driver"]["upgradePolicy"]
    assert policy["autoUpgrade"] is True
    assert policy["maxParallelUpgrades"] == policy["maxUnavailable"] == 1
    assert policy["drain"] == {"enable": True, "force": False, "timeoutSeconds": 900, "deleteEmptyDir": True}
    assert policy["gpuPodDeletion"]["timeoutSeconds"] == 900 and policy["gpuPodDeletion"]["force"] is False


def test_gpudirect_rdma_on_roce_uses_the_host_ofed(make_spec):
    spec = make_spec(operator_driver)
    assert gpu_operator.render_gpu_operator_values(spec)["driver"]["rdma"] == {"enabled": True, "useHostMofed": True}


def test_no_rdma_on_plain_ethernet(make_spec):
    spec = make_spec(lambda d: d.update(fabric={"kind": "ethernet"}))
    assert gpu_operator.render_gpu_operator_values(spec)["driver"]["rdma"]["enabled"] is False


def test_ofed_from_the_network_operator_turns_host_mofed_off(make_spec):
    spec = make_spec(lambda d: (operator_driver(d), d["kubernetes"].update(
        network_operator={**d["kubernetes"]["network_operator"], "ofed_driver_version": "doca3.3.0-26.01"})))
    assert gpu_operator.render_gpu_operator_values(spec)["driver"]["rdma"] == {"enabled": True, "useHostMofed": False}


def test_the_hosts_driver_is_the_default_and_the_operator_leaves_it_alone(dev_spec):
    """GPUDirect's nvidia-peermem is then loaded by host preparation: driver.rdma acts only on the operator's."""
    assert gpu_operator.render_gpu_operator_values(dev_spec)["driver"] == {
        "enabled": False, "kernelModuleType": "auto", "rdma": {"enabled": False, "useHostMofed": False}}


@pytest.mark.parametrize("rename", [True, False])
def test_time_slicing_config_is_keyed_by_pool(make_spec, rename):
    """Renamed by default: the device plugin advertises the slices as nvidia.com/gpu.shared."""
    spec = make_spec(lambda d: d["node_pools"][0].update(sharing={"time_slicing_replicas": 4,
                                                                  **({} if rename else {"rename_shared": False})}))
    config = gpu_operator.render_gpu_operator_values(spec)["devicePlugin"]["config"]
    assert config["name"] == gpu_operator.DEVICE_PLUGIN_CONFIG and config["default"] == "default"
    assert yaml.safe_load(config["data"]["h100"]) == {"version": "v1", "sharing": {"timeSlicing": {
        "renameByDefault": rename, "failRequestsGreaterThanOne": True,
        "resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}
    assert spec.node_pools[0].gpu_resource_name == ("nvidia.com/gpu.shared" if rename else "nvidia.com/gpu")
    assert yaml.safe_load(config["data"]["default"]) == {"version": "v1"}


def test_no_device_plugin_config_without_time_slicing(dev_spec):
    assert "devicePlugin" not in gpu_operator.render_gpu_operator_values(dev_spec)


def test_mig_turns_on_the_mig_manager(make_spec):
    spec = make_spec(lambda d: d["node_pools"][0].update(sharing={"mig_config": "all-1g.10gb"}))
    values = gpu_operator.render_gpu_operator_values(spec)
    assert values["migManager"] == {"enabled": True} and values["mig"] == {"strategy": "single"}


def test_dcgm_exporter_gets_the_metrics_the_alerts_read(dev_spec):
    dcgm = gpu_operator.render_gpu_operator_values(dev_spec)["dcgmExporter"]
    assert dcgm["config"]["name"] == DCGM_METRICS_CONFIG
    assert "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, counter" in dcgm["config"]["data"]
    assert dcgm["serviceMonitor"]["enabled"] is True
    assert dcgm["serviceMonitor"]["additionalLabels"] == {"release": "kube-prometheus-stack"}


def test_monitoring_off_means_no_service_monitor_and_default_metrics(make_spec):
    spec = make_spec(lambda d: d["kubernetes"].update(monitoring={"enabled": False}))
    dcgm = gpu_operator.render_gpu_operator_values(spec)["dcgmExporter"]
    assert dcgm["serviceMonitor"]["enabled"] is False and "config" not in dcgm


def test_network_operator_leaves_nfd_to_the_stack(dev_spec):
    assert network_operator.render_network_operator_values(dev_spec) == {
        "nfd": {"enabled": False, "deployNodeFeatureRules": True}, "sriovNetworkOperator": {"enabled": False}}


def test_nfd_labels_pci_devices_by_vendor_as_the_operators_expect(dev_spec):
    pci = nfd.render_nfd_values(dev_spec)["worker"]["config"]["sources"]["pci"]
    assert pci["deviceLabelFields"] == ["vendor"] and "0302" in pci["deviceClassWhitelist"]


def test_kueue_manages_every_job_in_tenant_namespaces_only(dev_spec):
    config = yaml.safe_load(kueue.render_kueue_values(dev_spec)["managerConfig"]["controllerManagerConfigYaml"])
    assert config["apiVersion"] == "config.kueue.x-k8s.io/v1beta2"
    assert config["manageJobsWithoutQueueName"] is True
    assert config["managedJobsNamespaceSelector"] == {"matchExpressions": [
        {"key": "gpucluster.io/tenant", "operator": "Exists"}]}
    assert "fairSharing" not in config and "batch/job" in config["integrations"]["frameworks"]


def test_kueue_requeues_a_workload_whose_pods_cannot_all_run_within_the_specs_timeouts(make_spec):
    def read(spec):
        return yaml.safe_load(kueue.render_kueue_values(spec)["managerConfig"]["controllerManagerConfigYaml"])
    default = read(make_spec(lambda d: None))["waitForPodsReady"]
    assert default["timeout"] == "1800s" and default["recoveryTimeout"] == "1800s"     # Kueue's own defaults
    assert default["blockAdmission"] is False and default["requeuingStrategy"]["timestamp"] == "Eviction"
    set_ = read(make_spec(lambda d: d["kubernetes"]["kueue"].update(pods_ready_timeout_s=900,
                                                                    pods_recovery_timeout_s=300)))
    assert set_["waitForPodsReady"]["timeout"] == "900s" and set_["waitForPodsReady"]["recoveryTimeout"] == "300s"


def test_kueue_fair_sharing_when_asked(make_spec):
    spec = make_spec(lambda d: d["kubernetes"]["kueue"].update(fair_sharing=True))
    config = yaml.safe_load(kueue.render_kueue_values(spec)["managerConfig"]["controllerManagerConfigYaml"])
    assert config["fairSharing"] == {"preemptionStrategies": ["LessThanOrEqualToFinalShare", "LessThanInitialShare"]}
