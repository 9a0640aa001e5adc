"""Tenants isolated on RoCE: a VLAN per tenant that owns a dedicated pool (`fabric.roce.isolate_dedicated_pools`).

On a bridged (VLAN-aware) rail, a VLAN is the switch's fence: a frame stays in the VLAN of the port it came in
on. So each leaf port cabled to an isolated pool's host is an access port of its tenant's VLAN, every other
cabled host port one of `shared_vlan`, and the tenants' VLANs are carried tagged between the switches. Access
ports take untagged frames, so hosts, their DSCP marking and pods are unchanged: the switch's DSCP trust and PFC
act per port whatever the VLAN, and the port keeps its lossless class.

What each network OS needs for the tagged part (their guides: Cumulus Linux "VLAN-aware Bridge Mode", SONiC's
Command Reference `config vlan`, EOS "VLANs"): on Cumulus and EOS a bridge or trunk port carries every VLAN the
switch has unless the site restricted it, so the VLANs are created on the leaves and spines; on SONiC a port
carries only the VLANs it is a member of, so the leaves' uplinks and the spines' ports are made tagged members.

The steps (`<name>-<switch>`) run after the Nodes whose ports change VLAN are drained (nodes/handover.py) and
before they are given back. A VLAN no tenant uses any more is left defined: no host port is in it. Where
isolation ends the steps are deleted, after the reopen step's delete drained the tenants' Nodes, and their
deletes put the tenants' ports back in the shared VLAN.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import pulumi

from ..bash import script
from ..spec import ClusterSpec
from ..spec.fabric import Switch
from ..spec.topology import plan_topology
from ..ssh import Script, push
from ..types import token, with_aliases
from .switches import BACKENDS, switch_ports, switch_target


@dataclass(frozen=True)
class SwitchVlans:
    """What one switch gets: each cabled host port's VLAN (untagged), and the tenants' VLANs it carries tagged
    on `trunks` (a leaf's uplinks, a spine's ports)."""

    access: dict[str, int] = field(default_factory=dict)
    trunks: tuple[str, ...] = ()
    tagged: tuple[int, ...] = ()

    @property
    def vlans(self) -> tuple[int, ...]:
        return tuple(sorted({*self.access.values(), *self.tagged}))


def plan_vlans(spec: ClusterSpec) -> dict[str, SwitchVlans]:
    """Per managed switch, its VLANs (none without isolated pools)."""
    roce = spec.fabric.roce
    if not spec.vlan_pools or roce is None:
        return {}
    topology = plan_topology(spec)[0]
    owner = spec.isolated_hosts
    vlans = spec.tenant_vlans
    switches = {s.name: s for s in spec.fabric.switches if s.managed and s.vendor in BACKENDS}
    out: dict[str, SwitchVlans] = {}
    carried: set[int] = set()
    for name, leaf in sorted(topology.leaves.items()):
        switch = switches.get(name)
        if switch is None:
            continue
        ports = switch_ports(switch, BACKENDS[switch.vendor])
        access = {ports[link.port - 1]: vlans[owner[link.host]] if link.host in owner else roce.shared_vlan
                  for link in topology.links if link.leaf == name}
        tagged = tuple(sorted({v for v in access.values() if v != roce.shared_vlan}))
        carried.update(tagged)
        out[name] = SwitchVlans(access, tuple(ports[leaf.ports - leaf.uplinks:]), tagged)
    for switch in switches.values():
        if switch.role == "spine" and carried:
            out[switch.name] = SwitchVlans({}, tuple(switch_ports(switch, BACKENDS[switch.vendor])),
                                           tuple(sorted(carried)))
    return out


def vlan_reach(spec: ClusterSpec) -> dict[str, Any]:
    """Who can reach whom on the rails, per pool: the pools whose ports share a VLAN."""
    roce = spec.fabric.roce
    isolated, vlans = spec.vlan_pools, spec.tenant_vlans
    shared = roce.shared_vlan if roce is not None else 1
    of = {p.name: vlans[isolated[p.name]] if p.name in isolated else shared for p in spec.node_pools}
    return {
        "isolated": bool(isolated),
        "vlans": dict(sorted(vlans.items())),
        "fences": {t: f"VLAN {v}" for t, v in sorted(vlans.items())},
        "groups": {g: {"tenant": isolated.get(g), "reaches": sorted(o for o in of if of[o] == v),
                       "cut_off_from": sorted(o for o in of if of[o] != v)} for g, v in of.items()},
    }


def render_vlan_step(switch: Switch, vlans: SwitchVlans, shared_vlan: int) -> Script:
    """The step, and its delete: run where isolation is turned off (the step's only deletion: a converging step
    is updated in place, never replaced), it moves the ports it put in tenants' VLANs back to `shared_vlan`.
    The tenants' VLANs stay defined, with no host port in them."""
    backend = BACKENDS[switch.vendor]
    back = {port: shared_vlan for port, vlan in vlans.access.items() if vlan != shared_vlan}
    leave = backend.vlan_body(SwitchVlans(back)) if back else 'note "no host port of this switch is in a tenant VLAN"\n'
    return Script(script(f"Tenant VLANs on {switch.role} {switch.name} ({switch.vendor}): "
                         f"{', '.join(map(str, vlans.vlans))}", switch.name, backend.vlan_body(vlans)),
                  script(f"Tenant VLANs leave {switch.name}: {len(back)} host port(s) back to VLAN {shared_vlan}",
                         switch.name, leave))


class FabricVlans(pulumi.ComponentResource):
    """The tenants' VLANs on every managed switch that carries one: `<name>-<switch>`."""

    TYPE: ClassVar[str] = token("FabricVlans")

    steps: dict[str, pulumi.Resource]
    """The VLAN step of each switch, by name: an isolated host opens to tenants after them."""

    def __init__(self, name: str, spec: ClusterSpec, ssh_private_key: pulumi.Input[str], *,
                 depends_on: list[pulumi.Resource], opts: pulumi.ResourceOptions | None = None):
        """`depends_on`: in a GpuCluster, the drain of the Nodes whose ports change VLAN (nodes/handover.py)."""
        reach = vlan_reach(spec)
        super().__init__(self.TYPE, name, {"reach": reach}, with_aliases(self.TYPE, opts))
        switches = {s.name: s for s in spec.fabric.switches}
        shared = spec.fabric.roce.shared_vlan if spec.fabric.roce is not None else 1
        self.steps = {}
        for switch_name, vlans in plan_vlans(spec).items():
            switch = switches[switch_name]
            step = render_vlan_step(switch, vlans, shared)
            self.steps[switch_name] = push(f"{name}-{switch_name}", switch_target(switch, spec.ssh.bastion), step,
                                           ssh_private_key, parent=self, converge=True, depends_on=depends_on)
        self.register_outputs({"reach": reach})
