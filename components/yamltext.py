"""YAML for people to review: multi-line strings (scripts, embedded configs) as literal blocks, no anchors."""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Iterable

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

_TAG = "tag:yaml.org,2002:"


def _block(value: str) -> bool:
    return "\n" in value and not any(c in value for c in "\t\r") and value == value.rstrip(" ")


class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):     # libyaml's emitter where PyYAML has it
    def ignore_aliases(self, data: Any) -> bool:
        return True

    def represent_data(self, data: Any) -> Node:
        """The nodes SafeRepresenter makes for plain data (block style, keys in order), made directly: a plan
        renders thousands of manifests, and the generic path costs most of their time."""
        kind = type(data)
        if kind is str:
            return ScalarNode(_TAG + "str", data, style="|" if _block(data) else None)
        if kind is dict:
            return MappingNode(_TAG + "map", [(self.represent_data(k), self.represent_data(v))
                                              for k, v in data.items()], flow_style=False)
        if kind is list:
            return SequenceNode(_TAG + "seq", [self.represent_data(v) for v in data], flow_style=False)
        if kind is bool:
            return ScalarNode(_TAG + "bool", "true" if data else "false")
        if kind is int:
            return ScalarNode(_TAG + "int", str(data))
        if data is None:
            return ScalarNode(_TAG + "null", "null")
        return super().represent_data(data)

    def resolve(self, kind: type, value: Any, implicit: tuple[bool, bool]) -> str:
        return _resolve_scalar(value, implicit) if kind is ScalarNode else super().resolve(kind, value, implicit)


@lru_cache(maxsize=4096)
def _resolve_scalar(value: str, implicit: tuple[bool, bool]) -> str:
    """A scalar's tag follows from its text alone (no path resolvers here), and manifests repeat their keys
    and values: the emitter asks twice for each scalar."""
    return _RESOLVER.resolve(ScalarNode, value, implicit)


_RESOLVER = yaml.resolver.Resolver()


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if _block(value) else None)


_Dumper.add_representer(str, _str)


def to_yaml(doc: Any) -> str:
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120, allow_unicode=True)


def to_yaml_all(docs: Iterable[Any]) -> str:
    return "---\n".join(to_yaml(d) for d in docs)
