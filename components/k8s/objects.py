"""Register a rendered Kubernetes manifest as the matching pulumi-kubernetes resource.

Planners render plain manifests (camelCase dicts, exactly as applied), which keeps them testable and
validatable without Pulumi. This module is the one place that turns such a dict into a resource: the
typed class where pulumi-kubernetes has one, `apiextensions.CustomResource` otherwise.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import pulumi
import pulumi_kubernetes as k8s
from pulumi_kubernetes import _utilities as _k8s_utilities

_TYPED: dict[tuple[str, str], Any] = {
    ("v1", "Namespace"): k8s.core.v1.Namespace,
    ("v1", "ConfigMap"): k8s.core.v1.ConfigMap,
    ("v1", "LimitRange"): k8s.core.v1.LimitRange,
    ("v1", "ResourceQuota"): k8s.core.v1.ResourceQuota,
    ("v1", "PersistentVolume"): k8s.core.v1.PersistentVolume,
    ("v1", "PersistentVolumeClaim"): k8s.core.v1.PersistentVolumeClaim,
    ("v1", "ServiceAccount"): k8s.core.v1.ServiceAccount,
    ("rbac.authorization.k8s.io/v1", "Role"): k8s.rbac.v1.Role,
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): k8s.rbac.v1.RoleBinding,
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): k8s.rbac.v1.ClusterRole,
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): k8s.rbac.v1.ClusterRoleBinding,
    ("apps/v1", "Deployment"): k8s.apps.v1.Deployment,
    ("networking.k8s.io/v1", "NetworkPolicy"): k8s.networking.v1.NetworkPolicy,
}


class Manifest(NamedTuple):
    """A Kubernetes object and the role that names its Pulumi resource (`f"{component}-{role}"`)."""

    role: str
    obj: dict[str, Any]


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


def rbac_rule(groups: list[str], resources: list[str], verbs: list[str]) -> dict[str, Any]:
    """One PolicyRule of a Role or ClusterRole."""
    return {"apiGroups": groups, "resources": resources, "verbs": verbs}


class _WholeObject(pulumi.CustomResource):
    """A custom object with top-level fields besides `spec` (Kueue's WorkloadPriorityClass has `value`).

    apiextensions.CustomResource passes only apiVersion, kind, metadata and spec; the provider itself takes a
    resource's inputs as the whole object, so this registers the same type token with the whole body.
    """

    def __init__(self, name: str, obj: dict[str, Any], opts: pulumi.ResourceOptions):
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(version=_k8s_utilities.get_version()))
        super().__init__(f"kubernetes:{obj['apiVersion']}:{obj['kind']}", name, dict(obj), opts)


def register(name: str, obj: dict[str, Any], opts: pulumi.ResourceOptions,
             namespace: pulumi.Input[str] | None = None) -> pulumi.CustomResource:
    """Create the resource for `obj`; `namespace`, when given, replaces metadata.namespace with an Output
    so the object depends on its Namespace resource (an implicit, visible dependency)."""
    metadata = dict(obj["metadata"])
    if namespace is not None:
        metadata["namespace"] = namespace
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    cls = _TYPED.get((obj["apiVersion"], obj["kind"]))
    if cls is not None:
        # Nested values stay camelCase dicts: the SDK passes plain dicts to the provider unchanged.
        return cls(name, metadata=metadata, **{_snake(k): v for k, v in body.items()}, opts=opts)
    if set(body) <= {"spec"}:
        return k8s.apiextensions.CustomResource(name, api_version=obj["apiVersion"], kind=obj["kind"],
                                                metadata=metadata, spec=body.get("spec"), opts=opts)
    return _WholeObject(name, {**obj, "metadata": metadata}, opts)
