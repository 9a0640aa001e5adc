"""Clients of a filesystem the site runs apart: WEKA's stateless client, and a GPU host as a client node of an
IBM Storage Scale cluster. Only the clients are built here: the storage cluster, its servers and its
filesystem are the site's, and nothing here creates, formats or deletes any of them.

Vendor syntax, with its sources:
- WEKA (docs.weka.io, "Add clients" and "Mount filesystems"): the agent from a backend's
  `http://<backend>:14000/dist/v1/install`; `mount -t wekafs -o num_cores=N|core=ID -o net=<netdev>|net=udp
  <backend>[,<backend>...]/<fs> <dir>` starts the stateless client's container, named `client`, which
  `weka local ps` lists with its state (`Running`); `weka fs quota set <path> --hard <size>` on a mounted client,
  with the CLI's credentials from WEKA_USERNAME and WEKA_PASSWORD ("Manage the system using the WEKA CLI").
- Storage Scale (IBM Storage Scale command reference: mmaddnode, mmchlicense, mmstartup, mmgetstate, mmmount,
  mmlsmount, mmumount, mmshutdown, mmdelnode, mmchconfig, mmcrfileset, mmlinkfileset, mmsetquota, mmbuildgpl):
  administration commands run on a node of the cluster (the spec's admin node) and reach the new node over
  SSH; the node must have Scale installed, and its portability layer built for the running kernel, before it
  joins. `mmlscluster -Y` and `mmgetstate -Y` print a HEADER line naming their fields (parsed by name, as IBM's
  own install toolkit does).
- GPUDirect Storage (NVIDIA's GDS configuration guide, "GPUDirect Storage Parameters"; cuFile compatibility mode):
  cuFile reads /etc/cufile.json, whose `properties.rdma_dev_addr_list` lists the IPv4 address of each interface
  it may use for RDMA; a WekaFS or GPFS mount with none listed falls back to the POSIX path (no GDS). IBM
  ("Configuring GPUDirect Storage for IBM Storage Scale"): verbsPorts must agree with that list.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..bash import call, fill, script
from ..spec import ClusterSpec
from ..spec.common import AbsPath, SpecModel
from ..spec.hardware import NodePool
from ..ssh import Script
from .layout import Layout
from .packages import Requirement, provide
from . import packages
from .scripts import _DEVICES, bounded_function     # mount_at and unmount_at, as the other clients use them

WEKA_AGENT = "weka-agent"
WEKA_CONTAINER = "client"       # the stateless client's container, as `weka local ps` lists it
SCALE_LOCK = "/var/lock/gpucluster-scale-nodes"
SCALE_WAIT_S = 300       # a node's daemon reaches active, or its mount shows, within this
SCALE_BUILD_S = 1800     # mmbuildgpl, at most
INSTALL_S = 1800         # WEKA's installer, at most
MM_TIMEOUT_S = 600       # one administration command, at most


def weka_install_url(spec: ClusterSpec) -> str:
    weka = spec.storage.weka
    assert weka is not None
    return weka.install_url or f"http://{weka.backends[0]}:14000/dist/v1/install"


# weka_state: the state `weka local ps` lists for the client container (empty: none, or no answer in 30 s).
_WEKA_STATE = r"""weka_state() { timeout 30 weka local ps 2>/dev/null | awk -v c=@CONTAINER@ '$1 == c { print $2 }' || true; }
"""

_WEKA_CLIENT = r"""need findmnt "install util-linux"
need timeout "install coreutils"
# --- the agent: installed from the cluster (or the site's mirror) when this host has none ---
if ! command -v weka >/dev/null 2>&1; then
  need curl "install curl, which fetches WEKA's installer"
  installer=$(mktemp)
  if ! curl -fsS --max-time 600 -o "$installer" @URL@; then
    rm -f "$installer"
    fail "could not fetch WEKA's installer from @URL@ (storage.weka.install_url): is a backend reachable from here?"
  fi
  rc=0
  timeout @INSTALL_S@ sh "$installer" >/dev/null || rc=$?
  rm -f "$installer"
  (( rc == 0 )) || fail "WEKA's installer from @URL@ failed (exit $rc); run it by hand to see why"
  changed "installed the WEKA agent from @URL@"
fi
need weka "the WEKA agent did not install"
if ! systemctl is-active --quiet @AGENT@; then
  systemctl enable --now @AGENT@ --quiet
  changed "started @AGENT@"
fi
@GDS@
# --- the stateless mount: its options bring up the client container; at boot, after the agent ---
mount_at @SOURCE@ @MOUNT@ wekafs @OPTIONS@
# weka_client_running: the client container runs (a mount over a stopped container answers nothing).
weka_client_running() {
  local waited state
  for ((waited = 0; waited < 60; waited += 5)); do
    state=$(weka_state)
    if [[ "$state" == Running ]]; then return 0; fi
    sleep 5
  done
  fail "@MOUNT@ is mounted but the WEKA client container @CONTAINER@ is ${state:-absent} (weka local ps); restart it (weka local restart @CONTAINER@) and run again"
}
weka_client_running
"""

# GPUDirect Storage reads through nvidia-fs. A driver the GPU Operator manages brings it (gds.enabled, set by the
# stack) once the node has joined, after this step; a host driver must have it already (NVIDIA's nvidia-fs).
_NVIDIA_FS = r"""[[ -d /sys/module/nvidia_fs ]] || fail "GPUDirect Storage (@FIELD@) needs the nvidia-fs module, which is not loaded: install NVIDIA's nvidia-fs (nvidia-gds) beside the host's driver, or set gds: false"
"""


def render_gds(spec: ClusterSpec, interfaces: list[str], field: str) -> str:
    """With a host driver, nvidia-fs checked first; then cufile.json."""
    check = "" if spec.kubernetes.gpu_operator.driver_managed else fill(_NVIDIA_FS, FIELD=field)
    return check + render_cufile(interfaces, field)


CUFILE = "/etc/cufile.json"
CUFILE_RECORD = "/etc/gpucluster/cufile.json.sha256"     # what this library last wrote there
CUFILE_KEPT = "/etc/cufile.json.before-gpucluster"       # the file it found there first
# cufile.json for GDS on this host: the address of each interface it reads through, as the host has it now. A file
# this library did not write (the GDS package's own, a site's) is kept aside first, never lost.
_CUFILE = r"""# --- GPUDirect Storage: cufile.json lists each RDMA interface's IPv4 address (none listed: no GDS) ---
addrs=""
devices=(@INTERFACES@)
for dev in "${devices[@]}"; do
  addr=$(timeout 10 ip -4 -o addr show dev "$dev" scope global 2>/dev/null | awk '{ split($4, a, "/"); print a[1]; exit }' || true)
  [[ -n "$addr" ]] || fail "GPUDirect Storage (@FIELD@) lists each RDMA interface's IPv4 address in @CUFILE@, and $dev has none: give $dev its address, or set gds: false"
  addrs+="${addrs:+, }\"$addr\""
done
want=$(printf '{\n  "properties": {\n    "rdma_dev_addr_list": [%s]\n  }\n}' "$addrs")
sum=$(printf '%s\n' "$want" | sha256sum | cut -d' ' -f1)
mkdir -p "$(dirname @RECORD@)"
# every file is written beside its place and moved there whole, so a cut run leaves no half file
new=@CUFILE@.gpucluster-new
if [[ ! -f @CUFILE@ ]] || [[ "$(cat @CUFILE@)" != "$want" ]]; then
  if [[ -f @CUFILE@ ]] && [[ "$(sha256sum < @CUFILE@ | cut -d' ' -f1)" != "$(cat @RECORD@ 2>/dev/null)" ]] &&
     ! cmp -s @CUFILE@ @KEPT@; then
    keep=@KEPT@
    if [[ -e "$keep" ]]; then keep="$keep.$(date +%Y%m%d%H%M%S)"; fi
    cp -p @CUFILE@ "$new"
    mv -f "$new" "$keep"
    note "kept the @CUFILE@ found here as $keep"
  fi
  printf '%s\n' "$want" > "$new"
  chmod 644 "$new"
  mv -f "$new" @CUFILE@
  changed "@CUFILE@ lists $addrs for GPUDirect Storage"
fi
[[ "$(cat @RECORD@ 2>/dev/null)" == "$sum" ]] || printf '%s\n' "$sum" > @RECORD@
"""
# GDS off (or never on): a cufile.json this library wrote goes, the one it found first comes back; one edited
# since is left alone.
_CUFILE_OFF = r"""if [[ -f @RECORD@ ]]; then
  if [[ -f @CUFILE@ ]] && [[ "$(sha256sum < @CUFILE@ | cut -d' ' -f1)" == "$(cat @RECORD@)" ]]; then
    if [[ -f @KEPT@ ]]; then
      mv -f @KEPT@ @CUFILE@
      changed "GPUDirect Storage is off: @CUFILE@ is the one found here before"
    else
      rm -f @CUFILE@
      changed "GPUDirect Storage is off: removed the @CUFILE@ it had"
    fi
  elif [[ -f @CUFILE@ ]]; then
    note "@CUFILE@ was edited since it was written for GPUDirect Storage: left as it is"
  fi
  rm -f @RECORD@
fi
"""


def render_cufile(interfaces: list[str] | None, field: str) -> str:
    """The host's cufile.json for GDS through `interfaces` (None: GDS off, and undone where it was on)."""
    paths = dict(CUFILE=CUFILE, RECORD=CUFILE_RECORD, KEPT=CUFILE_KEPT)
    if interfaces is None:
        return fill(_CUFILE_OFF, **paths)
    return fill(_CUFILE.replace("@INTERFACES@", call(*interfaces)), FIELD=field, **paths)


def weka_mount_options(spec: ClusterSpec, interface: str) -> str:
    weka = spec.storage.weka
    assert weka is not None
    return ",".join(weka.options(interface) + ["_netdev", f"x-systemd.requires={WEKA_AGENT}.service"])


def render_weka_client(spec: ClusterSpec, layout: Layout, hostname: str, interface: str) -> Script:
    weka = spec.storage.weka
    assert weka is not None
    gds = render_gds(spec, [interface], "storage.weka.gds") if weka.gds else render_cufile(None, "")
    body = _DEVICES + fill(_WEKA_STATE + _WEKA_CLIENT.replace("@GDS@", gds),
                           URL=weka_install_url(spec), INSTALL_S=INSTALL_S, AGENT=WEKA_AGENT,
                           SOURCE=layout.client_source, MOUNT=layout.mount_point, CONTAINER=WEKA_CONTAINER,
                           OPTIONS=weka_mount_options(spec, interface))
    create = script(f"WEKA {layout.fs_name} client on {hostname}", hostname, body, shared=True)
    delete = script(f"Unmount WEKA {layout.fs_name} on {hostname} (the agent stays)", hostname,
                    _DEVICES + call("unmount_at", layout.mount_point), shared=True)
    return Script(create, delete)


# --- Storage Scale ----------------------------------------------------------------------------------------

def scale_packages() -> list[Requirement]:
    """What a client node needs before it joins: the daemon and commands, and the portability layer's source
    (packages gpfs.base and gpfs.gpl, named alike on EL and Debian)."""
    root = packages.SCALE_ROOT
    return [Requirement("path", f"{root}/bin/mmfsd", "gpfs.base", "gpfs.base"),
            Requirement("path", f"{root}/bin/mmbuildgpl", "gpfs.base", "gpfs.base"),
            Requirement("path", f"{root}/src/config", "gpfs.gpl", "gpfs.gpl")]


_SCALE_NODE = r"""# --- the running kernel first: one the Scale release does not support stops the script before any change ---
kernel=$(uname -r)
supported=0
patterns=(@PATTERNS@)
for pattern in "${patterns[@]}"; do
  # shellcheck disable=SC2053  # the pattern is a glob on purpose
  if [[ "$kernel" == $pattern ]]; then supported=1; fi
done
(( supported )) || fail "kernel $kernel is not one Storage Scale @VERSION@ supports here (storage.scale.supported_kernels: ${patterns[*]}): boot a listed kernel, or add it once IBM's Storage Scale FAQ lists it for your release"
@PROVIDE@
# --- the portability layer, built for this kernel (again after a kernel change: its modules are per kernel) ---
scale_layer
@ADMIN_KEY@"""

# scale_layer: the portability layer for the running kernel, built where it has none (mmbuildgpl installs
# mmfs26, mmfslinux and tracedev under /lib/modules/<kernel>/extra, where modinfo finds them).
_SCALE_LAYER = r"""scale_layer() {
  local kernel rc=0
  kernel=$(uname -r)
  if modinfo -k "$kernel" mmfs26 >/dev/null 2>&1; then return 0; fi
  timeout @BUILD_S@ @BIN@/mmbuildgpl >/dev/null || rc=$?
  (( rc == 0 )) || fail "mmbuildgpl failed for kernel $kernel (exit $rc): it needs a compiler and this kernel's headers (kernel-devel or linux-headers-$kernel); run it by hand to see why"
  modinfo -k "$kernel" mmfs26 >/dev/null 2>&1 || fail "mmbuildgpl left no mmfs26 module for kernel $kernel"
  changed "built the Scale portability layer for kernel $kernel"
}
"""

_ADMIN_KEY = r"""# --- the admin node's key, which Scale's commands reach this node with ---
mkdir -p /root/.ssh
chmod 700 /root/.ssh
touch /root/.ssh/authorized_keys
if ! grep -qxF @KEY@ /root/.ssh/authorized_keys; then
  printf '%s\n' @KEY@ >> /root/.ssh/authorized_keys
  changed "authorized the Scale admin node's key for root"
fi
"""


def render_scale_node(spec: ClusterSpec, layout: Layout, pool: NodePool, hostname: str) -> Script:
    """A GPU host made ready to join: a supported kernel, Scale's packages, the portability layer, and with GDS
    the cufile.json that agrees with its verbsPorts."""
    scale = spec.storage.scale
    assert scale is not None
    cufile = render_gds(spec, [n.interface for n in sorted(pool.nics, key=lambda n: n.rail)], "storage.scale.gds") \
        if scale.gds else render_cufile(None, "")
    body = fill(_SCALE_LAYER + _SCALE_NODE.replace("@PROVIDE@", provide(
        layout, spec.storage.package_repositories, f"Storage Scale {layout.version}", scale_packages()))
        .replace("@PATTERNS@", " ".join(call(p) for p in scale.supported_kernels))
        .replace("@ADMIN_KEY@", fill(_ADMIN_KEY, KEY=scale.admin_public_key) if scale.admin_public_key else ""),
        VERSION=layout.version, BUILD_S=SCALE_BUILD_S,
        BIN=f"{packages.SCALE_ROOT}/bin") + cufile
    create = script(f"Storage Scale {layout.fs_name}: client node {hostname}", hostname, body, shared=True)
    return Script(create)


_MM = r"""export PATH="@BIN@:$PATH"
need mmlscluster "this host (storage.scale.admin_node) has no Storage Scale commands in @BIN@; name a node of the cluster"
need flock "install util-linux"
need timeout "install coreutils"
@MM_FN@# field COMMAND_OUTPUT KIND NAME: the column of field NAME in `-Y` output's HEADER line of KIND.
field() {
  awk -F: -v kind="$2" -v name="$3" '$2 == kind && $3 == "HEADER" { for (i = 1; i <= NF; i++) if ($i == name) { print i; exit } }' <<<"$1"
}
# same_node NAME HOST: NAME (as Scale lists it, maybe fully qualified) is HOST.
same_node() { [[ "$1" == "$2" || "$1" == "$2".* ]]; }
# scale_member HOST: HOST is a node of this cluster (mmlscluster -Y, daemon or admin node name).
scale_member() {
  local out daemon admin
  out=$(mm mmlscluster -Y) || fail "mmlscluster failed on this admin node; is it a node of the cluster?"
  daemon=$(field "$out" clusterNode daemonNodeName)
  admin=$(field "$out" clusterNode adminNodeName)
  [[ -n "$daemon" && -n "$admin" ]] || fail "mmlscluster -Y printed no clusterNode HEADER with daemonNodeName and adminNodeName; this library reads Scale 5.1 and 5.2's output"
  local n a
  while IFS=' ' read -r n a; do
    if same_node "$n" "$1" || same_node "$a" "$1"; then return 0; fi
  done < <(awk -F: -v d="$daemon" -v a="$admin" '$2 == "clusterNode" && $3 != "HEADER" { print $d, $a }' <<<"$out")
  return 1
}
# node_state HOST: GPFS's state on HOST (active, down, arbitrating, ...), from mmgetstate -Y.
node_state() {
  local out col
  out=$(mm mmgetstate -N "$1" -Y) || { echo unknown; return 0; }
  col=$(field "$out" "" state)
  awk -F: -v c="$col" '$3 != "HEADER" && c { print $c; exit }' <<<"$out"
}
# mounted_on FS HOST: FS is mounted on HOST (mmlsmount -L lists "IP NAME [CLUSTER]" per node).
mounted_on() {
  local out name
  out=$(mm mmlsmount "$1" -L) || return 1
  while read -r _ name _; do
    if [[ -n "$name" ]] && same_node "$name" "$2"; then return 0; fi
  done < <(sed 1d <<<"$out")
  return 1
}
"""

_JOIN = r"""exec 9>@LOCK@
# One node joins at a time: Scale's configuration changes cluster-wide, and parallel mmaddnode calls collide.
flock -w @MM_S@ 9 || fail "another node's join held @LOCK@ for @MM_S@ s"
node=@NODE@
if ! scale_member "$node"; then
  owe "scale-licence-$node"
  mm mmaddnode -N "$node" >/dev/null || fail "mmaddnode -N $node failed: the node must be reachable over SSH as root from here (storage.scale.admin_public_key) with Scale installed (its own step)"
  changed "added $node to the cluster"
fi
if owed "scale-licence-$node"; then
  mm mmchlicense client --accept -N "$node" >/dev/null
  paid "scale-licence-$node"
  changed "client licence for $node"
fi
# GPFS rebuilds the portability layer itself when it starts on a kernel it has none for (a reboot into a new
# kernel, which no step of this library sees): mmchconfig's autoBuildGPL, on this node.
if [[ ! -e @AUTOBUILD@ ]]; then
  mm mmchconfig autoBuildGPL=yes -N "$node" >/dev/null
  mkdir -p "$(dirname @AUTOBUILD@)"
  : > @AUTOBUILD@
  changed "autoBuildGPL for $node"
fi
@GDS@state=$(node_state "$node")
if [[ "$state" != active ]]; then
  mm mmstartup -N "$node" >/dev/null
  changed "started GPFS on $node (it was $state)"
  for ((waited = 0; waited < @WAIT_S@; waited += 5)); do
    state=$(node_state "$node")
    if [[ "$state" == active ]]; then break; fi
    sleep 5
  done
  [[ "$state" == active ]] || fail "GPFS on $node is $state, not active, @WAIT_S@ s after mmstartup (mmgetstate -N $node; /var/adm/ras/mmfs.log.latest there)"
fi
if ! mounted_on @FS@ "$node"; then
  mm mmmount @FS@ -N "$node" >/dev/null
  changed "mounted @FS@ on $node"
  for ((waited = 0; waited < @WAIT_S@; waited += 5)); do
    if mounted_on @FS@ "$node"; then break; fi
    sleep 5
  done
  mounted_on @FS@ "$node" || fail "@FS@ is not mounted on $node @WAIT_S@ s after mmmount (mmlsmount @FS@ -L)"
fi
"""

# GDS settings, per node: verbsPorts names the RDMA devices cufile.json lists. They take effect when GPFS
# starts on the node; a node already running keeps the old ones until its next start (a reboot or a rollout),
# since restarting GPFS under running jobs would unmount their filesystem.
_GDS = r"""conf=@CONF@
if ! same_file "$conf" @SETTINGS@; then
  mm mmchconfig @SETTINGS@ -N "$node" >/dev/null
  mkdir -p "$(dirname "$conf")"
  printf '%s\n' @SETTINGS@ > "$conf"
  changed "GDS settings for $node: @SETTINGS@"
  if [[ "$(node_state "$node")" == active ]]; then note "$node runs GPFS already: the GDS settings apply at its next start (its next rollout)"; fi
fi
"""
# GDS turned off: the node's own values go, so it takes the cluster's (mmchconfig: DEFAULT restores a value).
_GDS_OFF = r"""conf=@CONF@
if [[ -e "$conf" ]]; then
  mm mmchconfig verbsRdma=DEFAULT,verbsGPUDirectStorage=DEFAULT,verbsPorts=DEFAULT -N "$node" >/dev/null
  rm -f "$conf"
  changed "GDS settings of $node back to the cluster's"
fi
"""

_LEAVE = r"""exec 9>@LOCK@
flock -w @MM_S@ 9 || fail "another node's join held @LOCK@ for @MM_S@ s"
node=@NODE@
if scale_member "$node"; then
  if mounted_on @FS@ "$node"; then
    mm mmumount @FS@ -N "$node" >/dev/null || fail "@FS@ is busy on $node; stop what uses it (fuser -vm @MOUNT@ there) and run again"
    changed "unmounted @FS@ on $node"
  fi
  if [[ "$(node_state "$node")" != down ]]; then
    mm mmshutdown -N "$node" >/dev/null
    changed "stopped GPFS on $node"
  fi
  mm mmdelnode -N "$node" >/dev/null
  changed "removed $node from the cluster"
fi
rm -f @AUTOBUILD@
"""


def scale_verbs_ports(pool: NodePool) -> str:
    """Each RDMA device of the pool on its port 1, as mmchconfig's verbsPorts and cufile.json name them."""
    return " ".join(f"{n.device}/1" for n in sorted(pool.nics, key=lambda n: n.rail))


def scale_gds_settings(pool: NodePool) -> str:
    return f"verbsRdma=enable,verbsGPUDirectStorage=yes,verbsPorts={scale_verbs_ports(pool)}"


def render_scale_member(spec: ClusterSpec, layout: Layout, pool: NodePool, hostname: str) -> Script:
    """On the admin node: the GPU host joined (added, licensed, started, mounted), or removed on delete."""
    scale = spec.storage.scale
    assert scale is not None
    values = dict(BIN=f"{packages.SCALE_ROOT}/bin", MM_S=MM_TIMEOUT_S, LOCK=SCALE_LOCK, NODE=hostname,
                  FS=layout.client_source, WAIT_S=SCALE_WAIT_S, MOUNT=layout.mount_point,
                  AUTOBUILD=f"/etc/gpucluster/scale-{layout.fs_name}-autobuild/{hostname}")
    conf = f"/etc/gpucluster/scale-{layout.fs_name}-gds/{hostname}"
    gds = fill(_GDS, CONF=conf, SETTINGS=scale_gds_settings(pool)) if scale.gds \
        else fill(_GDS_OFF, CONF=conf)
    admin = scale.admin_node.hostname
    mm = fill(_MM.replace("@MM_FN@", bounded_function(
        "mm", MM_TIMEOUT_S, "an administration command, stopped and reported when the cluster does not answer in "
        "time.", "is the cluster healthy (mmgetstate -a)?")), **values)
    create = script(f"Storage Scale {layout.fs_name}: {hostname} joins through {admin}", admin,
                    mm + fill(_JOIN.replace("@GDS@", gds), **values))
    delete = script(f"Storage Scale {layout.fs_name}: {hostname} leaves the cluster (its data stays)", admin,
                    mm + fill(_LEAVE, **values))
    return Script(create, delete)



# --- the rollout's roll: the client again after a driver change, and its mount healthy before work ---------

class RolledFilesystem(SpecModel):
    """What a pool's roll checks of a site cluster's client before the node takes work again."""

    kind: Literal["wekafs", "scale"]
    mount_point: AbsPath
    device: str = Field("", description="Scale's file system device (mmmount's). Omitted: none (WEKA).")

    @classmethod
    def of(cls, spec: ClusterSpec) -> RolledFilesystem | None:
        storage = spec.storage
        if storage.kind not in ("wekafs", "scale"):
            return None
        return cls(kind=storage.kind, mount_point=storage.mount_point,
                   device=storage.remote_name if storage.kind == "scale" else "")


ROLL_MOUNT_S = 120       # the roll waits this long for the mount to come back


# A new driver stack (DOCA-OFED) resets the NICs the client drives: WEKA's DPDK client restarts on them, and
# GPFS restarts on the node (its verbs), after the portability layer is there for the running kernel.
_AFTER_DRIVER = {
    "wekafs": r"""  timeout 300 weka local restart @CONTAINER@ >/dev/null || fail "weka local restart @CONTAINER@ failed or took over 300 s after the driver change (weka local ps)"
  changed "restarted the WEKA client (its NICs' driver changed)"
""",
    "scale": r"""  scale_layer
  timeout 600 @BIN@/mmshutdown >/dev/null || fail "mmshutdown failed or took over 600 s on this node"
  timeout 600 @BIN@/mmstartup >/dev/null || fail "mmstartup failed or took over 600 s on this node"
  changed "restarted GPFS (its NICs' driver changed)"
""",
}

_ROLL_MOUNT = r"""
# --- the parallel filesystem's client: restarted after a driver change, mounted and answering before work ---
if [[ " ${due[*]} " == *" driver "* ]]; then
@AFTER_DRIVER@fi
for ((waited = 0; waited < @WAIT_S@; waited += 5)); do
  if findmnt -rn @MOUNT@ >/dev/null; then break; fi
  @REMOUNT@sleep 5
done
findmnt -rn @MOUNT@ >/dev/null || fail "@MOUNT@ is not mounted @WAIT_S@ s into the roll: the node stays out of work until it is (see the storage client's step)"
timeout 30 stat -f @MOUNT@ >/dev/null || fail "@MOUNT@ does not answer (stat -f, 30 s) after the roll: the node stays out of work"
@CLIENT@note "@MOUNT@ is mounted and answers"
"""

_WEKA_RUNNING = _WEKA_STATE + r"""state=$(weka_state)
[[ "$state" == Running ]] || fail "the WEKA client container @CONTAINER@ is ${state:-absent} after the roll (weka local ps)"
"""


def render_roll_check(fs: RolledFilesystem) -> str:
    """The roll's part for a site cluster's client (it runs after the owed restarts, which set `due`)."""
    root = packages.SCALE_ROOT
    after = fill(_AFTER_DRIVER[fs.kind], CONTAINER=WEKA_CONTAINER, BIN=f"{root}/bin")
    functions = fill(_SCALE_LAYER, BUILD_S=SCALE_BUILD_S, BIN=f"{root}/bin") if fs.kind == "scale" else ""
    # GPFS mounts on start where the file system automounts; where it does not, the node mounts it itself.
    remount = fill('if [[ "$waited" == 0 ]]; then timeout 300 @BIN@/mmmount @DEV@ >/dev/null 2>&1 || true; fi\n  ',
                   BIN=f"{root}/bin", DEV=fs.device) if fs.kind == "scale" else ""
    client = fill(_WEKA_RUNNING, CONTAINER=WEKA_CONTAINER) if fs.kind == "wekafs" else ""
    return functions + fill(_ROLL_MOUNT.replace("@AFTER_DRIVER@", after).replace("@REMOUNT@", remount)
                .replace("@CLIENT@", client), MOUNT=fs.mount_point, WAIT_S=ROLL_MOUNT_S)
