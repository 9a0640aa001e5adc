"""The library as a Pulumi component provider: GpuCluster for programs in any Pulumi language.

The Python SDK's component provider host (pulumi.provider.experimental) infers the package schema from type
annotations, so the hosted component takes a plain, documented TypedDict (pydantic models do not cross that
boundary) and converts it at the edge with the same loader, the same validation and the same messages as the
Python path. It registers the same children under the same type token as components.GpuCluster, through one
composition (cluster.compose), so a stack moved from one path to the other keeps its URNs. A bad spec is an
InputPropertiesError: the engine prints its message and the property it names, never a Python traceback.
The analyzer has no secret marker, so the schema's secret flags are set here (SECRETS).
"""

# No `from __future__ import annotations`: the analyzer reads the annotations as types, not strings.
import json
import re
import sys
from importlib import metadata
from typing import Any, Optional, TypedDict

import pulumi
from pulumi.errors import InputPropertiesError, InputPropertyError
from pulumi.provider import main
from pulumi.provider.experimental.component import ComponentProvider
from pulumi.provider.provider import ConstructResult
from pulumi.provider.server import ComponentInitError
from typing_extensions import NotRequired

from . import cluster
from .spec import ClusterSpec, SpecError, load_spec, parse_spec

PACKAGE = "gpucluster"


class GpuClusterArgs(TypedDict):
    """The inputs of a GpuCluster: its spec (a file or the text) and how to reach the hosts and the cluster."""

    spec_file: NotRequired[str]
    """Path of the cluster spec (YAML, as in the library's stacks/), relative to the program's directory. Give
    it or specYaml."""
    spec_yaml: NotRequired[str]
    """The cluster spec itself, as YAML or JSON text. Give it or specFile."""
    ssh_private_key: pulumi.Input[str]
    """Private key (OpenSSH or PEM) for SSH to the hosts, switches and storage servers; a secret."""
    kubeconfig: NotRequired[pulumi.Input[str]]
    """Kubeconfig (the content or a path) for kubectl where pulumi runs, which drains nodes in a rollout; give
    what the Kubernetes provider is given; a secret. Omitted: kubectl's own configuration."""
    kube_context: NotRequired[str]
    """Context of that kubeconfig. Omitted: its current context."""


class GpuCluster(pulumi.ComponentResource):
    """Everything a GPU cluster environment needs, built from one validated cluster spec: bare-metal GPU node
    pools prepared over SSH and burned in, the InfiniBand or RoCE fabric, a parallel filesystem, the
    Kubernetes GPU stack (GPU and Network Operators, Kueue, health, monitoring) and tenant namespaces."""

    gpus: pulumi.Output[int]
    """GPUs across every node pool."""
    flavors: pulumi.Output[dict[str, str]]
    """Kueue ResourceFlavor of each node pool, by pool name (what a workload's flavor selects)."""
    rdma_resource: pulumi.Output[Optional[str]]
    """The extended resource a pod asks for to use the fabric's RDMA devices; absent without RDMA."""
    networks: pulumi.Output[list[str]]
    """Secondary networks a pod lists in k8s.v1.cni.cncf.io/networks, in rail order."""
    nccl_env: pulumi.Output[dict[str, dict[str, str]]]
    """NCCL settings derived from the fabric, per node pool (what a job's pods set in their environment)."""
    tenant_namespaces: pulumi.Output[dict[str, str]]
    """Each tenant's namespace, by tenant name."""
    tenant_local_queues: pulumi.Output[dict[str, str]]
    """Each tenant's Kueue LocalQueue (a job's kueue.x-k8s.io/queue-name), by tenant name."""
    filesystem_claims: pulumi.Output[dict[str, list[str]]]
    """The parallel filesystem's PersistentVolumeClaims in each tenant's namespace, by tenant name."""
    filesystem_auth: pulumi.Output[Optional[str]]
    """BeeGFS's connection secret, for clients set up elsewhere; a secret. Absent on Lustre or without auth."""
    system_namespaces: pulumi.Output[list[str]]
    """Namespaces the platform keeps for itself, which no tenant may take."""
    spec_json: pulumi.Output[str]
    """The validated spec, defaults filled in, as JSON."""

    def __init__(self, name: str, args: GpuClusterArgs, opts: Optional[pulumi.ResourceOptions] = None):
        spec = spec_of(args)          # before anything registers: a bad spec leaves nothing half-made
        super().__init__(cluster.GpuCluster.TYPE, name, {"name": spec.name, "environment": spec.environment}, opts)
        cluster.compose(self, name, spec, args["ssh_private_key"], kubeconfig=args.get("kubeconfig"),
                        kube_context=args.get("kube_context"))
        self.gpus = pulumi.Output.from_input(spec.gpus)
        self.flavors = pulumi.Output.from_input(self.kubernetes.flavors)
        self.rdma_resource = pulumi.Output.from_input(self.kubernetes.rdma_resource)
        self.networks = pulumi.Output.from_input(self.kubernetes.networks)
        self.nccl_env = pulumi.Output.from_input(self.fabric.nccl_env)
        self.tenant_namespaces = pulumi.Output.from_input({n: t.namespace for n, t in self.tenants.items()})
        self.tenant_local_queues = pulumi.Output.from_input({n: t.local_queue for n, t in self.tenants.items()})
        claims = {t.name: [c[0] for c in spec.filesystem_claims(t)] for t in spec.tenants} \
            if self.storage is not None else {}
        self.filesystem_claims = pulumi.Output.from_input(claims)
        self.filesystem_auth = pulumi.Output.secret(self.storage.auth) \
            if self.storage is not None and self.storage.auth is not None else pulumi.Output.from_input(None)
        self.system_namespaces = pulumi.Output.from_input(sorted(spec.system_namespaces))
        self.spec_json = pulumi.Output.from_input(spec.model_dump_json())


def spec_of(args: GpuClusterArgs) -> ClusterSpec:
    """The validated spec of a GpuCluster's args; the loader's own problems, each naming the property."""
    given = [k for k in ("spec_file", "spec_yaml") if args.get(k) is not None]
    if len(given) != 1:
        raise InputPropertyError("specFile", "give the cluster spec as specFile (a path) or as specYaml (its "
                                             f"text), one of them{'; got both' if given else ''}")
    prop = "specFile" if given == ["spec_file"] else "specYaml"
    value = args[given[0]]            # type: ignore[literal-required]
    if not isinstance(value, str):
        raise InputPropertyError(prop, f"must be a plain string, got {type(value).__name__}")
    try:
        return load_spec(value) if prop == "specFile" else parse_spec(value, prop)
    except SpecError as e:
        raise InputPropertiesError(str(e), [{"property_path": prop, "reason": p} for p in e.problems]) from None


# Inputs and outputs the schema flags secret, by component: SDKs then wrap them as secrets on both sides.
SECRETS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "GpuCluster": (frozenset({"sshPrivateKey", "kubeconfig"}), frozenset({"filesystemAuth"})),
}
COMPONENTS: list[type[pulumi.ComponentResource]] = [GpuCluster]


class GpuClusterProvider(ComponentProvider):
    """The SDK's component provider, with the schema's secret flags and input errors reported as such."""

    def __init__(self, version: str):
        super().__init__(COMPONENTS, PACKAGE, version=version)
        schema = _flowed(json.loads(self.schema or "{}"))
        for component, (inputs, outputs) in SECRETS.items():
            resource = schema["resources"][f"{PACKAGE}:index:{component}"]
            for props, secret in ((resource["inputProperties"], inputs), (resource["properties"], outputs)):
                for prop in secret:
                    props[prop]["secret"] = True
        self.schema = json.dumps(schema)

    def construct(self, name: str, resource_type: str, inputs: pulumi.Inputs,
                  options: Optional[pulumi.ResourceOptions] = None) -> ConstructResult:
        try:
            return super().construct(name, resource_type, inputs, options)
        except ComponentInitError as e:
            if isinstance(e.inner, (InputPropertiesError, InputPropertyError)):
                raise e.inner from None        # the engine reports these by property, without a traceback
            raise


def _flowed(node: Any) -> Any:
    """Descriptions as flowing text: a docstring's line breaks and indentation are not Markdown's."""
    if isinstance(node, dict):
        return {k: " ".join(v.split()) if k == "description" and isinstance(v, str) else _flowed(v)
                for k, v in node.items()}
    return [_flowed(v) for v in node] if isinstance(node, list) else node


def semver(version: str) -> str:
    """The package's PEP 440 version as the semver a Pulumi schema needs (0.2.0.dev0 -> 0.2.0-dev.0)."""
    m = re.fullmatch(r"(\d+\.\d+\.\d+)(?:\.?(dev|a|b|rc)(\d+))?", version)
    if m is None:
        raise ValueError(f"version {version!r} is not X.Y.Z[.devN|aN|bN|rcN]")
    return m.group(1) + (f"-{m.group(2)}.{m.group(3)}" if m.group(2) else "")


def serve(args: list[str] | None = None) -> None:
    """Run the provider's gRPC server as the engine starts a plugin: `python <plugin dir> <engine address>`;
    it prints its port on stdout."""
    main(GpuClusterProvider(semver(metadata.version(PACKAGE))), sys.argv[1:] if args is None else args)
