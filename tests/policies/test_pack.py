"""The pack itself, as `pulumi preview --policy-pack policies` starts it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT


def test_the_pack_starts_its_analyzer_with_every_policy_and_serves():
    """`__main__.py` is only ever run, never imported: PolicyPack prints its port and serves until killed."""
    with pytest.raises(subprocess.TimeoutExpired) as ran:
        subprocess.run([sys.executable, "-u", "__main__.py"], cwd=ROOT / "policies", capture_output=True, timeout=8)
    assert (ran.value.stdout or b"").decode().strip().isdigit(), ran.value.stderr


def test_no_test_imports_the_packs_entry_point():
    for path in (ROOT / "tests").rglob("*.py"):
        if path.name == "test_pack.py":
            continue
        text = path.read_text()
        assert "policies.__main__" not in text and "from __main__" not in text, path
