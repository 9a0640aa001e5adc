"""What the subcommands share: finding the project and a stack's spec, and reporting bad input."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..offline.config import load_stack_config
from ..spec import SpecError

if TYPE_CHECKING:
    from ..offline.report import Thresholds

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
STACK_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


def add_project_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--project-dir", type=Path, default=Path("."),
                        help="folder holding Pulumi.yaml (default: the current folder)")


def project_dir(args: argparse.Namespace) -> Path:
    path: Path = args.project_dir
    if not (path / "Pulumi.yaml").exists():
        raise SpecError(str(path), [f"{path}: no Pulumi.yaml here; run from the project folder or pass --project-dir"])
    return path


def is_spec_file(stack: str) -> bool:
    return stack.endswith((".yaml", ".yml")) or "/" in stack


def stack_name(args: argparse.Namespace) -> str:
    """The stack a STACK argument names: itself, or for a spec file path its file name without the suffix
    (so `plan stacks/dev.yaml` plans stack dev, with Pulumi.dev.yaml's config, into build/dev)."""
    stack: str = args.stack
    name = Path(stack).stem if is_spec_file(stack) else stack
    if not STACK_RE.fullmatch(name):
        raise SpecError(stack, [f"{stack}: {name!r} is not a stack name (letters, digits, '-', '_', '.'); name the "
                                "stack, or a spec file whose name is one"])
    return name


def spec_path(args: argparse.Namespace) -> Path:
    """A stack name maps to its specFile config, else stacks/<stack>.yaml; a spec file path is taken as is."""
    stack: str = args.stack
    if is_spec_file(stack):
        return Path(stack)
    root = project_dir(args)
    config = load_stack_config(root, stack_name(args))
    configured = config.values.get(f"{config.project}:specFile", "")
    return root / (configured or f"stacks/{stack}.yaml")


def plain_secrets(args: argparse.Namespace, environment: str) -> list[str]:
    """Warnings for secrets written in plain text in Pulumi.<stack>.yaml: in dev a warning, elsewhere refused."""
    root = args.project_dir
    if not (root / "Pulumi.yaml").exists():       # a spec file checked outside a project has no stack settings
        return []
    stack = stack_name(args)
    keys = load_stack_config(root, stack).plain_secrets
    if not keys:
        return []
    path = root / f"Pulumi.{stack}.yaml"
    name = keys[0].split(":", 1)[-1]
    message = (f"{path}: {', '.join(keys)} is in plain text, readable by anyone with the repository; remove it and "
               f"set it with `pulumi config set --secret {name} < {'KEYFILE' if 'Key' in name else 'FILE'}`")
    if environment != "dev":
        raise SpecError(str(path), [f"{message} (refused in {environment})"])
    return [message]


def policy_settings(args: argparse.Namespace) -> tuple[list[Any], Path | None, dict[str, Any] | None]:
    """The pack's policies, and the stack's policy config: --policy-config, else policies/config/STACK.json."""
    from ..offline.policy import load_config, load_policies      # Pulumi's SDK only for the commands that run it
    root = project_dir(args)
    policies = load_policies(root)
    given = getattr(args, "policy_config", None)
    path = given or root / "policies" / "config" / f"{stack_name(args)}.json"
    config_file = path if (given or path.exists()) else None
    return policies, config_file, load_config(config_file, policies) if config_file else None


def report_thresholds(args: argparse.Namespace) -> Thresholds:
    """The plan report's yardsticks from the policy pack, or the report's own defaults without one."""
    from ..offline.policy import thresholds
    from ..offline.report import Thresholds
    try:
        policies, config_file, config = policy_settings(args)
    except SpecError:
        return Thresholds(source="the report's defaults (no policy pack here)")
    return thresholds(policies, config, f"policy config {config_file}" if config_file else
                      "the policy pack's defaults")


def report_bad_input(error: Exception) -> int:
    print(f"error: {error}", file=sys.stderr)
    return EXIT_BAD_INPUT
