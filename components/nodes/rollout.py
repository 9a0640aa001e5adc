"""A pool's rollout: changes that stop running work reach busy hosts a bounded batch at a time.

Preparation never restarts kubelet or containerd, installs and reloads the driver stack (driver.py), changes
what bounces the NICs' links (fabric/host.py) or the hugepages' count under tenants' pods: it leaves that owed
on the host and prints `<host>: rollout owed: <units>`. Three steps per host then pay them, in order:
`<pool>-<host>-drain`, where pulumi runs (kubectl): mark, taint and cordon the Node, then drain it with
PodDisruptionBudgets honoured; `<pool>-<host>-roll`, over SSH: the owed restarts and a short burn-in;
`<pool>-<host>-uncordon`, where pulumi runs: the Node back in service as it was before. Hosts are taken by
rack, then hostname, `rollout.batch_size` at a time; a batch's drains wait for the previous batch's uncordons,
so no more than that many of the pool's hosts are out at once, and a host that fails stops the batches after it
(it stays cordoned and tainted, and the error says why). A host with nothing owed passes through all three
without a drain.
"""

from __future__ import annotations

from typing import NamedTuple

from ..bash import fill, script
from ..spec.hardware import STUCK_DELETION_S   # a drain waits no longer for a pod whose grace ended this long ago
from ..spec import Host, NodePool
from .host_prep import ROLLOUT_OWED, ROLLOUT_UNITS

ROLLOUT_ANNOTATION = "gpucluster.io/rollout"
CORDONED_BEFORE_ANNOTATION = "gpucluster.io/rollout-cordoned-before"
ROLLOUT_TAINT = "gpucluster.io/rollout"     # not a managed taint: the Node patch keeps it, as another's


def rollout_batches(pool: NodePool) -> list[list[Host]]:
    """The pool's hosts in the order the rollout takes them, `batch_size` at a time; a rack's hosts together."""
    hosts = sorted(pool.hosts, key=lambda h: (h.rack, h.hostname))
    size = pool.rollout.batch_size(len(hosts))
    return [hosts[i:i + size] for i in range(0, len(hosts), size)]


def owed_restarts(stdout: str | None) -> str:
    """The restarts a preparation's output says it left to the rollout, as one sorted word list ("" for none):
    the last such line of the run, for its host."""
    owed = ""
    for line in (stdout or "").splitlines():
        _, sep, rest = line.partition(f": {ROLLOUT_OWED}")
        if sep:
            owed = " ".join(sorted({u for u in rest.split() if u in ROLLOUT_UNITS}))
    return owed


# kubectl as pulumi runs it: the kubeconfig on standard input (a secret: the content, or a path to it, as the
# Kubernetes provider's `kubeconfig` takes it), else kubectl's own (KUBECONFIG or ~/.kube/config).
KUBECTL = r"""
need kubectl "the rollout drains and uncordons nodes with kubectl where pulumi runs; install it there"
kubeconfig="$(cat)"
if [[ -n "$kubeconfig" ]]; then
  if [[ "$kubeconfig" != *$'\n'* && -f "$kubeconfig" ]]; then
    export KUBECONFIG="$kubeconfig"
  else
    KUBECONFIG="$(mktemp)"
    export KUBECONFIG
    trap 'rm -f "$KUBECONFIG"' EXIT      # mktemp made it 0600
    printf '%s\n' "$kubeconfig" > "$KUBECONFIG"
  fi
fi
unset kubeconfig
kc=(kubectl)
if [[ -n "${GPUCLUSTER_CONTEXT:-}" ]]; then kc+=(--context "$GPUCLUSTER_CONTEXT"); fi
# node_field JSONPATH: a field of this host's Node ("" when absent, or when there is no such Node). Always
# assigned (x="$(node_field ...)"), never tested inline: only an assignment stops the script when kubectl fails.
node_field() {
  local out
  out="$("${kc[@]}" get node "$HOST" --ignore-not-found -o "jsonpath=$1" 2>&1)" \
    || fail "kubectl cannot read node $HOST: $out"
  printf '%s' "$out"
}
# end_if_no_node WHAT: end the step, done, where this host has no Node, saying WHAT there is nothing to do.
end_if_no_node() {
  local name
  name="$(node_field '{.metadata.name}')"
  if [[ -z "$name" ]]; then
    note "no Node $HOST in the cluster: nothing to $1"
    finish
    exit 0
  fi
}
# shellcheck disable=SC2034  # not every step reads the taints
TAINTS='{range .spec.taints[*]}{.key}={.value}{"\n"}{end}'
# has_taint TAINTS KEY[=VALUE]: TAINTS (node_field "$TAINTS") has that taint (grep reads all its input).
has_taint() {
  if [[ $2 == *=* ]]; then printf '%s\n' "$1" | grep -Fx "$2" >/dev/null
  else printf '%s\n' "$1" | cut -d= -f1 | grep -Fx "$2" >/dev/null; fi
}
"""

_DRAIN = r"""
owed_units="${GPUCLUSTER_OWED:-}"
if [[ -z "$owed_units" ]]; then
  note "no restart is owed here: not drained"
  finish
  exit 0
fi
# A pod still there STUCK_S after its grace period ended has had its containers killed: what keeps it is a
# finalizer (a Job's tracking one, while Kueue holds the Job suspended: its workload evicted, with no node to
# replace this one), not work; the roll step checks on the host that nothing runs.
roll="${GPUCLUSTER_ROLL:-}" value=in-progress failed=failed why="restart $owed_units"
drain_flags=(--skip-wait-for-delete-timeout=@STUCK_S@)
stuck="$HOST stays cordoned and tainted @TAINT@=failed, and the pool's later batches wait. Let its pods finish or move them (a running one: a PodDisruptionBudget that allows no eviction, or a pod no controller owns; a terminating one: what its finalizer waits for), then run pulumi up again, which drains it again and goes on. To put it back to work meanwhile: kubectl taint node $HOST @TAINT@- && kubectl uncordon $HOST"
"""

# Taking a Node out: it reads roll (the annotation's value), value (the taint's), failed (the taint's when the
# drain does not finish), why, stuck (what the error says then) and drain_flags (more of kubectl drain's).
TAKE_OUT = r"""
end_if_no_node "drain before we $why"
# Marked first, with what it was: a run killed anywhere after this is finished or undone by the uncordon step.
marked="$(node_field '{.metadata.annotations.gpucluster\.io/rollout-cordoned-before}')"
before="$(node_field '{.spec.unschedulable}')"
if [[ -z "$marked" ]]; then
  "${kc[@]}" annotate node "$HOST" --overwrite @CORDONED_BEFORE@="${before:-false}" >/dev/null
  changed "marked for the rollout (cordoned before: ${before:-false})"
fi
"${kc[@]}" annotate node "$HOST" --overwrite @ANNOTATION@="$roll" >/dev/null
taints="$(node_field "$TAINTS")"
if ! has_taint "$taints" "@TAINT@=$value"; then
  "${kc[@]}" taint node "$HOST" --overwrite "@TAINT@=$value:NoSchedule" >/dev/null
  changed "tainted @TAINT@=$value:NoSchedule"
fi
if [[ "$before" != true ]]; then
  "${kc[@]}" cordon "$HOST" >/dev/null
  changed "cordoned"
fi
note "draining (PodDisruptionBudgets honoured, at most @TIMEOUT@s) to $why"
if ! drained="$("${kc[@]}" drain "$HOST" --ignore-daemonsets --delete-emptydir-data --timeout=@TIMEOUT@s "${drain_flags[@]}" 2>&1)"; then
  "${kc[@]}" taint node "$HOST" --overwrite "@TAINT@=$failed:NoSchedule" >/dev/null || true
  # What held it, pod by pod (DaemonSets' aside): still running (its eviction refused: a PodDisruptionBudget, a
  # pod no controller owns), or terminating past its grace period, kept by a finalizer.
  held="$("${kc[@]}" get pods -A --field-selector "spec.nodeName=$HOST" -o jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name}{"\t"}{.metadata.ownerReferences[0].kind}{"\t"}{.metadata.deletionTimestamp}{"\t"}{.metadata.finalizers}{"\n"}{end}' 2>/dev/null \
    | awk -F'\t' '$1 != "" && $2 != "DaemonSet" { printf "%s%s (%s)", sep, $1, ($3 == "" ? "running" : "terminating since " $3 ($4 == "" ? "" : ", kept by finalizers " $4)); sep = "; " }' || true)"
  fail "the drain did not finish: $(printf '%s\n' "$drained" | grep -iE 'error|cannot|timed out' | sed -n 1,3p | tr '\n' ' ')- still on $HOST: ${held:-nothing it could list}. $stuck"
fi
# kubectl prints a pod again each time it retries its eviction: count each pod once
changed "drained: $(printf '%s\n' "$drained" | sed -n 's/^evicting pod //p' | sort -u | grep -c . || true) pod(s) evicted"
"""

_UNCORDON = r"""
before="$(node_field '{.metadata.annotations.gpucluster\.io/rollout-cordoned-before}')"
if [[ -z "$before" ]]; then
  note "not taken out by a rollout: left as it is"
  finish
  exit 0
fi
taints="$(node_field "$TAINTS")"
if has_taint "$taints" @TAINT@; then
  "${kc[@]}" taint node "$HOST" @TAINT@- >/dev/null
  changed "removed the taint @TAINT@"
fi
unschedulable="$(node_field '{.spec.unschedulable}')"
if [[ "$before" != true && "$unschedulable" == true ]]; then
  "${kc[@]}" uncordon "$HOST" >/dev/null
  changed "uncordoned"
fi
# Unmarked last: a run killed before this does the steps above again, which change nothing twice.
"${kc[@]}" annotate node "$HOST" @ANNOTATION@- @CORDONED_BEFORE@- >/dev/null
if [[ "$before" == true ]]; then changed "rollout done (it stays cordoned, as it was before)"
else changed "rollout done: back in service"; fi
"""


class RolloutScripts(NamedTuple):
    drain: str
    uncordon: str


def render_rollout(pool: NodePool, host: Host) -> RolloutScripts:
    """The host's drain and uncordon scripts, run by bash where pulumi runs. They read GPUCLUSTER_OWED (the
    restarts owed, `owed_restarts`), GPUCLUSTER_ROLL (which preparation they roll), GPUCLUSTER_CONTEXT
    (optional) and the kubeconfig on standard input (optional)."""
    names = {"ANNOTATION": ROLLOUT_ANNOTATION, "CORDONED_BEFORE": CORDONED_BEFORE_ANNOTATION,
             "TAINT": ROLLOUT_TAINT}
    title = f"({pool.name}'s rollout, run by pulumi with kubectl)"
    return RolloutScripts(
        script(f"Drain {host.hostname} {title}", host.hostname,
               KUBECTL + fill(_DRAIN + TAKE_OUT, TIMEOUT=pool.rollout.drain_timeout_s, STUCK_S=STUCK_DELETION_S,
                              **names)),
        script(f"Give {host.hostname} back to work {title}", host.hostname, KUBECTL + fill(_UNCORDON, **names)))
