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


def dmesg(bin_dir: Path, kernel_log: str, code: int = 0) -> None:
    """`bin_dir/dmesg`: prints `kernel_log` (what the kernel's ring buffer holds) to stdout and exits `code`."""
    (bin_dir / "kmsg.txt").write_text(kernel_log)
    tool = bin_dir / "dmesg"
    tool.write_text(f"#!/bin/bash\ncat {bin_dir}/kmsg.txt\nexit {code}\n")
    tool.chmod(0o755)


# XID 48 in the driver's line format (NVIDIA's XID catalog: "DBE has been detected"; the sample's 79 line's
# device and fields): the XID that needs NVIDIA's diagnosis, so quarantines until a burn-in.
DOUBLE_BIT_XID = ("[6781742.102345] NVRM: Xid (PCI:0000:91:00): 48, pid='<unknown>', name=<unknown>, An "
                  "uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 0, "
                  "subpartition 0.")
