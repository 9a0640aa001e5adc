"""Slurm's node check as rendered: what it expects of each node, its bounds, and what it asks the controller.
The check itself runs against real Slurm daemons in test_daemons.py."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from components.k8s.slurm import cluster as slurm, node_check as slurm_health
from tests.components.k8s.slurm_specs import H200_POOL, SLURM_POOL, with_h200_pool, with_slurm_pool


@pytest.fixture
def spec(make_spec):
    def four_h200s(data):          # four GPUs of a board of eight: no NVSwitch between them
        with_slurm_pool(data)
        with_h200_pool(data)
        next(p for p in data["node_pools"] if p["name"] == H200_POOL)["gpu"]["count"] = 4
    return make_spec(four_h200s)


def arms(script: str) -> dict[str, str]:
    """The case arms of the node table: node -> "gpus=N nvswitch=B"."""
    table = {}
    for names, what in re.findall(r"^  ([a-z0-9|.-]+)\) (gpus=\d+ nvswitch=[01]) ;;$", script, re.M):
        table.update(dict.fromkeys(names.split("|"), what))
    return table


def test_each_slurm_node_is_known_by_its_pools_gpu_count_and_nvswitch_board_without_asking_the_controller(spec):
    for when in ("prolog", "epilog"):
        table = arms(slurm_health.render_node_check(spec, when))
        expected = {slurm.node_name(h.hostname): f"gpus={p.gpu.count} nvswitch={int(p.gpu.nvswitch)}"
                    for p in slurm.slurm_pools(spec) for h in p.hosts}
        assert table == expected
        assert {p.name for p in slurm.slurm_pools(spec)} == {SLURM_POOL, H200_POOL}
        assert "gpus=4 nvswitch=0" in table.values() and "gpus=8 nvswitch=1" in table.values()


def test_the_controller_is_only_told_never_asked_and_every_command_is_bounded(spec):
    """A controller restart must not become a verdict: scontrol only drains or comments, after the checks, and
    every tool runs under `run SECONDS ...` (timeout)."""
    for when in ("prolog", "epilog"):
        code = [line for line in slurm_health.render_node_check(spec, when).splitlines()
                if not line.lstrip().startswith(("#", "echo", "reasons+=", "unknown+="))]
        for tool in ("scontrol", "nvidia-smi", "dcgmi"):
            used = [line for line in code if re.search(rf"\b{tool} ", line) and "command -v" not in line]
            assert used and all(re.search(rf"\brun \d+ {tool} ", line) for line in used), used
        assert all(" scontrol update " in line for line in code if "scontrol " in line)


def test_dcgm_runs_after_jobs_only_and_slurm_never_kills_the_check(spec):
    assert "run 120 dcgmi diag -r 1" in slurm_health.render_node_check(spec, "epilog")
    assert "(( 0 )) && command -v dcgmi" in slurm_health.render_node_check(spec, "prolog")
    assert slurm_health.script_bound_s("prolog") < slurm_health.script_bound_s("epilog") \
        < slurm_health.PROLOG_EPILOG_TIMEOUT_S
    conf = slurm.render_extra_conf(spec).splitlines()
    assert f"PrologEpilogTimeout={slurm_health.PROLOG_EPILOG_TIMEOUT_S}" in conf
    assert "SchedulerParameters=nohold_on_prolog_fail" in conf


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed (.ci/run installs it)")
@pytest.mark.parametrize("when", ["prolog", "epilog"])
def test_the_node_check_passes_shellcheck(spec, tmp_path, when):
    path = tmp_path / f"{when}.sh"
    path.write_text(slurm_health.render_node_check(spec, when))
    out = subprocess.run(["shellcheck", "-S", "style", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout
