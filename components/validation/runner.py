"""Run the suite against a built cluster, one phase after another: apply, run the link scripts, wait, read
back, judge.

Phases run apart because their checks fight over the same hardware: DCGM diagnostics and NCCL each want every
GPU of a node, NCCL and the filesystem read the same NICs. Nodes are read first: what each offers pods, and
which of them can take a check's pods at all (the NCCL check runs on those, not on cordoned or quarantined
hosts it would wait for forever). A command that outlives its time is a failed check, never a traceback.
"""

from __future__ import annotations

import copy
import json
import subprocess
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

from ..fabric.checks import CHECKS_NAMESPACE
from ..k8s.labels import BURN_IN_TAINT, POOL_LABEL
from ..yamltext import to_yaml_all
from .suite import SUITE_LABEL, Check, Result, judge, unique_manifests

MPI_LAUNCHER = "training.kubeflow.org/job-role=launcher"
PHASES = ("nodes", "links", "dcgm", "nccl", "storage")
Run = Callable[..., subprocess.CompletedProcess]


@dataclass(frozen=True)
class Kubectl:
    """kubectl against one cluster; every call gets the kubeconfig, none inherits a context by accident."""
    kubeconfig: str
    binary: str = "kubectl"

    def __call__(self, *args: str, stdin: str | None = None, timeout_s: int = 300) -> subprocess.CompletedProcess:
        return subprocess.run([self.binary, "--kubeconfig", self.kubeconfig, *args], input=stdin, text=True,
                              capture_output=True, timeout=timeout_s)


def _bounded(call: Callable[[], subprocess.CompletedProcess], timeout_s: int) -> subprocess.CompletedProcess:
    """`call`, with a command that outlives its time as exit 124 and a line that says so."""
    try:
        return call()
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess([], 124, "", f"did not finish within {timeout_s} s")


def run_suite(checks: Sequence[Check], kubectl: Run, run_script: Callable[[str], subprocess.CompletedProcess],
              timeout_s: int) -> list[Result]:
    results: dict[str, Result] = {}
    nodes: dict[str, list[dict[str, Any]]] = {}
    for phase in PHASES:
        group = [c for c in checks if c.kind == phase]
        if phase == "nodes":
            for c in group:
                pool = c.workload.split("/", 1)[1]
                got = _bounded(lambda: kubectl("get", "nodes", "-l", f"{POOL_LABEL}={pool}", "-o", "json",
                                               timeout_s=120), 120)
                results[c.name] = judge(c, got.stdout if got.returncode == 0 else got.stderr)
                nodes[pool] = _items(got.stdout) if got.returncode == 0 else []
        elif phase == "links":
            results.update({c.name: _run_links(c, run_script, timeout_s) for c in group if c.script})
        else:
            results.update(_run_workloads(group, kubectl, timeout_s, nodes))
    return [results[c.name] for c in checks if c.name in results]


def _run_workloads(group: list[Check], kubectl: Run, timeout_s: int,
                   nodes: dict[str, list[dict[str, Any]]]) -> dict[str, Result]:
    results: dict[str, Result] = {}
    runnable = []
    for c in group:
        sized = _fit_to_schedulable(c, nodes) if c.kind == "nccl" else c
        if isinstance(sized, Result):
            results[c.name] = sized
        else:
            runnable.append(sized)
    manifests = unique_manifests(runnable)
    if not manifests:
        return results
    applied = _bounded(lambda: kubectl("apply", "-f", "-", stdin=to_yaml_all(manifests), timeout_s=300), 300)
    if applied.returncode != 0:
        return {**results, **{c.name: Result(c.name, False, "-", f"kubectl apply failed: {applied.stderr.strip()}")
                              for c in runnable}}
    for c in runnable:
        kind, name = c.workload.split("/", 1)
        condition = "Succeeded" if kind == "mpijob" else "complete"
        waited = _bounded(lambda: kubectl("wait", "-n", CHECKS_NAMESPACE, f"--for=condition={condition}",
                                          f"--timeout={timeout_s}s", c.workload, timeout_s=timeout_s + 60),
                          timeout_s + 60)
        selector = f"training.kubeflow.org/job-name={name},{MPI_LAUNCHER}" if kind == "mpijob" else \
            f"{SUITE_LABEL}={name}"
        logs = _bounded(lambda: kubectl("logs", "-n", CHECKS_NAMESPACE, "-l", selector, "--tail=-1",
                                        "--max-log-requests=4096", timeout_s=300), 300)
        result = judge(c, logs.stdout, completed=waited.returncode == 0)
        if waited.returncode != 0 and result.passed:
            result = Result(c.name, False, result.measured, f"did not complete: {waited.stderr.strip()}")
        results[c.name] = result
    return results


def _items(text: str) -> list[dict[str, Any]]:
    try:
        items = json.loads(text).get("items", [])
    except (ValueError, AttributeError):
        return []
    return [n for n in items if isinstance(n, dict)]


def schedulable(node: dict[str, Any]) -> bool:
    """Ready, not cordoned, not quarantined by its burn-in: a node a check's pod can start on now."""
    spec, status = node.get("spec") or {}, node.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    quarantined = any(t.get("key") == BURN_IN_TAINT and t.get("value") == "failed" for t in spec.get("taints") or [])
    return ready and not spec.get("unschedulable") and not quarantined


def _fit_to_schedulable(check: Check, nodes: dict[str, list[dict[str, Any]]]) -> Check | Result:
    """The NCCL check on the pool's schedulable nodes (at most as many as planned): an MPIJob waiting for a
    cordoned host never starts. Fewer than two is a failed check that names why."""
    job = next(m for m in check.manifests if m["kind"] == "MPIJob")
    pool = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["nodeSelector"][POOL_LABEL]
    if pool not in nodes:
        return check
    ready = sum(schedulable(n) for n in nodes[pool])
    planned = job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"]
    if ready < 2:
        return Result(check.name, False, "-", f"{ready} schedulable node(s) in pool {pool}: NCCL across nodes needs "
                                              "two (uncordon or repair them, then run again)")
    if ready >= planned:
        return check
    fitted = copy.deepcopy(job)
    fitted["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = ready
    return replace(check, manifests=[fitted if m is job else m for m in check.manifests],
                   what=f"{check.what} (on {ready} of {planned} nodes: the others are not schedulable)")


def _run_links(check: Check, run_script: Callable[[str], subprocess.CompletedProcess], timeout_s: int) -> Result:
    done = _bounded(lambda: run_script(check.script or ""), timeout_s)
    if done.returncode == 124 and not done.stdout:
        return Result(check.name, False, "-", f"the link check {done.stderr}")
    return judge(check, done.stdout + done.stderr, completed=done.returncode == 0)


def render_results(results: Sequence[Result]) -> str:
    rows = [("check", "result", "measured", "detail")] + \
        [(r.check, "pass" if r.passed else "FAIL", r.measured, r.detail) for r in results]
    widths = [max(len(row[i]) for row in rows[:]) for i in range(3)]
    lines = [f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:<{widths[2]}}  {d}" for a, b, c, d in rows]
    lines.insert(1, "  ".join("-" * w for w in widths) + "  ------")
    failed = sum(not r.passed for r in results)
    return "\n".join(lines) + f"\n\n{len(results) - failed} passed, {failed} failed\n"
