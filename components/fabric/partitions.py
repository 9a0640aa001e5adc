"""Tenants isolated on InfiniBand: a partition per tenant that owns a dedicated pool (`isolate_dedicated_pools`).

A partition key is the fabric's only fence (IBTA 10.9.1): two ports talk only where they share a P_Key and one
of them at least is a full member. So a tenant's rail ports are full members of its own partition, at P_Key
index 0 (`indx0`), the index NCCL, IPoIB and verbs use unless told otherwise, and only limited members of the
default partition and the spec's IPoIB networks, where the storage servers, the subnet managers and the shared
pools' hosts are full members: those they reach, another tenant's dedicated hosts never.

The port GUIDs come from the hosts: each fabric step prints `port-guid DEVICE GUID` per rail (read from the
device, never typed into the spec), and `FabricPartitions` renders them into partitions.conf on every subnet
manager host, which OpenSM re-reads on a hangup (a heavy sweep, no restart, no election), then checks from the
master that each tenant port holds its partition at index 0.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Mapping

import pulumi

from ..bash import call, fill, script
from ..spec import ClusterSpec
from ..ssh import Script, SshTarget, push
from ..types import token, with_aliases
from .host import OPENSM_LOG, OPENSM_UNIT, PARTITIONS_CONF, RESWEEP, SHARED_PARTITIONS, render_partitions
from .vlans import vlan_reach

PORT_GUID = re.compile(r"^\S+: port-guid (?P<device>\S+) (?P<guid>0x[0-9a-f]{16})$", re.M)
VERIFY_S = 60       # how long the master's sweep may take to program the tenants' ports, all of them


def port_guids(stdout: str | None) -> dict[str, str]:
    """Device -> port GUID, from a fabric step's output (its `port-guid` lines)."""
    return {m["device"]: m["guid"] for m in PORT_GUID.finditer(stdout or "")}


def memberships(spec: ClusterSpec) -> dict[str, dict[int, str]]:
    """Group (a node pool, or `storage`) -> P_Key -> full or limited: what render_partitions gives each group's
    ports, as a table the reach report and the tests read."""
    ib = spec.fabric.infiniband
    shared = [0x7FFF, *(p.pkey for p in ib.partitions)] if ib is not None else [0x7FFF]
    isolated, pkeys = spec.partitioned_pools, spec.tenant_pkeys
    out: dict[str, dict[int, str]] = {}
    for pool in spec.node_pools:
        tenant = isolated.get(pool.name)
        out[pool.name] = {k: "limited" if tenant else "full" for k in shared}
        if tenant:
            out[pool.name][pkeys[tenant]] = "full"
    if spec.storage.servers:
        out["storage"] = {k: "full" for k in shared}
    return out


def host_groups(spec: ClusterSpec) -> dict[str, str]:
    """Host -> its group in the reach report: its node pool, or `storage`."""
    return {h.hostname: p.name for p, h in spec.hosts()} | {s.hostname: "storage" for s in spec.storage.servers}


def fabric_reach(spec: ClusterSpec) -> dict[str, Any]:
    """Who can reach whom on the fabric, per group (a pool's hosts share their ports' memberships): on
    InfiniBand, two ports reach each other where they share a partition and one at least is a full member
    (checked against OpenSM's path records in the tests); on RoCE, where they share a VLAN. Registered and
    reported."""
    if spec.vlan_pools:
        return vlan_reach(spec)
    table = memberships(spec)

    def meet(a: str, b: str) -> bool:
        return any(k in table[b] and "full" in (m, table[b][k]) for k, m in table[a].items())

    isolated = spec.partitioned_pools
    groups = {g: sorted(o for o in table if meet(g, o)) for g in table}
    return {
        "isolated": bool(isolated),
        "partitions": {t: f"{k:#06x}" for t, k in sorted(spec.tenant_pkeys.items())},
        "fences": {t: f"P_Key {k:#06x}" for t, k in sorted(spec.tenant_pkeys.items())},
        "groups": {g: {"tenant": isolated.get(g), "reaches": reached,
                       "cut_off_from": sorted(o for o in table if o not in reached)} for g, reached in groups.items()},
    }


# check_tenant_ports: each line of stdin "HOST DEVICE GUID PKEY" (PKEY with the full-member bit), read back
# over the fabric from here (smpquery: the port's LID by GUID, then its P_Key table's index 0), retried while the
# master's sweep programs them, within one bound for all the ports (VERIFY_S; each query 10 s at most). A port not
# read by then (the SA not answering, a tool failing) is counted and noted, never a verdict; a port holding another
# key at index 0 fails. Parses infiniband-diags' own output, checked against the real smpquery over ibsim
# (tests/components/fabric/test_isolation_real.py).
CHECK_TENANT_PORTS = r'''
check_tenant_ports() {
  local host device guid want got lid unread=0 wrong=() deadline=$((SECONDS + @VERIFY_S@))
  while read -r host device guid want; do
    [[ -n "$host" ]] || continue
    got=""
    while (( SECONDS < deadline )); do
      if lid=$(timeout 10 smpquery portinfo -G "$guid" 2>/dev/null | sed -n 's/^Lid:\.*//p') && [[ -n "$lid" ]] &&
         got=$(timeout 10 smpquery pkeys "$lid" 2>/dev/null | sed -n 's/^ *0: *\(0x[0-9a-f]*\).*/\1/p') &&
         [[ "$got" == "$want" ]]; then
        break
      fi
      sleep 2
    done
    if [[ -z "$got" ]]; then unread=$((unread + 1))
    elif [[ "$got" != "$want" ]]; then wrong+=("$host $device ($guid) has $got at P_Key index 0, not $want")
    fi
  done
  if (( ${#wrong[@]} )); then
    fail "tenant ports without their partition at P_Key index 0 (is another subnet manager master?): ${wrong[*]}"
  fi
  if (( unread )); then note "$unread tenant port(s) could not be read from here within @VERIFY_S@ s: not checked"; fi
}
'''.replace("@VERIFY_S@", str(VERIFY_S))

# On a subnet manager's host: the tenants' partitions.conf, re-read on a hangup where it changed, then each
# tenant port read back from the master (a standby programs nothing).
_STEP = r'''
need systemctl "this host does not run systemd"
[[ -e @UNIT@ ]] || fail "no subnet manager here yet: its fabric step (gpucluster-opensm) runs first"
put_file @PARTITIONS@ 0644 "$(cat @DOC@)" resweep-gpucluster-opensm
resweep
if [[ "$(opensm_state @LOG@)" != MASTER ]]; then
  note "not the master subnet manager: the master checks the tenants' ports"
elif ! command -v smpquery >/dev/null 2>&1; then
  note "smpquery is missing (infiniband-diags): the tenants' ports are not checked"
else
  check_tenant_ports <<<"$(cat @PORTS@)"
fi
'''


def render_partition_step(spec: ClusterSpec, hostname: str, guids: Mapping[str, Mapping[str, str]]) -> Script:
    """The partitions step of one subnet manager's host, for the port GUIDs read so far."""
    pkeys, isolated = spec.tenant_pkeys, spec.partitioned_pools
    rails = [(h.hostname, n.device, pkeys[isolated[p.name]] | 0x8000) for p, h in spec.hosts() if p.name in isolated
             for n in sorted(p.nics, key=lambda n: n.rail)]
    ports = [f"{h} {d} {guids[h][d]} {k:#06x}" for h, d, k in rails if d in guids.get(h, {})]
    missing = [f"{h} {d}" for h, d, _ in rails if d not in guids.get(h, {})]
    # A port left out would stay a full member of the shared partitions: no file is written without every one.
    body = call("fail", f"no port GUID reported for {', '.join(missing)}: their fabric step prints `port-guid` "
                        "lines (see its output); the tenants' partitions are not changed") + "\n" if missing else \
        RESWEEP + CHECK_TENANT_PORTS + fill(_STEP, {"DOC": render_partitions(spec, guids), "PORTS": "\n".join(ports)},
                                            UNIT=OPENSM_UNIT, PARTITIONS=PARTITIONS_CONF, LOG=OPENSM_LOG)
    return Script(script(f"Tenant partitions on {hostname}: {len(ports)} isolated port(s)", hostname, body),
                  _leave(spec, hostname))


# The step's delete, where tenants are no longer isolated (after their Nodes are drained, nodes/handover.py): the
# shared partitions, as the subnet manager's own step last wanted them (it leaves them beside the file it does
# not write while this step owns it, and drops them when it writes the file again) or else as they were when
# this step last ran, re-read on a hangup.
_LEAVE = r'''
need systemctl "this host does not run systemd"
if [[ ! -e @UNIT@ ]]; then
  note "no subnet manager here any more: its partitions went with it"
else
  if [[ -e @SHARED@ ]]; then shared=$(cat @SHARED@); else shared=$(cat @DOC@); fi
  put_file @PARTITIONS@ 0644 "$shared" resweep-gpucluster-opensm
  resweep
fi
'''


def _leave(spec: ClusterSpec, hostname: str) -> str:
    return script(f"Tenant partitions leave {hostname}: every port back in the shared partitions", hostname,
                  RESWEEP + fill(_LEAVE, {"DOC": render_partitions(spec)}, UNIT=OPENSM_UNIT, PARTITIONS=PARTITIONS_CONF,
                                 SHARED=SHARED_PARTITIONS))


class FabricPartitions(pulumi.ComponentResource):
    """The tenants' partitions on every subnet manager: `<name>-<sm host>`, after every host whose ports are
    read. Standalone, give it the fabric steps (each prints its rails' port GUIDs) and the SM hosts' targets."""

    TYPE: ClassVar[str] = token("FabricPartitions")

    steps: dict[str, pulumi.Resource]
    """The partitions step of each subnet manager host, by hostname: a host opens to tenants after them."""
    preview: str
    """partitions.conf with `<host:device>` where each port GUID goes (the offline plan's fabric/partitions.conf)."""

    def __init__(self, name: str, spec: ClusterSpec, targets: Mapping[str, SshTarget],
                 reported: Mapping[str, pulumi.Output[str]], ssh_private_key: pulumi.Input[str], *,
                 depends_on: list[pulumi.Resource], opts: pulumi.ResourceOptions | None = None):
        """`targets`: each subnet manager host's SSH target. `reported`: each isolated host's fabric step output
        (its `port-guid` lines). `depends_on`: the steps that wrote the subnet managers' own files, and in a
        GpuCluster the drain of the Nodes whose ports change partition (nodes/handover.py)."""
        reach = fabric_reach(spec)
        super().__init__(self.TYPE, name, {"reach": reach}, with_aliases(self.TYPE, opts))
        self.preview = render_partitions(spec, {h.hostname: {n.device: f"<{h.hostname}:{n.device}>" for n in p.nics}
                                                for p, h in spec.hosts() if h.hostname in reported})
        hosts = sorted(reported)
        read = pulumi.Output.all(*[reported[h] for h in hosts]).apply(
            lambda outs: {h: port_guids(o) for h, o in zip(hosts, outs)})
        self.steps = {}
        for sm in spec.fabric.subnet_managers:
            step = read.apply(lambda g, sm=sm: render_partition_step(spec, sm, g))
            self.steps[sm] = push(f"{name}-{sm}", targets[sm], Script(step.apply(lambda s: s.create), _leave(spec, sm)),
                                  ssh_private_key, parent=self, converge=True, depends_on=depends_on)
        self.register_outputs({"reach": reach, "preview": self.preview})
