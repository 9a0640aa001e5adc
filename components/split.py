"""Split stacks (README): an environment as a platform stack and shard stacks of GPU pools, applied at once.

What a stack's `part` config may be, what the platform stack exports for its shards, and the check a shard
makes of it before it registers anything. GpuCluster composes each part (cluster.py).
"""

from __future__ import annotations

import hashlib
from typing import Any

import pulumi

from .spec import ClusterSpec
from .spec.cluster import PLATFORM

# The engine's builtin invoke behind StackReference (pkg/resource/deploy/builtins.go): {name} -> {name,
# outputs, secretOutputNames}.
READ_STACK_OUTPUTS = "pulumi:pulumi:readStackOutputs"


def spec_digest(spec: ClusterSpec) -> str:
    """What a shard compares with its platform's: the very spec both were applied from."""
    return hashlib.sha256(spec.model_dump_json().encode()).hexdigest()


# What the two settings are called where they are set: the stack's config, or GpuCluster's arguments.
CONFIG_NAMES = ("gpucluster:part", "gpucluster:platformStack")
ARGUMENT_NAMES = ("GpuCluster's part", "GpuCluster's platform")


def part_problem(spec: ClusterSpec, spec_file: str, part: str | None, platform: object | None,
                 names: tuple[str, str] = CONFIG_NAMES) -> str | None:
    """What is wrong with a stack's part and its platform stack (its name, or a StackReference) for its spec."""
    part_name, platform_name = names
    shards = [s.name for s in spec.shards]
    if part is None:
        return f"{platform_name} is set, but {part_name} is not: set the part this stack builds " \
               f"({PLATFORM} or a shard), or remove {platform_name}" if platform else None
    if part != PLATFORM and part not in shards:
        return (f"{part_name} is {part!r}, but {spec_file} has "
                + (f"the shards {', '.join(shards)}: use {PLATFORM} or one of them" if shards else
                   f"no shards: remove the setting, or add a shard named {part} to the spec's shards"))
    if part != PLATFORM and not platform:
        return (f"{part_name} is the shard {part!r}, which reads the platform stack: set {platform_name} to "
                + ("its name (organization/<project>/<stack> on a self-managed backend)" if names == CONFIG_NAMES
                   else "its StackReference"))
    if part == PLATFORM and platform:
        return f"{platform_name} is for a shard's stack: remove it from the platform stack"
    return None


def part_intent(spec: ClusterSpec, part: str | None, platform: pulumi.StackReference | None) -> dict[str, Any]:
    """Which part of a split environment a stack builds (none: the whole environment)."""
    if problem := part_problem(spec, "the spec", part, platform, ARGUMENT_NAMES):
        raise ValueError(problem)
    return {"part": part} if part else {}


def check_platform(spec: ClusterSpec, part: str, platform_stack: str) -> None:
    """Before a shard registers anything: its platform stack was applied, split, from this very spec. An `up`
    stops here otherwise (RunError); a preview says so and goes on, as a pull request's preview must.
    Synchronous (the engine's own readStackOutputs, as a StackReference reads), so nothing has started."""
    try:
        outputs = pulumi.runtime.invoke(READ_STACK_OUTPUTS, {"name": platform_stack}).value or {}
    except Exception as e:          # the engine's error names the stack; one line, no traceback
        raise pulumi.RunError(f"shard {part}: gpucluster:platformStack {platform_stack} cannot be read: "
                              f"{str(e).strip().splitlines()[-1]}") from None
    shared = (outputs.get("outputs") or {}).get("platform")
    stack = f"platform stack {platform_stack}"
    problem = (f"{stack} has no `platform` output: apply it first with `gpucluster:part` {PLATFORM}"
               if not isinstance(shared, dict) or shared.get("part") != PLATFORM else
               f"{stack} was last applied from another version of the spec: apply it first, then the shards"
               if shared.get("spec_digest") != spec_digest(spec) else None)
    if problem is None:
        return
    if pulumi.runtime.is_dry_run():
        pulumi.log.warn(f"shard {part}: {problem} (`pulumi up` stops here until then)")
        return
    raise pulumi.RunError(f"shard {part}: {problem}")


def platform_exports(spec: ClusterSpec, storage_auth: pulumi.Input[str] | None) -> dict[str, Any]:
    """The platform stack's outputs its shards read (`check_platform`; BeeGFS's connection secret)."""
    return {"platform": {"part": PLATFORM, "spec_digest": spec_digest(spec),
                         "shards": {s.name: list(s.node_pools) for s in spec.shards}},
            **({"storageAuth": storage_auth} if storage_auth is not None else {})}
