"""The Pulumi engine (the CLI, built from its Go module) running this repository's programs against the component
provider, for test_engine.py.

What the module proxy does not serve is stood in for, and nothing else: the kubernetes, command and random
provider plugins (EchoProvider: accepts what it is given, outputs its inputs, diffs by top-level property, and
registers its own components without children), and
the Python language host that would launch the component provider (the provider is started here, as that host
starts it, and the engine attaches to it through PULUMI_DEBUG_PROVIDERS; the SDK's provider server lacks the
Attach call that takes, so `attachable` adds it).
test_engine_python.py runs the project's own program with the real Python language host and Kubernetes provider;
there only command (commands.py) and random (EchoProvider) stand in.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
from concurrent import futures
from importlib import metadata
from pathlib import Path

import grpc
from google.protobuf import empty_pb2, json_format, struct_pb2
from pulumi.runtime.proto import plugin_pb2, provider_pb2, provider_pb2_grpc, resource_pb2, resource_pb2_grpc

# The plugin versions the SDKs pinned in constraints.txt ask the engine for.
PLUGINS = {"kubernetes": "4.34.2", "command": "1.2.1", "random": "4.21.4"}


class Plugin(provider_pb2_grpc.ResourceProviderServicer):
    """What every stand-in plugin answers alike: its version, and a configuration it takes as given."""

    def __init__(self, version: str):
        self.version = version

    def Handshake(self, request, context):
        return provider_pb2.ProviderHandshakeResponse(accept_secrets=True, accept_resources=True,
                                                      accept_outputs=True)

    def Attach(self, request, context):
        return empty_pb2.Empty()

    def GetPluginInfo(self, request, context):
        return plugin_pb2.PluginInfo(version=self.version)

    def CheckConfig(self, request, context):
        return provider_pb2.CheckResponse(inputs=request.news)

    def DiffConfig(self, request, context):
        return provider_pb2.DiffResponse()

    def Configure(self, request, context):
        return provider_pb2.ConfigureResponse(acceptSecrets=True, supportsPreview=True, acceptResources=True,
                                              acceptOutputs=True)

    def Check(self, request, context):
        return provider_pb2.CheckResponse(inputs=request.news)

    def Cancel(self, request, context):
        return empty_pb2.Empty()


class EchoProvider(Plugin):
    """A resource provider plugin that creates nothing: what it is given is what it outputs. A command's stdout
    is unknown in a preview and empty after `up`, as a command that printed nothing."""

    def __init__(self, version: str):
        super().__init__(version)
        self.created: list[str] = []

    def Diff(self, request, context):
        """By top-level input, against the inputs of the last update (what it computed is not an input)."""
        olds, news = json_format.MessageToDict(request.old_inputs), json_format.MessageToDict(request.news)
        changed = sorted(k for k in olds.keys() | news.keys() if olds.get(k) != news.get(k))
        return provider_pb2.DiffResponse(diffs=changed, changes=provider_pb2.DiffResponse.DIFF_SOME if changed
                                         else provider_pb2.DiffResponse.DIFF_NONE)

    def Create(self, request, context):
        props = struct_pb2.Struct()
        if not request.preview:      # what the real plugins compute: a command's output, a password
            props.update({"stdout": "", "stderr": ""})
            if request.type == "random:index/randomPassword:RandomPassword":
                props.update({"result": secrets.token_urlsafe(48)})
            self.created.append(request.urn)
        props.MergeFrom(request.properties)
        return provider_pb2.CreateResponse(id=request.urn.rsplit("::", 1)[-1], properties=props)

    def Read(self, request, context):
        """A refresh finds what it recorded (a password stays the one it made); a `get` of an object it never
        made finds one by that name."""
        if request.properties.fields:
            return provider_pb2.ReadResponse(id=request.id, properties=request.properties, inputs=request.inputs)
        props = struct_pb2.Struct()
        props.update({"metadata": {"name": request.id}, "spec": {}})
        return provider_pb2.ReadResponse(id=request.id, properties=props, inputs=request.inputs)

    def Update(self, request, context):
        return provider_pb2.UpdateResponse(properties=request.news)

    def Delete(self, request, context):
        return empty_pb2.Empty()

    def Construct(self, request, context):
        """A component of the plugin's own (kubernetes:yaml/v2:ConfigFile): registered, with no children, as
        the offline plan's mocks register it."""
        with grpc.insecure_channel(request.monitorEndpoint) as channel:
            monitor = resource_pb2_grpc.ResourceMonitorStub(channel)
            urn = monitor.RegisterResource(resource_pb2.RegisterResourceRequest(
                type=request.type, name=request.name, parent=request.parent, custom=False,
                object=struct_pb2.Struct(), dependencies=list(request.dependencies))).urn
            monitor.RegisterResourceOutputs(resource_pb2.RegisterResourceOutputsRequest(urn=urn,
                                                                                       outputs=struct_pb2.Struct()))
        return provider_pb2.ConstructResponse(urn=urn)


class Engine:
    """The real CLI on one project copy, with its own home and file backend, attached to the stand-ins."""

    def __init__(self, tools: Path, work: Path, project: Path, attach: dict[str, int]):
        self.tools, self.project = tools, project
        self.log: list[tuple[tuple[str, ...], int, str]] = []
        self.logs = work / "pulumi-output"
        self.env = {**os.environ, "PATH": f"{tools}:{os.environ['PATH']}", "PULUMI_HOME": str(work / "home"),
                    "PULUMI_BACKEND_URL": f"file://{work / 'state'}", "PULUMI_CONFIG_PASSPHRASE": "engine-test",
                    "PULUMI_SKIP_UPDATE_CHECK": "1", "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
                    # the v3.78 host ignores Pulumi.yaml's virtualenv (../shared/reference/engine.md)
                    "PULUMI_PYTHON_CMD": sys.executable,
                    "PULUMI_DEBUG_PROVIDERS": ",".join(f"{n}:{p}" for n, p in attach.items()),
                    # The Kubernetes provider copies the kubeconfig it is given into $TMPDIR, in the clear, on
                    # every start and never removes it (README: The real workflow): a folder of this run's own.
                    "TMPDIR": str(work / "tmp")}
        self.tmp = work / "tmp"
        (work / "state").mkdir()
        self.tmp.mkdir()

    def __call__(self, *args: str, input: str | None = None, ok: bool = True, timeout_s: float = 1500,
                 cwd: Path | None = None) -> str:
        done = subprocess.run([str(self.tools / "pulumi"), *args, "--non-interactive", "--color", "never"],
                              cwd=cwd or self.project, env=self.env, input=input, capture_output=True, text=True,
                              timeout=timeout_s)
        out = done.stdout + done.stderr
        self.log.append((args, done.returncode, out))
        self.logs.mkdir(exist_ok=True)       # every command's output, kept with the test's files
        (self.logs / f"{len(self.log):02d}-{'-'.join(a.lstrip('-') for a in args[:2])}.txt").write_text(out)
        assert (done.returncode == 0) == ok, f"pulumi {' '.join(args)} exited {done.returncode}:\n{out[-20000:]}"
        return out


def serve(plugin: Plugin, workers: int = 32) -> tuple[grpc.Server, int]:
    """A stand-in plugin on a port of its own, for PULUMI_DEBUG_PROVIDERS; `workers`: the calls it serves at
    once."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    provider_pb2_grpc.add_ResourceProviderServicer_to_server(plugin, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


def serve_echo(version: str) -> tuple[grpc.Server, int, EchoProvider]:
    echo = EchoProvider(version)
    return *serve(echo), echo


def start_component_provider(cwd: Path, stderr: Path) -> tuple[subprocess.Popen, int]:
    """The component provider as `python provider <engine>` runs it, in the program's directory, attachable."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.e2e.engine", "attachable"], cwd=cwd,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
                            stdout=subprocess.PIPE, stderr=stderr.open("wb"))
    assert proc.stdout is not None
    port = proc.stdout.readline().decode().strip()
    assert port.isdigit(), stderr.read_text()
    return proc, int(port)


def _attachable() -> None:
    from pulumi.provider import server as sdk_server

    from components.provider import GpuClusterProvider, semver

    class Attachable(sdk_server.ProviderServicer):
        async def Attach(self, request, context):
            self.engine_address = request.address      # where the SDK sends log lines, as its argument would say
            return empty_pb2.Empty()

        async def Handshake(self, request, context):   # the engine then falls back, as for any older plugin
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "no handshake")

    async def serve() -> None:
        server = grpc.aio.server(options=sdk_server._GRPC_CHANNEL_OPTIONS)
        servicer = Attachable(GpuClusterProvider(semver(metadata.version("gpucluster"))), [], engine_address="")
        provider_pb2_grpc.add_ResourceProviderServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        print(port, flush=True)
        await server.wait_for_termination()

    asyncio.run(serve())


if __name__ == "__main__" and sys.argv[1:] == ["attachable"]:
    _attachable()
