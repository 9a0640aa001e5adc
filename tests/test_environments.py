"""Every environment the project ships plans cleanly and passes its policies."""

from __future__ import annotations

import pytest

from components.offline.plan import build_plan
from components.offline.policy import evaluate, load_config, load_policies
from components.offline.runner import run_program
from components.spec import load_spec
from tests.conftest import ROOT

ENVIRONMENTS = ["stacks/dev.yaml", "stacks/staging.yaml", "stacks/prod.yaml", "examples/reference-64gpu.yaml",
                "examples/large.yaml", "examples/dev-l40s.yaml", "examples/starter-wekafs.yaml",
                "examples/scale-client.yaml", "examples/isolated-tenants.yaml"]


@pytest.mark.parametrize("path", ENVIRONMENTS)
def test_the_environment_plans_without_errors_and_passes_check(path):
    stack = path.rsplit("/", 1)[-1].removesuffix(".yaml")
    spec = load_spec(ROOT / path)
    run = run_program(ROOT, stack, spec_file=ROOT / path,      # the secrets it needs, as `gpucluster plan` passes them
                      secrets=spec.secret_settings)
    plan = build_plan(run)
    assert plan.errors == []
    assert {"report.md", "topology.svg", "summary.txt", "resources.json"} <= set(plan.files)
    policies = load_policies(ROOT)
    config_file = ROOT / "policies" / "config" / f"{stack}.json"
    config = load_config(config_file, policies) if config_file.exists() else None
    assert [v for v in evaluate(run, policies, config) if v.level == "mandatory"] == []


def test_every_shipped_spec_is_covered():
    specs = [*(ROOT / "stacks").glob("*.yaml"), *(ROOT / "examples").glob("*.yaml")]
    shipped = {str(p.relative_to(ROOT)) for p in specs}
    assert shipped == set(ENVIRONMENTS)
