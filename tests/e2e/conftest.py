"""One real control plane per stack in stacks/, with the stack's plan applied and its hosts as KWOK nodes.

`make e2e` sets GPUCLUSTER_E2E=1: then missing tools or a control plane that does not start fail the run. Run
alone (`pytest -m e2e`) without the tools, the tests skip and say how to build them.
"""

from __future__ import annotations

import contextlib
import copy
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import yaml

from components.k8s.health import checks as health_checks
from components.k8s.tenancy.jobs import render_job
from components.spec import ClusterSpec, NodePool, Tenant
from components.spec.cluster import checked_pools
from tests.conftest import _DEV

from .controlplane import ControlPlane, missing_tools
from .stack import STACKS, StackPlan, external_crds, kwok_nodes, ordered, plan_stack

REQUIRED = os.environ.get("GPUCLUSTER_E2E") == "1"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
MPIJOB_NAME_LABEL = "training.kubeflow.org/job-name"       # on an MPIJob's launcher and worker pods


@dataclass
class Admission:
    admitted: bool
    message: str
    flavors: dict[str, str]
    workload: dict[str, Any]


class Cluster:
    """The control plane with a stack applied, and what a tenant does with it: submit jobs, watch them."""

    def __init__(self, plan: StackPlan, cp: ControlPlane):
        self.plan, self.cp = plan, cp
        self.spec: ClusterSpec = plan.spec
        self.applied: list[str] = []          # kind/namespace/name of every object of the plan applied

    def tenant(self, name: str) -> Tenant:
        return next(t for t in self.spec.tenants if t.name == name)

    def job(self, tenant: Tenant, pool: NodePool, name: str, **kw: Any) -> dict[str, Any]:
        return render_job(self.spec, tenant, pool, name=name, **kw)

    def submit(self, job: dict[str, Any]) -> dict[str, Any]:
        self.cp.kubectl("create", "-f", "-", input=yaml.safe_dump(job, sort_keys=False))
        return job

    def delete_jobs(self, *jobs: dict[str, Any]) -> None:
        for job in jobs:
            m = job["metadata"]
            self.cp.kubectl("delete", job["kind"].lower(), m["name"], "-n", m["namespace"], "--ignore-not-found",
                            "--cascade=foreground", "--wait=true", "--timeout=60s")

    def workload(self, job: dict[str, Any]) -> dict[str, Any] | None:
        m = job["metadata"]
        for wl in self.cp.get("workloads.kueue.x-k8s.io", namespace=m["namespace"])["items"]:
            if any(o["kind"] == job["kind"] and o["name"] == m["name"]
                   for o in wl["metadata"].get("ownerReferences", [])):
                return wl
        return None

    def admission(self, job: dict[str, Any]) -> Admission | None:
        wl = self.workload(job)
        if wl is None:
            return None
        conds = {c["type"]: c for c in wl.get("status", {}).get("conditions", [])}
        admitted = conds.get("Admitted", {}).get("status") == "True"
        reason = conds.get("QuotaReserved", {}) if not admitted else conds["Admitted"]
        flavors = {}
        for ps in (wl.get("status", {}).get("admission") or {}).get("podSetAssignments", []):
            flavors.update(ps.get("flavors", {}))
        return Admission(admitted, reason.get("message", ""), flavors, wl)

    def wait_admitted(self, job: dict[str, Any], timeout_s: float = 60) -> Admission:
        return wait_for(lambda: (a := self.admission(job)) and a.admitted and a,
                        timeout_s, lambda: f"job {_name(job)} not admitted: {self._why(job)}")

    def wait_pending(self, job: dict[str, Any], timeout_s: float = 30) -> Admission:
        """Kueue has looked at the job and left it waiting, saying why."""
        return wait_for(lambda: (a := self.admission(job)) and not a.admitted and a.message and a,
                        timeout_s, lambda: f"job {_name(job)} has no pending reason: {self._why(job)}")

    def assert_stays_pending(self, job: dict[str, Any], settle_s: float = 5) -> Admission:
        self.wait_pending(job)
        time.sleep(settle_s)
        a = self.admission(job)
        assert a is not None and not a.admitted, f"job {_name(job)} was admitted: {a and a.flavors}"
        assert not self.pods(job), f"job {_name(job)} is pending but has pods"
        return a

    def pods(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        m = job["metadata"]
        label = MPIJOB_NAME_LABEL if job["kind"] == "MPIJob" else JOB_NAME_LABEL
        return self.cp.get("pods", namespace=m["namespace"], selector=f"{label}={m['name']}")["items"]

    def wait_running(self, job: dict[str, Any], timeout_s: float = 60) -> list[dict[str, Any]]:
        """All of the job's pods bound to nodes and Running (an MPIJob's: its launcher's and workers'); returns
        them."""
        want = sum(r["replicas"] for r in job["spec"]["mpiReplicaSpecs"].values()) if job["kind"] == "MPIJob" \
            else job["spec"].get("parallelism", 1)

        def running() -> list[dict[str, Any]] | None:
            pods = [p for p in self.pods(job) if not p["metadata"].get("deletionTimestamp")]
            ok = [p for p in pods if p["spec"].get("nodeName") and p["status"].get("phase") == "Running"]
            return ok if len(ok) == want else None
        return wait_for(running, timeout_s, lambda: f"pods of {_name(job)} not all running: {self._pods_state(job)}")

    def wait_evicted(self, job: dict[str, Any], timeout_s: float = 60) -> Admission:
        def evicted() -> Admission | None:
            a = self.admission(job)
            return a if a and not a.admitted and not self.pods(job) else None
        return wait_for(evicted, timeout_s, lambda: f"job {_name(job)} still admitted or has pods: {self._why(job)}")

    def nodes(self) -> dict[str, dict[str, Any]]:
        return {n["metadata"]["name"]: n for n in self.cp.get("nodes")["items"]}

    def set_nodes(self, quarantined: set[str] = frozenset()) -> None:
        """(Re)register every host as a KWOK node; `quarantined` hosts carry the failed burn-in taint."""
        self.cp.apply_objects(kwok_nodes(self.spec, set(quarantined)))
        hosts = len(list(self.spec.hosts()))
        # Ready, and the node lifecycle controller has lifted its own not-ready/unreachable taints.
        wait_for(lambda: len(nodes := self.nodes()) == hosts and all(_ready(n) for n in nodes.values()),
                 60, lambda: f"KWOK nodes not ready and untainted: {self._node_state()}")

    def _node_state(self) -> str:
        return "; ".join(f"{name}: ready={_ready(n)} taints={[t['key'] for t in n['spec'].get('taints') or []]}"
                         for name, n in sorted(self.nodes().items()))

    def clean(self) -> None:
        """Delete every Job and MPIJob in the tenants' namespaces and wait until their workloads and pods are
        gone."""
        kinds = ["jobs", *(["mpijobs"] if self.spec.kubernetes.mpi_operator.enabled else [])]
        targets = {t.namespace_name: kinds for t in self.spec.tenants}
        if checked_pools(self.spec):                  # the active health checks' Jobs too
            targets[health_checks.NAMESPACE] = ["jobs"]
        namespaces = list(targets)
        for ns, ns_kinds in targets.items():
            for kind in ns_kinds:
                if self.cp.get(kind, namespace=ns)["items"]:      # a kubectl process only for what there is
                    self.cp.kubectl("delete", kind, "--all", "-n", ns, "--cascade=foreground", "--wait=true",
                                    "--timeout=90s")
        wait_for(lambda: not any(self.cp.get("workloads.kueue.x-k8s.io", namespace=ns)["items"]
                                 or self.cp.get("pods", namespace=ns)["items"]
                                 for ns in namespaces), 90, lambda: "tenant workloads or pods left behind")

    def _why(self, job: dict[str, Any]) -> str:
        a = self.admission(job)
        return "no Workload yet" if a is None else f"admitted={a.admitted} flavors={a.flavors} message={a.message!r}"

    def _pods_state(self, job: dict[str, Any]) -> str:
        return ", ".join(f"{p['metadata']['name']}@{p['spec'].get('nodeName')}:{p['status'].get('phase')}"
                         for p in self.pods(job)) or f"no pods; {_name(job)} status {self._job_status(job)}"

    def _job_status(self, job: dict[str, Any]) -> str:
        m = job["metadata"]
        out = self.cp.kubectl("get", job["kind"].lower(), m["name"], "-n", m["namespace"], "-o",
                              "jsonpath={.spec.suspend} {.status}", check=False)
        events = self.cp.kubectl("get", "events", "-n", m["namespace"], "--field-selector",
                                 f"involvedObject.name={m['name']}", "-o",
                                 "jsonpath={range .items[*]}{.lastTimestamp} {.reason}: {.message}{'\\n'}{end}",
                                 check=False)
        return f"{(out.stdout or out.stderr).strip()}; events:\n{events.stdout.strip()}"


def wait_for(probe: Callable[[], Any], timeout_s: float, describe: Callable[[], str]) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(describe())
        time.sleep(0.5)


def _ready(node: dict[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions) and \
        not any(t["key"].startswith("node.kubernetes.io/") for t in node.get("spec", {}).get("taints") or [])


def _name(job: dict[str, Any]) -> str:
    return f"{job['metadata']['namespace']}/{job['metadata']['name']}"


@pytest.fixture(scope="session", params=STACKS)
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The stack's plan applied to a fresh control plane: CRDs, then its objects (dry run first), then nodes."""
    with running_cluster(request.param, tmp_path_factory.mktemp(f"e2e-{request.param}")) as c:
        yield c


@contextlib.contextmanager
def running_cluster(stack: str | Path, work: Path) -> Iterator[Cluster]:
    """A stack of stacks/ (by name) or a spec file, planned with the real command line and applied to a fresh
    control plane; stopped afterwards."""
    missing = missing_tools()
    if missing:
        message = f"control-plane tools missing ({', '.join(missing)}): run `make e2e-tools`"
        pytest.fail(message) if REQUIRED else pytest.skip(message)
    plan = plan_stack(stack, work / "plan")
    cp = ControlPlane(plan.kueue_config(), work / "cp")
    try:
        cp.start()
        cp.apply_files(external_crds())
        cp.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
        # What the stack expects to exist already: the Prometheus Operator stack's namespace.
        if plan.spec.kubernetes.monitoring.enabled:
            cp.kubectl("create", "namespace", plan.spec.kubernetes.monitoring.namespace)
        # The GPU Operator's RuntimeClass (its ClusterPolicy's operator.runtimeClass), which the operator creates
        # at run time rather than its chart: the NVML detector's pods run in it.
        gpu_monitor = plan.spec.kubernetes.health.gpu_monitor
        if plan.spec.kubernetes.health.enabled and gpu_monitor.enabled:
            cp.apply_objects([{"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                               "metadata": {"name": gpu_monitor.runtime_class}, "handler": "nvidia"}])
        mpi = plan.spec.kubernetes.mpi_operator
        if mpi.enabled:                 # the stack's ConfigFile: the CRD before the controller's objects
            cp.install_mpi_crd()
        c = Cluster(plan, cp)
        c.applied = apply_plan(cp, plan)
        c.set_nodes()
    except BaseException:              # whatever stopped the setup, the processes it started go with it
        cp.close()
        raise
    try:
        yield c
    finally:
        cp.close()


@contextlib.contextmanager
def dev_with_pool(work: Path, name: str, team_a_gpus: int, **pool: Any) -> Iterator[Cluster]:
    """The dev stack plus a pool of two more DGX hosts like its own (`pool`: what differs), team-a holding
    `team_a_gpus` of it, running on a fresh control plane."""
    data = copy.deepcopy(_DEV)
    data["sites"][0]["racks"][0]["pdu_capacity_kw"] = 60            # room for two more DGX hosts
    extra = copy.deepcopy(data["node_pools"][0])
    extra.update(name=name, **pool,
                 hosts=[{"hostname": f"gpu-dev-0{i}", "address": f"10.10.0.1{i}", "rack": "r01"} for i in (3, 4)])
    data["node_pools"].append(extra)
    data["tenants"][0]["gpu_quota"][name] = team_a_gpus
    # No MPIJob in what these clusters show: the MPI operator's CRD and objects stay out.
    data["kubernetes"]["mpi_operator"] = {"enabled": False}
    path = work / f"dev-{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with running_cluster(path, work) as c:
        c.clean()
        yield c


def apply_plan(cp: ControlPlane, plan: StackPlan) -> list[str]:
    """Server-side apply of every object of the plan, dry run then for real, batch by batch in dependency order."""
    applied = []
    for batch in ordered(plan.objects):
        if not batch:
            continue
        # The one change to the plan: the active health checks' CronJobs are suspended, so that the controller's
        # clock adds no check to a test's cluster; the tests create the Jobs of their template themselves.
        batch = [{**o, "spec": {**o["spec"], "suspend": True}} if o["kind"] == "CronJob" else o for o in batch]
        for dry_run in (True, False):
            proc = cp.apply_objects(batch, dry_run=dry_run, check=False)
            if proc.returncode != 0:
                raise AssertionError(f"{'dry-run ' if dry_run else ''}server-side apply of the {plan.stack} plan "
                                     f"refused:\n{proc.stderr}")
        applied += [f"{o['kind']}/{o['metadata'].get('namespace', '')}/{o['metadata']['name']}" for o in batch]
    return applied


@pytest.fixture
def clean(cluster: Cluster) -> Iterator[Cluster]:
    """The cluster with no tenant jobs, before and after the test; nodes as the spec has them."""
    cluster.clean()
    yield cluster
    cluster.clean()


ONE_STACK = "dev"


# first: xdist's own hook of the worker reads the groups into the test ids, and conftest hooks registered before it
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A `one_stack` test runs on dev's cluster alone: the scripts it runs are the same for every stack's pools,
    and its minutes are CI's (skipped before its fixtures start a job). Under `make e2e`'s workers
    (`--dist loadgroup`), tests that share what a machine holds once share a worker (`_worker_group`)."""
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_worker_group(item)))
        stack = getattr(getattr(item, "callspec", None), "params", {}).get("cluster")
        if item.get_closest_marker("one_stack") and stack not in (None, ONE_STACK):
            item.add_marker(pytest.mark.skip(reason=f"the same on every stack: shown on {ONE_STACK}"))


def pytest_collection_finish(session: pytest.Session) -> None:
    """A worker whose tests lost their groups would start a second set of clusters beside the first, which
    fails on the MPI operator's port: say why instead (pytest 9.2 with pytest-xdist 3.8, pytest-xdist#1386)."""
    if getattr(session.config.option, "loadgroup", False):
        ungrouped = [i.nodeid for i in session.items if "@" not in i.nodeid]
        if ungrouped:
            raise pytest.UsageError(f"--dist loadgroup: {len(ungrouped)} tests have no worker group (e.g. "
                                    f"{ungrouped[0]}): this pytest-xdist does not group on this pytest "
                                    "(pytest-xdist#1386); install the constraints.txt versions (make install)")


def _worker_group(item: pytest.Item) -> str:
    """A stack's cluster is set up once per worker that runs any of its tests: all of them on one worker.
    Slinky's tests run slurmrestd where the operator looks for it (localhost:6820): one worker. Any other module
    keeps its fixtures on one worker."""
    if "cluster" in getattr(item, "fixturenames", ()):
        return f"stack-{item.callspec.params['cluster']}"
    module = item.module.__name__ if item.module else item.nodeid
    return "slinky" if module.rsplit(".", 1)[-1].startswith("test_slurm") else module


def pytest_report_header(config: pytest.Config) -> list[str]:
    missing = missing_tools()
    return [f"e2e control plane: {'tools missing: ' + ', '.join(missing) if missing else 'tools ready'}; "
            f"stacks: {', '.join(STACKS)}"]

