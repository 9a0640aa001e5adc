"""The host records the scripts and the health monitors share (components/records.py)."""

from __future__ import annotations

import re
import subprocess

from components.k8s.health import checks, detector, nvml
from components.records import PUT_RECORD


def _writers(dev_spec) -> dict[str, str]:
    return {"xid monitor": detector.burn_in_check(dev_spec), "port monitor": detector.port_check(),
            "nvml monitor": nvml.check_script(), "dcgm check": checks.check_script(),
            "nccl check": checks.nccl_script()}


def test_every_monitor_and_check_writes_its_records_through_the_one_writer(dev_spec):
    """A record is replaced only by put_record (whole, then moved over the old one); what else a script keeps
    beside it (the port counts, the hot GPUs' times) is not a record the burn-in monitor reads."""
    for name, text in _writers(dev_spec).items():
        assert text.count("put_record() {") == 1, name
        assert "put_record " in text.replace("put_record() {", ""), name
        assert set(re.findall(r'> "(\$[a-z0-9]+)\.new"', text)) <= {"$1", "$seen", "$since"}, name


def test_a_record_is_two_lines_whole_and_its_folder_is_made(tmp_path):
    record = tmp_path / "state" / "gpu-fault"
    for head, message in (("check 2026-11-29T10:00:00Z failed", "active check failed: dcgm"),
                          ("fabric 2026-11-29T10:01:00Z", "mlx5_0/1: link went down 1 time(s)")):
        subprocess.run(["bash", "-c", f'set -euo pipefail\n{PUT_RECORD}put_record "$1" "$2" "$3"', "_",
                        str(record), head, message], check=True)
        assert record.read_text() == f"{head}\n{message}\n"
    assert [p.name for p in record.parent.iterdir()] == ["gpu-fault"]
