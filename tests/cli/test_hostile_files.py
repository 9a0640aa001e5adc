"""Every file a user hands a command other than the spec (a plan to `diff`, a policy config to `check`, a
kubeconfig to `validate`) gets the spec's guards: generated hostile input gives named problems, never a crash."""

from __future__ import annotations

import argparse
import json

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from components.cli.validate import _cluster_access
from components.offline.diff import load_plan
from components.offline.policy import load_config, load_policies
from components.spec import SpecError
from tests.conftest import ROOT, with_changes

_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**30, 10**30), st.floats(), st.text(max_size=20),
                     st.sampled_from(["mandatory", "advisory", "disabled", "urn:pulumi:a::b::c::d", "https://x:1"]))
_JSON = st.recursive(_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                      st.dictionaries(st.text(max_size=12), inner, max_size=3)),
                     max_leaves=10)
_TEXT = st.one_of(st.binary(max_size=200), st.text(alphabet='{}[]":,-0123456789.eE\n\t NaInfityrusl\\', max_size=200),
                  _JSON.map(lambda v: json.dumps(v)),
                  st.integers(1, 3000).map(lambda n: "[" * n + "]" * n),
                  _JSON.map(lambda v: json.dumps({"resources": [{"urn": "urn:pulumi:s::p::t::n", "inputs": v}],
                                                  "outputs": v})))
_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _named(e: SpecError, path) -> None:
    assert e.problems and all(p.startswith(str(path)) and len(p) < 2000 for p in e.problems), e.problems


@_SETTINGS
@given(_TEXT)
def test_any_plan_file_gives_problems_not_a_crash(tmp_path, text):
    (tmp_path / "resources.json").write_bytes(text if isinstance(text, bytes) else text.encode())
    try:
        load_plan(tmp_path)
    except SpecError as e:
        _named(e, tmp_path / "resources.json")


_POLICIES = load_policies(ROOT)


@_SETTINGS
@given(st.one_of(_TEXT, st.dictionaries(st.sampled_from([p.name for p in _POLICIES[:5]] + ["all", "x"]), _JSON,
                                        max_size=3).map(json.dumps)))
def test_any_policy_config_gives_problems_not_a_crash(tmp_path, text):
    path = tmp_path / "config.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    try:
        load_config(path, _POLICIES)
    except SpecError as e:
        _named(e, path)


_KUBECONFIG = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
               "clusters": [{"name": "k", "cluster": {"server": "https://10.0.0.1:6443"}}],
               "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}


def _mutated(changes: list) -> str:
    return yaml.safe_dump(with_changes(_KUBECONFIG, changes))


_KEYS = [("kind",), ("clusters",), ("current-context",), ("contexts",), ("clusters", 0, "cluster"),
         ("clusters", 0, "cluster", "server"), ("contexts", 0, "context"), ("contexts", 0, "context", "cluster"),
         ("clusters", 0, "name")]


@_SETTINGS
@given(st.one_of(_TEXT, st.lists(st.tuples(st.sampled_from(_KEYS), _JSON), min_size=1, max_size=3).map(_mutated)))
def test_any_kubeconfig_gives_problems_not_a_crash(tmp_path, text):
    path = tmp_path / "kubeconfig"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    problems = _cluster_access(argparse.Namespace(kubeconfig=str(path), kubectl="sh", timeout=None))
    assert all(isinstance(p, str) and len(p) < 2000 for p in problems), problems


_WORDS = st.one_of(st.sampled_from(["dev", "stacks/dev.yaml", "../dev", "", "-", "--", "/dev/null", "/", ".",
                                    "build", "x" * 300, "dev\n", "$(reboot)", "--timeout", "-5", "nan", "1e999",
                                    "--kubeconfig", "--project-dir", "--out", "--exit-code", "--kubectl"]),
                   st.text(max_size=12))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["validate", "diff", "schema"]), st.lists(_WORDS, max_size=4))
def test_any_arguments_to_a_command_give_an_exit_status_not_a_crash(tmp_path, capsys, command, words):
    """Commands that read only files (no program run), fed generated arguments: argparse's usage error (2), a
    named refusal (2), or a result; never an exception. `schema --out` writes only under the test's folder."""
    from components.cli import main
    words = [str(tmp_path / "out.json") if w == "/" and command == "schema" else w for w in words]
    if command == "schema" and "--out" in words:
        words = [w for w in words if w != "--out"] + ["--out", str(tmp_path / "schema.json")]
    try:
        code = main([command, *words])
    except SystemExit as e:          # argparse: a usage error
        code = e.code
    assert code in (0, 1, 2)
    assert "Traceback" not in capsys.readouterr().err


def test_a_large_clusters_plan_is_read_past_a_specs_size_bound(tmp_path):
    """A plan is bounded by MAX_PLAN_BYTES, not by a spec's 16 MiB: a 128-host plan is some 17 MB (each host's
    preparation, drain, roll and uncordon scripts), and diff refused it, naming the spec's bound."""
    from components.offline.diff import MAX_PLAN_BYTES
    from components.spec.loader import MAX_FILE_BYTES
    filler = "x" * (1 << 20)
    resources = [{"urn": f"urn:pulumi:s::p::command:remote:Command::h{i}-prepare", "type": "command:remote:Command",
                  "name": f"h{i}-prepare", "inputs": {"create": filler}} for i in range(17)]
    (tmp_path / "resources.json").write_text(json.dumps({"resources": resources, "outputs": {}}))
    assert MAX_FILE_BYTES < (tmp_path / "resources.json").stat().st_size < MAX_PLAN_BYTES
    assert len(load_plan(tmp_path)["resources"]) == 17
