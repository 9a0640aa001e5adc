"""Day 2 of tenants isolated on the fabric: a Node whose ports move to another partition (InfiniBand,
fabric/partitions.py: the subnet managers change its P_Key index 0) or VLAN (RoCE, fabric/vlans.py: the leaves
move its ports) is drained before the fabric steps and given back after, so no job runs on it across the
change. Run by pulumi with kubectl, like the rollout's steps.

Where isolation ends (turned off, or its last isolated pool gone), the steps go, and pulumi deletes them last,
dependents first: so the reopen step's delete drains every Node in a tenant's fence, the fence steps' deletes put
the ports back in the shared partitions or VLAN, and the handover's delete gives the Nodes back."""

from __future__ import annotations

from typing import NamedTuple

from ..bash import script
from ..spec import ClusterSpec
from .rollout import KUBECTL

PARTITION_MARK = "gpucluster.io/partition"           # on a Node: whose partition or VLAN its ports are in (or shared)
HANDOVER_MARK = "gpucluster.io/partition-handover"  # on a Node the handover cordoned: from->to, until reopened

# list_marked: every Node as NAME|PARTITION MARK|HANDOVER MARK per line, in $marked
_LIST_MARKED = r'''
list_marked() {
  marked="$("${kc[@]}" get nodes -o 'jsonpath={range .items[*]}{.metadata.name}|{.metadata.annotations.@PARTITION_JSON@}|{.metadata.annotations.@HANDOVER_JSON@}{"\n"}{end}' 2>&1)" \
    || fail "kubectl cannot list the nodes: $marked"
}
'''
_HAND_OVER = _LIST_MARKED + r'''
# hand_over HOST FROM TO TIMEOUT_S ABOUT PORTS: the Node marked FROM->TO, cordoned and drained; a drain that does
# not end in time fails the step: "node HOST[ABOUT] did not drain ... before its ports PORTS".
hand_over() {
  local out
  "${kc[@]}" annotate node "$1" --overwrite "@HANDOVER@=$2->$3" >/dev/null
  "${kc[@]}" cordon "$1" >/dev/null
  if ! out="$("${kc[@]}" drain "$1" --ignore-daemonsets --delete-emptydir-data --timeout="$4s" 2>&1)"; then
    fail "node $1$5 did not drain within $4s before its ports $6: $(printf '%s\n' "$out" | tail -n 2 | tr '\n' ' ')(it stays cordoned; its @FENCE@ is unchanged)"
  fi
}
'''
# Before the partitions or VLANs change, where pulumi runs (kubectl): each Node whose ports move to another one
# (GPUCLUSTER_PARTITIONS: "HOST OWNER DRAIN_TIMEOUT_S" per host; OWNER a tenant or `shared`; a Node without
# the mark was shared) is cordoned, marked and drained, so no job runs on it when its ports change. A drain that
# does not finish fails the step: nothing changes on the fabric, and the Node stays cordoned.
_HANDOVER = r'''
while read -r host owner timeout; do
  [[ -n "$host" ]] || continue
  found="$("${kc[@]}" get node "$host" --ignore-not-found -o 'jsonpath={.metadata.name}|{.metadata.annotations.@PARTITION_JSON@}' 2>&1)" \
    || fail "kubectl cannot read node $host: $found"
  [[ -n "$found" ]] || continue                      # not registered yet: nothing runs there
  now=${found#*|}
  now=${now:-shared}
  if [[ "$now" == "$owner" ]]; then continue; fi
  hand_over "$host" "$now" "$owner" "$timeout" "" "move from $now's @FENCE@ to $owner's"
  changed "drained $host: its ports move from $now's @FENCE@ to $owner's"
done <<<"${GPUCLUSTER_PARTITIONS:-}"
# A Node in a tenant's fence that no line names is leaving (its host, pool or tenant is gone from the spec): its
# ports leave the fence in this run, before the host's own retirement at the run's end, so it is drained now
# (within GPUCLUSTER_LEAVING_DRAIN_S, the plan's longest bound), marked `leaving` and left cordoned.
listed=" $(cut -d' ' -f1 <<<"${GPUCLUSTER_PARTITIONS:-}" | tr '\n' ' ') "
list_marked
while IFS='|' read -r host now _; do
  [[ -n "$host" && -n "$now" && "$now" != shared && "$now" != leaving && "$listed" != *" $host "* ]] || continue
  hand_over "$host" "$now" leaving "${GPUCLUSTER_LEAVING_DRAIN_S:-3600}" ", which leaves the cluster," \
    "leave $now's @FENCE@"
  "${kc[@]}" annotate node "$host" --overwrite "@PARTITION@=leaving" >/dev/null
  changed "drained $host: it leaves the cluster, and its ports leave $now's @FENCE@"
done <<<"$marked"
'''

# Isolation ends (the reopen step's delete, before the fence steps' deletes): each Node in a tenant's fence is
# drained, within its line's bound in GPUCLUSTER_PARTITIONS (as the steps last ran) or GPUCLUSTER_LEAVING_DRAIN_S.
_RELEASE = r'''
list_marked
while IFS='|' read -r host now _; do
  [[ -n "$host" && -n "$now" && "$now" != shared && "$now" != leaving ]] || continue
  timeout=${GPUCLUSTER_LEAVING_DRAIN_S:-3600}
  while read -r named _ bound; do if [[ "$named" == "$host" ]]; then timeout=$bound; fi; done <<<"${GPUCLUSTER_PARTITIONS:-}"
  hand_over "$host" "$now" shared "$timeout" "" \
    "leave $now's @FENCE@ (tenants are no longer isolated)"
  changed "drained $host: its ports leave $now's @FENCE@ for the shared one, as tenants are no longer isolated"
done <<<"$marked"
'''

_HAND_BACK = r'''
# hand_back HOST OWNER HANDED: the Node marked with its ports' OWNER, and opened again where the handover cordoned
# it (HANDED: its handover mark)
hand_back() {
  "${kc[@]}" annotate node "$1" --overwrite "@PARTITION@=$2" >/dev/null
  if [[ -n "$3" ]]; then
    "${kc[@]}" uncordon "$1" >/dev/null
    "${kc[@]}" annotate node "$1" "@HANDOVER@-" >/dev/null
    changed "reopened $1: its ports are in $2's @FENCE@"
  fi
}
'''
# After every subnet manager's partitions step or switch's VLAN step: each Node is marked with its ports' owner,
# and one the handover cordoned is opened again.
_REOPEN = r'''
while read -r host owner _; do
  [[ -n "$host" ]] || continue
  found="$("${kc[@]}" get node "$host" --ignore-not-found -o 'jsonpath={.metadata.name}|{.metadata.annotations.@HANDOVER_JSON@}' 2>&1)" \
    || fail "kubectl cannot read node $host: $found"
  [[ -n "$found" ]] || continue
  hand_back "$host" "$owner" "${found#*|}"
done <<<"${GPUCLUSTER_PARTITIONS:-}"
'''

# Isolation ended (the handover step's delete, after the fence steps' deletes): each Node in a tenant's fence or
# cordoned by a handover is marked shared and opened again; a leaving one stays as it is.
_RELEASED = r'''
list_marked
while IFS='|' read -r host now handed; do
  [[ -n "$host" && "$now" != leaving && ( -n "$handed" || ( -n "$now" && "$now" != shared ) ) ]] || continue
  hand_back "$host" shared "$handed"
done <<<"$marked"
'''


class Handover(NamedTuple):
    """The kubectl steps around a partition or VLAN change, and what their deletes run where isolation ends."""

    drain: str      # before the fence steps: the Nodes whose ports move drained
    reopen: str     # after them: the Nodes marked with their ports' owner, the drained ones given back
    release: str    # the reopen step's delete: every Node in a tenant's fence drained
    released: str   # the handover step's delete: those Nodes marked shared and given back


def owners(spec: ClusterSpec) -> str:
    """GPUCLUSTER_PARTITIONS: per host, its partition's owner (tenant or `shared`) and drain bound. Every host,
    RDMA or not: a Node in a tenant's fence that no line names is taken to be leaving the cluster."""
    isolated = spec.isolated_pools
    return "\n".join(f"{h.hostname} {isolated.get(p.name, 'shared')} {p.rollout.drain_timeout_s}"
                     for p, h in spec.hosts())


def leaving_drain_s(spec: ClusterSpec) -> int:
    """GPUCLUSTER_LEAVING_DRAIN_S: the bound for a leaving Node, whose own pool's is gone with it."""
    return max(p.rollout.drain_timeout_s for p in spec.node_pools)


def _json_key(key: str) -> str:
    return key.replace(".", "\\.")          # a jsonpath key with dots, escaped


def fence_of(spec: ClusterSpec) -> str:
    """What moves a tenant's ports: an InfiniBand partition, a RoCE VLAN."""
    return "partition" if spec.fabric.kind == "infiniband" else "VLAN"


def render_handover(spec: ClusterSpec) -> Handover:
    """The kubectl steps around a partition or VLAN change, and their deletes."""
    fence = fence_of(spec)
    marks = {"PARTITION_JSON": _json_key(PARTITION_MARK), "HANDOVER_JSON": _json_key(HANDOVER_MARK),
             "PARTITION": PARTITION_MARK, "HANDOVER": HANDOVER_MARK, "FENCE": fence}

    def filled(text: str) -> str:
        for k, v in marks.items():
            text = text.replace(f"@{k}@", v)
        return text
    return Handover(
        script(f"Drain the nodes whose ports change {fence} (run by pulumi with kubectl)", spec.name,
               KUBECTL + filled(_HAND_OVER + _HANDOVER)),
        script(f"Mark and reopen the nodes after their {fence} changed (run by pulumi with kubectl)", spec.name,
               KUBECTL + filled(_HAND_BACK + _REOPEN)),
        script(f"Tenants are no longer isolated: drain the nodes in a tenant's {fence} (run by pulumi with kubectl)",
               spec.name, KUBECTL + filled(_HAND_OVER + _RELEASE)),
        script(f"Tenants are no longer isolated: reopen the nodes in the shared {fence} (run by pulumi with kubectl)",
               spec.name, KUBECTL + filled(_LIST_MARKED + _HAND_BACK + _RELEASED)))
