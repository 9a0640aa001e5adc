"""A refactor's proof that behaviour did not change: every stack's and example's offline plan, and a Slurm stack's
and two mirrored stacks' (the variants the refactors of the house touched), planned from a base revision and
from the working tree, compared file by file.

    .venv/bin/python -m tests.same_plans [BASE]     # BASE: a git revision, HEAD when omitted

Prints each plan as identical or the files that differ, and exits 1 when any differs. The base is checked
out into a temporary git worktree and planned with this checkout's interpreter and packages.
"""

from __future__ import annotations

import filecmp
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SPECS = ["stacks/dev.yaml", "stacks/staging.yaml", "stacks/prod.yaml", "examples/large.yaml",
         "examples/reference-64gpu.yaml", "examples/dev-l40s.yaml", "examples/isolated-tenants.yaml"]
MIRROR = "registry.lab.example.internal/mirror"


def variants(out: Path) -> list[Path]:
    """dev with a Slurm pool, the same behind a mirror, staging with SR-IOV behind a mirror keeping no source."""
    sys.path.insert(0, str(ROOT))
    from tests.components.k8s.slurm_specs import with_slurm_pool

    def edited(stack: str, name: str, *edits) -> Path:
        data = yaml.safe_load((ROOT / "stacks" / f"{stack}.yaml").read_text())
        for edit in edits:
            edit(data)
        path = out / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    def mirror(data: dict) -> None:
        data["kubernetes"]["image_registry"] = MIRROR

    def sriov(data: dict) -> None:
        data["kubernetes"].update(keep_source_registry=False)
        data["kubernetes"]["network_operator"]["rdma_device_plugin"] = "sriov"

    return [edited("dev", "slurm", with_slurm_pool), edited("dev", "slurmmirror", with_slurm_pool, mirror),
            edited("staging", "stagingmirror", mirror, sriov)]


def plan(tree: Path, spec: Path, out: Path) -> None:
    code = (f"import sys; sys.path.insert(0, {str(tree)!r}); sys.argv = ['gpucluster', 'plan', {str(spec)!r}, "
            f"'--out', {str(out)!r}]; from components.cli import entry; entry()")
    done = subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"planning {spec} in {tree} failed:\n{done.stderr[-2000:]}")


def differing(a: Path, b: Path) -> list[str]:
    cmp = filecmp.dircmp(a, b)
    out = [f"{p} (only in one)" for p in cmp.left_only + cmp.right_only] + list(cmp.diff_files)
    for sub in cmp.common_dirs:
        out += [f"{sub}/{p}" for p in differing(a / sub, b / sub)]
    return out


def main(argv: list[str]) -> int:
    base = argv[0] if argv else "HEAD"
    with tempfile.TemporaryDirectory(prefix="same-plans-") as tmp:
        work = Path(tmp)
        worktree = work / "base"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(worktree), base], cwd=ROOT, check=True)
        try:
            specs = [ROOT / s for s in SPECS] + variants(work)
            changed = 0
            for spec in specs:
                before, after = work / "before" / spec.stem, work / "after" / spec.stem
                plan(worktree, spec if spec.is_relative_to(work) else worktree / spec.relative_to(ROOT), before)
                plan(ROOT, spec, after)
                files = differing(before, after)
                changed += bool(files)
                print(f"{spec.stem}: " + ("identical" if not files else "differs in " + ", ".join(files)))
            return 1 if changed else 0
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT, check=False)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
