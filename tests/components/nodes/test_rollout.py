"""The pool's rollout: batches, what preparation owes it, and the order the engine runs the steps in."""

from __future__ import annotations

from pathlib import Path

import pulumi
import pytest

from components.nodes import GpuNodePool, NodePoolArgs
from components.nodes.host_prep import ROLLOUT_OWED
from components.nodes.host_prep import ROLL_BOUNDS_S, render_pool_prep
from components.ssh import unwrap
from components.nodes.rollout import (drain_outcome, owed_restarts, render_rollout, roll_failure, rollout_batches,
                                      rollout_model)
from components.spec import load_spec
from components.spec.hardware import Rollout
from tests.conftest import ssh_key


def pool_of(dev_spec, racks: dict[str, list[str]], **rollout):
    """The dev pool with hosts named per rack (built directly: the batches need no valid cabling or power)."""
    pool = dev_spec.node_pools[0]
    template = pool.hosts[0]
    hosts = [template.model_copy(update={"hostname": name, "rack": rack, "address": f"10.10.0.{10 + i}"})
             for i, (rack, name) in enumerate((r, n) for r, names in racks.items() for n in names)]
    return pool.model_copy(update={"hosts": hosts, "rollout": Rollout(**rollout)})


@pytest.mark.parametrize("max_unavailable, hosts, size", [
    ("10%", 2, 1), ("10%", 10, 1), ("10%", 11, 2), ("25%", 8, 2), ("100%", 5, 5), (3, 2, 2), (1, 64, 1),
    ("1%", 4096, 41)])
def test_a_batch_is_the_count_or_the_percentage_rounded_up_and_never_empty(max_unavailable, hosts, size):
    assert Rollout(max_unavailable=max_unavailable).batch_size(hosts) == size


def test_batches_take_a_rack_at_a_time_then_hostnames_in_order(dev_spec):
    pool = pool_of(dev_spec, {"r02": ["gpu-b", "gpu-a"], "r01": ["gpu-z", "gpu-y", "gpu-x"]}, max_unavailable=2)
    assert [[h.hostname for h in b] for b in rollout_batches(pool)] == [
        ["gpu-x", "gpu-y"], ["gpu-z", "gpu-a"], ["gpu-b"]]


@pytest.mark.parametrize("stdout, owed", [
    (None, ""), ("", ""), ("gpu-1: 0 change(s)\n", ""),
    (f"gpu-1: changed: wrote x\ngpu-1: {ROLLOUT_OWED}kubelet\ngpu-1: 1 change(s)\n", "kubelet"),
    (f"gpu-1: {ROLLOUT_OWED}kubelet containerd\n", "containerd kubelet"),
    (f"gpu-1: {ROLLOUT_OWED}kubelet reboot;rm\n", "kubelet"),          # only the units the roll step pays
    (f"a fabric part: {ROLLOUT_OWED}containerd\ngpu-1: {ROLLOUT_OWED}kubelet\n", "kubelet"),   # the last says
])
def test_the_owed_restarts_are_read_from_the_preparations_output(stdout, owed):
    assert owed_restarts(stdout) == owed


def run_pool(record, dev_spec, pool, kubeconfig=None, kube_context=None):
    """`kubeconfig`: given as a secret, as a stack's `kubernetes:kubeconfig` is (made inside the program)."""
    return record(lambda: GpuNodePool("p", NodePoolArgs(pool=pool, ssh=dev_spec.ssh), ssh_key(),
                                      kubeconfig=None if kubeconfig is None else pulumi.Output.secret(kubeconfig),
                                      kube_context=kube_context))


def by_name(run):
    return {r.name: r for r in run.records}


def test_each_batch_waits_for_the_last_to_be_given_back_through_one_point(record, dev_spec):
    """Each batch's drains wait on one `-batch` point (named after the batch's first host, no command), which
    waits on every uncordon of the batch before: 2B edges between two batches, not B x B."""
    pool = pool_of(dev_spec, {"r01": ["gpu-1", "gpu-2", "gpu-3"], "r02": ["gpu-4", "gpu-5"]}, max_unavailable=2)
    r = by_name(run_pool(record, dev_spec, pool))
    urn = {name: rec.urn for name, rec in r.items()}

    def deps(name):       # the preparation is one too: its output says what is owed
        assert urn[f"{name.rsplit('-', 1)[0]}-prepare"] in r[name].dependencies or name.endswith("-roll")
        # and the cluster's identity, read once for the pool (every kubectl step checks it)
        return set(r[name].dependencies) - {u for u in urn.values() if u.endswith(("-prepare", "p-cluster"))}
    # the live read too: a pending mark on the Node runs the drain again
    assert deps("p-gpu-1-drain") == {urn["p-gpu-1-node"], urn["p-gpu-1-live"]}
    assert deps("p-gpu-2-drain") == {urn["p-gpu-2-node"], urn["p-gpu-2-live"]}
    for h in ("gpu-3", "gpu-4"):
        assert deps(f"p-{h}-drain") == {urn[f"p-{h}-node"], urn[f"p-{h}-live"], urn["p-gpu-3-batch"]}
    assert deps("p-gpu-5-drain") == {urn["p-gpu-5-node"], urn["p-gpu-5-live"], urn["p-gpu-5-batch"]}
    assert set(r["p-gpu-3-batch"].dependencies) == {urn["p-gpu-1-uncordon"], urn["p-gpu-2-uncordon"]}
    assert set(r["p-gpu-5-batch"].dependencies) == {urn["p-gpu-3-uncordon"], urn["p-gpu-4-uncordon"]}
    assert "p-gpu-1-batch" not in r                 # the first batch waits on nothing
    assert all(not r[f"p-gpu-{i}-batch"].inputs.get("create") and not r[f"p-gpu-{i}-batch"].inputs.get("delete")
               for i in (3, 5))
    for h in ("gpu-1", "gpu-5"):
        assert deps(f"p-{h}-roll") == {urn[f"p-{h}-drain"]}
        assert deps(f"p-{h}-uncordon") == {urn[f"p-{h}-roll"]}
    assert set(r["p-rollout"].dependencies) == {urn[f"p-gpu-{i}-uncordon"] for i in range(1, 6)} | {urn["p-cluster"]}


def test_the_kubectl_steps_run_bash_with_the_kubeconfig_kept_secret(record, dev_spec):
    pool = pool_of(dev_spec, {"r01": ["gpu-1"]})
    r = by_name(run_pool(record, dev_spec, pool, kubeconfig="apiVersion: v1\n",
                         kube_context="prod-admin"))
    drain, uncordon = r["p-gpu-1-drain"], r["p-gpu-1-uncordon"]
    for step, script in ((drain, render_rollout(pool, pool.hosts[0]).drain),
                         (uncordon, render_rollout(pool, pool.hosts[0]).uncordon)):
        assert step.type == "command:local:Command"
        assert step.inputs["interpreter"] == ["/bin/bash", "-c"]
        # an update runs `create` again: the script is not stored a second time as `update`
        assert unwrap(step.inputs["create"]) == script           # its shared part run from the file the pool wrote
        assert "update" not in step.inputs and "triggers" not in step.inputs    # an update runs `create` again
        assert pulumi.runtime.rpc.is_rpc_secret(step.inputs["stdin"])
        assert "apiVersion" not in step.inputs["create"]
        env = step.inputs["environment"]
        assert env["GPUCLUSTER_CONTEXT"] == "prod-admin" and len(env["GPUCLUSTER_ROLL"]) == 64
    known = lambda env: {k: v for k, v in env.items() if k in ("GPUCLUSTER_ROLL", "GPUCLUSTER_CONTEXT")}  # noqa: E731
    assert known(drain.inputs["environment"]) == known(uncordon.inputs["environment"])
    assert "GPUCLUSTER_PENDING" in drain.inputs["environment"]
    assert "GPUCLUSTER_ROLL_FAILED" in uncordon.inputs["environment"]
    assert pulumi.runtime.rpc.is_rpc_secret(r["p-gpu-1-roll"].inputs["stdin"])     # the drain's outcome
    assert "update" not in r["p-gpu-1-roll"].inputs and "triggers" not in r["p-gpu-1-roll"].inputs


def test_without_a_kubeconfig_kubectl_uses_its_own(record, dev_spec):
    r = by_name(run_pool(record, dev_spec, pool_of(dev_spec, {"r01": ["gpu-1"]})))
    assert "stdin" not in r["p-gpu-1-drain"].inputs
    assert set(r["p-gpu-1-drain"].inputs["environment"]) == {"GPUCLUSTER_OWED", "GPUCLUSTER_ROLL",
                                                              "GPUCLUSTER_PENDING", "GPUCLUSTER_CLUSTER"}


def test_the_drain_honours_disruption_budgets_and_the_pools_timeout(dev_spec):
    pool = pool_of(dev_spec, {"r01": ["gpu-1"]}, drain_timeout_s=900)
    drain = render_rollout(pool, pool.hosts[0]).drain
    assert "drain \"$HOST\" --ignore-daemonsets --delete-emptydir-data --timeout=900s" in drain
    assert "drain_flags=(--skip-wait-for-delete-timeout=60)" in drain      # not for pods only a finalizer holds
    assert "--force" not in drain and "--disable-eviction" not in drain


@pytest.mark.parametrize("rdma, host_driver, repos, burn_in, roll_s", [
    (False, True, False, True, 60 + 900), (True, True, False, True, 60 + 180 + 900),
    (True, False, False, True, 60 + 180), (True, True, True, False, 60 + 180 + 1200)])
def test_the_rollouts_modelled_time_adds_the_drain_and_the_rolls_own_bounds(dev_spec, rdma, host_driver, repos,
                                                                            burn_in, roll_s):
    """What the report prints comes from the batches and the bounds the steps run under (ROLL_BOUNDS_S is
    filled into the roll's script: its waits for kubelet and the ports, dcgmi's timeout)."""
    pool = pool_of(dev_spec, {"r01": ["gpu-1", "gpu-2", "gpu-3"], "r02": ["gpu-4"]}, max_unavailable=2,
                   drain_timeout_s=600)
    # prod's pool installs its driver stack from the site's mirrors; dev's only checks the versions
    software = load_spec(Path(__file__).parents[3] / "stacks" / "prod.yaml").node_pools[0].software if repos \
        else pool.software
    pool = pool.model_copy(update={"software": software,
                                   "burn_in": pool.burn_in.model_copy(update={"enabled": burn_in})})
    assert bool(pool.software.package_repositories) == repos
    m = rollout_model(pool, rdma=rdma, host_driver=host_driver)
    assert (m.batches, m.hosts_per_batch, m.drain_s, m.roll_s) == (2, 2, 600, roll_s)
    assert m.at_most_s == 2 * (600 + roll_s)
    assert (m.interruptions(1), m.interruptions(4)) == (1, 2)
    roll = render_pool_prep(pool, rdma=True).roll
    assert f"seq {ROLL_BOUNDS_S['kubelet']})" in roll and f"seq {ROLL_BOUNDS_S['ports']})" in roll


@pytest.mark.parametrize("stdout, outcome", [
    (None, "go"), ("gpu-1: drained: 1 pod(s) evicted\n", "go"), ("gpu-1: no restart is owed here: not drained\n", "go"),
    ("gpu-1: rollout deferred: 1 of pool h100's hosts are out\n", "deferred"),
    ("gpu-1: rollout failed (1 of the pool's failure budget of 1; ...): the drain did not finish\n", "failed")])
def test_the_roll_hears_whether_its_drain_took_the_node_out(stdout, outcome):
    assert drain_outcome(stdout) == outcome


@pytest.mark.parametrize("stdout, why", [
    (None, ""), ("gpu-1: 2 change(s)\n", ""), ("gpu-1: roll failed: dcgmi diag -r 1 failed after the restart\n",
                                                "dcgmi diag -r 1 failed after the restart")])
def test_the_uncordon_hears_the_rolls_own_failure(stdout, why):
    assert roll_failure(stdout) == why


def test_a_slurm_pools_drain_waits_for_slurm_and_gives_it_the_rollouts_reason():
    """Only the pools Slinky runs Slurm on: their drain names the rollout as the Slurm node's drain reason and
    evicts nothing before Slinky reports the Slurm node drained with no job (tests/e2e/test_slurm_rollout.py runs
    it against the real operator and Slurm's daemons)."""
    from tests.slurm_site import slurm_spec
    spec = slurm_spec()
    args = {p.name: NodePoolArgs.from_spec(spec, p) for p in spec.node_pools}
    assert {name: a.slurm for name, a in args.items()} == {"h100": False, "h100-slurm": True}
    slurm_pool = args["h100-slurm"].pool
    drain = render_rollout(slurm_pool, slurm_pool.hosts[0], slurm=True).drain
    assert "\nslurm=true\n" in drain and "-l nodeset.slinky.slurm.net/pod-hostname" in drain
    assert 'annotate node "$HOST" --overwrite nodeset.slinky.slurm.net/node-cordon-reason="$slurm_reason"' in drain
    # the wait comes before any eviction
    assert drain.index("then slurm_drained; fi") < drain.index('drain "$HOST" --ignore-daemonsets')
    plain = args["h100"].pool
    assert "\nslurm=false\n" in render_rollout(plain, plain.hosts[0]).drain
