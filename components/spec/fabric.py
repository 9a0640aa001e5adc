"""The data-plane fabric: InfiniBand, RoCEv2 or plain Ethernet, with its switches."""

from __future__ import annotations

from typing import Iterator, Literal

from pydantic import Field, field_validator

from .common import (DnsLabel, HostName, ImageRef, InterfaceName, IpAddress, PortName, Problem, SpecModel,
                     UserName)
from .hardware import HostKey

FabricKind = Literal["infiniband", "rocev2", "ethernet"]


class EcnSettings(SpecModel):
    min_threshold_kb: int = Field(150, ge=1, le=100000, description="Omitted: 150 KB, where marking starts.")
    max_threshold_kb: int = Field(1500, ge=1, le=100000, description="Omitted: 1500 KB, where every packet is marked.")
    probability_percent: int = Field(100, ge=1, le=100, description="Omitted: 100% at the max threshold.")

    def _ordered(self) -> Iterator[Problem]:
        if self.min_threshold_kb > self.max_threshold_kb:
            yield Problem(("min_threshold_kb",), f"min_threshold_kb ({self.min_threshold_kb}) is above "
                                                 f"max_threshold_kb ({self.max_threshold_kb}); the min threshold "
                                                 "must be the lower one")

    _checks = (_ordered,)


class RoceSettings(SpecModel):
    """Lossless RoCEv2: one priority carries RDMA with PFC, marked by one DSCP; CNPs ride their own priority."""

    priority: int = Field(3, ge=0, le=7, description="Omitted: 3, the priority NVIDIA's guides use for RoCE.")
    dscp: int = Field(26, ge=0, le=63, description="Omitted: 26 (AF31), mapped to the RoCE priority.")
    pfc_priorities: list[int] = Field(
        default_factory=lambda: [3], description="Omitted: PFC on the RoCE priority only.")
    cnp_dscp: int = Field(48, ge=0, le=63, description="Omitted: 48 for congestion notification packets.")
    cnp_priority: int = Field(6, ge=0, le=7, description="Omitted: 6.")
    ecn: EcnSettings = Field(default_factory=EcnSettings, description="Omitted: the defaults of each field.")
    pfc_watchdog: bool = Field(True, description="Omitted: switches drop PFC storms instead of spreading them.")
    dscp_map: dict[int, int] = Field(
        default_factory=dict, description="More DSCP -> priority entries for hosts and switches (other traffic "
                                          "classes). Omitted: only dscp -> priority and cnp_dscp -> cnp_priority.")
    isolate_dedicated_pools: bool = Field(
        False, description="Each dedicated pool's leaf ports in its tenant's own VLAN (access, untagged, so hosts "
                           "and pods are unchanged), the other cabled host ports in shared_vlan, the tenants' "
                           "VLANs tagged on the leaves' uplinks and the spines' ports: the rails must be bridged "
                           "(VLAN-aware) on the managed switches. Omitted: no; the rails are shared.")
    shared_vlan: int = Field(1, ge=1, le=4094, description="The VLAN of the shared pools' host ports where "
                                                           "dedicated pools are isolated. Omitted: 1.")
    tenant_vlan_first: int = Field(3000, ge=2, le=4094, description="The first VLAN this library gives tenants. "
                                                                    "Omitted: 3000.")
    tenant_vlan_last: int = Field(3999, ge=2, le=4094, description="The last VLAN this library gives tenants. "
                                                                   "Omitted: 3999.")
    site_vlans: list[int] = Field(
        default_factory=list, description="VLANs the site uses on these switches already, which no tenant may "
                                          "take. Omitted: none.")

    def _one_lossless_priority(self) -> Iterator[Problem]:
        if self.pfc_priorities != [self.priority]:
            yield Problem(("pfc_priorities",),
                          f"pfc_priorities is {self.pfc_priorities} but RoCE traffic uses priority {self.priority}: "
                          f"PFC must be on exactly that one priority (pfc_priorities: [{self.priority}]), or pause "
                          "frames from other traffic stall RDMA")
        if self.cnp_priority == self.priority or self.cnp_dscp == self.dscp:
            yield Problem(("cnp_priority",), "cnp_priority/cnp_dscp equal the RoCE priority/dscp: congestion "
                                             "notifications must not queue behind the traffic they slow down; use "
                                             "distinct values (e.g. 6 / 48)")

    def _dscp_map_agrees(self) -> Iterator[Problem]:
        for dscp, prio in sorted(self.dscp_map.items()):
            if not (0 <= dscp <= 63 and 0 <= prio <= 7):
                yield Problem(("dscp_map", dscp), f"{dscp}: {prio} is not a DSCP (0-63) to priority (0-7) entry")
                continue
            wanted = {self.dscp: self.priority, self.cnp_dscp: self.cnp_priority}.get(dscp, prio)
            if prio != wanted:
                yield Problem(("dscp_map", dscp),
                              f"dscp_map sends DSCP {dscp} to priority {prio}, but "
                              f"{'RoCE' if dscp == self.dscp else 'CNP'} traffic marked {dscp} must use priority "
                              f"{wanted} (PFC is on priority {self.priority}); remove the entry or map it to {wanted}")

    def _vlans(self) -> Iterator[Problem]:
        if self.tenant_vlan_first > self.tenant_vlan_last:
            yield Problem(("tenant_vlan_last",), f"tenant_vlan_last ({self.tenant_vlan_last}) is below "
                                                 f"tenant_vlan_first ({self.tenant_vlan_first}); swap them")
        elif self.tenant_vlan_first <= self.shared_vlan <= self.tenant_vlan_last:
            yield Problem(("shared_vlan",), f"shared_vlan {self.shared_vlan} lies in the tenants' VLANs "
                                            f"({self.tenant_vlan_first}-{self.tenant_vlan_last}); move one of them")
        for i, vlan in enumerate(self.site_vlans):
            if not 1 <= vlan <= 4094:
                yield Problem(("site_vlans", i), f"{vlan} is not a VLAN (1-4094)")
            elif vlan == self.shared_vlan:
                yield Problem(("site_vlans", i), f"VLAN {vlan} is shared_vlan, which this library puts host ports "
                                                 "in; remove it from site_vlans or choose another shared_vlan")

    _checks = (_one_lossless_priority, _dscp_map_agrees, _vlans)

    @property
    def tos(self) -> int:
        """IP ToS byte of RoCE traffic: the DSCP with ECT(0), so switches mark instead of dropping."""
        return self.dscp << 2 | 2

    @property
    def dscp_priorities(self) -> dict[int, int]:
        return {**self.dscp_map, self.dscp: self.priority, self.cnp_dscp: self.cnp_priority}


def pkey_problem(value: int) -> str | None:
    """Why `value` cannot be a partition key: 0x0000 is invalid, 0x7fff the default partition's (IBTA 10.9.1),
    and the top bit is the per-port membership flag, not part of the key."""
    if 0x0001 <= value <= 0x7FFE:
        return None
    hint = (f"; drop the full-membership bit 0x8000 (use {value & 0x7FFF:#06x}), membership is set per port"
            if 0x8001 <= value <= 0xFFFE else "")
    return f"partition key {value:#06x} is outside 0x0001-0x7ffe (0x7fff is the default partition){hint}"


class Partition(SpecModel):
    """An IPoIB network: every host gets a `<if>.<pkey>` interface on it. Every shared port is a full member, so
    these separate IP traffic only; tenants are isolated on the fabric by `isolate_dedicated_pools`, where a
    dedicated pool's ports are limited members of these."""

    name: DnsLabel
    pkey: int = Field(description="Partition key, 0x0001-0x7ffe (0x7fff is the default partition).")

    @field_validator("pkey")
    @classmethod
    def _pkey_in_range(cls, value: int) -> int:
        if (problem := pkey_problem(value)) is not None:
            raise ValueError(problem)
        return value


class InfinibandSettings(SpecModel):
    subnet_managers: list[HostName] = Field(
        min_length=1, description="Hosts that run OpenSM; the first is primary, the rest standby.")
    partitions: list[Partition] = Field(
        default_factory=list, description="IPoIB networks besides the default partition's (IP separation only, "
                                          "not RDMA isolation). Omitted: only the default partition.")
    isolate_dedicated_pools: bool = Field(
        False, description="Give each tenant that owns a dedicated pool its own partition (tenants[].infiniband_pkey), "
                           "at P_Key index 0 of the pool's rail ports, which are only limited members of every "
                           "other partition: the tenant's hosts reach each other, the storage servers, the subnet "
                           "managers and the shared pools' hosts, never another tenant's dedicated hosts. Omitted: "
                           "no, every port shares the default partition (the prod policy flags a dedicated pool "
                           "left so).")
    take_over_existing_sm: bool = Field(
        False, description="Start OpenSM even when another subnet manager (UFM, a switch's SM) is master of the "
                           "fabric. Omitted: no, the subnet managers' hosts refuse to take over and say which "
                           "SM is master.")
    rate_gbps: Literal[100, 200, 400, 800] = Field(400, description="Omitted: 400 (NDR).")
    routing_engine: Literal["updn", "minhop", "ftree", "dfsssp"] = Field(
        "updn", description="OpenSM routing engine. Omitted: updn, deadlock-free on any tree without a root list.")


class Switch(SpecModel):
    name: HostName
    role: Literal["leaf", "spine"]
    vendor: Literal["cumulus", "sonic", "eos", "mlnx-os"]
    address: IpAddress
    ports: int = Field(ge=1, le=512)
    port_speed_gbps: Literal[100, 200, 400, 800] = Field(description="Rate of the ports hosts are cabled to.")
    uplink_speed_gbps: Literal[100, 200, 400, 800] | None = Field(
        None, description="Rate of the ports to the spines (often faster than the host ports). Omitted: "
                          "port_speed_gbps.")
    uplinks: list[HostName] = Field(default_factory=list, description="Spines this leaf connects to. Omitted: none.")
    rails: list[int] = Field(default_factory=list, description="Rails served (rail-optimized). Omitted: every rail.")
    racks: list[DnsLabel] = Field(default_factory=list, description="Racks served. Omitted: every rack.")
    rack: DnsLabel | None = Field(None, description="The rack it is mounted in, whose PDUs feed it. Omitted: its "
                                                    "power is in no rack's (the plan says so).")
    power_w: int | None = Field(None, ge=1, le=20000, description="Peak power of the switch, counted in its rack's "
                                                                "power. Omitted: unknown; its rack's power is "
                                                                "reported unknown rather than ok.")
    host_key: HostKey | None = Field(None, description="Omitted: the switch's identity is not verified.")
    ssh_user: UserName = Field("admin", description="Omitted: admin.")
    managed: bool = Field(True, description="Push this switch's RoCE configuration (rocev2 fabrics). Omitted: yes; "
                                            "false keeps it in the topology only.")
    mtu_bytes: int | None = Field(None, ge=1280, le=9216,
                                  description="Port MTU. Omitted: the vendor's jumbo size (Cumulus 9216, EOS 9214, "
                                              "SONiC 9100), which carries a 9000-byte host MTU.")
    links_per_uplink: int = Field(1, ge=1, le=64, description="Parallel links to each spine in uplinks. Omitted: 1.")
    port_names: list[PortName] = Field(
        default_factory=list, description="Names of ports 1..ports when the vendor's default does not fit. Omitted: "
                                          "swp1.. (Cumulus), Ethernet1.. (EOS), Ethernet0, Ethernet8.. (SONiC, 8 lanes)")

    @property
    def effective_uplink_speed_gbps(self) -> int:
        return self.uplink_speed_gbps or self.port_speed_gbps

    def _port_names_cover_ports(self) -> Iterator[Problem]:
        if self.port_names and len(self.port_names) != self.ports:
            yield Problem(("port_names",), f"{len(self.port_names)} port names for {self.ports} ports; "
                                           "name every port, in order, or omit port_names")
        if len(set(self.port_names)) != len(self.port_names):
            yield Problem(("port_names",), "a port name appears more than once; name each port once")

    _checks = (_port_names_cover_ports,)


class FabricChecks(SpecModel):
    """Thresholds of the checks rendered for after `pulumi up` (ib_write_bw per rail, multi-node all_reduce)."""

    link_min_percent: int = Field(90, ge=10, le=100,
                                  description="ib_write_bw must reach this share of the line rate. Omitted: 90%.")
    nccl_min_percent: int = Field(
        85, ge=10, le=100, description="all_reduce_perf bus bandwidth at large messages must reach this share of "
                                       "what the slower of NVLink and the node's NICs carries. Omitted: 85%.")
    nccl_min_busbw_gb_per_s: float | None = Field(
        None, gt=0, description="all_reduce_perf bus bandwidth floor across nodes, in GB/s. Omitted: "
                                "nccl_min_percent of the line rate.")
    nccl_hosts: int | None = Field(
        None, ge=2, description="Nodes in each pool's NCCL check; at most the hosts of the smallest pool of two or "
                                "more (refused above it). Omitted: every host of each pool.")
    nccl_tests_image: ImageRef = Field(
        "ghcr.io/coreweave/nccl-tests:12.8.1-devel-ubuntu22.04-nccl2.26.2-1-0708d2e",
        description="Image with MPI and nccl-tests at /opt/nccl_tests/build. Omitted: CoreWeave's public build.")


class FabricSpec(SpecModel):
    kind: FabricKind = Field("ethernet", description="Omitted: plain Ethernet, no RDMA.")
    mtu_bytes: int | None = Field(
        None, description="Data-plane MTU. Omitted: 9000 on Ethernet and RoCE, 4096 on InfiniBand.")
    roce: RoceSettings | None = Field(None, description="Only with kind rocev2. Omitted: the defaults of each field.")
    infiniband: InfinibandSettings | None = Field(None, description="Required with kind infiniband.")
    switches: list[Switch] = Field(default_factory=list, max_length=4096, description="Omitted: switches are not managed.")
    gpudirect_rdma: bool | None = Field(
        None, description="GPUDirect RDMA between GPUs and NICs. Omitted: on for InfiniBand and RoCE.")
    control_interface: InterfaceName | None = Field(
        None,
        description="Host interface of the control network (NCCL_SOCKET_IFNAME). Omitted: NCCL chooses.")
    checks: FabricChecks = Field(default_factory=FabricChecks, description="Omitted: the defaults of each field.")

    def _kind_settings(self) -> Iterator[Problem]:
        if self.roce is not None and self.kind != "rocev2":
            yield Problem(("roce",), f"roce is set but kind is {self.kind}; remove roce or set kind: rocev2")
        if self.infiniband is not None and self.kind != "infiniband":
            yield Problem(("infiniband",), f"infiniband is set but kind is {self.kind}; remove it or set kind: "
                                           "infiniband")
        if self.kind == "infiniband" and self.infiniband is None:
            yield Problem(("infiniband",), "kind is infiniband but infiniband (subnet_managers) is missing")
        if self.gpudirect_rdma and self.kind == "ethernet":
            yield Problem(("gpudirect_rdma",), "gpudirect_rdma needs RDMA: set kind to rocev2 or infiniband, or drop it")
        mtu = self.mtu_bytes
        if mtu is not None:
            if self.kind == "infiniband" and mtu not in (256, 512, 1024, 2048, 4096):
                yield Problem(("mtu_bytes",), f"{mtu} is not an InfiniBand MTU; use 256, 512, 1024, 2048 or 4096")
            if self.kind != "infiniband" and not 1280 <= mtu <= 9216:
                yield Problem(("mtu_bytes",), f"{mtu} is outside 1280-9216; use 9000 for jumbo frames")
        if self.kind == "infiniband":
            for i, sw in enumerate(self.switches):
                if sw.vendor != "mlnx-os":
                    yield Problem(("switches", i, "vendor"),
                                  f"{sw.name} runs {sw.vendor}, an Ethernet switch OS, but the fabric is InfiniBand; "
                                  "InfiniBand switches run mlnx-os (or fix fabric.kind)")

    _checks = (_kind_settings,)

    @property
    def rdma(self) -> bool:
        return self.kind != "ethernet"

    @property
    def effective_mtu_bytes(self) -> int:
        return self.mtu_bytes or (4096 if self.kind == "infiniband" else 9000)

    @property
    def effective_gpudirect(self) -> bool:
        return self.rdma if self.gpudirect_rdma is None else self.gpudirect_rdma

    @property
    def effective_roce(self) -> RoceSettings | None:
        return (self.roce or RoceSettings()) if self.kind == "rocev2" else None

    @property
    def subnet_managers(self) -> list[str]:
        """Hosts that run OpenSM, primary first; none outside InfiniBand."""
        return list(self.infiniband.subnet_managers) if self.infiniband else []
