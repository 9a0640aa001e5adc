"""The library as a Pulumi component provider: its components for programs in any Pulumi language.

The Python SDK's component provider host (pulumi.provider.experimental) infers the package schema from type
annotations, so each hosted component takes a plain, documented TypedDict (pydantic models do not cross that
boundary) and converts it at the edge with the same loader, the same validation and the same messages as the
Python path. It registers the same children under the same type token as the Python component, through the
same function (each module's `compose`), so a stack moved from one path to the other keeps its URNs. A bad
input is an InputPropertiesError: the engine prints its message and the property it names, never a Python
traceback. The analyzer has no secret marker, so the schema's secret flags are set here (SECRETS).
"""

# No `from __future__ import annotations`: the analyzer reads the annotations as types, not strings.
import json
import re
import sys
from importlib import metadata
from typing import Any, Callable, Optional, TypedDict

import pulumi
from pulumi.errors import InputPropertiesError, InputPropertyError
from pulumi.provider import main
from pulumi.provider.experimental.component import ComponentProvider
from pulumi.provider.experimental.util import camel_case
from pulumi.provider.provider import ConstructResult
from pulumi.provider.server import ComponentInitError
from typing_extensions import NotRequired

from . import cluster
from .fabric import fabric
from .k8s import gpu_stack
from .k8s.tenancy import tenant as k8s_tenant
from .nodes import NodePoolArgs, node_pool
from .spec import ClusterSpec, SpecError, Tenant as TenantSpec, load_spec, parse_spec
from .spec.loader import located_error, read_object
from .spec.tenants import Tenancy, no_directories, tenancy_problems
from .spec.slurm import directory_password_problem
from .storage import filesystem
from .types import PACKAGE, token, with_aliases



class SpecArgs(TypedDict):
    """The cluster spec a component is built from: a file or its text."""

    spec_file: NotRequired[str]
    """Path of the cluster spec (YAML, as in the library's stacks/), relative to the program's directory. Give
    it or specYaml."""
    spec_yaml: NotRequired[str]
    """The cluster spec itself, as YAML or JSON text (a GpuCluster's specJson is one). Give it or specFile."""


class GpuKubernetesStackArgs(SpecArgs):
    """A cluster spec, and the secrets its Kubernetes stack needs beyond it."""

    slurm_directory_password: NotRequired[pulumi.Input[str]]
    """Password of the Slurm login set's directory account (kubernetes.slurm.login.directory.bind_dn); a
    secret. Omitted: none, which a spec with a bind_dn refuses."""


class HostsArgs(SpecArgs):
    """A cluster spec, and the key that reaches its hosts."""

    ssh_private_key: pulumi.Input[str]
    """Private key (OpenSSH or PEM) for SSH to the hosts, switches and storage servers; a secret."""


class ClusterAccessArgs(HostsArgs):
    """A cluster spec, and how to reach its hosts and the cluster."""

    kubeconfig: NotRequired[pulumi.Input[str]]
    """Kubeconfig (the content or a path) for kubectl where pulumi runs, which drains nodes in a rollout; give
    what the Kubernetes provider is given; a secret. Omitted: kubectl's own configuration."""
    kube_context: NotRequired[str]
    """Context of that kubeconfig. Omitted: its current context."""


class StorageSecretArgs(SpecArgs):
    """A cluster spec, and the secret its site storage cluster's API user needs."""

    storage_api_password: NotRequired[pulumi.Input[str]]
    """Password of the storage cluster's API user (storage.weka.api_username, storage.scale.csi.gui_username),
    which WEKA's quotas and the CSI drivers log in with; a secret. Omitted: none, which a spec with such a user
    refuses."""


class ParallelFilesystemArgs(HostsArgs, StorageSecretArgs):
    """A cluster spec with a parallel filesystem, the key that reaches its hosts, and its storage secret."""


class GpuClusterArgs(ClusterAccessArgs, GpuKubernetesStackArgs, StorageSecretArgs):
    """The inputs of a GpuCluster: its spec (a file or the text), how to reach the hosts and the cluster, and
    the secrets of its Kubernetes stack and its storage cluster."""


class GpuNodePoolArgs(ClusterAccessArgs):
    """One node pool of a cluster spec, and how to reach its hosts and the cluster."""

    pool: str
    """The pool's name among the spec's node_pools."""


class TenantArgs(TypedDict):
    """One tenant, onboarded onto a platform whose facts it is given."""

    tenancy: pulumi.Input[dict[str, Any]]
    """What the platform tells its tenants: a GpuCluster's `tenancy` output, or the platform stack's `tenancy`
    export read through a StackReference."""
    tenant: dict[str, Any]
    """The tenant, with the fields of an entry of the cluster spec's `tenants` as stacks/*.yaml write them
    (snake_case): name, gpu_quota, groups and the rest (stacks/clusterspec.schema.json)."""


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
    tenancy: pulumi.Output[dict[str, Any]]
    """What tenants built apart from the platform need (a Tenant's `tenancy`; export it for other stacks)."""
    spec_json: pulumi.Output[str]
    """The validated spec, defaults filled in, as JSON."""

    def __init__(self, name: str, args: GpuClusterArgs, opts: Optional[pulumi.ResourceOptions] = None):
        spec = spec_of(args)          # before anything registers: a bad spec leaves nothing half-made
        ssh_key = _required(args, "ssh_private_key")
        password = _directory_password(spec, args)
        api_password = _storage_api_password(spec, args)
        super().__init__(cluster.GpuCluster.TYPE, name, cluster.intent(spec), opts)
        cluster.compose(self, name, spec, ssh_key, kubeconfig=args.get("kubeconfig"),
                        kube_context=args.get("kube_context"), slurm_directory_password=password,
                        storage_api_password=api_password)
        self.gpus = pulumi.Output.from_input(spec.gpus)
        self.flavors = pulumi.Output.from_input(self.kubernetes.flavors)
        self.rdma_resource = pulumi.Output.from_input(self.kubernetes.rdma_resource)
        self.networks = pulumi.Output.from_input(self.kubernetes.networks)
        self.nccl_env = pulumi.Output.from_input(self.fabric.nccl_env)
        self.tenant_namespaces = pulumi.Output.from_input({n: t.namespace for n, t in self.tenants.items()})
        self.tenant_local_queues = pulumi.Output.from_input({n: t.local_queue for n, t in self.tenants.items()})
        self.filesystem_claims = pulumi.Output.from_input(claims_of(spec) if self.storage is not None else {})
        self.filesystem_auth = _secret(self.storage.auth if self.storage is not None else None)
        self.system_namespaces = pulumi.Output.from_input(sorted(spec.system_namespaces))
        self.tenancy = pulumi.Output.from_input(self.tenancy.model_dump(mode="json"))
        self.spec_json = pulumi.Output.from_input(spec.model_dump_json())


class GpuNodePool(pulumi.ComponentResource):
    """A pool of bare-metal GPU hosts: prepared over SSH (driver, fabric settings, container runtime), burned
    in, then labelled and tainted in Kubernetes; a change rolls through the pool in batches, each host drained
    first. Fabric settings of its hosts come from a Fabric over the same spec."""

    burn_in: pulumi.Output[dict[str, str]]
    """Burn-in verdict per host ("passed" or "failed: why"); "skipped" when the pool has no burn-in."""
    gpus: pulumi.Output[int]
    """GPUs in the pool."""
    hosts: pulumi.Output[list[str]]
    """The pool's hosts (their Kubernetes node names)."""

    def __init__(self, name: str, args: GpuNodePoolArgs, opts: Optional[pulumi.ResourceOptions] = None):
        spec = spec_of(args)
        ssh_key = _required(args, "ssh_private_key")
        pool = next((p for p in spec.node_pools if p.name == args.get("pool")), None)
        if pool is None:
            raise InputPropertyError("pool", f"the spec has no node pool {args.get('pool')!r}; its pools: "
                                             f"{', '.join(p.name for p in spec.node_pools)}")
        pool_args = NodePoolArgs.from_spec(spec, pool)
        super().__init__(node_pool.GpuNodePool.TYPE, name, node_pool.intent(pool_args),
                         with_aliases(node_pool.GpuNodePool.TYPE, opts))
        node_pool.compose(self, name, pool_args, ssh_key, kubeconfig=args.get("kubeconfig"),
                          kube_context=args.get("kube_context"))
        self.burn_in = pulumi.Output.from_input(self.burn_in)
        self.gpus = pulumi.Output.from_input(pool.gpus)
        self.hosts = pulumi.Output.from_input([h.hostname for h in pool.hosts])


class Fabric(pulumi.ComponentResource):
    """The InfiniBand or RoCEv2 fabric of a cluster spec: host settings (and subnet managers) on every host,
    switch settings on managed switches, over SSH; the NCCL settings and checks that match it."""

    nccl_env: pulumi.Output[dict[str, dict[str, str]]]
    """NCCL settings per node pool (also in /etc/nccl.conf on its hosts), for job templates."""
    topology: pulumi.Output[dict[str, Any]]
    """Rail-optimized or not, bisection bandwidth, and per leaf its links and oversubscription."""
    data_plane: pulumi.Output[dict[str, Any]]
    """MTU, RoCE priority, DSCP and PFC per pool's hosts and per managed switch; data and control interfaces."""
    checks: pulumi.Output[dict[str, str]]
    """Scripts and job specs to run after `pulumi up` (ib_write_bw per rail, multi-node all_reduce_perf)."""

    def __init__(self, name: str, args: HostsArgs, opts: Optional[pulumi.ResourceOptions] = None):
        spec = spec_of(args)
        ssh_key = _required(args, "ssh_private_key")
        super().__init__(fabric.Fabric.TYPE, name, fabric.intent(spec),
                         with_aliases(fabric.Fabric.TYPE, opts))
        fabric.compose(self, name, spec, ssh_key, gpu_hosts=True)
        for output in ("nccl_env", "topology", "data_plane", "checks"):
            setattr(self, output, pulumi.Output.from_input(getattr(self, output)))


class ParallelFilesystem(pulumi.ComponentResource):
    """The Lustre or BeeGFS filesystem of a cluster spec: servers and the GPU hosts' clients set up over SSH,
    its directories and quotas, and a PersistentVolume and claim per tenant that asks for one."""

    summary: pulumi.Output[dict[str, Any]]
    """Kind, version, mount point, manager, capacity and the expected aggregate read bandwidth against the GPUs."""
    claims: pulumi.Output[dict[str, list[str]]]
    """The PersistentVolumeClaims in each tenant's namespace, by tenant name."""
    auth: pulumi.Output[Optional[str]]
    """BeeGFS's connection secret, for clients set up elsewhere; a secret. Absent on Lustre or without auth."""

    def __init__(self, name: str, args: ParallelFilesystemArgs, opts: Optional[pulumi.ResourceOptions] = None):
        spec = spec_of(args)
        ssh_key = _required(args, "ssh_private_key")
        if spec.storage.kind == "none":
            raise InputPropertyError(_spec_property(args), "the spec's storage.kind is none: give a spec with a "
                                                           "parallel filesystem (storage.kind)")
        api_password = _storage_api_password(spec, args)
        super().__init__(filesystem.ParallelFilesystem.TYPE, name, filesystem.intent(spec),
                         with_aliases(filesystem.ParallelFilesystem.TYPE, opts))
        filesystem.compose(self, name, spec, ssh_key, host_ready=None, namespaces=None, api_password=api_password)
        self.summary = pulumi.Output.from_input(self.outputs)
        self.claims = pulumi.Output.from_input(claims_of(spec))
        self.auth = _secret(self.auth)


class GpuKubernetesStack(pulumi.ComponentResource):
    """What a GPU cluster needs on Kubernetes, from a cluster spec, in dependency order: Node Feature Discovery,
    the NVIDIA GPU and Network Operators, Kueue with a flavor per node pool, GPU health and quarantine, and
    monitoring."""

    flavors: pulumi.Output[dict[str, str]]
    """Kueue ResourceFlavor of each node pool, by pool name."""
    rdma_resource: pulumi.Output[Optional[str]]
    """The extended resource a pod asks for to use the fabric's RDMA devices; absent without the Network
    Operator."""
    networks: pulumi.Output[list[str]]
    """Secondary networks a pod lists in k8s.v1.cni.cncf.io/networks, in rail order."""

    def __init__(self, name: str, args: GpuKubernetesStackArgs, opts: Optional[pulumi.ResourceOptions] = None):
        spec = spec_of(args)
        password = _directory_password(spec, args)
        super().__init__(gpu_stack.GpuKubernetesStack.TYPE, name, gpu_stack.intent(spec),
                         with_aliases(gpu_stack.GpuKubernetesStack.TYPE, opts))
        gpu_stack.compose(self, name, spec, slurm_directory_password=password)
        for output in ("flavors", "rdma_resource", "networks"):
            setattr(self, output, pulumi.Output.from_input(getattr(self, output)))


class Tenant(pulumi.ComponentResource):
    """A tenant's namespace with RBAC, network isolation, limits and its Kueue queues, cut from the platform's
    pools. Its facts (pools, capacities, cohort, NCCL settings) may be another stack's output: the tenant is then
    built once they are known, so a preview before the platform exists shows no children."""

    namespace: pulumi.Output[str]
    """Name of the tenant's namespace."""
    local_queue: pulumi.Output[str]
    """LocalQueue jobs name in the `kueue.x-k8s.io/queue-name` label (also the namespace default)."""
    cluster_queue: pulumi.Output[str]
    """The tenant's ClusterQueue."""

    def __init__(self, name: str, args: TenantArgs, opts: Optional[pulumi.ResourceOptions] = None):
        tenant = tenant_of(args)
        tenancy = args.get("tenancy")
        # Built where the platform's facts are known: now, or in an apply once another stack's output is read.
        known = not isinstance(tenancy, pulumi.Output)
        built = tenant_args_of(tenancy, tenant) if known else \
            pulumi.Output.from_input(tenancy).apply(lambda t: tenant_args_of(t, tenant))
        intent = k8s_tenant.intent(built) if known else \
            {"spec": built.apply(lambda a: k8s_tenant.intent(a)["spec"])}
        super().__init__(k8s_tenant.Tenant.TYPE, name, intent, with_aliases(k8s_tenant.Tenant.TYPE, opts))
        if known:
            self.namespace, self.local_queue, self.cluster_queue = k8s_tenant.compose(self, name, built, ())
        else:
            queues = built.apply(lambda a: pulumi.Output.all(*k8s_tenant.compose(self, name, a, ())))
            self.namespace, self.local_queue, self.cluster_queue = (queues.apply(lambda q, i=i: q[i])
                                                                    for i in range(3))


# Inputs that are text, by their Python name: the property the engine names, and what else the text must be
# (a function giving the problem, or None).
_TEXT_INPUTS: dict[str, tuple[str, Callable[[str], Optional[str]] | None]] = {
    "spec_file": ("specFile", None), "spec_yaml": ("specYaml", None), "kube_context": ("kubeContext", None),
    "pool": ("pool", None), "ssh_private_key": ("sshPrivateKey", None), "kubeconfig": ("kubeconfig", None),
    "slurm_directory_password": ("slurmDirectoryPassword", directory_password_problem),
    "storage_api_password": ("storageApiPassword", None)}


def _text_inputs(args: SpecArgs) -> None:
    """Each text input a string (a secret: an Output of one) that passes its check, refused as an input error
    naming it otherwise; a bad value would fail deep inside a resource, reported as an unknown error. Checked in
    place: a secret's check runs when its value resolves, before anything reads it."""
    values: dict[str, Any] = args        # type: ignore[assignment]
    for key, (prop, check) in _TEXT_INPUTS.items():
        value = values.get(key)
        if value is None:
            continue
        if isinstance(value, pulumi.Output):
            values[key] = value.apply(lambda v, prop=prop, check=check: _text(prop, v, check))
        else:
            _text(prop, value, check)


def _text(prop: str, value: Any, check: Callable[[str], Optional[str]] | None) -> Any:
    if value is None:
        return value
    if not isinstance(value, str):
        raise InputPropertyError(prop, f"must be a string; got {type(value).__name__}")
    if check is not None and (problem := check(value)):
        raise InputPropertyError(prop, problem)
    return value


def _required(args: Any, key: str) -> Any:
    if args.get(key) is None:
        raise InputPropertyError(_TEXT_INPUTS[key][0], "required: give it")
    return args[key]


def spec_of(args: SpecArgs) -> ClusterSpec:
    """The validated spec of a component's args; the loader's own problems, each naming the property."""
    _text_inputs(args)
    given = [k for k in ("spec_file", "spec_yaml") if args.get(k) is not None]
    if len(given) != 1:
        raise InputPropertyError("specFile", "give the cluster spec as specFile (a path) or as specYaml (its "
                                             f"text), one of them{'; got both' if given else ''}")
    prop = _spec_property(args)
    value = args[given[0]]            # type: ignore[literal-required]
    if not isinstance(value, str):
        raise InputPropertyError(prop, f"must be a plain string known when the program starts (a path or the "
                                       f"text), not another resource's output; got {type(value).__name__}")
    try:
        return load_spec(value) if prop == "specFile" else parse_spec(value, prop)
    except SpecError as e:
        raise _refused(prop, e) from None


def tenant_of(args: TenantArgs) -> TenantSpec:
    """The tenant of a Tenant's args, checked as the tenants project checks its tenants."""
    try:
        tenant = read_object(args.get("tenant"), "tenant", TenantSpec, "the tenant")
        problems = list(no_directories([tenant], ()))
        if problems:
            raise located_error("tenant", [p._replace(loc=p.loc[1:]) for p in problems], {}, "the tenant")
    except SpecError as e:
        raise _refused("tenant", e) from None
    return tenant


def tenant_args_of(tenancy: Any, tenant: TenantSpec) -> k8s_tenant.TenantArgs:
    """The tenant's args on the platform `tenancy` describes; what that platform refuses of it, by property."""
    try:
        facts = read_object(tenancy, "tenancy", Tenancy, "the platform's tenancy")
    except SpecError as e:
        raise _refused("tenancy", e) from None
    problems = tenancy_problems(facts, [tenant])
    if problems:        # located like the tenant's own problems: tenants[0].gpu_quota.x is the tenant's gpu_quota.x
        raise _refused("tenant", located_error("tenant", [p._replace(loc=p.loc[2:]) for p in problems], {},
                                               "the tenant"))
    return k8s_tenant.TenantArgs.from_tenancy(facts, tenant)


def claims_of(spec: ClusterSpec) -> dict[str, list[str]]:
    return {t.name: [c[0] for c in spec.filesystem_claims(t)] for t in spec.tenants}


def _spec_property(args: SpecArgs) -> str:
    return "specYaml" if args.get("spec_yaml") is not None and args.get("spec_file") is None else "specFile"


def _refused(prop: str, e: SpecError) -> InputPropertiesError:
    return InputPropertiesError(str(e), [{"property_path": prop, "reason": p} for p in e.problems])


def _directory_password(spec: ClusterSpec, args: GpuKubernetesStackArgs) -> Optional[pulumi.Input[str]]:
    """The directory password, refused as an input error where the spec needs one and it is not given."""
    password = args.get("slurm_directory_password")
    if password is None and spec.kubernetes.slurm.secret_settings:
        raise InputPropertyError("slurmDirectoryPassword", "the spec's kubernetes.slurm.login.directory.bind_dn "
                                                           "needs its password: give slurmDirectoryPassword")
    return password             # its text checked by spec_of (_TEXT_INPUTS)


def _storage_api_password(spec: ClusterSpec, args: StorageSecretArgs) -> Optional[pulumi.Input[str]]:
    """The storage API user's password, refused as an input error where the spec needs one and it is not
    given, rather than failing on the cluster at apply."""
    password = args.get("storage_api_password")
    if password is None and spec.storage.secret_settings:
        raise InputPropertyError("storageApiPassword", "the spec's WEKA quotas or CSI driver log in as the storage "
                                                       "cluster's API user (storage.weka.api_username or storage."
                                                       "scale.csi.gui_username): give its password as "
                                                       "storageApiPassword")
    return password


def _secret(value: Optional[pulumi.Input[str]]) -> pulumi.Output[Optional[str]]:
    return pulumi.Output.secret(value) if value is not None else pulumi.Output.from_input(None)


# Inputs and outputs the schema flags secret, by component: SDKs then wrap them as secrets on both sides.
SECRETS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "GpuCluster": (frozenset({"sshPrivateKey", "kubeconfig", "slurmDirectoryPassword", "storageApiPassword"}),
                   frozenset({"filesystemAuth"})),
    "GpuKubernetesStack": (frozenset({"slurmDirectoryPassword"}), frozenset()),
    "GpuNodePool": (frozenset({"sshPrivateKey", "kubeconfig"}), frozenset()),
    "Fabric": (frozenset({"sshPrivateKey"}), frozenset()),
    "ParallelFilesystem": (frozenset({"sshPrivateKey", "storageApiPassword"}), frozenset({"auth"})),
}
COMPONENTS: list[type[pulumi.ComponentResource]] = [GpuCluster, GpuNodePool, Fabric, ParallelFilesystem,
                                                    GpuKubernetesStack, Tenant]
ARGS = [SpecArgs, GpuKubernetesStackArgs, HostsArgs, ClusterAccessArgs, StorageSecretArgs, ParallelFilesystemArgs,
        GpuClusterArgs, GpuNodePoolArgs, TenantArgs]


class GpuClusterProvider(ComponentProvider):
    """The SDK's component provider, with the schema's secret flags and input errors reported as such."""

    def __init__(self, version: str):
        super().__init__(COMPONENTS, PACKAGE, version=version)
        schema = json.loads(self.schema or "{}")
        # The analyzer reads an input's docstring in the args class analyzed, not in the base declaring it.
        docs = {camel_case(key): doc for args in ARGS for key in args.__annotations__
                if (doc := self.analyzer.get_docstring(args, key))}
        for component in COMPONENTS:
            resource = schema["resources"][token(component.__name__)]
            inputs, outputs = SECRETS.get(component.__name__, (frozenset(), frozenset()))
            for props, secret in ((resource["inputProperties"], inputs), (resource["properties"], outputs)):
                for prop in secret:
                    props[prop]["secret"] = True
            for prop, value in resource["inputProperties"].items():
                value.setdefault("description", docs.get(prop))
        self.schema = json.dumps(_flowed(schema))

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


def package_schema() -> str:
    """The schema GetSchema returns, as provider/schema.json keeps it for SDK generators (`make sdk`)."""
    return json.dumps(json.loads(GpuClusterProvider(semver(metadata.version(PACKAGE))).schema), indent=2) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] != ["schema"]:
        sys.exit("usage: python -m components.provider schema   (prints the package schema; `make sdk` keeps it "
                 "in provider/schema.json)")
    sys.stdout.write(package_schema())
