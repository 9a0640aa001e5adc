"""What a storage host must have installed, checked before anything changes, and installed only from the
repository the spec names (air-gapped sites name their mirror; nothing is fetched from the internet by default).

A requirement is a command, a kernel module or a path, with the EL (dnf) and Debian/Ubuntu (apt) package that
provides it; `-` where that family has none (Lustre servers are built for EL only).
"""

from __future__ import annotations

from typing import NamedTuple

from ..bash import call, fill
from ..spec.storage import PackageRepository
from .layout import Layout

BEEGFS_SBIN = "/opt/beegfs/sbin"       # where BeeGFS packages put their setup tools and daemons
KERNEL = "%KERNEL%"                    # replaced on the host by `uname -r`


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


def lustre_client() -> list[Requirement]:
    return [Requirement("command", c, "lustre-client", "lustre-client-utils") for c in
            ("mount.lustre", "lctl", "lnetctl")] + [
        Requirement("module", "lustre", "kmod-lustre-client", f"lustre-client-modules-{KERNEL}")]


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


_PROVIDE = r'''
# --- packages: what this host lacks is named, or installed from the spec's repository, before any change ---
what=@WHAT@
# require KIND NAME RPM DEB: note NAME (a command, kernel module or path) if this host lacks it, and the package
# of this host's family (dnf or apt) that provides it.
require() {
  case "$1" in
    command) command -v "$2" >/dev/null 2>&1 && return 0 ;;
    module) modinfo "$2" >/dev/null 2>&1 && return 0 ;;
    path) [[ -e "$2" ]] && return 0 ;;
  esac
  MISSING+=("$1 $2")
  if command -v dnf >/dev/null 2>&1; then PACKAGES+=("$3"); else PACKAGES+=("${4//@KERNEL_MARK@/$(uname -r)}"); fi
}
requirements() {
  MISSING=() PACKAGES=()
@REQUIRE@
}
requirements
if (( ${#MISSING[@]} )); then
  for p in "${PACKAGES[@]}"; do
    [[ "$p" != - ]] || fail "no package of this distribution provides $(IFS=,; echo "${MISSING[*]}") ($what)"
  done
  mapfile -t PACKAGES < <(printf '%s\n' "${PACKAGES[@]}" | sort -u)
@INSTALL@
fi
'''

_REFUSE = r'''  fail "missing $(IFS=,; echo "${MISSING[*]}") ($what: packages ${PACKAGES[*]}); install them, or name the site's repository in storage.package_repository"'''

_INSTALL = r'''  if command -v dnf >/dev/null 2>&1; then
    put_file @YUM_REPO@ 0644 "$(cat @YUM_DOC@)"
    dnf install -y -q "${PACKAGES[@]}" >/dev/null
  elif command -v apt-get >/dev/null 2>&1; then
    @APT_KEY@
    put_file @APT_LIST@ 0644 @APT_LINE@
    apt-get update -qq -o Dir::Etc::sourcelist=@APT_LIST@ -o Dir::Etc::sourceparts=- -o APT::Get::List-Cleanup=0
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null
  else
    fail "neither dnf nor apt-get is here to install $(IFS=,; echo "${MISSING[*]}")"
  fi
  changed "installed ${PACKAGES[*]} from @URL@"
  requirements
  (( ${#MISSING[@]} == 0 )) || fail "still missing $(IFS=,; echo "${MISSING[*]}") after installing from @URL@"'''


def provide(layout: Layout, repository: PackageRepository | None, what: str, needs: list[Requirement]) -> str:
    """The script part that checks `needs` and installs what is missing from `repository` (or stops)."""
    body = _PROVIDE.replace("@REQUIRE@", "\n".join("  " + call("require", *r) for r in needs))
    if repository is None:
        return fill(body.replace("@INSTALL@", _REFUSE), KERNEL_MARK=KERNEL, WHAT=what)
    repo_id = f"gpucluster-{layout.kind}-{layout.fs_name}"
    key = repository.gpg_key_url
    keyring = f"/etc/apt/keyrings/{repo_id}.asc"
    yum = f"[{repo_id}]\nname=gpucluster {layout.kind} {layout.version} ({layout.fs_name})\nbaseurl={repository.url}\nenabled=1\n" + (
        f"gpgcheck=1\ngpgkey={key}" if key else "gpgcheck=0")
    apt_key = call("curl", "-fsSL", "--create-dirs", "-o", keyring, key) if key else ":  # trusted=yes: unsigned"
    return fill(body.replace("@INSTALL@", _INSTALL).replace("@APT_KEY@", apt_key), {"YUM_DOC": yum},
                KERNEL_MARK=KERNEL, WHAT=what, URL=repository.url, YUM_REPO=f"/etc/yum.repos.d/{repo_id}.repo",
                APT_LIST=f"/etc/apt/sources.list.d/{repo_id}.list",
                APT_LINE=" ".join(["deb", f"[{f'signed-by={keyring}' if key else 'trusted=yes'}]", repository.url,
                                   repository.apt_suite, *repository.apt_components]))
