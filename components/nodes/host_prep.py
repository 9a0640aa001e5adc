"""Host preparation: one idempotent script per GPU host (../shared/reference/node-commands.md, section 7)."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Any, Sequence

import yaml

from ..bash import call, fill, script
from ..records import MAINTENANCE, PORT_SEEN, STATE_DIR, rdma_ports
from ..fabric.host import APPLY as FABRIC_APPLY, RUN_FABRIC
from ..k8s.labels import BURN_IN_TAINT
from ..spec import Host, NodePool
from ..spec.hardware import xid_pattern
from ..spec.xids import DEFAULT_FAULT_XIDS
from ..ssh import Script
from ..storage.clients import RolledFilesystem, render_roll_check
from .driver import DRIVER_STACK_PACKAGES, NO_STACK, render_driver_stack

KUBELET_DROP_IN_DIR = "/etc/kubernetes/kubelet.conf.d"
KUBELET_DROP_IN = f"{KUBELET_DROP_IN_DIR}/50-gpucluster.conf"
TUNING_SCRIPT = "/usr/local/sbin/gpucluster-node-tuning"
TUNING_UNIT = "/etc/systemd/system/gpucluster-node-tuning.service"
HUGEPAGES_SYSCTL = "/etc/sysctl.d/90-gpucluster-hugepages.conf"
MEMLOCK_DROP_IN = "/etc/systemd/system/containerd.service.d/50-gpucluster-memlock.conf"
PERSISTENCE_OVERRIDE = "/etc/systemd/system/nvidia-persistenced.service.d/50-gpucluster.conf"
PERSISTENCE_WANTS = "/etc/systemd/system/multi-user.target.wants/nvidia-persistenced.service"
CPU_MANAGER_STATE = "/var/lib/kubelet/cpu_manager_state"
PEERMEM_MODULES_LOAD = "/etc/modules-load.d/gpucluster-nvidia-peermem.conf"
SHM_FSTAB_TAG = "# gpucluster /dev/shm"


def render_kubelet_config(pool: NodePool) -> dict[str, Any]:
    """A KubeletConfiguration drop-in: new nodes register tainted until burn-in passes. A dedicated pool's tenant
    taint is left to the node patch: no flavor selects a node before the patch labels it, and a change of owner
    then needs no kubelet restart."""
    taints = [{"key": BURN_IN_TAINT, "value": "pending", "effect": "NoSchedule"}] if pool.burn_in.enabled else []
    taints += [{"key": t.key, "value": t.value, "effect": t.effect} for t in pool.taints]
    config: dict[str, Any] = {"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
                              "registerWithTaints": taints}
    t = pool.tuning
    # Kept from pods for the host's own daemons; under the static CPU manager its reservedSystemCPUs keep CPU.
    config["systemReserved"] = {"memory": f"{pool.system_reserved_memory_mib}Mi",
                                **({"cpu": f"{pool.system_reserved_cpu_millicores}m"}
                                   if pool.system_reserved_cpu_millicores else {})}
    if t.kubelet_cpu_manager_static:
        config.update(cpuManagerPolicy="static", reservedSystemCPUs=t.kubelet_reserved_cpus)
    if t.kubelet_topology_policy != "none":
        config.update(topologyManagerPolicy=t.kubelet_topology_policy, topologyManagerScope="pod")
    return config


def render_tuning_script(pool: NodePool) -> str | None:
    """What the boot unit applies: clocks, power cap and governor do not survive a reboot on their own."""
    t = pool.tuning
    lines = []
    if t.gpu_clock_lock_mhz:
        lines.append(f"nvidia-smi -lgc {t.gpu_clock_lock_mhz},{t.gpu_clock_lock_mhz}")
    if t.gpu_power_limit_w:
        lines.append(f"nvidia-smi -pl {t.gpu_power_limit_w}")
    if t.cpu_governor != "unchanged":
        # Written in sysfs: Ubuntu's cpupower is a wrapper that fails without the kernel-specific tools package.
        lines.append("for gov in /sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor; do\n"
                     f"  if [[ -w \"$gov\" && \"$(cat \"$gov\")\" != {t.cpu_governor} ]]; then "
                     f"echo {t.cpu_governor} > \"$gov\"; fi\n"
                     "done")
    if not lines:
        return None
    return "#!/usr/bin/env bash\n# GPU clocks, power cap and CPU governor at boot (gpucluster)\nset -euo pipefail\n" + \
        "\n".join(lines)


_PREFLIGHT = r"""
# --- hardware present and healthy -------------------------------------------------------------------
need nvidia-smi "the NVIDIA driver is not installed or not on PATH"
need systemctl "this host does not run systemd"
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
[[ "$gpus" -eq @GPUS@ ]] || fail "found $gpus GPUs, the pool expects @GPUS@ (@MODEL@)"
while IFS= read -r name; do
  [[ "${name// /-}" == @PRODUCT@ ]] || fail "found GPU '$name', the pool expects @PRODUCT@ (@MODEL@)"
done < <(nvidia-smi --query-gpu=name --format=csv,noheader)
while IFS=', ' read -r index ecc; do
  if [[ "$ecc" =~ ^[0-9]+$ ]] && (( ecc > 0 )); then
    fail "GPU $index has $ecc uncorrected ECC errors since the driver loaded; replace or reset it before use"
  fi
done < <(nvidia-smi --query-gpu=index,ecc.errors.uncorrected.volatile.total --format=csv,noheader,nounits)
# The XIDs that take a node out of service (kubernetes.health.fault_xids), as the detector reads them.
if kernel=$(timeout 30 dmesg 2>/dev/null); then
  xids=$(grep -E '@XID_PATTERN@' <<<"$kernel" || true)
  [[ -z "$xids" ]] || fail "XIDs since boot that take the node out of service (kubernetes.health.fault_xids): $(printf '%s' "$xids" | tail -n 3 | tr '\n' ' '); reboot the host (after a repair, where NVIDIA's catalog asks for one), then apply again"
  note "$gpus x @PRODUCT@ present, no uncorrected ECC error, no XID of kubernetes.health.fault_xids since boot"
else
  note "$gpus x @PRODUCT@ present, no uncorrected ECC error; the kernel log could not be read (dmesg): XIDs not checked"
fi
"""

# A driver the rollout owes (software.package_repositories) runs on until then; any other mismatch stops.
_DRIVER_VERSION = r"""
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | sed -n 1p)
if [[ "$driver" != @VERSION@ ]] && ! owed restart-driver; then
  fail "the NVIDIA driver is $driver but the pool runs @VERSION@ (software.driver_version); install @VERSION@, set software.package_repositories to have it installed, or change the spec"
fi
"""

# The GPU Operator's driver container would defer to a driver loaded on the host (and then never load its
# GPUDirect RDMA module), so with an operator-managed driver the host must have none.
_PREFLIGHT_OPERATOR_DRIVER = r"""
# --- hardware present; the GPU Operator installs the driver, so the host must not have one loaded -----
need lspci "install pciutils"
need systemctl "this host does not run systemd"
gpus=$({ lspci -n -d 10de::0302; lspci -n -d 10de::0300; } | wc -l)
[[ "$gpus" -eq @GPUS@ ]] || fail "found $gpus NVIDIA GPUs on the PCI bus, the pool expects @GPUS@ (@MODEL@)"
if [[ -e /proc/driver/nvidia/version ]]; then
  fail "an NVIDIA driver is loaded on the host ($(sed -n 1p /proc/driver/nvidia/version)) but the GPU Operator manages the driver (kubernetes.gpu_operator.driver_managed): the operator would defer to it and GPUDirect RDMA would never load; remove the host driver or set driver_managed: false"
fi
note "$gpus NVIDIA GPUs on the PCI bus and no host driver: the GPU Operator installs it"
"""

# Ubuntu's packaged unit is static and runs the daemon with --no-persistence-mode: enabling it does nothing
# and persistence stays off. An override runs it in its default (persistence) mode and multi-user.target
# pulls the static unit in at boot; nvidia-smi then proves the mode is on.
_PERSISTENCE = r"""
# --- GPU persistence: the daemon in persistence mode, checked on every GPU ---------------------------
need nvidia-persistenced "it ships with the NVIDIA driver"
pd_user=""
if id -u nvidia-persistenced >/dev/null 2>&1; then pd_user=" --user nvidia-persistenced"; fi
put_file @OVERRIDE@ 0644 "[Service]
ExecStart=
ExecStart=$(command -v nvidia-persistenced)${pd_user} --verbose" restart-nvidia-persistenced
case "$(systemctl is-enabled nvidia-persistenced 2>/dev/null || true)" in
  enabled) ;;
  static)
    if [[ ! -e @WANTS@ ]]; then
      systemctl add-wants multi-user.target nvidia-persistenced.service
      changed "multi-user.target starts the static nvidia-persistenced unit at boot"
    fi ;;
  *) systemctl enable nvidia-persistenced >/dev/null; changed "enabled nvidia-persistenced" ;;
esac
if owed restart-nvidia-persistenced; then
  systemctl daemon-reload
  systemctl restart nvidia-persistenced
  paid restart-nvidia-persistenced
  changed "restarted nvidia-persistenced in persistence mode"
elif ! systemctl is-active --quiet nvidia-persistenced; then
  systemctl start nvidia-persistenced
  changed "started nvidia-persistenced"
fi
off=$(nvidia-smi --query-gpu=index,persistence_mode --format=csv,noheader | awk -F', ' '$2 != "Enabled" { printf "%s ", $1 }')
[[ -z "$off" ]] || fail "persistence mode is off on GPU(s) ${off% } with nvidia-persistenced running; see journalctl -u nvidia-persistenced"
note "persistence mode is on for every GPU"
"""

# With the host's driver the GPU Operator's driver.rdma does nothing: the host loads nvidia-peermem itself.
_PEERMEM = r"""
# --- GPUDirect RDMA with the host's driver: nvidia-peermem, loaded now and at every boot --------------
put_file @CONF@ 0644 "nvidia-peermem"
if [[ ! -d /sys/module/nvidia_peermem ]]; then
  modprobe nvidia-peermem || fail "cannot load nvidia-peermem for GPUDirect RDMA: the driver must be built against the host's RDMA stack (MLNX_OFED or inbox)"
  changed "loaded nvidia-peermem"
fi
"""

_POWER_RANGE = r"""
while IFS=', ' read -r index low high; do
  awk -v w=@W@ -v lo="$low" -v hi="$high" 'BEGIN { exit !(w >= lo && w <= hi) }' ||
    fail "power limit @W@ W is outside GPU $index's range $low-$high W; change tuning.gpu_power_limit_w"
done < <(nvidia-smi --query-gpu=index,power.min_limit,power.max_limit --format=csv,noheader,nounits)
"""

_SERVICE = r"""
if [[ "$(systemctl is-enabled @UNIT@ 2>/dev/null || true)" != enabled ]]; then
  systemctl enable @UNIT@ >/dev/null
  changed "enabled @UNIT@"
fi
if ! systemctl is-active --quiet @UNIT@; then
  systemctl start @UNIT@
  changed "started @UNIT@"
fi
"""

_FABRIC_MANAGER = r"""
# --- NVSwitch: Fabric Manager must match the driver exactly, or CUDA fails with error 802 -------------
need nv-fabricmanager "install the nvidia-fabricmanager package of the driver's version"
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | sed -n 1p)
fm=$(nv-fabricmanager --version 2>/dev/null | grep -oE '[0-9]+(\.[0-9]+)+' | sed -n 1p || true)
[[ "$fm" == "$driver" ]] || fail "nvidia-fabricmanager is ${fm:-unknown} but the driver is $driver; install the matching version"
"""

_HOLD = r"""
# --- the driver stack held at the installed versions (no unattended upgrade moves it) -----------------
hold_pattern=@PATTERN@
if command -v apt-mark >/dev/null 2>&1; then
  held=" $(apt-mark showhold | tr '\n' ' ') "
  while read -r status name; do
    [[ "$status" == ii ]] || continue
    [[ "$held" == *" $name "* ]] && continue
    apt-mark hold "$name" >/dev/null
    changed "held $name at its installed version (apt-mark unhold $name to upgrade it on purpose)"
  done < <(dpkg-query -W -f '${db:Status-Abbrev} ${Package}\n' | grep -E "^ii +${hold_pattern#^}" || true)
elif command -v dnf >/dev/null 2>&1; then
  dnf versionlock list >/dev/null 2>&1 || fail "dnf versionlock is missing; install python3-dnf-plugin-versionlock so the driver stack can be held at its version"
  locked=$(dnf versionlock list 2>/dev/null || true)
  while read -r name; do
    grep -q "^${name}-[0-9]" <<<"$locked" && continue
    dnf versionlock add "$name" >/dev/null
    changed "held $name at its installed version (dnf versionlock delete $name to upgrade it on purpose)"
  done < <(rpm -qa --qf '%{NAME}\n' | grep -E "$hold_pattern" | sort -u || true)
else
  fail "neither apt-mark nor dnf is here to hold the driver stack at its version"
fi
"""

# Restarting kubelet or containerd under running pods is what a drain is for: preparation decides what it
# will restart before it changes anything, and on a node where work runs (system namespaces aside) leaves
# that restart owed to the pool's rollout, which drains the node first. Undoing refuses there instead.
_BUSY = r"""
system_namespaces=@SYSTEM@
# tenant_pods: the ready pods on this node outside the system namespaces, namespace/name one a line (the
# caller checks for crictl first: a failure inside a process substitution would read as an idle node).
tenant_pods() {
  local id pod
  while IFS= read -r id; do
    pod=$(crictl inspectp -o go-template --template '{{.status.metadata.namespace}}/{{.status.metadata.name}}' "$id")
    case " $system_namespaces " in *" ${pod%%/*} "*) ;; *) printf '%s\n' "$pod" ;; esac
  done < <(crictl pods --state ready -q)
}
refuse_if_busy() {
  need crictl "it lists the pods on this node before kubelet or containerd restart; install cri-tools"
  local pods=()
  mapfile -t pods < <(tenant_pods)
  if (( ${#pods[@]} )); then
    fail "$1 would disrupt ${#pods[@]} running pod(s): ${pods[*]:0:5}; drain the node first (kubectl drain $HOST --ignore-daemonsets --delete-emptydir-data), run again, then kubectl uncordon $HOST"
  fi
}
"""

# Only a restart of what runs interrupts work: containerd, the driver's reload, or a kubelet that is up (one that
# is down is started).
_DISRUPTIVE = r"""disruptive=()
for unit in "${restart[@]}"; do
  if [[ $unit != kubelet ]] || systemctl is-active --quiet kubelet; then disruptive+=("$unit"); fi
done"""
_REFUSE_IF_DISRUPTIVE = _DISRUPTIVE + r"""
if (( ${#disruptive[@]} )); then refuse_if_busy "restarting ${disruptive[*]} @FOR@"; fi"""
# defer_if_busy: of the restarts in `restart`, those that would interrupt work stay owed (put_file owes them) and
# leave `restart` for `deferred` where tenants' pods run (`busy_pods`): the rollout drains the node and pays
# them. The line ROLLOUT_OWED prints is what the rollout reads.
_DEFER = "\ndeferred=() busy_pods=()\ndefer_if_busy() {\n  local unit kept=() disruptive\n" + \
    textwrap.indent(_DISRUPTIVE, "  ") + r"""
  (( ${#disruptive[@]} )) || return 0
  need crictl "it lists the pods on this node before kubelet or containerd restart; install cri-tools"
  mapfile -t busy_pods < <(tenant_pods)
  (( ${#busy_pods[@]} )) || return 0
  for unit in "${restart[@]}"; do
    if [[ " ${disruptive[*]} " == *" $unit "* ]]; then deferred+=("$unit"); owe "restart-$unit"; else kept+=("$unit"); fi
  done
  restart=("${kept[@]}")
}
"""

# The CPU manager refuses to start on a state file written under another policy: compare with the policy the
# file records (not with an earlier drop-in, which a replacement or a hand edit may have removed).
_RESTART_KUBELET = r"""
systemctl stop kubelet
recorded=$(grep -oE '"policyName": *"[a-z]+"' @STATE@ 2>/dev/null | grep -oE '[a-z]+"$' | tr -d '"' || true)
if [[ -n "$recorded" && "$recorded" != @POLICY@ ]]; then
  rm -f @STATE@
  changed "removed the CPU manager state of policy $recorded (kubelet now runs @POLICY@)"
fi
systemctl start kubelet
changed "restarted kubelet"
"""

_SHM = r"""
# --- /dev/shm: NCCL's shared-memory transport needs far more than the default ------------------------
shm_line=@LINE@
if ! grep -qxF "$shm_line" /etc/fstab; then
  grep -vF @TAG@ /etc/fstab > /etc/fstab.gpucluster-new || true
  printf '%s\n' "$shm_line" >> /etc/fstab.gpucluster-new
  mv -f /etc/fstab.gpucluster-new /etc/fstab
  changed "set /dev/shm to @SIZE@G in /etc/fstab"
fi
current=$(df -B1G --output=size /dev/shm | tail -n 1 | tr -d ' ')
if [[ "$current" != @SIZE@ ]]; then
  mount -o remount,size=@SIZE@G /dev/shm
  changed "remounted /dev/shm with @SIZE@G (was ${current}G)"
fi
"""

# The kubelet reads the hugepages' count only when it starts (its machine info is cached then: kubernetes#81774,
# kubernetes#72307), and pods' memory grows or shrinks by them, so a new count is applied with a kubelet restart,
# where no tenant works: elsewhere by the rollout. The kernel releases no page in use and finds fewer free
# ones as memory fragments; what it cannot reserve at run time it reserves at boot from the sysctl file.
_HUGEPAGES = r"""
# hugepages_apply COUNT: COUNT pages of 2 MiB reserved now, and the kubelet restarted to offer them
hugepages_apply() {
  local had have
  had=$(sysctl -n vm.nr_hugepages)
  owe restart-kubelet
  if [[ "$had" != "$1" ]]; then
    sysctl -q -w "vm.nr_hugepages=$1"
    have=$(sysctl -n vm.nr_hugepages)
    [[ "$have" == "$1" ]] || fail "the kernel holds $have hugepages of 2 MiB, not $1 (it releases no page in use and finds no more in fragmented memory at run time); reboot $HOST, which reserves them at boot, then run pulumi up again"
    changed "hugepages of 2 MiB: $had -> $1"
  fi
  paid restart-hugepages
}
"""

_HUGEPAGES_PREPARE = r"""
# --- hugepages: a new count where no tenant works, else left to the rollout --------------------------
@FILE_OP@
if owed restart-hugepages || { [[ -e @FILE@ ]] && [[ "$(sysctl -n vm.nr_hugepages)" != @PAGES@ ]]; }; then
  restart=(hugepages)
  defer_if_busy
  if (( ${#restart[@]} )); then hugepages_apply @PAGES@; fi
fi
"""

# What bounces links (MTU, trust, PFC, pause), which the host's fabric settings left owed (fabric/host.py).
# fabric_owed: owed and still there to apply; a host whose fabric settings are gone owes it no more.
_FABRIC_OWED = r"""
fabric_owed() {
  owed restart-fabric || return 1
  [[ -x @APPLY@ ]] && return 0
  paid restart-fabric
  return 1
}
"""

_FABRIC_PREPARE = r"""
# --- fabric settings that bounce links: where no tenant works, else left to the rollout ---------------
if fabric_owed; then
  restart=(fabric)
  defer_if_busy
  if (( ${#restart[@]} )); then run_fabric all; fi
fi
"""

_TUNING = r"""
# --- clocks, power cap, governor: applied now and by a boot unit --------------------------------------
put_file @SCRIPT@ 0755 "$(cat @SCRIPT_DOC@)" restart-gpucluster-node-tuning
put_file @UNIT@ 0644 "$(cat @UNIT_DOC@)" restart-gpucluster-node-tuning
if owed restart-gpucluster-node-tuning; then
  systemctl daemon-reload
  systemctl enable gpucluster-node-tuning.service >/dev/null
  systemctl restart gpucluster-node-tuning.service
  paid restart-gpucluster-node-tuning
  changed "applied GPU clocks, power cap and governor"
fi
"""

_NO_TUNING = r"""
if [[ -e @UNIT@ ]]; then
  systemctl disable --now gpucluster-node-tuning.service >/dev/null 2>&1 || true
  drop_file @UNIT@
  drop_file @SCRIPT@
  systemctl daemon-reload
fi
"""

# What this run restarts is decided here, before anything changes; on a busy node the restarts are owed.
_RESTARTS = r"""
# --- kubelet and containerd: decided first, never restarted under running work -----------------------
kubelet_config="$(cat @CONFIG_DOC@)"
memlock_config=@MEMLOCK_CONF@
flag=--config-dir=@DIR@
# The environment file kubeadm's kubelet unit reads KUBELET_EXTRA_ARGS from: the unit says which
# (/etc/default/kubelet on Debian and Ubuntu, /etc/sysconfig/kubelet on EL); a flag in the other is never read.
kubelet_env=$(systemctl show kubelet -p EnvironmentFiles --value 2>/dev/null | grep -oE '/etc/(default|sysconfig)/kubelet' | sed -n 1p || true)
if [[ -z "$kubelet_env" ]]; then
  if [[ -d /etc/sysconfig ]]; then kubelet_env=/etc/sysconfig/kubelet; else kubelet_env=/etc/default/kubelet; fi
fi
# A restart is due for new settings, or still owed by a run cut off before it; a kubelet that should run but
# does not (a run cut off between stop and start) is started, which interrupts nothing.
restart=()
if systemctl is-enabled --quiet kubelet 2>/dev/null; then
  if ! same_file @DROP_IN@ "$kubelet_config" || ! grep -qF -- "$flag" "$kubelet_env" 2>/dev/null \
      || owed restart-kubelet || ! systemctl is-active --quiet kubelet; then
    restart+=(kubelet)
  fi
fi
if [[ -n "$memlock_config" ]] && { ! same_file @MEMLOCK@ "$memlock_config" || owed restart-containerd; } \
    && systemctl is-active --quiet containerd; then
  restart+=(containerd)
fi
defer_if_busy
"""

_MEMLOCK = r"""
# --- RDMA: containers lock memory for the HCAs; restricted pods cannot add IPC_LOCK --------------------
put_file @MEMLOCK@ 0644 "$memlock_config" restart-containerd
if [[ " ${restart[*]} " == *" containerd "* ]]; then
  systemctl daemon-reload
  systemctl restart containerd
  changed "restarted containerd"
fi
if [[ " ${deferred[*]} " != *" containerd "* ]]; then
  paid restart-containerd   # restarted, or not running: it reads the file when it starts
fi
"""

_KUBELET = r"""
# --- kubelet: registration taints, CPU and topology managers (a drop-in, so kubeadm upgrades keep it) --
put_file @DROP_IN@ 0644 "$kubelet_config" restart-kubelet
if ! grep -qF -- "$flag" "$kubelet_env" 2>/dev/null; then
  owe restart-kubelet
  if grep -q '^KUBELET_EXTRA_ARGS=' "$kubelet_env" 2>/dev/null; then
    sed -i -E "s|^KUBELET_EXTRA_ARGS=\"?([^\"]*)\"?\$|KUBELET_EXTRA_ARGS=\"\\1 $flag\"|" "$kubelet_env"
  else
    mkdir -p "$(dirname "$kubelet_env")"
    printf 'KUBELET_EXTRA_ARGS="%s"\n' "$flag" >> "$kubelet_env"
  fi
  changed "kubelet reads @DIR@ ($kubelet_env)"
fi
if [[ " ${restart[*]} " == *" kubelet "* ]]; then
@RESTART_KUBELET@
fi
if [[ " ${deferred[*]} " != *" kubelet "* ]]; then
  paid restart-kubelet      # restarted, or not enabled: it reads the drop-in when it starts
fi
if (( ${#deferred[@]} )); then
  note @OWED@"${deferred[*]}"
  note "${#busy_pods[@]} tenant pod(s) run here (${busy_pods[*]:0:3}): ${deferred[*]} left to the pool's rollout, which drains the node first"
fi
"""

_UNDO = r"""
need systemctl "this host does not run systemd"
restart=()
if { [[ -e @DROP_IN@ ]] || owed restart-kubelet || ! systemctl is-active --quiet kubelet; } \
    && systemctl is-enabled --quiet kubelet 2>/dev/null; then
  restart+=(kubelet)
fi
if { [[ -e @MEMLOCK@ ]] || owed restart-containerd; } && systemctl is-active --quiet containerd; then
  restart+=(containerd)
fi
@REFUSE_IF_DISRUPTIVE@
if [[ -e @UNIT@ ]]; then systemctl disable --now gpucluster-node-tuning.service >/dev/null 2>&1 || true; fi
drop_file @DROP_IN@ restart-kubelet
drop_file @MEMLOCK@ restart-containerd
for f in @UNIT@ @SCRIPT@ @HUGEPAGES@ @PERSISTENCE@ @PEERMEM@; do drop_file "$f"; done
systemctl daemon-reload
if [[ " ${restart[*]} " == *" containerd "* ]]; then systemctl restart containerd; changed "restarted containerd"; fi
paid restart-containerd
if [[ " ${restart[*]} " == *" kubelet "* ]]; then
@RESTART_KUBELET@
fi
paid restart-kubelet
note "left in place: drivers, services it enabled and /dev/shm in /etc/fstab (they are harmless without it)"
""".replace("@REFUSE_IF_DISRUPTIVE@", _REFUSE_IF_DISRUPTIVE.replace("@FOR@", "without the gpucluster settings"))


ROLLOUT_OWED = "rollout owed: "     # preparation's line naming the restarts it left to the rollout
# What preparation may leave to the rollout, in the order its step on the host pays them.
ROLLOUT_UNITS = ("driver", "fabric", "hugepages", "containerd", "kubelet")

# What the roll is told on standard input of its host's drain (rollout.drain_outcome): it rolls on "go" only.
NOT_DRAINED = ("deferred", "failed")
ROLL_FAILED = "roll failed"     # the roll's own failure, for the uncordon to judge against the failure budget
# The roll's own time bounds, each where its script waits: what the rollout's modelled wall time adds up.
ROLL_BOUNDS_S = {"kubelet": 60, "ports": 180, "dcgmi": 900}
# A driver stack install has no bound of ours (apt and DKMS's own): modelled as this, never enforced.
DRIVER_INSTALL_MODEL_S = 1200
_ROLL_GATE = r"""
# --- the drain's outcome, on standard input from where pulumi runs ------------------------------------
drained="$(cat)"
if [[ "$drained" == @DEFERRED@ || "$drained" == @FAILED@ ]]; then
  note "not drained ($drained): what is owed here waits for a later pulumi up"
  finish
  exit 0
fi
# From here a failure is the rollout's to judge against the pool's failure budget (the uncordon does): the
# step prints it as "roll failed: why" and succeeds; the node stays cordoned meanwhile.
roll_exit() {
  local rc=$?
  if (( rc != 0 )); then
    printf '%s: %s: %s\n' "$HOST" @ROLL_FAILED@ "${LAST_ERROR:-a command failed (exit $rc); its error is above}"
    exit 0
  fi
}
trap roll_exit EXIT
"""

# The rollout's step on a host, after the node is drained: the restarts preparation left owed, then a short
# burn-in; a failure leaves the node cordoned and tainted (the uncordon judges it).
_ROLL = r"""
# --- the restarts preparation left owed, on the drained node ------------------------------------------
need systemctl "this host does not run systemd"
due=()
for unit in @UNITS@; do if owed "restart-$unit"; then due+=("$unit"); fi; done
# A roll cut short after its restarts still owes its end: the checks and the monitors' return (the marker).
if (( ${#due[@]} == 0 )) && [[ ! -e @MAINTENANCE@ ]]; then
  note "no restart is owed here: nothing to roll"
  finish
  exit 0
fi
need crictl "it lists the pods on this node before kubelet or containerd restart; install cri-tools"
mapfile -t pods < <(tenant_pods)
if (( ${#pods[@]} )); then
  fail "${#pods[@]} tenant pod(s) still run here after the drain (${pods[*]:0:5}); what is owed (${due[*]}) would stop them: find what keeps them (kubectl get pods -A --field-selector spec.nodeName=$HOST) and run pulumi up again"
fi
# What follows bounces links and reloads drivers: the health monitors keep their last verdict until the roll has
# checked the host again (records.MAINTENANCE), instead of recording the roll's own doing as a fault.
mkdir -p @STATE@
printf 'roll %s\n' "$(date +%s)" > @MAINTENANCE@
if owed restart-driver; then
  if declare -F stack_apply >/dev/null; then stack_apply; fi    # the spec may have stopped installing it since
  paid restart-driver
fi
if fabric_owed; then run_fabric all; fi     # after the driver stack: a new DOCA-OFED resets the NICs' settings
if owed restart-hugepages; then hugepages_apply @PAGES@; fi     # owes the kubelet's restart
if owed restart-containerd; then
  systemctl daemon-reload
  systemctl restart containerd
  paid restart-containerd
  changed "restarted containerd"
fi
if owed restart-kubelet; then
  if systemctl is-enabled --quiet kubelet 2>/dev/null; then
@RESTART_KUBELET@
  fi
  paid restart-kubelet
fi
# --- a short burn-in before the node takes work again -------------------------------------------------
for _ in $(seq @KUBELET_S@); do systemctl is-active --quiet kubelet && break; sleep 1; done
systemctl is-active --quiet kubelet || fail "kubelet is not running after its restart; see journalctl -u kubelet"
""".replace("@UNITS@", " ".join(ROLLOUT_UNITS))

# The roll's end: its fabric ports up again (a bounded wait), their link_downed counters as the port monitor's
# baseline (records.PORT_SEEN: the roll's own bounces are no flap), then the monitors judge the host again.
_UNFENCE = r"""
# --- the health monitors again, on the host as the roll leaves it --------------------------------------------
seen=()
for p in @PORTS@; do
  dir=/sys/class/infiniband/${p%/*}/ports/${p#*/}
  for _ in $(seq @PORTS_S@); do
    [[ $(cat "$dir/state" 2>/dev/null) == *ACTIVE* && $(cat "$dir/phys_state" 2>/dev/null) == *LinkUp* ]] && break
    sleep 1
  done
  # Not the roll's verdict to give: a port still down is the port monitor's to judge (and quarantine) once the
  # marker is gone, without holding back the pool's later batches.
  [[ $(cat "$dir/state" 2>/dev/null) == *ACTIVE* ]] || note "fabric port $p is not active @PORTS_S@ s after the roll ($(cat "$dir/state" 2>/dev/null || echo missing)): the port monitor judges it now"
  downed=$(cat "$dir/counters/link_downed" 2>/dev/null || true)
  if [[ $downed =~ ^[0-9]+$ ]]; then seen+=("$p $downed"); fi
done
if (( ${#seen[@]} )); then
  printf '%s\n' "${seen[@]}" > @SEEN@.new
  mv -f @SEEN@.new @SEEN@
fi
rm -f @MAINTENANCE@
note "the health monitors judge this host again"
"""

_ROLL_DCGM = r"""
need dcgmi "install NVIDIA DCGM (datacenter-gpu-manager) and start nvidia-dcgm"
if ! diag=$(timeout @DCGM_S@ dcgmi diag -r 1 2>&1); then
  fail "dcgmi diag -r 1 failed after the restart: $(printf '%s\n' "$diag" | grep -iE 'fail|error' | sed -n 1,3p | tr '\n' ' ')"
fi
note "dcgmi diag -r 1 passed"
"""


@dataclass(frozen=True)
class PoolPrep:
    """A pool's host preparation, rendered once for the pool: host to host, only the name differs."""

    title: str          # "<pool>: <count> x <model>"
    create: str         # the scripts' bodies, without the per-host prelude
    delete: str
    roll: str           # the rollout's step on a drained host

    def for_host(self, host: Host) -> Script:
        hardware = f", hardware {host.hardware_id}" if host.hardware_id else ""    # new hardware: run again
        return Script(script(f"Prepare {host.hostname} ({self.title}{hardware})", host.hostname, self.create,
                             shared=True),
                      script(f"Undo the preparation of {host.hostname}", host.hostname, self.delete, shared=True))

    def roll_for_host(self, host: Host, preparation: str) -> Script:
        """`preparation`: the digest of the host's preparation, whose owed restarts this rolls; a new one
        changes the script, so the step runs again. Run with the drain's outcome on standard input (`go`,
        or one of NOT_DRAINED, where it rolls nothing)."""
        return Script(script(f"Roll {host.hostname} after its preparation {preparation[:16]}: owed restarts, "
                             "then a short burn-in", host.hostname, self.roll, shared=True))


def render_busy(system_namespaces: Sequence[str]) -> str:
    """The script part that finds tenants' pods on the node (`tenant_pods`) and refuses while they run."""
    return fill(_BUSY, SYSTEM=" ".join(system_namespaces))


def render_pool_prep(pool: NodePool, *, rdma: bool, gpudirect: bool = False, host_driver: bool = True,
                     system_namespaces: Sequence[str] = ("kube-system",),
                     fault_xids: Sequence[int] = DEFAULT_FAULT_XIDS,
                     filesystem: RolledFilesystem | None = None) -> PoolPrep:
    """`rdma`: the fabric has RDMA, so containers need unlimited locked memory. `gpudirect`: GPUs and NICs use
    GPUDirect RDMA. `host_driver`: the driver is installed on the host (false: the GPU Operator installs it).
    `system_namespaces`: pods there (node agents) are not work that a kubelet or containerd restart disrupts.
    `fault_xids`: XIDs since boot that stop the preparation and the roll (the detector's, spec/xids.py).
    `filesystem`: a site cluster's client the roll restarts after a driver change and whose mount it checks
    before the node takes work (omitted: none)."""
    info, t = pool.gpu.info, pool.tuning
    cpu_policy = "static" if t.kubelet_cpu_manager_static else "none"
    restart_kubelet = fill(_RESTART_KUBELET, STATE=CPU_MANAGER_STATE, POLICY=cpu_policy).strip("\n")
    busy = render_busy(system_namespaces)
    stack = render_driver_stack(pool.software, nvswitch=pool.gpu.nvswitch)
    # what preparation and the rollout's step both call
    functions = busy + RUN_FABRIC + fill(_FABRIC_OWED, APPLY=FABRIC_APPLY) + _HUGEPAGES
    parts = [functions, _DEFER] + ([stack.functions, stack.prepare] if stack else [NO_STACK])
    if not host_driver:
        parts.append(fill(_PREFLIGHT_OPERATOR_DRIVER, GPUS=pool.gpu.count, MODEL=pool.gpu.model))
    else:
        preflight = fill(_PREFLIGHT.replace("@XID_PATTERN@", xid_pattern(fault_xids)),
                         GPUS=pool.gpu.count, MODEL=pool.gpu.model, PRODUCT=info.product)
        parts.append(preflight)
        if pool.software.driver_version:
            parts.append(fill(_DRIVER_VERSION, VERSION=pool.software.driver_version))
        if t.gpu_power_limit_w:
            parts.append(fill(_POWER_RANGE, W=t.gpu_power_limit_w))
        if pool.gpu.nvswitch:
            parts.append(_FABRIC_MANAGER)
    parts.append(fill(_HOLD, PATTERN=DRIVER_STACK_PACKAGES))    # DOCA-OFED too, wherever the driver lives
    parts.append(_FABRIC_PREPARE)
    pages_file = (call("put_file", HUGEPAGES_SYSCTL, "0644", f"vm.nr_hugepages = {t.hugepages_2mi}",
                       "restart-hugepages") if t.hugepages_2mi
                  else call("drop_file", HUGEPAGES_SYSCTL, "restart-hugepages"))
    parts.append(fill(_HUGEPAGES_PREPARE.replace("@FILE_OP@", pages_file), FILE=HUGEPAGES_SYSCTL,
                      PAGES=t.hugepages_2mi))
    config = yaml.safe_dump(render_kubelet_config(pool), sort_keys=False).rstrip("\n")
    parts.append(fill(_RESTARTS, {"CONFIG_DOC": config}, DROP_IN=KUBELET_DROP_IN, DIR=KUBELET_DROP_IN_DIR,
                      MEMLOCK=MEMLOCK_DROP_IN, MEMLOCK_CONF="[Service]\nLimitMEMLOCK=infinity" if rdma else ""))
    if host_driver:         # the driver container runs these for a driver the operator installs
        if t.persistence:
            parts.append(fill(_PERSISTENCE, OVERRIDE=PERSISTENCE_OVERRIDE, WANTS=PERSISTENCE_WANTS))
        if gpudirect:
            parts.append(fill(_PEERMEM, CONF=PEERMEM_MODULES_LOAD))
        if pool.gpu.nvswitch:
            parts.append(fill(_SERVICE, UNIT="nvidia-fabricmanager"))
    if t.shm_size_gib:
        parts.append(fill(_SHM, SIZE=t.shm_size_gib, TAG=SHM_FSTAB_TAG,
                          LINE=f"tmpfs /dev/shm tmpfs defaults,size={t.shm_size_gib}G 0 0 {SHM_FSTAB_TAG}"))
    tuning = render_tuning_script(pool)
    if tuning:
        unit = ("[Unit]\nDescription=GPU clocks, power cap and CPU governor (gpucluster)\n"
                "After=nvidia-persistenced.service\n\n[Service]\nType=oneshot\nRemainAfterExit=yes\n"
                f"ExecStart={TUNING_SCRIPT}\n\n[Install]\nWantedBy=multi-user.target")
        parts.append(fill(_TUNING, {"SCRIPT_DOC": tuning, "UNIT_DOC": unit}, SCRIPT=TUNING_SCRIPT, UNIT=TUNING_UNIT))
    else:
        parts.append(fill(_NO_TUNING, SCRIPT=TUNING_SCRIPT, UNIT=TUNING_UNIT))
    parts.append(fill(_MEMLOCK if rdma else "\ndrop_file @MEMLOCK@\n", MEMLOCK=MEMLOCK_DROP_IN))
    parts.append(fill(_KUBELET.replace("@RESTART_KUBELET@", restart_kubelet), DROP_IN=KUBELET_DROP_IN,
                      DIR=KUBELET_DROP_IN_DIR, OWED=ROLLOUT_OWED))
    undo = _UNDO.replace("@RESTART_KUBELET@", fill(_RESTART_KUBELET, STATE=CPU_MANAGER_STATE, POLICY="none")
                         .strip("\n"))
    roll = [fill(_ROLL_GATE, DEFERRED=NOT_DRAINED[0], FAILED=NOT_DRAINED[1], ROLL_FAILED=ROLL_FAILED), functions] + \
        ([stack.functions] if stack else []) + \
        [fill(_ROLL.replace("@RESTART_KUBELET@", restart_kubelet), PAGES=t.hugepages_2mi, STATE=STATE_DIR,
              KUBELET_S=ROLL_BOUNDS_S["kubelet"],
              MAINTENANCE=MAINTENANCE)] + \
        ([fill(_HOLD, PATTERN=DRIVER_STACK_PACKAGES)] if stack else [])
    if host_driver:
        roll.append(preflight)
        if pool.software.driver_version:
            roll.append(fill(_DRIVER_VERSION, VERSION=pool.software.driver_version))
        if pool.gpu.nvswitch:
            roll.append(_FABRIC_MANAGER)
        if pool.burn_in.enabled:
            roll.append(fill(_ROLL_DCGM, DCGM_S=ROLL_BOUNDS_S["dcgmi"]))
    if filesystem is not None:
        roll.append(render_roll_check(filesystem))
    roll.append(fill(_UNFENCE.replace("@PORTS@", " ".join(call(p) for p in rdma_ports(pool)) if rdma else ""),
                     SEEN=PORT_SEEN, MAINTENANCE=MAINTENANCE, PORTS_S=ROLL_BOUNDS_S["ports"]))
    return PoolPrep(f"{pool.name}: {pool.gpu.count} x {pool.gpu.model}", "".join(parts), busy + fill(
        undo, UNIT=TUNING_UNIT, SCRIPT=TUNING_SCRIPT, DROP_IN=KUBELET_DROP_IN, HUGEPAGES=HUGEPAGES_SYSCTL,
        MEMLOCK=MEMLOCK_DROP_IN, PERSISTENCE=PERSISTENCE_OVERRIDE, PEERMEM=PEERMEM_MODULES_LOAD), "".join(roll))
