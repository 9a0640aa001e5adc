"""`gpucluster diff OLD_DIR NEW_DIR`: what changes between two offline plans."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..offline.diff import diff_outputs, diff_plans, load_plan, render_diff, unchanged_count
from ..spec import SpecError
from .common import EXIT_FAILED, EXIT_OK, report_bad_input

HELP = ("list resources added, removed and changed (field by field), and changed stack exports and component "
        "outputs, between two plan folders")


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("old", type=Path, metavar="OLD_DIR", help="plan folder before the change")
    parser.add_argument("new", type=Path, metavar="NEW_DIR", help="plan folder after the change")
    parser.add_argument("--exit-code", action="store_true", help="exit 1 when the plans differ (for CI gates)")


def run(args: argparse.Namespace) -> int:
    try:
        old, new = load_plan(args.old), load_plan(args.new)
    except SpecError as e:
        return report_bad_input(e)
    diffs, outputs = diff_plans(old, new), diff_outputs(old, new)
    print(render_diff(diffs, unchanged_count(old, new, diffs), outputs), end="")
    return EXIT_FAILED if (args.exit_code and (diffs or outputs)) else EXIT_OK
