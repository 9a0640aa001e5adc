"""A node pool dedicated to one tenant, on the real control plane and the pinned Kueue: the dev stack plus a pool
of two hosts that only team-a may use."""

from __future__ import annotations

from typing import Iterator

import pytest

from components.k8s.labels import POOL_LABEL
from components.spec.hardware import DEDICATED_TAINT

from .conftest import Cluster, dev_with_pool
from .scenarios import grants
from .test_scheduling import _assert_on_pool

pytestmark = pytest.mark.e2e
OWNED = "h100-team-a"


@pytest.fixture(scope="module")
def owned(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with dev_with_pool(tmp_path_factory.mktemp("e2e-dedicated"), OWNED, 16, dedicated_to="team-a") as c:
        yield c


def test_the_owner_fills_its_pool_whose_nodes_carry_its_tenant_taint(owned: Cluster):
    nodes = [n for n in owned.nodes().values() if n["metadata"]["labels"].get(POOL_LABEL) == OWNED]
    assert len(nodes) == 2
    for n in nodes:
        assert {"key": DEDICATED_TAINT, "value": "team-a", "effect": "NoSchedule"} in n["spec"]["taints"]
    g = next(g for g in grants(owned.spec) if g.pool.name == OWNED)
    assert g.tenant.name == "team-a" and g.borrowable == 0          # nobody else lends on it
    job = owned.submit(owned.job(g.tenant, g.pool, "own", pods=2, gpus_per_pod=8))
    assert set(owned.wait_admitted(job).flavors.values()) == {OWNED}
    _assert_on_pool(owned, owned.wait_running(job), g)
    owned.clean()


def test_another_tenant_never_gets_the_pool_even_while_it_is_idle(owned: Cluster):
    """team-b asks for more than the shared pool gives it, and then aims a job at the idle pool itself (a node
    selector and a toleration of the owner's taint): Kueue admits neither, and no pod of it exists."""
    b = owned.tenant("team-b")
    shared = next(g for g in grants(owned.spec) if g.tenant is b)
    beyond = owned.submit(owned.job(b, shared.pool, "beyond", pods=shared.nominal + shared.borrowable + 1,
                                    gpus_per_pod=1))
    assert OWNED not in owned.assert_stays_pending(beyond).flavors.values()
    aimed = owned.job(b, shared.pool, "aimed", pods=1, gpus_per_pod=1)
    pod = aimed["spec"]["template"]["spec"]
    pod["nodeSelector"] = {**pod.get("nodeSelector", {}), POOL_LABEL: OWNED}
    pod["tolerations"] = [*pod.get("tolerations", []), {"key": DEDICATED_TAINT, "operator": "Exists"}]
    owned.submit(aimed)
    assert OWNED not in owned.assert_stays_pending(aimed).flavors.values()
    owned.clean()


def test_a_pod_bound_to_a_dedicated_node_by_name_is_refused_in_another_tenants_namespace(owned: Cluster):
    """nodeName skips the scheduler and with it every taint; Kueue gates each pod of a tenant namespace, and the
    apiserver refuses a gated pod that names its node."""
    node = next(n for n, o in owned.nodes().items() if o["metadata"]["labels"].get(POOL_LABEL) == OWNED)
    ns = owned.tenant("team-b").namespace_name
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "by-name", "namespace": ns},
           "spec": {"nodeName": node, "containers": [{
               "name": "c", "image": "busybox:1.36", "resources": {"limits": {"nvidia.com/gpu": "1"}},
               "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True, "runAsUser": 1000,
                                   "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}}]}}
    proc = owned.cp.apply_objects([pod], check=False)
    assert proc.returncode != 0, f"team-b's pod was bound to {node}"
    assert "nodeName" in proc.stderr and "schedulingGates" in proc.stderr, proc.stderr
