"""A test host as a storage server or client: recording doubles for what needs a storage cluster or its kernel
modules (mounts, LNet, the BeeGFS setup tools and daemons, mkfs.lustre), real filesystems on real loop devices
beneath them. Shared by the storage script tests and the engine e2e."""

from __future__ import annotations

import shlex
from pathlib import Path

from tests.components.storage.beegfs_upstream import CONF_KEYS, MGMTD8_TOML_KEYS
from tests.realssh.doubles import STATE_DIR

RECORD = f'#!/usr/bin/env bash\nset -euo pipefail\nS={STATE_DIR}\nprintf \'%s %s\\n\' "$(basename "$0")" "$*" >> "$S/calls.log"\n'
DOUBLES = {
    "mkfs.lustre": RECORD + r'''
fs="" idx=0 role=""
for a in "$@"; do
  case "$a" in
    --fsname=*) fs=${a#--fsname=} ;;
    --index=*) idx=${a#--index=} ;;
    --ost) role=OST ;;
    --mdt) role=MDT ;;
    --mgs) if [[ -z "$role" ]]; then role=MGS; fi ;;
  esac
done
label=MGS
if [[ "$role" != MGS ]]; then label=$(printf '%s:%s%04x' "$fs" "$role" "$idx"); fi
mkfs.ext4 -q -F -L "$label" "${*: -1}"
''',
    "mkfs.xfs": RECORD + 'mkfs.ext4 -q -F -L "${3}" "${*: -1}"\n',     # -f -L LABEL DEVICE
    "mount": RECORD + 'mkdir -p "$S/mounts"; touch "$S/mounts/${1//\\//_}"\n',
    "umount": RECORD + 'rm -f "$S/mounts/${1//\\//_}"\n',
    # `df -t beegfs MOUNT` answers for a mounted BeeGFS (the client's RDMA check calls it); anything else is df's
    "df": RECORD + 'if [[ "${1:-}" == -t && "${2:-}" == beegfs ]]; then [[ -e "$S/mounts/${3//\\//_}" ]]; '
                    'else exec /usr/bin/df "$@"; fi\n',
    "findmnt": RECORD + '[[ -e "$S/mounts/${*: -1}" || -e "$S/mounts/${2//\\//_}" ]]\n',
    # LNet's configured NIs ("NET INTERFACE" lines), as `lnetctl import [--del]` of lnet.conf's YAML leaves them;
    # adding an NI it has, or deleting one it lacks, fails as lnetctl does (EEXIST, ENOENT)
    "lnetctl": RECORD + r'''
nis=$S/lnet-nis
touch "$nis"
case "$1" in
  lnet) if [[ "$2" == unconfigure ]]; then : > "$nis"; fi ;;
  import)
    del=0
    if [[ "${2:-}" == --del ]]; then del=1; shift; fi
    conf=$(cat "${2:-/dev/stdin}")
    ni="$(sed -n 's/.*net type: //p' <<<"$conf") $(sed -n 's/^ *0: //p' <<<"$conf")"
    if (( del )); then
      grep -qxF "$ni" "$nis" || { echo "del: errno -2: cannot delete network $ni" >&2; exit 1; }
      grep -vxF "$ni" "$nis" > "$nis.new" || true
      mv "$nis.new" "$nis"
    else
      if grep -qxF "$ni" "$nis"; then echo "add: errno -17: cannot add network $ni: File exists" >&2; exit 1; fi
      printf '%s\n' "$ni" >> "$nis"
    fi ;;
esac
''',
    "mount.lustre": RECORD,
    "lfs": RECORD,
    "lctl": RECORD + 'if [[ "$1" == list_nids ]]; then cat "$S/nids"; fi\n',
    # the Lustre kernel modules are built for Lustre's kernels, not this one: the servers' are "there"
    "modinfo": RECORD + '[[ "$1" == lustre || "$1" == osd_ldiskfs || "$1" == ko2iblnd ]] && [[ -e "$S/lustre-modules" ]]\n',
    "beegfs-setup-mgmtd": RECORD + 'touch "$2/format.conf"\n',
    "beegfs-setup-meta": RECORD + 'touch "$2/nodeNumID"\n',
    "beegfs-setup-storage": RECORD + 'touch "$2/targetNumID"\n',
}


def _conf_reader(keys: frozenset[str], key_chars: str, refusal: str, also: str = "") -> str:
    """Bash reading a daemon's conf file ($1) as its parser does: a key it does not know is refused (`refusal`
    says so, with $key) and it exits 1; `also` runs for every line."""
    return (f'allowed=" {" ".join(sorted(keys))} "\nwhile IFS= read -r line; do\n'
            f"  key=$(sed -n 's/^[[:space:]]*\\([{key_chars}]*\\)[[:space:]]*=.*/\\1/p' <<<\"$line\")\n"
            '  if [[ -n "$key" && "$allowed" != *" $key "* ]]; then\n'
            f'    echo "{refusal}"\n    exit 1\n  fi\n{also}done < "$1"\n')


def beegfs_daemon(keys: frozenset[str]) -> str:
    """A BeeGFS daemon reading its conf file: like the real one it refuses any key its parser does not know
    and exits at start (keys from upstream's parsers, beegfs_upstream.py), else runs on."""
    return RECORD + _conf_reader(keys, "A-Za-z0-9", "Unrecoverable error: The config argument '$key' is invalid")


# BeeGFS 8's mgmtd (Rust): `--init` makes its database once; started, it reads beegfs-mgmtd.toml, refuses a key
# its settings do not have and exits without an initialised database (beegfs-rust mgmtd/src/config.rs, main.rs).
BEEGFS8_MGMTD = RECORD + r"""
if [[ "${1:-}" == --init ]]; then
  [[ "${2:-}" == --db-file && -n "${3:-}" ]] || { echo "--init needs --db-file here" >&2; exit 2; }
  [[ ! -e "$3" ]] || { echo "Database file $3 already exists" >&2; exit 1; }
  : > "$3"
  exit 0
fi
db=""
""" + _conf_reader(MGMTD8_TOML_KEYS, "a-z0-9-", "Error: unknown field \\`$key\\` in $1",
                   r"""  if [[ "$key" == db-file ]]; then db=$(sed 's/^[^=]*=[[:space:]]*"\(.*\)"[[:space:]]*$/\1/' <<<"$line"); fi
""") + r"""[[ -n "$db" && -e "$db" ]] || { echo "Error: database $db is not initialised (beegfs-mgmtd --init)"; exit 1; }
"""


def storage_host(h, beegfs: str = "7.4", nid: str | None = None):
    """`h` made a storage server or client of either filesystem (its doubles, units and module state), its
    BeeGFS daemons those of release `beegfs` (7.4 or 8), its LNet NID `nid` once up (omitted: its address on
    tcp)."""
    for tool, text in DOUBLES.items():
        h.sh(f"printf '%s' {shlex.quote(text)} > /usr/local/bin/{tool} && chmod +x /usr/local/bin/{tool}")
    h.sh(f"printf '%s\\n' {nid or h.address + '@tcp'} > {STATE_DIR}/nids")
    h.sh(f"touch {STATE_DIR}/lustre-modules")
    # lnet.service: `lnetctl lnet configure`, then `lnetctl import /etc/lnet.conf` (reference 5; unconfigured first)
    h.put("/usr/local/sbin/lnet-up", "#!/bin/sh\nlnetctl lnet unconfigure && lnetctl import /etc/lnet.conf\n")
    h.sh("chmod +x /usr/local/sbin/lnet-up")
    h.put("/etc/systemd/system/lnet.service", "[Service]\nType=oneshot\nExecStart=/usr/local/sbin/lnet-up\n")
    h.sh("mkdir -p /etc/beegfs && for s in meta storage mgmtd; do : > /etc/beegfs/beegfs-$s.conf; done")
    for role in ("mgmtd", "meta", "storage"):      # Type=simple units, as BeeGFS ships them
        if beegfs == "8" and role == "mgmtd":
            daemon, conf, text = "/usr/local/bin/beegfs-mgmtd", "/etc/beegfs/beegfs-mgmtd.toml", BEEGFS8_MGMTD
        else:
            daemon, conf = f"/usr/local/bin/beegfs-daemon-{role}", f"/etc/beegfs/beegfs-{role}.conf"
            text = beegfs_daemon(CONF_KEYS[(beegfs, role)])
        h.put(daemon, text)
        h.sh(f"chmod +x {daemon}")
        h.put(f"/etc/systemd/system/beegfs-{role}.service", f"[Service]\nType=simple\nExecStart={daemon} {conf}\n")
    return h


# The BeeGFS client's three packages as test doubles: their commands record their calls, setup-client writes the
# management host as the real one does, and the client unit's start makes dev's mount appear (the double systemctl
# runs ExecStart).
BEEGFS_CLIENT_PACKAGES = {
    "beegfs-client": {
        "/opt/beegfs/sbin/beegfs-setup-client":
            RECORD + 'printf \'sysMgmtdHost = %s\\n\' "$2" >> /etc/beegfs/beegfs-client.conf\n',
        "/etc/beegfs/beegfs-client.conf": "",
        "/etc/systemd/system/beegfs-client.service": f"[Service]\nExecStart=/usr/bin/touch {STATE_DIR}/mounts/_mnt_devfs\n"},
    "beegfs-helperd": {"/opt/beegfs/sbin/beegfs-helperd": RECORD, "/etc/beegfs/beegfs-helperd.conf": ""},
    "beegfs-utils": {"/usr/local/bin/beegfs-ctl": RECORD},
}
# BeeGFS 8's client: no helper daemon; its tools are the `beegfs` CLI (beegfs-go), which talks to mgmtd's gRPC.
BEEGFS8_CLIENT_PACKAGES = {"beegfs-client": BEEGFS_CLIENT_PACKAGES["beegfs-client"],
                           "beegfs-tools": {"/usr/local/bin/beegfs": RECORD}}


def beegfs_client_installed(h, beegfs: str = "7.4", mount: str = "/mnt/devfs") -> None:
    """`h` with the BeeGFS client's packages of release `beegfs` (7.4 or 8) installed, its unit mounting
    `mount` when it starts."""
    for files in (BEEGFS8_CLIENT_PACKAGES if beegfs == "8" else BEEGFS_CLIENT_PACKAGES).values():
        for path, text in files.items():
            text = text.replace("_mnt_devfs", mount.replace("/", "_"))
            h.put(path, text)
            h.sh(f"chmod 0755 {shlex.quote(path)}")
    h.sh(f"mkdir -p {STATE_DIR}/mounts")


def beegfs_client_module(h, server: str, address: str) -> Path:
    """The BeeGFS client module, loaded with RDMA and connected to `server`, as its proc files show it
    (ProcFsHelper.c's format)."""
    module = h.root / "proc_fs" / "beegfs" / f"5F1E-6A2B-{h.name}"
    module.mkdir(parents=True, exist_ok=True)
    (module / "config").write_text("connUseRDMA = 1\n")
    (module / "meta_nodes").write_text(f"{server} [ID: 1]\n   Root: <yes>\n   Connections: RDMA: 1 ({address}:8005); \n")
    (module / "storage_nodes").write_text(f"{server} [ID: 1]\n   Connections: RDMA: 2 ({address}:8003); \n")
    return module
