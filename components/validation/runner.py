"""Run the suite against a built cluster: apply, run the link scripts, wait, read back, judge."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from typing import Callable, Sequence

from ..fabric.checks import CHECKS_NAMESPACE
from ..yamltext import to_yaml_all
from .suite import SUITE_LABEL, Check, Result, judge, unique_manifests

MPI_LAUNCHER = "training.kubeflow.org/job-role=launcher"


@dataclass(frozen=True)
class Kubectl:
    """kubectl against one cluster; every call gets the kubeconfig, none inherits a context by accident."""
    kubeconfig: str
    binary: str = "kubectl"

    def __call__(self, *args: str, stdin: str | None = None, timeout_s: int = 300) -> subprocess.CompletedProcess:
        return subprocess.run([self.binary, "--kubeconfig", self.kubeconfig, *args], input=stdin, text=True,
                              capture_output=True, timeout=timeout_s)


def run_suite(checks: Sequence[Check], kubectl: Callable[..., subprocess.CompletedProcess],
              run_script: Callable[[str], subprocess.CompletedProcess], timeout_s: int) -> list[Result]:
    manifests = unique_manifests(checks)
    if manifests:
        applied = kubectl("apply", "-f", "-", stdin=to_yaml_all(manifests))
        if applied.returncode != 0:
            return [Result(c.name, False, "-", f"kubectl apply failed: {applied.stderr.strip()}")
                    for c in checks if c.manifests] + [_run_links(c, run_script) for c in checks if c.script]
    results = {c.name: _run_links(c, run_script) for c in checks if c.script}
    for c in checks:
        if not c.workload:
            continue
        kind, name = c.workload.split("/", 1)
        condition = "Succeeded" if kind == "mpijob" else "complete"
        waited = kubectl("wait", "-n", CHECKS_NAMESPACE, f"--for=condition={condition}", f"--timeout={timeout_s}s",
                         c.workload, timeout_s=timeout_s + 60)
        selector = f"training.kubeflow.org/job-name={name},{MPI_LAUNCHER}" if kind == "mpijob" else \
            f"{SUITE_LABEL}={name}"
        logs = kubectl("logs", "-n", CHECKS_NAMESPACE, "-l", selector, "--tail=-1", "--max-log-requests=4096")
        result = judge(c, logs.stdout, completed=waited.returncode == 0)
        if waited.returncode != 0 and result.passed:
            result = Result(c.name, False, result.measured, f"did not complete: {waited.stderr.strip()}")
        results[c.name] = result
    return [results[c.name] for c in checks if c.name in results]


def _run_links(check: Check, run_script: Callable[[str], subprocess.CompletedProcess]) -> Result:
    done = run_script(check.script or "")
    return judge(check, done.stdout + done.stderr, completed=done.returncode == 0)


def render_results(results: Sequence[Result]) -> str:
    rows = [("check", "result", "measured", "detail")] + \
        [(r.check, "pass" if r.passed else "FAIL", r.measured, r.detail) for r in results]
    widths = [max(len(row[i]) for row in rows[:]) for i in range(3)]
    lines = [f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:<{widths[2]}}  {d}" for a, b, c, d in rows]
    lines.insert(1, "  ".join("-" * w for w in widths) + "  ------")
    failed = sum(not r.passed for r in results)
    return "\n".join(lines) + f"\n\n{len(results) - failed} passed, {failed} failed\n"
