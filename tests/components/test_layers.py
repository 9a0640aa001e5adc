"""The house's import graph: each module imports only from its own room or the rooms below it, so a newcomer
reads the library bottom up and no change to a lower room has to know a higher one."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "components"

# Lowest first. Within a room, modules import each other freely.
LAYERS = [
    {"spec", "types", "yamltext", "bash", "records", "repos", "ssh", "stack_traces", "split"},  # the spec, the shell kit
    {"k8s.kit"},                      # k8s/*.py: charts, images, labels, objects, quantities, rails
    {"fabric", "storage"},            # what runs on hosts and switches, and the NCCL settings pods share
    {"k8s.tenancy"},                  # tenant namespaces, queues and job templates
    {"k8s.health"},                   # detection, active checks, quarantine
    {"k8s.slurm"},                    # Slurm through Slinky, its node check
    {"k8s.platform"},                 # the operators, Kueue, monitoring
    {"k8s.gpu_stack"}, {"k8s"},       # the stack that composes the rooms; the package's public face
    {"nodes", "validation"},          # host preparation and day 2, the after-apply suite: nothing in k8s reads them
    {"cluster"}, {"provider"},
    {"offline"}, {"cli"}, {"__main__", "components"},
]
RANK = {room: i for i, rooms in enumerate(LAYERS) for room in rooms}


def room(module: str) -> str:
    parts = module.split(".")[1:]
    if not parts:
        return "components"
    if parts[0] != "k8s":
        return parts[0]
    if len(parts) == 1:
        return "k8s"
    return f"k8s.{parts[1]}" if parts[1] in ("tenancy", "health", "slurm", "platform", "gpu_stack") else "k8s.kit"


def imports() -> list[tuple[str, str, int]]:
    """(importing module, imported module, line) for every import of the library by itself, lazy ones too."""
    out = []
    for path in ROOT.rglob("*.py"):
        parts = ["components", *path.relative_to(ROOT).with_suffix("").parts]
        package = parts[:-1] if parts[-1] != "__init__" else parts[:-1]
        module = ".".join(parts if parts[-1] != "__init__" else parts[:-1])
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package[:len(package) - node.level + 1]
                names = [node.module] if node.module else [a.name for a in node.names]
                out += [(module, ".".join(base + [n]), node.lineno) for n in names]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("components"):
                out.append((module, node.module, node.lineno))
            elif isinstance(node, ast.Import):
                out += [(module, a.name, node.lineno) for a in node.names if a.name.startswith("components")]
    return out


def test_every_room_has_a_place_in_the_layers():
    assert {room(m) for m, _, _ in imports()} <= set(RANK)


def upward(edges: list[tuple[str, str, int]]) -> list[str]:
    return [f"{m}:{line} imports {target} ({room(m)} is below {room(target)})"
            for m, target, line in edges if RANK[room(target)] > RANK[room(m)]]


def test_no_module_imports_from_a_room_above_its_own():
    found = upward(imports())
    assert not found, "\n".join(found)


def test_an_arrow_back_up_is_found():
    """The check itself: the fabric's NCCL check importing a tenant's job template, the kit a detector, a
    detector the host's burn-in script (it reads the verdict's names from records.py)."""
    assert upward([("components.fabric.checks", "components.k8s.tenancy.jobs", 17),
                   ("components.k8s.labels", "components.k8s.health.detector", 3),
                   ("components.k8s.health.detector", "components.nodes.burn_in", 29),
                   ("components.k8s.health.checks", "components.k8s.tenancy.jobs", 36)]) == [
        "components.fabric.checks:17 imports components.k8s.tenancy.jobs (fabric is below k8s.tenancy)",
        "components.k8s.labels:3 imports components.k8s.health.detector (k8s.kit is below k8s.health)",
        "components.k8s.health.detector:29 imports components.nodes.burn_in (k8s.health is below nodes)"]
