"""The floor: Pulumi's mock runtime registering the same resources as a plan (same types, names, parents,
inputs and dependencies; the same outputs of components and of the stack) through the same SDK classes any
Pulumi program uses (pulumi-kubernetes, pulumi-command), with no library logic at all - the fastest a Pulumi
program could register them (../shared/reference/pulumi-offline.md, section 3, measures the same way).

python bench/floor.py build/STACK/resources.json
"""

from __future__ import annotations

import gc
import json
import re
import sys
from pathlib import Path
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
from pulumi.runtime import mocks, settings
from pulumi.runtime.stack import run_in_stack
from pulumi.runtime.sync_await import _sync_await
from pulumi_command import remote

KEY = pulumi.Output.secret("-----BEGIN OPENSSH PRIVATE KEY-----\n" + "A" * 400)
SECRET = "[secret]"
# API group -> pulumi-kubernetes module, where the SDK has typed classes for it
GROUPS = {"core": "core", "networking.k8s.io": "networking", "rbac.authorization.k8s.io": "rbac",
          "helm.sh": "helm", "apps": "apps", "batch": "batch", "storage.k8s.io": "storage"}


def snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


def typed_class(token: str) -> Any:
    """The SDK class for a kubernetes type token, or None for a custom resource."""
    _, group_version, kind = token.split(":")
    group, _, version = group_version.rpartition("/")
    module = getattr(k8s, GROUPS.get(group, ""), None)
    return getattr(getattr(module, version, None), kind, None) if module else None


def custom(r: dict, opts: pulumi.ResourceOptions) -> pulumi.Resource:
    inputs = dict(r["inputs"])
    if r["type"] == "command:remote:Command":
        conn = remote.ConnectionArgs(host=f"host-{r['name']}", port=22, user="root", private_key=KEY,
                                     dial_error_limit=10, per_dial_timeout=15)
        args = {snake(k): v for k, v in inputs.items() if k != "connection"}
        return remote.Command(r["name"], connection=conn, **args, opts=opts)
    cls = typed_class(r["type"])
    args = {snake(k): (KEY if v == SECRET else v) for k, v in inputs.items() if k not in ("apiVersion", "kind")}
    if cls is not None:
        return cls(r["name"], **args, opts=opts)
    if set(inputs) <= {"apiVersion", "kind", "metadata", "spec"}:
        return k8s.apiextensions.CustomResource(r["name"], api_version=inputs["apiVersion"], kind=inputs["kind"],
                                                metadata=inputs.get("metadata"), spec=inputs.get("spec"), opts=opts)
    return pulumi.CustomResource(r["type"], r["name"], inputs, opts)


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
            # The same edges: what it depends on explicitly and through its inputs (here plain values)
            edges = {*r.get("dependsOn", []), *(u for us in r.get("propertyDependencies", {}).values() for u in us)}
            opts = pulumi.ResourceOptions(parent=parent, depends_on=[make(by_urn[u]) for u in sorted(edges)
                                                                     if u in by_urn] or None)
            if r["custom"]:
                made[r["urn"]] = custom(r, opts)
            else:
                made[r["urn"]] = pulumi.ComponentResource(r["type"], r["name"], r.get("inputs") or None, opts)
            return made[r["urn"]]

        for r in records:
            make(r)
        for r in records:                     # what components register once their children are made
            if not r["custom"] and "outputs" in r:
                made[r["urn"]].register_outputs(r["outputs"])
        for key, value in plan.get("outputs", {}).items():
            pulumi.export(key, KEY if value == SECRET else value)

    class Echo(mocks.Mocks):
        def new_resource(self, args: mocks.MockResourceArgs) -> tuple[str, dict]:
            return f"{args.name}-id", args.inputs

        def call(self, args: mocks.MockCallArgs) -> dict:
            return {}

    # The SDK's own mock monitor, as a preview inside a fresh Stack, with the cyclic GC off: what the plan's
    # runner does, less its recording.
    monitor = mocks.MockMonitor(Echo())
    settings.ROOT.set(object())
    pulumi.runtime.set_mocks(monitor.mocks, project=plan["project"], stack=plan["stack"], preview=True,
                             monitor=monitor)
    settings.ROOT.set(None)
    gc.disable()
    _sync_await(run_in_stack(program))
    print(json.dumps({"registered": len(monitor.resources)}))


if __name__ == "__main__":
    main(sys.argv[1])
