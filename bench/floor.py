"""The floor: Pulumi's mock runtime registering the same resources as a plan (same types, names, parents and
inputs), with no library logic at all - the fastest any Pulumi program could register them.

python bench/floor.py build/STACK/resources.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pulumi

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from components.offline.runner import run_offline  # noqa: E402


def main(path: str) -> None:
    plan = json.loads(Path(path).read_text())
    records = [r for r in plan["resources"] if r["type"] != "pulumi:pulumi:Stack"]
    by_urn = {r["urn"]: r for r in records}

    def program() -> None:
        made: dict[str, pulumi.Resource] = {}

        def make(r: dict) -> pulumi.Resource:
            if r["urn"] in made:
                return made[r["urn"]]
            parent = make(by_urn[r["parent"]]) if r.get("parent") in by_urn else None
            opts = pulumi.ResourceOptions(parent=parent)
            if r["custom"]:
                made[r["urn"]] = pulumi.CustomResource(r["type"], r["name"], dict(r["inputs"]), opts)
            else:
                made[r["urn"]] = pulumi.ComponentResource(r["type"], r["name"], None, opts)
            return made[r["urn"]]

        for r in records:
            make(r)

    run = run_offline(program, project=plan["project"], stack=plan["stack"])
    print(json.dumps({"registered": len(run.records) - 1}))


if __name__ == "__main__":
    main(sys.argv[1])
