"""Whole GPUs and time slices on one real control plane: the dev stack plus a time-sliced pool, whose KWOK nodes
advertise nvidia.com/gpu.shared as the device plugin does with renameByDefault."""

from __future__ import annotations

from typing import Iterator

import pytest

from .conftest import Cluster, dev_with_pool
from .scenarios import grants
from .test_scheduling import _assert_on_pool

pytestmark = pytest.mark.e2e
SHARED = "h100-shared"


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with dev_with_pool(tmp_path_factory.mktemp("e2e-sharing"), SHARED, 8,
                       sharing={"time_slicing_replicas": 4}) as c:
        yield c


def test_a_whole_gpu_job_never_lands_on_slices_even_with_slices_free(mixed: Cluster):
    """Before the rename, slices were nvidia.com/gpu too, and a job Kueue could not fit on the whole-GPU flavor
    went to the shared one: 8 GPUs of work on 8 slices of 2 GPUs."""
    g = next(g for g in grants(mixed.spec) if g.tenant.name == "team-a" and g.pool.name == "h100")
    most = g.nominal + g.borrowable
    fits = mixed.submit(mixed.job(g.tenant, g.pool, "whole", pods=most, gpus_per_pod=1))
    assert set(mixed.wait_admitted(fits).flavors.values()) == {"h100"}
    _assert_on_pool(mixed, mixed.wait_running(fits), g)
    more = mixed.submit(mixed.job(g.tenant, g.pool, "whole-more", pods=1, gpus_per_pod=1))
    pending = mixed.assert_stays_pending(more)
    assert SHARED not in pending.flavors.values(), pending.flavors
    mixed.clean()


def test_a_slice_job_asks_for_the_shared_resource_and_runs_on_the_shared_pool(mixed: Cluster):
    g = next(g for g in grants(mixed.spec) if g.pool.name == SHARED)
    job = mixed.job(g.tenant, g.pool, "slices", pods=g.nominal, gpus_per_pod=1)
    assert job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu.shared"] == "1"
    mixed.submit(job)
    assert set(mixed.wait_admitted(job).flavors.values()) == {SHARED}
    _assert_on_pool(mixed, mixed.wait_running(job), g)
    mixed.clean()
