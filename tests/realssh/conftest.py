"""Real SSH test hosts for the scripts pushed over SSH; skipped, with the reason, where they cannot run."""

from __future__ import annotations

import pytest

from .hosts import TestHosts, unavailable


@pytest.fixture(scope="module")
def test_hosts(tmp_path_factory):
    why = unavailable()
    if why:
        pytest.skip(why)
    hosts = TestHosts(tmp_path_factory.mktemp("sshhosts"), ["gpu-dev-01", "gpu-dev-02", "gpu-dev-03"])
    try:                     # a start that fails half-way is undone too, or the next module's hosts clash with it
        yield hosts.start()
    finally:
        hosts.stop()
