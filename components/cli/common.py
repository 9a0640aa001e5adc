"""What the subcommands share: finding the project and a stack's spec, and reporting bad input."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..offline.runner import load_stack_config
from ..spec import SpecError

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


def add_project_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--project-dir", type=Path, default=Path("."),
                        help="folder holding Pulumi.yaml (default: the current folder)")


def project_dir(args: argparse.Namespace) -> Path:
    path: Path = args.project_dir
    if not (path / "Pulumi.yaml").exists():
        raise SpecError(str(path), [f"{path}: no Pulumi.yaml here; run from the project folder or pass --project-dir"])
    return path


def spec_path(args: argparse.Namespace) -> Path:
    """A stack name maps to its specFile config, else stacks/<stack>.yaml; a .yaml path is taken as is."""
    stack: str = args.stack
    if stack.endswith((".yaml", ".yml")):
        return Path(stack)
    root = project_dir(args)
    config = load_stack_config(root, stack)
    configured = config.values.get(f"{config.project}:specFile", "")
    return root / (configured or f"stacks/{stack}.yaml")


def report_bad_input(error: Exception) -> int:
    print(f"error: {error}", file=sys.stderr)
    return EXIT_BAD_INPUT
