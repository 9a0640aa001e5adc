"""`gpucluster check`: the policy pack over a planned stack, as a pull request's CI runs it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from components.cli.check import MAX_COMMENT_CHARS
from tests.cli.test_cli import gpucluster
from tests.conftest import ROOT

BROKEN = ROOT / "tests" / "policies" / "broken"

# Each deliberately broken spec, and exactly the findings it must give: (policy, resource, level).
EXPECTED = {
    "prod-reformat": {("storage-no-reformat", "prod-storage", "mandatory")},
    "prod-raid5": {("storage-raid-redundancy", "prod-storage", "mandatory")},
    "prod-no-burn-in": {("ops-burn-in-enabled", "prod-h100", "mandatory")},
    "prod-hot-alert": {("ops-gpu-temperature-alert", "prod-k8s-gpu-alerts", "mandatory")},
    "prod-rack-power": {("power-rack-budget", "prod", "mandatory")},
    "prod-old-driver": {("ops-driver-cuda-nccl-compatible", "prod-h100", "mandatory")},
    # The DCGM image of the validation suite, and of the active health check of each host.
    "prod-latest-image": {("k8s-image-versions-pinned", name, "mandatory") for name in (
        "prod", *(f"prod-k8s-gpu-check-gpu-prod-0{i}" for i in range(1, 9)))},
    "prod-unpinned": {("ssh-host-key-pinned", name, "mandatory") for name in (
        "prod-h100-gpu-prod-08-burn-in", "prod-h100-gpu-prod-08-prepare", "prod-h100-gpu-prod-08-roll",
        "prod-h100-gpu-prod-08-leave", "prod-h100-gpu-prod-08-scripts",
        "prod-storage-gpu-prod-08")},
}


def report(out: Path) -> dict:
    return json.loads((out / "check.json").read_text())


def test_every_broken_spec_has_its_expectation():
    assert {p.stem for p in BROKEN.glob("*.yaml")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_broken_spec_gives_exactly_its_findings_and_exits_1(name, tmp_path):
    out = gpucluster("check", str(BROKEN / f"{name}.yaml"), "--out", str(tmp_path))
    assert out.returncode == 1, out.stdout + out.stderr
    found = {(v["policy"], v["urn"].rsplit("::", 1)[-1], v["level"]) for v in report(tmp_path)["violations"]}
    assert found == EXPECTED[name]
    assert "Traceback" not in out.stderr


def test_the_dev_stack_passes_with_its_advisory_findings_shown(tmp_path):
    out = gpucluster("check", "dev", "--out", str(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    data = report(tmp_path)
    assert data["config"].endswith("policies/config/dev.json") and data["levels"]["ssh-host-key-pinned"] == "advisory"
    assert {v["level"] for v in data["violations"]} == {"advisory"}
    assert "Policies: 44 checked on stack dev (config policies/config/dev.json): 0 mandatory and 3 advisory" \
        in out.stdout
    assert "ssh-host-key-pinned (advisory): Checks that every SSH connection (and bastion) pins the host key." \
        in out.stdout


def test_markdown_is_written_for_a_pull_request_comment(tmp_path):
    out = gpucluster("check", str(BROKEN / "prod-rack-power.yaml"), "--out", str(tmp_path), "--format", "markdown")
    text = (tmp_path / "check.md").read_text()
    assert out.returncode == 1 and text == (tmp_path / "check-full.md").read_text()     # it fits: nothing cut
    assert "power-rack-budget (mandatory): Checks that each rack" in out.stdout          # the log has the text
    assert text.startswith("### gpucluster check: `prod-rack-power` fails\n")
    assert "| `power-rack-budget` | mandatory | 1 |" in text
    assert "- `prod`: rack r01 draws up to 4 x 10.2 kW (h100 host, dgx-h100's base power) = 40.8 kW at peak" in text


def test_a_policy_config_sets_levels_and_thresholds(tmp_path):
    config = tmp_path / "lenient.json"
    config.write_text(json.dumps({"power-rack-budget": {"enforcementLevel": "advisory", "derating": 0.95}}))
    out = gpucluster("check", str(BROKEN / "prod-rack-power.yaml"), "--out", str(tmp_path / "a"),
                     "--policy-config", str(config))
    assert out.returncode == 0 and report(tmp_path / "a")["violations"] == []       # 40.8 kW < 45 x 95%
    config.write_text(json.dumps({"all": "advisory"}))
    out = gpucluster("check", str(BROKEN / "prod-rack-power.yaml"), "--out", str(tmp_path / "b"),
                     "--policy-config", str(config))
    assert out.returncode == 0
    assert [v["level"] for v in report(tmp_path / "b")["violations"]] == ["advisory"]


def test_a_bad_policy_config_exits_2_naming_every_problem(tmp_path):
    config = tmp_path / "bad.json"
    config.write_text(json.dumps({"all": "strict", "power-budget": "advisory",
                                  "power-rack-budget": {"derating": "most", "margin": 1},
                                  "ops-burn-in-enabled": {"enforcementLevel": "sometimes"}}, indent=2))
    out = gpucluster("check", "dev", "--out", str(tmp_path / "o"), "--policy-config", str(config))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    expected = [f"{config}:2: all: enforcement level 'strict' is not one of advisory, mandatory, remediate, disabled",
                f"{config}:3: 'power-budget' is not a policy of the pack; did you mean 'power-rack-budget'?",
                f"{config}:4: power-rack-budget.(settings): Additional properties are not allowed ('margin' was "
                "unexpected)",
                f"{config}:5: power-rack-budget.derating: 'most' is not of type 'number'",
                f"{config}:9: ops-burn-in-enabled.enforcementLevel: enforcement level 'sometimes' is not one of "
                "advisory, mandatory, remediate, disabled"]
    assert [line.removeprefix("  - ") for line in out.stderr.splitlines()[1:]] == expected, out.stderr
    assert not (tmp_path / "o" / "check.json").exists()


@pytest.mark.parametrize("text, line", [
    ('{"power-rack-budget": "mandatory", "power-rack-budget": "disabled"}',
     "'power-rack-budget' is given twice in one object; JSON keeps the last one silently, so keep one"),
    ('{"power-rack-budget": {"derating": NaN}}',
     "bad.json:1: power-rack-budget.derating: NaN is not a JSON number; give a finite value; fix"),
    ('{\n "power-rack-budget": {\n  "note": "NaN",\n  "derating": -Infinity}}',
     "bad.json:4: power-rack-budget.derating: -Infinity is not a JSON number; give a finite value; fix"),
    ('{"power-rack-budget":\n "mandatory",}', "bad.json:2: not valid JSON: "),
    ('{"all": "mandatory"}'.encode("utf-16"), "is not UTF-8; save the file as UTF-8"),
    ('{"power-rack-budget": ["advisory"]}',
     "power-rack-budget: list where an enforcement level or an object of settings belongs"),
    # an id of its own: TEST_ID_MAX in tests/conftest.py
    pytest.param("[" * 100000 + "]" * 100000, "nested too deeply to be the policy config", id="nested-100000-deep"),
    ('{"power-rack-budget": {"deratin": 0.5}}', "did you mean 'derating'?"),
])
def test_a_hostile_policy_config_is_named_and_exits_2(tmp_path, text, line):
    config = tmp_path / "bad.json"
    config.write_bytes(text if isinstance(text, bytes) else text.encode())
    out = gpucluster("check", "dev", "--out", str(tmp_path / "o"), "--policy-config", str(config))
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert f"{config}: 1 problem(s) in the policy config:" in out.stderr and line in out.stderr, out.stderr


def test_the_headline_counts_the_policies_that_ran_not_the_disabled_ones(tmp_path):
    config = tmp_path / "off.json"
    config.write_text(json.dumps({"power-rack-budget": "disabled", "ssh-host-key-pinned": "disabled"}))
    out = gpucluster("check", str(BROKEN / "prod-rack-power.yaml"), "--out", str(tmp_path / "a"),
                     "--policy-config", str(config))
    assert "Policies: 42 checked on stack prod-rack-power" in out.stdout and report(tmp_path / "a")["policies"] == 42
    assert out.returncode == 0 and report(tmp_path / "a")["violations"] == []


def test_a_comment_for_hundreds_of_findings_fits_github_and_the_full_report_keeps_them_all(tmp_path):
    """The 1,024-GPU example with no host key pinned: a finding per SSH command, some 650."""
    spec = yaml.safe_load((ROOT / "examples" / "large.yaml").read_text())
    for pool in spec["node_pools"]:
        for host in pool["hosts"]:
            host.pop("host_key", None)
    for server in spec["storage"]["servers"]:
        server.pop("host_key", None)
    path = tmp_path / "large.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = gpucluster("check", str(path), "--out", str(tmp_path / "plan"), "--format", "markdown")
    assert out.returncode == 1, out.stderr
    found = report(tmp_path / "plan")["violations"]
    comment = (tmp_path / "plan" / "check.md").read_text()
    full = (tmp_path / "plan" / "check-full.md").read_text()
    assert len(found) > 600 and len(full) > MAX_COMMENT_CHARS >= len(comment)
    assert f"| `ssh-host-key-pinned` | mandatory | {len(found)} |" in comment
    assert f"- ... and {len(found) - 10} more: see check-full.md (a CI job keeps it as an artifact)\n" in comment
    assert all(f"- `{v['urn'].rsplit('::', 1)[-1]}`: " in full for v in found)


@pytest.mark.parametrize("policies,per_policy,chars", [(3, 40, 100), (38, 500, 2000), (38, 2, 60_000)])
def test_the_comment_fits_whatever_the_findings_and_every_policy_keeps_its_row(policies, per_policy, chars):
    from components.cli.check import markdown
    from components.offline.policy import Violation
    found = [Violation(f"policy-{p:02d}", "mandatory", f"finding {i} " + "x" * chars, f"urn:a::b::res-{i}")
             for p in range(policies) for i in range(per_policy)]
    errors = [f"plan error {i} " + "y" * 500 for i in range(300)]
    text = markdown("big", found, {}, policies, None, errors, "check-full.md")
    assert len(text) <= MAX_COMMENT_CHARS
    assert all(f"| `policy-{p:02d}` | mandatory | {per_policy} |" in text for p in range(policies))
    assert "check-full.md" in text and text.startswith("### gpucluster check: `big` fails\n")
