"""Recording doubles for tools that need hardware this machine lacks (GPUs, DCGM, ConnectX QoS, an InfiniBand
HCA's IPoIB driver and subnet manager, systemd as PID 1).

Each double appends its command line to /var/lib/gpucluster-doubles/calls.log and reads the host's simulated
hardware from /var/lib/gpucluster-doubles/state.env; everything else the scripts run is real.
"""

from __future__ import annotations

STATE_DIR = "/var/lib/gpucluster-doubles"

_RECORD = f'''#!/usr/bin/env bash
set -euo pipefail
S={STATE_DIR}
printf '%s %s\\n' "$(basename "$0")" "$*" >> "$S/calls.log"
# shellcheck disable=SC1091
source "$S/state.env"
'''

DOUBLES: dict[str, str] = {
    "nvidia-smi": _RECORD + r'''
query=""
for a in "$@"; do case "$a" in --query-gpu=*) query=${a#--query-gpu=} ;; esac; done
for ((i = 0; i < GPU_COUNT; i++)); do
  case "$query" in
    index) echo "$i" ;;
    name) echo "$GPU_NAME" ;;
    driver_version) cat /sys/module/nvidia/version 2>/dev/null || echo "$DRIVER" ;;
    index,ecc.errors.uncorrected.volatile.total) echo "$i, $ECC" ;;
    index,power.min_limit,power.max_limit) echo "$i, 200.00, 700.00" ;;
    index,persistence_mode)
      # on while the daemon runs, unless its effective command line (packaged unit, then overrides) turns it off
      exec=$(sed -n 's/^ExecStart=//p' "$S/units/nvidia-persistenced.service" \
             /etc/systemd/system/nvidia-persistenced.service.d/*.conf 2>/dev/null | sed '/^$/d' | tail -n 1 || true)
      if [[ -e "$S/active/nvidia-persistenced" && "$exec" != *--no-persistence-mode* ]]; then
        echo "$i, Enabled"; else echo "$i, Disabled"; fi ;;
    "") break ;;
    *) echo "nvidia-smi double: unknown query $query" >&2; exit 2 ;;
  esac
done
''',
    "systemctl": _RECORD + r'''
args=()
for a in "$@"; do case "$a" in --*) ;; *) args+=("${a%.service}") ;; esac; done
verb=${args[0]:-}; unit=${args[1]:-}
mkdir -p "$S/enabled" "$S/active"
now=0; case " $* " in *" --now "*) now=1 ;; esac
case "$verb" in
  is-enabled)
    quiet=0; case " $* " in *" --quiet "*|*" -q "*) quiet=1 ;; esac
    if [[ -e "$S/enabled/$unit" ]]; then state=enabled
    elif [[ -e "$S/static/$unit" ]]; then state=static
    else state=disabled; fi
    if (( !quiet )); then echo "$state"; fi
    [[ "$state" != disabled ]] ;;
  add-wants)
    mkdir -p "/etc/systemd/system/$unit.wants"
    ln -sf "$S/units/${args[2]}.service" "/etc/systemd/system/$unit.wants/${args[2]}.service" ;;
  is-active) [[ -e "$S/active/$unit" ]] ;;
  enable) touch "$S/enabled/$unit"; if (( now )); then touch "$S/active/$unit"; fi ;;
  disable) rm -f "$S/enabled/$unit"; if (( now )); then rm -f "$S/active/$unit"; fi ;;
  start|restart)
    touch "$S/active/$unit"
    # what the daemon reads at start, recorded as loaded (tests compare it with the files on disk)
    case "$unit" in
      kubelet) reads="/etc/kubernetes/kubelet.conf.d/* /etc/default/kubelet /etc/sysconfig/kubelet" ;;
      gpucluster-node-tuning) reads="/etc/systemd/system/$unit.service /usr/local/sbin/$unit" ;;
      beegfs-client) reads="/etc/beegfs/beegfs-client.conf /etc/beegfs/beegfs-mounts.conf /etc/beegfs/beegfs-client-autobuild.conf /etc/beegfs/conn.auth /etc/beegfs/gpucluster-interfaces" ;;
      beegfs-helperd) reads="/etc/beegfs/beegfs-helperd.conf /etc/beegfs/conn.auth" ;;
      beegfs-mgmtd) reads="/etc/beegfs/beegfs-mgmtd.conf /etc/beegfs/beegfs-mgmtd.toml /etc/beegfs/conn.auth /etc/beegfs/gpucluster-interfaces" ;;
      beegfs-*) reads="/etc/beegfs/$unit.conf /etc/beegfs/conn.auth /etc/beegfs/gpucluster-interfaces" ;;
      *) reads="/etc/systemd/system/$unit.service.d/*" ;;
    esac
    mkdir -p "$S/loaded"
    # shellcheck disable=SC2086  # the globs expand here
    cat $reads 2>/dev/null | md5sum > "$S/loaded/$unit" || true
    # run the unit's command, as systemd would: a oneshot unit's failure fails the start; a Type=simple
    # daemon's start succeeds at once and the unit fails when the daemon exits (its output goes to the journal)
    exec_start=$(sed -n 's/^ExecStart=//p' "/etc/systemd/system/$unit.service" 2>/dev/null || true)
    if [[ -n "$exec_start" ]] && grep -qx 'Type=simple' "/etc/systemd/system/$unit.service"; then
      mkdir -p "$S/journal"
      $exec_start >> "$S/journal/$unit" 2>&1 || rm -f "$S/active/$unit"
    elif [[ -n "$exec_start" ]]; then $exec_start; fi ;;
  stop) rm -f "$S/active/$unit" ;;
  reload) [[ -e "$S/active/$unit" ]] || { echo "$unit.service is not active, cannot reload." >&2; exit 1; } ;;
  daemon-reload) ;;
  # kubeadm's kubelet unit names its environment file (systemctl show -p EnvironmentFiles): KUBELET_ENV_FILES
  show) printf '%s\n' "${KUBELET_ENV_FILES:-}" ;;
  *) echo "systemctl double: unknown verb $verb" >&2; exit 2 ;;
esac
''',
    # the journal of a unit the systemctl double started: `journalctl -u UNIT ...`
    "journalctl": _RECORD + r'''
unit=""
while (( $# )); do case "$1" in -u) unit=${2%.service}; shift 2 ;; *) shift ;; esac; done
cat "$S/journal/$unit" 2>/dev/null || true
''',
    # a Fabric Manager package a test installed says its version (test_driver_stack.py), else the host's
    "nv-fabricmanager": _RECORD + 'echo "Fabric Manager version is : $(cat /opt/nvidia-test/fm-version 2>/dev/null '
                                  '|| echo "$FM_VERSION")"\n',
    "nvidia-persistenced": _RECORD,
    # the container runtime's view of the node's pods: PODS lists "namespace/name" of the ready sandboxes
    # vm.nr_hugepages is the host's own (the test hosts share the machine's kernel, whose count no test may
    # change): the kernel reserves at most HUGEPAGES_FREE pages more than it holds (fragmented memory) and
    # releases none of the HUGEPAGES_USED in use; every other key is the real sysctl's
    "sysctl": _RECORD + r'''
write=0 key=""
for a in "$@"; do case "$a" in -w) write=1 ;; -*) ;; *) key=$a ;; esac; done
case "$key" in
  vm.nr_hugepages) cat "$S/nr_hugepages" 2>/dev/null || echo 0 ;;
  vm.nr_hugepages=*)
    (( write )) || { echo "sysctl: a value needs -w" >&2; exit 1; }
    have=$(cat "$S/nr_hugepages" 2>/dev/null || echo 0) want=${key#*=}
    free=${HUGEPAGES_FREE:-1000000} used=${HUGEPAGES_USED:-0}
    (( want <= have + free )) || want=$((have + free))
    (( want >= used )) || want=$used
    echo "$want" > "$S/nr_hugepages" ;;
  *) exec /usr/sbin/sysctl "$@" ;;
esac
''',
    "crictl": _RECORD + r'''
# `rmp` removes sandboxes for good (until the host's PODS change): they are listed in $S/removed-pods
read -ra pods <<<"$PODS"
touch "$S/removed-pods"
case "$1" in
  pods) for i in "${!pods[@]}"; do grep -qx "${pods[$i]}" "$S/removed-pods" || echo "sandbox$i"; done ;;
  inspectp) i=${*: -1}; echo "${pods[${i#sandbox}]}" ;;
  rmp) for id in "${@:2}"; do [[ $id == -* ]] || echo "${pods[${id#sandbox}]}" >> "$S/removed-pods"; done ;;
  stopp) ;;
  *) echo "crictl double: unknown command $1" >&2; exit 2 ;;
esac
''',
    # a module whose build does not match the kernel (a marker file names it) fails to load, as insmod says; the
    # nvidia module loaded is the version of the driver package a test installed, and it
    # stays loaded while a process holds the GPUs (the gpus-held marker); see test_driver_stack.py
    "modprobe": _RECORD + r'''
if [[ $1 == -r ]]; then
  if [[ -e "$S/gpus-held" ]]; then echo "modprobe: FATAL: Module nvidia is in use." >&2; exit 1; fi
  for m in "${@:2}"; do rm -rf "/sys/module/${m//-/_}"; done
  exit 0
fi
if [[ -e "$S/bad-module-$1" ]]; then echo "modprobe: ERROR: could not insert '$1': Invalid argument" >&2; exit 1; fi
mkdir -p "/sys/module/${1//-/_}"
if [[ $1 == nvidia && -f /opt/nvidia-test/driver-version ]]; then cp /opt/nvidia-test/driver-version /sys/module/nvidia/version; fi
''',
    "dcgmi": _RECORD + r'''
if [[ "$DCGM" == pass ]]; then echo "Diagnostic | Result: Pass"; else echo "Memory | Fail - GPU 3 row remap pending"; exit 226; fi
''',
}

# mlnx_qos keeps each interface's trust, PFC and DSCP overrides in a state file and prints them as the real tool.
DOUBLES["mlnx_qos"] = _RECORD + r'''
iface="" trust="" pfc="" map=""
while (( $# )); do
  case "$1" in
    -i) iface=$2; shift 2 ;;
    --trust) trust=$2; shift 2 ;;
    --pfc|-f) pfc=$2; shift 2 ;;
    --dscp2prio) map=$2; shift 2 ;;
    *) echo "mlnx_qos double: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ -d "/sys/class/net/$iface" ]] || { echo "Netlink error: no interface $iface" >&2; exit 1; }
f="$S/qos-$iface.env" TRUST=pcp PFC=0,0,0,0,0,0,0,0 MAP=""
# shellcheck disable=SC1090
if [[ -f "$f" ]]; then source "$f"; fi
if [[ -n "$trust" ]]; then TRUST=$trust; fi
if [[ -n "$pfc" ]]; then PFC=$pfc; fi
if [[ -n "$map" ]]; then IFS=, read -r _ d p <<<"$map"; MAP="$MAP $d:$p"; fi
printf 'TRUST=%s\nPFC=%s\nMAP="%s"\n' "$TRUST" "$PFC" "$MAP" > "$f"
if [[ -z "$trust$pfc$map" ]]; then
  echo "DCBX mode: OS controlled"
  echo "Priority trust state: $TRUST"
  if [[ "$TRUST" == dscp ]]; then
    echo "dscp2prio mapping:"
    for ((prio = 0; prio < 8; prio++)); do
      line=""
      for ((d = 63; d >= 0; d--)); do
        to=$((d >> 3))
        for m in $MAP; do if [[ "${m%:*}" == "$d" ]]; then to=${m#*:}; fi; done
        if (( to == prio )); then line+=$(printf '%02d,' "$d"); fi
      done
      printf '\tprio:%d dscp:%s\n' "$prio" "$line"
    done
  fi
  echo "PFC configuration:"
  printf '\tpriority    0   1   2   3   4   5   6   7\n'
  printf '\tenabled     %s\n' "$(printf '%s' "$PFC" | sed 's/,/   /g')"
fi
'''
DOUBLES["ethtool"] = _RECORD + r'''
f="$S/pause-$2.env" PAUSE=on
# shellcheck disable=SC1090
if [[ -f "$f" ]]; then source "$f"; fi
case "$1" in
  -a) printf 'Pause parameters for %s:\nAutonegotiate:\t%s\nRX:\t\t%s\nTX:\t\t%s\n' "$2" "$PAUSE" "$PAUSE" "$PAUSE" ;;
  -A) echo "PAUSE=off" > "$f" ;;
  *) echo "ethtool double: unknown option $1" >&2; exit 2 ;;
esac
'''

# IPoIB's child interfaces need the ib_ipoib driver on an InfiniBand port (the parents here are veths): `ip link add
# link PARENT name CHILD type ipoib pkey KEY` makes a veth CHILD (a real link, whose MTU and state really change,
# refused as the kernel refuses an existing name); every other `ip` command is the real one.
DOUBLES["ip"] = r"""#!/usr/bin/env bash
set -euo pipefail
if [[ "${1:-} ${2:-} ${3:-}" == "link add link" && " $* " == *" type ipoib "* ]]; then
  printf '%s %s\n' ip "$*" >> /var/lib/gpucluster-doubles/calls.log
  [[ "$5" == name ]] || { echo "ip double: expected 'link add link PARENT name CHILD type ipoib ...'" >&2; exit 2; }
  child=$6
  if /usr/bin/ip link show dev "$child" >/dev/null 2>&1; then echo "RTNETLINK answers: File exists" >&2; exit 2; fi
  exec /usr/bin/ip link add "$child" type veth peer name "${child}p"
fi
exec /usr/bin/ip "$@"
"""
# OpenSM as its unit starts it (/usr/sbin/opensm --config FILE): no HCA here, so it writes to the log file its
# config names what the real one writes there once it has swept (master at the top priority, else standby:
# checked against the real OpenSM over ibsim in tests/components/fabric/test_opensm_real.py) and stays
# "running". The files it reads are checked against the real program there, not here.
OPENSM = _RECORD + r"""
conf=""
while (( $# )); do case "$1" in --config|-F) conf=$2; shift 2 ;; *) shift ;; esac; done
log=$(sed -n 's/^log_file //p' "$conf")
priority=$(sed -n 's/^sm_priority //p' "$conf")
stamp=$(date '+%b %d %H:%M:%S')
if [[ "$priority" == 15 ]]; then
  printf '%s 000001 [00000000] 0x80 -> Entering MASTER state\n%s 000002 [00000000] 0x80 -> SUBNET UP\n' \
    "$stamp" "$stamp" >> "$log"
else
  printf '%s 000001 [00000000] 0x80 -> Entering STANDBY state\n' "$stamp" >> "$log"
fi
"""

# nccl-tests' table: small messages far below the host's figure, which it reaches at 8 GiB; the average of all
# sizes (what a naive parser reads) is a quarter of it.
ALL_REDUCE = _RECORD + r'''
echo "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong"
echo "           8             2     float     sum      -1    42.61    0.00    0.00      0    41.93    0.00    0.00      0"
echo "     1048576        262144     float     sum      -1    60.12   17.44   30.52      0    59.80   17.53   30.68      0"
echo "  8589934592    2147483648     float     sum      -1    36983  232.27  $BUSBW      0    36962  232.40  $BUSBW      0"
echo "# Out of bounds values : 0 OK"
echo "# Avg bus bandwidth    : $(awk -v b="$BUSBW" 'BEGIN { printf "%.3f", b / 4 }') "
'''

HEALTHY = {"GPU_COUNT": "8", "GPU_NAME": "NVIDIA H100 80GB HBM3", "DRIVER": "550.54.15",
           "FM_VERSION": "550.54.15", "ECC": "0", "DCGM": "pass", "BUSBW": "451.20", "PODS": ""}


def state_env(state: dict[str, str]) -> str:
    return "".join(f"{k}={v!r}\n".replace("'", '"') for k, v in state.items())
