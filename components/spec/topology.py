"""The fabric's cabling, derived from the spec: which host NIC goes to which leaf port, and what that gives.

A leaf serves a NIC when the host's rack is in the leaf's `racks` and the NIC's rail in its `rails` (an empty
list serves all). Each NIC must reach exactly one leaf. Ports: a host's `leaf_port` when given (a leaf with
several of the host's rails gives them the next ports, in rail order), else the lowest free port in the order
hosts are listed; uplinks take the highest ports. From the links come, per leaf, the downlink and uplink
bandwidth and their ratio (oversubscription), whether the layout is rail-optimized (every leaf carries one
rail, and there are several rails), and the bisection bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator

from .common import Loc, Problem

if TYPE_CHECKING:
    from .cluster import ClusterSpec
    from .fabric import Switch


@dataclass(frozen=True)
class Link:
    """One host NIC cabled to one leaf port."""

    host: str
    rail: int
    device: str
    interface: str
    speed_gbps: int
    leaf: str
    port: int


@dataclass(frozen=True)
class LeafLoad:
    name: str
    ports: int
    downlinks: int
    uplinks: int
    down_gbps: int
    up_gbps: int
    rails: tuple[int, ...]

    @property
    def oversubscription(self) -> float | None:
        """Downlink over uplink bandwidth; None for a leaf without uplinks (nothing leaves it)."""
        return round(self.down_gbps / self.up_gbps, 3) if self.up_gbps else None


@dataclass(frozen=True)
class Topology:
    links: tuple[Link, ...] = ()
    leaves: dict[str, LeafLoad] = field(default_factory=dict)

    @property
    def rail_optimized(self) -> bool:
        rails = {link.rail for link in self.links}
        return len(rails) > 1 and all(len(leaf.rails) <= 1 for leaf in self.leaves.values())

    @property
    def bisection_gbps(self) -> float:
        """Bandwidth across a worst-case cut halving the hosts, at leaf granularity: each leaf passes at most
        the smaller of its downlinks and uplinks (a leaf without uplinks is cut through its middle)."""
        return sum(min(leaf.down_gbps, leaf.up_gbps or leaf.down_gbps) for leaf in self.leaves.values()) / 2

    def host_leaves(self) -> dict[str, str]:
        """Each host's leaf for labels: that of its lowest rail, so hosts under the same rail leaves share it."""
        return {link.host: link.leaf for link in sorted(self.links, key=lambda link: -link.rail)}

    def summary(self, host_pools: dict[str, str] | None = None) -> dict[str, object]:
        """Figures for review and policies; with `host_pools` (host -> pool), each leaf names the pools it serves."""
        served: dict[str, set[str]] = {}
        for link in self.links if host_pools else ():
            served.setdefault(link.leaf, set()).add(host_pools[link.host])
        return {
            "rail_optimized": self.rail_optimized,
            "bisection_gbps": self.bisection_gbps,
            "leaves": {name: {"downlinks": leaf.downlinks, "uplinks": leaf.uplinks, "ports": leaf.ports,
                              "down_gbps": leaf.down_gbps, "up_gbps": leaf.up_gbps,
                              "oversubscription": leaf.oversubscription, "rails": list(leaf.rails),
                              **({"pools": sorted(served.get(name, ()))} if host_pools else {})}
                       for name, leaf in sorted(self.leaves.items())},
        }


def network_places(spec: ClusterSpec) -> tuple[dict[str, str], dict[str, str]]:
    """Each rack's network block (its own, or its site's) and each cabled host's leaf: the levels of Kueue's
    topology (node labels) and of Slurm's switch tree alike."""
    blocks = {r.name: r.block or s.name for s in spec.sites for r in s.racks}
    return blocks, plan_topology(spec)[0].host_leaves()


_PLANNED: dict[int, tuple[ClusterSpec, tuple[Topology, list[Problem]]]] = {}


def plan_topology(spec: ClusterSpec) -> tuple[Topology, list[Problem]]:
    """The links and leaf loads, and every cabling problem (each naming the field to fix).

    Planned once per spec (specs are immutable): validation, the fabric, node pools, checks and the plan
    summary all read the same result."""
    hit = _PLANNED.get(id(spec))
    if hit is not None and hit[0] is spec:
        return hit[1]
    result = _plan_topology(spec)
    if len(_PLANNED) >= 8:
        _PLANNED.pop(next(iter(_PLANNED)))
    _PLANNED[id(spec)] = (spec, result)        # the spec is kept, so its id is not reused while cached
    return result


def _plan_topology(spec: ClusterSpec) -> tuple[Topology, list[Problem]]:
    switches = spec.fabric.switches
    leaves = [s for s in switches if s.role == "leaf"]
    if not leaves:
        return Topology(), []
    problems: list[Problem] = []
    where = {s.name: ("fabric", "switches", i) for i, s in enumerate(switches)}
    by_name = {leaf.name: leaf for leaf in leaves}
    uplink_ports = {leaf.name: len(leaf.uplinks) * leaf.links_per_uplink for leaf in leaves}
    taken: dict[str, dict[int, str]] = {leaf.name: {} for leaf in leaves}
    wanted: list[tuple[Loc, str, int, Link]] = []     # (host loc, leaf, explicit port or 0, link without port)
    too_fast: set[tuple[int, int, str]] = set()
    # Leaves by the racks and rails they name ("" / -1: every rack / rail), so finding the leaves of a NIC
    # costs the leaves that could serve it, not every leaf of the fabric.
    scoped: dict[tuple[str, int], list[int]] = {}
    for i, leaf in enumerate(leaves):
        for rack in leaf.racks or [""]:
            for rail in leaf.rails or [-1]:
                scoped.setdefault((rack, rail), []).append(i)
    serving_at: dict[tuple[str, int], list[Switch]] = {}

    def serving_leaves(rack: str, rail: int) -> list[Switch]:
        key = (rack, rail)
        if key not in serving_at:          # once per rack and rail, in the order of the spec
            found = {i for k in ((rack, rail), (rack, -1), ("", rail), ("", -1)) for i in scoped.get(k, ())}
            serving_at[key] = [leaves[i] for i in sorted(found)]
        return serving_at[key]

    for pi, pool in enumerate(spec.node_pools):
        for hi, host in enumerate(pool.hosts):
            loc = ("node_pools", pi, "hosts", hi)
            for ni, nic in enumerate(pool.nics):
                serving = serving_leaves(host.rack, nic.rail)
                if len(serving) != 1:
                    names = ", ".join(s.name for s in serving)
                    problems.append(Problem(loc, f"rail {nic.rail} of {host.hostname} (rack {host.rack}) reaches "
                                                 f"{'no leaf' if not serving else 'leaves ' + names}; each NIC needs "
                                                 "exactly one leaf: fix the leaves' racks or rails"))
                    continue
                if nic.speed_gbps > serving[0].port_speed_gbps and (pi, ni, serving[0].name) not in too_fast:
                    too_fast.add((pi, ni, serving[0].name))
                    problems.append(Problem(("node_pools", pi, "nics", ni, "speed_gbps"),
                                            f"rail {nic.rail} NICs of pool {pool.name} run at {nic.speed_gbps} Gb/s "
                                            f"but leaf {serving[0].name}'s ports at {serving[0].port_speed_gbps}; "
                                            "the links would train down and every bandwidth check fail: fix "
                                            "speed_gbps or the leaf's port_speed_gbps"))
                link = Link(host.hostname, nic.rail, nic.device, nic.interface, nic.speed_gbps, serving[0].name, 0)
                wanted.append((loc, serving[0].name, host.leaf_port or 0, link))
    offsets: dict[tuple[str, str], int] = {}
    for n, (loc, leaf_name, port, link) in enumerate(wanted):   # explicit ports first: automatic ones avoid them
        if not port:
            continue
        port += offsets.get((link.host, leaf_name), 0)    # a leaf with several of the host's rails: next ports
        offsets[(link.host, leaf_name)] = offsets.get((link.host, leaf_name), 0) + 1
        wanted[n] = (loc, leaf_name, port, link)
        leaf = by_name[leaf_name]
        if port > leaf.ports - uplink_ports[leaf_name]:
            problems.append(Problem(loc + ("leaf_port",),
                                    f"leaf_port {port} is not a downlink port of {leaf_name} (ports 1-"
                                    f"{leaf.ports - uplink_ports[leaf_name]}; the top {uplink_ports[leaf_name]} "
                                    "are uplinks); choose a free port in that range"))
        elif port in taken[leaf_name]:
            problems.append(Problem(loc + ("leaf_port",), f"leaf_port {port} of {leaf_name} is already cabled to "
                                                          f"{taken[leaf_name][port]}; give each host its own port"))
        else:
            taken[leaf_name][port] = link.host
    links: list[Link] = []
    cursor = {leaf.name: 1 for leaf in leaves}
    for _, leaf_name, port, link in wanted:
        if not port:
            while cursor[leaf_name] in taken[leaf_name]:
                cursor[leaf_name] += 1
            port = cursor[leaf_name]
            taken[leaf_name][port] = link.host
        links.append(Link(link.host, link.rail, link.device, link.interface, link.speed_gbps, leaf_name, port))
    per_leaf: dict[str, list[Link]] = {leaf.name: [] for leaf in leaves}
    for link in links:
        per_leaf[link.leaf].append(link)
    loads: dict[str, LeafLoad] = {}
    for leaf in leaves:
        mine = per_leaf[leaf.name]
        down = len(taken[leaf.name])
        if down + uplink_ports[leaf.name] > leaf.ports:
            problems.append(Problem(where[leaf.name] + ("ports",),
                                    f"leaf {leaf.name} has {down} downlinks and {uplink_ports[leaf.name]} uplinks "
                                    f"but only {leaf.ports} ports; add a leaf (narrow racks/rails) or fix ports"))
        loads[leaf.name] = LeafLoad(leaf.name, leaf.ports, down, uplink_ports[leaf.name],
                                    sum(link.speed_gbps for link in mine),
                                    uplink_ports[leaf.name] * leaf.effective_uplink_speed_gbps,
                                    tuple(sorted({link.rail for link in mine})))
    problems.extend(_spine_capacity(spec))
    return Topology(tuple(links), loads), problems


def _spine_capacity(spec: ClusterSpec) -> Iterator[Problem]:
    switches = spec.fabric.switches
    taken: dict[str, int] = {}
    for leaf in switches:
        for name in set(leaf.uplinks):
            taken[name] = taken.get(name, 0) + leaf.links_per_uplink
    for i, spine in enumerate(switches):
        if spine.role != "spine":
            continue
        used = taken.get(spine.name, 0)
        if used > spine.ports:
            yield Problem(("fabric", "switches", i, "ports"),
                          f"spine {spine.name} takes {used} uplinks from its leaves but has {spine.ports} ports; "
                          "add a spine or lower links_per_uplink")

