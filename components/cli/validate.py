"""`gpucluster validate STACK`: check a stack's spec without running the program; with `--kubeconfig`, also
run the validation suite on the cluster it built and judge it."""

from __future__ import annotations

import argparse
import subprocess

from ..spec import SpecError, load_spec
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
        spec = load_spec(path)
        warnings = plain_secrets(args, spec.environment) + spec.warnings()
    except SpecError as e:
        return report_bad_input(e)
    print(f"{path}: valid: cluster {spec.name} ({spec.environment}), {len(spec.node_pools)} node pool(s), "
          f"{spec.gpus} GPUs, {len(spec.tenants)} tenant(s)")
    for w in warnings:
        print(f"warning: {w}")
    if not args.kubeconfig:
        return EXIT_OK
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
