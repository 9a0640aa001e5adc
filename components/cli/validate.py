"""`gpucluster validate STACK`: check a stack's spec without running the program; with `--kubeconfig`, also
run the validation suite on the cluster it built and judge it."""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path
from typing import Any

from ..spec import SpecError, load_spec
from ..spec.common import shown, why
from ..spec.loader import read_bounded, read_mapping
from .common import EXIT_FAILED, EXIT_OK, add_project_dir, plain_secrets, report_bad_input, spec_path

HELP = ("validate a stack's cluster spec and list every problem; with --kubeconfig, run the validation suite "
        "(NCCL, ib_write_bw per rail, parallel storage read, DCGM diagnostics) on the built cluster")


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("stack", metavar="STACK", help="stack name (stacks/STACK.yaml) or a spec file path")
    parser.add_argument("--kubeconfig", help="the built cluster's kubeconfig: run the validation suite on it")
    parser.add_argument("--timeout", type=int, help="seconds each check may run (default: validation.timeout_s)")
    parser.add_argument("--kubectl", default="kubectl", help="kubectl to use (default: kubectl on PATH)")
    add_project_dir(parser)


def run(args: argparse.Namespace) -> int:
    try:
        path = spec_path(args)
        spec = load_spec(path, args.project_dir)
        warnings = plain_secrets(args, spec.environment) + spec.warnings()
    except SpecError as e:
        return report_bad_input(e)
    print(f"{path}: valid: cluster {spec.name} ({spec.environment}), {len(spec.node_pools)} node pool(s), "
          f"{spec.gpus} GPUs, {len(spec.tenants)} tenant(s)")
    for w in warnings:
        print(f"warning: {w}")
    if not args.kubeconfig:
        return EXIT_OK
    problems = _cluster_access(args)
    if problems:             # at once, not after every check has failed to reach the cluster
        return report_bad_input(SpecError(args.kubeconfig, problems, "the cluster access"))
    from ..validation import plan_suite                        # Kubernetes renderers only for a real run
    from ..validation.runner import Kubectl, render_results, run_suite
    checks = plan_suite(spec)
    timeout = args.timeout or spec.validation.timeout_s
    print(f"running {len(checks)} check(s) on the cluster in {args.kubeconfig} (up to {timeout} s each)")
    results = run_suite(checks, Kubectl(args.kubeconfig, args.kubectl),
                        lambda text: subprocess.run(["bash", "-c", text], capture_output=True, text=True,
                                                    timeout=timeout),
                        timeout)
    print(render_results(results), end="")
    return EXIT_OK if all(r.passed for r in results) else EXIT_FAILED


MAX_KUBECONFIG_BYTES = 1 << 20


def _cluster_access(args: argparse.Namespace) -> list[str]:
    """What `--kubeconfig`, `--kubectl` and `--timeout` must be before any check runs: a kubectl that exists, a
    time that is one, and a kubeconfig that names a cluster other than kubectl's localhost:8080 fallback (which
    it uses, silently, for a file that holds no cluster)."""
    out = []
    if args.timeout is not None and not 0 < args.timeout <= 86400:
        out.append(f"--timeout: {args.timeout} is not a number of seconds a check may run; give 1 to 86400")
    if shutil.which(args.kubectl) is None:
        out.append(f"--kubectl: {args.kubectl!r} is not an executable on PATH; install kubectl or pass its path")
    path = Path(args.kubeconfig)
    fix = "give the kubeconfig of the cluster `pulumi up` built"
    try:
        doc: Any = read_mapping(read_bounded(path, "a kubeconfig", MAX_KUBECONFIG_BYTES), str(path),
                                "apiVersion, kind: Config, clusters, contexts")[0]
    except (OSError, ValueError) as e:       # ValueError: a NUL in the path
        return out + [f"{path}: cannot be read ({why(e)}); {fix}"]
    except SpecError as e:          # the spec loader's guards: not UTF-8, not YAML, aliases, nesting, keys twice
        return out + [f"{p}; {fix}" for p in e.problems]
    if not isinstance(doc, dict) or doc.get("kind", "Config") != "Config" or not isinstance(doc.get("clusters"), list):
        return out + [f"{path}: not a kubeconfig (no kind: Config with a list of clusters); {fix}"]

    def named(entries: Any, body: str) -> dict[str, Any]:
        return {e["name"]: e.get(body) for e in entries if isinstance(e, dict) and isinstance(e.get("name"), str)} \
            if isinstance(entries, list) else {}

    contexts, clusters = named(doc.get("contexts"), "context"), named(doc["clusters"], "cluster")
    current = doc.get("current-context")
    context = contexts.get(current) if isinstance(current, str) else None
    cluster = context.get("cluster") if isinstance(context, dict) else None
    if not isinstance(cluster, str) or cluster not in clusters:
        return out + [f"{path}: current-context {shown(current)} names no context with a cluster in the file, so "
                      "kubectl would fall back to localhost:8080; set current-context"]
    server = clusters[cluster].get("server") if isinstance(clusters[cluster], dict) else None
    if not isinstance(server, str) or not server.startswith("https://"):
        return out + [f"{path}: cluster {shown(cluster)} has server {shown(server)}; give the API server's https:// "
                      "address"]
    return out
