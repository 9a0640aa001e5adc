"""`gpucluster plan STACK`: run the real program offline and write what it registers under build/STACK/."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..spec import SpecError, load_spec
from .common import (EXIT_FAILED, EXIT_OK, add_project_dir, is_spec_file, plain_secrets, project_dir,
                     report_bad_input, report_thresholds, spec_path, stack_name)

if TYPE_CHECKING:
    from ..offline.plan import Plan
    from ..offline.report import Thresholds
    from ..offline.runner import ProgramRun

HELP = "write the offline plan of a stack (resources, manifests, scripts) and print its summary"


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("stack", metavar="STACK", help="stack name (its spec is stacks/STACK.yaml unless "
                                                       "Pulumi.STACK.yaml sets specFile), or a spec file path, "
                                                       "planned as the stack its file name names")
    parser.add_argument("--out", type=Path, help="output folder (default: build/STACK under the project)")
    add_project_dir(parser)


def run(args: argparse.Namespace) -> int:
    planned = plan_stack(args)
    if isinstance(planned, int):
        return planned
    return EXIT_FAILED if planned.plan.errors else EXIT_OK


@dataclass
class Planned:
    root: Path
    stack: str
    run: ProgramRun
    plan: Plan
    out: Path
    thresholds: Thresholds


def plan_stack(args: argparse.Namespace) -> Planned | int:
    """Validate, run the program offline, write the plan and print its summary; an exit code on bad input."""
    from pulumi.errors import RunError

    from ..offline.plan import build_plan, write_plan         # Pulumi's SDK loads only when a plan is made
    from ..offline.runner import run_program
    try:
        root = project_dir(args)
        stack, path = stack_name(args), spec_path(args)
        spec = load_spec(path)          # bad input stops here, before anything runs
        for warning in plain_secrets(args, spec.environment):
            print(f"warning: {warning}", file=sys.stderr)
        result = run_program(root, stack, spec_file=path.resolve() if is_spec_file(args.stack) else None,
                             secrets=spec.secret_settings)
    except (SpecError, RunError) as e:      # a RunError: the program's own message, as the engine prints it
        return report_bad_input(e)
    yardsticks = report_thresholds(args)
    plan = build_plan(result, yardsticks)
    out = args.out or root / "build" / stack
    try:
        write_plan(plan, out)
    except FileExistsError as e:
        return report_bad_input(e)
    print(plan.summary, end="")
    print(f"\nWrote {len(plan.files)} files to {out}/ in {result.seconds:.2f}s of program time.")
    if plan.errors:
        print(f"error: the plan has {len(plan.errors)} error(s); see above", file=sys.stderr)
    return Planned(root, stack, result, plan, out, yardsticks)
