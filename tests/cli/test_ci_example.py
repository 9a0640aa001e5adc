"""The example pull-request workflow: its stack selection runs for real on a scratch repository."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import yaml

from tests.conftest import ROOT

WORKFLOW = ROOT / "examples" / "github-actions" / "gpucluster-check.yml"


def touched_script() -> str:
    jobs = yaml.safe_load(WORKFLOW.read_text())["jobs"]
    return next(s["run"] for s in jobs["stacks"]["steps"] if s.get("id") == "touched")


def git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t"})


@pytest.mark.skipif(shutil.which("jq") is None or shutil.which("git") is None, reason="needs git and jq")
@pytest.mark.parametrize("changed,expected", [
    (["stacks/prod.yaml"], ["prod"]),
    (["Pulumi.dev.yaml", "policies/config/prod.json"], ["dev", "prod"]),
    (["components/cluster.py"], ["dev", "prod"]),
    (["README.md"], []),
])
def test_the_workflow_checks_the_stacks_a_change_touches(tmp_path, changed, expected):
    repo = tmp_path / "repo"
    for path in ("stacks/dev.yaml", "stacks/prod.yaml", "Pulumi.dev.yaml", "policies/config/prod.json",
                 "components/cluster.py", "README.md"):
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text("v1\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    base = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    for path in changed:
        (repo / path).write_text("v2\n")
    git(repo, "commit", "-qam", "change")
    out_file = tmp_path / "out"
    subprocess.run(["bash", "-c", touched_script()], cwd=repo, check=True,
                   env={**os.environ, "BASE": base, "GITHUB_OUTPUT": str(out_file)})
    line = out_file.read_text().strip()
    assert line.startswith("stacks=") and json.loads(line.removeprefix("stacks=")) == expected


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="needs shellcheck")
def test_the_workflows_shell_passes_shellcheck(tmp_path):
    jobs = yaml.safe_load(WORKFLOW.read_text())["jobs"]
    scripts = [s["run"] for job in jobs.values() for s in job["steps"] if "run" in s and "${{" not in s["run"]]
    for i, text in enumerate(scripts):
        path = tmp_path / f"step{i}.sh"
        path.write_text("#!/usr/bin/env bash\n" + text)
        out = subprocess.run(["shellcheck", str(path)], capture_output=True, text=True)
        assert out.returncode == 0, out.stdout
