"""The parallel filesystem: Lustre or BeeGFS servers, their devices and targets, and how clients reach them; or
the clients of a WEKA or IBM Storage Scale cluster the site runs apart (its servers are appliances or a cluster
of their own, so only the GPU hosts' clients are built here)."""

from __future__ import annotations

import re
import zlib
from typing import Annotated, Iterator, Literal, NamedTuple

from pydantic import AfterValidator, Field

from .common import (AbsPath, DevicePath, DnsLabel, HostName, HostOrIp, InterfaceName, IpAddress,
                     PackageRepository, Problem, RelPath, SpecModel, Url, UserName, Version, _grammar)
from .hardware import CpuList, HostKey, cpu_count, cpu_ids
from .kubernetes import ChartSource

# Upstream vocabulary for each backend's target roles; Lustre's mgs-mdt is a combined MGS and MDT on one device.
STORAGE_ROLES: dict[str, tuple[str, ...]] = {
    "lustre": ("mgs", "mdt", "ost", "mgs-mdt"),
    "beegfs": ("mgmtd", "meta", "storage"),
}
VERSIONS = {"lustre": ("2.15",), "beegfs": ("7.4", "8"), "wekafs": ("4.2", "4.3", "4.4"), "scale": ("5.1", "5.2")}
DEFAULT_VERSION = {"lustre": "2.15", "beegfs": "7.4", "wekafs": "4.4", "scale": "5.2"}
# The stack's secret: the storage cluster's API user's password (WEKA's api_username, Scale's csi.gui_username).
STORAGE_API_PASSWORD = "storageApiPassword"
# Filesystems whose servers another cluster runs: only their clients are built here.
CLIENT_ONLY = ("wekafs", "scale")
SLOWEST_HCA_GBPS = 40      # QDR: what a storage server's port is taken to run at when the spec does not say
# RAID-5 survives one failed disk; rebuilding a large target takes long enough for a second to fail.
RAID5_MAX_TIB = 8.0


class StorageTarget(SpecModel):
    role: Literal["mgs", "mdt", "ost", "mgs-mdt", "mgmtd", "meta", "storage"]
    device: DevicePath = Field(description="Block device, e.g. /dev/disk/by-id/nvme-... (a stable name, not sdX).")
    index: int = Field(0, ge=0, le=65535, description="Lustre target index, or BeeGFS target ID (storage) within "
                                                      "its role. Omitted: 0.")
    raid_level: Literal["raid0", "raid1", "raid5", "raid6", "raid10", "raidz2", "none"] = Field(
        description="Redundancy of the device (hardware RAID or md), which the RAID rules check.")
    size_tib: float = Field(gt=0, le=100000, description="Usable size of the device in TiB.")
    reformat: bool = Field(
        False, description="Format the device even when it already holds a filesystem, destroying its data. "
                           "Omitted: a device that holds anything is never formatted; the script stops and says "
                           "what it found.")
    allow_raid5: bool = Field(False, description=f"Accept RAID-5 above {RAID5_MAX_TIB:g} TiB. Omitted: refused; "
                                                  "use RAID-6.")

    def _raid(self) -> Iterator[Problem]:
        if self.raid_level == "raid5" and self.size_tib > RAID5_MAX_TIB and not self.allow_raid5:
            yield Problem(("raid_level",), f"RAID-5 on a {self.size_tib:g} TiB target: a second disk failing during "
                                           "the long rebuild loses the target, so reference designs use RAID-6; "
                                           "use raid6 (or set allow_raid5: true)")
        if self.raid_level in ("raid0", "none") and self.role in ("mgs", "mdt", "mgs-mdt", "mgmtd", "meta"):
            yield Problem(("raid_level",), f"{self.role} target without redundancy ({self.raid_level}): one disk "
                                           "loses the whole filesystem's metadata; use raid1 or raid10")

    _checks = (_raid,)


class StorageServer(SpecModel):
    hostname: HostName
    address: IpAddress = Field(description="Management address the program reaches over SSH.")
    rack: DnsLabel
    host_key: HostKey | None = Field(None, description="Omitted: the server's identity is not verified.")
    data_address: IpAddress | None = Field(
        None, description="Address of storage.server_interface, which clients reach (its LNet NID on Lustre). "
                          "Omitted: address; required with lnet o2ib, whose NID is the data-plane address.")
    power_w: int | None = Field(None, ge=1, le=20000, description="Peak power of the server, counted in its rack's "
                                                                "power. Omitted: unknown; the rack's power is "
                                                                "reported unknown rather than ok.")
    link_speed_gbps: Literal[40, 56, 100, 200, 400, 800] | None = Field(
        None, description="Rate of the server's data-plane port (its HCA on InfiniBand), which the IPoIB groups "
                          f"must not exceed or the port cannot join them. Omitted: {SLOWEST_HCA_GBPS} Gb/s is "
                          "assumed, the slowest rate here, so the port always joins.")
    failover: HostName | None = Field(
        None, description="Lustre: the server that takes over this one's targets (both get --servicenode). "
                          "Omitted: no failover.")
    targets: list[StorageTarget] = Field(min_length=1, max_length=256)

    @property
    def nid_address(self) -> str:
        return self.data_address or self.address


# Directories a parallel filesystem must never be mounted on (or under, for the trees): the host's own.
SYSTEM_DIRS = frozenset({"/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/opt", "/proc",
                         "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var", "/var/lib", "/mnt"})
SYSTEM_TREES = ("/proc", "/sys", "/dev", "/etc", "/usr", "/boot", "/run")


class LustreTunables(SpecModel):
    """Client I/O settings, made persistent on the MGS (`lctl set_param -P`) for every node of the filesystem."""

    rpc_size_mib: Literal[1, 2, 4, 8, 16] | None = Field(
        None, description="Bulk RPC size (osc max_pages_per_rpc, and the OSTs' brw_size to allow it); 16 suits "
                          "large sequential reads. Clients use a new size after they remount. Omitted: Lustre's "
                          "default (4 MiB).")
    rpcs_in_flight: int | None = Field(None, ge=1, le=256, description="RPCs in flight per OST and MDT "
                                                                       "connection. Omitted: Lustre's default (8).")
    read_ahead_mib: int | None = Field(None, ge=0, le=1048576, description="Read-ahead per client (llite "
                                                                           "max_read_ahead_mb). Omitted: default.")
    read_ahead_per_file_mib: int | None = Field(
        None, ge=0, le=1048576, description="Read-ahead per file. Omitted: Lustre's default.")

    def _per_file_fits(self) -> Iterator[Problem]:
        if self.read_ahead_mib is not None and self.read_ahead_per_file_mib is not None \
                and self.read_ahead_per_file_mib > self.read_ahead_mib:
            yield Problem(("read_ahead_per_file_mib",), f"{self.read_ahead_per_file_mib} MiB per file is more than "
                                                        f"read_ahead_mib ({self.read_ahead_mib}); Lustre caps it "
                                                        "there, so lower it")

    _checks = (_per_file_fits,)


class Dataset(SpecModel):
    """A shared directory (training data, checkpoints) with its striping, exposed as a read-many volume."""

    name: DnsLabel = Field(max_length=54, description="Its directory under datasets/, and with fs_name its claim's "
                                                       "and pod volume's name (at most 63 characters in all).")
    stripe_count: int = Field(-1, ge=-1, le=2000, description="OSTs or storage targets a file spreads over; -1 "
                                                             "all of them. Omitted: all.")
    stripe_size_mib: int = Field(4, ge=1, le=4096, description="Stripe (chunk) size in MiB. Omitted: 4.")
    size_gib: int = Field(1024, ge=1, description="Capacity the volume advertises to Kubernetes. Omitted: 1 TiB.")


# WEKA's mount options this library does not set itself (docs.weka.io, "Mount filesystems": mount command
# options; csi-wekafs pkg/wekafs/mountoptions.go knows the same names): a bare flag, or NAME=<integer>.
WEKA_FLAGS = frozenset({"sync_on_close", "nosync_on_close", "acl", "noatime", "relatime", "strictatime",
                        "obs_direct", "verbose", "quiet"})
WEKA_VALUED = frozenset({"readahead_kb", "dentry_max_age_positive", "dentry_max_age_negative",
                         "connect_timeout_secs", "response_timeout_secs", "qos_max_throughput_mbps",
                         "qos_preferred_throughput_mbps", "qos_max_ops"})
# Options a typed field sets, and the field: one source for each, so the mount never carries two answers.
WEKA_TYPED = {"num_cores": "client_cores", "core": "client_core_ids", "net": "network", "readcache": "cache_mode",
              "writecache": "cache_mode", "coherent": "cache_mode", "forcedirect": "cache_mode"}
# Options the mount never takes, and why.
WEKA_REFUSED = {"ro": "tenants write to their own directory (datasets are read-only through their volumes)",
                "rw": "it is the default", "container_name": "a host runs one client container, 'client'",
                "mgmt_ip": "the client reaches the backends on its own interfaces"}


MountOption = Annotated[str, AfterValidator(_grammar(re.compile(r"[a-z_]{1,40}(=[A-Za-z0-9]{1,20})?"),
                                                     "a mount option (NAME or NAME=VALUE)", "readahead_kb=32768",
                                                     64))]
KernelPattern = Annotated[str, AfterValidator(_grammar(re.compile(r"[0-9][0-9A-Za-z._*+-]*"),
                                                       "a kernel release pattern (as uname -r prints, '*' for any)",
                                                       "5.14.0-427.*", 128))]


class SiteCluster(SpecModel):
    """What the plan knows of a storage cluster the site runs: only what its spec says."""

    capacity_tib: float | None = Field(None, gt=0, le=1_000_000, description="The filesystem's size, which no "
                                       "tenant directory's quota may exceed. Omitted: unknown; not checked.")
    read_gb_per_s: float | None = Field(None, gt=0, le=100_000, description="The cluster's sustained read "
                                        "bandwidth, for the plan and the read check. Omitted: not estimated.")


class WekaCsi(ChartSource):
    """WEKA's CSI plugin (csi.weka.io), which provisions the tenants' directory volumes with hard quotas."""

    enabled: bool = Field(True, description="Omitted: installed, with a StorageClass per tenant with a directory.")
    chart_version: Literal["2.8.8"] = Field("2.8.8", description="The pinned csi-wekafsplugin chart. Omitted: "
                                                                 "2.8.8.")


class WekaSettings(SiteCluster):
    """The clients of a WEKA cluster the site runs: stateless clients, which the mount itself brings up."""

    backends: list[HostOrIp] = Field(min_length=1, max_length=64, description="Backend hosts the client "
                                     "joins through (any of them answers; list several so one down is not an "
                                     "outage).")
    filesystem: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$",
                                   description="The WEKA filesystem's name. Omitted: storage.fs_name.")
    install_url: Url | None = Field(
        None, description="Where a host without the agent fetches WEKA's installer (an air-gapped site names "
                          "its mirror of it). Omitted: the first backend's own, "
                          "http://<backend>:14000/dist/v1/install.")
    client_cores: int = Field(1, ge=1, le=19, description="Cores the client's frontend polls on (mount option "
                                                          "num_cores): each runs at 100%. Omitted: 1.")
    client_core_ids: CpuList | None = Field(
        None, description="The CPUs those cores are (mount option core=, once each); required under the static "
                          "CPU manager, where they must lie in every pool's kubelet_reserved_cpus so no pod is "
                          "pinned onto them. Omitted: WEKA picks them.")
    network: Literal["dpdk", "udp"] = Field(
        "dpdk", description="dpdk: the client drives the storage NIC itself (net=<the pool's storage "
                            "interface>); udp: through the kernel's stack (net=udp), slower, no NIC of its own. "
                            "Omitted: dpdk.")
    cache_mode: Literal["readcache", "writecache", "coherent", "forcedirect"] | None = Field(
        None, description="The mount's cache mode (mutually exclusive in WEKA). Omitted: WEKA's default "
                          "(writecache).")
    mount_options: list[MountOption] = Field(
        default_factory=list, max_length=16,
        description=f"Further mount options: {', '.join(sorted(WEKA_FLAGS))}, or NAME=<integer> for "
                    f"{', '.join(sorted(WEKA_VALUED))}. Omitted: none.")
    api_username: UserName | None = Field(
        None, description="The WEKA user (a cluster admin of the Root organization) that sets the tenants' "
                          "directory quotas; its password is the stack's secret storageApiPassword. Required with "
                          "quotas.")
    csi: WekaCsi = Field(default_factory=WekaCsi, description="Omitted: the CSI plugin from WEKA's chart "
                                                              "repository.")
    gds: bool = Field(False, description="GPUDirect Storage: the client checks nvidia-fs is loaded, so cuFile "
                                         "reads go from the NICs to the GPUs. Needs an RDMA fabric and dpdk. "
                                         "Omitted: off.")

    def options(self, interface: str) -> list[str]:
        """The mount's options, in the order the mount writes them."""
        cores = [f"core={c}" for c in cpu_ids(self.client_core_ids)] if self.client_core_ids else \
            [f"num_cores={self.client_cores}"]
        net = "net=udp" if self.network == "udp" else f"net={interface}"
        return cores + [net] + ([self.cache_mode] if self.cache_mode else []) + list(self.mount_options)

    def _options(self) -> Iterator[Problem]:
        for i, option in enumerate(self.mount_options):
            name, _, value = option.partition("=")
            if name in WEKA_TYPED:
                yield Problem(("mount_options", i), f"{option} is set by storage.weka.{WEKA_TYPED[name]}; remove "
                                                    "it here")
            elif name in WEKA_REFUSED:
                yield Problem(("mount_options", i), f"{option} is not passed: {WEKA_REFUSED[name]}; remove it")
            elif name in WEKA_FLAGS and not value:
                continue
            elif name in WEKA_VALUED and value.isdigit() and len(value) <= 12:
                continue
            elif name in WEKA_VALUED:
                yield Problem(("mount_options", i), f"{option}: {name} takes a whole number ({name}=<n>)")
            else:
                yield Problem(("mount_options", i), f"{option!r} is not a wekafs mount option this library passes "
                                                    f"(the client refuses unknown ones); known: "
                                                    f"{', '.join(sorted(WEKA_FLAGS | WEKA_VALUED))}")
        if self.client_core_ids is not None and cpu_count(self.client_core_ids) != self.client_cores:
            yield Problem(("client_core_ids",), f"{self.client_core_ids} names {cpu_count(self.client_core_ids)} "
                                                f"CPU(s) but client_cores is {self.client_cores}; name one each")
        if len(set(self.backends)) != len(self.backends):
            yield Problem(("backends",), "a backend is listed twice; list each once")

    _checks = (_options,)


class ScaleAdminNode(SpecModel):
    """A node of the site's Scale cluster that runs its administration commands (mmaddnode and the rest)."""

    hostname: HostName
    address: IpAddress = Field(description="Address the program reaches it on over SSH.")
    host_key: HostKey | None = Field(None, description="Omitted: its identity is not verified.")


# The Storage Scale CSI release each Scale release is paired with (IBM Storage Scale container native, "Software
# requirements": 5.1.9.x with CSI 2.10.x, 5.2.3.x with CSI 2.14.x).
SCALE_CSI_VERSIONS = {"5.1": "v2.10.10", "5.2": "v2.14.3"}


class ScaleCsi(SpecModel):
    """IBM's Storage Scale CSI driver (spectrumscale.csi.ibm.com), run by its operator from a CSIScaleOperator."""

    enabled: bool = Field(False, description="Omitted: no CSI driver (tenants' volumes are the static ones).")
    version: Literal["v2.10.10", "v2.14.3"] | None = Field(
        None, description="The CSI release. Omitted: the one paired with storage.version (5.1: v2.10.10, 5.2: "
                          "v2.14.3).")
    operator_url: Url | None = Field(
        None, description="The operator's installer manifest. Omitted: IBM's generated/installer/ibm-spectrum-"
                          "scale-csi-operator.yaml of the release on GitHub; air-gapped sites give their copy.")
    operator_path: RelPath | None = Field(
        None, description="The installer manifest as a file in the project, read when the program runs (its images "
                          "through kubernetes.image_registry). Omitted: fetched from operator_url; required with a "
                          "mirror.")
    gui_host: HostOrIp | None = Field(None, description="A GUI node of the Scale cluster, whose REST API the "
                                                        "driver uses. Required when enabled.")
    gui_port: int = Field(443, ge=1, le=65535, description="Omitted: 443.")
    gui_username: UserName | None = Field(None, description="The GUI user of the CsiAdmin group; its password is "
                                                            "the stack secret storageApiPassword. Required when "
                                                            "enabled.")
    gui_ca_config_map: DnsLabel | None = Field(
        None, description="A ConfigMap in the driver's namespace holding the GUI's CA certificate: the driver "
                          "then verifies it (secureSslMode). Omitted: the GUI's certificate is not verified.")

    def _complete(self) -> Iterator[Problem]:
        for name in ("gui_host", "gui_username"):
            if self.enabled and getattr(self, name) is None:
                yield Problem((name,), f"the CSI driver needs {name}; set it, or enabled: false")
        if self.operator_url and self.operator_path:
            yield Problem(("operator_path",), "set operator_url or operator_path, not both")

    _checks = (_complete,)


class ScaleSettings(SiteCluster):
    """The GPU hosts as client nodes of the site's IBM Storage Scale (GPFS) cluster."""

    cluster_name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$",
                              description="The Scale cluster's name (mmlscluster), which the CSI driver names.")
    cluster_id: str = Field(pattern=r"^[0-9]{1,20}$", description="The Scale cluster's ID (mmlscluster).")
    admin_node: ScaleAdminNode
    device: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_]{0,63}$",
                               description="The Scale file system's device name (mmlsfs). Omitted: "
                                           "storage.fs_name. Its mount point is the file system's own (mmlsfs -T), "
                                           "which storage.mount_point must name.")
    supported_kernels: list[KernelPattern] = Field(
        min_length=1, max_length=64,
        description="Kernel releases the site's Scale release supports, from IBM's Storage Scale FAQ for it "
                    "(shell patterns: '5.14.0-427.*'). A host running another kernel stops before any change.")
    admin_public_key: HostKey | None = Field(
        None, description="The admin node's root SSH public key, authorized for root on each client, since "
                          "Scale's commands reach every node over SSH. Omitted: the site's own trust is relied on "
                          "(mmaddnode then fails naming any host it cannot reach).")
    csi: ScaleCsi = Field(default_factory=ScaleCsi, description="Omitted: no CSI driver.")
    gds: bool = Field(False, description="GPUDirect Storage: verbsRdma, verbsGPUDirectStorage and verbsPorts "
                                         "(each pool's RDMA devices, port 1, as cufile.json lists them) on its "
                                         "nodes. Needs an RDMA fabric. Omitted: off.")


def quota_id(namespace: str) -> int:
    """A tenant's Lustre project ID and group ID (owner of its directory, BeeGFS quota): stable across plans and
    spec order, from its name, above the range distributions hand out to local users and groups."""
    return 100_000 + zlib.crc32(namespace.encode()) % 1_000_000_000


class FilesystemClaim(NamedTuple):
    """A directory of the filesystem that a tenant claims in its namespace: pods mount it at `path`, the path
    it has on every GPU host."""

    name: str             # the PersistentVolumeClaim
    path: str             # under the mount point
    size_gib: int
    read_only: bool
    group: int | None = None      # the group that owns a tenant's directory: its pods join it to write there


class StorageSpec(SpecModel):
    kind: Literal["none", "lustre", "beegfs", "wekafs", "scale"] = Field(
        "none", description="lustre and beegfs: servers and clients built here; wekafs and scale: clients of the "
                            "site's WEKA or IBM Storage Scale cluster (weka, scale). Omitted: no parallel "
                            "filesystem.")
    version: Version | None = Field(
        None, description="Lustre 2.15, BeeGFS 7.4 or 8, WEKA 4.2-4.4, Storage Scale 5.1 or 5.2. Omitted: 2.15 for "
                          "Lustre, 7.4 for BeeGFS, 4.4 for WEKA, 5.2 for Scale.")
    fs_name: str = Field("gpufs", pattern=r"^[a-z][a-z0-9]{0,7}$",
                         description="Filesystem name, at most 8 characters (Lustre's limit). Omitted: gpufs.")
    mount_point: AbsPath = Field("/mnt/gpufs", description="Where clients mount it. Omitted: /mnt/gpufs.")
    servers: list[StorageServer] = Field(default_factory=list, max_length=1024,
                                         description="Omitted: no storage servers.")
    server_interface: InterfaceName | None = Field(
        None, description="The servers' storage interface (LNet's, or BeeGFS's connInterfaces). Required with a "
                          "filesystem.")
    lnet: Literal["o2ib", "tcp"] | None = Field(
        None, description="Lustre network type: o2ib (verbs, on InfiniBand and RoCE) or tcp. Omitted: o2ib when "
                          "the fabric has RDMA, else tcp.")
    client_interface: InterfaceName | None = Field(
        None, description="Interface GPU hosts reach the servers on. Omitted: each pool's lowest-rail NIC, else "
                          "its control_interface or fabric.control_interface.")
    read_gb_per_s_per_server: float | None = Field(
        None, gt=0, le=1000, description="Sustained read bandwidth of one storage (OSS) server in GB/s, for the "
                                         "aggregate shown in the plan. Omitted: not estimated.")
    package_repositories: list[PackageRepository] = Field(
        default_factory=list, max_length=2,
        description="Where a host's missing server or client packages are installed from, one repository per OS "
                    "family; a host uses its own family's. Omitted (or no repository of a host's family): nothing "
                    "is installed there; a host that lacks them stops before any change, naming what is missing.")
    client_tunables: LustreTunables | None = Field(
        None, description="Lustre client RPC size, RPCs in flight and read-ahead. Omitted: Lustre's defaults.")
    datasets: list[Dataset] = Field(default_factory=list, max_length=256,
                                    description="Shared directories with their striping. Omitted: none.")
    quotas: bool | None = Field(
        None, description="Enforce quotas: Lustre project quotas per tenant directory, BeeGFS quota enforcement per "
                          "tenant group. BeeGFS quota enforcement is an enterprise feature: 7.4 runs it unlicensed but "
                          "its production use needs a support contract, 8 needs license_file. Omitted: on for Lustre, "
                          "off for BeeGFS (tenant directories then have no size limit).")
    failover_mounted_by_ha: bool = Field(
        False, description="Lustre failover: an HA manager the site runs (Pacemaker with the Lustre resource "
                           "agents) mounts failover targets, which are kept out of the boot mounts (noauto) so two "
                           "servers never mount one at once. Omitted: failover is refused, since this library "
                           "generates no HA resources and nothing would mount those targets after a reboot.")
    license_file: AbsPath | None = Field(
        None, description="BeeGFS 8: the licence certificate on the mgmtd server (mgmtd's license-cert-file), which "
                          "quota enforcement needs; the server script stops before any change when it is missing. "
                          "Omitted: no licence, so quotas are refused on BeeGFS 8.")
    auth: bool = Field(True, description="BeeGFS connection authentication (a random secret shared by every "
                                         "node). Omitted: on; BeeGFS 8 refuses to run without it.")
    weka: WekaSettings | None = Field(None, description="The WEKA cluster's clients. Required with kind wekafs.")
    scale: ScaleSettings | None = Field(None, description="The Scale cluster's client nodes. Required with kind "
                                                          "scale.")

    def claims(self, tenant_namespace: str, filesystem_gib: int | None,
               group_id: int | None = None) -> list[FilesystemClaim]:
        """A tenant's claims: its own directory (read-write, when it has one), then every dataset (read-only).
        `group_id`: the tenant's group from the spec. Omitted: derived from the namespace (quota_id)."""
        if self.kind == "none":
            return []
        own = [FilesystemClaim(self.fs_name, self.tenant_path(tenant_namespace), filesystem_gib, False,
                               group_id or quota_id(tenant_namespace))] if filesystem_gib else []
        return own + [FilesystemClaim(f"{self.fs_name}-{d.name}", self.dataset_path(d.name), d.size_gib, True)
                      for d in self.datasets]

    def storage_class(self, namespace: str) -> str | None:
        """A tenant's own StorageClass (WEKA's directory or Scale's fileset volumes), or None where there is none."""
        csi = self.weka.csi if self.weka else self.scale.csi if self.scale else None
        return f"{self.fs_name}-{namespace}" if csi is not None and csi.enabled else None

    def tenant_path(self, namespace: str) -> str:
        return f"{self.mount_point}/tenants/{namespace}"

    def dataset_path(self, name: str) -> str:
        return f"{self.mount_point}/datasets/{name}"

    @property
    def effective_quotas(self) -> bool:
        return self.quotas if self.quotas is not None else self.kind in ("lustre", "wekafs", "scale")

    @property
    def effective_version(self) -> str:
        return self.version or DEFAULT_VERSION.get(self.kind, "")

    @property
    def secret_settings(self) -> tuple[str, ...]:
        """The stack secrets this filesystem needs: its API user's password, where WEKA's quotas or a CSI driver
        log in with it."""
        weka, scale = self.weka, self.scale
        needed = weka is not None and self.kind == "wekafs" and (self.effective_quotas or weka.csi.enabled) or \
            scale is not None and self.kind == "scale" and scale.csi.enabled
        return (STORAGE_API_PASSWORD,) if needed else ()

    @property
    def gds(self) -> bool:
        """GPUDirect Storage asked for the site cluster's clients (storage.weka.gds or storage.scale.gds)."""
        return bool(self.kind == "wekafs" and self.weka and self.weka.gds or
                    self.kind == "scale" and self.scale and self.scale.gds)

    @property
    def client_only(self) -> bool:
        return self.kind in CLIENT_ONLY

    @property
    def remote_name(self) -> str:
        """The filesystem's name on the site's cluster: WEKA's filesystem or Scale's device, else fs_name."""
        own = self.weka.filesystem if self.weka else self.scale.device if self.scale else None
        return own or self.fs_name

    @property
    def capacity_tib(self) -> float | None:
        """Its size: the data targets' built here, the spec's word for a site's cluster (None: unknown)."""
        settings = self.weka or self.scale
        if self.client_only:
            return settings.capacity_tib if settings else None
        data = [t.size_tib for s in self.servers for t in s.targets if t.role in ("ost", "storage")]
        return sum(data) if data else None

    def _roles_match_kind(self) -> Iterator[Problem]:
        if self.kind == "none":
            if self.servers:
                yield Problem(("servers",), "servers are listed but kind is none; set kind to lustre or beegfs")
            return
        if self.client_only:
            if self.servers:
                yield Problem(("servers",), f"{self.kind} servers are the site's own cluster, which this library "
                                            "does not build; remove servers and name the cluster in storage."
                                            f"{'weka' if self.kind == 'wekafs' else 'scale'}")
            return
        roles = STORAGE_ROLES[self.kind]
        seen: dict[tuple[str, int], str] = {}
        for i, s in enumerate(self.servers):
            for j, t in enumerate(s.targets):
                if t.role not in roles:
                    yield Problem(("servers", i, "targets", j, "role"),
                                  f"{s.hostname} has a {t.role} target, which {self.kind} does not have; "
                                  f"{self.kind} roles are {', '.join(roles)}")
                key = ("mdt" if t.role == "mgs-mdt" else t.role, t.index)
                if t.role != "mgs" and key in seen:
                    yield Problem(("servers", i, "targets", j, "index"),
                                  f"{key[0]} index {t.index} is on both {seen[key]} and {s.hostname}; "
                                  "give each target its own index")
                seen[key] = s.hostname
        present = {t.role for s in self.servers for t in s.targets} | {r for r, _ in seen}
        needed = ("mgs|mgs-mdt", "mdt", "ost") if self.kind == "lustre" else roles
        missing = [n.replace("|", " or ") for n in needed if not any(r in present for r in n.split("|"))]
        if missing:
            yield Problem(("servers",), f"no {', '.join(missing)} target: a {self.kind} filesystem needs at least "
                                       f"one of each of {', '.join(n.replace('|', ' or ') for n in needed)}")
        managers = [s.hostname for s in self.servers for t in s.targets if t.role in ("mgs", "mgs-mdt", "mgmtd")]
        if len(managers) > 1:
            yield Problem(("servers",), f"{len(managers)} management targets ({', '.join(managers)}); a filesystem "
                                       "has one (MGS or mgmtd); a standby is a failover server, not a second one")

    def _settings(self) -> Iterator[Problem]:
        if self.kind == "none":
            return
        if self.version is not None and self.version not in VERSIONS[self.kind]:
            yield Problem(("version",), f"{self.kind} {self.version} is not supported; use "
                                        f"{' or '.join(VERSIONS[self.kind])}")
        yield from self._client_only_settings()
        if self.server_interface is None and not self.client_only:
            yield Problem(("server_interface",), "set the servers' storage interface (e.g. ib0)")
        if self.kind == "beegfs" and not self.auth and self.effective_version == "8":
            yield Problem(("auth",), "BeeGFS 8 services refuse to start without connection authentication unless "
                                     "it is disabled on every node and mgmtd; keep auth: true")
        if self.kind == "beegfs":
            for i, server in enumerate(self.servers):
                for j, t in enumerate(server.targets):
                    if len(f"{self.fs_name}{t.role[0]}{t.index}") > 12:
                        yield Problem(("servers", i, "targets", j, "index"),
                                      f"{self.fs_name}{t.role[0]}{t.index}, the device label of this target, is "
                                      "longer than XFS's 12 characters; shorten fs_name or use a smaller index")
        if self.kind == "beegfs" and self.effective_version == "8" and self.quotas and self.license_file is None:
            yield Problem(("quotas",), "BeeGFS 8 enforces quotas only with a licence (beegfs quota set-limits fails "
                                       "without one): set license_file to the licence certificate on the mgmtd "
                                       "server, or quotas: false")
        if self.license_file is not None and not (self.kind == "beegfs" and self.effective_version == "8"):
            yield Problem(("license_file",), "license_file is BeeGFS 8's mgmtd licence certificate; "
                                             f"{self.kind} {self.effective_version} has none: remove it")
        families = [r.os_family for r in self.package_repositories]
        for i, family in enumerate(families):
            if family in families[:i]:
                yield Problem(("package_repositories", i, "os_family"),
                              f"a second {family} repository; hosts of a family install from one: merge them")
        if self.kind == "beegfs" and self.client_tunables is not None:
            yield Problem(("client_tunables",), "client_tunables are Lustre's (lctl set_param); BeeGFS clients "
                                                "take theirs from beegfs-client.conf; remove it")
        if self.kind == "beegfs" and self.lnet is not None:
            yield Problem(("lnet",), "lnet is Lustre's network; BeeGFS uses RDMA where the fabric has it; remove it")
        hosts = {s.hostname for s in self.servers}
        for i, s in enumerate(self.servers):
            for j, t in enumerate(s.targets):
                if self.kind == "beegfs" and t.role != "mgmtd" and t.index == 0:
                    yield Problem(("servers", i, "targets", j, "index"), "BeeGFS node and target IDs start at 1; "
                                                                        "set index")
            if s.failover is not None and (s.failover not in hosts or s.failover == s.hostname):
                yield Problem(("servers", i, "failover"), f"failover {s.failover!r} is not another storage server")
            if s.failover is not None and self.kind == "lustre" and not self.failover_mounted_by_ha:
                yield Problem(("servers", i, "failover"), f"failover targets of {s.hostname} are not mounted at boot "
                                                          "(noauto) and this library generates no HA resources, so "
                                                          "nothing would mount them after a reboot: remove failover, "
                                                          "or set storage.failover_mounted_by_ha: true once your HA "
                                                          "manager (Pacemaker) mounts them")
            if s.failover is not None and self.kind == "beegfs":
                yield Problem(("servers", i, "failover"), "BeeGFS has no failover servers (it mirrors with buddy "
                                                          "groups); remove failover")

    def _client_only_settings(self) -> Iterator[Problem]:
        """A client kind has its own settings and none of the server kinds'."""
        own = {"wekafs": "weka", "scale": "scale"}
        for kind, field in own.items():
            present = getattr(self, field) is not None
            if self.kind == kind and not present:
                yield Problem((field,), f"kind {kind} needs storage.{field}: the cluster its clients join")
            elif self.kind != kind and present:
                yield Problem((field,), f"storage.{field} is for kind {kind}, not {self.kind}: remove it")
        if not self.client_only:
            return
        servers_only = {"server_interface": self.server_interface, "lnet": self.lnet,
                        "client_tunables": self.client_tunables, "license_file": self.license_file,
                        "read_gb_per_s_per_server": self.read_gb_per_s_per_server,
                        "failover_mounted_by_ha": self.failover_mounted_by_ha or None}
        if self.kind == "scale" and self.client_interface is not None:
            yield Problem(("client_interface",), "Scale nodes reach the cluster on their daemon address (the host's "
                                                 "name) and, with gds, their RDMA devices: remove client_interface")
        for name, value in servers_only.items():
            if value is not None:
                yield Problem((name,), f"{name} is for the servers this library builds (Lustre, BeeGFS); a "
                                       f"{self.kind} cluster is the site's own: remove it")
        if self.weka and self.effective_quotas and self.weka.api_username is None:
            yield Problem(("weka", "api_username"), "WEKA directory quotas are set through its API: name the "
                                                     "user (its password is the stack secret storageApiPassword), "
                                                     "or set storage.quotas: false")
        elif self.weka and self.weka.csi.enabled and self.weka.api_username is None:
            yield Problem(("weka", "api_username"), "WEKA's CSI plugin logs in to its API: name the user (its "
                                                     "password is the stack secret storageApiPassword), or set "
                                                     "storage.weka.csi.enabled: false")
        for i, d in enumerate(self.datasets):
            if d.stripe_count != -1 or d.stripe_size_mib != 4:
                yield Problem(("datasets", i, "stripe_count" if d.stripe_count != -1 else "stripe_size_mib"),
                              f"{self.kind} places data itself (no per-directory striping): remove stripe_count "
                              "and stripe_size_mib")

    def _places(self) -> Iterator[Problem]:
        """Where the filesystem lands on hosts: one target per device (a second would format the first's), a
        mount point outside the system's own directories, datasets of unique names (each is a directory, a
        claim and a Pulumi resource) and, on BeeGFS, chunk sizes its servers accept."""
        if self.kind == "none":
            return
        mount = self.mount_point
        if mount in SYSTEM_DIRS or mount.startswith(tuple(f"{d}/" for d in SYSTEM_TREES)):
            yield Problem(("mount_point",), f"{mount} is a system directory: mounting the filesystem there hides "
                                            "what the host keeps in it (or lands in a kernel filesystem); use a "
                                            "directory of its own such as /mnt/gpufs")
        for i, s in enumerate(self.servers):
            devices: dict[str, int] = {}
            for j, t in enumerate(s.targets):
                if t.device in devices:
                    yield Problem(("servers", i, "targets", j, "device"),
                                  f"{s.hostname} has two targets on {t.device} (targets {devices[t.device]} and "
                                  f"{j}): the second would format the first's device; give each its own device")
                devices.setdefault(t.device, j)
        names: dict[str, int] = {}
        for i, d in enumerate(self.datasets):
            if d.name in names:
                yield Problem(("datasets", i, "name"), f"dataset {d.name} is listed twice (datasets {names[d.name]} "
                                                       f"and {i}); give each its own name")
            names.setdefault(d.name, i)
            if self.kind == "beegfs" and d.stripe_size_mib & (d.stripe_size_mib - 1):
                yield Problem(("datasets", i, "stripe_size_mib"),
                              f"BeeGFS chunk sizes are powers of two (64 KiB and up); {d.stripe_size_mib} MiB is "
                              f"not: use {1 << (d.stripe_size_mib.bit_length() - 1)} or "
                              f"{1 << d.stripe_size_mib.bit_length()}")

    _checks = (_roles_match_kind, _settings, _places)
