"""YAML for review: the fast path writes exactly what PyYAML's safe representer would."""

from __future__ import annotations

import json

import yaml

from components.yamltext import to_yaml, to_yaml_all


class _Reference(yaml.SafeDumper):
    def ignore_aliases(self, data):
        return True


def _block(dumper, value):
    block = "\n" in value and not any(c in value for c in "\t\r") and value == value.rstrip(" ")
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if block else None)


_Reference.add_representer(str, _block)


def reference(doc) -> str:
    return yaml.dump(doc, Dumper=_Reference, sort_keys=False, default_flow_style=False, width=120,
                     allow_unicode=True)


ODD = {"empty list": [], "empty map": {}, "empty": "", "yes": "yes", "number text": "1", "octal": "0755",
       "float": 1.5, "big float": 1e17, "none": None, "bool": True, "false": False, "script": "#!/bin/bash\necho hi\n",
       "trailing space": "a \nb", "tab": "a\tb\nc", "nested": [{"x": [1, [2, {"y": None}]]}], "colon": "x: y",
       "dash": "-", "quotes": "'q' \"d\"", "unicode": "ünïcødé", 3: "int key", "long": "w " * 80, "cr": "a\r\nb",
       "null word": "null", "tilde": "~", "star": "*x", "ampersand": "&y", "at": "@z", "percent": "%p"}


def test_plain_data_renders_exactly_as_pyyaml_would():
    assert to_yaml(ODD) == reference(ODD)
    assert yaml.safe_load(to_yaml(ODD)) == ODD


def test_every_manifest_of_the_dev_plan_renders_as_pyyaml_would():
    from components.offline.plan import build_plan
    from components.offline.runner import run_program
    from tests.conftest import ROOT

    plan = build_plan(run_program(ROOT, "dev"))
    docs = [r["inputs"] for r in plan.document["resources"]] + [r.get("outputs") or {} for r in
                                                                plan.document["resources"]]
    for doc in docs:
        assert to_yaml(doc) == reference(doc), json.dumps(doc)[:200]
    assert to_yaml_all([{"a": 1}, {"b": [2]}]) == "a: 1\n---\nb:\n- 2\n"
