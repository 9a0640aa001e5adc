"""A Slurm pool's rollout against the real Slinky operator and Slurm's own daemons: the operator (built from its
module) reconciles the charts' objects on the KWOK nodes and talks to slurmrestd, slurmctld and a slurmd per node
of Slurm 26.05 (tests/e2e/slurm_root.py), which run the jobs. The rollout's drain and uncordon run as pulumi runs
them (bash, kubectl) against the same apiserver."""

from __future__ import annotations

import base64
import threading
import time
from typing import Any, Iterator

import pytest

from components.k8s.slurm import cluster as slurm
from components.nodes.rollout import SLURM_REASON_ANNOTATION, render_rollout
from tests.components.k8s.slurm_specs import SLURM_POOL

from .conftest import Cluster, wait_for
from .slurm_root import SlurmRoot
from .test_rollout import annotations, node, restore, rollout_taint, run_step, with_rollout
from .test_slurm import (HOSTNAME_LABEL, create_database_secret, rendered, slurm_cluster,  # noqa: F401 (fixtures)
                         slurmd_on, slurmd_pods, stored)

pytestmark = pytest.mark.e2e
OPERATOR_REASON = "slurm-operator: "       # slurm-operator v1.1.0 internal/controller/nodeset/slurmcontrol


def jwt_key(c: Cluster) -> bytes:
    """The key the operator signs its tokens with: the Controller's secret (the chart made it)."""
    namespace = c.spec.kubernetes.slurm.namespace
    (controller,) = c.cp.get("controllers.slinky.slurm.net", namespace=namespace)["items"]
    ref = controller["spec"].get("jwtKeyRef") or controller["spec"]["jwtHs256KeyRef"]
    secret = c.cp.get("secret", ref["name"], namespace)
    return base64.b64decode(secret["data"][ref["key"]])


@pytest.fixture(scope="module")
def slinky(slurm_cluster: Cluster, stored: list[dict[str, Any]]) -> Iterator[tuple[Cluster, SlurmRoot]]:
    """Slurm's daemons for the Slurm pool's nodes, then the operator, talking to their slurmrestd; ready once the
    operator has read every node's state from Slurm onto its slurmd pod."""
    c = slurm_cluster
    create_database_secret(c)
    nodes = [slurm.node_name(h.hostname) for h in c.spec.pools[SLURM_POOL].hosts]
    root = SlurmRoot(slurm.render_slurm_values(c.spec)["clusterName"], SLURM_POOL, nodes, jwt_key(c))
    try:
        root.start()
        c.cp.start_slurm_operator(restapi_on_localhost=True)

        def idle() -> bool:
            states = {p["metadata"]["labels"][HOSTNAME_LABEL]: {x["type"] for x in p["status"].get("conditions", [])
                                                                if x["status"] == "True"}
                      for p in slurmd_pods(c) if not p["metadata"].get("deletionTimestamp")}
            return set(states) == set(nodes) and all("SlurmNodeStateIdle" in s for s in states.values())
        wait_for(idle, 120, lambda: f"the operator did not read the nodes' state from slurmrestd\n"
                                    f"{c.cp.log('slurm-operator')}\n{root.log('slurmrestd')}")
        yield c, root
    finally:
        root.close()


def operator_errors(c: Cluster) -> str:
    return "\n".join(line for line in c.cp.log("slurm-operator", 100000).splitlines()
                     if '"level":"error"' in line or "ERROR" in line)[-6000:]


def test_a_slurm_job_holds_its_hosts_drain_until_it_ends_and_no_new_job_starts_there(slinky, tmp_path):
    """The rollout cordons the host with its reason, and Slinky drains the Slurm node: the running job goes on, no
    new job starts there. The drain evicts nothing until Slinky reports the Slurm node drained with no job on it,
    within the pool's bound: past it (a bound too short, here) the host is given up, cordoned and tainted failed,
    the job untouched; the next run waits the job out, then evicts the slurmd pod. The job completed, never
    requeued. The uncordon gives the node back: Slinky undrains the Slurm node and the job that waited runs."""
    c, root = slinky
    pool = c.spec.pools[SLURM_POOL]
    host = pool.hosts[0]
    name = slurm.node_name(host.hostname)
    job = root.run("sbatch", "--parsable", "-p", SLURM_POOL, "-w", name, "--wrap", "sleep 100").stdout.strip()
    wait_for(lambda: root.job(job)["JobState"] == "RUNNING", 30, lambda: f"job {job}: {root.job(job)}")
    try:
        # Started at once: before Slinky has marked the busy slurmd pod for its disruption budget.
        short = render_rollout(with_rollout(pool, drain_timeout_s=20), host, slurm=True)
        out = run_step(c, short.drain, tmp_path, timeout_s=120)
        assert out.returncode == 1, out.stdout + out.stderr
        assert "Slurm did not drain it within 20 s" in out.stderr and "Nothing was evicted" in out.stderr, out.stderr
        n = node(c, host.hostname)
        assert n["spec"].get("unschedulable") is True and rollout_taint(n) == "failed"
        assert root.job(job)["JobState"] == "RUNNING" and host.hostname in slurmd_on(c)

        state = wait_for(lambda: (x := root.node(name))["State"].endswith("+DRAIN") and x, 90,
                         lambda: f"Slinky did not drain {name}: {root.node(name)}\n{operator_errors(c)}")
        assert state["Reason"] == f"{OPERATOR_REASON}gpucluster rollout: restart kubelet (preparation " \
                                  f"e2e-preparation)", state
        waiting = root.run("sbatch", "--parsable", "-p", SLURM_POOL, "-w", name, "--wrap", "sleep 1").stdout.strip()

        scripts = render_rollout(pool, host, slurm=True)        # the next apply: the pool's own bound
        drain: dict[str, Any] = {}
        thread = threading.Thread(target=lambda: drain.update(out=run_step(c, scripts.drain, tmp_path, timeout_s=300)))
        thread.start()
        try:
            time.sleep(10)
            assert thread.is_alive() and host.hostname in slurmd_on(c)
            assert root.job(job)["JobState"] == "RUNNING" and root.job(waiting)["JobState"] == "PENDING"
        finally:
            thread.join(timeout=300)
        out = drain["out"]
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"{host.hostname}: Slurm drained it: no job runs there" in out.stdout, out.stdout
        assert f"{host.hostname}: changed: drained: 1 pod(s) evicted" in out.stdout, out.stdout
        done = root.job(job)
        assert done["JobState"] == "COMPLETED" and done["Restarts"] == "0" and done["ExitCode"] == "0:0", done
        assert root.job(waiting)["JobState"] == "PENDING"

        out = run_step(c, scripts.uncordon, tmp_path, timeout_s=120)
        assert out.returncode == 0 and "rollout done: back in service" in out.stdout, out.stdout + out.stderr
        assert SLURM_REASON_ANNOTATION not in annotations(c, host.hostname)
        wait_for(lambda: "DRAIN" not in root.node(name)["State"], 120,
                 lambda: f"Slinky did not undrain {name}: {root.node(name)}\n{operator_errors(c)}")
        wait_for(lambda: root.job(waiting)["JobState"] == "COMPLETED", 60,
                 lambda: f"the job that waited did not run: {root.job(waiting)}")
    finally:
        root.run("scancel", "--nodelist", name, check=False)
        restore(c, host.hostname)
