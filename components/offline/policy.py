"""Evaluate the policy pack against what a program registered, with the pulumi_policy SDK's own analyzer.

The SDK's analyzer servicer is driven in process with the requests the engine would send
(../shared/reference/pulumi-offline.md, section 4): `Analyze` per resource with its inputs, then one
`AnalyzeStack` with every resource, components carrying their registered outputs as the engine passes them.
So secrets are unwrapped, unknown values raise inside a policy and come back as advisory notes, and
enforcement levels and settings come from the same config file `pulumi preview --policy-pack-config` reads.
"""

from __future__ import annotations

import difflib
import importlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
from google.protobuf import struct_pb2
from pulumi.runtime import rpc as _rpc
from pulumi.runtime.proto import analyzer_pb2 as apb

from ..spec import SpecError
from ..spec.common import shown
from ..spec.loader import json_of, lines_of, read_text
from ..types import urn_of, urn_parts
from .recorder import STACK_TYPE, Record
from .report import Thresholds
from .runner import ProgramRun

PACK_NAME, PACK_VERSION = "gpucluster", "0.1.0"
PACKAGE = "gpucluster_policies"
LEVELS = {"advisory": apb.ADVISORY, "mandatory": apb.MANDATORY, "remediate": apb.REMEDIATE,
          "disabled": apb.DISABLED}
_UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"    # the engine's unknown-string sentinel


@dataclass(frozen=True)
class Violation:
    policy: str
    level: str            # mandatory | advisory
    message: str
    urn: str              # "" for a finding about the whole stack

    @property
    def resource(self) -> str:
        return self.urn.rsplit("::", 1)[-1] if self.urn else "(stack)"


def load_policies(project_dir: Path) -> list[Any]:
    """The pack's policies, imported from the project's `policies/` folder (never its `__main__`)."""
    folder = str((project_dir / "policies").resolve())
    if not (Path(folder) / PACKAGE / "__init__.py").exists():
        raise SpecError(folder, [f"{folder}: no {PACKAGE} package here; run from the project folder"])
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return list(importlib.import_module(PACKAGE).POLICIES)


FIX_CONFIG = "fix the file (a Pulumi policy-pack config: policy names to levels)"


def load_config(path: Path, policies: list[Any]) -> dict[str, tuple[int, dict[str, Any]]]:
    """Policy name -> (enforcement level, settings) from a Pulumi policy-pack config file: `{"all": LEVEL,
    "<policy>": LEVEL | {"enforcementLevel": LEVEL, "<setting>": value}}`. Every error is reported at once."""
    what = "the policy config"
    text = read_text(path, what, FIX_CONFIG)
    raw = json_of(text, path, what, FIX_CONFIG)
    if not isinstance(raw, dict):
        raise SpecError(str(path), [f"{path}: a policy config is a JSON object of policy names"], what)
    by_name = {p.name: p for p in policies}
    lines = lines_of(text)
    problems: list[tuple[int, str]] = []

    def problem(loc: tuple[str, ...], message: str) -> None:
        line = lines.get(loc) or lines.get(loc[:1], 0)
        problems.append((line, f"{path}:{line}: {message}" if line else f"{path}: {message}"))

    def level(loc: tuple[str, ...], value: Any) -> int | None:
        if isinstance(value, str) and value in LEVELS:
            return LEVELS[value]
        problem(loc, f"{'.'.join(loc)}: enforcement level {shown(value)} is not one of {', '.join(LEVELS)}")
        return None

    default_all = level(("all",), raw["all"]) if "all" in raw else None
    out: dict[str, tuple[int, dict[str, Any]]] = {}
    for name, entry in raw.items():
        if name == "all":
            continue
        policy = by_name.get(name)
        if policy is None:
            close = difflib.get_close_matches(name, by_name, n=1)
            problem((name,), f"{shown(name)} is not a policy of the pack"
                    + (f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(sorted(by_name))}"))
            continue
        if not isinstance(entry, (dict, str)):
            problem((name,), f"{name}: {type(entry).__name__} where an enforcement level or an object of settings "
                             "belongs")
            continue
        props = dict(entry) if isinstance(entry, dict) else {}
        chosen = level((name, "enforcementLevel"), props.pop("enforcementLevel")) if "enforcementLevel" in props \
            else (level((name,), entry) if not isinstance(entry, dict) else None)
        schema = policy.config_schema
        if props:
            import jsonschema             # only a policy config with settings needs it (a tenth of a second)
            body = {"type": "object", "properties": schema.properties if schema else {},
                    "additionalProperties": False}
            for error in jsonschema.Draft7Validator(body).iter_errors(props):
                where = ".".join(str(p) for p in error.absolute_path) or "(settings)"
                unknown = [k for k in props if k not in (schema.properties if schema else {})]
                hint = difflib.get_close_matches(unknown[0], schema.properties if schema else {}, n=1) \
                    if error.validator == "additionalProperties" and unknown else []
                problem((name, *map(str, error.absolute_path)), f"{name}.{where}: {error.message}"
                        + (f"; did you mean {hint[0]!r}?" if hint else ""))
        out[name] = (chosen if chosen is not None else -1, props)
    if problems:
        raise SpecError(str(path), [m for _, m in sorted(problems, key=lambda p: p[0])], what)
    resolved = {}
    for p in policies:
        own = LEVELS[p.enforcement_level.value] if p.enforcement_level else apb.MANDATORY
        chosen, props = out.get(p.name, (-1, {}))
        resolved[p.name] = (chosen if chosen != -1 else default_all if default_all is not None else own, props)
    return resolved


def thresholds(policies: list[Any], config: dict[str, tuple[int, dict[str, Any]]] | None,
               source: str) -> Thresholds:
    """The report's yardsticks, from the same settings the policies judge with."""
    by_name = {p.name: p for p in policies}

    def setting(policy: str, key: str, fallback: float) -> float:
        if policy not in by_name:
            return fallback
        given = (config or {}).get(policy, (0, {}))[1]
        return given.get(key, by_name[policy].config_schema.properties[key]["default"])

    return Thresholds(derating=setting("power-rack-budget", "derating", Thresholds.derating),
                      min_read_gb_per_s_per_gpu=setting("storage-bandwidth-per-gpu", "minReadGbPerSecondPerGpu",
                                                        Thresholds.min_read_gb_per_s_per_gpu),
                      max_oversubscription=setting("fabric-leaf-oversubscription", "maxRatio",
                                                   Thresholds.max_oversubscription),
                      source=source)


def _wire(value: Any) -> Any:
    """A recorded value as the engine sends it: secret envelopes kept, unknowns as the sentinel."""
    if isinstance(value, dict):
        return {k: _wire(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_wire(v) for v in value]
    if isinstance(value, pulumi.output.Unknown) or value == _rpc.UNKNOWN:
        return _UNKNOWN
    if isinstance(value, (pulumi.Asset, pulumi.Archive)):
        return {k: getattr(value, k) for k in ("path", "text", "uri") if hasattr(value, k)}
    return value


def _struct(value: dict[str, Any]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(_wire(value))
    return s


def _options(r: Record) -> apb.AnalyzerResourceOptions:
    o = r.options
    return apb.AnalyzerResourceOptions(
        protect=bool(o.get("protect")), ignoreChanges=o.get("ignoreChanges", []),
        deleteBeforeReplace=bool(o.get("deleteBeforeReplace")), deleteBeforeReplaceDefined=True,
        additionalSecretOutputs=o.get("additionalSecretOutputs", []), aliases=_alias_urns(r),
        parent=r.parent or "")


def _alias_urns(r: Record) -> list[str]:
    """A resource's aliases as the engine hands them to analyzers: URNs, its own under each earlier type or
    name (the parent left empty is its current one)."""
    head, types, name = urn_parts(r.urn)
    return [urn_of(head, [*types[:-1], spec.get("type") or types[-1]], spec.get("name") or name)
            for spec in (a.get("spec", {}) for a in r.options.get("aliases", []))]


def evaluate(run: ProgramRun, policies: list[Any],
             config: dict[str, tuple[int, dict[str, Any]]] | None = None) -> list[Violation]:
    from pulumi_policy import EnforcementLevel
    from pulumi_policy.policy import _PolicyAnalyzerServicer   # the SDK's own analyzer, as the engine drives it

    servicer = _PolicyAnalyzerServicer(PACK_NAME, PACK_VERSION, policies, EnforcementLevel.MANDATORY)
    if config:
        request = apb.ConfigureAnalyzerRequest()
        for name, (level, props) in config.items():
            request.policyConfig[name].CopyFrom(apb.PolicyConfig(enforcementLevel=level, properties=_struct(props)))
        servicer.Configure(request, None)
    exports = {k: _rpc.wrap_rpc_secret(v) if secret else v for k, (v, secret) in run.outputs.items()}
    diagnostics = []
    stack_resources = []
    for r in run.records:
        if r.kind == "read":
            continue
        if r.type == STACK_TYPE:
            outputs = exports
        elif not r.custom:
            outputs = run.component_outputs.get(r.urn, {})
        else:
            outputs = r.inputs        # a provider echoes known inputs back as outputs
        options = _options(r)
        if r.type != STACK_TYPE:
            found = servicer.Analyze(apb.AnalyzeRequest(type=r.type, properties=_struct(r.inputs), urn=r.urn,
                                                        name=r.name, options=options), None).diagnostics
            for d in found:          # the engine files a resource policy's finding under the resource
                d.urn = d.urn or r.urn
            diagnostics += found
        resource = apb.AnalyzerResource(type=r.type, properties=_struct(outputs), urn=r.urn, name=r.name,
                                        options=options, parent=r.parent or "", dependencies=r.dependencies)
        for key, urns in r.property_dependencies.items():
            resource.propertyDependencies[key].urns.extend(urns)
        stack_resources.append(resource)
    diagnostics += servicer.AnalyzeStack(apb.AnalyzeStackRequest(resources=stack_resources), None).diagnostics
    out = []
    for d in diagnostics:
        message = d.message.split("\n", 1)[1] if "\n" in d.message else d.message   # drop the description
        out.append(Violation(d.policyName, apb.EnforcementLevel.Name(d.enforcementLevel).lower(), message, d.urn))
    return sorted(set(out), key=lambda v: (v.policy, v.urn, v.message))
