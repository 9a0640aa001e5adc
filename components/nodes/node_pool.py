"""GpuNodePool: bare-metal GPU hosts made into healthy, schedulable Kubernetes GPU nodes.

Per host, keyed by hostname (adding a host changes nothing for the others), these resources:
`<name>-<host>-scripts`, a copy of the pool's shared script parts (ssh.Lib: the preparation, roll and burn-in
are one text for all its hosts, which the state then holds once per host as a path and a hash, not as text),
`<name>-<host>-prepare` over SSH (the host's fabric settings, when given, then its preparation, in one session),
`<name>-<host>-burn-in` over SSH, and `<name>-<host>-node`, a NodePatch of the existing Node (patched, not
owned) whose taints follow the burn-in: new nodes register with the burn-in taint (kubelet's
registerWithTaints, set by the preparation), and the patch sets the pool's taints, plus a quarantine taint if the
burn-in failed. The taint list is atomic under server-side apply (whoever applies it owns all of it), so the
patch carries the node's live taints of every key the library does not manage, read (`<name>-<host>-live`) after
the burn-in, right before the patch: a person's or a health operator's taint survives a re-apply.
Then the pool's rollout (rollout.py): per host `<name>-<host>-drain`, `-roll` and `-uncordon`, batch after
batch, which pay the kubelet and containerd restarts and driver installs preparation left owed on hosts where
work runs. And what
retires a host removed from the spec (retire.py): `<name>-<host>-deregister` and `-leave` before its preparation,
`-retire` after its rollout, each acting when it is deleted.
"""

from __future__ import annotations

import hashlib
from typing import Any, ClassVar, Collection, Mapping, NamedTuple, Sequence

import pulumi
import pulumi_kubernetes as k8s
from pulumi_command import local, remote
from pydantic import Field

from ..k8s.labels import BLOCK_LABEL, BURN_IN_TAINT, FILESYSTEM_CLIENT_LABEL, LEAF_LABEL, RACK_LABEL, pool_labels
from ..spec import ClusterSpec, Host, NodePool
from ..spec.common import SpecModel
from ..spec.hardware import SshSettings
from ..spec.xids import DEFAULT_FAULT_XIDS
from ..spec.topology import network_places
from ..bash import in_sequence
from ..ssh import Lib, Script, SshTarget, digest, push, ship
from ..storage.clients import RolledFilesystem
from ..types import token, with_aliases
from .burn_in import burn_in_identity, parse_result, render_burn_in
from .host_prep import PoolPrep, render_pool_prep
from .retire import render_retirement, undo_guard
from .rollout import (PENDING_ANNOTATION, drain_outcome, owed_restarts, render_rollout, render_rollout_report,
                      roll_failure, rollout_batches)

BURN_IN_ANNOTATION = "gpucluster.io/burn-in"
# The taint keys the last apply managed, so a key dropped from the spec is removed, not kept as someone else's.
MANAGED_TAINTS_ANNOTATION = "gpucluster.io/managed-taints"


class NodePoolArgs(SpecModel):
    pool: NodePool
    ssh: SshSettings = Field(default_factory=SshSettings, description="Omitted: root on port 22, no bastion.")
    rdma: bool = Field(False, description="The fabric has RDMA. Omitted: no.")
    gpudirect: bool = Field(False, description="GPUs and NICs use GPUDirect RDMA. Omitted: no.")
    blocks: dict[str, str] = Field(default_factory=dict, description="Rack -> network block. Omitted: none.")
    leaves: dict[str, str] = Field(default_factory=dict,
                                   description="Host -> leaf switch of its first rail. Omitted: the host's rack.")
    host_driver: bool = Field(True, description="The NVIDIA driver is installed on the hosts; false: the GPU "
                                                "Operator installs it. Omitted: on the hosts.")
    system_namespaces: list[str] = Field(
        default_factory=lambda: ["kube-system"],
        description="Namespaces of node agents, whose pods do not stop a kubelet restart. Omitted: kube-system.")
    slurm: bool = Field(False, description="Slinky runs Slurm on the pool (kubernetes.slurm.pools): the rollout's "
                                           "drain gives Slinky its reason and evicts nothing before Slurm has "
                                           "drained the node of its jobs. Omitted: no.")
    fault_xids: list[int] = Field(
        default_factory=lambda: list(DEFAULT_FAULT_XIDS),
        description="XIDs since boot that stop a host's preparation and roll: the cluster's health monitor's "
                    "(kubernetes.health.fault_xids), so that a host it keeps in service is never refused. "
                    "Omitted: every XID NVIDIA's catalog resolves by a reset, a reboot or a diagnosis.")
    filesystem: RolledFilesystem | None = Field(
        None, description="A site's WEKA or Scale cluster whose client the roll restarts after a driver change and "
                          "whose mount it checks before the node takes work. Omitted: none.")

    @classmethod
    def from_spec(cls, spec: ClusterSpec, pool: NodePool) -> NodePoolArgs:
        blocks, all_leaves = network_places(spec)
        leaves = {h.hostname: all_leaves[h.hostname] for h in pool.hosts if h.hostname in all_leaves}
        gpu_operator = spec.kubernetes.gpu_operator
        return cls(pool=pool, ssh=spec.ssh, rdma=spec.fabric.rdma, gpudirect=spec.fabric.effective_gpudirect,
                   blocks=blocks, leaves=leaves,
                   host_driver=not (gpu_operator.enabled and gpu_operator.driver_managed),
                   system_namespaces=sorted(spec.agent_namespaces),
                   fault_xids=sorted(set(spec.kubernetes.health.fault_xids)),
                   slurm=pool.name in spec.kubernetes.slurm.pools, filesystem=RolledFilesystem.of(spec))

    def target(self, host: Host) -> SshTarget:
        return SshTarget(host=host.address, user=host.ssh_user or self.ssh.user, port=host.ssh_port or self.ssh.port,
                         host_key=host.host_key, bastion=self.ssh.bastion)


def render_pool_preparation(args: NodePoolArgs) -> PoolPrep:
    return render_pool_prep(args.pool, rdma=args.rdma, gpudirect=args.gpudirect, host_driver=args.host_driver,
                            system_namespaces=args.system_namespaces, fault_xids=args.fault_xids,
                            filesystem=args.filesystem)


def render_preparation(args: NodePoolArgs, host: Host, fabric: Script | None = None,
                       pool_prep: PoolPrep | None = None) -> Script:
    """The host's preparation, after its fabric settings when given (undone in the reverse order).
    `pool_prep`: the pool's, rendered once for all its hosts. Omitted: rendered here."""
    prep = (pool_prep or render_pool_preparation(args)).for_host(host)
    assert isinstance(prep.create, str) and prep.delete
    host_, pool = host.hostname, args.pool.name
    guard = undo_guard(args.pool, host)     # a host another pool took over keeps what that pool set
    if fabric is None:
        return Script(prep.create, in_sequence(f"{host_} ({pool}): undo its preparation", [prep.delete],
                                               guard=guard))
    assert isinstance(fabric.create, str) and fabric.delete
    return Script(in_sequence(f"{host_} ({pool}): its fabric settings, then its preparation",
                              [fabric.create, prep.create]),
                  in_sequence(f"{host_} ({pool}): undo its preparation, then its fabric settings",
                              [prep.delete, fabric.delete], guard=guard))


def pool_lib(args: NodePoolArgs, samples: Sequence[Host], fabric: Mapping[str, Script], pool_prep: PoolPrep,
             also_ship: Sequence[str] = ()) -> Lib:
    """The pool's shared parts, as these hosts' scripts hold them: those run over SSH (deletes included, and
    `also_ship`, another component's) are shipped, the rollout's local steps read theirs where pulumi runs."""
    over_ssh: list[str | pulumi.Output[str]] = list(also_ship)
    here: list[str] = []
    for host in samples:
        prepare = render_preparation(args, host, fabric.get(host.hostname), pool_prep)
        membership = render_retirement(args.pool, host, args.system_namespaces).membership
        over_ssh += [prepare.create, prepare.delete, pool_prep.roll_for_host(host, digest(prepare)).create,
                     membership.create, membership.delete]
        if args.pool.burn_in.enabled:
            over_ssh.append(render_burn_in(args.pool, host, args.system_namespaces).create)
        here += render_rollout(args.pool, host, slurm=args.slurm)
    return Lib([t for t in over_ssh if isinstance(t, str)], here)


def node_labels(args: NodePoolArgs, host: Host) -> dict[str, str]:
    labels = {**pool_labels(args.pool), RACK_LABEL: host.rack, LEAF_LABEL: args.leaves.get(host.hostname, host.rack),
              "gpucluster.io/gpu-model": args.pool.gpu.model}
    if args.pool.nics:    # what a job can expect of the node's data-plane network
        labels["gpucluster.io/rails"] = str(len(args.pool.nics))
        labels["gpucluster.io/rail-gbps"] = str(min(n.speed_gbps for n in args.pool.nics))
    if host.rack in args.blocks:
        labels[BLOCK_LABEL] = args.blocks[host.rack]
    if args.filesystem is not None:
        labels[FILESYSTEM_CLIENT_LABEL] = args.filesystem.kind
    return labels


def managed_taint_keys(pool: NodePool) -> list[str]:
    return sorted({t.key for t in pool.all_taints} | {BURN_IN_TAINT})


def node_taints(pool: NodePool, verdict: tuple[bool, str] | None, live: Sequence[Mapping[str, str]] = (),
                managed_before: Collection[str] = ()) -> list[dict[str, str]]:
    """The whole taint list: the live taints of keys the library does not manage (a person's, a health
    operator's, the node controller's not-ready or unschedulable), as they are, then the pool's, plus quarantine
    when the burn-in did not pass. `managed_before`: the keys an earlier apply managed (the node's annotation)."""
    ours = {*managed_taint_keys(pool), *managed_before}
    taints = [dict(t) for t in live if t.get("key") not in ours]
    taints += [{"key": t.key, "value": t.value, "effect": t.effect} for t in pool.all_taints]
    if verdict is not None and not verdict[0]:
        taints.append({"key": BURN_IN_TAINT, "value": "failed", "effect": "NoSchedule"})
    return taints


def live_taints(node_spec: Any) -> list[dict[str, str]]:
    """The taints of a Node as read, in the API's shape: typed outputs from the engine, or plain dicts keyed by
    Python names once Output.all has been through them (or by API names, elsewhere)."""
    def field(obj: Any, name: str, api_name: str) -> Any:
        return obj.get(api_name, obj.get(name)) if type(obj) is dict else getattr(obj, name, None)
    out = []
    for t in (field(node_spec, "taints", "taints") if node_spec else None) or []:
        taint = {"key": field(t, "key", "key"), "effect": field(t, "effect", "effect")}
        for name, api_name in (("value", "value"), ("time_added", "timeAdded")):
            if field(t, name, api_name):
                taint[api_name] = field(t, name, api_name)
        out.append(taint)
    return out


def annotation(metadata: Any, key: str) -> str:
    """An annotation of a Node as read ("" when absent): typed outputs from the engine, or plain dicts."""
    annotations = (metadata.get("annotations") if type(metadata) is dict else getattr(metadata, "annotations", None)
                   ) if metadata else None
    return (annotations or {}).get(key) or ""


def managed_before(metadata: Any) -> list[str]:
    return [k for k in annotation(metadata, MANAGED_TAINTS_ANNOTATION).split(",") if k]


def render_node_patch(args: NodePoolArgs, host: Host, verdict: tuple[bool, str] | None,
                      live: Sequence[Mapping[str, str]] = (), managed: Collection[str] = ()) -> dict[str, Any]:
    """The Node patch; `verdict` is the burn-in result, None when the pool skips burn-in. `live`, `managed`: the
    node's taints and managed keys as read before the patch. Omitted: a node with no taints of others."""
    annotations = {"pulumi.com/patchForce": "true",   # take over the taints kubelet registered
                   MANAGED_TAINTS_ANNOTATION: ",".join(managed_taint_keys(args.pool))}
    if verdict is not None:
        annotations[BURN_IN_ANNOTATION] = verdict[1][:1000]
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": host.hostname, "labels": node_labels(args, host), "annotations": annotations},
            "spec": {"taints": node_taints(args.pool, verdict, live, managed)}}


class GpuNodePool(pulumi.ComponentResource):
    TYPE: ClassVar[str] = token("GpuNodePool")

    burn_in: dict[str, pulumi.Output[str]]
    """Burn-in verdict per host ("passed" or "failed: why"); "skipped" when the pool has no burn-in."""
    prepared: dict[str, pulumi.Resource]
    """Each host's preparation (with its fabric settings), by hostname: what needs a prepared host waits on."""
    subnet_managers: list[pulumi.Resource]
    """The preparations of the pool's subnet-manager hosts (other pools' hosts wait for them)."""
    kube: Kube
    """How its kubectl steps reach the stack's cluster (the fabric's partitions handover uses the same)."""
    lib: Lib
    """The shared script parts each host's `-scripts` copy puts there before its preparation."""

    def __init__(self, name: str, args: NodePoolArgs, ssh_private_key: pulumi.Input[str],
                 opts: pulumi.ResourceOptions | None = None, *,
                 host_ready: Mapping[str, Sequence[pulumi.Input[pulumi.Resource]]] | None = None,
                 fabric: Mapping[str, Script] | None = None, after: Sequence[pulumi.Resource] = (),
                 subnet_managers: Collection[str] = (), kubeconfig: pulumi.Input[str] | None = None,
                 kube_context: str | None = None, also_ship: Sequence[str] = ()):
        """`host_ready`: per host name, what must be done before its Node is opened to work. `fabric`: per host
        name, its fabric script (Fabric.host_scripts), run first in its preparation's session. `after`: what
        every preparation waits for (subnet managers set up elsewhere). `subnet_managers`: host names whose
        preparation starts a subnet manager: prepared first, and the pool's other hosts wait for them.
        `kubeconfig` (a secret: the content or a path, as the Kubernetes provider takes it) and `kube_context`:
        how kubectl, where pulumi runs, reaches the cluster to drain and uncordon nodes; give what the
        Kubernetes provider is given. Omitted: no fabric settings, nothing to wait for, kubectl's own
        configuration (KUBECONFIG or ~/.kube/config). `also_ship`: scripts another component runs on this
        pool's hosts after their preparation (one host's filesystem client): the `-scripts` copy carries their
        shared parts too, and that component runs them from there with `lib`. Omitted: the pool's own parts."""
        super().__init__(self.TYPE, name, intent(args), with_aliases(self.TYPE, opts))
        compose(self, name, args, ssh_private_key, host_ready=host_ready, fabric=fabric, after=after,
                subnet_managers=subnet_managers, kubeconfig=kubeconfig, kube_context=kube_context,
                also_ship=also_ship)


def intent(args: NodePoolArgs) -> dict[str, Any]:
    """A GpuNodePool's registered inputs: its args, for policies."""
    return {"spec": args.model_dump(mode="json")}


def compose(component: Any, name: str, args: NodePoolArgs, ssh_private_key: pulumi.Input[str], *,
            host_ready: Mapping[str, Sequence[pulumi.Input[pulumi.Resource]]] | None = None,
            fabric: Mapping[str, Script] | None = None, after: Sequence[pulumi.Resource] = (),
            subnet_managers: Collection[str] = (), kubeconfig: pulumi.Input[str] | None = None,
            kube_context: str | None = None, also_ship: Sequence[str] = ()) -> None:
    """A GpuNodePool's children and outputs, under `component`: a GpuNodePool, or the component provider's
    (provider.py)."""
    pool = args.pool
    fabric = fabric or {}
    pool_prep = render_pool_preparation(args)
    component.burn_in, component.prepared, component.subnet_managers = {}, {}, []
    rolls: dict[str, tuple[remote.Command, str, pulumi.Resource, k8s.core.v1.Node]] = {}
    retire_scripts: dict[str, str] = {}
    # kubectl acts only on the cluster the Kubernetes provider reaches: its kube-system namespace's uid, read
    # through the provider on every apply, is what each kubectl step checks before it acts.
    cluster = k8s.core.v1.Namespace.get(f"{name}-cluster", "kube-system", opts=pulumi.ResourceOptions(parent=component))
    kube = component.kube = Kube(kubeconfig, kube_context, cluster.metadata.apply(lambda m: (m.uid if m else None) or ""))
    hosts = sorted(pool.hosts, key=lambda h: h.hostname not in subnet_managers)
    # The pool's shared parts, as its first host's scripts hold them and, where that one runs a subnet manager
    # (whose fabric part is its own), its first other host's: every other host's are the same text (a part
    # that is not stays inline; a file is found by its hash).
    firsts = {h.hostname: h for h in hosts[:1] + [h for h in hosts if h.hostname not in subnet_managers][:1]}
    lib = component.lib = pool_lib(args, list(firsts.values()), fabric, pool_prep, also_ship)
    lib.write()                 # once, before any copy registers and the engine hashes its folder
    for host in hosts:
        key = f"{name}-{host.hostname}"
        target = args.target(host)
        manager = host.hostname in subnet_managers
        retire = render_retirement(pool, host, args.system_namespaces)
        retire_scripts[host.hostname] = retire.retire
        # First created, last deleted: a host that leaves the spec loses its Node after everything else.
        deregister = kubectl_step(component, kube, f"{key}-deregister", None, retire.deregister, [])
        shipped = ship(f"{key}-scripts", target, lib, ssh_private_key, parent=component, depends_on=[deregister])
        leave = push(f"{key}-leave", target, retire.membership, ssh_private_key, parent=component,
                     converge=True, depends_on=[shipped], lib=lib)
        script = render_preparation(args, host, fabric.get(host.hostname), pool_prep)
        prepare = push(f"{key}-prepare", target, script, ssh_private_key, parent=component, converge=True,
                       depends_on=[leave, *after] if manager else [leave, *after, *component.subnet_managers], lib=lib)
        component.prepared[host.hostname] = prepare
        if manager:
            component.subnet_managers.append(prepare)
        if pool.burn_in.enabled:
            burn = push(f"{key}-burn-in", target, render_burn_in(pool, host, args.system_namespaces),
                        ssh_private_key, parent=component, depends_on=[prepare],
                        replace_on=burn_in_identity(pool, host), lib=lib)
            verdict = burn.stdout.apply(parse_result)
            component.burn_in[host.hostname] = verdict.apply(lambda v: v[1])
            patch_deps: list[pulumi.Resource] = [burn]
        else:
            verdict = pulumi.Output.from_input(None)
            component.burn_in[host.hostname] = pulumi.Output.from_input("skipped")
            patch_deps = [prepare]
        # Name and labels are known at preview; only what the burn-in decides waits for its result. The live
        # node is read when everything before the patch is done, so the taints kept are as fresh as can be.
        deps = [*patch_deps, *(host_ready or {}).get(host.hostname, ())]
        live = k8s.core.v1.Node.get(f"{key}-live", host.hostname,
                                    opts=pulumi.ResourceOptions(parent=component, depends_on=deps))
        static = render_node_patch(args, host, None)
        meta = {**static["metadata"], "annotations": verdict.apply(
            lambda v, h=host: render_node_patch(args, h, v)["metadata"]["annotations"])}
        taints = pulumi.Output.all(verdict, live.spec, live.metadata).apply(
            lambda a: node_taints(pool, a[0], live_taints(a[1]), managed_before(a[2])))
        patch = k8s.core.v1.NodePatch(f"{key}-node", metadata=meta, spec={"taints": taints},
                                      opts=pulumi.ResourceOptions(parent=component, depends_on=[*deps, live]))
        rolls[host.hostname] = (prepare, digest(script), patch, live)
    given: list[local.Command] = []
    uncordons: list[local.Command] = []
    for batch in rollout_batches(pool):
        # A batch waits on one point after the last (`-batch`, named after its first host; no command), not
        # each of its hosts on every host of the last: 2B edges instead of B x B, in the state and in the SDK's
        # cycle check, which walks the graph behind every edge (a 512-node plan took 143 s, now 39).
        gate = [local.Command(f"{name}-{batch[0].hostname}-batch", opts=pulumi.ResourceOptions(
            parent=component, depends_on=given))] if given else []
        given = [_roll(component, kube, f"{name}-{h.hostname}", args, h, pool_prep, *rolls[h.hostname],
                       ssh_private_key, lib, after=gate) for h in batch]
        uncordons += given
        # Last created, first deleted: a host that leaves the spec is drained before anything is undone.
        for h, given_back in zip(batch, given):
            kubectl_step(component, kube, f"{name}-{h.hostname}-retire", None, retire_scripts[h.hostname], [given_back])
    # Runs again whenever a host's uncordon did: what the rollout left undone fails the apply, by name.
    kubectl_step(component, kube, f"{name}-rollout", render_rollout_report(pool), None, uncordons,
             {"GPUCLUSTER_ROUND": pulumi.Output.all(*[u.stdout for u in uncordons]).apply(
                 lambda out: hashlib.sha256("\0".join(o or "" for o in out).encode()).hexdigest())})
    component.register_outputs({**intent(args), "burn_in": component.burn_in, "gpus": pool.gpus,
                                "peak_power_w_per_host": pool.peak_power_w_per_host})


class Kube(NamedTuple):
    """How kubectl reaches the cluster, and which cluster it must be."""
    kubeconfig: pulumi.Input[str] | None
    context: str | None
    cluster: pulumi.Input[str]          # the uid of its kube-system namespace, as the Kubernetes provider reads it


def _roll(component: Any, kube: Kube, key: str, args: NodePoolArgs, host: Host, pool_prep: PoolPrep,
          prepare: remote.Command, prepared: str, patch: pulumi.Resource, live: k8s.core.v1.Node,
          ssh_private_key: pulumi.Input[str], lib: Lib, *, after: Sequence[pulumi.Resource]) -> local.Command:
    """The host's drain, roll and uncordon, after its Node patch and the previous batch; returns the last.
    All three run again whenever the preparation changes (its digest is in each), and whenever the host's
    Node carries a pending mark (a deferral or failure the last apply left); each does nothing where nothing
    is owed. The roll hears the drain's outcome; the uncordon, the roll's failure."""
    env = {"GPUCLUSTER_OWED": prepare.stdout.apply(owed_restarts), "GPUCLUSTER_ROLL": prepared}
    scripts = render_rollout(args.pool, host, slurm=args.slurm)
    pending = live.metadata.apply(lambda m: annotation(m, PENDING_ANNOTATION))
    drain = kubectl_step(component, kube, f"{key}-drain", scripts.drain, None, [patch, *after],
                     {**env, "GPUCLUSTER_PENDING": pending}, previous_output=True, lib=lib)
    roll = push(f"{key}-roll", args.target(host), pool_prep.roll_for_host(host, prepared), ssh_private_key,
                parent=component, converge=True, depends_on=[drain], stdin=drain.stdout.apply(drain_outcome), lib=lib)
    return kubectl_step(component, kube, f"{key}-uncordon", scripts.uncordon, None, [roll],
                    {**env, "GPUCLUSTER_ROLL_FAILED": roll.stdout.apply(roll_failure)}, lib=lib)


def kubectl_step(component: Any, kube: Kube, name: str, create: str | None, delete: str | None,
             deps: Sequence[pulumi.Resource], env: Mapping[str, pulumi.Input[str]] | None = None, *,
             previous_output: bool = False, lib: Lib | None = None) -> local.Command:
    """A step run by bash where pulumi runs, with kubectl reaching the cluster as the pool was told. A
    `create` runs again on every change (an update runs it: it is not stored twice as `update`); a `delete`
    runs with the inputs it was stored with.
    `previous_output`: an update gets its last run's output (PULUMI_COMMAND_STDOUT). `lib`: the pool's shared
    parts, which `create` runs from where the program wrote them (a delete keeps its whole text)."""
    environment = {**(env or {}), "GPUCLUSTER_CLUSTER": kube.cluster,
                   **({"GPUCLUSTER_CONTEXT": kube.context} if kube.context else {})}
    return local.Command(
        name, create=lib.factor(create, None) if lib and create else create, delete=delete, interpreter=["/bin/bash", "-c"],
        environment=environment or None, stdin=None if kube.kubeconfig is None else pulumi.Output.secret(kube.kubeconfig),
        add_previous_output_in_env=previous_output,
        opts=pulumi.ResourceOptions(parent=component, depends_on=list(deps)))
