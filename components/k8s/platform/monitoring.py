"""GPU alerts, the DCGM metrics they read, and a Grafana dashboard, kept in one module so they agree.

Every metric an alert or panel uses is in DCGM_FIELDS, which the GPU Operator's dcgm-exporter is configured
with: its default list (dcp-metrics-included.csv) leaves out the ECC and throttling counters.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ...spec import ClusterSpec
from ...spec.cluster import checked_pools
from ..health import checks as health_checks, nvml as health_nvml, quarantine
from ..slurm import node_check as slurm_health
from ..health.detector import BLIND_CONDITION, CONDITION as HEALTH_CONDITION
from ..labels import POOL_LABEL, QUARANTINE_TAINT
from ..objects import Manifest

# (DCGM field, Prometheus type, help): dcgm-exporter's default list plus ECC, throttling and NVLink errors.
DCGM_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_POWER_VIOLATION", "counter", "Throttling duration due to power constraints (in ns)."),
    ("DCGM_FI_DEV_THERMAL_VIOLATION", "counter", "Throttling duration due to thermal constraints (in ns)."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total number of single-bit volatile ECC errors."),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors."),
    ("DCGM_FI_DEV_RETIRED_DBE", "counter", "Total number of retired pages due to double-bit errors."),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for uncorrectable errors"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
    ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink flow-control CRC errors."),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", "Total number of NVLink bandwidth counters for all lanes."),
    ("DCGM_FI_DRIVER_VERSION", "label", "Driver Version"),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", "Ratio of cycles the device memory interface is active."),
)
DCGM_METRICS_CONFIG = "gpucluster-dcgm-metrics"


def render_dcgm_metrics_csv() -> str:
    return "# DCGM FIELD, Prometheus metric type, help message\n" + "".join(
        f"{field}, {kind}, {help_}\n" for field, kind, help_ in DCGM_FIELDS)


SLURM_DRAINED = "slurm_partition_nodes_drain"    # Slurm's openmetrics.c: nodes with the Drain flag, per partition


def _rule(alert: str, expr: str, for_: str, severity: str, summary: str) -> dict[str, Any]:
    return {"alert": alert, "expr": expr, "for": for_, "labels": {"severity": severity},
            "annotations": {"summary": summary}}


def render_alert_rules(spec: ClusterSpec) -> list[dict[str, Any]]:
    limit = spec.kubernetes.monitoring.gpu_temperature_limit_c
    rules = [
        _rule("GpuTemperatureHigh", f"max by (Hostname, gpu) (DCGM_FI_DEV_GPU_TEMP) > {limit}", "5m", "warning",
              f"GPU {{{{ $labels.gpu }}}} on {{{{ $labels.Hostname }}}} is at {{{{ $value }}}} C, above {limit} C"),
        # The exporter's XID metric holds the last XID seen, for good: alert when it changes to one that takes the
        # node out (fault_xids, as the detector). Application XIDs (13, 31, 43: a job's own fault) would fire forever.
        _rule("GpuXidError", "max by (Hostname, gpu) ("
              + " or ".join(f"DCGM_FI_DEV_XID_ERRORS == {x}" for x in sorted(set(spec.kubernetes.health.fault_xids)))
              + ") and max by (Hostname, gpu) (changes(DCGM_FI_DEV_XID_ERRORS[10m])) > 0", "0m", "critical",
              "GPU {{ $labels.gpu }} on {{ $labels.Hostname }} reported hardware XID {{ $value }}; drain the node"),
        _rule("GpuEccDoubleBitError",
              "sum by (Hostname, gpu) (increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[10m])) > 0 "
              "or max by (Hostname, gpu) (DCGM_FI_DEV_ROW_REMAP_FAILURE) > 0", "0m", "critical",
              "GPU {{ $labels.gpu }} on {{ $labels.Hostname }} has uncorrectable ECC errors; drain the node"),
        _rule("GpuThermalThrottling",
              "max by (Hostname, gpu) (rate(DCGM_FI_DEV_THERMAL_VIOLATION[5m])) / 1e9 > 0.05", "10m", "warning",
              "GPU {{ $labels.gpu }} on {{ $labels.Hostname }} is thermally throttled {{ $value | humanizePercentage }} of the time"),
        _rule("GpuPowerThrottling",
              "max by (Hostname, gpu) (rate(DCGM_FI_DEV_POWER_VIOLATION[5m])) / 1e9 > 0.2", "15m", "warning",
              "GPU {{ $labels.gpu }} on {{ $labels.Hostname }} is power capped {{ $value | humanizePercentage }} of the time"),
    ]
    if spec.kubernetes.health.enabled:
        # node-problem-detector's condition (health/detector.py), as kube-state-metrics exports every node condition: it
        # stays true until the kernel log is cleared, so the alert holds while the node still has the fault.
        rules.append(_rule(
            "GpuHardwareFault", f'max by (node) (kube_node_status_condition{{condition="{HEALTH_CONDITION}",'
                                'status="true"}) == 1', "0m", "critical",
            f"node {{{{ $labels.node }}}} logged a GPU hardware XID ({HEALTH_CONDITION}); `kubectl describe node "
            f"{{{{ $labels.node }}}}` shows which GPU and XID: take it out of service"))
        # A check that cannot read its inputs (a tool missing or hung, an input gone) keeps its last verdict and
        # holds no node: this says so, once it lasts beyond a restart's blip.
        rules.append(_rule(
            "GpuHealthCheckBlind", f'max by (node) (kube_node_status_condition{{condition="{BLIND_CONDITION}",'
                                   'status="true"}) == 1', "15m", "warning",
            f"node {{{{ $labels.node }}}}: a GPU health check cannot read its inputs and keeps its last verdict "
            f"({BLIND_CONDITION}); `kubectl describe node {{{{ $labels.node }}}}` says which and why. The node is "
            "left as it was: fix the detector"))
        if health_nvml.enabled(spec):
            # The NVML detector's conditions (health/nvml.py), quarantining or not: the condition says which.
            conditions = "|".join(health_nvml.CONDITIONS.values())
            rules.append(_rule(
                "GpuNodeUnhealthy", f'max by (node, condition) (kube_node_status_condition{{condition=~"{conditions}",'
                                    'status="true"}) == 1', "0m", "critical",
                "node {{ $labels.node }}: {{ $labels.condition }} (a GPU above the temperature limit for too long, or "
                "an NVLink down); `kubectl describe node {{ $labels.node }}` says which GPU"))
        if quarantine.enabled(spec):
            # The taint node-readiness-controller keeps (kube-state-metrics' kube_node_spec_taint), joined with
            # the condition that holds it past the reboot: the alert says what releases the node.
            rules.append(_rule(
                "GpuNodeQuarantined", f'max by (node) (kube_node_spec_taint{{key="{QUARANTINE_TAINT}"}}) == 1',
                "0m", "warning",
                f"node {{{{ $labels.node }}}} is quarantined ({QUARANTINE_TAINT}): a GPU fault not yet followed by "
                "a passing burn-in; after the repair and a reboot, burn it in again with `pulumi up --replace` of "
                "its <pool>-<host>-burn-in resource"))
            if quarantine.breaker_enabled(spec):
                # Quarantined NoSchedule and not NoExecute for longer than the breaker's passes take: held by
                # the breaker (its pool has its share evicted already) or no breaker running to grant it.
                taint = f'kube_node_spec_taint{{key="{QUARANTINE_TAINT}",effect="%s"}}'
                rules.append(_rule(
                    "GpuQuarantineHeld", f"max by (node) ({taint % 'NoSchedule'}) unless on (node) "
                                         f"max by (node) ({taint % 'NoExecute'})", "5m", "critical",
                    "node {{ $labels.node }} is quarantined but not drained: its pool has its share of nodes "
                    "(kubernetes.health.quarantine.evict_at_most_percent) evicted already, or the breaker "
                    f"(deployment {quarantine.BREAKER} in {quarantine.NAMESPACE}) is not running. Its jobs run on. "
                    "Many faults at once are more often a detector's, a driver's or the site's than the GPUs': "
                    f"`kubectl get nodes -L {quarantine.GRANT_LABEL}` and the detectors' logs first; "
                    f"`kubectl label node {{{{ $labels.node }}}} {quarantine.GRANT_LABEL}={quarantine.GRANTED}` "
                    "drains it by hand"))
    if checked_pools(spec):
        # kube-state-metrics' Job series of the checks started within a day: a failed test has quarantined its
        # node (GpuNodeQuarantined says so); a check that failed with no failed test could not run at all.
        ns = f'namespace="{health_checks.NAMESPACE}"'
        rules.append(_rule(
            "GpuHealthCheckFailed", f"max by (job_name) (kube_job_status_failed{{{ns}}}) > 0 and on (job_name) "
                                    f"max by (job_name) (time() - kube_job_status_start_time{{{ns}}}) < 86400",
            "0m", "warning",
            "GPU health check {{ $labels.job_name }} failed: a failed test holds its node in quarantine until a "
            "burn-in passes; without one the check could not run. `kubectl -n " + health_checks.NAMESPACE
            + " logs job/{{ $labels.job_name }}` says which"))
    if spec.kubernetes.slurm.enabled:
        # slurmctld's partition series (Slurm 25.11 metrics/openmetrics, /metrics/partitions): a node drained by
        # the node check (its reason starts "gpucluster:") or by hand, which Slurm never returns on its own.
        rules.append(_rule(
            "SlurmNodesDrained", f"max by (partition) ({SLURM_DRAINED}) > 0", "0m", "warning",
            "{{ $value }} node(s) of Slurm partition {{ $labels.partition }} drained: `sinfo -R -p "
            f"{{{{ $labels.partition }}}}` lists each with its reason (the node check's start with "
            f"\"{slurm_health.DRAIN_PREFIX.strip()}\"); "
            "after the repair, `scontrol update nodename=<node> state=resume`"))
    # kube-state-metrics must export the pool label (metricLabelsAllowlist: nodes=[gpucluster.io/pool]).
    label = "label_" + POOL_LABEL.replace(".", "_").replace("/", "_").replace("-", "_")
    for pool in spec.node_pools:
        expected = pool.gpu_resources_per_host
        if expected is None:
            continue
        rules.append(_rule(
            f"GpusMissing{''.join(w.capitalize() for w in pool.name.split('-'))}",
            # kube-state-metrics writes the resource name with '_' for '.' and '/'
            f'kube_node_status_capacity{{resource="{re.sub(r"[./]", "_", pool.gpu_resource_name)}"}} '
            f'* on (node) group_left () max by (node) (kube_node_labels{{{label}="{pool.name}"}}) < {expected}',
            "10m", "critical", f"node {{{{ $labels.node }}}} of pool {pool.name} advertises {{{{ $value }}}} of "
                               f"{expected} {pool.gpu_unit_word}"))
    return rules


def render_prometheus_rule(spec: ClusterSpec, namespace: str) -> Manifest:
    m = spec.kubernetes.monitoring
    return Manifest("gpu-alerts", {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
        "metadata": {"name": "gpucluster-gpu-alerts", "namespace": namespace, "labels": dict(m.rule_labels)},
        "spec": {"groups": [{"name": "gpucluster.gpu", "rules": render_alert_rules(spec)}]},
    })


_GPU_LEGEND = "{{Hostname}} gpu{{gpu}}"     # DCGM exporter's labels


def _panel(pid: int, title: str, expr: str, unit: str, x: int, y: int, legend: str = _GPU_LEGEND) -> dict[str, Any]:
    return {"id": pid, "type": "timeseries", "title": title, "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [{"expr": expr, "legendFormat": legend, "refId": "A"}]}


def render_dashboard(spec: ClusterSpec, namespace: str) -> Manifest:
    m = spec.kubernetes.monitoring
    panels = [
        ("GPU utilization", "DCGM_FI_DEV_GPU_UTIL", "percent"),
        ("Tensor core activity", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "percentunit"),
        ("GPU temperature", "DCGM_FI_DEV_GPU_TEMP", "celsius"),
        ("Power draw", "DCGM_FI_DEV_POWER_USAGE", "watt"),
        ("Framebuffer used", "DCGM_FI_DEV_FB_USED", "decmbytes"),
        ("NVLink bandwidth", "rate(DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL[1m])", "Bps"),
        ("Fabric receive (per HCA port)", "rate(node_infiniband_port_data_received_bytes_total[1m])", "Bps"),
        ("Fabric transmit (per HCA port)", "rate(node_infiniband_port_data_transmitted_bytes_total[1m])", "Bps"),
        ("XID errors (last code)", "DCGM_FI_DEV_XID_ERRORS", "none"),
        ("Thermal throttling", "rate(DCGM_FI_DEV_THERMAL_VIOLATION[5m]) / 1e9", "percentunit"),
    ]
    legends = {}
    if quarantine.enabled(spec):
        # Each quarantined node, once per condition that holds it (kube-state-metrics' taint and condition
        # series): GpuHardwareFault until the reboot, GpuBurnInRequired until a burn-in passes after it.
        title = "Quarantined GPU nodes (and the condition that holds each)"
        held = "|".join(quarantine.conditions(spec))
        panels.append((title, f'max by (node, condition) (kube_node_status_condition{{condition=~"{held}",'
                              f'status="true"}} == 1) * on (node) group_left () max by (node) '
                              f'(kube_node_spec_taint{{key="{QUARANTINE_TAINT}"}})', "none"))
        legends[title] = "{{node}}: {{condition}}"
    if checked_pools(spec):
        # Per host's CronJob (gpu-check-<host>): a node never idle for long goes unchecked, and shows it here.
        title = "Hours since each node's last passing GPU health check"
        panels.append((title, f'(time() - max by (cronjob) (kube_cronjob_status_last_successful_time{{namespace='
                              f'"{health_checks.NAMESPACE}"}})) / 3600', "h"))
        legends[title] = "{{cronjob}}"
    if spec.kubernetes.slurm.enabled:
        title = "Drained Slurm nodes per partition"
        panels.append((title, f"max by (partition) ({SLURM_DRAINED})", "none"))
        legends[title] = "{{partition}}"
    dashboard = {
        "title": f"GPU cluster {spec.name}", "uid": f"gpucluster-{spec.name}", "schemaVersion": 39,
        "tags": ["gpu", "gpucluster"], "time": {"from": "now-6h", "to": "now"}, "refresh": "1m",
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus"}]},
        "panels": [_panel(i + 1, title, expr, unit, (i % 2) * 12, (i // 2) * 8, legends.get(title, _GPU_LEGEND))
                   for i, (title, expr, unit) in enumerate(panels)],
    }
    return Manifest("gpu-dashboard", {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "gpucluster-gpu-dashboard", "namespace": namespace, "labels": dict(m.dashboard_labels)},
        "data": {"gpucluster-gpu.json": json.dumps(dashboard, indent=1, sort_keys=True)},
    })
