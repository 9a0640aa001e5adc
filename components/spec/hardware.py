"""Sites, racks, SSH access and GPU node pools: the physical half of the cluster spec."""

from __future__ import annotations

import base64
import binascii
import re
import struct
from typing import Annotated, Iterator, Literal, NamedTuple

from pydantic import AfterValidator, Field

from .common import (AbsPath, CountOrPercent, DnsLabel, HardwareId, HostName, HostOrIp, InterfaceName, IpAddress,
                     NodeLabels, PackageRepository, Problem, SpecModel, Taint, UserName, Version, shown, valid)


class GpuModelInfo(NamedTuple):
    product: str                 # value of the GPU Feature Discovery label nvidia.com/gpu.product
    memory_gib: int
    tdp_w: int
    host_gpu_counts: tuple[int, ...]   # GPUs per host that exist as real server boards
    nvlink: bool
    nvswitch_at: int             # GPU count from which the board has NVSwitch (0: never)
    busbw_gb_per_s: float        # typical single-node NCCL all_reduce bus bandwidth at full board
    mig: bool                    # supports Multi-Instance GPU (7 compute slices)
    open_modules_only: bool = False   # the driver's open kernel modules only (Grace Hopper, Blackwell)


# One place for what each GPU model really is; a pool may override tdp_w, never the counts.
GPU_MODELS: dict[str, GpuModelInfo] = {
    "H100-SXM5-80GB": GpuModelInfo("NVIDIA-H100-80GB-HBM3", 80, 700, (4, 8), True, 8, 450.0, True),
    "H200-SXM5-141GB": GpuModelInfo("NVIDIA-H200", 141, 700, (4, 8), True, 8, 460.0, True),
    "B200-SXM6-180GB": GpuModelInfo("NVIDIA-B200", 180, 1000, (8,), True, 8, 800.0, True, True),
    "A100-SXM4-80GB": GpuModelInfo("NVIDIA-A100-SXM4-80GB", 80, 400, (4, 8), True, 8, 230.0, True),
    "A100-SXM4-40GB": GpuModelInfo("NVIDIA-A100-SXM4-40GB", 40, 400, (4, 8), True, 8, 230.0, True),
    "GH200-96GB": GpuModelInfo("NVIDIA-GH200-480GB", 96, 1000, (1, 2, 4), True, 0, 100.0, True, True),
    # PCIe cards: NVLink only through 2-card bridges, so a whole host's all_reduce runs at PCIe speed.
    "A100-PCIE-80GB": GpuModelInfo("NVIDIA-A100-80GB-PCIe", 80, 300, (1, 2, 4, 8), True, 0, 20.0, True),
    "A100-PCIE-40GB": GpuModelInfo("NVIDIA-A100-PCIE-40GB", 40, 250, (1, 2, 4, 8), True, 0, 20.0, True),
    "H100-PCIE-80GB": GpuModelInfo("NVIDIA-H100-PCIe", 80, 350, (1, 2, 4, 8), False, 0, 20.0, True),
    "H100-NVL-94GB": GpuModelInfo("NVIDIA-H100-NVL", 94, 400, (1, 2, 4, 8), True, 0, 40.0, True),
    "H200-NVL-141GB": GpuModelInfo("NVIDIA-H200-NVL", 141, 600, (1, 2, 4, 8), True, 0, 40.0, True),
    "L40S-48GB": GpuModelInfo("NVIDIA-L40S", 48, 350, (1, 2, 4, 8, 10), False, 0, 20.0, False),
    "L4-24GB": GpuModelInfo("NVIDIA-L4", 24, 72, (1, 2, 4, 8), False, 0, 10.0, False),
}

GPU_RESOURCE = "nvidia.com/gpu"
SHARED_GPU = "nvidia.com/gpu.shared"       # the device plugin's name for time slices with renameByDefault

# Server models whose GPU count is fixed by the board (a pool may name one to have its count checked).
# Peak power of a host model apart from its GPUs: the system's maximum less its GPUs at TDP (NVIDIA's DGX user
# guides: DGX A100 6.5 kW, DGX H100 and H200 10.2 kW, DGX B200 14.3 kW). HGX boards vary by vendor: not known here.
HOST_BASE_POWER_W: dict[str, int] = {"dgx-a100": 6500 - 8 * 400, "dgx-h100": 10200 - 8 * 700,
                                     "dgx-h200": 10200 - 8 * 700, "dgx-b200": 14300 - 8 * 1000}
HOST_MODELS: dict[str, tuple[str, int]] = {
    "dgx-a100": ("A100-SXM4-80GB", 8), "dgx-h100": ("H100-SXM5-80GB", 8), "dgx-h200": ("H200-SXM5-141GB", 8),
    "dgx-b200": ("B200-SXM6-180GB", 8), "hgx-h100-4gpu": ("H100-SXM5-80GB", 4),
    "hgx-h200-4gpu": ("H200-SXM5-141GB", 4), "hgx-a100-4gpu": ("A100-SXM4-80GB", 4),
}

_HOST_KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
                   "ssh-rsa", "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com")


def _host_key(value: str) -> str:
    """An authorized_keys line ("type base64 [comment]"), the only form pulumi-command can pin."""
    parts = value.split()
    fix = "paste the host's public key, e.g. the output of `ssh-keyscan -t ed25519 HOST` without the host name"
    if len(parts) < 2 or parts[0] not in _HOST_KEY_TYPES:
        raise ValueError(f"{shown(value, 40)} is not an authorized_keys line ('ssh-ed25519 AAAA...'): {fix}")
    try:
        blob = base64.b64decode(parts[1], validate=True)
        (n,) = struct.unpack(">I", blob[:4])
        inner = blob[4:4 + n].decode("ascii")
    except (binascii.Error, struct.error, UnicodeDecodeError):
        raise ValueError(f"the key data of {parts[0]} host key is not valid base64 key material: {fix}") from None
    if inner != parts[0]:
        raise ValueError(f"host key says {parts[0]} but its key data is a {inner!r} key: {fix}")
    return " ".join(parts[:2])


HostKey = Annotated[str, AfterValidator(_host_key)]


CPU_LIST_RE = re.compile(r"[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*")


def _cpu_list(value: str) -> str:
    """A kubelet CPU list as the kubelet parses it (cpuset: ranges low-high, each CPU once)."""
    if not CPU_LIST_RE.fullmatch(value) or len(value) > 256:
        raise ValueError(f"{shown(value)} is not a CPU list: CPU numbers and low-high ranges, comma-separated "
                         "(e.g. '0-1,64-65')")
    seen: set[int] = set()
    for part in value.split(","):
        low, _, high = part.partition("-")
        if int(high or low) < int(low):
            raise ValueError(f"{shown(value)}: the range {part} runs high to low, which the kubelet refuses; "
                             f"write {high}-{low}")
        if int(high or low) > 8191:
            raise ValueError(f"{shown(value)} names CPU {high or low}, beyond any host's (at most 8192 CPUs)")
        cpus = set(range(int(low), int(high or low) + 1))
        if cpus & seen:
            raise ValueError(f"{shown(value)} names CPU {min(cpus & seen)} twice; list each CPU once")
        seen |= cpus
    return value


CpuList = Annotated[str, AfterValidator(_cpu_list)]


class Rack(SpecModel):
    name: DnsLabel
    pdu_capacity_kw: float = Field(gt=0, le=500, description="Power the rack may draw, in kW: with pdu_redundancy "
                                                            "a+b what ONE feed carries (the rack must run on it "
                                                            "alone), with none what all its PDUs deliver together.")
    pdu_redundancy: Literal["a+b", "none"] | None = Field(
        None, description="How the rack's PDUs back each other, which says what pdu_capacity_kw means. Omitted: "
                          "not stated; the plan says so, since a capacity summed over an A+B pair trips one feed "
                          "when the other fails.")
    block: DnsLabel | None = Field(
        None, description="Network block (a group of racks under the same spines) for topology-aware "
                          "scheduling. Omitted: the site is the block.")


class Site(SpecModel):
    name: DnsLabel
    racks: list[Rack] = Field(min_length=1, max_length=1024)


class Bastion(SpecModel):
    host: HostOrIp
    port: int = Field(22, ge=1, le=65535, description="Omitted: 22.")
    user: UserName = Field("root", description="Omitted: root.")
    host_key: HostKey | None = Field(
        None, description="Omitted: the bastion's identity is not verified (refused by policy in staging/prod).")


class SshSettings(SpecModel):
    """How the program reaches hosts; the private key is the secret config `sshPrivateKey`, never here."""

    user: UserName = Field("root", description="Omitted: root. A non-root user needs passwordless sudo.")
    port: int = Field(22, ge=1, le=65535, description="Omitted: 22.")
    bastion: Bastion | None = Field(None, description="Omitted: hosts are reached directly.")


class Host(SpecModel):
    hostname: HostName = Field(description="Host name, also its Kubernetes node name.")
    address: IpAddress = Field(description="Management address the program reaches over SSH.")
    rack: DnsLabel
    host_key: HostKey | None = Field(
        None, description="SSH host key to pin. Omitted: the host's identity is not verified "
                          "(a warning in dev, refused by policy in staging/prod).")
    hardware_id: HardwareId | None = Field(
        None, description="The host's hardware: its chassis serial number or asset tag. Changing it says the hardware "
                    "under this name was replaced: its preparation runs again and its burn-in runs anew. "
                    "Omitted: not tracked (a replaced host is prepared again only when its host_key changes).")
    ssh_user: UserName | None = Field(None, description="Omitted: ssh.user.")
    ssh_port: int | None = Field(None, ge=1, le=65535, description="Omitted: ssh.port.")
    leaf_port: int | None = Field(
        None, ge=1, le=512, description="Leaf port the host's data-plane NICs are cabled to, the same number on each "
                                        "rail's leaf (a leaf with several of its rails: the next ports too). Omitted: the lowest free "
                                        "port, in the order hosts are listed.")


class GpuSpec(SpecModel):
    model: Literal[tuple(GPU_MODELS)] = Field(description="GPU model from the catalogue.")  # type: ignore[valid-type]
    count: int = Field(ge=1, le=16, description="GPUs per host.")
    tdp_w: int | None = Field(None, ge=50, le=2000, description="Omitted: the model's TDP from the catalogue.")

    def _count_exists(self) -> Iterator[Problem]:
        counts = GPU_MODELS[self.model].host_gpu_counts
        if self.count not in counts:
            yield Problem(("count",), f"{self.model} hosts carry {' or '.join(map(str, counts))} GPUs, "
                                      f"not {self.count}; set count to one of those")

    _checks = (_count_exists,)

    @property
    def info(self) -> GpuModelInfo:
        return GPU_MODELS[self.model]

    @property
    def power_w(self) -> int:
        return self.tdp_w or self.info.tdp_w

    @property
    def nvswitch(self) -> bool:
        return bool(self.info.nvswitch_at) and self.count >= self.info.nvswitch_at


class Nic(SpecModel):
    """One data-plane NIC of a host, on one rail; every host of a pool has the same NICs."""

    rail: int = Field(ge=0, le=63)
    device: str = Field(pattern=r"^[a-z][a-z0-9_]{0,31}$", description="RDMA device name, e.g. mlx5_0.")
    interface: InterfaceName = Field(description="Network interface, e.g. ens1f0np0.")
    speed_gbps: Literal[100, 200, 400, 800] = Field(description="Link rate in Gb/s.")


class HostTuning(SpecModel):
    persistence: bool = Field(True, description="Omitted: nvidia-persistenced keeps the driver loaded.")
    gpu_clock_lock_mhz: int | None = Field(None, ge=300, le=4000, description="Omitted: clocks are not locked.")
    gpu_power_limit_w: int | None = Field(None, ge=50, le=2000, description="Omitted: the GPU's default power limit.")
    shm_size_gib: int | None = Field(None, ge=1, le=4096, description="Omitted: /dev/shm keeps the OS default.")
    hugepages_2mi: int = Field(0, ge=0, description="Omitted: no 2 MiB hugepages are reserved.")
    cpu_governor: Literal["performance", "schedutil", "powersave", "unchanged"] = Field(
        "performance", description="Omitted: performance. `unchanged` leaves the OS setting alone.")
    kubelet_cpu_manager_static: bool = Field(False, description="Omitted: kubelet's default (none) CPU manager.")
    kubelet_topology_policy: Literal["none", "best-effort", "restricted", "single-numa-node"] = Field(
        "none", description="kubelet's topology manager policy (scope pod). Omitted: none. `restricted` aligns GPUs, "
                            "NICs and CPUs as closely as the request allows; `single-numa-node` refuses any pod "
                            "whose GPUs span NUMA nodes, so it is accepted only where one NUMA node holds every GPU "
                            "a pod of the pool can ask for.")
    kubelet_reserved_cpus: CpuList = Field(
        "0-1",
        description="CPUs kept for the system under the static CPU manager (which requires some). Omitted: 0-1.")
    system_reserved_memory_gib: int | None = Field(
        None, ge=0, le=4096,
        description="Memory kept from pods for the host's own daemons (kubelet, containerd, DCGM, persistenced, the "
                    "health detectors, slurmd): the kubelet's systemReserved, which the job templates size from "
                    "too. Omitted: GKE's published tiers of the host's memory (25% of the first 4 GiB, 20% of the "
                    "next 4, 10% of the next 8, 6% of the next 112, 2% of the rest: about 48 GiB of a 2 TiB host). "
                    "Without the static CPU manager, CPU is kept by GKE's tiers too (6% of the first core, 1% of "
                    "the next, 0.5% of the next two, 0.25% of the rest).")


class BurnIn(SpecModel):
    """Gate before a node takes work: it stays tainted until this passes."""

    enabled: bool = Field(True, description="Omitted: new nodes are burned in before they take work.")
    dcgm_level: int = Field(2, ge=1, le=4, description="Omitted: `dcgmi diag -r 2` (about two minutes).")
    nccl_min_busbw_gb_per_s: float | None = Field(
        None, gt=0, le=5000,
        description="Minimum single-node all_reduce bus bandwidth in GB/s. Omitted: 80% of the model's typical.")
    timeout_s: int = Field(3600, ge=60, le=86400, description="Omitted: one hour.")
    nccl_tests_dir: AbsPath = Field("/opt/nccl-tests/build",
                                description="Where all_reduce_perf is on the hosts. Omitted: /opt/nccl-tests/build.")


def _tiered(total: float, tiers: tuple[tuple[float, float], ...]) -> float:
    """A share of each successive slice of `total` (size, share), the last slice unbounded."""
    kept, left = 0.0, total
    for size, share in tiers:
        part = min(left, size)
        kept, left = kept + part * share, left - part
    return kept


def reserved_memory_mib(memory_gib: int) -> int:
    """What GKE keeps of a node's memory for its system (cloud.google.com/kubernetes-engine/docs/concepts/
    plan-node-sizes, "Memory and CPU reservations"; AKS used the same tiers before 1.29)."""
    return -(-int(_tiered(memory_gib * 1024, ((4096, .25), (4096, .20), (8192, .10), (114688, .06),
                                               (float("inf"), .02))) * 1000) // 1000)


def reserved_cpu_millicores(cores: int) -> int:
    """What GKE keeps of a node's CPU for its system (same page)."""
    return -(-int(_tiered(cores * 1000, ((1000, .06), (1000, .01), (2000, .005), (float("inf"), .0025))) * 1000)
             // 1000)


# What one eviction takes: the pod's grace period (Kubernetes' default terminationGracePeriodSeconds), then the
# wait for a pod whose grace ended and that a finalizer still keeps (kubectl drain --skip-wait-for-delete-timeout:
# its containers are gone; a Job's tracking finalizer while Kueue holds the Job), and room for the requests.
POD_GRACE_S = 30
STUCK_DELETION_S = 60
MIN_DRAIN_S = POD_GRACE_S + STUCK_DELETION_S + 30


class Rollout(SpecModel):
    """How a change that disrupts running work (a kubelet or containerd restart) reaches a pool's busy hosts:
    a bounded batch at a time, each cordoned, drained, changed, checked and uncordoned before the next. Hosts
    without tenants' pods take every change at once, without a drain."""

    max_unavailable: CountOrPercent = Field(
        "10%", description="Hosts out of service at once: a count (at least 1) or a percentage of the pool's hosts, "
                           "rounded up to at least one host. Omitted: 10%. Also the GPU Operator's "
                           "driver upgrade policy where it manages the driver (the smallest over its pools).")
    drain_timeout_s: int = Field(
        3600, ge=1, le=604800,
        description="How long evicting a host's pods (PodDisruptionBudgets honoured) may take; past it the rollout "
                    "stops and the host stays cordoned and tainted gpucluster.io/rollout=failed. At least "
                    f"{MIN_DRAIN_S} s: one eviction's grace period and the wait for a pod a finalizer keeps; on "
                    "a Slurm pool, the partition's longest job (kubernetes.slurm.partition_max_time_h) more, as "
                    "Slinky keeps a busy slurmd until its jobs end. At most 7 days. Omitted: one hour.")
    failure_budget_hosts: int = Field(
        0, ge=0, le=10000,
        description="How many of the pool's hosts may fail their drain or roll while the rollout goes on: each "
                    "stays out of service (cordoned, tainted gpucluster.io/rollout=failed, still counted against "
                    "max_unavailable), the apply ends by naming them, and the next apply tries them again. One "
                    "more stops the pool's later batches. Omitted: 0, the first failed host stops them.")

    def _drain_covers_one_eviction(self) -> Iterator[Problem]:
        if self.drain_timeout_s < MIN_DRAIN_S:
            yield Problem(("drain_timeout_s",), f"{self.drain_timeout_s} s cannot cover one eviction: a pod's "
                                                f"{POD_GRACE_S} s grace period (Kubernetes' default), then up to "
                                                f"{STUCK_DELETION_S} s while a finalizer keeps it (a Job's tracking "
                                                f"one), and the drain's own requests; give at least {MIN_DRAIN_S}")

    _checks = (_drain_covers_one_eviction,)

    def batch_size(self, hosts: int) -> int:
        """Hosts per batch for a pool of `hosts` (a percentage rounds up, as Kubernetes' maxUnavailable does)."""
        m = self.max_unavailable
        size = m if isinstance(m, int) else -(-hosts * int(m[:-1]) // 100)
        return max(1, min(size, hosts))


class Sharing(SpecModel):
    """Time-slicing or MIG, never both on one pool (the device plugin can do only one per node)."""

    time_slicing_replicas: int | None = Field(None, ge=2, le=64, description="Omitted: no time-slicing.")
    rename_shared: bool = Field(
        True, description="Time-sliced GPUs are advertised as nvidia.com/gpu.shared, so a job asking for "
                          "nvidia.com/gpu (a whole GPU) never lands on a slice, and one that wants a slice says "
                          "so. Omitted: renamed. false: slices are nvidia.com/gpu like whole GPUs elsewhere.")
    mig_config: str | None = Field(
        None, pattern=r"^[a-z0-9][a-z0-9.-]*$",
        description="MIG layout name from the MIG manager config (e.g. all-1g.10gb). Omitted: MIG off.")

    def _one_kind(self) -> Iterator[Problem]:
        if self.time_slicing_replicas is not None and self.mig_config is not None:
            yield Problem(("mig_config",), "time_slicing_replicas and mig_config are both set: a pool shares GPUs "
                                           "one way; remove one of them")

    _checks = (_one_kind,)


class Software(SpecModel):
    """The GPU software stack a pool runs, so pools that train together run the same versions."""

    driver_version: Version | None = Field(
        None, description="NVIDIA driver on the hosts (e.g. 570.124.06); host preparation fails on another, or "
                          "with package_repositories installs it. Omitted: whatever the hosts have.")
    driver_kernel_modules: Literal["open", "proprietary"] = Field(
        "open", description="The driver's kernel modules where package_repositories installs it. Omitted: open, "
                            "which NVIDIA recommends from Turing on and Grace Hopper and Blackwell require.")
    doca_ofed_version: Version | None = Field(
        None, description="DOCA-OFED release on the hosts (the doca-ofed package, e.g. 2.9.5), the RDMA stack "
                          "NVIDIA's NICs and GPUDirect use; host preparation fails on another, or with "
                          "package_repositories installs it. Omitted: whatever the hosts have (or the kernel's).")
    package_repositories: list[PackageRepository] = Field(
        default_factory=list, max_length=8,
        description="Where the versions above are installed from: the site's mirrors of NVIDIA's CUDA repository "
                    "(driver and Fabric Manager) and, for doca_ofed_version, of that DOCA release's repository, "
                    "for the hosts' OS family. The packages are pinned to the versions (apt preferences, dnf "
                    "versionlock); a host where tenants' work runs gets them from the pool's rollout, drained. "
                    "Omitted: versions are checked, never installed (the hosts' image carries them).")
    cuda_version: Version | None = Field(None, description="CUDA the pool's images are built for. Omitted: not stated.")
    nccl_version: Version | None = Field(None, description="NCCL the pool's images carry. Omitted: not stated.")
    allow_version_skew: bool = Field(
        False, description="This pool may run other versions than the rest (a canary pool). Omitted: no.")

    def _something_to_install(self) -> Iterator[Problem]:
        if self.package_repositories and self.driver_version is None and self.doca_ofed_version is None:
            yield Problem(("package_repositories",), "repositories to install from, but no version to install: "
                                                     "set driver_version or doca_ofed_version, or remove them")

    _checks = (_something_to_install,)


# Which XIDs take a node out of service, and how, is spec/xids.py's table.

# The NVIDIA driver's kernel-log line up to its XID, as dmesg, journald and /dev/kmsg carry it, in an extended
# regular expression grep -E and Go's RE2 read alike. The device comes in several shapes: `(PCI:0000:01:00)`,
# `(PCI:0000:01:00 GPU-I:05)` under MIG, `(0000:03:00)` from older drivers.
XID_LINE = r"NVRM: Xid \([^)]*\): "


def xid_pattern(xids: tuple[int, ...] | list[int]) -> str:
    """The driver's kernel-log line for one of `xids`."""
    return XID_LINE + "(" + "|".join(str(x) for x in sorted(set(xids))) + "),"


# kubelet's default hard-eviction threshold, memory.available<100Mi (KubeletConfiguration evictionHard), which
# comes off a node's allocatable memory; the preparation's kubelet drop-in keeps the default.
KUBELET_EVICTION_HARD_MIB = 100


def cpu_count(cpus: str) -> int:
    """How many CPUs a kubelet CPU list ("0-1,64-65") names."""
    return len(cpu_ids(cpus))


def cpu_ids(cpus: str) -> list[int]:
    """The CPUs a kubelet CPU list names, in its order."""
    out: list[int] = []
    for part in cpus.split(","):
        low, _, high = part.partition("-")
        out += range(int(low), int(high or low) + 1)
    return out


DEDICATED_TAINT = "gpucluster.io/tenant"


def _default_taints() -> list[Taint]:
    return [Taint(key="nvidia.com/gpu", value="present", effect="NoSchedule")]


class NodePool(SpecModel):
    name: DnsLabel = Field(description="Pool name; also the Kueue ResourceFlavor tenants' GPU quotas refer to.")
    host_model: Literal[tuple(HOST_MODELS)] | None = Field(  # type: ignore[valid-type]
        None, description="Server model, to check the GPU model and count against. Omitted: not checked.")
    gpu: GpuSpec
    cpu_cores_per_host: int = Field(ge=1, le=1024, description="CPU cores (threads) of each host, as its Node "
                                                                "reports them (status.capacity.cpu).")
    numa_nodes_per_host: int = Field(
        2, ge=1, le=16, description="NUMA nodes (usually CPU sockets) per host, over which the GPUs are spread "
                                    "evenly. Omitted: 2, as on dual-socket HGX and DGX boards.")
    threads_per_core: int = Field(
        2, ge=1, le=8, description="Hardware threads per CPU core (cpu_cores_per_host counts threads); Slurm "
                                   "numbers cores, not threads, when it ties GPUs to the cores of their NUMA node. "
                                   "Omitted: 2 (SMT on, as DGX and HGX systems ship).")
    memory_gib_per_host: int = Field(ge=1, le=65536, description="Memory of each host in GiB, as its Node reports "
                                                                 "it (status.capacity.memory: a little below the "
                                                                 "installed RAM). Pods get less: see allocatable.")
    hosts: list[Host] = Field(min_length=1, max_length=4096)
    workload: Literal["training", "inference"] = Field(
        "training", description="What the pool runs; training pools need a fabric of at most 2:1 "
                                "oversubscription (a policy). Omitted: training.")
    nics: list[Nic] = Field(default_factory=list, max_length=16, description="Omitted: the pool has no data-plane NICs.")
    control_interface: InterfaceName | None = Field(
        None,
        description="The hosts' management interface (NCCL_SOCKET_IFNAME in /etc/nccl.conf) where it differs "
                    "from other pools'. Omitted: fabric.control_interface.")
    nccl_min_busbw_gb_per_s: float | None = Field(
        None, gt=0, le=5000,
        description="Floor of the multi-node NCCL check on this pool. Omitted: fabric.checks.nccl_min_busbw_gb_per_s, "
                    "else 80% of the slower of NVLink and the pool's NICs.")
    host_base_power_w: int | None = Field(
        None, ge=0, le=20000,
        description="Peak power of a host apart from its GPUs (CPUs, memory, NICs, fans, NVSwitches), for the rack "
                    "power check. Omitted: the host_model's figure (DGX systems), else unknown, and the rack's "
                    "power is reported as unknown rather than ok.")
    labels: NodeLabels = Field(default_factory=dict, max_length=64, description="Extra node labels. Omitted: only the pool's own.")
    taints: list[Taint] = Field(
        default_factory=_default_taints,
        description="Omitted: nvidia.com/gpu=present:NoSchedule, so only pods that ask for GPUs land here.")
    dedicated_to: DnsLabel | None = Field(
        None, description="The one tenant (by name) this pool belongs to: its hosts are tainted "
                          "gpucluster.io/tenant=<name>:NoSchedule, only that tenant's queue holds the pool's flavor "
                          "(no other tenant has quota on it or borrows it), so no other tenant's pod runs on these "
                          "hosts or gets their GPUs and RDMA devices. Omitted: every tenant with quota on the pool "
                          "shares it.")
    sharing: Sharing = Field(default_factory=Sharing, description="Omitted: whole GPUs only.")
    tuning: HostTuning = Field(default_factory=HostTuning, description="Omitted: the defaults of each field.")
    burn_in: BurnIn = Field(default_factory=BurnIn, description="Omitted: the defaults of each field.")
    software: Software = Field(default_factory=Software, description="Omitted: versions are not stated.")
    rollout: Rollout = Field(default_factory=Rollout, description="Omitted: the defaults of each field.")

    def _matches_host_model(self) -> Iterator[Problem]:
        if self.host_model is not None:
            model, count = HOST_MODELS[self.host_model]
            if self.gpu.model != model:
                yield Problem(("gpu", "model"), f"host model {self.host_model} carries {model}, not "
                                                f"{self.gpu.model}; fix gpu.model or host_model")
            elif self.gpu.count != count:
                yield Problem(("gpu", "count"), f"host model {self.host_model} has {count} GPUs, not "
                                                f"{self.gpu.count}; set gpu.count: {count}")

    def _burn_in_floor_reachable(self) -> Iterator[Problem]:
        ceiling = 1.25 * self.gpu.info.busbw_gb_per_s
        wanted = self.burn_in.nccl_min_busbw_gb_per_s
        if wanted is not None and wanted > ceiling:
            yield Problem(("burn_in", "nccl_min_busbw_gb_per_s"),
                          f"{wanted} GB/s is more than {self.gpu.model} reaches (typically "
                          f"{self.gpu.info.busbw_gb_per_s} GB/s), so every node would fail burn-in; use at most "
                          f"{ceiling:g}")

    def _topology_policy_fits_pods(self) -> Iterator[Problem]:
        per_numa = -(-self.gpu.count // self.numa_nodes_per_host)
        shared = self.sharing.time_slicing_replicas or self.sharing.mig_config   # pods get slices of one GPU
        if self.tuning.kubelet_topology_policy == "single-numa-node" and not shared and self.gpu.count > per_numa:
            yield Problem(("tuning", "kubelet_topology_policy"), (
                f"single-numa-node refuses every pod asking for more than {per_numa} of the pool's "
                f"{self.gpu.count} GPUs (one NUMA node's of {self.numa_nodes_per_host}) with TopologyAffinityError, "
                f"such as a whole-host training pod or the NCCL check's {self.gpu.count}-GPU worker; use "
                "restricted, which aligns GPUs, NICs and CPUs as closely as each request allows"))

    def _unique_nics(self) -> Iterator[Problem]:
        for attr in ("rail", "device", "interface"):
            values = [getattr(n, attr) for n in self.nics]
            dup = sorted({v for v in values if values.count(v) > 1}, key=str)
            if dup:
                yield Problem(("nics",), f"{attr} {', '.join(map(str, dup))} appears more than once; "
                                        f"each NIC needs its own {attr}")

    def _fits_the_host(self) -> Iterator[Problem]:
        """Host tuning asks for no more memory than the host has, nor more power than the GPU is rated for."""
        memory_gib, tuning = self.memory_gib_per_host, self.tuning
        hugepages_gib = tuning.hugepages_2mi * 2 / 1024
        if hugepages_gib > memory_gib:
            yield Problem(("tuning", "hugepages_2mi"),
                          f"{tuning.hugepages_2mi} hugepages of 2 MiB are {hugepages_gib:g} GiB, more than the "
                          f"host's {memory_gib} GiB (memory_gib_per_host); reserve at most {memory_gib * 512} pages")
        elif tuning.system_reserved_memory_gib is not None and self.allocatable_memory_mib_per_host <= 0:
            yield Problem(("tuning", "system_reserved_memory_gib"),
                          f"{tuning.system_reserved_memory_gib} GiB kept for the system, with {hugepages_gib:g} GiB "
                          f"of hugepages, leaves pods nothing of the host's {memory_gib} GiB (memory_gib_per_host); "
                          "keep less")
        if tuning.shm_size_gib is not None and tuning.shm_size_gib > memory_gib:
            yield Problem(("tuning", "shm_size_gib"),
                          f"/dev/shm of {tuning.shm_size_gib} GiB is larger than the host's {memory_gib} GiB "
                          f"(memory_gib_per_host); use at most {memory_gib}")
        reserved = tuning.kubelet_reserved_cpus           # checked whole where it entered (CpuList)
        highest = max(int(p.rpartition("-")[2]) for p in reserved.split(",")) \
            if valid(reserved) and CPU_LIST_RE.fullmatch(reserved) else -1
        if tuning.kubelet_cpu_manager_static and highest >= self.cpu_cores_per_host:
            yield Problem(("tuning", "kubelet_reserved_cpus"),
                          f"CPU {highest} is reserved but the hosts have CPUs 0-{self.cpu_cores_per_host - 1} "
                          "(cpu_cores_per_host); the kubelet refuses to start with a CPU it does not have")
        elif tuning.kubelet_cpu_manager_static and highest >= 0 and cpu_count(reserved) >= self.cpu_cores_per_host:
            yield Problem(("tuning", "kubelet_reserved_cpus"),
                          f"{tuning.kubelet_reserved_cpus} reserves every CPU of the host for the system; leave "
                          "pods some")
        limit = tuning.gpu_power_limit_w
        if limit is not None and limit > self.gpu.power_w:
            yield Problem(("tuning", "gpu_power_limit_w"),
                          f"power limit {limit} W is above the {self.gpu.model}'s {self.gpu.power_w} W "
                          "(gpu.tdp_w or the catalogue), which nvidia-smi refuses; use at most "
                          f"{self.gpu.power_w} or omit it")

    def _driver_modules_run_the_gpu(self) -> Iterator[Problem]:
        sw = self.software
        if sw.package_repositories and sw.driver_version and sw.driver_kernel_modules == "proprietary" \
                and self.gpu.info.open_modules_only:
            yield Problem(("software", "driver_kernel_modules"),
                          f"{self.gpu.model} runs only with the driver's open kernel modules (NVIDIA driver "
                          "installation guide); use open")

    def _own_taint_keys(self) -> Iterator[Problem]:
        for i, t in enumerate(self.taints):
            if t.key == DEDICATED_TAINT:
                yield Problem(("taints", i, "key"), f"taint {DEDICATED_TAINT} is the platform's, set from "
                                                    "dedicated_to; use dedicated_to, or a key under your own prefix")

    _checks = (_matches_host_model, _burn_in_floor_reachable, _topology_policy_fits_pods, _unique_nics,
               _fits_the_host, _driver_modules_run_the_gpu, _own_taint_keys)

    @property
    def all_taints(self) -> list[Taint]:
        """The spec's taints and, on a dedicated pool, its tenant's: what the nodes carry and the flavor tolerates."""
        own = [Taint(key=DEDICATED_TAINT, value=self.dedicated_to, effect="NoSchedule")] if self.dedicated_to else []
        return [*self.taints, *own]

    @property
    def peak_power_w_per_host(self) -> int:
        """A host at full load: its GPUs at TDP plus its base power (what a rack's PDUs must carry)."""
        return self.gpu.count * self.gpu.power_w + (self.base_power_w or 0)

    @property
    def base_power_w(self) -> int | None:
        """Base power as the spec gives it, else the host model's; None: unknown."""
        if self.host_base_power_w is not None:
            return self.host_base_power_w
        return HOST_BASE_POWER_W.get(self.host_model) if self.host_model else None

    @property
    def gpus(self) -> int:
        return self.gpu.count * len(self.hosts)

    @property
    def allocatable_cpu_cores_per_host(self) -> int:
        """Cores the kubelet offers pods: under the static CPU manager its reservedSystemCPUs are not
        allocatable (kubelet node-allocatable; the preparation sets no other CPU reservation)."""
        t = self.tuning
        if t.kubelet_cpu_manager_static:
            return self.cpu_cores_per_host - cpu_count(t.kubelet_reserved_cpus)
        return self.cpu_cores_per_host - -(-self.system_reserved_cpu_millicores // 1000)

    @property
    def system_reserved_memory_mib(self) -> int:
        """The kubelet's systemReserved memory: the spec's, else GKE's tiers of the host's memory."""
        gib = self.tuning.system_reserved_memory_gib
        return gib * 1024 if gib is not None else reserved_memory_mib(self.memory_gib_per_host)

    @property
    def system_reserved_cpu_millicores(self) -> int:
        """The kubelet's systemReserved CPU where the static CPU manager does not keep CPUs (GKE's tiers)."""
        return 0 if self.tuning.kubelet_cpu_manager_static else reserved_cpu_millicores(self.cpu_cores_per_host)

    @property
    def allocatable_memory_mib_per_host(self) -> int:
        """Memory the kubelet offers pods: capacity less the system's reservation, pre-allocated hugepages and the
        hard-eviction threshold (node allocatable = capacity - reserved - eviction-hard; hugepages come off
        memory). Always below capacity, so a pod sized from capacity never schedules."""
        return (self.memory_gib_per_host * 1024 - self.system_reserved_memory_mib - self.tuning.hugepages_2mi * 2
                - KUBELET_EVICTION_HARD_MIB)

    @property
    def gpu_resources_per_host(self) -> int | None:
        """nvidia.com/gpu each host advertises: time-sliced replicas or MIG slices count too.

        None for a MIG layout other than all-<N>g.*, whose slice count depends on the layout's contents.
        """
        if self.sharing.time_slicing_replicas:
            return self.gpu.count * self.sharing.time_slicing_replicas
        if self.sharing.mig_config:
            m = re.fullmatch(r"all-([1-7])g\..*", self.sharing.mig_config)
            return self.gpu.count * (7 // int(m.group(1))) if m else None
        return self.gpu.count

    @property
    def nccl_ranks_per_host(self) -> int:
        """GPUs the NCCL check runs on per host: all of them, or one on a time-sliced pool, whose device plugin
        refuses a pod more than one slice (failRequestsGreaterThanOne) and where NCCL refuses two ranks on one
        GPU."""
        return 1 if self.sharing.time_slicing_replicas else self.gpu.count

    @property
    def nccl_line_rate_gb_per_s(self) -> float:
        """The most all_reduce_perf's bus bandwidth across hosts can be: the slower of NVLink (the model's bus
        bandwidth) and the NICs the ranks use (all of the host's, or the fastest one for a single rank)."""
        speeds = [n.speed_gbps for n in self.nics]
        nic = (sum(speeds) if self.nccl_ranks_per_host > 1 else max(speeds, default=0)) / 8
        return min(self.gpu.info.busbw_gb_per_s, nic or self.gpu.info.busbw_gb_per_s)

    @property
    def gpu_resource_name(self) -> str:
        """The extended resource a pod of this pool asks for: whole GPUs and MIG slices are nvidia.com/gpu
        (MIG strategy single), time slices nvidia.com/gpu.shared unless the spec keeps the plain name."""
        s = self.sharing
        return SHARED_GPU if s.time_slicing_replicas and s.rename_shared else GPU_RESOURCE

    @property
    def gpu_unit_word(self) -> str:
        """What the pool's GPU resources are, for people: GPUs, or slices on a shared pool."""
        return "slices" if self.sharing.time_slicing_replicas or self.sharing.mig_config else "GPUs"

    @property
    def gpu_units_per_host(self) -> int:
        """What quotas, pods and CPU/memory shares count per host: GPUs, or slices on a shared pool (whole GPUs
        where a MIG layout's slice count is not known from its name)."""
        return self.gpu_resources_per_host or self.gpu.count

    @property
    def gpu_resources(self) -> int | None:
        per_host = self.gpu_resources_per_host
        return None if per_host is None else per_host * len(self.hosts)

    @property
    def cpu_cores(self) -> int:
        return self.cpu_cores_per_host * len(self.hosts)

    @property
    def memory_gib(self) -> int:
        return self.memory_gib_per_host * len(self.hosts)
