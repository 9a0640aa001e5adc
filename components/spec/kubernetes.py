"""The Kubernetes GPU stack: which operators are on, at which pinned chart versions."""

from __future__ import annotations

import re
from typing import Annotated, Iterator, Literal

from pydantic import AfterValidator, Field

from .common import (ChartRepo, DnsLabel, ImageRef, LabelKey, Labels, Problem, Registry, RelPath, SpecModel, Text,
                     Url, Version, shown)
from .xids import APPLICATION_XIDS, DEFAULT_FAULT_XIDS, XidAction, split
from .slurm import SlurmSettings
from .tenants import Cidr

VERSION = r"^v?[0-9]+\.[0-9]+\.[0-9]+$"


def _resource_name(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_]+", value):
        raise ValueError(f"{shown(value)} is not a device plugin resource name: the RDMA device plugins accept only "
                         f"letters, digits and '_' (e.g. {re.sub(r'[^A-Za-z0-9_]', '_', value)!r})")
    return value


ResourceName = Annotated[str, AfterValidator(_resource_name)]

_CRON_MACROS = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *", "@weekly": "0 0 * * 0",
                "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *"}
_CRON_PART = re.compile(r"(\*|([0-9]+)(?:-([0-9]+))?)(?:/([0-9]+))?")    # '*' or a-b, then /step
_CRON_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12), ("day of week", 0, 6))


def _cron(value: str) -> str:
    """A CronJob schedule as the API server's parser (robfig/cron, standard form) takes it: five fields or a macro;
    numbers only, within each field's range, so a typo is refused here and not by `pulumi up`."""
    fields = value.split()
    if value in _CRON_MACROS:
        return value
    if len(fields) != 5:
        raise ValueError(f"{shown(value)} is not a cron schedule: give five fields (minute hour day-of-month month "
                         f"day-of-week, e.g. '0 */6 * * *') or one of {', '.join(_CRON_MACROS)}")
    for text, (what, low, high) in zip(fields, _CRON_FIELDS):
        for part in text.split(","):
            m = _CRON_PART.fullmatch(part)
            numbers = [int(n) for n in (m.group(2), m.group(3)) if n is not None] if m else []
            if not m or any(not low <= n <= high for n in numbers) or (m.group(4) is not None and
                                                                      int(m.group(4)) == 0) or numbers != sorted(numbers):
                raise ValueError(f"{shown(value)}: {shown(part)} is not a valid {what} (numbers {low}-{high}, "
                                 "'*', ranges a-b from low to high, lists a,b and steps /n)")
    if not cron_fires(value):
        raise ValueError(f"{shown(value)} never fires: no month it names has that day (with day of week '*', the "
                         "day of month must be one the month has); fix the day of month or the month")
    return value


def _cron_values(text: str, low: int, high: int) -> set[int]:
    """The numbers a (valid) cron field matches, as robfig/cron's getRange expands them: `a/n` runs to the end."""
    out: set[int] = set()
    for part in text.split(","):
        m = _CRON_PART.fullmatch(part)
        assert m is not None
        start = low if m[1] == "*" else int(m[2])
        end = high if m[1] == "*" or (m[3] is None and m[4]) else int(m[3] or m[2])
        out.update(range(start, end + 1, int(m[4] or 1)))
    return out


def cron_fields(value: str) -> list[str]:
    """The five fields of a schedule, a macro spelled out."""
    return _CRON_MACROS.get(value, value).split()


def cron_fires(value: str) -> bool:
    """Whether the schedule ever fires. robfig/cron's dayMatches: with day of month or day of week '*', a day
    must match both; otherwise either. So only a day of month that no month of the schedule has, with day of
    week '*', never comes (30 February)."""
    minute, hour, dom, month, dow = cron_fields(value)
    if dow not in ("*", "*/1") or dom in ("*", "*/1"):
        return True
    days = {1: 31, 2: 29, 3: 31, 4: 30, 5: 31, 6: 30, 7: 31, 8: 31, 9: 30, 10: 31, 11: 30, 12: 31}
    return any(d <= days[m] for m in _cron_values(month, 1, 12) for d in _cron_values(dom, 1, 31))


def cron_min_gap_min(value: str) -> int:
    """The shortest time between two firings on one day, in minutes (1440 where it fires once a day)."""
    minute, hour, *_ = cron_fields(value)
    times = sorted(h * 60 + m for h in _cron_values(hour, 0, 23) for m in _cron_values(minute, 0, 59))
    return min((b - a for a, b in zip(times, times[1:])), default=1440)


CronSchedule = Annotated[str, AfterValidator(_cron)]


class ChartSource(SpecModel):
    """Where a release's chart comes from; air-gapped sites point it at their mirror or a vendored copy."""

    chart_repository: ChartRepo | None = Field(
        None, description="A Helm repository (https://...) or OCI registry path (oci://...) holding the chart. "
                          "Omitted: the upstream one.")
    chart_path: RelPath | None = Field(
        None, description="A chart directory in the project (vendored, pinned by its content). Omitted: pulled.")

    def _one_source(self) -> Iterator[Problem]:
        if self.chart_repository and self.chart_path:
            yield Problem(("chart_path",), "set chart_repository or chart_path, not both")

    _checks = (_one_source,)


class GpuOperatorSettings(ChartSource):
    enabled: bool = Field(True, description="Omitted: the GPU Operator is installed.")
    chart_version: str = Field("v26.7.0", pattern=VERSION, description="Omitted: v26.7.0.")
    driver_managed: bool = Field(
        False, description="The operator installs the driver in a container (then the hosts must have none, and "
                           "host-level burn-in, persistence and clock or power settings are refused, as they need "
                           "a host driver). Omitted: false, the driver installed on the hosts is used, which host "
                           "preparation checks and burn-in runs on.")
    kernel_module_type: Literal["auto", "open", "proprietary"] = Field(
        "auto", description="Driver kernel modules. Omitted: auto (open modules on GPUs that support them).")
    mig_strategy: Literal["single", "mixed"] = Field(
        "single", description="How MIG devices are advertised. Omitted: single (each MIG slice is a nvidia.com/gpu).")


class NetworkOperatorSettings(ChartSource):
    enabled: bool | None = Field(None, description="Omitted: installed when the fabric is InfiniBand or RoCE.")
    chart_version: str = Field("26.4.1", pattern=VERSION, description="Omitted: 26.4.1.")
    rdma_device_plugin: Literal["shared", "sriov"] = Field(
        "shared", description="Omitted: the RDMA shared device plugin (every pod sees the host's HCAs).")
    rdma_resource_name: ResourceName = Field(
        "rdma_shared_devices", max_length=63,
        description="Device plugin resource pods ask for (rdma/<name>, or nvidia.com/<name> with sriov). Letters, "
                    "digits and '_' only. Omitted: rdma_shared_devices.")
    rdma_hca_max: int = Field(63, ge=1, le=1000, description="Pods that may share one HCA. Omitted: 63.")
    ofed_driver_version: Version | None = Field(
        None,
        description="DOCA-OFED driver container version to install. Omitted: the hosts' own (or inbox) driver.")
    rail_subnets: list[Cidr] = Field(
        default_factory=list,
        description="Pod IP range of each rail's secondary network, in rail order. Omitted: no secondary "
                    "networks; pods reach the HCAs through the device plugin alone.")
    ips_per_node: int = Field(32, ge=2, le=4096, description="Pod addresses per node on each rail. Omitted: 32.")


class NfdSettings(ChartSource):
    chart_version: str = Field("0.19.0", pattern=VERSION, description="Omitted: 0.19.0.")


LOWEST_PRIORITY = -(2**31)       # int32's least: the active health checks' alone


class PriorityClass(SpecModel):
    name: DnsLabel
    value: int = Field(ge=LOWEST_PRIORITY + 1, le=10**9,
                       description="Kueue's priority of the class's workloads (jobs without a class have 0); the "
                                   "least value is the active health checks', below every job.")
    description: Text = Field("", description="Omitted: no description.")


class KueueSettings(ChartSource):
    chart_version: str = Field("0.19.2", pattern=VERSION, description="Omitted: 0.19.2.")
    cohort: DnsLabel = Field("gpu-cluster", description="Cohort every tenant ClusterQueue joins. Omitted: gpu-cluster.")
    fair_sharing: bool = Field(False, description="Omitted: borrowing is first come, first served.")
    pods_ready_timeout_s: int = Field(
        1800, ge=60, le=86400,
        description="How long an admitted workload may take until all its pods run and are ready (images of tens "
                    "of GB pulled included) before Kueue evicts it, frees its quota and queues it again (Kueue's "
                    "waitForPodsReady). Omitted: 1800, Kueue's own default.")
    pods_recovery_timeout_s: int | None = Field(
        None, ge=10, le=86400,
        description="How long a running workload may wait for a pod that stopped (evicted by a node's drain in a "
                    "rollout, lost with its node) to run again before Kueue evicts the whole workload and queues "
                    "it again, to be placed anew (a training job holds all its GPUs while it waits). Omitted: "
                    "pods_ready_timeout_s, as in Kueue.")
    priority_classes: list[PriorityClass] = Field(
        default_factory=list, description="WorkloadPriorityClasses. Omitted: none; every workload has priority 0.")
    topology_levels: list[LabelKey] = Field(
        default_factory=lambda: ["gpucluster.io/block", "gpucluster.io/leaf", "kubernetes.io/hostname"],
        min_length=1,
        description="Node labels from widest to narrowest for topology-aware scheduling. Omitted: block, leaf "
                    "(the leaf switch of the host's first rail, or its rack without leaves), host.")


class CrdSource(SpecModel):
    """Where a CRD of an operator that ships no chart comes from: its pinned release upstream by default."""

    crd_url: Url | None = Field(
        None, description="Where `pulumi up` fetches the release's CRD (an http(s) URL). Omitted: the release's own "
                          "file on GitHub; air-gapped sites give their mirror's copy, or crd_path.")
    crd_path: RelPath | None = Field(None, description="The CRD as a file in the project (vendored). Omitted: "
                                                       "fetched from crd_url.")

    def _one_source(self) -> Iterator[Problem]:
        if self.crd_url and self.crd_path:
            yield Problem(("crd_path",), "set crd_url or crd_path, not both")
        if self.crd_url and not self.crd_url.startswith(("https://", "http://")):
            yield Problem(("crd_url",), f"{shown(self.crd_url)} is not an http(s) URL, which Pulumi's ConfigFile "
                                        "fetches; give a file in the project as crd_path instead")

    _checks = (_one_source,)


class MpiOperatorSettings(CrdSource):
    """The Kubeflow MPI operator, which runs MPIJobs: the NCCL check's, the validation suite's and tenants' MPI
    training. Kueue admits an MPIJob as one workload (launcher and workers together, or none). Its CRD upstream:
    the release's manifests/base/kubeflow.org_mpijobs.yaml."""

    enabled: bool = Field(True, description="Omitted: installed; without it no MPIJob runs, the NCCL check "
                                            "included.")
    version: str = Field("v0.8.2", pattern=VERSION, description="Release whose CRD and controller image are "
                                                                "installed. Omitted: v0.8.2.")


class MonitoringSettings(SpecModel):
    """Rules and dashboards for an existing Prometheus Operator stack (kube-prometheus-stack) to pick up."""

    enabled: bool = Field(True, description="Omitted: DCGM metrics, alert rules and dashboards are installed.")
    namespace: DnsLabel = Field("monitoring", description="Namespace of the Prometheus stack. Omitted: monitoring.")
    gpu_temperature_limit_c: int = Field(85, ge=40, le=110, description="Omitted: alert above 85 C (and a GPU "
                                                                        "above it for health.gpu_monitor."
                                                                        "temperature_for_s is GpuOverheating).")
    rule_labels: Labels = Field(
        default_factory=lambda: {"release": "kube-prometheus-stack"},
        description="Labels Prometheus selects rules and ServiceMonitors by. Omitted: release=kube-prometheus-stack.")
    dashboard_labels: Labels = Field(
        default_factory=lambda: {"grafana_dashboard": "1"},
        description="Labels Grafana's sidecar loads dashboards by. Omitted: grafana_dashboard=1.")


class QuarantineSettings(CrdSource):
    """What a GPU fault does to its node, through node-readiness-controller (kubernetes-sigs): one rule taints a
    GPU node while GpuHardwareFault is True (a hardware XID since boot), GpuBurnInRequired is True (a fault, a
    failed active check or a fabric port that went down was recorded after the node's last passing burn-in) or
    FabricPortFault is True (an RDMA port of the node is down now), and GpuOverheating or GpuNvlinkDown is True
    when gpu_monitor.quarantine_on names them. The taint is
    readiness.k8s.io/gpucluster-gpu-health. A node leaves only once all are False: after the repair (the reboot
    that clears the fault, the port back up) and a burn-in that passes (`pulumi up --replace` of the host's
    burn-in). Its CRD upstream: the release's crds.yaml."""

    mode: Literal["enforce", "observe", "off"] = Field(
        "enforce", description="enforce: the rule taints faulty nodes. observe: the rule runs in dry run and only "
                               "reports in its status which nodes it would taint (a first week in production, "
                               "or dev). off: no controller and no rule; faults are still conditions and alerts. "
                               "Omitted: enforce.")
    drain: bool = Field(
        True, description="true: a faulty node is tainted NoSchedule at once and, within evict_at_most_percent of "
                          "its pool, NoExecute too, so Kubernetes evicts its pods and Kueue requeues their "
                          "workloads (a job on a faulty GPU is lost anyway); node agents tolerate both. false: "
                          "NoSchedule only, running jobs finish and no new pod lands there. Omitted: true.")
    evict_at_most_percent: int = Field(
        10, ge=1, le=100,
        description="The circuit breaker, with drain: at most this share of a pool's nodes (rounded down, never "
                    "less than one) is quarantined NoExecute at once; a further faulty node is held NoSchedule "
                    "only (its jobs run on, no new pod lands there) and the alert GpuQuarantineHeld fires. Many "
                    "nodes failing at once is more often a detector's, a driver's or the site's fault than the "
                    "GPUs'; `kubectl label node <node> gpucluster.io/quarantine-evict=granted` evicts a held node "
                    "by hand. 100: no breaker, every faulty node is drained. Omitted: 10.")
    kubectl_image: ImageRef = Field(
        "registry.k8s.io/kubectl:v1.33.5",
        description="The circuit breaker's image: kubectl with bash and jq, as Kubernetes' own kubectl image has "
                    "them (build/server-image/kubectl/Dockerfile). Omitted: registry.k8s.io/kubectl:v1.33.5.")
    version: str = Field("v0.5.0", pattern=VERSION, description="node-readiness-controller release whose CRD and "
                                                                "image are installed. Omitted: v0.5.0.")


class ActiveCheckSettings(SpecModel):
    """A short DCGM diagnostic (and, on NVSwitch boards, every NVLink up at full speed), then an NCCL all_reduce
    across the host's GPUs, on every idle GPU node, between tenants' jobs. Each host has a CronJob in the
    namespace gpu-health-checks whose Job asks Kueue for all of the host's GPUs on that host only, at the lowest
    priority, through a ClusterQueue with no quota of its own: it borrows what tenants leave unused, never
    preempts (tenants reclaim from it), and topology-aware scheduling admits it only while every GPU of its host
    is free. A failed check records the failure on the host, and the detector's GpuBurnInRequired holds the
    node in quarantine until a burn-in passes. Runs on pools that burn in and give pods whole GPUs (a shared
    pool's jobs would never leave the host idle long enough; MIG slices are not diagnosed by DCGM)."""

    enabled: bool = Field(True, description="Omitted: every idle GPU node is checked on the schedule.")
    schedule: CronSchedule = Field("0 */6 * * *", description="When each host's check is queued (cron, UTC). A "
                                                             "check waits in its queue until its host is idle; "
                                                             "the next one is not queued while it waits. "
                                                             "Omitted: every six hours.")
    dcgm_level: Literal[1, 2] = Field(
        1, description="`dcgmi diag -r` level: 1 (deployment checks, seconds) or 2 (adds PCIe and memory tests, "
                       "about two minutes). Omitted: 1. The image is validation.dcgm_image.")
    timeout_s: int = Field(900, ge=60, le=3600, description="How long a check may run once admitted before it "
                                                            "counts as failed to run. Omitted: 900.")
    dedicated_pools: bool = Field(
        False, description="Check the idle hosts of pools dedicated to a tenant too: the check's privileged pods then "
                           "run on that tenant's nodes, through a queue that borrows its pool's flavor, an exception "
                           "to its isolation stated on the queue (gpucluster.io/isolation-exception). Omitted: no; a "
                           "dedicated pool's hosts get the burn-in and the detectors only.")
    nccl: bool = Field(True, description="After the diagnostic, an NCCL all_reduce at 8 GiB across the host's GPUs "
                                         "(fabric.checks.nccl_tests_image) must return right values at the pool's "
                                         "burn-in minimum bus bandwidth. Omitted: yes.")

    def _at_most_hourly(self) -> Iterator[Problem]:
        gap = cron_min_gap_min(self.schedule)
        if gap < 60:
            yield Problem(("schedule",), f"{shown(self.schedule)} queues a check every {gap} minute(s), but each "
                                         "takes every GPU of an idle host for up to timeout_s and pulls its images: "
                                         "idle hosts would do little else and tenants' jobs would wait for them; "
                                         "check at most hourly (e.g. '0 */6 * * *')")

    _checks = (_at_most_hourly,)


class GpuMonitorSettings(SpecModel):
    """The GPUs read through NVML while jobs run: a second node-problem-detector on every GPU node, started in the
    GPU Operator's runtime class with every GPU visible (as DCGM's exporter is), runs nvidia-smi every minute.
    GpuOverheating: a GPU above monitoring.gpu_temperature_limit_c at every look for temperature_for_s.
    GpuNvlinkDown: on an NVSwitch board, an NVLink inactive or trained below the others' speed. A detector of its
    own, so that a node where the runtime cannot start it still has its kernel log and fabric ports watched."""

    enabled: bool = Field(True, description="Omitted: every GPU node's temperatures and NVLinks are read each "
                                            "minute.")
    runtime_class: DnsLabel = Field("nvidia", description="RuntimeClass that makes the GPUs and nvidia-smi visible "
                                                          "in the detector (the GPU Operator's "
                                                          "operator.runtimeClass). Omitted: nvidia.")
    temperature_for_s: int = Field(600, ge=120, le=86400,
                                   description="How long a GPU must stay above monitoring.gpu_temperature_limit_c "
                                               "before GpuOverheating is set (a spike under load is not a "
                                               "cooling fault). Omitted: 600.")
    quarantine_on: list[Literal["temperature", "nvlink"]] = Field(
        default_factory=lambda: ["temperature", "nvlink"], max_length=2,
        description="Faults that quarantine the node and, on pools that burn in, hold it until a burn-in passes "
                    "after them; a fault left out only sets its condition and alerts. Omitted: both.")


class HealthSettings(SpecModel):
    """Runtime GPU health: node-problem-detector on every GPU node turns a GPU hardware XID in the kernel log into
    the node condition GpuHardwareFault (reason GpuXid<N>, the driver's line as message) and every XID into a Node
    event, so a fault seen after burn-in is visible per node, to alerts and to the quarantine that acts on it."""

    enabled: bool = Field(True, description="Omitted: node-problem-detector runs on every GPU node.")
    npd_version: str = Field("v1.34.0", pattern=VERSION,
                             description="node-problem-detector release (its image's tag). Omitted: v1.34.0.")
    fault_xids: list[Annotated[int, Field(ge=1, le=999)]] = Field(
        default_factory=lambda: list(DEFAULT_FAULT_XIDS), min_length=1, max_length=64,
        description="XIDs that take a GPU node out of service, each as NVIDIA's XID catalog resolves it "
                    "(components/spec/xids.py): one that needs a GPU reset or a reboot (64 row remapping failed, "
                    "79 fell off the bus, 95 uncontained ECC, ...) sets GpuResetRequired: new work waits, running "
                    "jobs go on, the reboot clears it; one that needs NVIDIA's diagnosis (48 double-bit ECC, 74 "
                    "and 144-150 NVLink) sets GpuHardwareFault: the quarantine, until a reboot and a passing "
                    "burn-in. Preparation, the rollout's preflight, Slurm's node check and the alerts read the "
                    "same list. Any other XID is an event only; a job's own XIDs (13, 31, 43, 45, 94) are refused. "
                    "Omitted: every XID the catalog resolves by a reset, a reboot or a diagnosis.")
    quarantine: QuarantineSettings = Field(default_factory=QuarantineSettings,
                                           description="Omitted: enforced, draining at most 10% of a pool at "
                                                       "once, node-readiness-controller v0.5.0.")
    active_checks: ActiveCheckSettings = Field(default_factory=ActiveCheckSettings,
                                               description="Omitted: `dcgmi diag -r 1` on every idle node every "
                                                           "six hours.")
    gpu_monitor: GpuMonitorSettings = Field(default_factory=GpuMonitorSettings,
                                            description="Omitted: temperatures and NVLinks read every minute, both "
                                                        "faults quarantining.")

    @property
    def xids(self) -> dict[XidAction, tuple[int, ...]]:
        """`fault_xids` by what the node gets: a reset, or service (spec/xids.py)."""
        return split(self.fault_xids)

    def _no_xid_of_a_job(self) -> Iterator[Problem]:
        for i, xid in enumerate(self.fault_xids):
            if xid in APPLICATION_XIDS:
                yield Problem(("fault_xids", i), f"XID {xid} ({APPLICATION_XIDS[xid]}) is the job's own fault: "
                                                 "NVIDIA's catalog resolves it by restarting the application and it "
                                                 "says nothing of the GPU, so every node a failing job touched would "
                                                 "be taken out; remove it")

    _checks = (_no_xid_of_a_job,)


class KubernetesSpec(SpecModel):
    version: str = Field("1.33", pattern=r"^1\.[0-9]+$",
                         description="Kubernetes minor version objects are validated against. Omitted: 1.33.")
    gpu_operator: GpuOperatorSettings = Field(default_factory=GpuOperatorSettings)
    network_operator: NetworkOperatorSettings = Field(default_factory=NetworkOperatorSettings)
    nfd: NfdSettings = Field(default_factory=NfdSettings)
    kueue: KueueSettings = Field(default_factory=KueueSettings)
    mpi_operator: MpiOperatorSettings = Field(default_factory=MpiOperatorSettings)
    monitoring: MonitoringSettings = Field(default_factory=MonitoringSettings)
    health: HealthSettings = Field(default_factory=HealthSettings)
    slurm: SlurmSettings = Field(default_factory=SlurmSettings,
                                 description="Omitted: no Slurm; Kueue schedules every pool.")
    dns_namespace: DnsLabel = Field("kube-system", description="Namespace of cluster DNS. Omitted: kube-system.")
    image_registry: Registry | None = Field(
        None, description="A registry mirror every image of the operators, Kueue, NFD and the checks is pulled "
                          "through, as <image_registry>/<source registry>/<path> (keep_source_registry) or "
                          "<image_registry>/<path>. Omitted: the upstream registries.")
    keep_source_registry: bool = Field(
        True, description="Keep the source registry's host as the first path element under image_registry "
                          "(nvcr.io/nvidia/x -> mirror/nvcr.io/nvidia/x). Omitted: yes.")
    allow_unknown_versions: bool = Field(
        False, description="Accept chart versions outside the known-good table. Omitted: they are an error.")


class ValidationSpec(SpecModel):
    """The suite `gpucluster validate STACK --kubeconfig` runs after `pulumi up` (NCCL and link thresholds are in
    fabric.checks, the DCGM level in each pool's burn_in)."""

    storage_min_read_percent: int = Field(
        70, ge=10, le=100, description="The parallel read test from every GPU node must reach this share of the "
                                       "filesystem's expected aggregate read bandwidth. Omitted: 70%.")
    storage_test_seconds: int = Field(60, ge=10, le=3600, description="How long fio reads. Omitted: 60 s.")
    storage_test_gib_per_server: int = Field(
        1024, ge=16, le=1048576,
        description="Data the read check writes first, per storage server, all of it read back by another "
                    "client than the one that wrote it: at least twice a server's memory, so the servers' page "
                    "cache cannot serve the read (a WEKA cluster: per backend listed; Scale: once). Omitted: "
                    "1024 GiB (servers with up to 512 GiB of memory).")
    dcgm_image: ImageRef = Field("nvcr.io/nvidia/cloud-native/dcgm:3.3.9-1-ubuntu22.04",
                                 description="Image with dcgmi and nv-hostengine. Omitted: NVIDIA's DCGM image.")
    fio_image: ImageRef | None = Field(
        None, description="Image with fio (3.x) and a POSIX sh on PATH, for the storage read check; the fio project "
                          "publishes no image, so build one the site maintains (for example debian:bookworm-slim "
                          "with Debian's fio package) into its registry. Omitted: validate does not measure the "
                          "filesystem's read bandwidth, and the plan warns.")
    timeout_s: int = Field(3600, ge=60, le=86400, description="How long each check may run. Omitted: one hour.")
