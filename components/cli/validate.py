"""`gpucluster validate STACK`: check a stack's spec without running the program."""

from __future__ import annotations

import argparse

from ..spec import SpecError, load_spec
from .common import EXIT_OK, add_project_dir, plain_secrets, report_bad_input, spec_path

HELP = "validate a stack's cluster spec and list every problem"


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("stack", metavar="STACK", help="stack name (stacks/STACK.yaml) or a spec file path")
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
    return EXIT_OK
