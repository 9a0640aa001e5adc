"""The component provider, started as the engine starts a plugin (`python provider <engine address>`) and driven
over its real gRPC interface: GetSchema against Pulumi's published package metaschema, Construct against a
resource monitor served over gRPC (the offline plan's recorder, built on the SDK's MockMonitor), compared with
the Python import path for the same inputs."""

from __future__ import annotations

import json
import re
from importlib import metadata
import subprocess
import sys
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
from components.offline.recorder import STACK_TYPE, RecordingMonitor, redact
from components.offline.runner import run_offline
from components.provider import SECRETS, semver
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

    def construct(self, monitor: str, name: str, inputs: dict[str, Any]) -> provider_pb2.ConstructResponse:
        struct = struct_pb2.Struct()
        struct.update(inputs)          # plain values, a secret in its wire form (rpc.wrap_rpc_secret)
        return self.stub.Construct(provider_pb2.ConstructRequest(
            project=PROJECT, stack=STACK, dryRun=True, parallel=8, monitorEndpoint=monitor,
            type="gpucluster:index:GpuCluster", name=name, parent=STACK_URN, inputs=struct,
            organization="organization", accepts_output_values=False), timeout=300)

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
    assert set(resources) == {f"gpucluster:index:{c}" for c in SECRETS}
    for token, resource in resources.items():
        assert resource["isComponent"] and resource["description"]
        inputs, outputs = SECRETS[token.rsplit(":", 1)[1]]
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


def test_construct_registers_what_the_python_path_registers_for_the_same_spec(provider):
    spec_file = ROOT / "stacks" / "dev.yaml"
    spec = load_spec(spec_file)
    python = run_offline(lambda: GpuCluster(spec.name, spec, ssh_private_key=pulumi.Output.secret(KEY)),
                         project=PROJECT, stack=STACK)
    monitor = Monitor()
    server, address = _serve(resource_pb2_grpc.add_ResourceMonitorServicer_to_server, monitor)
    try:
        response = provider.construct(address, spec.name, {"specFile": str(spec_file),
                                                           "sshPrivateKey": rpc.wrap_rpc_secret(KEY)})
    finally:
        server.stop(0)
    monitor.recorder.finalize()
    assert response.urn == f"urn:pulumi:{STACK}::{PROJECT}::gpucluster:index:GpuCluster::{spec.name}"
    got, want = _records(monitor.recorder.records), _records(python.records)
    assert set(got) == set(want)
    assert [u for u in got if got[u] != want[u]] == []
    state = rpc.deserialize_properties(response.state, keep_unknowns=True)
    assert state["gpus"] == spec.gpus and state["flavors"] == {p.name: p.name for p in spec.node_pools}
    assert rpc.is_rpc_secret(state["filesystemAuth"])          # BeeGFS's connection secret goes out as one
    assert state["tenantLocalQueues"] == {t.name: "default" for t in spec.tenants} or state["tenantLocalQueues"]
    # The key came in as a secret and reaches every SSH connection as one (the connection holds it).
    commands = [r for r in monitor.recorder.records if r.type == "command:remote:Command"]
    assert commands and all(rpc.is_rpc_secret(r.inputs["connection"]) for r in commands)
    assert KEY not in json.dumps(redact([r.inputs for r in monitor.recorder.records]))



# --- bad args: the Python path's messages, by property, no traceback, nothing registered --------------------

def _refused(provider: Provider, inputs: dict[str, Any]) -> tuple[grpc.RpcError, Monitor]:
    monitor = Monitor()
    server, address = _serve(resource_pb2_grpc.add_ResourceMonitorServicer_to_server, monitor)
    try:
        with pytest.raises(grpc.RpcError) as refused:
            provider.construct(address, "bad", inputs)
    finally:
        server.stop(0)
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


# --- the examples --------------------------------------------------------------------------------------------

def test_the_yaml_example_uses_the_schemas_names_and_a_valid_spec(provider):
    """What Pulumi YAML binds against the schema: the type, every property given and every output read."""
    example = ROOT / "examples" / "pulumi-yaml"
    program = yaml.safe_load((example / "Pulumi.yaml").read_text())
    resources = provider.schema()["resources"]
    assert program["runtime"] == "yaml" and program["packages"] == {"gpucluster": "../../provider"}
    assert (example / program["packages"]["gpucluster"]).resolve() == ROOT / "provider"
    for name, resource in program["resources"].items():
        package, component = resource["type"].split(":")
        schema = resources[f"{package}:index:{component}"]
        given = resource["properties"]
        assert set(given) <= set(schema["inputProperties"]) and set(schema["requiredInputs"]) <= set(given)
        load_spec(example / given["specFile"])              # the spec it points at is valid, from there
    outputs = {re.fullmatch(r"\$\{cluster\.(\w+)\}", v).group(1) for v in program["outputs"].values()}
    assert outputs <= set(resources["gpucluster:index:GpuCluster"]["properties"])
