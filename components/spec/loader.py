"""Load a stack spec from YAML and report every problem at once, each with its path, line and fix.

The loader is the boundary hostile input meets first: it refuses what is not UTF-8, YAML bombs (alias budgets,
recursive aliases, deep nesting), oversized values and pasted private keys before any model sees them, and it
runs every rule that can still judge a spec whose fields are partly invalid (see `_partial`).
"""

from __future__ import annotations

import difflib
import json
import re
import types
import typing
from functools import partial
from pathlib import Path
from typing import Any, Iterator, NamedTuple

import yaml
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from .changes import change_at, explained
from .cluster import ClusterSpec
from .tenants import Tenancy, TenantsSpec
from .common import CrossFieldError, Invalid, Loc, Problem, fmt_loc, run_checks, shown, why

MAX_FILE_BYTES = 16 * 1024 * 1024
MAX_VALUE_CHARS = 64 * 1024         # far above any real value (an SSH public key is under 1 KB)
MAX_DEPTH = 64                      # a spec nests under 12 levels
MAX_ALIASES = 256
MAX_NODES = 300_000                 # after aliases are expanded; a 4,096-host spec has about 60,000
MAX_NUMBER_CHARS = 100
STR_TAG, INT_TAG, FLOAT_TAG = "tag:yaml.org,2002:str", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
PRIVATE_KEY_RE = re.compile(r"-----BEGIN ([A-Z0-9]+ )*PRIVATE KEY-----")
SECRET_FIX = ("a private key never belongs in the spec, which is committed in plain text: remove it and store "
              "it as the stack's secret with `pulumi config set --secret sshPrivateKey < KEYFILE`")


class SpecError(Exception):
    """The spec is invalid; `problems` holds one line per problem, all of them."""

    def __init__(self, source: str, problems: list[str], what: str = "the cluster spec"):
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: {len(problems)} problem(s) in {what}:\n"
                         + "\n".join(f"  - {p}" for p in problems))


class _Resolver(yaml.resolver.Resolver):
    """YAML 1.1 tags as SafeLoader resolves them, except timestamps, which stay strings (as kubectl keeps them)."""


_Resolver.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:timestamp"]
    for k, v in yaml.resolver.Resolver.yaml_implicit_resolvers.items()
}
TOO_DEEP = f"nested more than {MAX_DEPTH} levels deep; a spec needs far fewer"
# libyaml's parser (a state machine, fast) when PyYAML has it; its composer is not used: it recurses in C and
# crashes the process on deeply nested input, so nodes are composed here, iteratively and within budgets.
_EVENTS_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _compose(text: str) -> tuple[yaml.Node | None, int]:
    """The document's node graph, as PyYAML's composer builds it (an alias is the anchored node itself), refusing
    more than one document, more than MAX_ALIASES aliases and nesting deeper than MAX_DEPTH; and how many
    aliases it has (without any, it is a tree within those bounds)."""
    resolver = _Resolver()
    anchors: dict[str, yaml.Node] = {}
    open_nodes: list[tuple[yaml.CollectionNode, list[yaml.Node]]] = []
    root: yaml.Node | None = None
    documents = aliases = 0

    def refuse(problem: str, event: yaml.Event) -> None:
        raise yaml.composer.ComposerError(None, None, problem, event.start_mark)

    def add(node: yaml.Node, event: yaml.Event) -> None:
        nonlocal root
        if open_nodes:
            open_nodes[-1][1].append(node)
        else:
            root = node
        anchor = getattr(event, "anchor", None)
        if anchor is not None and not isinstance(event, yaml.AliasEvent):
            anchors[anchor] = node

    for event in yaml.parse(text, Loader=_EVENTS_LOADER):
        if isinstance(event, yaml.DocumentStartEvent):
            documents += 1
            if documents > 1:
                refuse("a second YAML document (---); a spec is one document", event)
        elif isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_ALIASES:
                refuse(f"more than {MAX_ALIASES} aliases (*name); a spec needs few, so write the values out", event)
            if event.anchor not in anchors:
                refuse(f"alias *{event.anchor} refers to no anchor (&{event.anchor}) defined before it", event)
            add(anchors[event.anchor], event)
        elif isinstance(event, yaml.ScalarEvent):
            if event.tag not in (None, "!", STR_TAG):
                refuse(f"explicit tag {event.tag} (a spec uses plain values; only !!str is accepted)", event)
            tag = event.tag if event.tag not in (None, "!") else \
                resolver.resolve(yaml.ScalarNode, event.value, event.implicit)
            if len(event.value) > MAX_NUMBER_CHARS and tag in (INT_TAG, FLOAT_TAG):
                refuse(f"a number of {len(event.value):,} characters; no field takes one that long", event)
            add(yaml.ScalarNode(tag, event.value, event.start_mark, event.end_mark, style=event.style), event)
        elif isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            if len(open_nodes) >= MAX_DEPTH:
                refuse(TOO_DEEP, event)
            if event.tag not in (None, "!"):
                refuse(f"explicit tag {event.tag} (a spec uses plain lists and mappings)", event)
            kind = yaml.SequenceNode if isinstance(event, yaml.SequenceStartEvent) else yaml.MappingNode
            tag = event.tag if event.tag not in (None, "!") else resolver.resolve(kind, None, event.implicit)
            node = kind(tag, [], event.start_mark, None, flow_style=event.flow_style)
            add(node, event)
            open_nodes.append((node, []))
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            node, items = open_nodes.pop()
            node.value = items if isinstance(node, yaml.SequenceNode) else list(zip(items[::2], items[1::2]))
            node.end_mark = event.end_mark
    return root, aliases


def _line_of(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def _expanded_size(root: yaml.Node, source: str) -> None:
    """Refuse recursive aliases, and documents that aliases blow up beyond MAX_NODES values or MAX_DEPTH levels
    (billion laughs): measured on the alias graph, each shared node once, without expanding anything."""
    done: dict[int, tuple[int, int]] = {}        # node -> (expanded size, depth)
    on_path: set[int] = set()
    work: list[tuple[yaml.Node, bool]] = [(root, False)]
    while work:
        node, children_done = work.pop()
        key = id(node)
        if children_done:
            kids = [done[id(c)] for c in _children(node)]
            size, depth = 1 + sum(k[0] for k in kids), 1 + max((k[1] for k in kids), default=0)
            on_path.discard(key)
            if size > MAX_NODES or depth > MAX_DEPTH:
                what = f"more than {MAX_NODES:,} values" if size > MAX_NODES else f"more than {MAX_DEPTH} levels"
                raise SpecError(source, [f"{source}:{_line_of(node)}: aliases expand this to {what}; write the "
                                         "values out instead of nesting aliases"])
            done[key] = (size, depth)
            continue
        if key in done:
            continue
        if key in on_path:
            raise SpecError(source, [f"{source}:{_line_of(node)}: an alias refers to the collection it is in, "
                                     "which never ends; write the value out"])
        on_path.add(key)
        work.append((node, True))
        work.extend((c, False) for c in _children(node) if id(c) not in done)


def _index_nodes(root: yaml.Node, lines: dict[Loc, int], problems: list[str], source: str) -> None:
    """Record the line of every path; find duplicate keys (which PyYAML would silently overwrite), oversized
    values and pasted private keys. Iterative, and each shared (aliased) node is visited once per path."""
    work: list[tuple[yaml.Node, Loc]] = [(root, ())]
    while work:
        node, loc = work.pop()
        lines.setdefault(loc, _line_of(node))
        if isinstance(node, yaml.ScalarNode):
            value = node.value
            where = f"{source}:{_line_of(node)}: {fmt_loc(loc) or '(top level)'}"
            if len(value) > MAX_VALUE_CHARS:
                problems.append(f"{where}: a value of {len(value):,} characters ({shown(value, 40)}); spec "
                                f"values are at most {MAX_VALUE_CHARS:,} characters, so this is not what was meant")
            elif PRIVATE_KEY_RE.search(value):
                problems.append(f"{where}: {SECRET_FIX}")
        elif isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, value_node in node.value:
                line = _line_of(key_node)
                if not isinstance(key_node, yaml.ScalarNode):
                    problems.append(f"{source}:{line}: {fmt_loc(loc) or '(top level)'}: a key is a "
                                    f"{'list' if isinstance(key_node, yaml.SequenceNode) else 'mapping'}; keys are "
                                    "plain names or numbers")
                    continue
                key = key_node.value
                if key in seen:
                    problems.append(f"{source}:{line}: {fmt_loc(loc + (key,)) or key}: key {shown(key)} appears "
                                    f"twice (first on line {seen[key]}); YAML would keep only the last one, so "
                                    "remove one")
                seen[key] = line
                lines[loc + (key,)] = line
                work.append((value_node, loc + (key,)))
        elif isinstance(node, yaml.SequenceNode):
            work.extend((item, loc + (i,)) for i, item in enumerate(node.value))


def _yaml_problem(e: yaml.YAMLError, text: str, source: str) -> str:
    """PyYAML's own words and both of its places; the line shown is where the problem starts (an unclosed
    bracket or quote: its opening, not the end of the file where the parser noticed)."""
    if isinstance(e, yaml.reader.ReaderError):
        line = text.count("\n", 0, e.position) + 1
        char = f"#x{e.character:04x}" if isinstance(e.character, int) else f"#x{ord(e.character[:1] or ' '):04x}"
        return (f"{source}:{line}: not valid YAML: character {char} is not allowed in YAML text; "
                "remove it (a control character or a file that is not text)")
    context, context_mark = getattr(e, "context", None), getattr(e, "context_mark", None)
    problem, problem_mark = getattr(e, "problem", None) or str(e), getattr(e, "problem_mark", None)
    if "maximum nesting depth" in problem:      # libyaml >= 0.2.6 (PyYAML 6.0.4) scans ahead and stops at 1000
        return f"{source}:{problem_mark.line + 1 if problem_mark else 1}: not valid YAML: {TOO_DEEP}"
    opened = bool(context and context_mark and re.search(r"flow|quoted|simple key|block scalar", context))
    mark = context_mark if opened else problem_mark or context_mark
    where = f"{source}:{mark.line + 1}" if mark else source
    parts = []
    if context:
        parts.append(f"{context}" + (f" (line {context_mark.line + 1}, column {context_mark.column + 1})"
                                     if context_mark else ""))
    parts.append(problem + (f" (line {problem_mark.line + 1}, column {problem_mark.column + 1})"
                            if problem_mark else ""))
    return f"{where}: not valid YAML: {', '.join(parts)}"


def _decode(data: bytes, source: str, max_bytes: int = MAX_FILE_BYTES, what: str = "a spec") -> str:
    if len(data) > max_bytes:
        raise SpecError(source, [f"{source}: {len(data):,} bytes; {what} is at most {max_bytes:,} bytes (is "
                                 "this the right file?)"])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise SpecError(source, [f"{source}:{line}: byte {data[e.start]:#04x} at column {column} is not UTF-8; "
                                 "save the file as UTF-8 (a spec is text)"]) from None


def parse_spec(text: str | bytes, source: str = "<spec>", project_dir: Path | None = None) -> ClusterSpec:
    """Validate YAML text as a ClusterSpec; raise SpecError listing every problem. `project_dir`: the Pulumi
    project the spec belongs to, where vendored charts and files must exist. Omitted: they are not looked for."""
    data, lines = read_mapping(text, source, "name, environment, sites, node_pools ...")
    try:
        spec = ClusterSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError(source, _describe(e, data, lines, source)) from None
    missing = [_line(loc, message, lines, source)[1] for loc, message in _vendored_missing(spec, project_dir)]
    if missing:
        raise SpecError(source, missing)
    return spec


def _vendored_missing(spec: ClusterSpec, project_dir: Path | None) -> Iterator[tuple[Loc, str]]:
    """Charts and files the spec says are vendored in the project, which `pulumi up` reads from there."""
    if project_dir is None:
        return
    k = spec.kubernetes
    for name in ("gpu_operator", "network_operator", "nfd", "kueue"):
        path = getattr(k, name).chart_path
        if path is not None and not (project_dir / path / "Chart.yaml").is_file():
            yield (("kubernetes", name, "chart_path"),
                   f"{path} has no Chart.yaml in the project ({project_dir}): vendor the chart there "
                   "(helm pull --untar) or set chart_repository")
    weka, scale = spec.storage.weka, spec.storage.scale
    if weka is not None and weka.csi.chart_path and not (project_dir / weka.csi.chart_path / "Chart.yaml").is_file():
        yield (("storage", "weka", "csi", "chart_path"),
               f"{weka.csi.chart_path} has no Chart.yaml in the project ({project_dir}): vendor the chart there "
               "(helm pull --untar) or set chart_repository")
    files = [(("kubernetes", "mpi_operator", "crd_path"), k.mpi_operator.crd_path,
              "vendor the release's kubeflow.org_mpijobs.yaml there or set crd_url"),
             (("kubernetes", "health", "quarantine", "crd_path"), k.health.quarantine.crd_path,
              "vendor the release's crds.yaml there or set crd_url")]
    if scale is not None:
        files.append((("storage", "scale", "csi", "operator_path"), scale.csi.operator_path,
                      "download the release's generated/installer/ibm-spectrum-scale-csi-operator.yaml there" +
                      ("" if k.image_registry else " or set operator_url")))
    for loc, path, fix in files:
        if path is not None and not (project_dir / path).is_file():
            yield loc, f"{path} is not a file in the project ({project_dir}): {fix}"


def project_of(path: Path) -> Path | None:
    """The Pulumi project a spec file belongs to: the nearest directory above it with a Pulumi.yaml."""
    for parent in path.resolve().parents:
        if (parent / "Pulumi.yaml").is_file():
            return parent
    return None


class TenantsFile(NamedTuple):
    """A tenants stack file as loaded: the spec, and where each of its values is, for errors found later
    (against the platform's exported tenancy)."""

    source: str
    spec: TenantsSpec
    lines: dict[Loc, int]

    def error(self, problems: list[Problem]) -> SpecError:
        return located_error(self.source, problems, self.lines, "the tenants file")


def located_error(source: str, problems: list[Problem], lines: dict[Loc, int], what: str) -> SpecError:
    """Problems found after validation, as the loader words them (each at its line, where one is known)."""
    located = sorted(_line(p.loc, p.message, lines, source) for p in problems)
    return SpecError(source, [m for _, m in located], what)


M = typing.TypeVar("M", bound=BaseModel)


def read_object(value: Any, source: str, model: type[M], what: str) -> M:
    """A value a program handed over already parsed (a component provider's input), validated as `model` with
    the loader's messages. Numbers cross Pulumi's wire as doubles, so whole ones are integers again first."""
    data = _whole(value)
    if not isinstance(data, dict):
        raise SpecError(source, [f"{source}: not a mapping (got {_yaml_kind(data)})"], what)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise SpecError(source, _describe(e, data, {}, source, model), what) from None


def _whole(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _whole(v) for k, v in value.items()}
    return [_whole(v) for v in value] if isinstance(value, list) else value


def load_tenants(path: str | Path) -> TenantsFile:
    """A tenants-only stack file (see tenants/), read with the same guards and messages as a cluster spec."""
    p = Path(path)
    try:
        data = read_bounded(p, "a tenants file")
    except (OSError, ValueError) as e:       # ValueError: a NUL in the path
        raise SpecError(str(p), [f"{p}: cannot read the tenants file ({why(e)}); create it or set the "
                                 "stack's tenantsFile to its path"], "the tenants file") from None
    try:
        data, lines = read_mapping(data, str(p), "platform_stack and tenants")
        return TenantsFile(str(p), TenantsSpec.model_validate(data), lines)
    except ValidationError as e:
        raise SpecError(str(p), _describe(e, data, lines, str(p), TenantsSpec), "the tenants file") from None
    except SpecError as e:
        raise SpecError(str(p), e.problems, "the tenants file") from None


def read_tenancy(exported: Any, tenants: TenantsFile) -> Tenancy:
    """The platform stack's exported `tenancy` as this release reads it, or why it cannot be (a platform stack
    that predates the output, or one built by another release of the library)."""
    stack = tenants.spec.platform_stack
    fix = (f"run `pulumi up` on {stack} with the same release of gpucluster as this project first (the tenants "
           "project reads what that release exports)")
    if exported is None:
        raise tenants.error([Problem(("platform_stack",), f"stack {stack!r} exports no `tenancy` output; {fix}")])
    try:
        return Tenancy.model_validate(exported, strict=False)     # numbers cross the wire as doubles
    except ValidationError as e:
        found = [f"{fmt_loc(tuple(err['loc'])) or '(top level)'}: {err['msg'].lower()}"
                 for err in e.errors(include_url=False)]
        raise tenants.error([Problem(("platform_stack",), f"stack {stack!r} exports `tenancy` in a shape this "
                                                          f"release cannot read ({'; '.join(found[:5])}"
                                                          f"{'; ...' if len(found) > 5 else ''}); {fix}")]) from None


def lines_of(text: str) -> dict[Loc, int]:
    """The line of every key and item of a JSON (or YAML) text, for messages about a file already read whole by
    read_json or read_mapping; {} where it cannot be composed."""
    try:
        root, _ = _compose(text)
    except yaml.YAMLError:
        return {}
    lines: dict[Loc, int] = {}
    work: list[tuple[yaml.Node, Loc]] = [(root, ())] if root is not None else []
    while work:
        node, loc = work.pop()
        lines.setdefault(loc, _line_of(node))
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    lines[loc + (key.value,)] = _line_of(key)
                    work.append((value, loc + (key.value,)))
        elif isinstance(node, yaml.SequenceNode):
            work.extend((item, loc + (i,)) for i, item in enumerate(node.value))
    return lines


def read_json(path: Path, what: str, fix: str, max_bytes: int = MAX_FILE_BYTES) -> Any:
    """A JSON file a user hands a command, with the spec loader's guards: a size bound, UTF-8, bounded nesting,
    no key given twice (JSON keeps the last silently) and no NaN or Infinity. Raises SpecError naming the file,
    the line where there is one, and `fix`."""
    return json_of(read_text(path, what, fix, max_bytes), path, what, fix)


def read_bounded(path: Path, what: str, max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """The file's bytes, read no further than `max_bytes` + 1: a device or a pipe (/dev/zero, <(cmd)) has no size
    to check first. More than `max_bytes` is a SpecError saying so; OSError where it cannot be read."""
    with path.open("rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise SpecError(str(path), [f"{path}: more than {max_bytes:,} bytes, more than {what} can be (is this the "
                                    "right file?)"], what)
    return data


def _refused(path: Path, what: str, fix: str, problem: str) -> SpecError:
    return SpecError(str(path), [f"{problem}; {fix}"], what)


def read_text(path: Path, what: str, fix: str, max_bytes: int = MAX_FILE_BYTES) -> str:
    """A file's text, at most `max_bytes` and UTF-8, or a SpecError naming the file and `fix`."""
    refuse = partial(_refused, path, what, fix)
    try:
        return _decode(read_bounded(path, what, max_bytes), str(path), max_bytes, what)
    except FileNotFoundError:
        raise refuse(f"{path}: no such file") from None
    except (OSError, ValueError) as e:       # ValueError: a NUL in the path
        raise refuse(f"{path}: cannot be read ({why(e)})") from None
    except SpecError as e:
        raise refuse(e.problems[0]) from None


def json_of(text: str, path: Path, what: str, fix: str) -> Any:
    """`text`, read from `path`, as JSON with read_json's guards (a caller that also wants its lines)."""
    refuse = partial(_refused, path, what, fix)
    repeated: list[str] = []

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in pairs]
        repeated.extend(k for i, k in enumerate(keys) if k in keys[:i])
        return dict(pairs)

    constants: list[_Constant] = []

    def constant(name: str) -> Any:
        constants.append(_Constant(name, len(constants)))
        return constants[-1]

    try:
        data = json.loads(text, object_pairs_hook=unique, parse_constant=constant)
    except json.JSONDecodeError as e:
        raise refuse(f"{path}:{e.lineno}: not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None
    except ValueError as e:
        raise refuse(f"{path}: {str(e)[:200]}") from None
    except RecursionError:
        raise refuse(f"{path}: nested too deeply to be {what}") from None
    if repeated:
        raise SpecError(str(path), [f"{path}: {shown(k)} is given twice in one object; JSON keeps the last one "
                                    f"silently, so keep one" for k in dict.fromkeys(repeated)], what)
    if constants:
        offsets = _bare_constants(text)
        raise SpecError(str(path), [
            f"{path}:{text.count(chr(10), 0, offsets[c.index]) + 1}: {fmt_loc(loc) or '(the whole file)'}: {c.name} "
            f"is not a JSON number; give a finite value; {fix}" for loc, c in _constants_in(data)], what)
    return data


class _Constant(NamedTuple):
    """NaN or (-)Infinity where a JSON file has one, and which one of them in the text it is."""
    name: str
    index: int


def _constants_in(value: Any, loc: Loc = ()) -> Iterator[tuple[Loc, _Constant]]:
    if isinstance(value, _Constant):
        yield loc, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _constants_in(v, loc + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _constants_in(v, loc + (i,))


def _bare_constants(text: str) -> list[int]:
    """Offsets of NaN, Infinity and -Infinity outside strings, in order (json.loads meets them in this order)."""
    out, i, quoted = [], 0, False
    while i < len(text):
        ch = text[i]
        if quoted:
            quoted = ch != '"'
            i += 2 if ch == "\\" else 1
            continue
        if ch == '"':
            quoted = True
        elif text.startswith(("NaN", "Infinity", "-Infinity"), i):
            out.append(i)
            i += 3
            continue
        i += 1
    return out


class _Unusual(Exception):
    """A node the fast construction leaves to PyYAML's constructor (merge keys, sets, complex keys)."""


_STR, _SEQ, _MAP = "tag:yaml.org,2002:str", "tag:yaml.org,2002:seq", "tag:yaml.org,2002:map"


def _construct_tree(node: yaml.Node, constructor: yaml.constructor.SafeConstructor) -> Any:
    """The values of an alias-free tree, as PyYAML's SafeConstructor builds them: strings, lists and dicts here
    (most of a spec), every other scalar (ints, bools, nulls, floats) by the constructor itself, so each means
    what it means in PyYAML; anything else raises _Unusual. Depth is bounded by MAX_DEPTH when composed."""
    if isinstance(node, yaml.ScalarNode):
        return node.value if node.tag == _STR else constructor.construct_object(node, deep=True)
    if isinstance(node, yaml.SequenceNode) and node.tag == _SEQ:
        return [_construct_tree(child, constructor) for child in node.value]
    if isinstance(node, yaml.MappingNode) and node.tag == _MAP:
        out = {}
        for key, value in node.value:
            if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
                raise _Unusual
            out[_construct_tree(key, constructor)] = _construct_tree(value, constructor)
        return out
    raise _Unusual


def read_mapping(text: str | bytes, source: str, wanted: str) -> tuple[dict, dict[Loc, int]]:
    """YAML text as a mapping, with the line of every value; every guard of the loader applies (also to the
    other YAML files users hand the commands: tenants files, kubeconfigs)."""
    if isinstance(text, bytes):
        text = _decode(text, source)
    elif len(text) > MAX_FILE_BYTES:
        raise SpecError(source, [f"{source}: {len(text):,} characters; a spec is at most {MAX_FILE_BYTES:,}"])
    lines: dict[Loc, int] = {}
    found: list[str] = []
    try:
        node, aliases = _compose(text)
        if node is not None:
            if aliases:
                _expanded_size(node, source)
            _index_nodes(node, lines, found, source)
            if found:
                raise SpecError(source, found)
        data = None
        if node is not None:
            constructor = yaml.constructor.SafeConstructor()
            try:
                data = _construct_tree(node, constructor) if not aliases else constructor.construct_document(node)
            except _Unusual:
                data = yaml.constructor.SafeConstructor().construct_document(node)
    except yaml.YAMLError as e:
        raise SpecError(source, [_yaml_problem(e, text, source)]) from None
    except (ValueError, TypeError, OverflowError) as e:      # a value PyYAML resolved but cannot build
        raise SpecError(source, [f"{source}: not valid YAML: {shown(str(e), 200)}"]) from None
    if not isinstance(data, dict):
        raise SpecError(source, [f"{source}: not a mapping with {wanted} (got {_yaml_kind(data)})"])
    return data, lines


def load_spec(path: str | Path, project_dir: Path | None = None) -> ClusterSpec:
    """The spec file, validated; vendored charts and files are looked for in the project it belongs to, else in
    `project_dir` (the command's), else in the working directory's (where the engine runs the program): a spec
    kept outside the project is checked as strictly as one inside."""
    p = Path(path)
    try:
        data = read_bounded(p, "a spec")
    except (OSError, ValueError) as e:       # ValueError: a NUL in the path
        raise SpecError(str(p), [f"{p}: cannot read the spec ({why(e)}); create it or pass the right path"]) \
            from None
    project = project_of(p) or (project_dir.resolve() if project_dir and (project_dir / "Pulumi.yaml").is_file()
                                else None) \
        or project_of(Path.cwd() / "spec")
    key = (str(p.resolve()), data, str(project))
    if key not in _LOADED:            # the CLI validates a spec, then the program loads it: parsed once
        if len(_LOADED) >= 4:
            _LOADED.pop(next(iter(_LOADED)))
        _LOADED[key] = parse_spec(data, str(p), project)
    return _LOADED[key]


_LOADED: dict[tuple[str, bytes, str], ClusterSpec] = {}     # specs are immutable, so one parse serves every reader


def loaded_specs() -> list[ClusterSpec]:
    """The specs this process loaded last (a plan finds the one its program built from)."""
    return list(_LOADED.values())


# --- every rule that can run: checks over a spec whose invalid values are stand-ins ---------------------

_ADAPTERS: dict[int, tuple[Any, TypeAdapter]] = {}
_STRICT = ConfigDict(strict=True, allow_inf_nan=False)


def _adapter(tp: Any) -> TypeAdapter:
    hit = _ADAPTERS.get(id(tp))
    if hit is None:
        # A model, bare or Annotated (a quota given as a count), keeps its own config; pydantic refuses another.
        bare = typing.get_args(tp)[0] if typing.get_origin(tp) is typing.Annotated else tp
        model = isinstance(bare, type) and issubclass(bare, BaseModel)
        hit = _ADAPTERS[id(tp)] = (tp, TypeAdapter(tp) if model else TypeAdapter(tp, config=_STRICT))
    return hit[1]


_FIELD_TYPES: dict[tuple[type, str], Any] = {}


def _field_type(model: type[BaseModel], name: str) -> Any:
    key = (model, name)
    if key not in _FIELD_TYPES:
        field = model.model_fields[name]
        _FIELD_TYPES[key] = typing.Annotated[(field.annotation, *field.metadata)] if field.metadata \
            else field.annotation
    return _FIELD_TYPES[key]


def _partial(tp: Any, value: Any, loc: Loc, touched: set[Loc], problems: list[Problem]) -> Any:
    """`value` as `tp`: validated where no error lies at or under `loc`; elsewhere built from what is valid,
    with `Invalid` standing in for the rest, and the checks of every model so built run (their problems are
    collected). So a bad address does not keep the rack, quota and cabling rules from running; a rule that
    reaches an invalid value is skipped, so nothing is reported that follows from another problem."""
    if loc not in touched:
        try:
            return _adapter(tp).validate_python(value)
        except ValidationError:
            return Invalid(loc)
    base = _unwrap(tp)
    origin = typing.get_origin(base)
    if isinstance(base, type) and issubclass(base, BaseModel) and isinstance(value, dict):
        fields = {}
        for name, field in base.model_fields.items():
            if name in value:
                fields[name] = _partial(_field_type(base, name), value[name], loc + (name,), touched, problems)
            elif field.is_required():
                fields[name] = Invalid(loc + (name,))
            else:
                fields[name] = field.get_default(call_default_factory=True)
        model = base.model_construct(**fields)
        found = run_checks(model, partial=True)
        problems.extend(Problem(loc + p.loc, p.message) for p in found)
        refused = {p.loc[0] for p in found if len(p.loc) == 1 and p.loc[0] in fields}
        if refused:       # a value a check refused is no input for the rules above (no follow-on problems)
            model = base.model_construct(**{**fields, **{f: Invalid(loc + (f,)) for f in refused}})
        return model
    if origin is list and isinstance(value, list):
        item = typing.get_args(base)[0]
        return [_partial(item, v, loc + (i,), touched, problems) for i, v in enumerate(value)]
    if origin is dict and isinstance(value, dict):
        item = typing.get_args(base)[1]
        return {k: _partial(item, v, loc + (k,), touched, problems) for k, v in value.items()
                if loc + (k, "[key]") not in touched}
    return Invalid(loc)


# --- turning pydantic's errors into messages a platform engineer can act on ---------------------------

def _describe(exc: ValidationError, data: dict, lines: dict[Loc, int], source: str,
              root: type[BaseModel] = ClusterSpec) -> list[str]:
    out: dict[str, int] = {}
    touched: set[Loc] = set()
    for err in exc.errors(include_url=False):
        loc: Loc = tuple(err["loc"])
        touched.update(loc[:k] for k in range(len(loc) + 1))
        ctx_error = (err.get("ctx") or {}).get("error")
        if isinstance(ctx_error, CrossFieldError):
            for p in ctx_error.problems:
                out.setdefault(*_line(loc + p.loc, p.message, lines, source)[::-1])
            continue
        out.setdefault(*_line(*_message(err, loc, root), lines, source)[::-1])
    rules: list[Problem] = []
    _partial(root, data, (), touched, rules)
    for p in rules:
        out.setdefault(*_line(p.loc, p.message, lines, source)[::-1])
    return [m for m, _ in sorted(out.items(), key=lambda x: x[1])]


def _line(loc: Loc, message: str, lines: dict[Loc, int], source: str) -> tuple[int, str]:
    probe = loc
    while probe and probe not in lines:
        probe = probe[:-1]
    line = lines.get(probe, 0)
    where = f"{source}:{line}" if line else source
    return line, f"{where}: {fmt_loc(loc) or '(top level)'}: {message}"


_NUMBER_TYPES = ("int_type", "int_parsing", "int_from_float", "float_type", "float_parsing")


def _message(err: dict, loc: Loc, root: type[BaseModel]) -> tuple[Loc, str]:
    kind, msg, value = err["type"], err["msg"], err.get("input")
    if loc and loc[-1] == "[key]":          # a bad dict key: point at the key itself
        loc = loc[:-1]
    got = f"got {shown(value)}" if not isinstance(value, (dict, list)) else f"got a {_yaml_kind(value)}"
    if kind == "value_error":
        return loc, msg.removeprefix("Value error, ")
    if kind == "extra_forbidden" and (change := change_at(loc, ("renamed", "removed"))) is not None:
        return loc, f"unknown field {shown(str(loc[-1]))}: {explained(change)}"
    if kind == "missing" and (change := change_at(loc, ("required",))) is not None:
        return loc, f"required field is missing; {explained(change)}"
    if kind == "extra_forbidden":
        field = str(loc[-1])
        allowed = _fields_at(loc[:-1], root)
        close = difflib.get_close_matches(field, allowed, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return loc, f"unknown field {shown(field)}; {hint}allowed here: {', '.join(allowed)}"
    if kind == "missing":
        desc = _description_at(loc, root)
        return loc, f"required field is missing; add it{f' ({desc})' if desc else ''}"
    if kind in _NUMBER_TYPES:
        if isinstance(value, bool):
            return loc, (f"{msg} ({got}: YAML reads yes, no, on, off, true and false as booleans); write a number")
        if isinstance(value, str):
            return loc, f"{msg} ({got}, a string); write the number without quotes"
    if kind == "bool_type":
        return loc, f"{msg} ({got}); write true or false, without quotes"
    if kind == "string_type" and isinstance(value, (bool, int, float)):
        return loc, (f"{msg} ({got}: YAML read it as a {_yaml_kind(value)}); put the value in quotes exactly as "
                     "meant (e.g. '1.10', 'yes', '0755')")
    if kind == "finite_number":
        return loc, f"{msg} ({got}); write a finite number"
    if kind in ("list_type", "dict_type", "model_type", "model_attributes_type"):
        want = "a list (- item)" if kind == "list_type" else "a mapping (key: value)"
        return loc, f"expected {want}, {got}"
    return loc, f"{msg} ({got})"


def _yaml_kind(value: object) -> str:
    return {bool: "boolean", int: "number", float: "number", str: "string", list: "list", dict: "mapping",
            type(None): "null"}.get(type(value), type(value).__name__)


def _model_at(loc: Loc, root: type[BaseModel]) -> type[BaseModel] | None:
    """The model class that owns the field at `loc`, found by walking the root model's annotations."""
    tp: Any = root
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


def _fields_at(loc: Loc, root: type[BaseModel]) -> list[str]:
    model = _model_at(loc, root)
    return sorted(model.model_fields) if model else []


def _description_at(loc: Loc, root: type[BaseModel]) -> str:
    model = _model_at(loc[:-1], root)
    if model is None or loc[-1] not in model.model_fields:
        return ""
    return model.model_fields[loc[-1]].description or ""
