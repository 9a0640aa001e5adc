"""Type tokens: one per component, the same from Python and through the component provider.

A component provider serves one Pulumi module, `index` (the SDK's host refuses any other), so every component is
`gpucluster:index:<Name>` whichever language registers it: a stack keeps its URNs when a team moves from the
Python import to the provider, and policies match one token. Components first released under a module of their
own keep an alias to that token (MOVED), so a stack applied before the move updates in place, children included
(the engine carries a parent's aliases to its children), and the offline diff matches them the same way.
"""

from __future__ import annotations

import pulumi

PACKAGE = "gpucluster"

# Earlier type token -> today's, for components released before they moved to `index`.
MOVED: dict[str, str] = {
    "gpucluster:nodes:GpuNodePool": "gpucluster:index:GpuNodePool",
    "gpucluster:fabric:Fabric": "gpucluster:index:Fabric",
    "gpucluster:storage:ParallelFilesystem": "gpucluster:index:ParallelFilesystem",
    "gpucluster:k8s:GpuKubernetesStack": "gpucluster:index:GpuKubernetesStack",
    "gpucluster:k8s:Tenant": "gpucluster:index:Tenant",
}


def token(name: str) -> str:
    return f"{PACKAGE}:index:{name}"


def with_aliases(type_: str, opts: pulumi.ResourceOptions | None) -> pulumi.ResourceOptions:
    """`opts` with an alias from each earlier token of `type_`."""
    old = [pulumi.Alias(type_=before) for before, now in MOVED.items() if now == type_]
    return pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(aliases=old)) if old else \
        (opts or pulumi.ResourceOptions())


def urn_parts(urn: str) -> tuple[str, list[str], str]:
    """`urn:pulumi:STACK::PROJECT`, the type chain (every ancestor's type but the stack's, then its own) and the
    name, which may itself hold "::"."""
    stack, project, chain, name = urn.split("::", 3)
    return f"{stack}::{project}", chain.split("$"), name


def urn_of(head: str, types: list[str], name: str) -> str:
    return f"{head}::{'$'.join(types)}::{name}"


def moved_urn(urn: str) -> str:
    """A URN with each earlier component token in its type chain replaced by today's (what the aliases say)."""
    if urn.count("::") < 3:
        return urn
    head, types, name = urn_parts(urn)
    return urn_of(head, [MOVED.get(t, t) for t in types], name)
