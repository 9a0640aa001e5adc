"""What a storage host must have installed, checked before anything changes, and installed only from the
repository the spec names (air-gapped sites name their mirror; nothing is fetched from the internet by default).

A requirement is a command, a kernel module or a path, with the EL (dnf) and Debian/Ubuntu (apt) package that
provides it; `-` where that family has none (Lustre servers are built for EL only).
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

from ..bash import call, fill
from ..repos import APT_UPDATE, repo_files
from ..spec.common import PackageRepository
from .layout import Layout

BEEGFS_SBIN = "/opt/beegfs/sbin"       # where BeeGFS packages put their setup tools and daemons
SCALE_ROOT = "/usr/lpp/mmfs"           # where Storage Scale's packages put its daemon, commands (bin/) and sources
KERNEL = "%KERNEL%"                    # replaced on the host by `uname -r`
OFED_SOURCE = "/usr/src/ofa_kernel/default"     # DOCA-OFED's (MLNX_OFED's) kernel sources, which DKMS builds against


class Requirement(NamedTuple):
    kind: str        # command, module or path
    name: str
    rpm: str
    deb: str


def lustre_server() -> list[Requirement]:
    return [Requirement("command", "mkfs.lustre", "lustre", "-"), Requirement("command", "lctl", "lustre", "-"),
            Requirement("command", "lnetctl", "lustre", "-"),
            Requirement("command", "mount.lustre", "lustre-osd-ldiskfs-mount", "-"),
            Requirement("module", "lustre", "kmod-lustre", "-"),
            Requirement("module", "osd_ldiskfs", "kmod-lustre-osd-ldiskfs", "-")]


def lustre_client(o2ib: bool = False) -> list[Requirement]:
    """The client's tools and modules; "plain|ofed" names the prebuilt modules (for the kernel's own RDMA stack)
    and the DKMS ones, built on the host against DOCA-OFED where it is installed (Whamcloud's
    lustre-client-dkms and lustre-client-modules-dkms). On o2ib the verbs LND (ko2iblnd) must be there too.
    `lfs` sets the datasets' striping and the tenants' projects and quotas from a client."""
    modules = ("kmod-lustre-client|lustre-client-dkms", f"lustre-client-modules-{KERNEL}|lustre-client-modules-dkms")
    return [Requirement("command", c, "lustre-client", "lustre-client-utils") for c in
            ("mount.lustre", "lctl", "lnetctl", "lfs")] + [
        Requirement("module", m, *modules) for m in (("lustre", "ko2iblnd") if o2ib else ("lustre",))]


# BeeGFS daemons load RDMA from this library at start and fall back to TCP without a word when it is missing
# (common/source/common/net/sock/RDMASocket.cpp dlopens it; package libbeegfs-ib on EL and Debian alike).
BEEGFS_IB = Requirement("path", "/opt/beegfs/lib/libbeegfs_ib.so", "libbeegfs-ib", "libbeegfs-ib")


def beegfs_server(version: str, roles: set[str], rdma: bool = False) -> list[Requirement]:
    setup = {"mgmtd": "beegfs-mgmtd" if version == "8" else "beegfs-setup-mgmtd", "meta": "beegfs-setup-meta",
             "storage": "beegfs-setup-storage"}
    out = [Requirement("command", setup[r], f"beegfs-{r}", f"beegfs-{r}") for r in sorted(roles)]
    out.append(Requirement("command", "mkfs.ext4", "e2fsprogs", "e2fsprogs"))
    if "storage" in roles:
        out.append(Requirement("command", "mkfs.xfs", "xfsprogs", "xfsprogs"))
    if rdma and roles - {"mgmtd"}:
        out.append(BEEGFS_IB)
    return out


def beegfs_client(version: str) -> list[Requirement]:
    out = [Requirement("command", "beegfs-setup-client", "beegfs-client", "beegfs-client")]
    if version == "8":
        out.append(Requirement("command", "beegfs", "beegfs-tools", "beegfs-tools"))
    else:
        out += [Requirement("command", "beegfs-helperd", "beegfs-helperd", "beegfs-helperd"),
                Requirement("command", "beegfs-ctl", "beegfs-utils", "beegfs-utils")]
    return out


_PROVIDE = r"""
# --- packages: what this host lacks is named, or installed from its OS family's repository, before any change ---
what=@WHAT@
# The host's family decides the package names and the repository: dnf (EL) or apt (Debian/Ubuntu).
if command -v dnf >/dev/null 2>&1; then family=el
elif command -v apt-get >/dev/null 2>&1; then family=debian
else family=unknown; fi
# pick NAMES: the package of NAMES ("plain|ofed") for this host: where DOCA-OFED replaced the kernel's RDMA
# stack, modules built against it (DKMS), since prebuilt ones match only the inbox stack.
pick() {
  if [[ "$1" != *"|"* ]]; then printf '%s' "$1"
  elif [[ -d @OFED@ ]]; then printf '%s' "${1#*|}"
  else printf '%s' "${1%|*}"; fi
}
# require KIND NAME RPM DEB: note NAME (a command, kernel module or path) if this host lacks it, and the package
# of this host's family that provides it.
require() {
  case "$1" in
    command) command -v "$2" >/dev/null 2>&1 && return 0 ;;
    module) modinfo "$2" >/dev/null 2>&1 && return 0 ;;
    path) [[ -e "$2" ]] && return 0 ;;
  esac
  MISSING+=("$1 $2")
  if [[ "$family" == el ]]; then PACKAGES+=("$(pick "$3")"); else PACKAGES+=("$(pick "${4//@KERNEL_MARK@/$(uname -r)}")"); fi
}
requirements() {
  MISSING=() PACKAGES=()
@REQUIRE@
}
requirements
if (( ${#MISSING[@]} )); then
  for p in "${PACKAGES[@]}"; do
    [[ "$p" != - ]] || fail "no package of this distribution ($family) provides $(IFS=,; echo "${MISSING[*]}") ($what)"
  done
  mapfile -t PACKAGES < <(printf '%s\n' "${PACKAGES[@]}" | sort -u)
  repo_url=""
  case "$family" in
@INSTALL@
    *) fail "missing $(IFS=,; echo "${MISSING[*]}") ($what), and neither dnf nor apt-get is here to install it" ;;
  esac
  changed "installed ${PACKAGES[*]} from $repo_url"
  requirements
  (( ${#MISSING[@]} == 0 )) || fail "still missing $(IFS=,; echo "${MISSING[*]}") after installing ${PACKAGES[*]} from $repo_url"
fi
"""

_REFUSE = r"""    @FAMILY@) fail "missing $(IFS=,; echo "${MISSING[*]}") ($what: packages ${PACKAGES[*]}); install them, or name the site's @FAMILY@ repository in storage.package_repositories" ;;"""

_INSTALL_EL = r"""    el)
      repo_url=@EL_URL@
      put_file @YUM_REPO@ 0644 "$(cat @YUM_DOC@)"
      dnf install -y -q "${PACKAGES[@]}" >/dev/null ;;"""

_INSTALL_DEBIAN = r"""    debian)
      repo_url=@DEB_URL@
      @APT_KEY@
      put_file @APT_LIST@ 0644 @APT_LINE@
      @APT_UPDATE@
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null ;;"""


def provide(layout: Layout, repositories: Sequence[PackageRepository], what: str, needs: list[Requirement]) -> str:
    """The script part that checks `needs` and installs what is missing from the repository of the host's OS
    family (an EL host never gets an apt source, nor a Debian one a dnf repository), or stops naming it."""
    body = _PROVIDE.replace("@REQUIRE@", "\n".join("  " + call("require", *r) for r in needs))
    by_family = {r.os_family: r for r in repositories}      # one a family (the spec checks)
    repo_id = f"gpucluster-{layout.kind}-{layout.fs_name}"
    files = repo_files(repo_id, f"gpucluster {layout.kind} {layout.version} ({layout.fs_name})", repositories)
    cases = []
    docs: dict[str, str] = {}
    values: dict[str, str] = {}
    if "el" not in by_family:
        cases.append(_REFUSE.replace("@FAMILY@", "el"))
    else:
        docs["YUM_DOC"] = files.yum_repo
        values["YUM_REPO"] = f"/etc/yum.repos.d/{repo_id}.repo"
        values["EL_URL"] = by_family["el"].url
        cases.append(_INSTALL_EL)
    if "debian" not in by_family:
        cases.append(_REFUSE.replace("@FAMILY@", "debian"))
    else:
        cases.append(_INSTALL_DEBIAN.replace("@APT_KEY@", files.apt_keys).replace("@APT_UPDATE@", APT_UPDATE))
        values["APT_LIST"] = f"/etc/apt/sources.list.d/{repo_id}.list"
        values["DEB_URL"] = by_family["debian"].url
        values["APT_LINE"] = files.apt_list
    return fill(body.replace("@INSTALL@", "\n".join(cases)), docs, KERNEL_MARK=KERNEL, WHAT=what, OFED=OFED_SOURCE,
                **values)
