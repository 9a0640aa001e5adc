"""Record what a Pulumi program registers, under Pulumi's own mock runtime.

`Mocks.new_resource` sees only type, name and inputs; parent, dependencies and options travel on the
RegisterResourceRequest, so the recorder is a MockMonitor subclass that reads the request itself
(see ../shared/reference/pulumi-offline.md, section 1).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import pulumi
from google.protobuf import json_format
from pulumi.runtime import mocks as _mocks
from pulumi.runtime import rpc as _rpc
from pulumi.runtime import settings as _settings

SECRET = "[secret]"
COMPUTED = "<computed>"
STACK_TYPE = "pulumi:pulumi:Stack"


@dataclass
class Record:
    urn: str                      # the engine's URN (after finalize); the mock's until then
    type: str
    name: str
    custom: bool
    remote: bool
    parent: str
    dependencies: list[str]
    property_dependencies: dict[str, list[str]]
    provider: str
    inputs: dict[str, Any]        # secrets still wrapped in the RPC envelope, unknowns as pulumi Unknown
    options: dict[str, Any] = field(default_factory=dict)
    kind: str = "register"        # register | read


class EchoMocks(_mocks.Mocks):
    """Resources echo their inputs as outputs, as providers do for known inputs during a preview.

    Outputs a provider computes (a Helm release's status, a command's stdout) stay unknown, so anything
    built from them shows as `<computed>`. A component gets no id and no outputs back, as from the engine
    (its state has none until it registers them). Invokes are refused: the program must not depend on one
    offline.
    """

    def new_resource(self, args: _mocks.MockResourceArgs) -> tuple[str, dict]:
        if args.typ == "pulumi:pulumi:StackReference":       # a read, which the mocks do not mark custom
            read = self.stack_outputs(args.inputs.get("name", args.name))
            return read["name"], read
        if not args.custom:
            return "", {}
        return f"{args.name}-id", dict(args.inputs)

    def stack_outputs(self, name: str) -> dict[str, Any]:
        """What the engine's StackReference read and readStackOutputs invoke answer for stack `name`: here, a
        stack nothing was planned for, with no outputs."""
        return {"name": name, "outputs": {}, "secretOutputNames": []}

    def call(self, args: _mocks.MockCallArgs):
        if args.token == "pulumi:pulumi:readStackOutputs":
            return self.stack_outputs(args.args["name"])
        raise NotImplementedError(f"the offline plan has no answer for invoke {args.token}; "
                                  "the program must not need it to register resources")


class StackReferenceMocks(EchoMocks):
    """EchoMocks where a StackReference reads the outputs of another stack's (offline) run, by stack name."""

    def __init__(self, stacks: dict[str, dict[str, Any]]):
        self.stacks = stacks

    def stack_outputs(self, name: str) -> dict[str, Any]:
        if name not in self.stacks:
            raise KeyError(f"no offline run of stack {name!r} to reference (have: {', '.join(self.stacks)})")
        return {**super().stack_outputs(name), "outputs": self.stacks[name]}


class _HandingOver(_mocks.Mocks):
    """Passes each registration's inputs, as the stock monitor deserialized them for the mocks, to the recorder
    (the same thread answers the registration), so they are deserialized once, not twice."""

    def __init__(self, mocks: _mocks.Mocks, seen: threading.local):
        self.mocks, self.seen = mocks, seen

    def new_resource(self, args: _mocks.MockResourceArgs) -> tuple[str | None, dict]:
        self.seen.inputs = args.inputs
        return self.mocks.new_resource(args)

    def call(self, args: _mocks.MockCallArgs):
        return self.mocks.call(args)


class RecordingMonitor(_mocks.MockMonitor):
    def __init__(self, mocks: _mocks.Mocks | None = None):
        self._seen = threading.local()
        super().__init__(_HandingOver(mocks or EchoMocks(), self._seen))
        self.records: list[Record] = []
        self.component_outputs: dict[str, dict[str, Any]] = {}
        self.duplicates: list[str] = []
        self._lock = threading.Lock()

    def _keep(self, rec: Record) -> None:
        with self._lock:
            self.records.append(rec)

    def _inputs(self, request) -> dict[str, Any]:
        """The inputs with unknowns kept: in a preview the stock monitor's deserialization keeps them too."""
        inputs = getattr(self._seen, "inputs", None)
        self._seen.inputs = None
        if inputs is None or not _settings.is_dry_run():
            return _rpc.deserialize_properties(request.object, keep_unknowns=True)
        return inputs

    def RegisterResource(self, request):
        self._seen.inputs = None
        resp = super().RegisterResource(request)
        self._keep(Record(
            urn=resp.urn, type=request.type, name=request.name, custom=request.custom, remote=request.remote,
            parent=request.parent, dependencies=list(request.dependencies),
            property_dependencies={k: list(v.urns) for k, v in request.propertyDependencies.items()},
            provider=request.provider,
            inputs=self._inputs(request),
            options={
                "protect": request.protect if request.HasField("protect") else False,
                "ignoreChanges": list(request.ignoreChanges),
                "replaceOnChanges": list(request.replaceOnChanges),
                "additionalSecretOutputs": list(request.additionalSecretOutputs),
                "deleteBeforeReplace": request.deleteBeforeReplace,
                "retainOnDelete": request.retainOnDelete if request.HasField("retainOnDelete") else False,
                "deletedWith": request.deletedWith,
                # Each alias as its set fields ({"spec": {"type": ...}}): the parent left empty is the current one.
                "aliases": sorted((json_format.MessageToDict(a) for a in request.aliases), key=repr),
            }))
        return resp

    def ReadResource(self, request):
        resp = super().ReadResource(request)
        self._keep(Record(urn=resp.urn, type=request.type, name=request.name, custom=True, remote=False,
                          parent=request.parent, dependencies=list(request.dependencies),
                          property_dependencies={}, provider=request.provider, inputs={}, kind="read"))
        return resp

    def RegisterResourceOutputs(self, request):
        with self._lock:   # the stock monitor drops component outputs; the plan shows them
            self.component_outputs[request.urn] = _rpc.deserialize_properties(request.outputs, keep_unknowns=True)
        return super().RegisterResourceOutputs(request)

    def finalize(self) -> None:
        """Rewrite every URN the way the engine builds it, and find duplicates the mock never reports.

        The engine qualifies a type with all its ancestors' types (children of the stack excepted); the
        mock keeps only the parent's. Records end sorted by URN, since registration order is not stable.
        """
        by_urn = {r.urn: r for r in self.records}
        qualified: dict[str, str] = {}

        def qual(urn: str) -> str:
            if urn not in qualified:
                r = by_urn[urn]
                parent = by_urn.get(r.parent)
                if r.type == STACK_TYPE or parent is None or parent.type == STACK_TYPE:
                    qualified[urn] = r.type
                else:
                    qualified[urn] = qual(r.parent) + "$" + r.type
            return qualified[urn]

        real = {r.urn: f"{'::'.join(r.urn.split('::')[:2])}::{qual(r.urn)}::{r.name}" for r in self.records}
        seen: set[str] = set()
        for r in self.records:
            r.urn = real[r.urn]
            if r.urn in seen:
                self.duplicates.append(r.urn)
            seen.add(r.urn)
            r.parent = real.get(r.parent, r.parent)
            r.dependencies = sorted({real.get(d, d) for d in r.dependencies})
            r.property_dependencies = {k: sorted({real.get(d, d) for d in v})
                                       for k, v in sorted(r.property_dependencies.items()) if v}
        self.component_outputs = {real.get(k, k): v for k, v in self.component_outputs.items()}
        self.records.sort(key=lambda r: r.urn)


def redact(value: Any, reveal: bool = False, ordered: bool = False) -> Any:
    """Plain JSON for review: secrets become `[secret]`, unknowns `<computed>`, whole floats ints again;
    `ordered`: keys sorted at every level, so the same spec always gives the same bytes."""
    if type(value) is str:             # most values: answered first, without the checks below
        return COMPUTED if value == _rpc.UNKNOWN else value
    if isinstance(value, dict):
        if _rpc.is_rpc_secret(value):
            return redact(_rpc.unwrap_rpc_secret(value), reveal, ordered) if reveal else SECRET
        return {k: redact(value[k], reveal, ordered) for k in (sorted(value) if ordered else value)}
    if isinstance(value, list):
        return [redact(v, reveal, ordered) for v in value]
    if isinstance(value, pulumi.output.Unknown) or value == _rpc.UNKNOWN:
        return COMPUTED
    if isinstance(value, float) and value.is_integer():
        return int(value)         # protobuf carries every number as a double
    if isinstance(value, (pulumi.Asset, pulumi.Archive)):
        return {"asset": type(value).__name__,
                **{k: getattr(value, k) for k in ("path", "text", "uri") if hasattr(value, k)}}
    return value
