"""The driver stack as desired state: the NVIDIA driver, its Fabric Manager and DOCA-OFED at the spec's versions.

With `software.package_repositories`, preparation writes the repositories and a version pin, and finds what is
not at its version: where no tenant's work runs it installs it and loads the new driver at once; elsewhere it
leaves that owed to the pool's rollout (the `driver` restart), which installs it on the drained host. A package
is picked by its upstream version (the part before the packaging revision), so the same spec installs from
NVIDIA's repository, Ubuntu's archive or a site mirror of either. Fabric Manager is always the driver's version.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from ..bash import call, fill
from ..repos import APT_UPDATE, repo_files
from ..spec.hardware import Software

REPO_ID = "gpucluster-driver-stack"
APT_LIST = f"/etc/apt/sources.list.d/{REPO_ID}.list"
APT_PIN = f"/etc/apt/preferences.d/{REPO_ID}"
YUM_REPO = f"/etc/yum.repos.d/{REPO_ID}.repo"
# Packages of the driver stack (NVIDIA driver, Fabric Manager, DOCA-OFED/MLNX_OFED), held at the versions the host
# runs: an unattended upgrade would move them on every node at once, under running jobs, and a Fabric Manager
# upgraded apart from the driver stops CUDA (error 802). They change on purpose only: through the spec's
# versions, or by hand (unhold, upgrade, reboot, node by node).
DRIVER_STACK_PACKAGES = (r"^(nvidia-driver|nvidia-open|nvidia-dkms|nvidia-kernel|nvidia-firmware|nvidia-utils|"
                         r"nvidia-compute-utils|nvidia-fabricmanager|nvidia-persistenced|nvidia-modprobe|libnvidia-|"
                         r"cuda-drivers|kmod-nvidia|doca-|mlnx-ofed|mlnx-tools|ofed-|kmod-mlnx)")


class Part(NamedTuple):
    what: str
    version: str
    deb: str         # package names that may carry it on Debian/Ubuntu, tried in order
    rpm: str         # and on EL


def parts(software: Software, nvswitch: bool) -> list[Part]:
    """What the spec pins. Package names per branch: NVIDIA's repository and Ubuntu's archive name the driver
    and Fabric Manager by branch up to 580 (nvidia-open-570, nvidia-driver-570-server-open,
    nvidia-fabricmanager-570) and without it from 590 (NVIDIA driver installation guide, "Ubuntu 590 and later
    packages"); EL's meta packages are nvidia-open and cuda-drivers. DOCA's profile is doca-ofed on both."""
    out = []
    v = software.driver_version
    if v:
        b = v.split(".")[0]
        if software.driver_kernel_modules == "open":
            out.append(Part("the NVIDIA driver", v, f"nvidia-open-{b} nvidia-driver-{b}-server-open "
                                                    f"nvidia-driver-{b}-open nvidia-open", "nvidia-open"))
        else:
            out.append(Part("the NVIDIA driver", v, f"cuda-drivers-{b} nvidia-driver-{b}-server nvidia-driver-{b} "
                                                    "cuda-drivers", "cuda-drivers"))
        if nvswitch:
            out.append(Part("Fabric Manager", v, f"nvidia-fabricmanager-{b} nvidia-fabricmanager",
                            "nvidia-fabricmanager"))
    if software.doca_ofed_version:
        out.append(Part("DOCA-OFED", software.doca_ofed_version, "doca-ofed", "doca-ofed"))
    return out


# Functions of preparation and the rollout's step. `stack_missing`: the indexes of the parts not installed at
# their version; the driver is also due while another version is loaded.
_FUNCTIONS = r"""
# --- the driver stack at the spec's versions (software.package_repositories) ---------------------------
if command -v apt-get >/dev/null 2>&1; then stack_family=debian
elif command -v dnf >/dev/null 2>&1; then stack_family=el
else fail "neither apt-get nor dnf is here to install the driver stack (software.package_repositories)"; fi
part_what=() part_version=() part_names=()
# stack_part WHAT VERSION DEB_NAMES RPM_NAMES
stack_part() {
  part_what+=("$1") part_version+=("$2")
  if [[ $stack_family == debian ]]; then part_names+=("$3"); else part_names+=("$4"); fi
}
@PARTS@
driver_want=@DRIVER@
stack_packages=@PACKAGES@
# upstream VERSION: the version without its epoch and packaging revision (2:570.124.06-0ubuntu1 -> 570.124.06)
upstream() { local v=${1#*:}; if [[ $stack_family == debian ]]; then printf '%s' "${v%-*}"; else printf '%s' "${v%%-*}"; fi; }
# installed_at NAMES VERSION: one of NAMES is installed at VERSION
installed_at() {
  local name v
  for name in $1; do
    if [[ $stack_family == debian ]]; then
      v=$(dpkg-query -W -f '${db:Status-Abbrev}|${Version}' "$name" 2>/dev/null || true)
      [[ ${v:1:1} == i ]] || continue     # installed (ii, or hi: held)
      v=${v#*|}
    else
      v=$(rpm -q --qf '%{VERSION}' "$name" 2>/dev/null) || continue
    fi
    if [[ "$(upstream "$v")" == "$2" ]]; then return 0; fi
  done
  return 1
}
# stack_installed: the driver stack's packages installed here, one a line
stack_installed() {
  if [[ $stack_family == debian ]]; then
    dpkg-query -W -f '${db:Status-Abbrev} ${Package}\n' | awk 'substr($1, 2, 1) == "i" { print $2 }' | grep -E "$stack_packages" || true
  else
    rpm -qa --qf '%{NAME}\n' | grep -E "$stack_packages" | sort -u || true
  fi
}
loaded_driver() { cat /sys/module/nvidia/version 2>/dev/null || true; }
stack_missing=()
stack_check() {
  local i
  stack_missing=()
  for i in "${!part_what[@]}"; do
    installed_at "${part_names[$i]}" "${part_version[$i]}" || stack_missing+=("$i")
  done
}
stack_due() {
  stack_check
  (( ${#stack_missing[@]} )) || { [[ -n $driver_want && "$(loaded_driver)" != "$driver_want" ]]; }
}
# available_at NAME VERSION: the full version of NAME at VERSION in the repositories, printed
available_at() {
  local v versions
  if [[ $stack_family == debian ]]; then
    mapfile -t versions < <(apt-cache madison "$1" 2>/dev/null | awk -F'|' '{ gsub(/ /, "", $2); print $2 }')
  else
    mapfile -t versions < <(dnf list --showduplicates -q "$1" 2>/dev/null | awk 'NF == 3 && $1 != "Available" { print $2 }')
  fi
  for v in "${versions[@]}"; do
    if [[ "$(upstream "$v")" == "$2" ]]; then printf '%s' "$v"; return 0; fi
  done
  return 1
}
# add_spec NAME FULL: NAME at FULL (a version available_at printed) for the package manager, onto `specs`
add_spec() { if [[ $stack_family == debian ]]; then specs+=("$1=$2"); else specs+=("$1-${2#*:}"); fi; }
stack_install() {
  local i name full specs=() names=()
  (( ${#stack_missing[@]} )) || return 0
  if [[ $stack_family == debian ]]; then
    @APT_KEYS@
    @APT_UPDATE@
  else
    dnf makecache -q >/dev/null
  fi
  for i in "${stack_missing[@]}"; do
    full=""
    for name in ${part_names[$i]}; do
      if full=$(available_at "$name" "${part_version[$i]}"); then break; fi
    done
    [[ -n $full ]] || fail "${part_what[$i]} ${part_version[$i]} is in none of the repositories (software.package_repositories) as any of ${part_names[$i]}; mirror that version there, or change the spec's version"
    names+=("$name")
    add_spec "$name" "$full"
  done
  # the driver's other installed packages (libraries a meta package wants at ">=" the old version) come along
  while read -r name; do
    if [[ -z $driver_want || " ${names[*]} " == *" $name "* ]] || installed_at "$name" "$driver_want"; then continue; fi
    if full=$(available_at "$name" "$driver_want"); then add_spec "$name" "$full"; fi
  done < <(stack_installed)
  if [[ $stack_family == debian ]]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends --allow-change-held-packages \
      --allow-downgrades -o Dpkg::Options::=--force-confold "${specs[@]}" >/dev/null
  else
    # the holds of the versions installed before (preparation locks the driver stack) give way to the spec's
    while read -r lock; do
      dnf versionlock delete "$lock" >/dev/null
    done < <(dnf versionlock list 2>/dev/null | grep -E "^[0-9]*:?${stack_packages#^}" || true)
    dnf install -y -q --allowerasing "${specs[@]}" >/dev/null
  fi
  changed "installed ${specs[*]}"
  stack_check
  (( ${#stack_missing[@]} == 0 )) || fail "${part_what[${stack_missing[0]}]} is still not at ${part_version[${stack_missing[0]}]} after installing ${specs[*]}"
}
# stack_load: the installed driver (and a new DOCA-OFED) loaded, on a host where no tenant's pod runs: the node
# agents' pods and the services holding the GPUs stop, the modules are reloaded, and all of them start again.
# Where something else still holds the GPUs the host must reboot, which loads what is installed.
stack_load() {
  local loaded unit stopped=() sandboxes=() modules=() m out
  # what was stopped starts again in reverse, kubelet last, on success and failure alike: pods start only
  # once the services they need (persistenced, Fabric Manager) run
  start_stopped() { local i; for ((i = ${#stopped[@]} - 1; i >= 0; i--)); do systemctl start "${stopped[$i]}"; done; }
  loaded=$(loaded_driver)
  if [[ -z $driver_want || "$loaded" == "$driver_want" ]] && [[ " $1 " != *" DOCA-OFED "* ]]; then return 0; fi
  for unit in kubelet nvidia-dcgm nvidia-fabricmanager nvidia-persistenced; do
    if systemctl is-active --quiet "$unit"; then systemctl stop "$unit"; stopped+=("$unit"); fi
  done
  mapfile -t sandboxes < <(crictl pods -q)
  if (( ${#sandboxes[@]} )); then crictl stopp "${sandboxes[@]}" >/dev/null; fi
  for m in nvidia_peermem nvidia_uvm nvidia_drm nvidia_modeset nvidia; do if [[ -d /sys/module/$m ]]; then modules+=("$m"); fi; done
  if (( ${#modules[@]} )) && ! out=$(modprobe -r "${modules[@]}" 2>&1); then
    start_stopped
    fail "the driver stack is installed, but ${loaded:-the old driver} stays loaded ($out): something outside Kubernetes holds the GPUs; reboot $HOST, which loads what is installed, then run pulumi up again"
  fi
  if [[ " $1 " == *" DOCA-OFED "* ]] && systemctl cat openibd >/dev/null 2>&1; then
    systemctl restart openibd
    owe restart-fabric      # the reloaded NICs lost their settings: applied again after this (fabric/host.py)
  fi
  if [[ -n $driver_want ]]; then
    modprobe nvidia
    modprobe nvidia_uvm
    if [[ " ${modules[*]} " == *" nvidia_peermem "* ]]; then modprobe nvidia_peermem; fi
  fi
  start_stopped
  loaded=$(loaded_driver)
  [[ -z $driver_want || "$loaded" == "$driver_want" ]] || fail "driver ${loaded:-none} is loaded after installing $driver_want; reboot $HOST, then run pulumi up again"
  changed "loaded the driver stack${driver_want:+ (driver $driver_want)}"
}
# stack_apply: what is not at the spec's version installed and loaded (the caller made sure no tenant's pod runs)
stack_apply() {
  local what=() i
  stack_check
  for i in "${stack_missing[@]}"; do what+=("${part_what[$i]}"); done
  stack_install
  stack_load "${what[*]}"
}
"""

# Preparation: the repositories and the pin written (in place, always); what is not at its version installed
# now where that disturbs nobody, else owed to the rollout.
_PREPARE = r"""
stack_files
if stack_due; then
  restart=(driver)
  defer_if_busy
  if (( ${#restart[@]} )); then
    stack_apply
    paid restart-driver
  else
    note "the driver stack is not at the spec's versions (driver $(loaded_driver)): left to the pool's rollout"
  fi
else
  paid restart-driver
fi
"""

# The repositories of the host's family (none: stop, naming the fix) and, on Debian/Ubuntu, the version pin.
_FILES = r"""
stack_files() {
  local apt_lines=@APT_LINES@ yum_repo
  yum_repo="$(cat @YUM_DOC@)"
  if [[ $stack_family == debian && -n $apt_lines ]]; then
    put_file @APT_LIST@ 0644 "$apt_lines"
    @PIN@
  elif [[ $stack_family == el && -n $yum_repo ]]; then
    put_file @YUM_REPO@ 0644 "$yum_repo"
  else
    fail "this host installs with $stack_family's packages, but software.package_repositories has no $stack_family repository; add the site's mirror for it"
  fi
}
"""


# Without repositories nothing installs the driver: a reload owed before is owed no more, and the repositories
# and pin an earlier spec wrote go (the pin would hold apt to the old version through a manual upgrade).
NO_STACK = "\n".join(["", "paid restart-driver", *(call("drop_file", f) for f in (APT_LIST, APT_PIN, YUM_REPO)),
                      ""])


class DriverStack(NamedTuple):
    functions: str      # defines stack_apply and what it needs (in preparation and the rollout's step)
    prepare: str        # preparation's part: files, then install now or owe


def render_driver_stack(software: Software, *, nvswitch: bool) -> DriverStack | None:
    """None without package repositories: the versions are then only checked, as before."""
    if not software.package_repositories:
        return None
    pinned = parts(software, nvswitch)
    files = repo_files(REPO_ID, "gpucluster driver stack", software.package_repositories)
    driver = software.driver_version or ""
    # apt prefers the pinned version of every driver package, dependencies included (a meta package's
    # dependencies are often ">=", which would pull the newest); a version no package has pins nothing.
    pin = (call("put_file", APT_PIN, "0644", "Package: *nvidia* cuda-drivers* libxnvctrl*\n"
                f"Pin: version /^([0-9]+:)?{re.escape(driver)}-/\nPin-Priority: 1001") if driver
           else call("drop_file", APT_PIN))
    functions = fill(_FUNCTIONS.replace("@APT_KEYS@", files.apt_keys.replace("\n", "\n    "))
                     .replace("@APT_UPDATE@", APT_UPDATE)
                     .replace("@PARTS@", "\n".join(call("stack_part", *p) for p in pinned)),
                     APT_LIST=APT_LIST, DRIVER=driver, PACKAGES=DRIVER_STACK_PACKAGES)
    files_fn = fill(_FILES.replace("@PIN@", pin), {"YUM_DOC": files.yum_repo},
                    APT_LIST=APT_LIST, APT_LINES=files.apt_list, YUM_REPO=YUM_REPO)
    return DriverStack(functions + files_fn, _PREPARE)
