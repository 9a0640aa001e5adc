"""The command line as users and CI call it: exit codes, messages, outputs under build/STACK/."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from components.cli import main
from components.cli.schema import render_schema
from tests.conftest import ROOT


def gpucluster(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "components", *args], cwd=cwd, capture_output=True, text=True)


@pytest.fixture
def project(tmp_path) -> Path:
    """A copy of the project's program and dev stack, to break on purpose."""
    for name in ("Pulumi.yaml", "Pulumi.dev.yaml", "__main__.py"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "stacks", tmp_path / "stacks")
    return tmp_path


def test_bad_spec_exits_2_with_every_problem_and_no_traceback(project):
    spec = project / "stacks" / "dev.yaml"
    spec.write_text(spec.read_text().replace("rack: r01", "rack: r09", 1).replace("count: 8", "count: 3"))
    for command in ("validate", "plan"):
        out = gpucluster(command, "dev", cwd=project)
        assert out.returncode == 2, out
        assert "Traceback" not in out.stderr
        assert "node_pools[0].gpu.count: H100-SXM5-80GB hosts carry 4 or 8 GPUs, not 3" in out.stderr
    assert not (project / "build").exists()


def test_plan_writes_under_build_stack_and_prints_the_summary(project):
    out = gpucluster("plan", "dev", cwd=project)
    assert out.returncode == 0, out.stderr
    assert "Stack dev of project gpucluster: 120 resources and 3 read(s) of live objects" in out.stdout
    assert (project / "build" / "dev" / "helm" / "kueue-system-kueue.values.yaml").exists()
    assert (project / "build" / "dev" / "resources.json").exists()
    assert (project / "build" / "dev" / "manifests" / "team-a" / "localqueue-default.yaml").exists()


def test_diff_shows_a_quota_change(project):
    assert gpucluster("plan", "dev", "--out", "build/before", cwd=project).returncode == 0
    spec = project / "stacks" / "dev.yaml"
    spec.write_text(spec.read_text().replace("h100: {nominal: 6, lending_limit: 2}", "h100: {nominal: 5, lending_limit: 2}"))
    assert gpucluster("plan", "dev", "--out", "build/after", cwd=project).returncode == 0
    out = gpucluster("diff", "build/before", "build/after", "--exit-code", cwd=project)
    assert out.returncode == 1
    assert "~  update  kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue dev-team-b-cq" in out.stdout
    assert 'inputs.spec.resourceGroups[0].flavors[0].resources[2].nominalQuota: "6" -> "5"' in out.stdout


def test_diff_of_a_missing_plan_is_bad_input(tmp_path, capsys):
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    assert "run `gpucluster plan STACK --out" in capsys.readouterr().err


def test_validate_accepts_a_spec_path(capsys):
    assert main(["validate", str(ROOT / "stacks" / "dev.yaml")]) == 0
    assert "valid: cluster dev (dev), 1 node pool(s), 16 GPUs, 2 tenant(s)" in capsys.readouterr().out


def test_spec_file_from_stack_config_is_honoured(project):
    (project / "stacks" / "dev.yaml").rename(project / "stacks" / "lab.yaml")
    (project / "Pulumi.dev.yaml").write_text("config:\n  gpucluster:specFile: stacks/lab.yaml\n")
    out = gpucluster("plan", "dev", cwd=project)
    assert out.returncode == 0, out.stderr


def test_not_a_project_folder_is_bad_input(tmp_path):
    out = gpucluster("plan", "dev", cwd=tmp_path)
    assert out.returncode == 2 and "no Pulumi.yaml here" in out.stderr


def test_committed_schema_is_current():
    assert (ROOT / "stacks" / "clusterspec.schema.json").read_text() == render_schema(), \
        "regenerate it with `make schema`"


def test_stack_files_point_editors_at_the_schema():
    for spec in (ROOT / "stacks").glob("*.yaml"):
        assert spec.read_text().startswith("# yaml-language-server: $schema=./clusterspec.schema.json"), spec
