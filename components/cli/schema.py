"""`gpucluster schema`: the JSON Schema of ClusterSpec, which the stacks' YAML files point editors at."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..spec import ClusterSpec
from .common import EXIT_OK

HELP = "print (or write) the JSON Schema of the cluster spec"


def render_schema() -> str:
    schema = ClusterSpec.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "gpucluster ClusterSpec"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, help="write to this file instead of standard output")


def run(args: argparse.Namespace) -> int:
    text = render_schema()
    if args.out:
        args.out.write_text(text, encoding="utf-8")
        print(f"wrote {args.out}")
    else:
        print(text, end="")
    return EXIT_OK
