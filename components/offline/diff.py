"""Compare two offline plans: what a spec change adds, removes and changes, field by field."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..spec import SpecError
from ..spec.loader import read_json
from ..types import moved_urn, urn_parts
from .recorder import COMPUTED

# Changes the engine records without running a step: the order things run in.
_ORDER_ONLY = ("dependsOn", "propertyDependencies")
# Fields whose change makes the provider replace the resource rather than update it in place.
_REPLACING = ("inputs.metadata.name", "inputs.metadata.namespace", "inputs.apiVersion", "inputs.kind")
# Kinds whose deletion lifts taints from nodes (a NodeReadinessRule's cleanup finalizer): replaced delete-first,
# every node they hold is free until the new one reconciles.
TAINT_OWNERS = ("NodeReadinessRule",)


@dataclass(frozen=True)
class Change:
    path: str
    old: Any
    new: Any


@dataclass(frozen=True)
class ResourceDiff:
    urn: str
    action: str                 # create | delete | update | replace | read | discard (reads change nothing)
    changes: tuple[Change, ...] = ()
    delete_first: bool = False  # a replacement that deletes the old object before it creates the new one


def load_plan(plan_dir: Path) -> dict[str, Any]:
    """A plan's resources.json, read with the spec loader's guards and checked for the shape `diff` reads, so a
    damaged file is named, not a traceback."""
    path = plan_dir / "resources.json"
    fix = f"run `gpucluster plan STACK --out {plan_dir}` again"
    plan = read_json(path, "a plan", fix, MAX_PLAN_BYTES)
    problem = _shape_problem(plan)
    if problem:
        raise SpecError(str(path), [f"{path}: not a plan written by `gpucluster plan`: {problem}; {fix}"], "a plan")
    return plan


MAX_PLAN_BYTES = 1 << 30        # a 4,096-host plan is about 0.55 GB (some 130 KB of scripts a host)


def _shape_problem(plan: Any) -> str | None:
    if not isinstance(plan, dict):
        return f"it holds a {type(plan).__name__}, not an object"
    if not isinstance(plan.get("resources"), list):
        return "it has no list of resources"
    if not isinstance(plan.get("outputs", {}), dict):
        return "its outputs are not an object"
    seen: set[str] = set()
    for i, r in enumerate(plan["resources"]):
        if not isinstance(r, dict) or not isinstance(r.get("urn"), str) or r["urn"].count("::") < 3:
            return f"resource {i} has no urn (urn:pulumi:STACK::PROJECT::TYPE::NAME)"
        if r["urn"] in seen:         # the engine refuses a URN twice; a diff would compare only one of them
            return f"{r['urn']} is listed twice"
        seen.add(r["urn"])
        for key in ("inputs", "options", "outputs", "propertyDependencies"):
            if not isinstance(r.get(key) if r.get(key) is not None else {}, dict):
                return f"the {key} of {r['urn']} are not an object"
        if not isinstance(r.get("dependsOn") if r.get("dependsOn") is not None else [], list):
            return f"the dependsOn of {r['urn']} is not a list"
        replace_on = (r.get("options") or {}).get("replaceOnChanges") or []
        if not isinstance(replace_on, list) or not all(isinstance(p, str) for p in replace_on):
            return f"the replaceOnChanges of {r['urn']} is not a list of property paths"
    return None


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> dict[str, Any]:
    if isinstance(value, dict) and value:
        for k, v in value.items():
            _flatten(v, f"{prefix}.{k}" if prefix else k, out)
    elif isinstance(value, list) and value:
        for i, v in enumerate(value):
            _flatten(v, f"{prefix}[{i}]", out)
    else:
        out[prefix] = value
    return out


def _comparable(entry: dict[str, Any]) -> dict[str, Any]:
    """What a change of makes a step; aliases only tell the engine the resource's earlier URN."""
    options = {k: v for k, v in (entry.get("options") or {}).items() if k != "aliases"}
    return {**{k: entry.get(k) for k in ("parent", "dependsOn", "propertyDependencies", "provider", "inputs")},
            "options": options}


def _replaces(entry: dict[str, Any], path: str) -> bool:
    """The provider's replaceOnChanges (e.g. a command's `triggers[*]`) also forces a replacement."""
    declared = (entry.get("options") or {}).get("replaceOnChanges") or []
    prefixes = _REPLACING + tuple(f"inputs.{p.split('[')[0]}" for p in declared)
    return "*" in declared or path.startswith(prefixes)


def _moved(entry: dict[str, Any]) -> dict[str, Any]:
    """A resource named as the aliases name it now, to match it across plans: a component whose type token
    moved keeps its state under the new URN, and so do its children."""
    deps = entry.get("propertyDependencies") or {}
    return {**entry, "parent": moved_urn(entry["parent"]) if entry.get("parent") else entry.get("parent"),
            "dependsOn": [moved_urn(u) for u in entry.get("dependsOn") or []],
            "propertyDependencies": {k: [moved_urn(u) for u in v] for k, v in deps.items()}}


def _keyed(plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {moved_urn(r["urn"]): _moved(r) for r in plan["resources"]}


def unchanged_count(old: dict[str, Any], new: dict[str, Any], diffs: list[ResourceDiff]) -> int:
    """Resources in both plans (matched as diff_plans matches them) that the diff leaves alone."""
    return len(_keyed(old).keys() & _keyed(new).keys()) - sum(d.action in ("update", "replace") for d in diffs)


def diff_plans(old: dict[str, Any], new: dict[str, Any]) -> list[ResourceDiff]:
    """What the engine would do: a read (Resource.get) that is new is read, one that is gone is discarded; a
    read neither creates nor deletes anything, and a read present in both is read again, not shown."""
    before, after = _keyed(old), _keyed(new)
    out = [ResourceDiff(before[u]["urn"], "discard" if before[u].get("read") else "delete")
           for u in sorted(before.keys() - after.keys())]
    out += [ResourceDiff(after[u]["urn"], "read" if after[u].get("read") else "create")
            for u in sorted(after.keys() - before.keys())]
    for urn in sorted(before.keys() & after.keys()):
        if after[urn].get("read"):
            continue
        a, b = _flatten(_comparable(before[urn]), "", {}), _flatten(_comparable(after[urn]), "", {})
        changes = tuple(Change(p, a.get(p), b.get(p)) for p in sorted(a.keys() | b.keys()) if a.get(p) != b.get(p))
        # Dependencies alone (the order things run in) are a same step: the engine records them, runs nothing.
        if any(not c.path.startswith(_ORDER_ONLY) for c in changes):
            action = "replace" if any(_replaces(after[urn], c.path) for c in changes) else "update"
            first = action == "replace" and bool((after[urn].get("options") or {}).get("deleteBeforeReplace"))
            out.append(ResourceDiff(after[urn]["urn"], action, changes, first))
    out += _waiting_on_unknowns(before, after, out)
    order = {"delete": 0, "discard": 0, "replace": 1, "update": 2, "create": 3, "read": 4}
    return sorted(out, key=lambda d: (order[d.action], d.urn))


def _waiting_on_unknowns(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]],
                         diffs: list[ResourceDiff]) -> list[ResourceDiff]:
    """Resources whose own inputs are the same in both plans but computed from the outputs of one that will run:
    the engine does not know those outputs before it runs (a command's stdout, a new resource's id; the
    Kubernetes provider previews an update by the server's dry run, so its outputs are known), so its preview
    shows them changing too, and the apply decides. Followed to the end of each chain."""
    actions = {moved_urn(d.urn): d.action for d in diffs}
    changing = set(actions)
    running = {u for u, action in actions.items() if u in after and (
        action in ("create", "replace") or after[u].get("type", "").startswith("command:"))}
    found: list[ResourceDiff] = []
    grew = bool(running)
    while grew:
        grew = False
        for urn in sorted((before.keys() & after.keys()) - changing):
            entry = after[urn]
            if entry.get("read"):
                continue
            waits = [(prop, moved_urn(dep)) for prop, deps in sorted((entry.get("propertyDependencies") or {}).items())
                     for dep in deps if moved_urn(dep) in running]
            computed = [(prop, path) for prop, dep in waits for path, value in
                        _flatten((entry.get("inputs") or {}).get(prop), f"inputs.{prop}", {}).items()
                        if value == COMPUTED]
            if not computed:
                continue
            ran: dict[str, list[str]] = {}
            for prop, dep in waits:
                ran.setdefault(prop, []).append(dep.rsplit("::", 1)[-1])
            changes = tuple(Change(path, COMPUTED, f"{COMPUTED}, known once {', '.join(ran[prop])} ran")
                            for prop, path in dict.fromkeys(computed))
            action = "replace" if any(_replaces(entry, c.path) for c in changes) else "update"
            found.append(ResourceDiff(entry["urn"], action, changes))
            changing.add(urn)
            if action == "replace" or entry.get("type", "").startswith("command:"):
                running.add(urn)
            grew = True
    return found


def diff_outputs(old: dict[str, Any], new: dict[str, Any]) -> list[Change]:
    """Stack exports and component outputs that change: a resource diff misses what the program derives and
    reports (topology, check plans, GPU counts), though reviewers and StackReferences read exactly that."""
    def values(plan: dict[str, Any]) -> dict[str, Any]:
        out = _flatten(plan.get("outputs") or {}, "exports", {})
        for r in plan["resources"]:
            if r.get("outputs"):
                _flatten(r["outputs"], f"{r['urn'].rsplit('::', 1)[-1]}.outputs", out)
        return out
    a, b = values(old), values(new)
    return [Change(p, a.get(p), b.get(p)) for p in sorted(a.keys() | b.keys()) if a.get(p) != b.get(p)]


_SIGN = {"create": "+", "delete": "-", "update": "~", "replace": "+-", "read": ">", "discard": "<"}


def _short(value: Any, limit: int = 80) -> str:
    text = "(absent)" if value is None else json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def taint_owner(urn: str) -> bool:
    return urn_parts(urn)[1][-1].split(":")[-1] in TAINT_OWNERS


def render_diff(diffs: list[ResourceDiff], unchanged: int, outputs: list[Change] | None = None) -> str:
    lines = []
    for d in diffs:
        _, types, name = urn_parts(d.urn)
        kind = types[-1]
        lines.append(f"{_SIGN[d.action]:<2} {d.action:<7} {kind} {name}")
        if d.delete_first and taint_owner(d.urn):
            lines.append(f"      !! deleted before its replacement is created: a {kind.split(':')[-1]} lifts its "
                         "taints from every node as it goes, and the nodes it holds (quarantined, reset pending) "
                         "take work until the new one reconciles")
        lines += [f"      {c.path}: {_short(c.old)} -> {_short(c.new)}" for c in d.changes]
    counts = {a: sum(d.action == a for d in diffs) for a in ("create", "update", "replace", "delete")}
    if outputs:
        lines.append("Outputs:")
        lines += [f"  ~ {c.path}: {_short(c.old)} -> {_short(c.new)}" for c in outputs]
    lines.append(f"{counts['create']} to create, {counts['update']} to update, {counts['replace']} to replace, "
                 f"{counts['delete']} to delete, {unchanged} unchanged"
                 + (f"; {len(outputs)} output value(s) change" if outputs else ""))
    return "\n".join(lines) + "\n"
