"""`gpucluster plan|diff|check|schema|validate`: each subcommand is a module with `add_parser` and `run`."""

from __future__ import annotations

import argparse
import gc
import os
import sys
from typing import NoReturn

from . import check, diff, plan, schema, validate

COMMANDS = {"plan": plan, "diff": diff, "check": check, "schema": schema, "validate": validate}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gpucluster", description="Plan, diff, check and validate GPU cluster environments offline.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in COMMANDS.items():
        module.add_parser(sub.add_parser(name, help=module.HELP, description=module.HELP))
    args = parser.parse_args(argv)
    # One short process: the cyclic GC would rescan the program's whole object graph (a tenth of a large
    # plan's time) and frees next to nothing before exit.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return COMMANDS[args.command].run(args)
    finally:
        if gc_was_enabled:
            gc.enable()


def entry() -> NoReturn:
    """The console script: `main`, then exit without the interpreter's teardown.

    Tearing down a large plan's heap (every Output, future and record the run made) takes up to a second and
    finalizes nothing the command needs: its files are written and closed, and its streams are flushed here.
    An exception still exits the usual way, with its traceback.
    """
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()
