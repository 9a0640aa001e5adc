"""YAML for people to review: multi-line strings (scripts, embedded configs) as literal blocks, no anchors."""

from __future__ import annotations

from typing import Any, Iterable

import yaml


class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):     # libyaml's emitter where PyYAML has it
    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    block = "\n" in value and not any(c in value for c in "\t\r") and value == value.rstrip(" ")
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if block else None)


_Dumper.add_representer(str, _str)


def to_yaml(doc: Any) -> str:
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120, allow_unicode=True)


def to_yaml_all(docs: Iterable[Any]) -> str:
    return "---\n".join(to_yaml(d) for d in docs)
