"""Host preparation: one idempotent script per GPU host (../shared/reference/node-commands.md, section 7)."""

from __future__ import annotations

from typing import Any

import yaml

from ..bash import fill, heredoc, script
from ..k8s.labels import BURN_IN_TAINT
from ..spec import Host, NodePool
from ..ssh import Script

KUBELET_DROP_IN_DIR = "/etc/kubernetes/kubelet.conf.d"
KUBELET_DROP_IN = f"{KUBELET_DROP_IN_DIR}/50-gpucluster.conf"
TUNING_SCRIPT = "/usr/local/sbin/gpucluster-node-tuning"
TUNING_UNIT = "/etc/systemd/system/gpucluster-node-tuning.service"
HUGEPAGES_SYSCTL = "/etc/sysctl.d/90-gpucluster-hugepages.conf"
MEMLOCK_DROP_IN = "/etc/systemd/system/containerd.service.d/50-gpucluster-memlock.conf"
SHM_FSTAB_TAG = "# gpucluster /dev/shm"
# XIDs that mean the hardware is at fault (DBE, row remap, fell off the bus, uncontained ECC), not the job.
HARDWARE_XIDS = (48, 63, 64, 74, 79, 94, 95)


def render_kubelet_config(pool: NodePool) -> dict[str, Any]:
    """A KubeletConfiguration drop-in: new nodes register tainted until burn-in passes."""
    taints = [{"key": BURN_IN_TAINT, "value": "pending", "effect": "NoSchedule"}] if pool.burn_in.enabled else []
    taints += [{"key": t.key, "value": t.value, "effect": t.effect} for t in pool.taints]
    config: dict[str, Any] = {"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
                              "registerWithTaints": taints}
    t = pool.tuning
    if t.kubelet_cpu_manager_static:
        config.update(cpuManagerPolicy="static", reservedSystemCPUs=t.kubelet_reserved_cpus)
    if t.kubelet_topology_single_numa:
        config.update(topologyManagerPolicy="single-numa-node", topologyManagerScope="pod")
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


_PREFLIGHT = r'''
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
xids=$(dmesg 2>/dev/null | grep -E 'NVRM: Xid \(PCI:[^)]*\): (XIDS),' || true)
[[ -z "$xids" ]] || fail "hardware XID errors since boot: $(printf '%s' "$xids" | tail -n 3 | tr '\n' ' ')"
note "$gpus x @PRODUCT@ present, no uncorrected ECC or hardware XID errors"
'''

_SERVICE = r'''
if [[ "$(systemctl is-enabled @UNIT@ 2>/dev/null || true)" != enabled ]]; then
  systemctl enable @UNIT@ >/dev/null
  changed "enabled @UNIT@"
fi
if ! systemctl is-active --quiet @UNIT@; then
  systemctl start @UNIT@
  changed "started @UNIT@"
fi
'''

_FABRIC_MANAGER = r'''
# --- NVSwitch: Fabric Manager must match the driver exactly, or CUDA fails with error 802 -------------
need nv-fabricmanager "install the nvidia-fabricmanager package of the driver's version"
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | sed -n 1p)
fm=$(nv-fabricmanager --version 2>/dev/null | grep -oE '[0-9]+(\.[0-9]+)+' | sed -n 1p || true)
[[ "$fm" == "$driver" ]] || fail "nvidia-fabricmanager is ${fm:-unknown} but the driver is $driver; install the matching version"
'''

_SHM = r'''
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
'''

_HUGEPAGES = r'''
# --- hugepages ---------------------------------------------------------------------------------------
put_file @FILE@ 0644 "vm.nr_hugepages = @PAGES@"
if [[ "$(sysctl -n vm.nr_hugepages)" != @PAGES@ ]]; then
  sysctl -q -w vm.nr_hugepages=@PAGES@
  changed "reserved @PAGES@ hugepages of 2 MiB"
fi
'''

_TUNING = r'''
# --- clocks, power cap, governor: applied now and by a boot unit --------------------------------------
put_file @SCRIPT@ 0755 "$(cat @SCRIPT_DOC@)"
script_changed=$FILE_CHANGED
put_file @UNIT@ 0644 "$(cat @UNIT_DOC@)"
if (( script_changed || FILE_CHANGED )); then
  systemctl daemon-reload
  systemctl enable gpucluster-node-tuning.service >/dev/null
  systemctl restart gpucluster-node-tuning.service
  changed "applied GPU clocks, power cap and governor"
fi
'''

_NO_TUNING = r'''
if [[ -e @UNIT@ ]]; then
  systemctl disable --now gpucluster-node-tuning.service >/dev/null 2>&1 || true
  drop_file @UNIT@
  drop_file @SCRIPT@
  systemctl daemon-reload
fi
'''

_MEMLOCK = r'''
# --- RDMA: containers lock memory for the HCAs; restricted pods cannot add IPC_LOCK --------------------
put_file @FILE@ 0644 "[Service]
LimitMEMLOCK=infinity"
if (( FILE_CHANGED )); then
  systemctl daemon-reload
  if systemctl is-active --quiet containerd; then systemctl restart containerd; changed "restarted containerd"; fi
fi
'''

_KUBELET = r'''
# --- kubelet: registration taints, CPU and topology managers (a drop-in, so kubeadm upgrades keep it) --
old_policy=$(grep -h '^cpuManagerPolicy:' @DROP_IN@ 2>/dev/null || true)
put_file @DROP_IN@ 0644 "$(cat @CONFIG_DOC@)"
kubelet_changed=$FILE_CHANGED
flag=--config-dir=@DIR@
if ! grep -qF -- "$flag" /etc/default/kubelet 2>/dev/null; then
  if grep -q '^KUBELET_EXTRA_ARGS=' /etc/default/kubelet 2>/dev/null; then
    sed -i -E "s|^KUBELET_EXTRA_ARGS=\"?([^\"]*)\"?\$|KUBELET_EXTRA_ARGS=\"\\1 $flag\"|" /etc/default/kubelet
  else
    printf 'KUBELET_EXTRA_ARGS="%s"\n' "$flag" >> /etc/default/kubelet
  fi
  kubelet_changed=1
  changed "kubelet reads @DIR@"
fi
new_policy=$(grep -h '^cpuManagerPolicy:' @DROP_IN@ || true)
if (( kubelet_changed )) && systemctl is-enabled --quiet kubelet 2>/dev/null; then
  if [[ "$old_policy" != "$new_policy" ]]; then
    # The CPU manager refuses to start on a state file written under another policy.
    systemctl stop kubelet
    rm -f /var/lib/kubelet/cpu_manager_state
    note "CPU manager policy changed: drain the node before this runs on a node with work"
  fi
  systemctl restart kubelet
  changed "restarted kubelet"
fi
'''


def render_host_prep(pool: NodePool, host: Host, *, rdma: bool) -> Script:
    """`rdma`: the fabric has RDMA, so containers need unlimited locked memory."""
    info, t = pool.gpu.info, pool.tuning
    parts = [fill(_PREFLIGHT.replace("(XIDS)", "(" + "|".join(map(str, HARDWARE_XIDS)) + ")"),
                   GPUS=pool.gpu.count, MODEL=pool.gpu.model, PRODUCT=info.product)]
    if t.persistence:
        parts.append("\n# --- GPU persistence: the daemon, not the legacy nvidia-smi -pm flag\n"
                     "need nvidia-persistenced \"it ships with the NVIDIA driver\"\n"
                     + fill(_SERVICE, UNIT="nvidia-persistenced"))
    if pool.gpu.nvswitch:
        parts.append(_FABRIC_MANAGER + fill(_SERVICE, UNIT="nvidia-fabricmanager"))
    if t.gpu_power_limit_w:
        parts.append(fill(r'''
while IFS=', ' read -r index low high; do
  awk -v w=@W@ -v lo="$low" -v hi="$high" 'BEGIN { exit !(w >= lo && w <= hi) }' ||
    fail "power limit @W@ W is outside GPU $index's range $low-$high W; change tuning.gpu_power_limit_w"
done < <(nvidia-smi --query-gpu=index,power.min_limit,power.max_limit --format=csv,noheader,nounits)
''', W=t.gpu_power_limit_w))
    if t.shm_size_gib:
        parts.append(fill(_SHM, SIZE=t.shm_size_gib, TAG=SHM_FSTAB_TAG,
                           LINE=f"tmpfs /dev/shm tmpfs defaults,size={t.shm_size_gib}G 0 0 {SHM_FSTAB_TAG}"))
    if t.hugepages_2mi:
        parts.append(fill(_HUGEPAGES, FILE=HUGEPAGES_SYSCTL, PAGES=t.hugepages_2mi))
    tuning = render_tuning_script(pool)
    if tuning:
        unit = ("[Unit]\nDescription=GPU clocks, power cap and CPU governor (gpucluster)\n"
                "After=nvidia-persistenced.service\n\n[Service]\nType=oneshot\nRemainAfterExit=yes\n"
                f"ExecStart={TUNING_SCRIPT}\n\n[Install]\nWantedBy=multi-user.target")
        parts.append(fill(_TUNING, {"SCRIPT_DOC": tuning, "UNIT_DOC": unit}, SCRIPT=TUNING_SCRIPT, UNIT=TUNING_UNIT))
    else:
        parts.append(fill(_NO_TUNING, SCRIPT=TUNING_SCRIPT, UNIT=TUNING_UNIT))
    if rdma:
        parts.append(fill(_MEMLOCK, FILE=MEMLOCK_DROP_IN))
    config = yaml.safe_dump(render_kubelet_config(pool), sort_keys=False).rstrip("\n")
    parts.append(fill(_KUBELET, {"CONFIG_DOC": config}, DROP_IN=KUBELET_DROP_IN, DIR=KUBELET_DROP_IN_DIR))
    create = script(f"Prepare {host.hostname} ({pool.name}: {pool.gpu.count} x {pool.gpu.model})", host.hostname,
                    "".join(parts))
    delete = script(f"Undo the preparation of {host.hostname}", host.hostname, fill(r'''
need systemctl "this host does not run systemd"
if [[ -e @UNIT@ ]]; then systemctl disable --now gpucluster-node-tuning.service >/dev/null 2>&1 || true; fi
for f in @UNIT@ @SCRIPT@ @DROP_IN@ @HUGEPAGES@ @MEMLOCK@; do drop_file "$f"; done
systemctl daemon-reload
note "left in place: drivers, services it enabled and /dev/shm in /etc/fstab (they are harmless without it)"
''', UNIT=TUNING_UNIT, SCRIPT=TUNING_SCRIPT, DROP_IN=KUBELET_DROP_IN, HUGEPAGES=HUGEPAGES_SYSCTL,
                                                                         MEMLOCK=MEMLOCK_DROP_IN))
    return Script(create, delete)
