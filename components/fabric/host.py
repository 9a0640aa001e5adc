"""One fabric script per host (../shared/reference/node-commands.md, sections 1, 3 and 4).

None of the RoCE or IPoIB runtime settings survive a reboot or driver reload, so the script installs an apply
script and a boot unit that runs it, then runs it now: the same code path at push and at boot. The apply script
checks every NIC before it changes anything, and reads what it cannot know from the device (the RoCEv2 GID
index, the port GUID). On InfiniBand subnet-manager hosts the push also sets up OpenSM first, so the ports
become Active before they are checked.
"""

from __future__ import annotations

import shlex
from typing import Mapping, Sequence

from ..bash import call, fill, script
from ..spec import ClusterSpec
from ..spec.hardware import Nic
from ..spec.storage import SLOWEST_HCA_GBPS
from ..ssh import Script
from .nccl import NCCL_CONF, render_nccl_conf

APPLY = "/usr/local/sbin/gpucluster-fabric"
# Stands for the host's name in the boot script's text until the host puts its own in (see render_fabric_host).
HOST_MARK = "__GPUCLUSTER_HOST__"
APPLY_UNIT = "/etc/systemd/system/gpucluster-fabric.service"
OPENSM_CONF = "/etc/opensm/opensm.conf"
PARTITIONS_CONF = "/etc/opensm/partitions.conf"
# The shared partitions the subnet manager's step wants while the tenants' partitions step owns partitions.conf:
# what that step's delete puts in when tenants are no longer isolated (fabric/partitions.py).
SHARED_PARTITIONS = "/etc/opensm/gpucluster-shared-partitions.conf"
OPENSM_LOG = "/var/log/opensm.log"
OPENSM_UNIT = "/etc/systemd/system/gpucluster-opensm.service"
BOOT_WAIT_S = 180          # at boot, NICs and the SM can take minutes to come up
PUSH_WAIT_S = 60           # InfiniBand ports wait this long for the SM's sweep, even at push time
IB_MTU_CODES = {256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5}             # IBTA encodings in partitions.conf
IB_RATE_CODES = {40: 7, 56: 12, 100: 16, 200: 17, 400: 21, 800: 23}  # IBTA rate encodings (enum ibv_rate)

# The apply script's arguments: how long to wait for NICs, and `all` (at boot, on a host no pod uses, in the
# rollout's step) or `in-place`: what bounces links (MTU, trust, PFC, global pause) is not applied but owed
# (`restart-fabric`), for the node's preparation to apply where no tenant works or to leave to the rollout.
_COMMON = r'''
WAIT_S=${1:-0} MODE=${2:-all}
[[ $MODE == all || $MODE == in-place ]] || fail "usage: $0 [WAIT_S] [all|in-place]"
bounce_due=()
# may_bounce WHAT: a setting that bounces the link may change now (else it is noted as due, for later)
may_bounce() { if [[ $MODE == all ]]; then return 0; fi; bounce_due+=("$1"); return 1; }
wait_for() { local i=0; while [[ ! -e "$1" ]] && (( i < WAIT_S )); do sleep 1; i=$((i + 1)); done; }
# check_nic DEVICE INTERFACE RAIL LINK_LAYER: present, of the right kind, and paired as the spec says
check_nic() {
  wait_for "/sys/class/net/$2"
  wait_for "/sys/class/infiniband/$1"
  [[ -d "/sys/class/net/$2" ]] || fail "NIC $2 (rail $3, $1) not found: check nics[].interface against 'ip link'"
  [[ -d "/sys/class/infiniband/$1" ]] ||
    fail "RDMA device $1 (rail $3, $2) not found: load the mlx5_ib driver (DOCA-OFED) or fix nics[].device"
  local layer
  layer=$(cat "/sys/class/infiniband/$1/ports/1/link_layer" 2>/dev/null || echo unknown)
  [[ "$layer" == "$4" ]] || fail "$1 ($2, rail $3) has link layer $layer, not $4: set the port type with mlxconfig (LINK_TYPE_P1) or fix fabric.kind"
  [[ -e "/sys/class/infiniband/$1/device/net/$2" ]] || fail "$2 is not a port of $1 (rail $3): fix the pairing in nics[] (see ibdev2netdev)"
}
set_mtu() {
  local mtu
  mtu=$(ip -o link show dev "$1" | sed -n 's/.* mtu \([0-9][0-9]*\) .*/\1/p')
  if [[ "$mtu" != "$2" ]] && may_bounce "$1: MTU ${mtu:-unknown} -> $2"; then
    ip link set dev "$1" mtu "$2"
    changed "$1: MTU ${mtu:-unknown} -> $2"
  fi
}
'''

_ROCE = r'''
# set_sysfs FILE VALUE WHAT: OFED-only knobs are skipped, with a note, when the driver lacks them
set_sysfs() {
  if [[ ! -e "$1" ]]; then note "no $1 (inbox driver?): $3 stays at the default"; return 0; fi
  local now
  now=$(cat "$1")
  if [[ "$now" != "$2" && "$now" != *"=$2" ]]; then echo "$2" > "$1"; changed "$3"; fi
}
# roce_nic DEVICE INTERFACE: lossless RoCEv2 on one NIC
roce_nic() {
  local dev=$1 if=$2 qos trust pfc pause point
  set_mtu "$if" @MTU@
  qos=$(mlnx_qos -i "$if")
  trust=$(printf '%s\n' "$qos" | sed -n 's/^Priority trust state: *//p')
  if [[ "$trust" != dscp ]] && may_bounce "$if: trust ${trust:-unknown} -> dscp"; then
    mlnx_qos -i "$if" --trust dscp >/dev/null
    changed "$if: trust DSCP (was ${trust:-unknown})"
    qos=$(mlnx_qos -i "$if")
  fi
  pfc=$(printf '%s\n' "$qos" | awk '$1 == "enabled" { $1 = ""; gsub(/ /, ""); print; exit }')
  if [[ "$pfc" != @PFC_BITS@ ]] && may_bounce "$if: PFC ${pfc:-unknown} -> @PFC_BITS@"; then
    mlnx_qos -i "$if" --pfc @PFC@ >/dev/null
    changed "$if: PFC on priority @PRIO@ only (was ${pfc:-unknown})"
  fi
  @DSCP_MAP@
  for point in roce_np roce_rp; do
    set_sysfs "/sys/class/net/$if/ecn/$point/enable/@PRIO@" 1 "$if: ECN $point on priority @PRIO@"
  done
  set_sysfs "/sys/class/net/$if/ecn/roce_np/cnp_dscp" @CNP_DSCP@ "$if: CNPs marked DSCP @CNP_DSCP@"
  set_sysfs "/sys/class/net/$if/ecn/roce_np/cnp_802p_prio" @CNP_PRIO@ "$if: CNPs on priority @CNP_PRIO@"
  pause=$(ethtool -a "$if" 2>/dev/null | awk '$1 == "RX:" || $1 == "TX:" { printf "%s", $2 }' || true)
  if [[ -n "$pause" && "$pause" != offoff ]] && may_bounce "$if: global pause off"; then
    ethtool -A "$if" autoneg off rx off tx off
    changed "$if: global pause off (PFC replaces it)"
  fi
  local cma=/sys/kernel/config/rdma_cm
  if [[ ! -d $cma ]]; then
    modprobe rdma_cm 2>/dev/null || true
    mountpoint -q /sys/kernel/config || mount -t configfs none /sys/kernel/config
  fi
  [[ -d $cma ]] || fail "$cma is missing: load the rdma_cm module"
  [[ -d "$cma/$dev" ]] || mkdir "$cma/$dev"
  set_sysfs "$cma/$dev/ports/1/default_roce_mode" "RoCE v2" "$dev: RDMA-CM uses RoCE v2"
  set_sysfs "$cma/$dev/ports/1/default_roce_tos" @TOS@ "$dev: RDMA-CM ToS @TOS@"
  set_sysfs "/sys/class/infiniband/$dev/tc/1/traffic_class" @TOS@ "$dev: traffic class @TOS@ for every QP"
}
# rdma_dev INTERFACE: the RDMA device whose port the interface is (a filesystem NIC, named by interface only)
rdma_dev() {
  wait_for "/sys/class/net/$1"
  local devs=("/sys/class/net/$1/device/infiniband/"*)
  [[ -d "${devs[0]}" ]] || fail "$1 has no RDMA device (nothing in /sys/class/net/$1/device/infiniband): the filesystem's RDMA traffic needs an RDMA NIC there; fix storage.server_interface or storage.client_interface"
  printf '%s\n' "${devs[0]##*/}"
}
# dscp_prio INTERFACE DSCP PRIORITY
dscp_prio() {
  local qos
  qos=$(mlnx_qos -i "$1")       # not piped into grep -q: its early exit would fail the pipe (SIGPIPE)
  if ! grep -Eq "prio:$3 dscp:([0-9]+,)*$(printf %02d "$2")," <<<"$qos"; then
    mlnx_qos -i "$1" --dscp2prio "set,$2,$3" >/dev/null
    changed "$1: DSCP $2 -> priority $3"
  fi
}
# gid_index DEVICE: the first IPv4 RoCE v2 GID (index 1 is link-local IPv6 and not routable)
gid_index() {
  local port=/sys/class/infiniband/$1/ports/1 i
  while read -r i; do
    [[ "$(cat "$port/gid_attrs/types/$i" 2>/dev/null)" == "RoCE v2" ]] || continue
    if [[ "$(cat "$port/gids/$i")" == 0000:0000:0000:0000:0000:ffff:* ]]; then echo "$i"; return 0; fi
  done < <(find "$port/gid_attrs/types" -mindepth 1 -maxdepth 1 -printf '%f\n' | sort -n)
}
'''

_IB = r'''
# ib_nic DEVICE INTERFACE RATE_GBPS: the port is Active at its rate (an SM has swept it), IPoIB in datagram mode
ib_nic() {
  local dev=$1 if=$2 state="" rate i
  for ((i = 0; i <= PORT_WAIT_S; i++)); do
    state=$(ibstat "$dev" 1 | sed -n 's/^[[:space:]]*State: *//p')
    [[ "$state" != Active ]] || break
    if (( i < PORT_WAIT_S )); then sleep 1; fi
  done
  [[ "$state" == Active ]] || fail "$dev port 1 is ${state:-unknown}, not Active after ${PORT_WAIT_S}s: no subnet manager has brought it up (is opensm running on fabric.infiniband.subnet_managers?), or the link is down"
  rate=$(ibstat "$dev" 1 | sed -n 's/^[[:space:]]*Rate: *//p')
  [[ "$rate" == "$3" ]] || fail "$dev runs at ${rate:-unknown} Gb/s but nics[] says $3: check the cable, transceiver and switch port"
  if [[ -e "/sys/class/net/$if/mode" && "$(cat "/sys/class/net/$if/mode")" != datagram ]]; then
    echo datagram > "/sys/class/net/$if/mode"
    changed "$if: IPoIB datagram mode"
  fi
  set_mtu "$if" @IPOIB_MTU@
}
# ipoib_child PARENT PKEY: the partition's IPoIB interface, named <parent>.<pkey> as the kernel does
ipoib_child() {
  local child="$1.${2#0x}"
  if ! ip link show dev "$child" >/dev/null 2>&1; then
    ip link add link "$1" name "$child" type ipoib pkey "$2"
    changed "$child: IPoIB interface for partition $2"
  fi
  set_mtu "$child" @IPOIB_MTU@
  ip link set dev "$child" up
}
PORT_WAIT_S=$(( WAIT_S > @PUSH_WAIT@ ? WAIT_S : @PUSH_WAIT@ ))
'''

# port_guid DEVICE: the port's GUID as ibstat reads it from the device, reported for the partitions step (an
# isolated pool's hosts only)
_PORT_GUID = r'''
port_guid() {
  local guid
  guid=$(ibstat "$1" 1 | sed -n 's/^[[:space:]]*Port GUID: *//p')
  [[ "$guid" =~ ^0x[0-9a-f]{16}$ && "$guid" != 0x0000000000000000 ]] ||
    fail "$1: ibstat shows no port GUID (${guid:-none}): is mlx5_ib loaded and the firmware's GUID set?"
  note "port-guid $1 $guid"
}
'''

_NCCL = r'''
# --- NCCL: the settings above, as NCCL reads them (KEY=VALUE, no quotes) -------------------------------
conf=$(cat @NCCL_DOC@)
@GID@
put_file @NCCL_CONF@ 0644 "$conf"
'''

_GID = r'''gids=()
for dev in @DEVICES@; do gids+=("$(gid_index "$dev")"); done
if [[ -n "${gids[0]}" && "$(printf '%s\n' "${gids[@]}" | sort -u | wc -l)" -eq 1 ]]; then
  conf+=$'\n'"NCCL_IB_GID_INDEX=${gids[0]}"
else
  note "RoCE v2 IPv4 GID index differs between NICs or is missing (${gids[*]:-none}): NCCL picks it itself"
fi'''

# sm_master: the fabric's master subnet manager as "LID DESCRIPTION" (its node's description, as OpenSM and
# UFM set it: the host name first), or nothing (exit 1) when the fabric has none. Parses infiniband-diags'
# own output (sminfo: "sminfo: sm lid N sm guid ...", smpquery: "Node Description:....NAME"), checked against
# the real programs over a simulated fabric (ibsim) in the tests.
SM_MASTER = r'''
sm_master() {
  local master lid desc
  master=$(timeout 30 sminfo 2>/dev/null) || return 1
  lid=$(printf '%s\n' "$master" | sed -n 's/^sminfo: sm lid \([0-9]*\) .*/\1/p')
  [[ -n "$lid" ]] || return 1
  desc=$(timeout 30 smpquery nodedesc "$lid" 2>/dev/null | sed -n 's/^Node Description:\.*//p' || true)
  printf '%s %s\n' "$lid" "$desc"
}
'''

# opensm_up LOG FROM: OpenSM, just (re)started, took its files: its log after byte FROM says it is master
# ("SUBNET UP") or standby within OPENSM_UP_S. A partitions.conf it cannot parse does not stop OpenSM: it runs
# the default partition alone and says so only in its log ("Partition configuration in error"), so that fails
# the step. No sign at all is not a verdict on the fabric: noted, the step goes on.
OPENSM_UP_S = 60
OPENSM_UP = r'''
opensm_up() {
  local waited size new start=$(( $2 + 1 ))
  for ((waited = 0; waited < @UP_S@; waited++)); do
    size=$(stat -c %s "$1" 2>/dev/null || echo 0)
    if (( size < $2 )); then start=1; fi
    new=$(tail -c +"$start" "$1" 2>/dev/null || true)
    if grep -q "Partition configuration in error" <<<"$new"; then
      fail "OpenSM could not parse @PARTITIONS@ and runs the default partition alone: $(grep 'PARSE ERROR' <<<"$new" | head -n 3 | tr '\n' ' ')(see $1)"
    fi
    if grep -qE "SUBNET UP|Entering STANDBY state" <<<"$new"; then return 0; fi
    sleep 1
  done
  note "OpenSM said neither master nor standby in $1 within @UP_S@ s: its partitions are not checked"
}
# opensm_state LOG: the state OpenSM last entered (MASTER, STANDBY, DISCOVERING...), as its log says
opensm_state() { grep -oE "Entering [A-Z-]+ state" "$1" 2>/dev/null | tail -n 1 | cut -d' ' -f2 || true; }
'''.replace("@UP_S@", str(OPENSM_UP_S))

# resweep: where partitions.conf changed (owed), OpenSM re-reads it on a hangup (the unit's ExecReload). A standby
# sweeps nothing (it reads the partitions when it takes over); the master's sweep must take them.
RESWEEP = fill(OPENSM_UP + r'''
resweep() {
  owed resweep-gpucluster-opensm || return 0
  local from
  from=$(stat -c %s @LOG@ 2>/dev/null || echo 0)
  systemctl reload gpucluster-opensm
  if [[ "$(opensm_state @LOG@)" != STANDBY ]]; then opensm_up @LOG@ "$from"; fi
  paid resweep-gpucluster-opensm
  changed "the subnet manager re-read @PARTITIONS@ (a heavy sweep on SIGHUP, not a restart)"
}
''', LOG=OPENSM_LOG, PARTITIONS=PARTITIONS_CONF)

_OPENSM = SM_MASTER + RESWEEP + r'''
# --- subnet manager: OpenSM with the spec's priority and partitions --------------------------------------
need opensm "install the opensm package"
# An existing master (UFM, a switch's SM) is never taken over silently: a second SM at priority 15 would.
if ! systemctl is-active --quiet gpucluster-opensm; then
  need sminfo "install infiniband-diags"
  if master=$(sm_master); then
    lid=${master%% *} desc=${master#* }
    owner=${desc%% *} ours=@OURS@ take_over=@TAKE_OVER@
    case " $ours " in
      *" $owner "*) ;;
      *) if [[ "$take_over" != yes ]]; then
           fail "a subnet manager is already master of this fabric (lid $lid, '${desc:-unknown node}': UFM or a switch SM?); use it and remove fabric.infiniband.subnet_managers, or set fabric.infiniband.take_over_existing_sm: true"
         fi
         note "taking over from the master subnet manager at lid $lid ('$desc'), as the spec allows" ;;
    esac
  fi
fi
conf=$(cat @CONF_DOC@)
gid0=$(cat /sys/class/infiniband/@DEV@/ports/1/gids/0 2>/dev/null || true)
if [[ -n "$gid0" ]]; then conf+=$'\n'"guid 0x$(printf '%s' "$gid0" | cut -d: -f5-8 | tr -d :)"; fi
put_file @CONF@ 0644 "$conf" restart-gpucluster-opensm
# OpenSM re-reads its partitions at every heavy sweep, which a hangup starts: a partition change needs no restart
# (which would hand mastership to the standby and back, each with a full sweep)
# A file with a tenant's partition (`indx0`: only the tenants' partitions step writes one) is that step's, whatever
# this spec says (it has the hosts' port GUIDs; where isolation ends, its delete puts the shared partitions in,
# after the tenants' Nodes are drained): left as it is, the shared partitions kept beside it for that delete.
shared=$(cat @PARTITIONS_DOC@)
if grep -q '^tenant-.*, indx0,' @PARTITIONS@ 2>/dev/null; then
  put_file @SHARED@ 0644 "$shared"
  note "@PARTITIONS@ holds the tenants' partitions, which their partitions step writes"
else
  put_file @PARTITIONS@ 0644 "$shared" resweep-gpucluster-opensm
  drop_file @SHARED@
fi
put_file @UNIT@ 0644 "$(cat @UNIT_DOC@)" restart-gpucluster-opensm
for other in opensm opensmd; do
  if systemctl is-enabled --quiet "$other" 2>/dev/null; then
    systemctl disable --now "$other" >/dev/null
    changed "disabled $other: gpucluster-opensm runs the subnet manager now"
  fi
done
if [[ "$(systemctl is-enabled gpucluster-opensm 2>/dev/null || true)" != enabled ]]; then
  systemctl enable gpucluster-opensm >/dev/null
  changed "enabled gpucluster-opensm"
fi
# restarted while owed (files changed since it started, in this run or in one cut off), started when stopped
if owed restart-gpucluster-opensm || ! systemctl is-active --quiet gpucluster-opensm; then
  from=$(stat -c %s @LOG@ 2>/dev/null || echo 0)
  systemctl daemon-reload
  systemctl restart gpucluster-opensm
  opensm_up @LOG@ "$from"
  paid restart-gpucluster-opensm
  paid resweep-gpucluster-opensm
  changed "started the subnet manager (priority @PRIORITY@)"
else
  resweep
fi
'''

# A host that is no longer a subnet manager stops the one this tool set up (its unit is ours by name).
_NO_OPENSM = r'''
if [[ -e @UNIT@ ]] || owed stop-gpucluster-opensm; then
  owe stop-gpucluster-opensm
  systemctl disable --now gpucluster-opensm >/dev/null 2>&1 || true
  paid restart-gpucluster-opensm
  paid resweep-gpucluster-opensm
  for f in @CONF@ @PARTITIONS@ @SHARED@ @UNIT@; do drop_file "$f"; done
  systemctl daemon-reload
  paid stop-gpucluster-opensm
  changed "stopped the subnet manager: this host is not one of fabric.infiniband.subnet_managers"
fi
'''

_PUSH = r'''
need systemctl "this host does not run systemd"
@SM@
# --- the settings, applied now and by a boot unit (none of them persist on their own) ------------------
# the host's own name goes in here, so that this part is the same text on every host of a pool (ssh.Lib)
apply_doc=$(cat @APPLY_DOC@)
put_file @APPLY@ 0755 "${apply_doc//@HOST_MARK@/$HOST}"
put_file @UNIT@ 0644 "$(cat @UNIT_DOC@)" reload-units
if owed reload-units; then systemctl daemon-reload; paid reload-units; fi
if [[ "$(systemctl is-enabled gpucluster-fabric 2>/dev/null || true)" != enabled ]]; then
  systemctl enable gpucluster-fabric >/dev/null
  changed "enabled gpucluster-fabric at boot"
fi
run_fabric @MODE@
'''

# run_fabric MODE: the installed settings applied now (waiting for no NIC: the host runs); their lines and change
# count become the caller's. Also in the node's preparation and rollout step, which pay `restart-fabric`.
RUN_FABRIC = fill(r'''
run_fabric() {
  local out applied
  if ! out=$(@APPLY@ 0 "$1"); then
    printf '%s\n' "$out"
    fail "the fabric settings were not applied (see the error above)"
  fi
  printf '%s\n' "$out" | grep -v ' change(s)$' || true
  applied=$(printf '%s\n' "$out" | sed -n 's/^.*: \([0-9][0-9]*\) change(s)$/\1/p')
  CHANGES=$((CHANGES + ${applied:-0}))
}
''', APPLY=APPLY)

# What bounces links stays owed until it is applied: on a busy node the rollout drains it first.
_BOUNCE = r'''
# --- settings that bounce links: applied above (all), or owed (in-place) ------------------------------
if (( ${#bounce_due[@]} )); then
  owe restart-fabric
  note "due where no tenant works (they bounce links): ${bounce_due[*]}"
else
  paid restart-fabric
fi
'''


def _apply_unit() -> str:
    # Before kubelet: a node takes no pods until its fabric is set. Retried without limit: an InfiniBand port
    # that is not Active yet (the subnet manager still sweeping) fails one attempt, not the boot for good.
    return ("[Unit]\nDescription=RoCE/InfiniBand host settings and NCCL config (gpucluster)\n"
            "Wants=network-online.target\nAfter=network-online.target openibd.service\nBefore=kubelet.service\n"
            "StartLimitIntervalSec=0\n\n"
            f"[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart={APPLY} {BOOT_WAIT_S}\n"
            "Restart=on-failure\nRestartSec=30\n\n"
            "[Install]\nWantedBy=multi-user.target")


def ipoib_group_rate_gbps(spec: ClusterSpec) -> int:
    """The IPoIB groups' rate: the slowest member port's. OpenSM refuses a join from a port slower than the
    group (osm_sa_mcmember_record.c), which locks that port out of IPoIB and LNet with it; storage servers'
    HCAs are often a generation behind the GPU NICs."""
    ib = spec.fabric.infiniband
    assert ib is not None
    speeds = [n.speed_gbps for p in spec.node_pools for n in p.nics]
    if spec.storage.kind != "none":
        speeds += [s.link_speed_gbps or SLOWEST_HCA_GBPS for s in spec.storage.servers]
    return min(speeds or [ib.rate_gbps])


def render_partitions(spec: ClusterSpec, guids: Mapping[str, Mapping[str, str]] | None = None) -> str:
    """partitions.conf: the default partition and the spec's IPoIB networks, every shared port a full member;
    with `guids` (host -> device -> port GUID, read from the hosts), each isolated pool's rail ports are limited
    members of those and full members of their tenant's partition, at P_Key index 0 (`indx0`): NCCL and IPoIB
    use index 0 unless told otherwise, and a limited member reaches only full members (IBTA 10.9.1). Omitted:
    no tenant partitions (what a subnet manager starts with before the hosts are read). One port per line:
    OpenSM reads lines of at most 4 KiB, and a definition runs on to its `;` (osm_prtn_config.c)."""
    ib = spec.fabric.infiniband
    assert ib is not None
    flags = f"mtu={IB_MTU_CODES[spec.fabric.effective_mtu_bytes]}, rate={IB_RATE_CODES[ipoib_group_rate_gbps(spec)]}"
    isolated = spec.partitioned_pools if guids is not None else {}
    ports: dict[str, list[str]] = {}          # tenant -> its isolated pools' port GUIDs
    for pool in spec.node_pools:
        if pool.name in isolated:
            for host in pool.hosts:
                found = (guids or {}).get(host.hostname, {})
                ports.setdefault(isolated[pool.name], []).extend(
                    found[n.device] for n in sorted(pool.nics, key=lambda n: n.rail) if n.device in found)
    limited = "".join(f",\n  {g}=limited" for t in sorted(ports) for g in ports[t])

    def members(listed: list[str]) -> str:
        return ",\n".join(f"  {g}=full" for g in listed)

    lines = ["# InfiniBand partitions (generated by gpucluster). IPoIB groups use the fabric MTU, not 2048.",
             f"Default=0x7fff, ipoib, {flags} : ALL=full, ALL_SWITCHES=full, SELF=full{limited} ;"]
    for p in ib.partitions:
        lines.append(f"{p.name}={p.pkey:#06x}, ipoib, {flags} : ALL=full{limited} ;")
    pkeys = spec.tenant_pkeys
    for tenant in sorted(ports):
        if ports[tenant]:
            lines.append(f"tenant-{tenant}={pkeys[tenant]:#06x}, indx0, ipoib, {flags} :\n{members(ports[tenant])} ;")
    return "\n".join(lines)


def render_opensm_conf(spec: ClusterSpec, priority: int) -> str:
    ib = spec.fabric.infiniband
    assert ib is not None
    return "\n".join(["# OpenSM (generated by gpucluster); the port GUID is read from the device",
                      f"sm_priority {priority}", f"routing_engine {ib.routing_engine}",
                      f"partition_config_file {PARTITIONS_CONF}", "sweep_interval 10",
                      f"log_file {OPENSM_LOG}", "force_log_flush TRUE"])     # read as it is written (opensm_up)


def sm_priority(spec: ClusterSpec, hostname: str) -> int | None:
    """15 for the primary, then 14, 13... for standbys (a higher priority wins mastership); None: no SM here."""
    ib = spec.fabric.infiniband
    if ib is None or hostname not in ib.subnet_managers:
        return None
    return 15 - ib.subnet_managers.index(hostname)


def render_apply(spec: ClusterSpec, hostname: str, nics: list[Nic], nccl: dict[str, str],
                 storage_interfaces: Sequence[str] = (), *, isolated: bool = False) -> str:
    """`storage_interfaces`: RoCE NICs of the filesystem's RDMA traffic besides the rails (their RDMA device
    is read on the host), which get the same lossless class. `isolated`: a host of an isolated pool, which
    reports its rails' port GUIDs for its tenant's partition (partitions.py)."""
    fabric = spec.fabric
    nics = sorted(nics, key=lambda n: n.rail)
    roce = fabric.effective_roce
    storage = list(storage_interfaces) if roce is not None else []
    parts = [_COMMON]
    layer = "Ethernet" if roce else "InfiniBand"
    # Every tool the settings use, checked with the NICs: a missing one fails before anything changes.
    tools = []
    if nics or storage:
        tools = ['need ip "install iproute2"', *(
            ['need mlnx_qos "install DOCA-OFED or mlnx-tools (they ship mlnx_qos)"', 'need ethtool "install ethtool"']
            if roce is not None else ['need ibstat "install infiniband-diags"'])]
    checks = "".join(f"{t}\n" for t in tools) + \
        "".join(call("check_nic", n.device, n.interface, n.rail, layer) + "\n" for n in nics) + \
        "".join(f'dev=$({call("rdma_dev", i)})\ncheck_nic "$dev" {call(i, "storage", layer)}\n' for i in storage)
    if roce is not None:
        dscp = "\n  ".join(f'dscp_prio "$if" {d} {p}' for d, p in sorted(roce.dscp_priorities.items()))
        bits = ["1" if i == roce.priority else "0" for i in range(8)]
        parts.append(fill(_ROCE.replace("@DSCP_MAP@", dscp), MTU=fabric.effective_mtu_bytes, PRIO=roce.priority,
                          PFC_BITS="".join(bits), PFC=",".join(bits), CNP_DSCP=roce.cnp_dscp,
                          CNP_PRIO=roce.cnp_priority, TOS=roce.tos))
        body = "".join(call("roce_nic", n.device, n.interface) + "\n" for n in nics) + \
            "".join(f'dev=$({call("rdma_dev", i)})\nroce_nic "$dev" {call(i)}\n' for i in storage)
        gid = fill(_GID.replace("@DEVICES@", call(*(n.device for n in nics)))) if nics else ""
    else:
        parts.append(fill(_IB, IPOIB_MTU=fabric.effective_mtu_bytes - 4, PUSH_WAIT=PUSH_WAIT_S)
                     + (_PORT_GUID if isolated else ""))
        ib = fabric.infiniband
        pkeys = [p.pkey | 0x8000 for p in (ib.partitions if ib else [])]
        body = "".join(call("ib_nic", n.device, n.interface, n.speed_gbps) + "\n"
                       + (call("port_guid", n.device) + "\n" if isolated else "")
                       + "".join(call("ipoib_child", n.interface, f"{k:#06x}") + "\n" for k in pkeys) for n in nics)
        gid = ""
    parts.append("\n# --- every tool and NIC first: nothing changes unless all of them are there --------\n"
                 + checks + "\n# --- then the settings ---\n" + body)
    if nics:                     # a host NCCL runs on (not a storage server or a subnet manager alone)
        parts.append(fill(_NCCL.replace("@GID@", gid), {"NCCL_DOC": render_nccl_conf(nccl).rstrip("\n")},
                          NCCL_CONF=NCCL_CONF))
    parts.append(_BOUNCE)
    return script(f"Fabric settings of {hostname} ({fabric.kind}, {len(nics)} NIC(s)), applied at every boot",
                  hostname, "".join(parts))


def render_fabric_host(spec: ClusterSpec, hostname: str, nics: list[Nic], nccl: dict[str, str],
                       storage_interfaces: Sequence[str] = (), *, in_place: bool = False) -> Script:
    """`in_place`: the host's preparation runs next in the same session and applies what bounces links where
    no tenant works, or leaves it to its pool's rollout (it pays `restart-fabric`). Omitted: applied at once
    (a storage server, a subnet manager, a host this component prepares alone)."""
    priority = sm_priority(spec, hostname)
    ib = spec.fabric.infiniband
    sm = fill(_NO_OPENSM, UNIT=OPENSM_UNIT, CONF=OPENSM_CONF, PARTITIONS=PARTITIONS_CONF, SHARED=SHARED_PARTITIONS)
    if priority is not None and ib is not None:
        first = min(nics, key=lambda n: n.rail).device if nics else "mlx5_0"
        unit = ("[Unit]\nDescription=InfiniBand subnet manager (gpucluster)\nAfter=network.target openibd.service\n\n"
                f"[Service]\nExecStart=/usr/sbin/opensm --config {OPENSM_CONF}\nExecReload=/bin/kill -HUP $MAINPID\n"
                "Restart=on-failure\n\n"
                "[Install]\nWantedBy=multi-user.target")
        sm = fill(_OPENSM, {"CONF_DOC": render_opensm_conf(spec, priority), "PARTITIONS_DOC": render_partitions(spec),
                            "UNIT_DOC": unit},
                  DEV=first, CONF=OPENSM_CONF, PARTITIONS=PARTITIONS_CONF, SHARED=SHARED_PARTITIONS,
                  UNIT=OPENSM_UNIT, PRIORITY=priority,
                  LOG=OPENSM_LOG,
                  OURS=" ".join(ib.subnet_managers), TAKE_OVER="yes" if ib.take_over_existing_sm else "no")
    # A plain host name (the spec's: lowercase letters, digits, '-' and '.') is put into the boot script on
    # the host, so that the push is one text for the pool and the file is byte for byte the one rendered for
    # the host; any other name is rendered in here, quoted.
    name = HOST_MARK if shlex.quote(hostname) == hostname else hostname
    push = RUN_FABRIC + fill(_PUSH.replace("@SM@", sm).replace("@HOST_MARK@", HOST_MARK),
                             {"APPLY_DOC": render_apply(spec, name, nics, nccl, storage_interfaces,
                                                        isolated=hostname in spec.partitioned_hosts).rstrip("\n"),
                              "UNIT_DOC": _apply_unit()},
                             APPLY=APPLY, UNIT=APPLY_UNIT, MODE="in-place" if in_place else "all")
    create = script(f"Fabric of {hostname}: {spec.fabric.kind}"
                    + (f", subnet manager priority {priority}" if priority is not None else ""), hostname, push,
                    shared=True)
    delete = script(f"Undo the fabric setup of {hostname}", hostname, fill(r'''
need systemctl "this host does not run systemd"
for unit in gpucluster-fabric gpucluster-opensm; do
  if [[ -e "/etc/systemd/system/$unit.service" ]]; then systemctl disable --now "$unit" >/dev/null 2>&1 || true; fi
done
for f in @APPLY@ @UNIT@ @NCCL@ @OPENSM_UNIT@ @OPENSM_CONF@ @PARTITIONS@ @SHARED@; do drop_file "$f"; done
systemctl daemon-reload
note "runtime NIC settings (MTU, PFC, trust, ECN) stay until the next reboot or driver reload"
''', APPLY=APPLY, UNIT=APPLY_UNIT, NCCL=NCCL_CONF, OPENSM_UNIT=OPENSM_UNIT, OPENSM_CONF=OPENSM_CONF,
                                                                                     PARTITIONS=PARTITIONS_CONF,
                                                                                     SHARED=SHARED_PARTITIONS))
    return Script(create, delete)
