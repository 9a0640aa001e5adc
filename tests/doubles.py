"""Doubles for the tools that need a GPU, shared by the unit tests and the e2e: each prints real output the test
gives it."""

from __future__ import annotations

from pathlib import Path


def nvidia_smi(bin_dir: Path, query: str, links: str, code: int = 0, calls: Path | None = None) -> None:
    """`bin_dir/nvidia-smi`: `nvidia-smi nvlink ...` prints `links`, any other call (`-q ...`) prints `query`;
    it exits `code` and appends its arguments to `calls` when given."""
    (bin_dir / "query.txt").write_text(query)
    (bin_dir / "links.txt").write_text(links)
    tool = bin_dir / "nvidia-smi"
    tool.write_text("#!/bin/bash\n" + (f'echo "$*" >> {calls}\n' if calls else "")
                    + f"if [[ $1 == nvlink ]]; then cat {bin_dir}/links.txt; else cat {bin_dir}/query.txt; fi\n"
                    + f"exit {code}\n")
    tool.chmod(0o755)
