"""The rollout's drain and uncordon steps, as pulumi runs them (bash, kubectl), against the real apiserver and
controllers with tenants' jobs on KWOK nodes: evictions honour PodDisruptionBudgets, a drain that cannot finish
leaves the node cordoned and tainted failed, and the node goes back to work exactly as it was. What depends on
the stack (its pools' batches, Kueue's topology) runs on every stack; the scripts' own paths on dev alone."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from components.k8s.labels import QUARANTINE_TAINT
from components.nodes.retire import render_retirement
from components.nodes.rollout import (CLAIM_ANNOTATION, CORDONED_BEFORE_ANNOTATION, DEFERRED, FAILED,
                                      PENDING_ANNOTATION, ROLLED_ANNOTATION, ROLLOUT_ANNOTATION, ROLLOUT_TAINT,
                                      UPGRADE_STATE_LABEL, drain_outcome, render_rollout, render_rollout_report,
                                      rollout_batches)
from components.spec import Host, NodePool

from tests.cutting import cut_everywhere

from .conftest import Cluster, wait_for
from .scenarios import Grant, grants

pytestmark = pytest.mark.e2e


def cluster_uid(c: Cluster) -> str:
    """The stack's cluster, as the Kubernetes provider's read of kube-system gives it to every kubectl step."""
    return c.cp.get("namespace", "kube-system")["metadata"]["uid"]


def run_step(c: Cluster, script: str, home: Path, *, owed: str = "kubelet", kubeconfig: str | None = None,
             timeout_s: float = 180, roll_failed: str = "", cluster: str | None = None,
             previous: str | None = None, roll: str = "e2e-preparation") -> subprocess.CompletedProcess[str]:
    """As pulumi-command runs a local command: bash -c, the component's environment, the kubeconfig (content
    or path) on standard input. Omitted `kubeconfig`: the control plane's, as content. `roll_failed`: what
    the uncordon hears of the roll (rollout.roll_failure). `cluster`: the stack's cluster (omitted: this control
    plane's). `previous`: the step's last output, as pulumi-command gives it to an update (omitted: none).
    `roll`: the preparation's digest."""
    env = {"PATH": f"{c.cp.bin}:/usr/bin:/bin", "HOME": str(home), "GPUCLUSTER_OWED": owed,
           "GPUCLUSTER_ROLL": roll, "GPUCLUSTER_ROLL_FAILED": roll_failed,
           "GPUCLUSTER_CLUSTER": cluster_uid(c) if cluster is None else cluster,
           **({"PULUMI_COMMAND_STDOUT": previous} if previous is not None else {})}
    stdin = c.cp.kubeconfig.read_text() if kubeconfig is None else kubeconfig
    return subprocess.run(["/bin/bash", "-c", script], env=env, input=stdin, capture_output=True, text=True,
                          timeout=timeout_s)


def node(c: Cluster, host: str) -> dict[str, Any]:
    return c.cp.get("node", host)


def rollout_taint(n: dict[str, Any]) -> str | None:
    return next((t["value"] for t in n["spec"].get("taints") or [] if t["key"] == ROLLOUT_TAINT), None)


def restore(c: Cluster, host: str) -> None:
    """Whatever a failed assertion left: the node uncordoned, untainted, unmarked."""
    c.cp.kubectl("uncordon", host)
    c.cp.kubectl("taint", "node", host, f"{ROLLOUT_TAINT}-", check=False)
    c.cp.kubectl("annotate", "node", host, f"{ROLLOUT_ANNOTATION}-", f"{CORDONED_BEFORE_ANNOTATION}-",
                 f"{ROLLED_ANNOTATION}-", f"{PENDING_ANNOTATION}-", f"{CLAIM_ANNOTATION}-")


def a_grant(c: Cluster) -> Grant:
    return next(g for g in grants(c.spec) if g.nominal)


def one_gpu_job(c: Cluster, name: str) -> tuple[NodePool, Host, dict[str, Any]]:
    """A tenant's one-GPU job `name`, admitted and running: its pod's pool, host and the job."""
    g = a_grant(c)
    job = c.submit(c.job(g.tenant, g.pool, name, pods=1, gpus_per_pod=1))
    c.wait_admitted(job)
    (pod,) = c.wait_running(job)
    return g.pool, next(h for h in g.pool.hosts if h.hostname == pod["spec"]["nodeName"]), job


@contextmanager
def blocking_budget(c: Cluster, job: dict[str, Any], name: str) -> Iterator[None]:
    """A PodDisruptionBudget `name` that allows no eviction of `job`'s pod, counted by the disruption
    controller, inside the block; deleted after it."""
    ns = job["metadata"]["namespace"]
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name, "namespace": ns},
           "spec": {"minAvailable": 1, "selector": {"matchLabels": {
               "batch.kubernetes.io/job-name": job["metadata"]["name"]}}}}
    c.cp.apply_objects([pdb])
    try:
        wait_for(lambda: c.cp.get("pdb", name, namespace=ns).get("status", {}).get("expectedPods") == 1, 30,
                 lambda: "the budget does not count the job's pod")
        yield
    finally:
        c.cp.kubectl("delete", "pdb", name, "-n", ns, "--ignore-not-found")


@pytest.fixture
def busy(clean: Cluster, tmp_path: Path) -> Iterator[tuple[Cluster, NodePool, Host, dict[str, Any], Path]]:
    """A tenant's one-GPU job running; its pod's node, the pool and the job."""
    pool, host, job = one_gpu_job(clean, "rolled")
    try:
        yield clean, pool, host, job, tmp_path
    finally:
        restore(clean, host.hostname)


def test_a_busy_node_is_drained_then_given_back_as_it_was(busy):
    c, pool, host, job, home = busy
    taints_before = node(c, host.hostname)["spec"].get("taints") or []
    scripts = render_rollout(pool, host)
    out = run_step(c, scripts.drain, home)
    assert out.returncode == 0, out.stderr
    assert f"{host.hostname}: changed: drained: 1 pod(s) evicted" in out.stdout
    n = node(c, host.hostname)
    assert n["spec"].get("unschedulable") is True and rollout_taint(n) == "in-progress"
    assert n["metadata"]["annotations"][CORDONED_BEFORE_ANNOTATION] == "false"
    assert n["metadata"]["annotations"][ROLLOUT_ANNOTATION] == "e2e-preparation"
    assert not [p for p in c.pods(job) if p["spec"].get("nodeName") == host.hostname
                and not p["metadata"].get("deletionTimestamp")], "the tenant's pod is still on the drained node"

    out = run_step(c, scripts.uncordon, home)
    assert out.returncode == 0, out.stderr
    assert f"{host.hostname}: changed: rollout done: back in service" in out.stdout
    n = node(c, host.hostname)
    assert not n["spec"].get("unschedulable") and (n["spec"].get("taints") or []) == taints_before
    assert not {ROLLOUT_ANNOTATION, CORDONED_BEFORE_ANNOTATION} & set(n["metadata"].get("annotations") or {})
    again = run_step(c, scripts.uncordon, home)
    assert again.returncode == 0 and again.stdout.endswith(f"{host.hostname}: 0 change(s)\n"), again.stdout


def conditions(c: Cluster, job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    wl = c.workload(job) or {}
    return {x["type"]: x for x in wl.get("status", {}).get("conditions", [])}


def test_with_room_elsewhere_kueue_moves_a_drained_job_without_evicting_it(busy):
    """Topology-aware Kueue replaces the drained node in the job's placement: the job keeps its admission (and
    its place in the queue) and its pod runs on another host of the pool."""
    c, pool, host, job, home = busy
    if len(pool.hosts) < 2:
        pytest.skip(f"pool {pool.name} has one host: there is nowhere else to go")
    out = run_step(c, render_rollout(pool, host).drain, home)
    assert out.returncode == 0, out.stderr
    (pod,) = c.wait_running(job, timeout_s=90)
    assert pod["spec"]["nodeName"] != host.hostname
    conds = conditions(c, job)
    assert conds["Admitted"]["status"] == "True" and conds.get("Evicted", {}).get("status") != "True", conds
    placement = json.dumps(c.workload(job)["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"])
    assert host.hostname not in placement and pod["spec"]["nodeName"] in placement


@pytest.mark.one_stack
def test_with_nowhere_else_to_go_kueue_requeues_a_drained_job_and_admits_it_again(busy):
    """The pool's other hosts cordoned by a person: Kueue finds no node to replace the drained one, evicts the
    workload and queues it again (its quota freed); the drain does not wait on the evicted pod the suspended
    Job still tracks; once the host is given back, Kueue admits the job again and it runs there."""
    c, pool, host, job, home = busy
    others = [h.hostname for h in pool.hosts if h.hostname != host.hostname]
    for other in others:
        c.cp.kubectl("cordon", other)
    try:
        # room for every host: the others' cordons would defer the drain otherwise (max_unavailable)
        scripts = render_rollout(with_rollout(pool, max_unavailable="100%"), host)
        out = run_step(c, scripts.drain, home, timeout_s=300)
        assert out.returncode == 0, out.stderr
        conds = wait_for(lambda: (x := conditions(c, job)).get("Requeued", {}).get("status") == "True" and x, 60,
                         lambda: f"the job was not requeued: {conditions(c, job)}")
        assert conds["Evicted"]["reason"] == "NodeFailures" and conds["Admitted"]["status"] == "False", conds
        assert c.cp.get("job", job["metadata"]["name"], namespace=job["metadata"]["namespace"])["spec"]["suspend"]
        out = run_step(c, scripts.uncordon, home)
        assert out.returncode == 0, out.stderr
        c.wait_admitted(job, timeout_s=90)
        (pod,) = c.wait_running(job, timeout_s=90)
        assert pod["spec"]["nodeName"] == host.hostname
    finally:
        for other in others:
            c.cp.kubectl("uncordon", other)


@pytest.mark.one_stack
def test_nothing_owed_means_no_drain_even_on_a_busy_node(busy):
    c, pool, host, job, home = busy
    out = run_step(c, render_rollout(pool, host).drain, home, owed="")
    assert out.returncode == 0 and "no restart is owed here: not drained" in out.stdout, out.stderr
    assert not node(c, host.hostname)["spec"].get("unschedulable")
    assert [p for p in c.pods(job) if p["spec"].get("nodeName") == host.hostname]


@pytest.mark.one_stack
def test_a_drain_a_disruption_budget_blocks_stops_the_rollout_with_the_node_cordoned_and_failed(busy):
    c, pool, host, job, home = busy
    pool = with_rollout(pool, failure_budget_hosts=0)      # prod lets one host fail and goes on (tested below)
    with blocking_budget(c, job, "rolled"):
        drain = render_rollout(pool, host).drain.replace(f"--timeout={pool.rollout.drain_timeout_s}s", "--timeout=5s")
        for attempt in (1, 2):          # a failed step is run again by the next pulumi up
            out = run_step(c, drain, home)
            assert out.returncode == 1, (attempt, out.stdout)
            assert "the drain did not finish" in out.stderr
            assert f"{host.hostname} stays cordoned and tainted {ROLLOUT_TAINT}=failed" in out.stderr
            # what held it, by name: the budget's pod, still running
            held = [p["metadata"] for p in c.pods(job) if p["spec"].get("nodeName") == host.hostname]
            assert any(f"still on {host.hostname}: " in out.stderr and f"{m['namespace']}/{m['name']} (running)"
                       in out.stderr for m in held), out.stderr
            n = node(c, host.hostname)
            assert n["spec"].get("unschedulable") is True and rollout_taint(n) == "failed"
            # what the node was before the first attempt, not the cordon the first attempt left
            assert n["metadata"]["annotations"][CORDONED_BEFORE_ANNOTATION] == "false", attempt
        running = [p for p in c.pods(job) if p["spec"].get("nodeName") == host.hostname
                   and p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]
        assert running, "the budget's pod was evicted"
    # The budget lifted, the rollout goes on. The evicted pod is gone once the Job controller has replaced it:
    # with a back-off per index it keeps the failed pod (its failure count) until then, 10 s on a first eviction.
    out = run_step(c, drain.replace("--timeout=5s", "--timeout=60s"), home)
    assert out.returncode == 0, out.stderr
    assert rollout_taint(node(c, host.hostname)) == "in-progress"
    out = run_step(c, render_rollout(pool, host).uncordon, home)
    assert out.returncode == 0, out.stderr
    n = node(c, host.hostname)
    assert not n["spec"].get("unschedulable") and rollout_taint(n) is None


@pytest.mark.one_stack
def test_a_node_a_person_cordoned_stays_cordoned_after_the_rollout(clean: Cluster, tmp_path: Path):
    g = a_grant(clean)
    host = g.pool.hosts[0]
    clean.cp.kubectl("cordon", host.hostname)
    try:
        scripts = render_rollout(g.pool, host)
        # the kubeconfig given as a path, as the Kubernetes provider's `kubeconfig` may be
        out = run_step(clean, scripts.drain, tmp_path, kubeconfig=str(clean.cp.kubeconfig))
        assert out.returncode == 0, out.stderr
        assert "marked for the rollout (cordoned before: true)" in out.stdout and "changed: cordoned" not in out.stdout
        out = run_step(clean, scripts.uncordon, tmp_path, kubeconfig=str(clean.cp.kubeconfig))
        assert out.returncode == 0, out.stderr
        assert "rollout done (it stays cordoned, as it was before)" in out.stdout
        n = node(clean, host.hostname)
        assert n["spec"].get("unschedulable") is True and rollout_taint(n) is None
        assert CORDONED_BEFORE_ANNOTATION not in (n["metadata"].get("annotations") or {})
    finally:
        restore(clean, host.hostname)


@pytest.mark.one_stack
def test_a_host_that_is_not_a_node_is_not_drained_and_an_unreachable_cluster_is_named(clean: Cluster,
                                                                                       tmp_path: Path):
    pool = a_grant(clean).pool
    absent = pool.hosts[0].model_copy(update={"hostname": "gpu-not-joined"})
    out = run_step(clean, render_rollout(pool, absent).drain, tmp_path)
    assert out.returncode == 0 and "no Node gpu-not-joined in the cluster: nothing to drain" in out.stdout, out.stderr
    unreachable = clean.cp.kubeconfig.read_text().replace(
        next(line.split()[-1] for line in clean.cp.kubeconfig.read_text().splitlines() if "server:" in line),
        "https://127.0.0.1:9")
    out = run_step(clean, render_rollout(pool, pool.hosts[0]).drain, tmp_path, kubeconfig=unreachable, timeout_s=90)
    assert out.returncode == 1, out.stdout
    assert f"{pool.hosts[0].hostname}: error: kubectl cannot reach the cluster to check it is the stack's" in out.stderr
    assert "apiVersion" not in out.stdout + out.stderr          # the kubeconfig is never printed


@pytest.mark.one_stack
def test_drain_and_uncordon_killed_anywhere_converge_on_the_next_run(clean: Cluster, tmp_path: Path):
    """Each step cut (SIGKILL of its shell) at every risky point and spread between, then run whole again, as the
    next pulumi up runs a step whose last run failed; judged on the Node the apiserver holds."""
    pool = a_grant(clean).pool
    host = pool.hosts[0]
    scripts = render_rollout(pool, host)
    taints_before = node(clean, host.hostname)["spec"].get("taints") or []

    def run(text: str) -> subprocess.CompletedProcess[str]:
        return run_step(clean, text, tmp_path)

    def drained(k: int) -> None:
        n = node(clean, host.hostname)
        assert n["spec"].get("unschedulable") is True and rollout_taint(n) == "in-progress", k
        assert n["metadata"]["annotations"][CORDONED_BEFORE_ANNOTATION] == "false", k

    def given_back(k: int) -> None:
        n = node(clean, host.hostname)
        assert not n["spec"].get("unschedulable") and (n["spec"].get("taints") or []) == taints_before, k
        assert not {ROLLOUT_ANNOTATION, CORDONED_BEFORE_ANNOTATION} & set(n["metadata"].get("annotations") or {}), k

    try:
        cut_everywhere(run, scripts.drain, lambda: restore(clean, host.hostname), drained)
        cut_everywhere(run, scripts.uncordon, lambda: (restore(clean, host.hostname), run(scripts.drain)),
                       given_back)
    finally:
        restore(clean, host.hostname)


def rollout_steps(c: Cluster) -> tuple[dict[str, dict[str, Any]], dict[str, list[str]]]:
    """The plan's drain, roll and uncordon resources by URN, and the points between batches (`-batch`, no
    command), and each one's dependencies among them."""
    plan = json.loads((c.plan.dir / "resources.json").read_text())
    steps = {r["urn"]: r for r in plan["resources"]
             if r["name"].endswith(("-drain", "-roll", "-uncordon", "-batch"))}
    def deps(r: dict[str, Any]) -> set[str]:       # the engine waits for both kinds
        return {*r["dependsOn"], *(d for ds in (r.get("propertyDependencies") or {}).values() for d in ds)}
    return steps, {u: [d for d in deps(r) if d in steps] for u, r in steps.items()}


def run_graph(steps: dict[str, Any], deps: dict[str, list[str]], act: Callable[[str], bool]) -> dict[str, bool | None]:
    """As the engine runs a graph: each step once its dependencies succeeded, side by side where they allow;
    a step whose dependency failed is not run (None)."""
    results: dict[str, bool | None] = {}
    with ThreadPoolExecutor(max_workers=16) as pool:
        running: dict[Any, str] = {}
        while len(results) < len(steps):
            for u in steps:
                if u in results or u in running.values():
                    continue
                if any(results.get(d) in (False, None) and d in results for d in deps[u]):
                    results[u] = None
                elif all(results.get(d) is True for d in deps[u]):
                    running[pool.submit(act, u)] = u
            if running:
                done, _ = wait(list(running), return_when=FIRST_COMPLETED)
                for f in done:
                    results[running.pop(f)] = f.result()
    return results


def test_the_plans_rollout_never_has_more_of_a_pools_hosts_out_than_a_batch(clean: Cluster, tmp_path: Path):
    """Every host owes a kubelet restart: the plan's own drain and uncordon scripts run in the plan's dependency
    order (the roll over SSH stands in: it is tested on the SSH hosts), while the Nodes are watched. A roll that
    fails stops its pool there: that host stays cordoned and tainted, no later batch is drained."""
    steps, deps = rollout_steps(clean)
    pools = {p.name: p for p in clean.spec.node_pools}
    pool_of = {h.hostname: p.name for p in clean.spec.node_pools for h in p.hosts}
    g = a_grant(clean)
    job = clean.submit(clean.job(g.tenant, g.pool, "fleet", pods=min(g.nominal, len(g.pool.hosts)), gpus_per_pod=1))
    clean.wait_admitted(job)
    clean.wait_running(job)
    batches = {p.name: rollout_batches(p) for p in clean.spec.node_pools}
    failing = {p: b[1][0].hostname for p, b in batches.items() if len(b) > 2}    # the first host of batch 2

    def host_of(urn: str) -> str:
        return next(h for h in pool_of if urn.endswith(f"-{h}-drain") or urn.endswith(f"-{h}-roll")
                    or urn.endswith(f"-{h}-uncordon"))

    said: dict[str, str] = {}

    def act(urn: str) -> bool:
        if steps[urn]["name"].endswith("-batch"):
            assert not steps[urn]["inputs"].get("create")
            return True                 # a point between two batches: nothing runs
        name, host = steps[urn]["name"], host_of(urn)
        if name.endswith("-roll"):
            assert node(clean, host)["spec"].get("unschedulable") is True, \
                f"{host} rolled while schedulable; its drain said: {said.get(host)}"
            time.sleep(0.5)
            return host not in failing.values()
        out = run_step(clean, (clean.plan.dir / "scripts" / "_local" / f"{name}.sh").read_text(), tmp_path)
        assert out.returncode == 0, out.stderr
        said[host] = out.stdout
        return True

    most: dict[str, int] = {p: 0 for p in pools}
    watching = threading.Event()

    def watch() -> None:
        while not watching.is_set():
            out: dict[str, int] = {p: 0 for p in pools}
            for name, n in clean.nodes().items():
                if n["spec"].get("unschedulable"):
                    out[pool_of[name]] += 1
            for p in pools:
                most[p] = max(most[p], out[p])
            time.sleep(0.1)
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        results = run_graph(steps, deps, act)
        watching.set()
        for p, h in failing.items():
            n = node(clean, h)
            assert n["spec"].get("unschedulable") is True and rollout_taint(n) == "in-progress", (p, h)
    finally:
        watching.set()
        watcher.join()
        for h in pool_of:
            restore(clean, h)
    for p, pool in pools.items():
        size = pool.rollout.batch_size(len(pool.hosts))
        assert 1 <= most[p] <= size, f"pool {p}: {most[p]} hosts out at once, the policy allows {size}"
        for i, batch in enumerate(batches[p]):
            for h in batch:
                drained = results[next(u for u in steps if u.endswith(f"-{h.hostname}-drain"))]
                given_back = results[next(u for u in steps if u.endswith(f"-{h.hostname}-uncordon"))]
                if p not in failing or i == 0:
                    assert drained and given_back, (p, h.hostname)
                elif i == 1:
                    assert drained and (given_back is None) == (h.hostname == failing[p]), (p, h.hostname)
                else:
                    assert drained is None, f"{h.hostname} of batch {i + 1} was drained after batch 2 failed"
    assert clean.wait_admitted(job).admitted      # Kueue keeps the job admitted; its pods run again
    clean.wait_running(job, timeout_s=90)


def with_rollout(pool: NodePool, **rollout: Any) -> NodePool:
    return pool.model_copy(update={"rollout": pool.rollout.model_copy(update=rollout)})


def annotations(c: Cluster, host: str) -> dict[str, str]:
    return node(c, host)["metadata"].get("annotations") or {}


def run_report(c: Cluster, pool: NodePool, home: Path) -> subprocess.CompletedProcess[str]:
    return run_step(c, render_rollout_report(pool), home)


@pytest.mark.one_stack
@pytest.mark.parametrize("how", ["quarantined", "cordoned", "driver-upgrade"])
def test_a_host_already_out_counts_against_max_unavailable_and_the_drain_waits_for_the_next_apply(
        clean: Cluster, tmp_path: Path, how: str):
    """One of the pool's hosts out of service already (quarantined, cordoned by a person, in a GPU Operator
    driver upgrade): with room for one, the rollout defers the next host (left in service, marked pending,
    named by the pool's report) instead of taking a second out; the next apply, with room again, rolls it."""
    pool = with_rollout(a_grant(clean).pool, max_unavailable=1)
    if len(pool.hosts) < 2:
        pytest.skip("one host: nothing else can be out")
    out_host, host = pool.hosts[0].hostname, pool.hosts[1]
    take_out = {"quarantined": ["taint", "node", out_host, f"{QUARANTINE_TAINT}=gpu-fault:NoExecute"],
                "cordoned": ["cordon", out_host],
                "driver-upgrade": ["label", "node", out_host, f"{UPGRADE_STATE_LABEL}=drain-required"]}[how]
    clean.cp.kubectl(*take_out)
    try:
        scripts = render_rollout(pool, host)
        out = run_step(clean, scripts.drain, tmp_path)
        assert out.returncode == 0, out.stderr
        assert f"{host.hostname}: {DEFERRED}: 1 of pool {pool.name}'s hosts are out of service already ({out_host}" \
            in out.stdout and "max_unavailable allows 1" in out.stdout, out.stdout
        assert drain_outcome(out.stdout) == "deferred"
        n = node(clean, host.hostname)
        assert not n["spec"].get("unschedulable") and rollout_taint(n) is None
        assert annotations(clean, host.hostname)[PENDING_ANNOTATION].startswith("deferred: ")
        assert CLAIM_ANNOTATION not in annotations(clean, host.hostname)
        out = run_step(clean, scripts.uncordon, tmp_path)
        assert out.returncode == 0 and "not taken out by a rollout: left as it is" in out.stdout, out.stderr
        report = run_report(clean, pool, tmp_path)
        assert report.returncode == 1 and f"{host.hostname}: deferred: " in report.stderr, report.stderr
        assert "0 host(s) failed" in report.stderr and "1 deferred" in report.stderr
        # the other host out itself takes no more room: it is rolled
        out = run_step(clean, render_rollout(pool, pool.hosts[0]).drain, tmp_path)
        if how == "driver-upgrade":     # ... unless the GPU Operator is at work on it
            assert f"{DEFERRED}: in a GPU Operator driver upgrade (drain-required)" in out.stdout, out.stdout
        else:
            assert out.returncode == 0 and "drained: " in out.stdout, out.stderr
            assert run_step(clean, render_rollout(pool, pool.hosts[0]).uncordon, tmp_path).returncode == 0
    finally:
        restore(clean, out_host)
        clean.cp.kubectl("taint", "node", out_host, f"{QUARANTINE_TAINT}-", check=False)
        clean.cp.kubectl("label", "node", out_host, f"{UPGRADE_STATE_LABEL}-")
    try:
        out = run_step(clean, scripts.drain, tmp_path)      # the next apply: room again
        assert out.returncode == 0 and "drained: " in out.stdout, out.stdout + out.stderr
        out = run_step(clean, scripts.uncordon, tmp_path)
        assert out.returncode == 0 and "rollout done: back in service" in out.stdout, out.stderr
        a = annotations(clean, host.hostname)
        assert PENDING_ANNOTATION not in a and a[ROLLED_ANNOTATION] == "e2e-preparation"
        assert run_report(clean, pool, tmp_path).returncode == 0
        out = run_step(clean, scripts.drain, tmp_path)      # run again for the same preparation: nothing to do
        assert out.returncode == 0 and "already rolled for this preparation: not drained" in out.stdout
        assert not node(clean, host.hostname)["spec"].get("unschedulable")
    finally:
        restore(clean, host.hostname)


@pytest.mark.one_stack
def test_within_the_failure_budget_a_failed_host_stays_out_and_the_rollout_goes_on(busy):
    """A drain a disruption budget blocks, and a roll that failed, with `failure_budget_hosts: 1`: the first
    failure stays out (cordoned, tainted failed, pending) and its steps succeed, so the later batches go on;
    the pool's report names it; a second failure is past the budget and stops the rollout."""
    c, pool, host, job, home = busy
    pool = with_rollout(pool, failure_budget_hosts=1)
    with blocking_budget(c, job, "budgeted"):
        drain = render_rollout(pool, host).drain.replace(f"--timeout={pool.rollout.drain_timeout_s}s", "--timeout=5s")
        out = run_step(c, drain, home)
        assert out.returncode == 0, out.stderr
        assert f"{host.hostname}: {FAILED} (1 of the pool's failure budget of 1; the rollout goes on" in out.stdout
        assert drain_outcome(out.stdout) == "failed"
        n = node(c, host.hostname)
        assert n["spec"].get("unschedulable") is True and rollout_taint(n) == "failed"
        assert annotations(c, host.hostname)[PENDING_ANNOTATION].startswith("failed: the drain did not finish")
        out = run_step(c, render_rollout(pool, host).uncordon, home)
        assert out.returncode == 0 and "its rollout failed: it stays out of service" in out.stdout, out.stderr
        assert node(c, host.hostname)["spec"].get("unschedulable") is True
        report = run_report(c, pool, home)
        assert report.returncode == 1 and f"{host.hostname}: failed: the drain did not finish" in report.stderr
        assert "1 host(s) failed" in report.stderr
    # the next apply: the budget lifted, drained; then the roll fails, judged by the uncordon
    out = run_step(c, render_rollout(pool, host).drain.replace("--timeout=3600s", "--timeout=60s"), home)
    assert out.returncode == 0 and rollout_taint(node(c, host.hostname)) == "in-progress", out.stderr
    other = next((h for h in pool.hosts if h.hostname != host.hostname), None)
    try:
        if other is not None:       # a second failure in the pool is one past the budget
            c.cp.kubectl("taint", "node", other.hostname, f"{ROLLOUT_TAINT}=failed:NoSchedule")
        out = run_step(c, render_rollout(pool, host).uncordon, home, roll_failed="dcgmi diag -r 1 failed")
        if other is not None:
            assert out.returncode == 1, out.stdout
            assert "the roll failed: dcgmi diag -r 1 failed (rollout.failure_budget_hosts allows 1 failed host(s)" \
                in out.stderr and "2 have failed: the pool's later batches wait" in out.stderr, out.stderr
        else:
            assert out.returncode == 0 and FAILED in out.stdout, out.stderr
        n = node(c, host.hostname)
        assert n["spec"].get("unschedulable") is True and rollout_taint(n) == "failed"
        assert annotations(c, host.hostname)[PENDING_ANNOTATION] == "failed: the roll failed: dcgmi diag -r 1 failed"
    finally:
        if other is not None:
            c.cp.kubectl("taint", "node", other.hostname, f"{ROLLOUT_TAINT}-", check=False)
    # and the apply after that rolls it: given back, nothing pending, the report clean
    assert run_step(c, render_rollout(pool, host).drain, home).returncode == 0
    out = run_step(c, render_rollout(pool, host).uncordon, home)
    assert out.returncode == 0 and "back in service" in out.stdout, out.stderr
    assert PENDING_ANNOTATION not in annotations(c, host.hostname)
    assert run_report(c, pool, home).returncode == 0


@pytest.mark.one_stack
@pytest.mark.parametrize("step", ["drain", "uncordon", "retire", "deregister", "report"])
def test_a_kubectl_step_pointed_at_another_cluster_changes_nothing_and_says_so(clean: Cluster, tmp_path: Path,
                                                                            step: str):
    """The kubeconfig kubectl was given reaches a cluster whose kube-system is not the one the Kubernetes
    provider read (another cluster, the ambient context): every step refuses before it acts; a step stored
    without the stack's cluster (an earlier release) refuses too."""
    pool = a_grant(clean).pool
    host = pool.hosts[0]
    retire = render_retirement(pool, host, sorted(clean.spec.agent_namespaces))
    script = {"drain": render_rollout(pool, host).drain, "uncordon": render_rollout(pool, host).uncordon,
              "retire": retire.retire, "deregister": retire.deregister, "report": render_rollout_report(pool)}[step]
    before = node(clean, host.hostname)
    other = "0c5e4d7a-0000-4000-8000-000000000000"
    out = run_step(clean, script, tmp_path, cluster=other)
    assert out.returncode == 1, out.stdout
    assert f"kubectl reaches another cluster than the stack's Kubernetes provider (its kube-system namespace is " \
           f"{cluster_uid(clean)}, the stack's {other}" in out.stderr and "nothing was changed" in out.stderr
    out = run_step(clean, script, tmp_path, cluster="")
    assert out.returncode == 1 and "this step was not told which cluster is the stack's" in out.stderr
    after = node(clean, host.hostname)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


@pytest.mark.one_stack
def test_a_drain_run_again_for_another_reason_than_a_new_preparation_drains_nothing(busy):
    """A new release changes the drain's script (or an input), so every host's drain runs again with the owed
    restarts its preparation once printed. Rolled for this preparation (the Node says so), or rolled before the
    Node recorded it (the step ran before: pulumi-command gives it its last output), it drains nothing; what
    the host still owes comes back from the roll, marks the host pending, and the next apply drains it."""
    c, pool, host, job, home = busy
    scripts = render_rollout(pool, host)
    out = run_step(c, scripts.drain, home, previous="gpu-dev-01: drained: 1 pod(s) evicted\n")
    assert out.returncode == 0, out.stderr
    assert "rolled before its Node recorded it: not drained" in out.stdout, out.stdout
    assert not node(c, host.hostname)["spec"].get("unschedulable")
    assert annotations(c, host.hostname)[ROLLED_ANNOTATION] == "e2e-preparation"
    out = run_step(c, scripts.drain, home)          # the same preparation, the Node records it now
    assert out.returncode == 0 and "already rolled for this preparation: not drained" in out.stdout, out.stdout
    assert drain_outcome(out.stdout) == "go"
    # the roll (told "go") found the kubelet restart still owed, with the tenant's pod running
    out = run_step(c, scripts.uncordon, home, roll_failed="1 tenant pod(s) still run here after the drain")
    assert out.returncode == 0, out.stderr
    assert f"{DEFERRED}: not drained, and the roll found: 1 tenant pod(s) still run here" in out.stdout
    assert annotations(c, host.hostname)[PENDING_ANNOTATION].startswith("deferred: not drained")
    out = run_step(c, scripts.drain, home, previous="anything")     # the next apply: pending, so drained
    assert out.returncode == 0 and "drained: " in out.stdout, out.stdout + out.stderr
    out = run_step(c, scripts.uncordon, home)
    assert out.returncode == 0 and "back in service" in out.stdout, out.stderr
    assert PENDING_ANNOTATION not in annotations(c, host.hostname)


@pytest.mark.one_stack
def test_a_host_whose_last_preparation_owed_nothing_is_drained_for_a_new_one_that_owes_a_restart(busy):
    """Its drain ran before (owing nothing, so the Node recorded no roll) for another preparation: not a host
    rolled before its Node recorded it, so the drain goes on (found by the real engine, issue 54: the first
    owed restart of every busy host was deferred to a second apply)."""
    c, pool, host, job, home = busy
    scripts = render_rollout(pool, host)
    first = run_step(c, scripts.drain, home, owed="", roll="first-preparation")
    assert first.returncode == 0 and "no restart is owed here: not drained" in first.stdout, first.stdout
    out = run_step(c, scripts.drain, home, previous=first.stdout, roll="second-preparation")
    assert out.returncode == 0, out.stderr
    assert f"{host.hostname}: changed: drained: 1 pod(s) evicted" in out.stdout, out.stdout
    assert drain_outcome(out.stdout) == "go"
    out = run_step(c, scripts.uncordon, home, roll="second-preparation")
    assert out.returncode == 0 and "back in service" in out.stdout, out.stdout + out.stderr
    assert annotations(c, host.hostname)[ROLLED_ANNOTATION] == "second-preparation"


@pytest.mark.one_stack
def test_a_multi_pod_job_its_budget_protects_survives_a_rollout_of_its_pool(clean: Cluster, tmp_path: Path):
    """A tenant's job with a pod per host (each asks for more than half a host's GPUs), a PodDisruptionBudget
    allowing one pod out. The
    rollout drains a host: the evicted pod's replacement is pinned by Kueue's topology assignment to the
    drained host, cannot run, and Kueue fails it (TerminatedByKueue, UnschedulableOnAssignedNode); the
    template's failure policy ignores that as it ignores an eviction, so the job is not failed: Kueue moves the
    pod to another host where there is room, or else requeues the workload and admits it again once the host is
    given back."""
    g = a_grant(clean)
    pool = with_rollout(g.pool, max_unavailable="100%")
    per_pod = pool.gpu.count // 2 + 1
    pods = min(len(pool.hosts), g.nominal // per_pod)
    if pods < 2:
        pytest.skip("the tenant's guarantee does not cover two pods of more than half a host each")
    job = clean.submit(clean.job(g.tenant, pool, "survivor", pods=pods, gpus_per_pod=per_pod))
    clean.wait_admitted(job)
    running = clean.wait_running(job, timeout_s=120)
    host = next(h for h in pool.hosts if h.hostname == running[0]["spec"]["nodeName"])
    ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name, "namespace": ns},
           # minAvailable: a Job has no scale, so the disruption controller cannot count maxUnavailable
           "spec": {"minAvailable": pods - 1, "selector": {"matchLabels": {"batch.kubernetes.io/job-name": name}}}}
    clean.cp.apply_objects([pdb])
    try:
        wait_for(lambda: clean.cp.get("pdb", name, namespace=ns).get("status", {}).get("expectedPods") == pods, 30,
                 lambda: "the budget does not count the job's pods")
        scripts = render_rollout(pool, host)
        out = run_step(clean, scripts.drain, tmp_path, timeout_s=300)
        assert out.returncode == 0, out.stderr

        def terminated_by_kueue() -> bool:
            return any(c.get("type") == "TerminatedByKueue" for p in clean.pods(job)
                       for c in p.get("status", {}).get("conditions") or [])

        def moved() -> bool:        # room elsewhere: Kueue placed the pod on another host
            live = [p for p in clean.pods(job) if p["status"].get("phase") == "Running"
                    and not p["metadata"].get("deletionTimestamp")]
            return len(live) == pods and all(p["spec"].get("nodeName") != host.hostname for p in live)
        settled = wait_for(lambda: (conditions(clean, job).get("Requeued", {}).get("status") == "True"
                                    or terminated_by_kueue() or moved()) and conditions(clean, job), 120,
                           lambda: f"neither requeued, replaced nor moved: {conditions(clean, job)}")
        assert settled
        time.sleep(5)       # what the Job controller makes of the failed replacement
        status = clean.cp.get("job", name, namespace=ns)["status"]
        assert not [c for c in status.get("conditions") or [] if c["type"] == "Failed" and c["status"] == "True"], \
            status
        out = run_step(clean, scripts.uncordon, tmp_path)
        assert out.returncode == 0, out.stderr
        clean.wait_admitted(job, timeout_s=120)
        assert len(clean.wait_running(job, timeout_s=120)) == pods
        status = clean.cp.get("job", name, namespace=ns)["status"]
        assert not status.get("failedIndexes") and not [
            c for c in status.get("conditions") or [] if c["type"] == "Failed" and c["status"] == "True"], status
    finally:
        clean.cp.kubectl("delete", "pdb", name, "-n", ns, "--ignore-not-found")
        restore(clean, host.hostname)


@pytest.mark.one_stack
def test_a_pod_kueue_fails_for_its_assigned_node_is_not_the_jobs_failure(busy):
    """What Kueue's node failure controller does to a replacement pod pinned to a node that cannot take it
    (TAS, the node drained or tainted): the pod Failed with the condition TerminatedByKueue
    (UnschedulableOnAssignedNode), for the Job controller to create it again elsewhere. Done here as Kueue does
    it (a status patch), the real Job controller judges it by the template's failure policy: not a failed
    index, the job goes on with a new pod."""
    c, pool, host, job, home = busy
    ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
    (pod,) = [p for p in c.pods(job) if p["status"].get("phase") == "Running"]
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    c.cp.kubectl("patch", "pod", pod["metadata"]["name"], "-n", ns, "--subresource=status", "--type=merge", "-p",
                 json.dumps({"status": {"phase": "Failed", "conditions": [
                     {"type": "TerminatedByKueue", "status": "True", "reason": "UnschedulableOnAssignedNode",
                      "message": "Pod terminated by Kueue NodeFailureController due to node taint",
                      "lastTransitionTime": now}]}}))
    replaced = wait_for(lambda: [p for p in c.pods(job) if p["metadata"]["uid"] != pod["metadata"]["uid"]], 90,
                        lambda: f"no replacement pod: {c.cp.get('job', name, namespace=ns)['status']}")
    assert replaced
    status = c.cp.get("job", name, namespace=ns)["status"]
    assert not status.get("failedIndexes") and not [
        x for x in status.get("conditions") or [] if x["type"] in ("Failed", "FailureTarget")], status
