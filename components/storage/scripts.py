"""The parallel filesystem's scripts: servers, clients and the shared directories, for Lustre 2.15 and BeeGFS
7.4/8 (../shared/reference/node-commands.md, sections 5 and 6).

Data safety first: every device is probed (blkid -p) before anything changes, and one that holds anything but
the very target this spec puts there stops the script with what it found, unless its `reformat` is set. A device
that already is its target is never formatted again, reformat or not, so a second run changes nothing. Delete
scripts unmount and stop; they never erase a target.
"""

from __future__ import annotations

from ..bash import call, fill, script
from ..spec import ClusterSpec
from ..ssh import Script
from . import packages
from .layout import DATA_ROLES, Layout, Target
from .packages import provide

LNET_CONF = "/etc/lnet.conf"
BEEGFS_AUTH = "/etc/beegfs/conn.auth"
BEEGFS_INTERFACES = "/etc/beegfs/gpucluster-interfaces"
STATE_DIR = "/etc/gpucluster"
BEEGFS_GRPC_PORT = 8010
DEFAULT_POOL = "1"        # BeeGFS's default storage pool

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
# LNet from /etc/lnet.conf, which lnet.service imports at boot; this host's NID must come up.
put_file @LNET_CONF@ 0644 "$(cat @LNET_DOC@)"
lnet_changed=$FILE_CHANGED
systemctl enable lnet --quiet
if ! systemctl is-active --quiet lnet; then
  systemctl start lnet
  changed "started lnet"
elif (( lnet_changed )); then
  lnetctl import < @LNET_CONF@
  changed "imported @LNET_CONF@"
fi
lctl list_nids | grep @NID_MATCH@ || fail "LNet has no @NET@ NID on @IFACE@ (lctl list_nids: $(lctl list_nids | tr '\n' ' ')); check the interface's address and link"
'''


def _lnet(layout: Layout, net: str, interface: str, nid: str | None) -> str:
    """`nid`: the exact NID this host must have (a server's, which clients are given), else any on `net`."""
    doc = f"net:\n    - net type: {net}\n      local NI(s):\n        - interfaces:\n              0: {interface}"
    match = call("-qxF", nid) if nid else call("-q", f"@{net}$")
    return fill(_LNET.replace("@NID_MATCH@", match), {"LNET_DOC": doc}, LNET_CONF=LNET_CONF, NET=net, IFACE=interface)


def _checks(targets: tuple[Target, ...]) -> str:
    return "".join(call("check_device", t.device, "true" if t.reformat else "false", *_labels(t)) + "\n"
                   for t in targets)


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
            + _checks(targets) + provide(layout, spec.storage.package_repository,
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
    if spec.storage.quotas:      # users, groups and projects (the tenants' directories)
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
    body = _BASE + provide(layout, spec.storage.package_repository, f"the Lustre {layout.version} client",
                           packages.lustre_client()) + _DEVICES + _lnet(layout, net, interface, None) + "\n" + call(
        "mount_at", layout.client_source, layout.mount_point, "lustre",
        "defaults,_netdev,noauto,x-systemd.automount,x-systemd.requires=lnet.service")
    create = script(f"Lustre {layout.fs_name} client on {hostname}", hostname, body)
    delete = script(f"Unmount Lustre {layout.fs_name} on {hostname}", hostname,
                    _DEVICES + call("unmount_at", layout.mount_point))
    return Script(create, delete)


# --- BeeGFS ---------------------------------------------------------------------------------------------

_BEEGFS_CONF = r'''
# set_conf FILE KEY VALUE: one "KEY = VALUE" line in a BeeGFS conf file; CONF_CHANGED tells the caller.
CONF_CHANGED=0
set_conf() {
  [[ -f "$1" ]] || fail "$1 is missing; install the BeeGFS @VERSION@ packages"
  if ! grep -qxF "$2 = $3" "$1"; then
    sed -i "/^[[:space:]]*$2[[:space:]]*=/d" "$1"
    printf '%s = %s\n' "$2" "$3" >> "$1"
    CONF_CHANGED=1
    changed "$1: $2 = $3"
  fi
}
# running SERVICE RESTART: enabled, and running (restarted when its configuration changed).
running() {
  systemctl enable "$1" --quiet
  if ! systemctl is-active --quiet "$1"; then
    systemctl start "$1"
    changed "started $1"
  elif (( $2 )); then
    systemctl restart "$1"
    changed "restarted $1"
  fi
}
'''


# The shared connection secret comes on the session's standard input (the command's secret `stdin`), so it is
# in no script, argument, environment or output; written only when it differs.
_AUTH_FROM_STDIN = r'''
# --- the shared connection secret, from standard input (never printed) ---
# Run as `bash -c SCRIPT gpucluster` (push() does): fed to bash on its input, reading it would eat the script.
[[ "$0" == gpucluster ]] || fail "this script reads the connection secret on standard input: run it as bash -c \"\$(cat SCRIPT)\" gpucluster < SECRET"
secret=$(cat)
[[ -n "$secret" ]] || fail "no connection secret on standard input (the command's stdin carries it)"
mkdir -p /etc/beegfs
put_file @AUTH@ 0400 "$secret"
unset secret
'''


def _beegfs_common(layout: Layout, auth: bool, interface: str) -> str:
    auth_check = fill(_AUTH_FROM_STDIN, AUTH=BEEGFS_AUTH) if auth else ""
    return fill(_BEEGFS_CONF, VERSION=layout.version) + auth_check + fill(
        'put_file @IFS@ 0644 @IFACE@\nIFS_CHANGED=$FILE_CHANGED\n', IFS=BEEGFS_INTERFACES, IFACE=interface)


def _beegfs_conf(conf: str, auth: bool, quotas: bool, extra: tuple[tuple[str, str], ...] = ()) -> str:
    settings = (("connAuthFile", BEEGFS_AUTH) if auth else ("connDisableAuthentication", "true"),
                ("connInterfacesFile", BEEGFS_INTERFACES), ("quotaEnabled", "true" if quotas else "false"), *extra)
    return "CONF_CHANGED=$IFS_CHANGED\n" + "".join(call("set_conf", conf, k, v) + "\n" for k, v in settings)


def render_beegfs_server(spec: ClusterSpec, layout: Layout, hostname: str) -> Script:
    targets = layout.on(hostname)
    storage = spec.storage
    v8 = layout.version == "8"
    ids = layout.node_ids.get(hostname, {})
    needs = packages.beegfs_server(layout.version, {t.role for t in targets})
    body = [_BASE + _BEEGFS_PATH + _DEVICES + "# --- every device first ---\n" + _checks(targets)
            + provide(layout, storage.package_repository, f"the BeeGFS {layout.version} server", needs)
            + _beegfs_common(layout, storage.auth, storage.server_interface or "")]
    services: dict[str, list[str]] = {}
    for t in targets:
        mkfs = ["mkfs.xfs", "-f", "-L", t.label] if t.role == "storage" else ["mkfs.ext4", "-q", "-F", "-L", t.label]
        body.append("if " + call("must_format", t.device, t.label) + "; then\n  "
                    + call(*mkfs, t.device) + " >/dev/null\n  " + call("changed", f"formatted {t.device} as "
                                                                                 f"{t.label}") + "\nfi\n"
                    + call("mount_at", t.device, t.mount, "xfs" if t.role == "storage" else "ext4",
                           "defaults,noatime,nofail"))
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
            # No TLS certificates are generated, so the CLI's gRPC runs without TLS (clients never use it).
            toml = "\n".join([f'auth-file = "{BEEGFS_AUTH}"' if storage.auth else "auth-disable = true",
                              "tls-disable = true",
                              f'db-file = "{services[role][0]}/mgmtd.sqlite"',
                              f'interfaces = ["{storage.server_interface}"]',
                              f"quota-enable = {'true' if storage.quotas else 'false'}",
                              f"quota-enforce = {'true' if storage.quotas else 'false'}"])
            body.append(fill('put_file /etc/beegfs/beegfs-mgmtd.toml 0644 "$(cat @TOML@)"\n'
                             'running beegfs-mgmtd $((FILE_CHANGED | IFS_CHANGED))', {"TOML": toml}))
            continue
        extra = (("quotaEnableEnforcement", "true" if storage.quotas else "false"),) if role == "mgmtd" else ()
        body.append(_beegfs_conf(f"/etc/beegfs/beegfs-{role}.conf", storage.auth, storage.quotas, extra)
                    + f'running beegfs-{role} "$CONF_CHANGED"')
    roles = ", ".join(f"{t.role} {t.index}" for t in targets)
    create = script(f"BeeGFS {layout.fs_name} server {hostname}: {roles}", hostname, "\n".join(body))
    stop = "".join(call("systemctl", "disable", "--now", f"beegfs-{role}") + "\n" for role in services)
    delete = script(f"Stop BeeGFS {layout.fs_name} on {hostname} (the targets keep their data)", hostname,
                    _DEVICES + stop + "".join(call("unmount_at", t.mount) + "\n" for t in reversed(targets)))
    return Script(create, delete)


def render_beegfs_client(spec: ClusterSpec, layout: Layout, hostname: str, interface: str) -> Script:
    storage = spec.storage
    conf = "/etc/beegfs/beegfs-client.conf"
    helper = "" if layout.version == "8" else "running beegfs-helperd 0\n"
    needs = packages.beegfs_client(layout.version)
    body = (_BASE + _BEEGFS_PATH
            + provide(layout, storage.package_repository, f"the BeeGFS {layout.version} client", needs)
            + _beegfs_common(layout, storage.auth, interface)
            + fill('if ! grep -qxF @MGMTD_LINE@ @CONF@; then\n  beegfs-setup-client -m @MGMTD@ >/dev/null\n'
                   '  changed "client of mgmtd @MGMTD@"\nfi\n', MGMTD_LINE=f"sysMgmtdHost = {layout.manager}",
                   CONF=conf, MGMTD=layout.manager)
            + _beegfs_conf(conf, storage.auth, storage.quotas)
            + fill('put_file /etc/beegfs/beegfs-mounts.conf 0644 @MOUNTS@\n'
                   'CONF_CHANGED=$((CONF_CHANGED | FILE_CHANGED))\n', MOUNTS=f"{layout.mount_point} {conf}")
            + helper + 'running beegfs-client "$CONF_CHANGED"\n'
            + fill('findmnt -rn @MOUNT@ >/dev/null || fail "beegfs-client runs but @MOUNT@ is not mounted '
                   '(journalctl -u beegfs-client)"', MOUNT=layout.mount_point))
    create = script(f"BeeGFS {layout.fs_name} client on {hostname}", hostname, body)
    delete = script(f"Stop the BeeGFS {layout.fs_name} client on {hostname}", hostname,
                    "systemctl disable --now beegfs-client\n")
    return Script(create, delete)


# --- the shared directories, from one client ------------------------------------------------------------

def render_directories(spec: ClusterSpec, layout: Layout, hostname: str) -> Script:
    """Dataset directories with their striping, tenant directories with their quota; applied when the wanted
    settings differ from those recorded on the host (the commands are idempotent, this keeps the count honest)."""
    lines = []
    lustre = layout.kind == "lustre"
    data_targets = sum(1 for t in layout.targets if t.role in DATA_ROLES)
    # BeeGFS 8's CLI talks to mgmtd's gRPC port, without TLS (see the mgmtd configuration) and with the auth file.
    cli = [f"--mgmtd-addr={layout.manager}:{BEEGFS_GRPC_PORT}", "--tls-disable",
           f"--auth-file={BEEGFS_AUTH}" if spec.storage.auth else "--auth-disable"]
    for d in spec.storage.datasets:
        path = spec.storage.dataset_path(d.name)
        lines.append(call("mkdir", "-p", path))
        count = d.stripe_count if d.stripe_count > 0 else data_targets      # -1: every target
        if lustre:
            lines.append(call("lfs", "setstripe", "-c", d.stripe_count, "-S", f"{d.stripe_size_mib}M", path))
        elif layout.version == "8":
            lines.append(call("beegfs", "entry", "set", *cli, f"--chunk-size={d.stripe_size_mib}Mi",
                              f"--num-targets={count}", path))
        else:
            lines.append(call("beegfs-ctl", "--setpattern", f"--chunksize={d.stripe_size_mib}m",
                              f"--numtargets={count}", path))
    for tenant in spec.tenants:
        gib = tenant.storage.filesystem_gib
        if not gib:
            continue
        ns, qid = tenant.namespace_name, layout.project_ids[tenant.namespace_name]
        path = spec.storage.tenant_path(ns)
        # Owned by the tenant's group, which its pods join (supplementalGroups); setgid keeps new files in it.
        lines += [call("mkdir", "-p", path), call("chgrp", qid, path), call("chmod", "2770", path)]
        if lustre:
            lines.append(call("lfs", "project", "-p", qid, "-r", "-s", path))
            if spec.storage.quotas:
                lines.append(call("lfs", "setquota", "-p", qid, "-B", f"{gib}G", layout.mount_point))
        elif spec.storage.quotas:       # BeeGFS quotas are per user or group: the tenant's group
            lines.append(call("beegfs", "quota", "set-limits", *cli, f"--gid={qid}", f"--space={gib}GiB",
                              "--inode=unlimited", DEFAULT_POOL) if layout.version == "8" else
                         call("beegfs-ctl", "--setquota", "--gid", qid, f"--sizelimit={gib}G",
                              "--inodelimit=unlimited"))
    wanted = "\n".join(lines)
    apply = "\n".join(f"  {line}" for line in lines) or "  :"
    body = fill(r'''
findmnt -rn @MOUNT@ >/dev/null || fail "@MOUNT@ is not mounted (the client step mounts it)"
if ! same_file @STATE@ "$(cat @WANTED_DOC@)"; then
''' + apply + r'''
  mkdir -p @STATE_DIR@
  put_file @STATE@ 0644 "$(cat @WANTED_DOC@)" >/dev/null
  changed "shared directories, striping and quotas"
fi''', {"WANTED_DOC": wanted}, MOUNT=layout.mount_point, STATE=f"{STATE_DIR}/{layout.kind}-{layout.fs_name}-dirs",
                STATE_DIR=STATE_DIR)
    return Script(script(f"{layout.kind} {layout.fs_name}: datasets and tenant directories", hostname, body))
