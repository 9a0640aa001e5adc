"""Lossless RoCE on leaf and spine switches, one backend per network OS (reference section 2).

Every backend renders the minimal configuration for the fabric's one RoCE priority: DSCP trust and the same
DSCP -> priority map as the hosts, PFC on that priority only, ECN on its queue with the spec's thresholds, CNPs
on their own strict queue, the port MTU and the PFC watchdog. Each is a bash script pushed over SSH like the
host scripts, checking before it changes, so a second run reports nothing. The configuration covers every port
of the switch, so cabling another host changes nothing on it. Destroying the resource leaves the switch as it
is: removing lossless settings under live RDMA traffic would do more harm than keeping them.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, ClassVar, Protocol

from ..bash import call, fill, script
from ..spec.fabric import FabricSpec, RoceSettings, Switch
from ..spec.hardware import Bastion
from ..ssh import Script, SshTarget

if TYPE_CHECKING:
    from .vlans import SwitchVlans


class SwitchBackend(Protocol):
    vendor: ClassVar[str]
    jumbo_mtu_bytes: ClassVar[int]

    def port_name(self, number: int) -> str: ...

    def body(self, switch: Switch, roce: RoceSettings, mtu_bytes: int, ports: list[str]) -> str:
        """The script body (after the shared prelude) that brings the switch to the wanted state."""
        ...

    def vlan_body(self, vlans: SwitchVlans) -> str:
        """The script body that puts each host port in its VLAN and carries the tenants' VLANs (fabric/vlans.py)."""
        ...


def _ranges(ports: list[str], prefix: str) -> str:
    """swp1,swp2,swp3,swp7 -> swp1-3,swp7 when every port is <prefix><n>, else the plain list."""
    if not all(p.startswith(prefix) and p[len(prefix):].isdigit() for p in ports):
        return ",".join(ports)
    groups: list[list[int]] = []
    for n in sorted(int(p[len(prefix):]) for p in ports):
        if groups and n == groups[-1][1] + 1:
            groups[-1][1] = n
        else:
            groups.append([n, n])
    return ",".join(f"{prefix}{a}-{b}" if b > a else f"{prefix}{a}" for a, b in groups)


class Cumulus:
    """NVIDIA Cumulus Linux 5.x through NVUE: `nv set` stages, `nv config apply` applies when something differs."""

    vendor: ClassVar[str] = "cumulus"
    jumbo_mtu_bytes: ClassVar[int] = 9216
    ROCE_TC = 3          # the lossless traffic class NVUE's RoCE mode sets up
    CNP_TC = 6
    BRIDGE = "br_default"    # NVUE's default VLAN-aware bridge

    def port_name(self, number: int) -> str:
        return f"swp{number}"

    def commands(self, roce: RoceSettings, mtu_bytes: int, ports: list[str]) -> list[str]:
        ecn, tc, ifs = roce.ecn, self.ROCE_TC, shlex.quote(_ranges(ports, "swp"))
        out = ["nv set qos roce mode lossless"]
        out += [f"nv set qos mapping default-global dscp {d} switch-priority {p}"
                for d, p in sorted(roce.dscp_priorities.items())]
        if roce.priority != self.ROCE_TC:     # RoCE mode puts PFC on 3; PFC stays on exactly one priority
            out.append(f"nv unset qos pfc default-global switch-priority {self.ROCE_TC}")
        out += [f"nv set qos pfc default-global switch-priority {roce.priority}",
                f"nv set qos egress-queue-mapping default-global switch-priority {roce.priority} traffic-class {tc}",
                f"nv set qos egress-queue-mapping default-global switch-priority {roce.cnp_priority} "
                f"traffic-class {self.CNP_TC}",
                f"nv set qos congestion-control default-global traffic-class {tc} ecn enable",
                f"nv set qos congestion-control default-global traffic-class {tc} min-threshold "
                f"{ecn.min_threshold_kb * 1000}",
                f"nv set qos congestion-control default-global traffic-class {tc} max-threshold "
                f"{ecn.max_threshold_kb * 1000}",
                f"nv set qos congestion-control default-global traffic-class {tc} probability "
                f"{ecn.probability_percent}",
                f"nv set interface {ifs} link mtu {mtu_bytes}"]
        if roce.pfc_watchdog:
            out.append(f"nv set interface {ifs} qos pfc-watchdog state enable")
        return out

    def body(self, switch: Switch, roce: RoceSettings, mtu_bytes: int, ports: list[str]) -> str:
        return self._applied(self.commands(roce, mtu_bytes, ports),
                             f"applied lossless RoCE: priority {roce.priority}, DSCP {roce.dscp}, MTU {mtu_bytes}")

    def vlan_body(self, vlans: SwitchVlans) -> str:
        """The VLANs in the bridge (which its ports carry unless the site restricted them), each host port an
        access port of its VLAN."""
        out = [f"nv set bridge domain {self.BRIDGE} vlan {','.join(map(str, vlans.vlans))}"]
        out += [f"nv set interface {shlex.quote(port)} bridge domain {self.BRIDGE} access {vlan}"
                for port, vlan in vlans.access.items()]
        return self._applied(out, f"tenant VLANs {','.join(map(str, vlans.vlans))}")

    @staticmethod
    def _applied(commands: list[str], what: str) -> str:
        """`commands` staged, then applied where they change something, and saved while owed."""
        return fill(r'''
need nv "this switch does not run NVUE (Cumulus Linux 5.x)"
@COMMANDS@
pending=$(nv config diff)
if [[ -n "$pending" && "$pending" != "{}" ]]; then
  printf '%s\n' "$pending"
  owe save-config
  nv config apply -y >/dev/null
  changed @WHAT@
fi
if owed save-config; then nv config save >/dev/null; paid save-config; fi
'''.replace("@COMMANDS@", "\n".join(commands)), WHAT=what)


class Sonic:
    """SONiC: CONFIG_DB read with sonic-db-cli, changed with the `config` CLI, then `config save`.

    The stock AZURE map sends DSCP 26 to lossy TC1 and enables PFC on 3 and 4; both are corrected here. Port
    names follow the platform's lanes per port and breakouts (Ethernet0, Ethernet4 or Ethernet8...), so they come
    from the switch's own PORT table, checked against the spec before anything changes.
    """

    vendor: ClassVar[str] = "sonic"
    jumbo_mtu_bytes: ClassVar[int] = 9100
    FROM_PORT_TABLE = "@port-table@"        # no port_names in the spec: the switch's PORT table names them

    def port_name(self, number: int) -> str:
        return self.FROM_PORT_TABLE

    def body(self, switch: Switch, roce: RoceSettings, mtu_bytes: int, ports: list[str]) -> str:
        ecn = roce.ecn
        maps = "\n".join(f"dscp_tc {d} {p}" for d, p in sorted(roce.dscp_priorities.items()))
        watchdog = r'''
  if [[ -z "$(sonic-db-cli CONFIG_DB hget "PFC_WD|$1" action)" ]]; then
    saving config pfcwd start --action drop "$1" 200 --restoration-time 200
    changed "$1: PFC watchdog (drop)"
  fi''' if roce.pfc_watchdog else ""
        if set(ports) == {self.FROM_PORT_TABLE}:
            pick = fill('ports=("${table[@]}")\n(( ${#ports[@]} == @COUNT@ )) || fail "the PORT table lists '
                        '${#ports[@]} ports but the spec says @COUNT@ (ports): correct ports, or list port_names '
                        'for a breakout"', COUNT=len(ports))
        else:
            pick = "ports=(" + call(*ports) + ")"
        return fill(r'''
need config "this switch does not run SONiC"
need sonic-db-cli "this switch does not run SONiC"
# --- every port checked against the switch's PORT table first: nothing global changes for a wrong name ---
mapfile -t table < <(sonic-db-cli CONFIG_DB keys 'PORT|*' | sed 's/^PORT|//' | sort -V)
(( ${#table[@]} )) || fail "CONFIG_DB has no PORT table"
@PICK@
for port in "${ports[@]}"; do
  [[ " ${table[*]} " == *" $port "* ]] || fail "port $port is not in this switch's PORT table (${table[*]:0:4} ...): correct port_names"
done
# saving COMMAND...: a change to the running configuration, which owes a save to config_db.json
saving() { owe save-config; "$@"; }
dscp_tc() {
  if [[ "$(sonic-db-cli CONFIG_DB hget 'DSCP_TO_TC_MAP|AZURE' "$1")" != "$2" ]]; then
    saving sonic-db-cli CONFIG_DB hset 'DSCP_TO_TC_MAP|AZURE' "$1" "$2" >/dev/null
    changed "DSCP $1 -> traffic class $2"
  fi
}
roce_port() {
  local pfc prio
  pfc=$(sonic-db-cli CONFIG_DB hget "PORT_QOS_MAP|$1" pfc_enable)
  if [[ "$pfc" != @PRIO@ ]]; then
    for prio in ${pfc//,/ }; do
      if [[ "$prio" != @PRIO@ ]]; then saving config interface pfc priority "$1" "$prio" off; fi
    done
    if [[ ",$pfc," != *,@PRIO@,* ]]; then saving config interface pfc priority "$1" @PRIO@ on; fi
    changed "$1: PFC on priority @PRIO@ only (was ${pfc:-none})"
  fi
  if [[ "$(sonic-db-cli CONFIG_DB hget "PORT|$1" mtu)" != @MTU@ ]]; then
    saving config interface mtu "$1" @MTU@
    changed "$1: MTU @MTU@"
  fi@WATCHDOG@
}
@MAPS@
wred=$(sonic-db-cli CONFIG_DB hget 'WRED_PROFILE|AZURE_LOSSLESS' green_min_threshold),$(sonic-db-cli CONFIG_DB hget 'WRED_PROFILE|AZURE_LOSSLESS' green_max_threshold),$(sonic-db-cli CONFIG_DB hget 'WRED_PROFILE|AZURE_LOSSLESS' green_drop_probability)
if [[ "$wred" != @WRED@ ]]; then
  saving config ecn -profile AZURE_LOSSLESS -gmin @GMIN@ -gmax @GMAX@ -gdrop @GDROP@
  changed "ECN thresholds @GMIN@/@GMAX@ bytes, @GDROP@% (was $wred)"
fi
for port in "${ports[@]}"; do roce_port "$port"; done
# saved while owed: a run cut off between a change and the save saves on the next run
if owed save-config; then config save -y >/dev/null; paid save-config; note "saved to /etc/sonic/config_db.json"; fi
'''.replace("@MAPS@", maps).replace("@WATCHDOG@", watchdog).replace("@PICK@", pick),
                    PRIO=roce.priority, MTU=mtu_bytes, GMIN=ecn.min_threshold_kb * 1000,
                    GMAX=ecn.max_threshold_kb * 1000, GDROP=ecn.probability_percent,
                    WRED=f"{ecn.min_threshold_kb * 1000},{ecn.max_threshold_kb * 1000},{ecn.probability_percent}")


    def vlan_body(self, vlans: SwitchVlans) -> str:
        """Each VLAN created, each host port an untagged member of its VLAN alone, each trunk port a tagged member
        of the tenants' VLANs (SONiC ports carry only the VLANs they are members of). Checked against the PORT
        table first, and against CONFIG_DB before each change, as `config vlan` refuses a member twice."""
        access = "\n".join(call("access", port, vlan) for port, vlan in vlans.access.items())
        tagged = "\n".join(call("tagged", port, vlan) for port in vlans.trunks for vlan in vlans.tagged)
        return fill(r'''
need config "this switch does not run SONiC"
need sonic-db-cli "this switch does not run SONiC"
mapfile -t table < <(sonic-db-cli CONFIG_DB keys 'PORT|*' | sed 's/^PORT|//' | sort -V)
ports=(@PORTS@)
for port in "${ports[@]}"; do
  [[ " ${table[*]} " == *" $port "* ]] || fail "port $port is not in this switch's PORT table (${table[*]:0:4} ...): correct port_names"
done
saving() { owe save-config; "$@"; }
vlan_up() {
  if [[ -z "$(sonic-db-cli CONFIG_DB hget "VLAN|Vlan$1" vlanid)" ]]; then
    saving config vlan add "$1"
    changed "VLAN $1"
  fi
}
# untagged_of PORT: the VLAN PORT is an untagged member of (none: empty)
untagged_of() {
  local key
  while read -r key; do
    [[ -n "$key" ]] || continue
    if [[ "$(sonic-db-cli CONFIG_DB hget "$key" tagging_mode)" == untagged ]]; then
      key=${key#VLAN_MEMBER|Vlan}
      printf '%s\n' "${key%%|*}"
    fi
  done < <(sonic-db-cli CONFIG_DB keys "VLAN_MEMBER|*|$1")
}
access() {
  local now
  now=$(untagged_of "$1")
  if [[ "$now" != "$2" ]]; then
    if [[ -n "$now" ]]; then saving config vlan member del "$now" "$1"; fi
    saving config vlan member add -u "$2" "$1"
    changed "$1: VLAN $2 (was ${now:-none})"
  fi
}
tagged() {
  if [[ -z "$(sonic-db-cli CONFIG_DB hget "VLAN_MEMBER|Vlan$2|$1" tagging_mode)" ]]; then
    saving config vlan member add "$2" "$1"
    changed "$1: carries VLAN $2 tagged"
  fi
}
@VLANS@
@ACCESS@
@TAGGED@
if owed save-config; then config save -y >/dev/null; paid save-config; note "saved to /etc/sonic/config_db.json"; fi
'''.replace("@ACCESS@", access).replace("@TAGGED@", tagged)
            .replace("@PORTS@", call(*vlans.access, *vlans.trunks))
            .replace("@VLANS@", "\n".join(call("vlan_up", v) for v in vlans.vlans)))


class Eos:
    """Arista EOS through a configuration session (diffed first, committed only when it changes something).

    The SSH account's shell must be bash (`username NAME shell /bin/bash`), as for any scripted EOS change.
    """

    vendor: ClassVar[str] = "eos"
    jumbo_mtu_bytes: ClassVar[int] = 9214
    PROFILE = "GPUCLUSTER-ROCE"

    def port_name(self, number: int) -> str:
        return f"Ethernet{number}"

    def config(self, roce: RoceSettings, mtu_bytes: int, ports: list[str]) -> str:
        ecn = roce.ecn
        lines = [f"qos map dscp {d} to traffic-class {p}" for d, p in sorted(roce.dscp_priorities.items())]
        # EOS merges a session into the running configuration: a priority an earlier class made lossless stays
        # so unless set back to drop (the form Arista's AVD renders for `no_drop: false`).
        lines += [f"qos profile {self.PROFILE}", "   qos trust dscp", "   priority-flow-control on",
                  *(f"   priority-flow-control priority {p} {'no-drop' if p == roce.priority else 'drop'}"
                    for p in range(8))]
        if roce.pfc_watchdog:
            lines.append("   priority-flow-control pause watchdog")
        lines += [f"   uc-tx-queue {roce.priority}",
                  f"      random-detect ecn minimum-threshold {ecn.min_threshold_kb} kbytes maximum-threshold "
                  f"{ecn.max_threshold_kb} kbytes max-mark-probability {ecn.probability_percent} weight 0",
                  f"   uc-tx-queue {roce.cnp_priority}", "      priority strict",
                  f"interface {_ranges(ports, 'Ethernet')}", f"   mtu {mtu_bytes}",
                  f"   service-profile {self.PROFILE}"]
        if roce.pfc_watchdog:
            lines.append("priority-flow-control pause watchdog action drop")
        return "\n".join(lines)

    def body(self, switch: Switch, roce: RoceSettings, mtu_bytes: int, ports: list[str]) -> str:
        return self._committed("gpucluster-roce", self.config(roce, mtu_bytes, ports),
                               f"committed lossless RoCE: priority {roce.priority}, DSCP {roce.dscp}, MTU {mtu_bytes}")

    def vlan_body(self, vlans: SwitchVlans) -> str:
        """The VLANs created (trunks carry every VLAN unless the site restricted them), each host port an
        access port of its VLAN."""
        lines = [f"vlan {v}" for v in vlans.vlans]
        for port, vlan in vlans.access.items():
            lines += [f"interface {port}", "   switchport mode access", f"   switchport access vlan {vlan}"]
        return self._committed("gpucluster-vlans", "\n".join(lines),
                               f"committed tenant VLANs {','.join(map(str, vlans.vlans))}")

    @staticmethod
    def _committed(session: str, config: str, what: str) -> str:
        """`config` diffed in a configuration session, committed where it changes something, saved while owed."""
        return fill(r'''
need FastCli "log in to EOS as an account whose shell is bash (username NAME shell /bin/bash)"
config=$(cat @CONFIG_DOC@)
diffs=$(FastCli -p 15 -c "configure session @SESSION@
$config
show session-config diffs
abort")
if grep -Eq '^[+-][^+-]' <<<"$diffs"; then
  printf '%s\n' "$diffs"
  owe save-config
  FastCli -p 15 -c "configure session @SESSION@
$config
commit" >/dev/null
  changed @WHAT@
fi
if owed save-config; then FastCli -p 15 -c "copy running-config startup-config" >/dev/null; paid save-config; fi
'''.replace("@SESSION@", session), {"CONFIG_DOC": config}, WHAT=what)


BACKENDS: dict[str, SwitchBackend] = {b.vendor: b for b in (Cumulus(), Sonic(), Eos())}


def switch_ports(switch: Switch, backend: SwitchBackend) -> list[str]:
    return list(switch.port_names) or [backend.port_name(n) for n in range(1, switch.ports + 1)]


def switch_target(switch: Switch, bastion: Bastion | None) -> SshTarget:
    """Where a switch's steps are pushed: its management address, on port 22."""
    return SshTarget(switch.address, switch.ssh_user, 22, switch.host_key, bastion)


def switch_mtu_bytes(switch: Switch) -> int:
    """The port MTU a managed switch gets: the spec's, else its vendor's jumbo frame size."""
    return switch.mtu_bytes or BACKENDS[switch.vendor].jumbo_mtu_bytes


def render_switch(switch: Switch, fabric: FabricSpec) -> Script:
    roce = fabric.effective_roce
    assert roce is not None and switch.vendor in BACKENDS, "the spec allows managed switches only on RoCE backends"
    backend = BACKENDS[switch.vendor]
    body = backend.body(switch, roce, switch_mtu_bytes(switch), switch_ports(switch, backend))
    return Script(script(f"Lossless RoCE on {switch.role} {switch.name} ({switch.vendor})", switch.name, body))
