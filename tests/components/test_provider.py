"""The component provider, started as the engine starts a plugin (`python provider <engine address>`) and driven
over its real gRPC interface: GetSchema against Pulumi's published package metaschema, Construct against a
resource monitor served over gRPC (the offline plan's recorder, built on the SDK's MockMonitor), compared with
the Python import path for the same inputs."""

from __future__ import annotations

import contextlib
import json
import re
from importlib import metadata
import subprocess
import sys
import time
from concurrent import futures
from pathlib import Path
from typing import Any, Iterator

import grpc
import jsonschema
import pulumi
import pytest
import yaml
from google.protobuf import empty_pb2, struct_pb2
from pulumi.runtime import rpc
from pulumi.runtime.proto import (engine_pb2_grpc, errors_pb2, provider_pb2, provider_pb2_grpc, resource_pb2,
                                  resource_pb2_grpc, status_pb2)

from components import GpuCluster, SpecError, load_spec, parse_spec
from components.fabric import Fabric
from components.fabric.nccl import nccl_envs as fabric_nccl
from components.k8s.gpu_stack import GpuKubernetesStack
from components.k8s.tenancy.tenant import Tenant, TenantArgs, tenancy_of
from components.spec.tenants import tenancy_problems
from components.nodes import GpuNodePool, NodePoolArgs
from components.spec import Tenant as TenantSpec
from components.storage import ParallelFilesystem
from components.offline.recorder import STACK_TYPE, RecordingMonitor, redact
from components.offline.runner import run_offline
from components.provider import SECRETS, package_schema, semver
from tests.components.k8s.slurm_specs import with_slurm_pool
from tests.conftest import ROOT

# Pulumi's package metaschema (pkg/codegen/schema/pulumi.json of github.com/pulumi/pulumi/pkg/v3 v3.274.1, from
# the Go module proxy), pinned: the schema every SDK generator binds.
# Its patterns name groups as ECMA-262 and Go write them, `(?<name>`; Python's re spells the same group
# `(?P<name>`, so the patterns are read with that one spelling changed (no lookbehind is touched).
METASCHEMA = json.loads(re.sub(r"\(\?<(?![=!])", "(?P<",
                               (Path(__file__).parent / "pulumi_package_metaschema.json").read_text()))
PROJECT, STACK = "gpucluster", "dev"
STACK_URN = f"urn:pulumi:{STACK}::{PROJECT}::{STACK_TYPE}::{PROJECT}-{STACK}"
KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nnot-a-real-key\n-----END OPENSSH PRIVATE KEY-----\n"


class Engine(engine_pb2_grpc.EngineServicer):
    """What a provider asks of the engine while it constructs: where its log lines go."""

    def __init__(self) -> None:
        self.logs: list[str] = []

    def Log(self, request, context):
        self.logs.append(request.message)
        return empty_pb2.Empty()


class Monitor(resource_pb2_grpc.ResourceMonitorServicer):
    """The offline plan's recording monitor, over gRPC, with URNs as the engine builds them (every ancestor's
    type but the stack's) in the project and stack given here (a server thread has no runtime settings)."""

    def __init__(self) -> None:
        self.recorder = RecordingMonitor()
        self.recorder.make_urn = self._urn                       # type: ignore[method-assign]

    @staticmethod
    def _urn(parent: str, type_: str, name: str) -> str:
        qualified = parent.split("::")[2] if parent else STACK_TYPE
        if qualified != STACK_TYPE:
            type_ = f"{qualified}${type_}"
        return f"urn:pulumi:{STACK}::{PROJECT}::{type_}::{name}"

    def SupportsFeature(self, request, context):
        return resource_pb2.SupportsFeatureResponse(hasSupport=request.id != "outputValues")

    def RegisterResource(self, request, context):
        return self.recorder.RegisterResource(request)

    def RegisterResourceOutputs(self, request, context):
        return self.recorder.RegisterResourceOutputs(request)

    def ReadResource(self, request, context):
        return self.recorder.ReadResource(request)

    def Invoke(self, request, context):
        context.abort(grpc.StatusCode.UNIMPLEMENTED, f"no invoke offline: {request.tok}")

    def GetDeploymentInfo(self, request, context):
        return self.recorder.GetDeploymentInfo(request)

    def RegisterPackage(self, request, context):
        return self.recorder.RegisterPackage(request)

    def SignalAndWaitForShutdown(self, request, context):
        return empty_pb2.Empty()


def _serve(add, servicer) -> tuple[grpc.Server, str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    add(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


class Provider:
    """The plugin process, its engine and its stub."""

    def __init__(self, work: Path):
        self.engine = Engine()
        self.engine_server, address = _serve(engine_pb2_grpc.add_EngineServicer_to_server, self.engine)
        # The language host runs `python <plugin directory> <engine address>` in the program's directory.
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "provider"), address], cwd=work,
                                     stdout=subprocess.PIPE, stderr=(work / "provider.err").open("wb"))
        assert self.proc.stdout is not None
        port = self.proc.stdout.readline().decode().strip()
        assert port.isdigit(), (work / "provider.err").read_text()
        self.err = work / "provider.err"
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = provider_pb2_grpc.ResourceProviderStub(self.channel)

    def schema(self) -> dict[str, Any]:
        return json.loads(self.stub.GetSchema(provider_pb2.GetSchemaRequest(version=0)).schema)

    def construct(self, monitor: str, name: str, inputs: dict[str, Any], component: str = "GpuCluster",
                  dependencies: dict[str, list[str]] | None = None) -> provider_pb2.ConstructResponse:
        """A Construct as the engine sends it: plain values (numbers as doubles), a secret in its wire form
        (rpc.wrap_rpc_secret), and per input the URNs it depends on (another resource's output)."""
        struct = struct_pb2.Struct()
        struct.update(inputs)
        deps = {k: provider_pb2.ConstructRequest.PropertyDependencies(urns=v) for k, v in (dependencies or {}).items()}
        return self.stub.Construct(provider_pb2.ConstructRequest(
            project=PROJECT, stack=STACK, dryRun=True, parallel=8, monitorEndpoint=monitor,
            type=f"gpucluster:index:{component}", name=name, parent=STACK_URN, inputs=struct,
            inputDependencies=deps, organization="organization", accepts_output_values=False), timeout=300)

    def close(self) -> None:
        self.channel.close()
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.engine_server.stop(0)


@pytest.fixture(scope="module")
def provider(tmp_path_factory) -> Iterator[Provider]:
    p = Provider(tmp_path_factory.mktemp("program"))
    try:
        yield p
    finally:
        p.close()


# --- GetSchema --------------------------------------------------------------------------------------------

def test_the_schema_passes_pulumis_package_metaschema(provider):
    schema = provider.schema()
    jsonschema.Draft202012Validator(METASCHEMA).validate(schema)
    assert schema["name"] == "gpucluster" and schema["version"] == semver(metadata.version("gpucluster"))


def test_every_component_input_and_output_is_described_and_the_secrets_are_flagged(provider):
    resources = provider.schema()["resources"]
    assert set(resources) == {f"gpucluster:index:{c}" for c in ("GpuCluster", "GpuNodePool", "Fabric",
                                                                 "ParallelFilesystem", "GpuKubernetesStack", "Tenant")}
    for token, resource in resources.items():
        assert resource["isComponent"] and resource["description"]
        inputs, outputs = SECRETS.get(token.rsplit(":", 1)[1], (frozenset(), frozenset()))
        for props, secret in ((resource["inputProperties"], inputs), (resource["properties"], outputs)):
            for name, prop in props.items():
                assert prop.get("description") and "\n" not in prop["description"], (token, name)
                assert prop.get("secret", False) == (name in secret), (token, name)
    cluster = resources["gpucluster:index:GpuCluster"]
    assert cluster["requiredInputs"] == ["sshPrivateKey"]
    assert {"flavors", "rdmaResource", "tenantLocalQueues", "ncclEnv", "tenantNamespaces",
            "filesystemClaims", "filesystemAuth"} <= set(cluster["properties"])


@pytest.mark.parametrize("pep440, version", [("0.2.0", "0.2.0"), ("0.2.0.dev0", "0.2.0-dev.0"),
                                              ("1.0.0rc2", "1.0.0-rc.2"), ("1.10.3b1", "1.10.3-b.1")])
def test_the_packages_version_becomes_the_semver_a_schema_needs(pep440, version):
    assert semver(pep440) == version


def test_a_version_semver_cannot_carry_is_refused():
    with pytest.raises(ValueError, match="not X.Y.Z"):
        semver("1.0")


# --- Construct --------------------------------------------------------------------------------------------

def _records(run_records) -> dict[str, tuple]:
    return {r.urn: (r.type, r.custom, r.remote, r.parent, r.dependencies, redact(r.inputs, ordered=True))
            for r in run_records if r.type != STACK_TYPE}


@contextlib.contextmanager
def _monitor() -> Iterator[tuple[Monitor, str]]:
    """A resource monitor served over gRPC for one Construct, and its address."""
    monitor = Monitor()
    server, address = _serve(resource_pb2_grpc.add_ResourceMonitorServicer_to_server, monitor)
    try:
        yield monitor, address
    finally:
        server.stop(0)


def _constructed(provider: Provider, component: str, name: str, inputs: dict[str, Any],
                 dependencies: dict[str, list[str]] | None = None) -> tuple[provider_pb2.ConstructResponse, Monitor]:
    with _monitor() as (monitor, address):
        response = provider.construct(address, name, inputs, component, dependencies)
    monitor.recorder.finalize()
    return response, monitor


def test_construct_registers_what_the_python_path_registers_for_the_same_spec(provider):
    spec_file = ROOT / "stacks" / "dev.yaml"
    spec = load_spec(spec_file)
    python = run_offline(lambda: GpuCluster(spec.name, spec, ssh_private_key=pulumi.Output.secret(KEY)),
                         project=PROJECT, stack=STACK)
    response, monitor = _constructed(provider, "GpuCluster", spec.name,
                                     {"specFile": str(spec_file), "sshPrivateKey": rpc.wrap_rpc_secret(KEY)})
    assert response.urn == f"urn:pulumi:{STACK}::{PROJECT}::gpucluster:index:GpuCluster::{spec.name}"
    got, want = _records(monitor.recorder.records), _records(python.records)
    assert set(got) == set(want)
    assert [u for u in got if got[u] != want[u]] == []
    state = rpc.deserialize_properties(response.state, keep_unknowns=True)
    assert state["gpus"] == spec.gpus and state["flavors"] == {p.name: p.name for p in spec.node_pools}
    assert rpc.is_rpc_secret(state["filesystemAuth"])          # BeeGFS's connection secret goes out as one
    assert state["tenantLocalQueues"] == {t.name: "default" for t in spec.tenants} or state["tenantLocalQueues"]
    assert state["tenancy"] == tenancy_of(spec).model_dump(mode="json", exclude_none=True)   # the wire drops nulls
    # The key came in as a secret and reaches every SSH connection as one (the connection holds it).
    commands = [r for r in monitor.recorder.records if r.type == "command:remote:Command"]
    assert commands and all(rpc.is_rpc_secret(r.inputs["connection"]) for r in commands)
    assert KEY not in json.dumps(redact([r.inputs for r in monitor.recorder.records]))


# Each composable component from the same spec, as a program composing them would build it in Python.
PARTS: dict[str, Any] = {
    "GpuNodePool": lambda spec, key: GpuNodePool(f"{spec.name}-h100", NodePoolArgs.from_spec(spec, spec.node_pools[0]),
                                                 key),
    "Fabric": lambda spec, key: Fabric(f"{spec.name}-h100", spec, key),
    "ParallelFilesystem": lambda spec, key: ParallelFilesystem(f"{spec.name}-h100", spec, key),
    "GpuKubernetesStack": lambda spec, key: GpuKubernetesStack(f"{spec.name}-h100", spec),
}


@pytest.mark.parametrize("component", sorted(PARTS))
def test_each_component_registers_what_the_python_path_registers(provider, component):
    spec_file = ROOT / "stacks" / "dev.yaml"
    spec = load_spec(spec_file)
    python = run_offline(lambda: PARTS[component](spec, pulumi.Output.secret(KEY)), project=PROJECT, stack=STACK)
    inputs = {"specYaml": spec_file.read_text()}
    if component != "GpuKubernetesStack":
        inputs["sshPrivateKey"] = rpc.wrap_rpc_secret(KEY)
    if component == "GpuNodePool":
        inputs["pool"] = spec.node_pools[0].name
    response, monitor = _constructed(provider, component, f"{spec.name}-h100", inputs)
    assert response.urn == f"urn:pulumi:{STACK}::{PROJECT}::gpucluster:index:{component}::{spec.name}-h100"
    got, want = _records(monitor.recorder.records), _records(python.records)
    assert len(got) > 1 and set(got) == set(want)
    assert [u for u in got if got[u] != want[u]] == []
    state = rpc.deserialize_properties(response.state, keep_unknowns=True)
    if component == "GpuNodePool":
        assert state["gpus"] == spec.node_pools[0].gpus
        assert state["hosts"] == [h.hostname for h in spec.node_pools[0].hosts]
    elif component == "ParallelFilesystem":
        assert rpc.is_rpc_secret(state["auth"]) and state["summary"]["kind"] == "beegfs"
        assert state["claims"] == {t.name: [c[0] for c in spec.filesystem_claims(t)] for t in spec.tenants}
    elif component == "Fabric":
        assert state["ncclEnv"] == fabric_nccl(spec)
    else:
        assert state["flavors"] == {"h100": "h100"}
    assert KEY not in json.dumps(redact([r.inputs for r in monitor.recorder.records]))


NEW_TEAM = {"name": "vision", "groups": {"edit": ["oidc:vision"]}, "gpu_quota": {"h100": {"nominal": 0,
                                                                                         "borrowing_limit": 4}}}


@pytest.mark.parametrize("from_another_stack", [False, True], ids=["known", "another-stacks-output"])
def test_a_tenant_registers_what_the_python_path_registers_on_the_platforms_tenancy(provider, from_another_stack):
    """The platform's facts known when the program starts, or another resource's output (a StackReference):
    then the tenant is built once they are known, with the same children."""
    spec = load_spec(ROOT / "stacks" / "dev.yaml")
    tenancy = tenancy_of(spec)
    python = run_offline(lambda: Tenant("dev-vision", TenantArgs.from_tenancy(tenancy, TenantSpec(**NEW_TEAM))),
                         project=PROJECT, stack=STACK)
    reference = f"urn:pulumi:{STACK}::{PROJECT}::pulumi:pulumi:StackReference::platform"
    response, monitor = _constructed(
        provider, "Tenant", "dev-vision", {"tenancy": tenancy.model_dump(mode="json"), "tenant": NEW_TEAM},
        {"tenancy": [reference]} if from_another_stack else None)
    got, want = _records(monitor.recorder.records), _records(python.records)
    component = f"urn:pulumi:{STACK}::{PROJECT}::gpucluster:index:Tenant::dev-vision"
    if from_another_stack:         # the component waits on the stack it read the facts from, its children do not
        assert got[component][4] == [reference]
        got[component] = (*got[component][:4], [], got[component][5])
    assert len(got) > 5 and set(got) == set(want)
    assert [u for u in got if got[u] != want[u]] == []
    state = rpc.deserialize_properties(response.state, keep_unknowns=True)
    assert (state["namespace"], state["localQueue"]) == ("vision", "default")
    cq = next(r for r in python.records if r.name == "dev-vision-cq")
    assert state["clusterQueue"] == cq.inputs["metadata"]["name"]


# --- bad args: the Python path's messages, by property, no traceback, nothing registered --------------------

def _refused(provider: Provider, inputs: dict[str, Any], component: str = "GpuCluster",
             dependencies: dict[str, list[str]] | None = None) -> tuple[grpc.RpcError, Monitor]:
    """A Construct the provider refuses as an input error, reported without a traceback."""
    with _monitor() as (monitor, address), pytest.raises(grpc.RpcError) as refused:
        provider.construct(address, "bad", inputs, component, dependencies)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
    assert "Traceback" not in refused.value.details() + _property_errors(refused.value)
    return refused.value, monitor


def test_a_bad_spec_is_refused_with_the_loaders_message_and_nothing_registered(provider, dev_data):
    dev_data["kubernetes"]["health"] = {"gpu_monitor": {"temperature_for_s": 30}}
    text = yaml.safe_dump(dev_data, sort_keys=False)
    with pytest.raises(SpecError) as python:
        parse_spec(text, "specYaml")
    error, monitor = _refused(provider, {"specYaml": text, "sshPrivateKey": rpc.wrap_rpc_secret(KEY)})
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == str(python.value) and "Traceback" not in error.details()
    assert "kubernetes.health.gpu_monitor.temperature_for_s" in error.details()
    assert monitor.recorder.records == []


@pytest.mark.parametrize("inputs, reason", [
    ({}, "give the cluster spec as specFile (a path) or as specYaml (its text), one of them"),
    ({"specFile": "stacks/dev.yaml", "specYaml": "name: x"}, "one of them; got both"),
    ({"specFile": "no/such.yaml"}, "no/such.yaml: cannot read the spec")])
def test_a_missing_or_unreadable_spec_is_refused_naming_the_property(provider, inputs, reason):
    error, monitor = _refused(provider, {**inputs, "sshPrivateKey": rpc.wrap_rpc_secret(KEY)})
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "Traceback" not in error.details()
    assert reason in error.details() + _property_errors(error)
    assert monitor.recorder.records == []


def test_a_pool_the_spec_lacks_and_a_filesystem_it_lacks_are_refused_by_property(provider, dev_data):
    key = rpc.wrap_rpc_secret(KEY)
    error, monitor = _refused(provider, {"specFile": str(ROOT / "stacks" / "dev.yaml"), "sshPrivateKey": key,
                                        "pool": "a100"}, "GpuNodePool")
    assert _property_errors(error) == "pool: the spec has no node pool 'a100'; its pools: h100"
    assert monitor.recorder.records == []
    dev_data["storage"] = {"kind": "none"}
    dev_data["tenants"][1].pop("storage")
    error, monitor = _refused(provider, {"specYaml": yaml.safe_dump(dev_data), "sshPrivateKey": key},
                             "ParallelFilesystem")
    assert _property_errors(error).startswith("specYaml: the spec's storage.kind is none")
    assert monitor.recorder.records == []


@pytest.mark.parametrize("component", ["GpuCluster", "GpuKubernetesStack"])
def test_a_slurm_directory_account_needs_its_password_which_stays_a_secret(provider, dev_data, component):
    with_slurm_pool(dev_data)
    dev_data["kubernetes"]["slurm"]["login"] = {"directory": {
        "uris": ["ldaps://ldap.site.example"], "search_base": "dc=site,dc=example", "group_prefix": "oidc:",
        "bind_dn": "cn=sssd,dc=site,dc=example"}}
    inputs = {"specYaml": yaml.safe_dump(dev_data), "sshPrivateKey": rpc.wrap_rpc_secret(KEY)}
    if component == "GpuKubernetesStack":
        del inputs["sshPrivateKey"]
    error, monitor = _refused(provider, inputs, component)
    assert _property_errors(error).startswith("slurmDirectoryPassword: ") and monitor.recorder.records == []
    response, monitor = _constructed(provider, component, "dev", {
        **inputs, "slurmDirectoryPassword": rpc.wrap_rpc_secret("bind-pw-9")})
    bind = next(r for r in monitor.recorder.records if r.name.endswith("-slurm-login-directory"))
    assert rpc.is_rpc_secret(bind.inputs["stringData"])
    assert "bind-pw-9" not in json.dumps(redact([r.inputs for r in monitor.recorder.records]))


@pytest.mark.parametrize("component", ["GpuCluster", "ParallelFilesystem"])
def test_a_storage_api_user_needs_its_password_which_stays_a_secret(provider, dev_data, component):
    from tests.components.storage.client_specs import WEKA, with_storage
    data = with_storage(WEKA, dev_data)
    inputs = {"specYaml": yaml.safe_dump(data), "sshPrivateKey": rpc.wrap_rpc_secret(KEY)}
    error, monitor = _refused(provider, inputs, component)
    assert _property_errors(error).startswith("storageApiPassword: ") and monitor.recorder.records == []
    response, monitor = _constructed(provider, component, "dev", {
        **inputs, "storageApiPassword": rpc.wrap_rpc_secret("W3KA-API-pw-7")})
    secret = next(r for r in monitor.recorder.records if r.name.endswith("-csi-api-secret"))
    assert rpc.is_rpc_secret(secret.inputs["stringData"])
    quotas = next(r for r in monitor.recorder.records if r.name.endswith("-directories"))
    assert rpc.is_rpc_secret(quotas.inputs["stdin"])
    assert "W3KA-API-pw-7" not in json.dumps(redact([r.inputs for r in monitor.recorder.records]))

def _tenancy_problems(tenant: dict[str, Any]) -> list[str]:
    """What the tenants project says of this tenant on the dev platform (its own check, its own words)."""
    return [p.message for p in tenancy_problems(tenancy_of(load_spec(ROOT / "stacks" / "dev.yaml")),
                                                [TenantSpec(**tenant)])]


@pytest.mark.parametrize("from_another_stack", [False, True], ids=["known", "another-stacks-output"])
def test_a_tenant_the_platform_refuses_gets_the_tenants_projects_words_by_property(provider, from_another_stack):
    spec = load_spec(ROOT / "stacks" / "dev.yaml")
    team = {"name": "team-a", "gpu_quota": {"h100": {"nominal": 2}, "a100": {"nominal": 1}}}
    error, monitor = _refused(
        provider, {"tenancy": tenancy_of(spec).model_dump(mode="json"), "tenant": team}, "Tenant",
        {"tenancy": ["urn:pulumi:dev::gpucluster::pulumi:pulumi:StackReference::platform"]}
        if from_another_stack else None)
    reasons = _property_errors(error).splitlines()
    expected = _tenancy_problems(team)
    assert len(reasons) == len(expected) == 3
    for message in expected:       # namespace taken, no pool a100, 18 of 16 GPUs guaranteed
        assert any(r.startswith("tenant: tenant: ") and r.endswith(message) for r in reasons), (message, reasons)
    assert any(r.startswith("tenant: tenant: name: namespace 'team-a' is already taken") for r in reasons)
    assert not [r for r in monitor.recorder.records if r.custom]          # no Kubernetes object is made


@pytest.mark.parametrize("tenant, reason", [
    ({"name": "vision", "gpu_quota": {"h100": {"nominal": "four"}}},
     "tenant: gpu_quota.h100"),
    ({"name": "vision", "colour": "blue"}, "tenant: colour: unknown field"),
    ({"name": "vision", "storage": {"filesystem_gib": 100}},
     "tenant: storage.filesystem_gib: filesystem_gib 100 asks for a directory on the parallel filesystem"),
])
def test_a_bad_tenant_is_refused_with_the_loaders_message_and_nothing_registered(provider, tenant, reason):
    tenancy = tenancy_of(load_spec(ROOT / "stacks" / "dev.yaml")).model_dump(mode="json")
    error, monitor = _refused(provider, {"tenancy": tenancy, "tenant": tenant}, "Tenant")
    assert reason in _property_errors(error), _property_errors(error)
    assert monitor.recorder.records == []


def test_a_tenancy_of_another_shape_is_refused_naming_it(provider):
    error, monitor = _refused(provider, {"tenancy": {"cluster": "dev"}, "tenant": NEW_TEAM}, "Tenant")
    assert _property_errors(error).startswith("tenancy: tenancy: ")
    assert "pools" in _property_errors(error) and monitor.recorder.records == []


def _property_errors(error: grpc.RpcError) -> str:
    """The property errors the engine prints under the message (google.rpc.Status details, as the SDK packs
    them)."""
    out = []
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                errors = errors_pb2.InputPropertiesError()
                detail.Unpack(errors)
                out += [f"{e.property_path}: {e.reason}" for e in errors.errors]
    return "\n".join(out)


# --- the examples ----------------------------------------------------------------------------------------------

TS_EXAMPLE = ROOT / "examples" / "tenant-and-pool" / "typescript"
SDK = TS_EXAMPLE / "sdks" / "gpucluster"


@pytest.mark.parametrize("example", ["pulumi-yaml", "tenant-and-pool/yaml"])
def test_the_yaml_examples_use_the_schemas_names_and_valid_specs(provider, example):
    """What Pulumi YAML binds against the schema: each type, every property given and every output read; and
    what the provider checks of the values, checked here the same way."""
    directory = ROOT / "examples" / example
    program = yaml.safe_load((directory / "Pulumi.yaml").read_text())
    resources = provider.schema()["resources"]
    assert program["runtime"] == "yaml"
    assert (directory / program["packages"]["gpucluster"]).resolve() == ROOT / "provider"
    types = {}
    for name, resource in program["resources"].items():
        if not resource["type"].startswith("gpucluster:"):
            assert resource["type"] == "pulumi:pulumi:StackReference"
            continue
        package, component = resource["type"].split(":")
        types[name] = schema = resources[f"{package}:index:{component}"]
        given = resource["properties"]
        assert set(given) <= set(schema["inputProperties"]) and set(schema["requiredInputs"]) <= set(given)
        if "specFile" in given:
            spec = load_spec(directory / given["specFile"])          # valid, from the program's directory
            assert given.get("pool", spec.node_pools[0].name) in {p.name for p in spec.node_pools}
        if "tenant" in given:                                       # as the provider checks it, on dev's tenancy
            assert given["tenancy"] == '${platform.outputs["tenancy"]}'
            assert tenancy_problems(tenancy_of(load_spec(ROOT / "stacks" / "dev.yaml")),
                                    [TenantSpec(**given["tenant"])]) == []
    for value in program["outputs"].values():
        name, output = re.fullmatch(r"\$\{(\w+)\.(\w+)\}", value).groups()
        assert output in types[name]["properties"], value


def test_the_checked_in_schema_is_what_the_provider_serves():
    """provider/schema.json is what SDK generators read and what the checked-in TypeScript SDK was generated
    from; after a change to components/provider.py, `make sdk` writes both again."""
    assert (ROOT / "provider" / "schema.json").read_text() == package_schema(), "run `make sdk`"


def _ts_members(text: str, block: str, pattern: str) -> dict[str, bool]:
    body = re.search(block + r" \{\n(.*?)\n\}", text, re.S)
    assert body, block
    return {m.group(1): not m.group(2) for m in re.finditer(pattern, body.group(1), re.M)}


def test_the_checked_in_sdk_declares_every_component_input_and_output_of_the_schema():
    schema = json.loads((ROOT / "provider" / "schema.json").read_text())
    assert json.loads((SDK / "package.json").read_text())["version"] == schema["version"]
    for token, resource in schema["resources"].items():
        component = token.rsplit(":", 1)[1]
        text = (SDK / f"{component[0].lower()}{component[1:]}.ts").read_text()
        assert f"__pulumiType = '{token}'" in text and ", true /*remote*/);" in text
        inputs = _ts_members(text, f"export interface {component}Args", r"^    (\w+)(\?)?: ")
        assert inputs == {p: p in resource.get("requiredInputs", []) for p in resource["inputProperties"]}
        outputs = _ts_members(text, f"export class {component} extends pulumi.ComponentResource",
                              r"^    declare public /\*out\*/ readonly (\w+)(\?)?: ")
        assert set(outputs) == set(resource["properties"])


def _tsc(project: Path) -> subprocess.CompletedProcess:
    tsc = TS_EXAMPLE / "node_modules" / ".bin" / "tsc"
    assert tsc.exists(), f"{tsc} is missing: `make test` installs the example's packages (npm ci) first"
    return subprocess.run([str(tsc), "--noEmit", "-p", str(project)], capture_output=True, text=True, timeout=300)


def test_the_typescript_example_type_checks_against_the_generated_sdk():
    done = _tsc(TS_EXAMPLE)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_program_misnaming_an_input_or_leaving_one_out_fails_the_type_check(tmp_path):
    """The type check is real: the SDK's types refuse what the provider would refuse by property."""
    program = (TS_EXAMPLE / "index.ts").read_text()
    program = program.replace('    pool: "l40s",', '    pools: "l40s",')
    program = re.sub(r"    tenant: \{.*?\n    \},\n", "", program, flags=re.S)
    (tmp_path / "index.ts").write_text(program)
    config = json.loads((TS_EXAMPLE / "tsconfig.json").read_text())
    config["compilerOptions"].update(baseUrl=str(TS_EXAMPLE), paths={"*": ["node_modules/*"]},
                                     typeRoots=[str(TS_EXAMPLE / "node_modules" / "@types")])
    (tmp_path / "tsconfig.json").write_text(json.dumps(config))
    done = _tsc(tmp_path)
    assert done.returncode != 0
    assert "'pools' does not exist in type 'GpuNodePoolArgs'" in done.stdout, done.stdout
    assert "Property 'tenant' is missing" in done.stdout, done.stdout


@pytest.mark.parametrize("password", ["line\nbreak", " leading-space", ""])
def test_a_directory_password_sssd_cannot_carry_is_an_input_error_naming_it(provider, dev_data, password):
    with_slurm_pool(dev_data)
    dev_data["kubernetes"]["slurm"]["login"] = {"directory": {
        "uris": ["ldaps://ldap.site.example"], "search_base": "dc=site,dc=example", "group_prefix": "oidc:",
        "bind_dn": "cn=sssd,dc=site,dc=example"}}
    error, _ = _refused(provider, {"specYaml": yaml.safe_dump(dev_data),
                                   "slurmDirectoryPassword": rpc.wrap_rpc_secret(password)}, "GpuKubernetesStack")
    found = _property_errors(error)
    assert found.startswith("slurmDirectoryPassword: slurmDirectoryPassword is empty, starts or ends with a space, "
                            "or holds a control character"), found
    assert password.strip() not in found or not password.strip()


# --- any value in any input ---------------------------------------------------------------------------------------

from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

_WIRE = st.recursive(
    st.one_of(st.none(), st.booleans(), st.floats(allow_nan=False, allow_infinity=False, width=64),
              st.text(max_size=30), st.sampled_from(["", "/dev/zero", "stacks/../../etc/passwd", "line\nbreak",
                                                     "$(reboot)", "h100", "team-a", "stacks/dev.yaml"])),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=6)
_BASE = {"GpuCluster": {"specFile": str(ROOT / "stacks" / "dev.yaml"), "sshPrivateKey": KEY},
         "GpuKubernetesStack": {"specFile": str(ROOT / "stacks" / "dev.yaml")},
         "GpuNodePool": {"specFile": str(ROOT / "stacks" / "dev.yaml"), "pool": "h100", "sshPrivateKey": KEY}}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(component=st.sampled_from(sorted(_BASE)), data=st.data())
def test_any_value_in_any_input_is_registered_or_refused_naming_an_input_never_a_crash(provider, component, data):
    """Every input of the schema, one at a time, given a generated value as the engine sends it: the component
    is built, or refused as an input error naming a property (INVALID_ARGUMENT, no traceback), within 5 s, with
    nothing registered."""
    properties = sorted(provider.schema()["resources"][f"gpucluster:index:{component}"]["inputProperties"])
    prop = data.draw(st.sampled_from(properties), label="property")
    value = data.draw(_WIRE, label="value")
    inputs = {**_BASE[component], prop: value}
    for secret in ("sshPrivateKey", "kubeconfig", "slurmDirectoryPassword", "storageApiPassword"):
        if isinstance(inputs.get(secret), str):
            inputs[secret] = rpc.wrap_rpc_secret(inputs[secret])
    started = time.monotonic()
    with _monitor() as (monitor, address):
        try:
            provider.construct(address, "fuzzed", inputs, component)
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, (prop, value, e.code(), e.details()[:2000])
            found = _property_errors(e)
            assert found and "Traceback" not in e.details() + found, (prop, value, e.details()[:2000])
            assert monitor.recorder.records == [], (prop, value)
    assert time.monotonic() - started < 5, (prop, value)
