"""`gpucluster plan|diff|check|schema|validate`: each subcommand is a module with `add_parser` and `run`."""

from __future__ import annotations

import argparse
import sys

from . import check, diff, plan, schema, validate

COMMANDS = {"plan": plan, "diff": diff, "check": check, "schema": schema, "validate": validate}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gpucluster", description="Plan, diff, check and validate GPU cluster environments offline.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in COMMANDS.items():
        module.add_parser(sub.add_parser(name, help=module.HELP, description=module.HELP))
    args = parser.parse_args(argv)
    return COMMANDS[args.command].run(args)


if __name__ == "__main__":
    sys.exit(main())
