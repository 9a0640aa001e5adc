"""The parallel filesystem's scripts: servers, clients and the shared directories, for Lustre 2.15 and BeeGFS
7.4/8 (../shared/reference/node-commands.md, sections 5 and 6).

Data safety first: every device is probed (blkid -p) before anything changes, and one that holds anything but
the very target this spec puts there stops the script with what it found, unless its `reformat` is set. A device
that already is its target is never formatted again, reformat or not, so a second run changes nothing. Delete
scripts unmount and stop; they never erase a target.
"""

from __future__ import annotations

import shlex

from ..bash import call, fill, script
from ..spec import ClusterSpec
from ..spec.storage import StorageSpec
from ..ssh import Script
from . import packages
from .layout import DATA_ROLES, Layout, Target
from .packages import provide

LNET_CONF = "/etc/lnet.conf"
LNET_RUNNING = "/var/lib/gpucluster/lnet.conf.imported"   # what LNet was last configured from, by this tool
BEEGFS_AUTH = "/etc/beegfs/conn.auth"
BEEGFS_INTERFACES = "/etc/beegfs/gpucluster-interfaces"
STATE_DIR = "/etc/gpucluster"
BEEGFS_GRPC_PORT = 8010
DEFAULT_POOL = "1"        # BeeGFS's default storage pool
DIRECTORY_TIMEOUT_S = 300  # one filesystem command of the shared directories' step, at most
BEEGFS_SETTLE_S = 5       # a BeeGFS daemon that rejects its configuration exits within this after its start
BEEGFS_IB_LIB = "/opt/beegfs/lib/libbeegfs_ib.so"     # RDMA for BeeGFS daemons (package libbeegfs-ib)

_DEVICES = r'''
# device_state DEVICE LABEL...: "empty", "ours" (it carries one of the labels) or what else it holds.
device_state() {
  local found type label want
  found=$(blkid -p -o export "$1" 2>/dev/null || true)
  if [[ -z "$found" ]]; then echo empty; return 0; fi
  type=$(sed -n 's/^TYPE=//p' <<<"$found")
  label=$(sed -n 's/^LABEL=//p' <<<"$found")
  for want in "${@:2}"; do
    if [[ -n "$label" && "$label" == "$want" ]]; then echo ours; return 0; fi
  done
  if [[ -z "$type" ]]; then type="$(sed -n 's/^PTTYPE=//p' <<<"$found") partition table"; fi
  printf '%s%s\n' "$type" "${label:+ labelled $label}"
}
# check_device DEVICE REFORMAT LABEL...: stop, before anything changes, where formatting would destroy data.
check_device() {
  local state
  [[ -b "$1" ]] || fail "$1 is not a block device on this host (storage target device)"
  state=$(device_state "$@")
  if [[ "$state" == empty || "$state" == ours ]]; then return 0; fi
  if [[ "$2" != true ]]; then
    fail "$1 holds $state; it is left alone to keep its data: point the target at an empty device, or set reformat: true on it to destroy the data"
  fi
  note "$1 holds $state and is formatted over (reformat: true)"
}
# check_raid DEVICE LEVEL: an md array is at the level the spec declares (a RAID-0 declared raid6 loses the
# target with one disk); hardware RAID is not visible from here and is taken as declared.
check_raid() {
  local dev level
  dev=$(readlink -f "$1")
  if [[ -r /sys/class/block/${dev##*/}/md/level ]]; then
    level=$(cat "/sys/class/block/${dev##*/}/md/level")
    [[ "$level" == "$2" ]] || fail "$1 is an md $level array but the spec declares $2 (raid_level): correct raid_level, or rebuild the array"
  else
    note "$1: $2 as declared (not an md array; hardware RAID is not checked from the host)"
  fi
}
# must_format DEVICE LABEL...: the device is not yet this target (check_device allowed formatting it).
must_format() { [[ "$(device_state "$@")" != ours ]]; }
# mount_at DEVICE_OR_SOURCE MOUNTPOINT TYPE OPTIONS: an fstab line of ours for it, and mounted now.
mount_at() {
  local line="$1 $2 $3 $4 0 0 # gpucluster"
  if ! grep -qxF "$line" /etc/fstab; then
    grep -v " $2 .* # gpucluster\$" /etc/fstab > /etc/fstab.gpucluster-new || true
    printf '%s\n' "$line" >> /etc/fstab.gpucluster-new
    mv -f /etc/fstab.gpucluster-new /etc/fstab
    changed "fstab: $2"
  fi
  mkdir -p "$2"
  if ! findmnt -rn "$2" >/dev/null; then
    mount "$2"
    changed "mounted $2"
  fi
}
# unmount_at MOUNTPOINT: unmounted and out of fstab; the data stays where it is.
unmount_at() {
  if findmnt -rn "$1" >/dev/null; then
    umount "$1" || fail "$1 is busy; stop what uses it (fuser -vm $1) and run again"
    changed "unmounted $1"
  fi
  if grep -q " $1 .* # gpucluster\$" /etc/fstab; then
    grep -v " $1 .* # gpucluster\$" /etc/fstab > /etc/fstab.gpucluster-new || true
    mv -f /etc/fstab.gpucluster-new /etc/fstab
    changed "fstab: removed $1"
  fi
}
'''

_BASE = 'need blkid "install util-linux"\nneed findmnt "install util-linux"\n'
_BEEGFS_PATH = f'export PATH="{packages.BEEGFS_SBIN}:$PATH"     # the setup tools and daemons live there\n'

_LNET = r'''
# LNet from /etc/lnet.conf, which lnet.service imports at start; this host's NID must come up. A changed file
# owes its import, which swaps the NI LNet runs (kept in @RUNNING@) for the file's.
@VERBS@put_file @LNET_CONF@ 0644 "$(cat @LNET_DOC@)" lnet-import
systemctl enable lnet --quiet
if ! systemctl is-active --quiet lnet; then
  systemctl start lnet
  changed "started lnet"
elif owed lnet-import; then
  if [[ -f @RUNNING@ ]]; then lnetctl import --del < @RUNNING@ >/dev/null 2>&1 || true; fi
  lnetctl import --del < @LNET_CONF@ >/dev/null 2>&1 || true     # a run cut off after its import
  lnetctl import < @LNET_CONF@
  changed "imported @LNET_CONF@"
fi
if owed lnet-import || ! same_file @RUNNING@ "$(cat @LNET_CONF@)"; then
  mkdir -p "$(dirname @RUNNING@)"
  cp @LNET_CONF@ @RUNNING@
  paid lnet-import
fi
lctl list_nids | grep @NID_MATCH@ || fail "LNet has no @NET@ NID on @IFACE@ (lctl list_nids: $(lctl list_nids | tr '\n' ' ')); check the interface's address and link"
'''


def _lnet(layout: Layout, net: str, interface: str, nid: str | None) -> str:
    """`nid`: the exact NID this host must have (a server's, which clients are given), else any on `net`."""
    doc = f"net:\n    - net type: {net}\n      local NI(s):\n        - interfaces:\n              0: {interface}"
    match = call("-qxF", nid) if nid else call("-q", f"@{net}$")
    verbs = fill(_VERBS_LND, OFED=packages.OFED_SOURCE) if net == "o2ib" else ""
    return fill(_LNET.replace("@NID_MATCH@", match).replace("@VERBS@", verbs), {"LNET_DOC": doc},
                LNET_CONF=LNET_CONF, NET=net, IFACE=interface, RUNNING=LNET_RUNNING)


# o2ib needs the verbs LND, built for the kernel and RDMA stack the host runs: loaded first, so a mismatch is
# named here rather than as lnet.service failing to configure its network.
_VERBS_LND = r"""if ! lnd_error=$(modprobe ko2iblnd 2>&1); then
  stack="the kernel's own RDMA stack"
  if [[ -d @OFED@ ]]; then stack="DOCA-OFED"; fi
  fail "the Lustre verbs driver ko2iblnd does not load on kernel $(uname -r) with $stack ($lnd_error): its modules were built for another kernel or RDMA stack; with DOCA-OFED install the DKMS modules (lustre-client-dkms, lustre-client-modules-dkms), which build against it"
fi
"""


def _checks(targets: tuple[Target, ...]) -> str:
    return "".join(call("check_device", t.device, "true" if t.reformat else "false", *_labels(t)) + "\n"
                   + call("check_raid", t.device, t.raid_level) + "\n" for t in targets)


def _labels(t: Target) -> tuple[str, ...]:
    """Labels a formatted target carries: Lustre writes fsname:OSTxxxx until the first mount registers it."""
    return (t.label, t.label.replace("-", ":", 1)) if "-" in t.label and t.role != "mgs" else (t.label,)


# --- Lustre ---------------------------------------------------------------------------------------------

def _mkfs_lustre(layout: Layout, t: Target, mgs_nids: tuple[str, ...]) -> list[str]:
    words = ["mkfs.lustre"]
    if t.role != "mgs":
        words += [f"--fsname={layout.fs_name}", f"--index={t.index}"]
    words += {"mgs": ["--mgs"], "mgs-mdt": ["--mgs", "--mdt"], "mdt": ["--mdt"], "ost": ["--ost"]}[t.role]
    if t.role in ("mdt", "ost"):
        words += [f"--mgsnode={n}" for n in mgs_nids]
    if len(t.service_nids) > 1:
        words += [f"--servicenode={n}" for n in t.service_nids]
    if t.reformat:
        words.append("--reformat")
    return words + [t.device]


def render_lustre_server(spec: ClusterSpec, layout: Layout, hostname: str) -> Script:
    targets = layout.on(hostname)
    server = next(s for s in layout.servers if s.hostname == hostname)
    net = spec.storage_lnet
    mgs_nids = tuple(layout.manager.split(":"))
    body = [_BASE + _DEVICES + "# --- every device first: nothing changes unless all of them can be used ---\n"
            + _checks(targets) + provide(layout, spec.storage.package_repositories,
                                         f"the Lustre {layout.version} server", packages.lustre_server()),
            _lnet(layout, net, spec.storage.server_interface or "", f"{server.nid_address}@{net}")]
    for t in targets:
        failover = len(t.service_nids) > 1     # an HA manager mounts failover targets, not boot
        options = "defaults,_netdev,x-systemd.requires=lnet.service" + (",noauto" if failover else "")
        body.append("\nif " + call("must_format", t.device, *_labels(t)) + "; then\n  "
                    + call(*_mkfs_lustre(layout, t, mgs_nids)) + " >/dev/null\n  "
                    + call("changed", f"formatted {t.device} as {t.label}") + "\nfi\n"
                    + call("mount_at", t.device, t.mount, "lustre", options))
    if any(t.role in ("mgs", "mgs-mdt") for t in targets):
        body.append(_persistent_params(spec, layout))
    roles = ", ".join(f"{t.role} {t.index}" for t in targets)
    create = script(f"Lustre {layout.fs_name} server {hostname}: {roles}", hostname, "\n".join(body))
    delete = script(f"Stop Lustre {layout.fs_name} on {hostname} (the targets keep their data)", hostname,
                    _DEVICES + "".join(call("unmount_at", t.mount) + "\n" for t in reversed(targets)))
    return Script(create, delete)


def lustre_params(spec: ClusterSpec, fs: str) -> list[str]:
    """`lctl set_param -P` settings, which the MGS hands to every server and client of the filesystem; patterns
    name this filesystem so another one on the same nodes is untouched (reference 5.4)."""
    out = []
    if spec.storage.effective_quotas:      # users, groups and projects (the tenants' directories)
        out += [f"osd-*.{fs}-MDT*.quota_slave.enabled=ugp", f"osd-*.{fs}-OST*.quota_slave.enabled=ugp"]
    tune = spec.storage.client_tunables
    if tune is None:
        return out
    if tune.rpc_size_mib is not None:      # the servers' bulk size must allow it; clients negotiate at connect
        out += [f"obdfilter.{fs}-OST*.brw_size={tune.rpc_size_mib}",
                f"osc.{fs}-OST*.max_pages_per_rpc={tune.rpc_size_mib}M"]
    if tune.rpcs_in_flight is not None:
        out += [f"osc.{fs}-OST*.max_rpcs_in_flight={tune.rpcs_in_flight}",
                f"mdc.{fs}-MDT*.max_rpcs_in_flight={tune.rpcs_in_flight}"]
    if tune.read_ahead_mib is not None:
        out.append(f"llite.{fs}-*.max_read_ahead_mb={tune.read_ahead_mib}")
    if tune.read_ahead_per_file_mib is not None:
        out.append(f"llite.{fs}-*.max_read_ahead_per_file_mb={tune.read_ahead_per_file_mib}")
    return out


def _persistent_params(spec: ClusterSpec, layout: Layout) -> str:
    """Set on the MGS when the wanted list differs from the one recorded there. A setting removed from the
    spec is deleted (`-d`), so the filesystem goes back to Lustre's default."""
    params = lustre_params(spec, layout.fs_name)
    wanted = "\n".join(params)
    return fill(r'''
# Persistent parameters (quotas, client tunables), from the MGS to every node of the filesystem.
if ! same_file @STATE@ "$(cat @WANTED_DOC@)"; then
  if [[ -f @STATE@ ]]; then
    while read -r old; do
      grep -qxF "$old" <<<"$(cat @WANTED_DOC@)" || lctl set_param -P -d "${old%%=*}" >/dev/null
    done < @STATE@
  fi
@SET@
  mkdir -p @STATE_DIR@
  put_file @STATE@ 0644 "$(cat @WANTED_DOC@)" >/dev/null
  changed "persistent parameters: @COUNT@"
fi'''.replace("@SET@", "\n".join("  " + call("lctl", "set_param", "-P", p) + " >/dev/null" for p in params) or "  :"),
                {"WANTED_DOC": wanted}, STATE=f"{STATE_DIR}/lustre-{layout.fs_name}-params", STATE_DIR=STATE_DIR,
                COUNT=f"{len(params)} set")


def render_lustre_client(spec: ClusterSpec, layout: Layout, hostname: str, interface: str) -> Script:
    net = spec.storage_lnet
    body = _BASE + provide(layout, spec.storage.package_repositories, f"the Lustre {layout.version} client",
                           packages.lustre_client(o2ib=net == "o2ib")) + _DEVICES + _lnet(layout, net, interface, None) + "\n" + call(
        "mount_at", layout.client_source, layout.mount_point, "lustre",
        "defaults,_netdev,noauto,x-systemd.automount,x-systemd.requires=lnet.service")
    create = script(f"Lustre {layout.fs_name} client on {hostname}", hostname, body, shared=True)
    delete = script(f"Unmount Lustre {layout.fs_name} on {hostname}", hostname,
                    _DEVICES + call("unmount_at", layout.mount_point), shared=True)
    return Script(create, delete)


# --- BeeGFS ---------------------------------------------------------------------------------------------

_BEEGFS_CONF = r"""
# set_conf FILE KEY VALUE ACTION...: one "KEY = VALUE" line in a BeeGFS conf file, owing each ACTION first.
set_conf() {
  [[ -f "$1" ]] || fail "$1 is missing; install the BeeGFS @VERSION@ packages"
  if ! grep -qxF "$2 = $3" "$1"; then
    owe "${@:4}"
    sed -i "/^[[:space:]]*$2[[:space:]]*=/d" "$1"
    printf '%s = %s\n' "$2" "$3" >> "$1"
    changed "$1: $2 = $3"
  fi
}
# drop_conf FILE KEY ACTION...: a key this tool's earlier releases wrote where the daemon refuses it.
drop_conf() {
  if grep -q "^[[:space:]]*$2[[:space:]]*=" "$1"; then
    owe "${@:3}"
    sed -i "/^[[:space:]]*$2[[:space:]]*=/d" "$1"
    changed "$1: removed $2, which this daemon refuses"
  fi
}
# running SERVICE: enabled, and running: started when it is not, restarted while a restart is owed (its
# configuration changed since it started, in this run or in one cut off). BeeGFS units are Type=simple, so
# systemctl reports success before the daemon has read its configuration: one that rejects it exits a moment
# later, and is caught here with its log instead of being reported as running (the restart stays owed).
running() {
  systemctl enable "$1" --quiet
  if ! systemctl is-active --quiet "$1"; then
    systemctl start "$1"
    changed "started $1"
  elif owed "restart-$1"; then
    systemctl restart "$1"
    changed "restarted $1"
  else
    return 0
  fi
  local waited
  for ((waited = 0; waited < @SETTLE_S@; waited++)); do
    sleep 1
    systemctl is-active --quiet "$1" || fail "$1 stopped right after it started: $(journalctl -u "$1" -n 8 --no-pager -o cat 2>/dev/null | tr '\n' ' ')(journalctl -u $1)"
  done
  paid "restart-$1"
}
"""


# The shared connection secret comes on the session's standard input (the command's secret `stdin`), so it is
# in no script, argument, environment or output; written only when it differs, and a new one owes a restart of
# every daemon of the host (they read it once, at start).
_AUTH_FROM_STDIN = r"""
# --- the shared connection secret, from standard input (never printed) ---
# Run as `bash -c SCRIPT gpucluster` (push() does): fed to bash on its input, reading it would eat the script.
[[ "$0" == gpucluster ]] || fail "this script reads the connection secret on standard input: run it as bash -c \"\$(cat SCRIPT)\" gpucluster < SECRET"
secret=$(cat)
[[ -n "$secret" ]] || fail "no connection secret on standard input (the command's stdin carries it)"
mkdir -p /etc/beegfs
put_file @AUTH@ 0400 "$secret" @OWES@
unset secret
"""

# Settings each BeeGFS daemon reads from its conf file. Every daemon refuses a key its parser does not know
# ("The config argument '...' is invalid") and exits at start, so each gets only keys of its own: quota
# enforcement is quotaEnableEnforcement on mgmtd, meta and storage, and quotaEnabled on the client
# (ThinkParQ/beegfs 7.4.7 and 8.3.1, */source/app/config/Config.cpp and client_module/.../Config.c; the tests
# check every key written against the keys those parsers accept).
BEEGFS_CONF_ROLES = ("mgmtd", "meta", "storage", "client", "helperd")


def beegfs_settings(role: str, storage: StorageSpec, rdma: bool, manager: str) -> tuple[tuple[str, str], ...]:
    out = [("connAuthFile", BEEGFS_AUTH), ("connDisableAuthentication", "false")] if storage.auth else \
        [("connAuthFile", ""), ("connDisableAuthentication", "true")]
    if role == "helperd":
        return tuple(out)
    out.append(("connInterfacesFile", BEEGFS_INTERFACES))
    if role != "mgmtd":     # a moved mgmtd reaches every other daemon; data paths use RDMA where there is some
        out += [("sysMgmtdHost", manager), ("connUseRDMA", "true" if rdma else "false")]
    quotas = "true" if storage.effective_quotas else "false"
    out.append(("quotaEnabled", quotas) if role == "client" else ("quotaEnableEnforcement", quotas))
    return tuple(out)


def _restart(role: str) -> str:
    """The owed action that makes `role`'s daemon read its files again (`running` pays it)."""
    return f"restart-beegfs-{role}"


def _beegfs_common(layout: Layout, auth: bool, interface: str, roles: list[str]) -> str:
    """Files every daemon of the host reads at start: a change owes each of them a restart."""
    owes = call(*(_restart(r) for r in roles))
    auth_part = fill(_AUTH_FROM_STDIN.replace("@OWES@", owes), AUTH=BEEGFS_AUTH) if auth else ""
    return fill(_BEEGFS_CONF, VERSION=layout.version, SETTLE_S=BEEGFS_SETTLE_S) + auth_part + \
        call("put_file", BEEGFS_INTERFACES, "0644", interface, *(_restart(r) for r in roles)) + "\n"


# Keys earlier releases of this tool wrote into daemons' confs that refuse them (servers exited at start).
STALE_KEYS = {"mgmtd": ("quotaEnabled",), "meta": ("quotaEnabled",), "storage": ("quotaEnabled",)}


def _beegfs_conf(role: str, settings: tuple[tuple[str, str], ...]) -> str:
    conf = f"/etc/beegfs/beegfs-{role}.conf"
    lines = [call("drop_conf", conf, k, _restart(role)) for k in STALE_KEYS.get(role, ())]
    lines += [call("set_conf", conf, k, v, _restart(role)) for k, v in settings]
    return "".join(line + "\n" for line in lines)


def render_beegfs_server(spec: ClusterSpec, layout: Layout, hostname: str) -> Script:
    targets = layout.on(hostname)
    storage = spec.storage
    v8 = layout.version == "8"
    ids = layout.node_ids.get(hostname, {})
    roles = {t.role for t in targets}
    needs = packages.beegfs_server(layout.version, roles, rdma=spec.fabric.rdma)
    licence = ""
    if v8 and "mgmtd" in roles and storage.license_file is not None:
        licence = fill('[[ -f @LIC@ ]] || fail "the BeeGFS licence certificate @LIC@ (storage.license_file) is not '
                       'on this host; quota enforcement needs it: copy it here, or set storage.quotas: false"\n',
                       LIC=storage.license_file)
    body = [_BASE + _BEEGFS_PATH + _DEVICES + "# --- every device first ---\n" + _checks(targets) + licence
            + provide(layout, storage.package_repositories, f"the BeeGFS {layout.version} server", needs)
            + _beegfs_common(layout, storage.auth, storage.server_interface or "",
                             list(dict.fromkeys(t.role for t in targets)))]
    services: dict[str, list[str]] = {}
    for t in targets:
        mkfs = ["mkfs.xfs", "-f", "-L", t.label] if t.role == "storage" else ["mkfs.ext4", "-q", "-F", "-L", t.label]
        body.append("if " + call("must_format", t.device, t.label) + "; then\n  "
                    + call(*mkfs, t.device) + " >/dev/null\n  " + call("changed", f"formatted {t.device} as "
                                                                                 f"{t.label}") + "\nfi\n"
                    + call("mount_at", t.device, t.mount, "xfs" if t.role == "storage" else "ext4",
                           _beegfs_mount_options(t.role, storage.effective_quotas)))
        if t.role == "mgmtd" and v8:
            initialise = call("beegfs-mgmtd", "--init", "--db-file", f"{t.mount}/mgmtd.sqlite")
            marker = f"{t.mount}/mgmtd.sqlite"
        elif t.role == "mgmtd":
            initialise, marker = call("beegfs-setup-mgmtd", "-p", t.mount), f"{t.mount}/format.conf"
        elif t.role == "meta":
            initialise = call("beegfs-setup-meta", "-p", t.mount, "-s", ids["meta"], "-m", layout.manager)
            marker = f"{t.mount}/nodeNumID"
        else:
            initialise = call("beegfs-setup-storage", "-p", t.mount, "-s", ids["storage"], "-i", t.index,
                              "-m", layout.manager)
            marker = f"{t.mount}/targetNumID"
        body.append(fill(f'if [[ ! -e @MARKER@ ]]; then\n  {initialise} >/dev/null\n  changed @WHAT@\nfi',
                         MARKER=marker, WHAT=f"initialised {t.role} {t.index} in {t.mount}"))
        services.setdefault(t.role, []).append(t.mount)
    for role in services:
        if role == "mgmtd" and v8:
            body.append(fill('put_file /etc/beegfs/beegfs-mgmtd.toml 0644 "$(cat @TOML@)" @OWES@\n'
                             'running beegfs-mgmtd', {"TOML": beegfs8_mgmtd_toml(storage, services[role][0])},
                             OWES=_restart(role)))
            continue
        body.append(_beegfs_conf(role, beegfs_settings(role, storage, spec.fabric.rdma, layout.manager))
                    + f'running beegfs-{role}')
    roles = ", ".join(f"{t.role} {t.index}" for t in targets)
    create = script(f"BeeGFS {layout.fs_name} server {hostname}: {roles}", hostname, "\n".join(body))
    stop = "".join(call("systemctl", "disable", "--now", f"beegfs-{role}") + "\n" for role in services)
    delete = script(f"Stop BeeGFS {layout.fs_name} on {hostname} (the targets keep their data)", hostname,
                    _DEVICES + stop + "".join(call("unmount_at", t.mount) + "\n" for t in reversed(targets)))
    return Script(create, delete)


def _beegfs_mount_options(role: str, quotas: bool) -> str:
    """Quota tracking reads the storage targets' own XFS accounting, which is on only when mounted with it
    (BeeGFS quota guide: uqnoenforce,gqnoenforce; a mounted target takes it at its next mount)."""
    return "defaults,noatime,nofail" + (",uqnoenforce,gqnoenforce" if quotas and role == "storage" else "")


def beegfs8_mgmtd_toml(storage: StorageSpec, db_dir: str) -> str:
    """BeeGFS 8's mgmtd settings, keys as in beegfs-rust's shipped mgmtd/assets/beegfs-mgmtd.toml. No TLS
    certificates are generated, so the CLI's gRPC runs without TLS (clients never use it)."""
    quotas = "true" if storage.effective_quotas else "false"
    lines = [f'auth-file = "{BEEGFS_AUTH}"' if storage.auth else "auth-disable = true", "tls-disable = true",
             f'db-file = "{db_dir}/mgmtd.sqlite"', f'interfaces = ["{storage.server_interface}"]',
             f"quota-enable = {quotas}", f"quota-enforce = {quotas}"]
    if storage.license_file is not None:
        lines.append(f'license-cert-file = "{storage.license_file}"')
    return "\n".join(lines)


# DOCA-OFED replaces the kernel's verbs: a client module built against the kernel's own headers has no RDMA
# (or fails to load), so it is built against OFED's; the client's start rebuilds the module whenever this file
# differs from the one it was last built with (client_module/build/dist/etc/init.d/beegfs-client.init).
BEEGFS_AUTOBUILD = "/etc/beegfs/beegfs-client-autobuild.conf"
OFED_INCLUDE = "/usr/src/ofa_kernel/default/include"
_CLIENT_OFED = r"""
if [[ -d @OFED@ ]] && ! grep -qxF @WANT@ @AUTOBUILD@; then
  [[ -f @AUTOBUILD@ ]] || fail "@AUTOBUILD@ is missing; install the BeeGFS client package"
  sed -i '/^buildArgs=/d' @AUTOBUILD@
  owe restart-beegfs-client
  printf '%s\n' @WANT@ >> @AUTOBUILD@
  changed "@AUTOBUILD@: the client module is built against DOCA-OFED (@OFED@)"
fi
"""


# With RDMA, a mounted client is not yet an RDMA client: a module built without OFED's verbs runs with
# connUseRDMA 0, and a server without libbeegfs-ib answers over TCP. Both show in the module's proc files
# (client_module/source/filesystem/ProcFsHelper.c: `connUseRDMA = N` in config; per server a line
# `   Connections: TCP: n (peer); RDMA: n (peer); `, or `<none>`). `df` makes it connect to every storage server.
BEEGFS_PROC = "/proc/fs/beegfs"
BEEGFS_RDMA_CHECK = r"""
# beegfs_rdma PROC_DIR MOUNT: the client runs with RDMA and reaches no server over TCP alone
beegfs_rdma() {
  local cfgs=("$1"/*/config) node="" line tcp=()
  [[ -f "${cfgs[0]}" ]] || fail "no $1/*/config: the BeeGFS client module is not loaded"
  grep -qx 'connUseRDMA = 1' "${cfgs[@]}" || fail "the BeeGFS client module runs without RDMA (connUseRDMA is not 1 in ${cfgs[0]}): it was built without OFED's verbs; check @AUTOBUILD@, then /etc/init.d/beegfs-client rebuild"
  timeout 60 df -t beegfs "$2" >/dev/null || fail "df $2 got no answer within 60 s: a BeeGFS server is unreachable"
  while IFS= read -r line; do
    case $line in
      "   Connections:"*) if [[ $line == *TCP:* && $line != *RDMA:* ]]; then tcp+=("$node"); fi ;;
      "   "*) ;;
      *) node=${line%% \[*} ;;
    esac
  done < <(cat "$1"/*/meta_nodes "$1"/*/storage_nodes)
  ((${#tcp[@]} == 0)) || fail "the BeeGFS client reaches ${tcp[*]} over TCP, not RDMA: install libbeegfs-ib on those servers and check their RDMA NIC (storage.server_interface)"
  note "BeeGFS over RDMA to every server it is connected to"
}
"""


def render_beegfs_client(spec: ClusterSpec, layout: Layout, hostname: str, interface: str) -> Script:
    storage = spec.storage
    conf = "/etc/beegfs/beegfs-client.conf"
    # 7.4's helper daemon (logging, DNS for the kernel module) takes the connection secret too; 8 has none.
    daemons = ["client"] if layout.version == "8" else ["helperd", "client"]
    helper = "" if layout.version == "8" else _beegfs_conf(
        "helperd", beegfs_settings("helperd", storage, False, layout.manager)) + "running beegfs-helperd\n"
    needs = packages.beegfs_client(layout.version)
    body = (_BASE + _BEEGFS_PATH
            + provide(layout, storage.package_repositories, f"the BeeGFS {layout.version} client", needs)
            + _beegfs_common(layout, storage.auth, interface, daemons)
            + _beegfs_conf("client", beegfs_settings("client", storage, spec.fabric.rdma, layout.manager))
            + (fill(_CLIENT_OFED, AUTOBUILD=BEEGFS_AUTOBUILD, OFED=OFED_INCLUDE,
                    WANT=f"buildArgs=-j8 OFED_INCLUDE_PATH={OFED_INCLUDE}") if spec.fabric.rdma else "")
            + call("put_file", "/etc/beegfs/beegfs-mounts.conf", "0644", f"{layout.mount_point} {conf}",
                   _restart("client")) + "\n"
            + helper + 'running beegfs-client\n'
            + fill('findmnt -rn @MOUNT@ >/dev/null || fail "beegfs-client runs but @MOUNT@ is not mounted '
                   '(journalctl -u beegfs-client)"\n', MOUNT=layout.mount_point)
            + (fill(BEEGFS_RDMA_CHECK, AUTOBUILD=BEEGFS_AUTOBUILD) + call("beegfs_rdma", BEEGFS_PROC,
                                                                         layout.mount_point) + "\n"
               if spec.fabric.rdma else ""))
    create = script(f"BeeGFS {layout.fs_name} client on {hostname}", hostname, body, shared=True)
    delete = script(f"Stop the BeeGFS {layout.fs_name} client on {hostname}", hostname,
                    "systemctl disable --now beegfs-client\n", shared=True)
    return Script(create, delete)


# --- the shared directories, from one client ------------------------------------------------------------

# WEKA's CLI takes its credentials from WEKA_USERNAME and WEKA_PASSWORD (docs.weka.io, "Manage the system using
# the WEKA CLI"): the password comes on standard input (the command's secret stdin), never an argument.
_WEKA_CREDENTIALS = r"""[[ "$0" == gpucluster ]] || fail "this script reads the WEKA API password on standard input: run it as bash -c \"\$(cat SCRIPT)\" gpucluster < SECRET"
WEKA_PASSWORD=$(cat)
[[ -n "$WEKA_PASSWORD" ]] || fail "no WEKA API password on standard input (the stack secret storageApiPassword)"
export WEKA_USERNAME=@USER@ WEKA_PASSWORD
"""
# fileset FS NAME PATH: an independent fileset NAME linked at PATH, made and linked only where it is not yet.
_FILESET = r"""fileset() {
  local attrs
  if ! bounded mmlsfileset "$1" "$2" >/dev/null 2>&1; then
    bounded mmcrfileset "$1" "$2" --inode-space new >/dev/null
  fi
  attrs=$(bounded mmlsattr -L "$3" 2>/dev/null || true)
  if ! grep -qE "^fileset name: +$2\$" <<<"$attrs"; then
    [[ ! -e "$3" ]] || fail "$3 exists but is not the junction of fileset $2: its data is not handed to a tenant; move it away and run again"
    bounded mkdir -p "$(dirname "$3")"
    bounded mmlinkfileset "$1" "$2" -J "$3" >/dev/null
  fi
}
"""

def bounded_function(name: str, limit_s: int, doc: str, hint: str) -> str:
    """The bash function `name COMMAND...`: COMMAND under `timeout`, whose expiry (exit 124) fails the script
    saying `hint`; any other exit status is COMMAND's own. `doc` says what it runs."""
    return (f"# {name} COMMAND...: {doc}\n{name}() {{\n  local rc=0\n  timeout {limit_s} \"$@\" || rc=$?\n"
            f"  (( rc != 124 )) || fail \"$* did not finish within {limit_s} s: {hint}\"\n  return \"$rc\"\n}}\n")


def render_directories(spec: ClusterSpec, layout: Layout, hostname: str) -> Script:
    """Dataset directories with their striping, tenant directories with their quota. Each one is applied only
    when its own settings differ from those recorded on the host, so a change to one tenant touches that
    tenant alone. Nothing walks a tree: the project ID goes on the directory with its inherit flag, which every
    file made in it takes (a directory this tool made holds nothing older), and every filesystem command is
    bounded in time, so a hung server fails the step instead of holding `pulumi up` forever."""
    items: list[tuple[str, list[str]]] = []
    lustre = layout.kind == "lustre"
    quotas = spec.storage.effective_quotas
    data_targets = sum(1 for t in layout.targets if t.role in DATA_ROLES)
    # BeeGFS 8's CLI talks to mgmtd's gRPC port, without TLS (see the mgmtd configuration) and with the auth file.
    cli = [f"--mgmtd-addr={layout.manager}:{BEEGFS_GRPC_PORT}", "--tls-disable",
           f"--auth-file={BEEGFS_AUTH}" if spec.storage.auth else "--auth-disable"]
    weka, scale = layout.kind == "wekafs", layout.kind == "scale"
    remote = spec.storage.remote_name
    for d in spec.storage.datasets:
        path = spec.storage.dataset_path(d.name)
        count = d.stripe_count if d.stripe_count > 0 else data_targets      # -1: every target
        if weka or scale:       # the filesystem places data itself (the spec refuses striping)
            items.append((f"dataset {d.name}", [call("bounded", "mkdir", "-p", path)]))
            continue
        if lustre:
            stripe = ["lfs", "setstripe", "-c", d.stripe_count, "-S", f"{d.stripe_size_mib}M", path]
        elif layout.version == "8":
            stripe = ["beegfs", "entry", "set", *cli, f"--chunk-size={d.stripe_size_mib}Mi",
                      f"--num-targets={count}", path]
        else:
            stripe = ["beegfs-ctl", "--setpattern", f"--chunksize={d.stripe_size_mib}m", f"--numtargets={count}",
                      path]
        items.append((f"dataset {d.name}: {d.stripe_count} x {d.stripe_size_mib} MiB",
                      [call("bounded", "mkdir", "-p", path), call("bounded", *stripe)]))
    for tenant in spec.tenants:
        gib = tenant.storage.filesystem_gib
        if not gib:
            continue
        ns, qid = tenant.namespace_name, layout.project_ids[tenant.namespace_name]
        path = spec.storage.tenant_path(ns)
        # Owned by the tenant's group, which its pods join (supplementalGroups); setgid keeps new files in it. A
        # directory another group owns holds an earlier tenant's data: never handed to a new one.
        # On Scale, an independent fileset (its own inode space), whose quota is the tenant's.
        cmds = [call("fileset", remote, ns, path) if scale else call("bounded", "mkdir", "-p", path),
                call("owned_by_or_new", path, qid), call("bounded", "chgrp", qid, path),
                call("bounded", "chmod", "2770", path)]
        if weka or scale:
            if quotas:      # WEKA: a directory quota, hard at the tenant's size; Scale: the fileset's block quota
                cmds.append(call("bounded", "weka", "fs", "quota", "set", path, "--hard", f"{gib}GiB") if weka else
                            call("bounded", "mmsetquota", f"{remote}:{ns}", "--block", f"{gib}G:{gib}G"))
        elif lustre:
            cmds.append(call("bounded", "lfs", "project", "-p", qid, "-s", path))
            if quotas:
                cmds.append(call("bounded", "lfs", "setquota", "-p", qid, "-B", f"{gib}G", layout.mount_point))
        elif quotas:       # BeeGFS quotas are per user or group: the tenant's group
            cmds.append(call("bounded", "beegfs", "quota", "set-limits", *cli, f"--gid={qid}", f"--space={gib}GiB",
                             "--inode=unlimited", DEFAULT_POOL) if layout.version == "8" else
                        call("bounded", "beegfs-ctl", "--setquota", "--gid", qid, f"--sizelimit={gib}G",
                             "--inodelimit=unlimited"))
        items.append((f"tenant {ns}: group {qid}, {gib} GiB{'' if quotas else ' (no quota)'}", cmds))
    state = f"{STATE_DIR}/{layout.kind}-{layout.fs_name}-dirs"
    # the filesystem's own CLI, which the client step installs: named if it is missing, before any change
    cli, package = ("lfs", "install lustre-client-utils or lustre-client") if lustre else \
        ("weka", "the client step installs the WEKA agent") if weka else \
        ("mmcrfileset", "storage.scale.admin_node runs Scale's commands") if scale else \
        ("beegfs", "install beegfs-tools") if layout.version == "8" else ("beegfs-ctl", "install beegfs-utils")
    # WEKA's CLI logs in with the API user's password (its quotas need it); Scale's commands and fileset helper
    prelude = ""
    if weka and quotas and spec.storage.weka:
        prelude = fill(_WEKA_CREDENTIALS, USER=spec.storage.weka.api_username)
    elif scale:
        prelude = fill('export PATH="@BIN@:$PATH"\n', BIN=f"{packages.SCALE_ROOT}/bin") + _FILESET
    parts = [prelude + call("need", cli, package) + "\n" + fill(r"""need timeout "install coreutils"
@BOUNDED@# owned_by_or_new DIR GROUP: DIR is new (root's, as mkdir left it) or already GROUP's.
owned_by_or_new() {
  local owner
  owner=$(stat -c %g "$1")
  [[ "$owner" == 0 || "$owner" == "$2" ]] || fail "$1 belongs to group $owner, an earlier tenant's, not $2: its data is not handed to a new tenant; archive or remove it, or give the tenant its old storage.group_id"
}
findmnt -rn @MOUNT@ >/dev/null || fail "@MOUNT@ is not mounted (the client step mounts it)"
mkdir -p @STATE_DIR@
touch @STATE@""".replace("@BOUNDED@", bounded_function(
        "bounded", DIRECTORY_TIMEOUT_S, "COMMAND, stopped and reported when the filesystem does not answer in time.",
        "is every server of the filesystem up? (lfs df, beegfs-check-servers)")),
        MOUNT=layout.mount_point, STATE=state, STATE_DIR=STATE_DIR)]
    for key, cmds in items:
        parts.append(f"if ! grep -qxF {shlex.quote(key)} {shlex.quote(state)}; then\n"
                     + "".join(f"  {c}\n" for c in cmds) + f"  {call('changed', key)}\nfi")
    parts.append(fill('same_file @STATE@ "$(cat @WANTED_DOC@)" || { printf \'%s\\n\' "$(cat @WANTED_DOC@)" > '
                      '@STATE@.gpucluster-new && mv -f @STATE@.gpucluster-new @STATE@; }',
                      {"WANTED_DOC": "\n".join(k for k, _ in items)}, STATE=state))
    return Script(script(f"{layout.kind} {layout.fs_name}: datasets and tenant directories", hostname,
                         "\n".join(parts)))
