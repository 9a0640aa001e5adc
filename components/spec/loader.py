"""Load a stack spec from YAML and report every problem at once, each with its path, line and fix."""

from __future__ import annotations

import difflib
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from .cluster import ClusterSpec, _fmt
from .common import CrossFieldError, Loc


class SpecError(Exception):
    """The spec is invalid; `problems` holds one line per problem, all of them."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: {len(problems)} problem(s) in the cluster spec:\n"
                         + "\n".join(f"  - {p}" for p in problems))


class _Loader(yaml.SafeLoader):
    """SafeLoader that keeps timestamps as strings (as kubectl does) and never builds Python objects."""


_Loader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:timestamp"]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _index_nodes(node: yaml.Node, loc: Loc, lines: dict[Loc, int], dups: list[str], source: str) -> None:
    """Record the line of every path and find duplicate keys, which PyYAML would silently overwrite."""
    lines[loc] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value
            line = key_node.start_mark.line + 1
            if key in seen:
                dups.append(f"{source}:{line}: {_fmt(loc + (key,)) or key}: key {key!r} appears twice "
                            f"(first on line {seen[key]}); YAML would keep only the last one, so remove one")
            seen[key] = line
            _index_nodes(value_node, loc + (key,), lines, dups, source)
            lines[loc + (key,)] = line
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _index_nodes(item, loc + (i,), lines, dups, source)


def parse_spec(text: str, source: str = "<spec>") -> ClusterSpec:
    """Validate YAML text as a ClusterSpec; raise SpecError listing every problem."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        lines: dict[Loc, int] = {}
        dups: list[str] = []
        if node is not None:
            _index_nodes(node, (), lines, dups, source)
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        raise SpecError(source, [f"{where}: not valid YAML: {getattr(e, 'problem', None) or e}"]) from None
    finally:
        loader.dispose()
    if dups:
        raise SpecError(source, dups)
    if not isinstance(data, dict):
        raise SpecError(source, [f"{source}: the spec must be a mapping with name, environment, sites, "
                                 f"node_pools ... (got {type(data).__name__})"])
    try:
        return ClusterSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError(source, _describe(e, lines, source)) from None


def load_spec(path: str | Path) -> ClusterSpec:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise SpecError(str(p), [f"{p}: cannot read the spec ({e.strerror}); create it or pass the right path"]) \
            from None
    return parse_spec(text, str(p))


# --- turning pydantic's errors into messages a platform engineer can act on ---------------------------

def _describe(exc: ValidationError, lines: dict[Loc, int], source: str) -> list[str]:
    out: list[tuple[int, str]] = []
    for err in exc.errors(include_url=False):
        loc: Loc = tuple(err["loc"])
        ctx_error = (err.get("ctx") or {}).get("error")
        if isinstance(ctx_error, CrossFieldError):
            for p in ctx_error.problems:
                out.append(_line(loc + p.loc, p.message, lines, source))
            continue
        out.append(_line(*_message(err, loc), lines, source))
    return [m for _, m in sorted(out, key=lambda x: x[0])]


def _line(loc: Loc, message: str, lines: dict[Loc, int], source: str) -> tuple[int, str]:
    probe = loc
    while probe and probe not in lines:
        probe = probe[:-1]
    line = lines.get(probe, 0)
    where = f"{source}:{line}" if line else source
    return line, f"{where}: {_fmt(loc) or '(top level)'}: {message}"


def _message(err: dict, loc: Loc) -> tuple[Loc, str]:
    kind, msg, value = err["type"], err["msg"], err.get("input")
    if loc and loc[-1] == "[key]":          # a bad dict key: point at the key itself
        loc = loc[:-1]
    shown = f" (got {value!r})" if not isinstance(value, (dict, list)) else ""
    if kind == "value_error":
        return loc, msg.removeprefix("Value error, ")
    if kind == "extra_forbidden":
        field = str(loc[-1])
        allowed = _fields_at(loc[:-1])
        close = difflib.get_close_matches(field, allowed, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return loc, f"unknown field {field!r}; {hint}allowed here: {', '.join(allowed)}"
    if kind == "missing":
        desc = _description_at(loc)
        return loc, f"required field is missing; add it{f' ({desc})' if desc else ''}"
    return loc, f"{msg}{shown}"


def _model_at(loc: Loc) -> type[BaseModel] | None:
    """The model class that owns the field at `loc`, found by walking ClusterSpec's annotations."""
    tp: Any = ClusterSpec
    for part in loc:
        tp = _unwrap(tp)
        if typing.get_origin(tp) in (list, dict):    # an index or a key: step into the element type
            tp = typing.get_args(tp)[-1]
            continue
        if not (isinstance(tp, type) and issubclass(tp, BaseModel)) or part not in tp.model_fields:
            return None
        tp = tp.model_fields[part].annotation
    tp = _unwrap(tp)
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _unwrap(tp: Any) -> Any:
    """Strip Annotated and Optional, keeping list[...] and dict[...] for the caller to step into."""
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return tp
            tp = args[0]
        else:
            return tp


def _fields_at(loc: Loc) -> list[str]:
    model = _model_at(loc)
    return sorted(model.model_fields) if model else []


def _description_at(loc: Loc) -> str:
    model = _model_at(loc[:-1])
    if model is None or loc[-1] not in model.model_fields:
        return ""
    return model.model_fields[loc[-1]].description or ""
