"""A pool's rollout: changes that stop running work reach busy hosts a bounded batch at a time.

Preparation never restarts kubelet or containerd, installs and reloads the driver stack (driver.py), changes
what bounces the NICs' links (fabric/host.py) or the hugepages' count under tenants' pods: it leaves that owed
on the host and prints `<host>: rollout owed: <units>`. Three steps per host then pay them, in order:
`<pool>-<host>-drain`, where pulumi runs (kubectl): mark, taint and cordon the Node, then drain it with
PodDisruptionBudgets honoured; `<pool>-<host>-roll`, over SSH: the owed restarts and a short burn-in;
`<pool>-<host>-uncordon`, where pulumi runs: the Node back in service as it was before. Hosts are taken by
rack, then hostname, `rollout.batch_size` at a time; a batch's drains wait for the previous batch's uncordons.
What the cluster holds out already counts: a drain takes its host out only while the pool's hosts out of
service (cordoned, quarantined, not Ready, claimed by another drain, in a GPU Operator driver upgrade) leave
room under max_unavailable, and is deferred otherwise. A host whose drain or roll fails stays out (tainted
`gpucluster.io/rollout=failed`); within `rollout.failure_budget_hosts` the later batches go on, past it they
wait. `<pool>-rollout`, last, names the hosts deferred or failed and fails the apply while there are any; the
next apply tries exactly those again (the live Node's pending mark is an input of their drain). A host with
nothing owed, or already rolled for this preparation, passes through all three without a drain. On a Slurm pool
the drain gives Slinky its reason with the cordon and evicts nothing until Slinky reports the Slurm node drained
with no job on it.
"""

from __future__ import annotations

from typing import NamedTuple

from ..bash import fill, script
from ..k8s.labels import BURN_IN_TAINT, POOL_LABEL, QUARANTINE_TAINT, RESET_TAINT
from ..spec.hardware import STUCK_DELETION_S   # a drain waits no longer for a pod whose grace ended this long ago
from ..spec import Host, NodePool
from .host_prep import DRIVER_INSTALL_MODEL_S, NOT_DRAINED, ROLL_BOUNDS_S, ROLL_FAILED, ROLLOUT_OWED, ROLLOUT_UNITS

ROLLOUT_ANNOTATION = "gpucluster.io/rollout"
CORDONED_BEFORE_ANNOTATION = "gpucluster.io/rollout-cordoned-before"
ROLLOUT_TAINT = "gpucluster.io/rollout"     # not a managed taint: the Node patch keeps it, as another's
# A drain's claim on room under max_unavailable, from its count of the pool's hosts out to its cordon; one
# older than CLAIM_STALE_S is a killed run's and no longer counts.
CLAIM_ANNOTATION = "gpucluster.io/rollout-claim"
CLAIM_STALE_S = 300
# Why the host's rollout is not done ("deferred: ..." or "failed: ..."): read by the next apply, whose drain
# then runs again; lifted by the uncordon.
PENDING_ANNOTATION = "gpucluster.io/rollout-pending"
# The preparation (its digest) the host last rolled for: a drain run again for it has nothing to do.
ROLLED_ANNOTATION = "gpucluster.io/rolled"
# The library's taints that keep a host out of service whatever their effect (NoExecute ones of others count too).
OUT_OF_SERVICE_TAINTS = (BURN_IN_TAINT, QUARANTINE_TAINT, RESET_TAINT)
DEFERRED, FAILED = "rollout deferred", "rollout failed"     # the drain's outcome lines, besides a drain
# Slinky's operator drains the Slurm node of a cordoned Node's slurmd pod, with this annotation's value as the
# reason (slurm-operator v1.1.0 api/v1beta1/well_known.go); it undrains it once the Node is uncordoned.
SLURM_REASON_ANNOTATION = "nodeset.slinky.slurm.net/node-cordon-reason"
SLURM_POD_LABEL = "nodeset.slinky.slurm.net/pod-hostname"     # on each slurmd pod: the Slurm node it registers as
# The GPU Operator's driver upgrade (NVIDIA k8s-operator-libs, pkg/upgrade/consts.go): the states in which its
# upgrade controller has a node out of service or is about to.
UPGRADE_STATE_LABEL = "nvidia.com/gpu-driver-upgrade-state"
UPGRADE_ACTIVE = ("cordon-required", "wait-for-jobs-required", "pod-deletion-required", "drain-required",
                  "pod-restart-required", "validation-required", "uncordon-required")


def jsonpath_annotation(key: str) -> str:
    return "{.metadata.annotations." + key.replace(".", "\\.") + "}"


def rollout_batches(pool: NodePool) -> list[list[Host]]:
    """The pool's hosts in the order the rollout takes them, `batch_size` at a time; a rack's hosts together."""
    hosts = sorted(pool.hosts, key=lambda h: (h.rack, h.hostname))
    size = pool.rollout.batch_size(len(hosts))
    return [hosts[i:i + size] for i in range(0, len(hosts), size)]


class RolloutModel(NamedTuple):
    """A pool's rollout in time, from the bounds its steps run under: what the report prints."""
    batches: int
    hosts_per_batch: int
    drain_s: int            # a batch's drain, at most (the pool's drain timeout)
    roll_s: int             # a batch's roll, at most: the roll's own bounds for what the pool can owe

    @property
    def at_most_s(self) -> int:
        return self.batches * (self.drain_s + self.roll_s)

    def interruptions(self, job_hosts: int) -> int:
        """How often a job on `job_hosts` of the pool's hosts can be stopped: once per batch it has a host in."""
        return min(job_hosts, self.batches)


def rollout_model(pool: NodePool, *, rdma: bool, host_driver: bool) -> RolloutModel:
    batches = rollout_batches(pool)
    roll = ROLL_BOUNDS_S["kubelet"] + (ROLL_BOUNDS_S["ports"] if rdma else 0)
    if host_driver and pool.burn_in.enabled:
        roll += ROLL_BOUNDS_S["dcgmi"]
    if host_driver and pool.software.package_repositories:
        roll += DRIVER_INSTALL_MODEL_S
    return RolloutModel(len(batches), len(batches[0]), pool.rollout.drain_timeout_s, roll)


def owed_restarts(stdout: str | None) -> str:
    """The restarts a preparation's output says it left to the rollout, as one sorted word list ("" for none):
    the last such line of the run, for its host."""
    owed = ""
    for line in (stdout or "").splitlines():
        _, sep, rest = line.partition(f": {ROLLOUT_OWED}")
        if sep:
            owed = " ".join(sorted({u for u in rest.split() if u in ROLLOUT_UNITS}))
    return owed


def drain_outcome(stdout: str | None) -> str:
    """What the roll is told of its host's drain: one of NOT_DRAINED (the roll waits for the next apply), else
    `go` (drained, or nothing to drain)."""
    for line in (stdout or "").splitlines():
        for word, outcome in zip((f": {DEFERRED}", f": {FAILED}"), NOT_DRAINED):
            if word in line:
                return outcome
    return "go"


def roll_failure(stdout: str | None) -> str:
    """The roll's failure, as its last such line says it ("" when it did not fail): the uncordon judges it."""
    why = ""
    for line in (stdout or "").splitlines():
        _, sep, rest = line.partition(f": {ROLL_FAILED}: ")
        if sep:
            why = rest.strip()
    return why


# kubectl as pulumi runs it: the kubeconfig on standard input (a secret: the content, or a path to it, as the
# Kubernetes provider's `kubeconfig` takes it), else kubectl's own (KUBECONFIG or ~/.kube/config); then proof
# that it reaches the stack's cluster before any step acts.
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
# Only the stack's own cluster: the one whose kube-system namespace the Kubernetes provider read (its uid).
[[ -n "${GPUCLUSTER_CLUSTER:-}" ]] || fail "this step was not told which cluster is the stack's (GPUCLUSTER_CLUSTER, the uid of its kube-system namespace as the Kubernetes provider reads it; a step an earlier release stored has none): nothing was changed. Run pulumi up once with the host still in the spec, then again"
cluster="$("${kc[@]}" get namespace kube-system -o 'jsonpath={.metadata.uid}' 2>&1)" \
  || fail "kubectl cannot reach the cluster to check it is the stack's: $(printf '%s\n' "$cluster" | sed -n 1,2p | tr '\n' ' ')"
if [[ "$cluster" != "$GPUCLUSTER_CLUSTER" ]]; then
  fail "kubectl reaches another cluster than the stack's Kubernetes provider (its kube-system namespace is $cluster, the stack's $GPUCLUSTER_CLUSTER; context $("${kc[@]}" config current-context 2>/dev/null || echo unknown)): nothing was changed. Give the node pool the kubeconfig and context the Kubernetes provider uses (kubernetes:kubeconfig, kubernetes:context; kubeconfig= and kube_context= where you import the components)"
fi
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
# one_line TEXT: TEXT on one line of at most 400 characters, for a mark on the Node (the error says it all).
one_line() { printf '%s' "$*" | tr '\n' ' ' | cut -c1-400; }
# shellcheck disable=SC2034  # not every step reads the taints
TAINTS='{range .spec.taints[*]}{.key}={.value}{"\n"}{end}'
# has_taint TAINTS KEY[=VALUE]: TAINTS (node_field "$TAINTS") has that taint (grep reads all its input).
has_taint() {
  if [[ $2 == *=* ]]; then printf '%s\n' "$1" | grep -Fx "$2" >/dev/null
  else printf '%s\n' "$1" | cut -d= -f1 | grep -Fx "$2" >/dev/null; fi
}
"""

# The pool's view, for the room a drain may take and the failures the rollout may go past.
_POOL = r"""
SLURM_REASON_PREFIX="gpucluster rollout: "      # how the drain's reason for Slurm begins
# pool_nodes: a line per Node of the pool: name, unschedulable, claim, driver upgrade state, taints
# (key=value:effect ...), Ready.
pool_nodes() {
  local out
  out="$("${kc[@]}" get nodes -l @POOL_LABEL@=@POOL@ -o 'jsonpath={range .items[*]}{.metadata.name}{"\t"}{.spec.unschedulable}{"\t"}{.metadata.annotations.gpucluster\.io/rollout-claim}{"\t"}{.metadata.labels.nvidia\.com/gpu-driver-upgrade-state}{"\t"}{range .spec.taints[*]}{.key}={.value}:{.effect} {end}{"\t"}{range .status.conditions[?(@.type=="Ready")]}{.status}{end}{"\n"}{end}' 2>&1)" \
    || fail "kubectl cannot list pool @POOL@'s nodes: $out"
  printf '%s\n' "$out"
}
# pool_out: "name<TAB>why" for each of the pool's hosts out of service now, or about to be.
pool_out() {
  local nodes
  nodes="$(pool_nodes)"
  printf '%s\n' "$nodes" | awk -F'\t' -v now="$(date +%s)" -v stale=@CLAIM_STALE_S@ -v ours=@OUT_TAINTS@ \
    -v own=@OWN_TAINTS@ -v active=@UPGRADE_ACTIVE@ '
    $1 == "" { next }
    {
      why = ""
      if ($2 == "true") why = "cordoned"
      else if ($6 != "True") why = "not Ready"
      else if ($4 != "" && index(" " active " ", " " $4 " ")) why = "in a GPU Operator driver upgrade (" $4 ")"
      else if ($3 ~ /^[0-9]+$/ && now - $3 < stale) why = "claimed by another drain"
      else {
        n = split($5, taints, " ")
        for (i = 1; i <= n; i++) {
          key = taints[i]; sub(/=.*/, "", key)
          effect = taints[i]; sub(/.*:/, "", effect)
          if (index(" " ours " ", " " key " ") || (effect == "NoExecute" && !index(" " own " ", " " key " "))) {
            why = "tainted " taints[i]; break
          }
        }
      }
      if (why != "") print $1 "\t" why
    }'
}
# give_up WHY: the host failed its rollout. It stays out (tainted failed, marked pending: the next apply tries
# it again); within the pool's failure budget the step succeeds and the later batches go on.
give_up() {
  local why failed
  why="$(one_line "$*")"
  "${kc[@]}" taint node "$HOST" --overwrite "@TAINT@=failed:NoSchedule" >/dev/null || true
  "${kc[@]}" annotate node "$HOST" --overwrite @PENDING@="failed: $why" >/dev/null || true
  failed="$(pool_nodes | awk -F'\t' -v t=@TAINT@=failed: 'index(" " $5, " " t) { n++ } END { print n + 0 }')"
  if (( failed <= @FAILURE_BUDGET@ )); then
    note @FAILED@" ($failed of the pool's failure budget of @FAILURE_BUDGET@; the rollout goes on, the next pulumi up tries it again): $*"
    finish
    exit 0
  fi
  fail "$* (rollout.failure_budget_hosts allows @FAILURE_BUDGET@ failed host(s) in pool @POOL@ and $failed have failed: the pool's later batches wait)"
}
"""

_DRAIN = r"""
# Which preparation this run drains for, in its output: pulumi-command hands the next run this output, which
# tells a run for a new preparation from one run again for another reason.
note "preparation ${GPUCLUSTER_ROLL:-none}"
owed_units="${GPUCLUSTER_OWED:-}"
if [[ -z "$owed_units" ]]; then
  note "no restart is owed here: not drained"
  finish
  exit 0
fi
roll="${GPUCLUSTER_ROLL:-}" value=in-progress failed=failed why="restart $owed_units"
slurm=@SLURM@
if [[ "$slurm" == true ]]; then
  # A Slurm pool: the cordon makes Slinky drain the Slurm node, with this reason (no new job starts there;
  # running ones go on).
  slurm_reason="$SLURM_REASON_PREFIX$why (preparation ${roll:-none})"
fi
# slurm_drained: returns once Slinky reports the Slurm node of this host's slurmd pod drained (or down) with no
# job on it, read from the pod's SlurmNodeState conditions, which Slinky sets from slurmrestd after it has acted
# on the cordon; gives the host up past the pool's bound. Its disruption budget alone is not enough: it marks a
# busy pod only on its next pass, up to a minute after a job starts, and an eviction before that kills the job.
slurm_drained() {
  local deadline=$((SECONDS + @TIMEOUT@)) out states=""
  while :; do
    out="$("${kc[@]}" get pods -A --field-selector "spec.nodeName=$HOST" -l @SLURM_POD_LABEL@ -o 'jsonpath={range .items[*]}{.metadata.namespace}/{.metadata.name}{"\t"}{range .status.conditions[?(@.status=="True")]}{.type} {end}{"\n"}{end}' 2>&1)" \
      || fail "kubectl cannot list the slurmd pod on $HOST: $out"
    if [[ -z "$out" ]]; then
      note "no slurmd pod here: no Slurm job to wait for"
      return 0
    fi
    # the Slurm states Slinky copied onto the pod (SlurmNodeState<State> conditions), as " Mixed Drain "
    states=" $(printf '%s\n' "$out" | cut -f2 | tr ' ' '\n' | sed -n 's/^SlurmNodeState//p' | tr '\n' ' ')"
    if [[ "$states" != *" Allocated "* && "$states" != *" Mixed "* && "$states" != *" Completing "* \
          && ( "$states" == *" Down "* || ( "$states" == *" Drain "* && "$states" != *" Undrain "* ) ) ]]; then
      note "Slurm drained it: no job runs there ($(printf '%s\n' "$out" | cut -f1 | tr '\n' ' ')in Slurm:$states)"
      return 0
    fi
    if (( SECONDS >= deadline )); then
      give_up "Slurm did not drain it within @TIMEOUT@ s (its Slurm states, as Slinky reads them:${states:- none}): a job still runs there, or Slinky's operator or slurmrestd does not answer. Nothing was evicted. $stuck"
    fi
    sleep 5
  done
}
end_if_no_node "drain before we $why"
# Run again for another reason than a new preparation (a new release of this script, a new input), a drain
# must not take out a host its roll has paid already. A pending mark (deferred, failed) or the rollout's own
# mark always goes on. A host rolled before its Node recorded the preparation (an earlier release), whose
# drain ran before for this preparation (its last output names it, or, from a release that did not name it,
# exists), is taken as rolled: the roll checks on the host, and what it finds still owed there marks the host
# pending, drained by the next apply. A drain's last run for another preparation is no such sign.
rolled="$(node_field @ROLLED_PATH@)"
pending="$(node_field @PENDING_PATH@)"
ours="$(node_field '{.metadata.annotations.gpucluster\.io/rollout-cordoned-before}')"
last_for="$(printf '%s\n' "${PULUMI_COMMAND_STDOUT:-}" | sed -n "s/^$HOST: preparation //p" | tail -n 1)"
if [[ -z "$pending" && -z "$ours" && -n "$roll" ]]; then
  if [[ "$rolled" == "$roll" ]]; then
    note "already rolled for this preparation: not drained"
    finish
    exit 0
  elif [[ -z "$rolled" && -n "${PULUMI_COMMAND_STDOUT:-}" && ( -z "$last_for" || "$last_for" == "$roll" ) ]]; then
    "${kc[@]}" annotate node "$HOST" --overwrite @ROLLED@="$roll" >/dev/null
    note "rolled before its Node recorded it: not drained (the roll checks what the host still owes)"
    finish
    exit 0
  fi
fi
# defer WHY: the host stays in service, marked pending, for the next apply.
defer() {
  "${kc[@]}" annotate node "$HOST" --overwrite @PENDING@="deferred: $1" @CLAIM@- >/dev/null
  note @DEFERRED@": $1"
  finish
  exit 0
}
if [[ -z "$ours" ]]; then      # taken out by this rollout already: no room to claim
  self="$(pool_out | awk -F'\t' -v h="$HOST" '$1 == h { print $2 }')"
  if [[ "$self" == "in a GPU Operator driver upgrade"* ]]; then
    defer "$self: the GPU Operator has it now"
  elif [[ -z "$self" || "$self" == "claimed by another drain" ]]; then    # its own killed run's claim
    # In service: claim room first, then count; of two drains that count at once, the later sees both.
    "${kc[@]}" annotate node "$HOST" --overwrite @CLAIM@="$(date +%s)" >/dev/null
    out="$(pool_out | awk -F'\t' -v h="$HOST" '$1 != h')"
    n="$(printf '%s\n' "$out" | grep -c . || true)"
    if (( n + 1 > @ROOM@ )); then
      defer "$n of pool @POOL@'s hosts are out of service already ($(printf '%s\n' "$out" | sed -n 1,5p | awk -F'\t' '{ printf "%s%s: %s", (NR > 1 ? "; " : ""), $1, $2 }')) and max_unavailable allows @ROOM@"
    fi
  fi      # a host out of service already takes no room
fi
# A pod still there STUCK_S after its grace period ended has had its containers killed: what keeps it is a
# finalizer (a Job's tracking one, while Kueue holds the Job suspended: its workload evicted, with no node to
# replace this one), not work; the roll step checks on the host that nothing runs.
drain_flags=(--skip-wait-for-delete-timeout=@STUCK_S@)
stuck="$HOST stays cordoned and tainted @TAINT@=failed. Let its pods finish or move them (a running one: a PodDisruptionBudget that allows no eviction, or a pod no controller owns; a terminating one: what its finalizer waits for), then run pulumi up again, which drains it again and goes on. To put it back to work meanwhile: kubectl taint node $HOST @TAINT@- && kubectl uncordon $HOST"
"""

# Taking a Node out, once its caller has ended where the host has no Node: it reads roll (the annotation's value), value (the taint's), failed (the taint's when the
# drain does not finish), why, stuck (what the error says then), drain_flags (more of kubectl drain's) and
# give_up (what is done with the error).
TAKE_OUT = r"""
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
  if [[ -n "${slurm_reason:-}" ]]; then      # read by Slinky when it drains the Slurm node
    "${kc[@]}" annotate node "$HOST" --overwrite @SLURM_REASON@="$slurm_reason" >/dev/null
  fi
  "${kc[@]}" cordon "$HOST" >/dev/null
  changed "cordoned"
fi
if [[ "${slurm:-false}" == true ]]; then slurm_drained; fi
note "draining (PodDisruptionBudgets honoured, at most @TIMEOUT@s) to $why"
if ! drained="$("${kc[@]}" drain "$HOST" --ignore-daemonsets --delete-emptydir-data --timeout=@TIMEOUT@s "${drain_flags[@]}" 2>&1)"; then
  "${kc[@]}" taint node "$HOST" --overwrite "@TAINT@=$failed:NoSchedule" >/dev/null || true
  # What held it, pod by pod (DaemonSets' aside): still running (its eviction refused: a PodDisruptionBudget, a
  # pod no controller owns), or terminating past its grace period, kept by a finalizer.
  held="$("${kc[@]}" get pods -A --field-selector "spec.nodeName=$HOST" -o jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name}{"\t"}{.metadata.ownerReferences[0].kind}{"\t"}{.metadata.deletionTimestamp}{"\t"}{.metadata.finalizers}{"\n"}{end}' 2>/dev/null \
    | awk -F'\t' '$1 != "" && $2 != "DaemonSet" { printf "%s%s (%s)", sep, $1, ($3 == "" ? "running" : "terminating since " $3 ($4 == "" ? "" : ", kept by finalizers " $4)); sep = "; " }' || true)"
  give_up "the drain did not finish: $(printf '%s\n' "$drained" | grep -iE 'error|cannot|timed out' | sed -n 1,3p | tr '\n' ' ')- still on $HOST: ${held:-nothing it could list}. $stuck"
fi
# kubectl prints a pod again each time it retries its eviction: count each pod once
changed "drained: $(printf '%s\n' "$drained" | sed -n 's/^evicting pod //p' | sort -u | grep -c . || true) pod(s) evicted"
"""

_UNCORDON = r"""
before="$(node_field '{.metadata.annotations.gpucluster\.io/rollout-cordoned-before}')"
if [[ -z "$before" ]]; then
  if [[ -n "${GPUCLUSTER_ROLL_FAILED:-}" ]]; then
    # not drained (taken as rolled, or deferred) and the host still owes what stops work: the next apply drains it
    why="$(one_line "$GPUCLUSTER_ROLL_FAILED")"
    "${kc[@]}" annotate node "$HOST" --overwrite @PENDING@="deferred: not drained, and the roll found: $why" >/dev/null
    note @DEFERRED@": not drained, and the roll found: $why"
    finish
    exit 0
  fi
  note "not taken out by a rollout: left as it is"
  finish
  exit 0
fi
taints="$(node_field "$TAINTS")"
if has_taint "$taints" "@TAINT@=failed"; then
  note "its rollout failed: it stays out of service until a pulumi up rolls it"
  finish
  exit 0
fi
if [[ -n "${GPUCLUSTER_ROLL_FAILED:-}" ]]; then give_up "the roll failed: $GPUCLUSTER_ROLL_FAILED"; fi
if has_taint "$taints" @TAINT@; then
  "${kc[@]}" taint node "$HOST" @TAINT@- >/dev/null
  changed "removed the taint @TAINT@"
fi
unschedulable="$(node_field '{.spec.unschedulable}')"
if [[ "$before" != true && "$unschedulable" == true ]]; then
  "${kc[@]}" uncordon "$HOST" >/dev/null
  changed "uncordoned"
fi
# Slurm's drain reason, where the drain gave it (not one a person gave)
slurm_reason="$(node_field @SLURM_REASON_PATH@)"
unmark=()
if [[ "$slurm_reason" == "$SLURM_REASON_PREFIX"* ]]; then unmark=(@SLURM_REASON@-); fi
# Unmarked last: a run killed before this does the steps above again, which change nothing twice.
"${kc[@]}" annotate node "$HOST" --overwrite @ROLLED@="${GPUCLUSTER_ROLL:-}" @ANNOTATION@- @CORDONED_BEFORE@- \
  @PENDING@- @CLAIM@- "${unmark[@]}" >/dev/null
if [[ "$before" == true ]]; then changed "rollout done (it stays cordoned, as it was before)"
else changed "rollout done: back in service"; fi
"""

# The pool's last step: what the rollout left undone, by host; the apply fails while there is any.
_REPORT = r"""
pending="$("${kc[@]}" get nodes -l @POOL_LABEL@=@POOL@ -o 'jsonpath={range .items[*]}{.metadata.name}{"\t"}{.metadata.annotations.gpucluster\.io/rollout-pending}{"\n"}{end}' 2>&1)" \
  || fail "kubectl cannot list pool @POOL@'s nodes: $pending"
undone="$(printf '%s\n' "$pending" | awk -F'\t' '$2 != "" { print }')"
if [[ -n "$undone" ]]; then
  failed="$(printf '%s\n' "$undone" | awk -F'\t' '$2 ~ /^failed/ { n++ } END { print n + 0 }')"
  deferred="$(printf '%s\n' "$undone" | awk -F'\t' '$2 ~ /^deferred/ { n++ } END { print n + 0 }')"
  printf '%s\n' "$undone" | sed 's/\t/: /; s/^/  /' >&2
  fail "pool @POOL@'s rollout is not done: $failed host(s) failed, out of service (cordoned, tainted @TAINT@=failed) until their cause is fixed, and $deferred deferred for want of room under max_unavailable (listed above). The other hosts rolled. Run pulumi up again: it tries just these"
fi
note "pool @POOL@: every host rolled or owed nothing"
"""


class RolloutScripts(NamedTuple):
    drain: str
    uncordon: str


def _names(pool: NodePool) -> dict[str, object]:
    own = sorted({t.key for t in pool.all_taints})
    return {"ANNOTATION": ROLLOUT_ANNOTATION, "CORDONED_BEFORE": CORDONED_BEFORE_ANNOTATION, "TAINT": ROLLOUT_TAINT,
            "CLAIM": CLAIM_ANNOTATION, "PENDING": PENDING_ANNOTATION, "ROLLED": ROLLED_ANNOTATION,
            "POOL": pool.name, "POOL_LABEL": POOL_LABEL, "CLAIM_STALE_S": CLAIM_STALE_S,
            "OUT_TAINTS": " ".join([ROLLOUT_TAINT, *OUT_OF_SERVICE_TAINTS]), "OWN_TAINTS": " ".join(own) or "-",
            "UPGRADE_ACTIVE": " ".join(UPGRADE_ACTIVE), "FAILURE_BUDGET": pool.rollout.failure_budget_hosts,
            "FAILED": FAILED, "SLURM_REASON": SLURM_REASON_ANNOTATION,
            "SLURM_REASON_PATH": jsonpath_annotation(SLURM_REASON_ANNOTATION)}


def render_rollout(pool: NodePool, host: Host, *, slurm: bool = False) -> RolloutScripts:
    """The host's drain and uncordon scripts, run by bash where pulumi runs. `slurm`: Slinky runs a slurmd on
    the pool's nodes; the drain gives Slurm the rollout as its drain reason. They read GPUCLUSTER_OWED (the
    restarts owed, `owed_restarts`), GPUCLUSTER_ROLL (which preparation they roll), GPUCLUSTER_ROLL_FAILED (the
    uncordon: `roll_failure`), GPUCLUSTER_PENDING (the drain: the Node's pending mark as the apply read it, only
    so that the step runs again), GPUCLUSTER_CLUSTER (the stack's cluster), GPUCLUSTER_CONTEXT (optional) and the
    kubeconfig on standard input (optional)."""
    names = _names(pool)
    title = f"({pool.name}'s rollout, run by pulumi with kubectl)"
    pool_view = fill(_POOL, **{k: names[k] for k in ("POOL", "POOL_LABEL", "CLAIM_STALE_S", "OUT_TAINTS",
                                                     "OWN_TAINTS", "UPGRADE_ACTIVE", "TAINT", "PENDING",
                                                     "FAILURE_BUDGET", "FAILED")})
    drain = fill(_DRAIN + TAKE_OUT, TIMEOUT=pool.rollout.drain_timeout_s, STUCK_S=STUCK_DELETION_S,
                 ROOM=pool.rollout.batch_size(len(pool.hosts)), DEFERRED=DEFERRED, SLURM=str(slurm).lower(),
                 SLURM_POD_LABEL=SLURM_POD_LABEL,
                 ROLLED_PATH=jsonpath_annotation(ROLLED_ANNOTATION), PENDING_PATH=jsonpath_annotation(PENDING_ANNOTATION),
                 **{k: names[k] for k in ("ANNOTATION", "CORDONED_BEFORE", "TAINT", "CLAIM", "PENDING", "POOL",
                                          "ROLLED", "SLURM_REASON")})
    uncordon = fill(_UNCORDON, DEFERRED=DEFERRED, **{k: names[k] for k in (
        "ANNOTATION", "CORDONED_BEFORE", "TAINT", "CLAIM", "PENDING", "ROLLED", "SLURM_REASON",
        "SLURM_REASON_PATH")})
    return RolloutScripts(script(f"Drain {host.hostname} {title}", host.hostname, KUBECTL + pool_view + drain,
                                 shared=True),
                          script(f"Give {host.hostname} back to work {title}", host.hostname,
                                 KUBECTL + pool_view + uncordon, shared=True))


def render_rollout_report(pool: NodePool) -> str:
    """The pool's last rollout step (`<pool>-rollout`): the hosts left deferred or failed, by name and why."""
    return script(f"What {pool.name}'s rollout left undone (run by pulumi with kubectl)", pool.name,
                  KUBECTL + fill(_REPORT, POOL=pool.name, POOL_LABEL=POOL_LABEL, TAINT=ROLLOUT_TAINT))
