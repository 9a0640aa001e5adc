"""Quantities as the apiserver writes them back (resource.Quantity's canonical form), so a second preview after
an up shows no diff: what the real engine found on Kueue's ClusterQueues."""

import pytest

from components.k8s.quantities import binary, cpu


@pytest.mark.parametrize("n, unit, shown", [
    (0, "Gi", "0"), (1, "Gi", "1Gi"), (512, "Gi", "512Gi"), (1536, "Gi", "1536Gi"), (2048, "Gi", "2Ti"),
    (1024, "Mi", "1Gi"), (3 * 1024 ** 2, "Gi", "3Pi"), (1024 ** 2, "Ti", "1Ei"), (1024 ** 3, "Ti", "1024Ei")])
def test_a_binary_quantity_takes_the_largest_suffix_that_keeps_it_whole(n, unit, shown):
    assert binary(n, unit) == shown


@pytest.mark.parametrize("given, shown", [("500m", "500m"), ("0.5", "500m"), ("2", "2"), ("2000m", "2"),
                                          ("1.25", "1250m"), ("0", "0")])
def test_a_cpu_amount_is_whole_cores_or_millicores(given, shown):
    assert cpu(given) == shown
