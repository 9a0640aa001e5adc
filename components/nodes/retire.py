"""Hosts join and retire with the spec: a host removed from a pool leaves the cluster, never while work runs.

Three resources per host carry it, besides those that set the host up. Each does its part when Pulumi deletes
it, and Pulumi deletes a removed host's resources in the reverse order of their dependencies:
1. `<pool>-<host>-retire` (where pulumi runs, kubectl; after the host's last rollout step): marks, taints
   `gpucluster.io/rollout=retiring` and cordons the Node, then drains it with PodDisruptionBudgets honoured.
   A drain that does not finish fails the deletion, and nothing after it runs: the host keeps its Node, mounts
   and settings, cordoned.
2. What the host's other resources undo: the Node patch, the filesystem client (unmounted), the burn-in, the
   preparation and its fabric settings (undone).
3. `<pool>-<host>-leave` (over SSH; the preparation waits for it): refuses while tenants' pods run, then stops
   and disables kubelet, so the Node is not registered again, and removes the node agents' pods it left.
4. `<pool>-<host>-deregister` (kubectl; first of the host's resources, so deleted last): deletes the Node.
A host moved to another pool in the same change is not retired: its new pool's resources are created first,
and every step above reads whose the host is now (the Node's pool label, the host's pool file) and leaves it be.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

from ..bash import SKIP_REST, fill, script
from ..ssh import Script
from ..spec import Host, NodePool
from ..k8s.labels import POOL_LABEL
from .host_prep import render_busy
from .rollout import (TAKE_OUT, CORDONED_BEFORE_ANNOTATION, KUBECTL, ROLLOUT_ANNOTATION, ROLLOUT_TAINT,
                      SLURM_REASON_ANNOTATION)

POOL_FILE = "/var/lib/gpucluster/pool"      # the pool whose preparation the host carries
LEFT_FILE = "/var/lib/gpucluster/left"      # kubelet was disabled by a retirement (a re-added host enables it)


def host_guard(pool: NodePool, what: str, code: int = 0) -> str:
    """Bash lines that end a script with `code` on a host that another pool has taken over, leaving `what`
    as it is (a host's pool file is written by `-leave`'s create, the first step of its preparation)."""
    return fill(r"""
if [[ -f @FILE@ ]] && ! same_file @FILE@ @POOL@; then
  note "prepared for pool $(cat @FILE@) now, not @POOL@: @WHAT@ left as it is"
  finish
  exit @CODE@
fi
""", FILE=POOL_FILE, POOL=pool.name, WHAT=what, CODE=code)


def undo_guard(pool: NodePool, host: Host) -> str:
    """The script that runs before the host's preparation is undone: it ends with SKIP_REST (the undo is not
    run) where another pool has taken the host over in the same change."""
    return script(f"Is {host.hostname} still {pool.name}'s?", host.hostname,
                  host_guard(pool, "its preparation and fabric settings", SKIP_REST), shared=True)


_NODE_GUARD = r"""
pool="$(node_field '{.metadata.labels.@POOL_LABEL@}')"
if [[ -n "$pool" && "$pool" != @POOL@ ]]; then
  note "its Node is in pool $pool now, not @POOL@: left as it is"
  finish
  exit 0
fi
"""

_RETIRE = r"""
roll=retire value=retiring failed=retiring why="retire it (it left pool @POOL@ in the spec)"
give_up() { fail "$*"; }     # a host leaving the spec has no rollout to go on with
drain_flags=(--skip-wait-for-delete-timeout=@TIMEOUT@)
stuck="$HOST stays cordoned and tainted @TAINT@=retiring and is not retired: its Node, mounts, preparation and fabric settings stay until a drain finishes. Let its pods finish or move them (a PodDisruptionBudget that allows no eviction, a pod no controller owns), then run pulumi up again. To keep the host instead, put it back in the spec, run pulumi up, then kubectl taint node $HOST @TAINT@- && kubectl uncordon $HOST"
end_if_no_node "drain before we $why"
"""

_DEREGISTER = r"""
end_if_no_node deregister
system_namespaces=@SYSTEM@
# tenants' pods still bound to it and not on their way out (a retirement drained them; a person may not have)
bound="$("${kc[@]}" get pods -A --field-selector "spec.nodeName=$HOST" -o go-template \
  --template '{{range .items}}{{if not (or .metadata.deletionTimestamp (eq .status.phase "Succeeded" "Failed"))}}{{.metadata.namespace}}/{{.metadata.name}}{{"\n"}}{{end}}{{end}}' 2>&1)" \
  || fail "kubectl cannot list the pods on $HOST: $bound"
work=()
while IFS= read -r pod; do
  [[ -n "$pod" ]] || continue
  case " $system_namespaces " in *" ${pod%%/*} "*) ;; *) work+=("$pod") ;; esac
done <<<"$bound"
if (( ${#work[@]} )); then
  fail "${#work[@]} tenant pod(s) are still bound to $HOST (${work[*]:0:5}): its Node is not deleted. Drain it (kubectl drain $HOST --ignore-daemonsets --delete-emptydir-data) and run pulumi up again"
fi
"${kc[@]}" delete node "$HOST" --ignore-not-found >/dev/null
changed "deleted its Node: $HOST has left the cluster"
"""

_JOIN = r"""
put_file @FILE@ 0644 @POOL@
if [[ -e @LEFT@ ]]; then
  need systemctl "this host does not run systemd"
  systemctl enable kubelet >/dev/null     # preparation starts it, with its settings
  rm -f @LEFT@
  changed "enabled kubelet again (a retirement had disabled it)"
fi
"""

_LEAVE = r"""
need systemctl "this host does not run systemd"
if systemctl is-enabled --quiet kubelet 2>/dev/null || systemctl is-active --quiet kubelet; then
  refuse_if_busy "stopping kubelet to retire the host"
  mkdir -p "$(dirname @LEFT@)"
  : > @LEFT@
  systemctl disable --now kubelet >/dev/null
  changed "stopped and disabled kubelet: the host no longer registers a Node"
fi
if command -v crictl >/dev/null 2>&1; then
  sandboxes=()
  mapfile -t sandboxes < <(crictl pods -q)
  if (( ${#sandboxes[@]} )); then
    crictl rmp -f "${sandboxes[@]}" >/dev/null
    changed "removed ${#sandboxes[@]} pod(s) of node agents the kubelet left"
  fi
fi
drop_file @FILE@
"""


class RetireScripts(NamedTuple):
    retire: str         # the delete of `-retire`, where pulumi runs
    deregister: str     # the delete of `-deregister`, where pulumi runs
    membership: Script  # `-leave`, over SSH: the host joins (create) and leaves (delete)


def render_retirement(pool: NodePool, host: Host, system_namespaces: Sequence[str]) -> RetireScripts:
    """The host's retirement steps. The kubectl ones read GPUCLUSTER_CLUSTER, GPUCLUSTER_CONTEXT (optional) and the
    kubeconfig on standard input (optional), as the rollout's do. `system_namespaces`: pods there are node agents, not work."""
    names = {"ANNOTATION": ROLLOUT_ANNOTATION, "CORDONED_BEFORE": CORDONED_BEFORE_ANNOTATION,
             "TAINT": ROLLOUT_TAINT, "POOL": pool.name, "SLURM_REASON": SLURM_REASON_ANNOTATION}
    guard = fill(_NODE_GUARD.replace("@POOL_LABEL@", POOL_LABEL.replace(".", "\\.")), POOL=pool.name)
    title = f"({pool.name}: the host left the spec; run by pulumi with kubectl)"
    timeout = pool.rollout.drain_timeout_s
    files = {"FILE": POOL_FILE, "LEFT": LEFT_FILE, "POOL": pool.name}
    return RetireScripts(
        script(f"Retire {host.hostname}: cordon and drain its Node {title}", host.hostname,
               KUBECTL + guard + fill(_RETIRE + TAKE_OUT, TIMEOUT=timeout, **names)),
        script(f"Delete the Node of {host.hostname} {title}", host.hostname,
               KUBECTL + guard + fill(_DEREGISTER, SYSTEM=" ".join(system_namespaces))),
        Script(script(f"{host.hostname} joins pool {pool.name}", host.hostname, fill(_JOIN, **files), shared=True),
               script(f"{host.hostname} leaves the cluster: kubelet stopped and disabled", host.hostname,
                      render_busy(system_namespaces) + host_guard(pool, "kubelet")
                      + fill(_LEAVE, **files), shared=True)))
