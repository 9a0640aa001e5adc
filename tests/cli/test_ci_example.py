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
    (["policies/gpucluster_policies/tenancy.py", "stacks/prod.yaml"], ["dev", "prod"]),
    (["stacks/clusterspec.schema.json"], ["dev", "prod"]),
    (["README.md", "stacks/prod.yaml"], ["prod"]),
    (["stacks/x;touch pwned.yaml"], []),              # a file name is no stack name (nor a shell command)
    (["README.md"], []),
])
def test_the_workflow_checks_the_stacks_a_change_touches(tmp_path, changed, expected):
    repo = tmp_path / "repo"
    for path in ("stacks/dev.yaml", "stacks/prod.yaml", "Pulumi.dev.yaml", "policies/config/prod.json",
                 "components/cluster.py", "README.md", "policies/gpucluster_policies/tenancy.py",
                 "stacks/clusterspec.schema.json", "stacks/x;touch pwned.yaml"):
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
    assert not (repo / "pwned").exists()


def steps(job: str) -> list[dict]:
    return yaml.safe_load(WORKFLOW.read_text())["jobs"][job]["steps"]


def test_no_expression_is_interpolated_into_a_shell_line():
    """Values reach scripts through the environment: an expression in `run` is pasted into the script before the
    shell parses it, so a crafted stack name or title would run as code."""
    for job in yaml.safe_load(WORKFLOW.read_text())["jobs"]:
        for step in steps(job):
            assert "${{" not in step.get("run", ""), (job, step.get("name") or step["run"][:40])


FAKE_GH = """#!/usr/bin/env bash
# gh api, as the comment step uses it, over a JSON file of the pull request's comments
set -euo pipefail
echo "$*" >> "$STATE/calls"
args=("$@"); method=GET; jq_filter=""; body=""; path=""
for ((i = 1; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    --method) method=${args[i+1]}; i=$((i + 1)) ;;
    --jq) jq_filter=${args[i+1]}; i=$((i + 1)) ;;
    -f) body=${args[i+1]#body=}; i=$((i + 1)) ;;
    --paginate) ;;
    *) path=${args[i]} ;;
  esac
done
case "$method" in
  GET) jq -r "$jq_filter" "$STATE/comments.json" ;;
  POST) jq --arg b "$body" '. + [{"id": (length + 100), "body": $b}]' "$STATE/comments.json" > "$STATE/new"
        mv "$STATE/new" "$STATE/comments.json" ;;
  PATCH) id=${path##*/}
         jq --arg b "$body" --argjson id "$id" 'map(if .id == $id then .body = $b else . end)' \
           "$STATE/comments.json" > "$STATE/new"
         mv "$STATE/new" "$STATE/comments.json" ;;
esac
"""


@pytest.mark.skipif(shutil.which("jq") is None, reason="needs jq")
def test_one_comment_per_stack_is_posted_once_then_updated_on_every_push(tmp_path):
    comment = next(s for s in steps("check") if s.get("name", "").startswith("Comment the report"))
    assert comment["if"] == "always() && github.event.pull_request.head.repo.full_name == github.repository"
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir(), state.mkdir()
    (bin_dir / "gh").write_text(FAKE_GH)
    (bin_dir / "gh").chmod(0o755)
    (state / "comments.json").write_text(json.dumps([{"id": 7, "body": "a reviewer's comment"}]))
    work = tmp_path / "work"

    def push(stack: str, report: str) -> None:
        (work / "build" / stack).mkdir(parents=True, exist_ok=True)
        (work / "build" / stack / "check.md").write_text(report)
        subprocess.run(["bash", "-c", comment["run"]], cwd=work, check=True,
                       env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STATE": str(state),
                            "STACK": stack, "PR": "12", "REPO": "org/platform"})

    push("prod", "first push\n")
    push("dev", "dev's report\n")
    push("prod", "second push\n")
    bodies = {c["id"]: c["body"] for c in json.loads((state / "comments.json").read_text())}
    assert bodies == {7: "a reviewer's comment", 101: "<!-- gpucluster-check:prod -->\nsecond push",
                      102: "<!-- gpucluster-check:dev -->\ndev's report"}
    assert sum(" POST " in f" {line} " for line in (state / "calls").read_text().splitlines()) == 2


def test_a_fork_pull_request_keeps_the_verdict_and_the_log(tmp_path):
    check = steps("check")
    run = next(s for s in check if s.get("id") == "check")["run"]
    assert "--format markdown" in run and "/dev/null" not in run        # the text report stays in the log
    verdict = next(s for s in check if s.get("name", "").startswith("Fail on"))
    assert "if" in verdict and "head.repo" not in verdict["if"]       # forks fail on a mandatory finding too
    artifact = next(s for s in check if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert "check-full.md" in artifact["with"]["path"] and artifact["if"] == "always()"


def test_actionlint_accepts_the_workflow():
    actionlint = shutil.which("actionlint") or str(ROOT / ".venv" / "bin" / "actionlint")
    if not os.path.exists(actionlint):
        pytest.fail("actionlint is missing: `make test` builds it (go install github.com/rhysd/actionlint/cmd/"
                    "actionlint@v1.7.12 into .venv/bin)")
    out = subprocess.run([actionlint, "-no-color", str(WORKFLOW)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="needs shellcheck")
def test_the_workflows_shell_passes_shellcheck(tmp_path):
    jobs = yaml.safe_load(WORKFLOW.read_text())["jobs"]
    scripts = [s["run"] for job in jobs.values() for s in job["steps"] if "run" in s and "${{" not in s["run"]]
    for i, text in enumerate(scripts):
        path = tmp_path / f"step{i}.sh"
        path.write_text("#!/usr/bin/env bash\n" + text)
        out = subprocess.run(["shellcheck", str(path)], capture_output=True, text=True)
        assert out.returncode == 0, out.stdout
