"""A test host as a client of a site's WEKA or Storage Scale cluster: recording doubles for the vendors' binaries
(`weka`, WEKA's installer, the `mm*` commands), which hold the cluster's state under the doubles' state
directory and answer in the vendors' documented output formats; everything else the scripts run is real.

Formats, with their sources: `weka local ps` lists CONTAINER STATE ... per container (docs.weka.io, "weka local
ps"); `mmlscluster -Y` and `mmgetstate -Y` print a HEADER line naming their colon-separated fields, as IBM's
install toolkit parses them (IBM/ibm-spectrum-scale-install-infra); `mmlsmount FS -L` prints "File system FS is
mounted on N nodes:" then "IP NAME" per node; `mmlsattr -L` prints "fileset name: NAME" (IBM Storage Scale
command reference). Each double refuses what its command refuses where the scripts could trip on it: adding a
node twice, deleting one GPFS still runs on, mounting on a node that is down, creating or linking a fileset twice.
"""

from __future__ import annotations

import os
import shlex

from tests.realssh.doubles import STATE_DIR
from tests.realssh.storage_host import RECORD

KERNEL = os.uname().release       # the test hosts run this machine's kernel

# WEKA: the CLI. `weka local ps` shows the stateless client's container once the mount started it (unless the
# test stopped it); quota commands need the CLI's credentials from the environment, as a real cluster does.
WEKA = RECORD + r'''
case "$1 ${2:-}" in
  "local ps")
    echo "CONTAINER  STATE    DISABLED  UPTIME    MONITORING  PERSISTENT  PORT   PID    STATUS  VERSION"
    if [[ -e "$S/mounts/_srv_weka" ]]; then
      state=Running
      if [[ -e "$S/weka-stopped" ]]; then state=Stopped; fi
      echo "client     $state  False     0:10:00h  True        False       14000  4242   Ready   4.4.1"
    fi ;;
  "fs quota")
    [[ -n "${WEKA_USERNAME:-}" && -n "${WEKA_PASSWORD:-}" ]] || { echo "error: Authentication failed (no login)" >&2; exit 1; }
    [[ "$WEKA_PASSWORD" == "$(cat "$S/weka-password")" ]] || { echo "error: Authentication failed" >&2; exit 1; }
    echo "quota-as $WEKA_USERNAME" >> "$S/calls.log" ;;
esac
'''
# WEKA's installer, as a backend serves it: installs the agent (the CLI above and its unit).
WEKA_INSTALLER = f'''#!/bin/sh
set -e
printf '%s' {shlex.quote(WEKA)} > /usr/local/bin/weka
chmod +x /usr/local/bin/weka
printf '[Service]\\nExecStart=/bin/true\\n' > /etc/systemd/system/weka-agent.service
echo "installer" >> {STATE_DIR}/calls.log
'''

_MM_STATE = r'''
C=$S/scale
mkdir -p "$C/nodes" "$C/mounts" "$C/filesets" "$C/junctions"
node=""; args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do if [[ "${args[i]}" == -N ]]; then node=${args[i+1]}; fi; done
member() { [[ -e "$C/nodes/$1" ]]; }
'''
SCALE = {
    "mmlscluster": RECORD + _MM_STATE + r'''
echo "mmlscluster:clusterSummary:HEADER:version:reserved:reserved:clusterName:clusterId:uidDomain:rshPath:rshSudoWrapper:rcpPath:rcpSudoWrapper:repositoryType:primaryServer:secondaryServer:"
echo "mmlscluster:clusterSummary:0:1:::scale1.example.internal:4711471147114711:example.internal:/usr/bin/ssh:no:/usr/bin/scp:no:CCR:::"
echo "mmlscluster:clusterNode:HEADER:version:reserved:reserved:nodeNumber:daemonNodeName:ipAddress:adminNodeName:designation:otherNodeRoles:adminLoginName:otherNodeRolesAlias:"
echo "mmlscluster:clusterNode:0:1:::1:nsd-01.example.internal:10.10.0.61:nsd-01.example.internal:quorum-manager::root::"
n=2
for f in "$C"/nodes/*; do
  [[ -e "$f" ]] || continue
  echo "mmlscluster:clusterNode:0:1:::$n:${f##*/}.example.internal:10.10.9.$n:${f##*/}.example.internal:::root::"
  n=$((n + 1))
done
''',
    "mmaddnode": RECORD + _MM_STATE + r'''
if member "$node"; then echo "mmaddnode: Node $node is already a member of the cluster." >&2; exit 1; fi
echo down > "$C/nodes/$node"
''',
    "mmchlicense": RECORD + _MM_STATE + r'''
member "$node" || { echo "mmchlicense: $node is not a node of the cluster" >&2; exit 1; }
[[ "$1" == client && "$2" == --accept ]] || { echo "mmchlicense: give client --accept" >&2; exit 1; }
''',
    "mmgetstate": RECORD + _MM_STATE + r'''
member "$node" || { echo "mmgetstate: $node is not a node of the cluster" >&2; exit 1; }
echo "mmgetstate::HEADER:version:reserved:reserved:nodeName:nodeNumber:state:quorum:nodesUp:totalNodes:remarks:cnfsState:"
echo "mmgetstate::0:1:::$node.example.internal:2:$(cat "$C/nodes/$node"):1:2:3:::"
''',
    # without -N: this node (a client's own roll), recorded as such
    "mmstartup": RECORD + _MM_STATE + '[[ -n "$node" ]] || exit 0\nmember "$node" || exit 1\n'
                                      'echo active > "$C/nodes/$node"\n',
    "mmshutdown": RECORD + _MM_STATE + '[[ -n "$node" ]] || exit 0\nmember "$node" || exit 1\n'
                                       'echo down > "$C/nodes/$node"\nrm -f "$C"/mounts/*/"$node"\n',
    "mmmount": RECORD + _MM_STATE + r'''
[[ "$(cat "$C/nodes/$node" 2>/dev/null)" == active ]] || { echo "mmmount: GPFS is not active on $node" >&2; exit 1; }
mkdir -p "$C/mounts/$1"; touch "$C/mounts/$1/$node"
''',
    "mmumount": RECORD + _MM_STATE + r'''
if [[ -e "$C/busy" ]]; then echo "umount: $1: target is busy" >&2; exit 1; fi
rm -f "$C/mounts/$1/$node"
''',
    "mmlsmount": RECORD + _MM_STATE + r'''
n=$(find "$C/mounts/$1" -type f 2>/dev/null | wc -l)
if (( n == 0 )); then echo "File system $1 is not mounted."; exit 0; fi
echo "File system $1 is mounted on $n nodes:"
for f in "$C/mounts/$1"/*; do echo "  10.10.9.9      ${f##*/}.example.internal"; done
''',
    "mmdelnode": RECORD + _MM_STATE + r'''
member "$node" || { echo "mmdelnode: $node is not a node of the cluster" >&2; exit 1; }
[[ "$(cat "$C/nodes/$node")" == down ]] || { echo "mmdelnode: GPFS is still active on $node; mmshutdown it first" >&2; exit 1; }
rm -f "$C/nodes/$node"
''',
    "mmchconfig": RECORD + _MM_STATE + 'member "$node" || exit 1\n',
    "mmbuildgpl": RECORD + 'touch "$S/scale-modules-$(uname -r)"\n',
    "mmlsfileset": RECORD + _MM_STATE + '[[ -e "$C/filesets/$2" ]] || { echo "mmlsfileset: fileset $2 not found" >&2; exit 2; }\n',
    "mmcrfileset": RECORD + _MM_STATE + r'''
[[ ! -e "$C/filesets/$2" ]] || { echo "mmcrfileset: Fileset $2 already exists." >&2; exit 1; }
[[ "$3 $4" == "--inode-space new" ]] || { echo "expected --inode-space new" >&2; exit 2; }
touch "$C/filesets/$2"
''',
    "mmlinkfileset": RECORD + _MM_STATE + r'''
[[ -e "$C/filesets/$2" ]] || { echo "mmlinkfileset: fileset $2 not found" >&2; exit 2; }
[[ ! -e "$4" ]] || { echo "mmlinkfileset: $4 already exists" >&2; exit 1; }
mkdir "$4"; printf '%s' "$2" > "$C/junctions/${4//\//_}"
''',
    "mmlsattr": RECORD + _MM_STATE + r'''
path=${*: -1}
[[ -e "$path" ]] || { echo "mmlsattr: $path: No such file or directory" >&2; exit 1; }
set="root"
if [[ -e "$C/junctions/${path//\//_}" ]]; then set=$(cat "$C/junctions/${path//\//_}"); fi
printf 'file name:            %s\nfileset name:         %s\n' "$path" "$set"
''',
    "mmsetquota": RECORD,
    # the daemon and the portability layer's sources, which the node's packages check for
    "mmfsd": RECORD,
}
# modinfo: the Lustre modules of storage_host's double, and Scale's portability layer once mmbuildgpl built it.
MODINFO = RECORD + r'''
if [[ "$1" == -k ]]; then [[ "$3" == mmfs26 && -e "$S/scale-modules-$2" ]]; exit; fi
[[ "$1" == lustre || "$1" == osd_ldiskfs || "$1" == ko2iblnd ]] && [[ -e "$S/lustre-modules" ]]
'''
SCALE_ROOT = "/opt/lpp/mmfs"      # the tests' Scale tree: under an overlaid directory, so each host has its own


def scale_installed(h) -> None:
    """`h` with Scale's packages (the mm doubles in SCALE_ROOT/bin) and the modinfo that sees its layer."""
    for tool, text in SCALE.items():
        h.put(f"{SCALE_ROOT}/bin/{tool}", text)
    h.put(f"{SCALE_ROOT}/src/config/site.mcr", "")
    h.put("/usr/local/bin/modinfo", MODINFO)
    h.sh(f"chmod +x {SCALE_ROOT}/bin/* /usr/local/bin/modinfo")
