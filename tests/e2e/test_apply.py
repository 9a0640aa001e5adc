"""Every object of every stack's plan is accepted by the real apiserver, Kueue's webhooks and the upstream CRDs."""

from __future__ import annotations

import pytest
import yaml

from .conftest import Cluster
from .stack import SHARED_CRDS

pytestmark = pytest.mark.e2e


def test_every_object_of_the_plan_is_stored_as_planned(cluster: Cluster):
    for obj in cluster.plan.objects:
        m = obj["metadata"]
        kind = obj["kind"].lower() + ("." + obj["apiVersion"].split("/")[0] if "." in obj["apiVersion"] else "")
        live = cluster.cp.get(kind, m["name"], namespace=m.get("namespace"))
        assert live["metadata"].get("labels", {}) | m.get("labels", {}) == live["metadata"].get("labels", {}), \
            f"{obj['kind']}/{m['name']}: labels differ from the plan"
    assert len(cluster.applied) == len(cluster.plan.objects)


def test_objects_without_a_crd_here_are_the_only_ones_not_applied(cluster: Cluster):
    kinds = {o.split("/")[0] for objs in cluster.plan.skipped.values() for o in objs}
    if SHARED_CRDS.is_dir():      # with ../shared, only nv-ipam's kind has no CRD here
        assert kinds <= {"IPPool"}, kinds
    if cluster.plan.skipped:
        pytest.skip("; ".join(f"{why}: {', '.join(objs)}" for why, objs in cluster.plan.skipped.items()))


def test_every_kueue_object_is_active(cluster: Cluster):
    """Kueue marks a ClusterQueue inactive when a flavor, cohort or topology it needs is missing or wrong."""
    for kind in ("clusterqueues", "localqueues"):
        for item in cluster.cp.get(f"{kind}.kueue.x-k8s.io")["items"]:
            conds = {c["type"]: c for c in item.get("status", {}).get("conditions", [])}
            assert conds.get("Active", {}).get("status") == "True", \
                f"{kind} {item['metadata']['name']}: {conds.get('Active', {}).get('message', 'no Active condition')}"


def test_nodes_carry_exactly_what_the_node_patches_set(cluster: Cluster):
    nodes = cluster.nodes()
    assert sorted(nodes) == sorted(h.hostname for _, h in cluster.spec.hosts())
    for patch in cluster.plan.node_patches:
        live = nodes[patch["metadata"]["name"]]
        assert patch["metadata"]["labels"].items() <= live["metadata"]["labels"].items()


def test_example_jobs_are_accepted_and_reference_what_exists(cluster: Cluster):
    """The plan's jobs/ templates (a Job per tenant and pool, an MPIJob where two whole-GPU workers fit):
    admitted by the apiserver (LimitRange, Kueue's webhooks, the MPIJob CRD's schema), every pod template run as
    a pod of its namespace passes its Pod Security, and every ConfigMap they read exists there."""
    paths = sorted((cluster.plan.dir / "jobs").glob("*.yaml"))
    expected = {f"{t.name}-{pool}" for t in cluster.spec.tenants for pool in t.gpu_quota}
    expected |= {f"{t.name}-{pool}-mpi" for t in cluster.spec.tenants for pool, q in t.gpu_quota.items()
                 if q.nominal >= 2 and len(cluster.spec.pools[pool].hosts) >= 2
                 and not cluster.spec.pools[pool].sharing.time_slicing_replicas
                 and not cluster.spec.pools[pool].sharing.mig_config}
    assert {p.stem for p in paths} == expected
    for job in (yaml.safe_load(p.read_text()) for p in paths):
        proc = cluster.cp.apply_objects([job], dry_run=True, check=False)
        assert proc.returncode == 0, proc.stderr
        ns = job["metadata"]["namespace"]
        templates = ([r["template"] for r in job["spec"]["mpiReplicaSpecs"].values()] if job["kind"] == "MPIJob"
                     else [job["spec"]["template"]])
        for i, template in enumerate(templates):
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{job['metadata']['name']}-{i}",
                                                                    "namespace": ns},
                   "spec": {"restartPolicy": "Never", **template["spec"]}}
            proc = cluster.cp.apply_objects([pod], dry_run=True, check=False)
            assert proc.returncode == 0, f"{job['metadata']['name']} template {i}: {proc.stderr}"
            for container in template["spec"]["containers"]:
                for ref in container.get("envFrom", []):
                    cluster.cp.get("configmap", ref["configMapRef"]["name"], namespace=ns)


def test_after_apply_checks_are_accepted_and_reference_what_exists(cluster: Cluster):
    """The NCCL check: its namespace is accepted, and each of its pod templates, run as a pod there, passes
    admission (Pod Security of that namespace), with every ConfigMap and Secret it reads present, and as many
    nodes matching its node selector and tolerations as it has replicas, each with room for its requests."""
    nodes = list(cluster.nodes().values())
    checked = 0
    for obj in cluster.plan.checks:
        if obj["kind"] == "Namespace":
            cluster.cp.apply_objects([obj])
            continue
        assert obj["kind"] == "MPIJob", obj["kind"]
        ns = obj["metadata"]["namespace"]
        for role, replica in obj["spec"]["mpiReplicaSpecs"].items():
            template = replica["template"]
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": f"{obj['metadata']['name']}-{role.lower()}", "namespace": ns},
                   "spec": {**template["spec"], "restartPolicy": "Never"}}
            proc = cluster.cp.apply_objects([pod], dry_run=True, check=False)
            assert proc.returncode == 0, f"{role} of {obj['metadata']['name']}: {proc.stderr}"
            for container in template["spec"]["containers"]:
                for ref in container.get("envFrom", []):
                    kind = "configmap" if "configMapRef" in ref else "secret"
                    cluster.cp.get(kind, (ref.get("configMapRef") or ref["secretRef"])["name"], namespace=ns)
            misfits = {n["metadata"]["name"]: _misfit(template["spec"], n) for n in nodes}
            fitting = [name for name, why in misfits.items() if why is None]
            assert len(fitting) >= replica["replicas"], \
                f"{role} of {obj['metadata']['name']}: {replica['replicas']} replicas, {len(fitting)} nodes fit: {misfits}"
            checked += 1
    assert checked == 2 * len(cluster.spec.node_pools)


def _misfit(pod: dict, node: dict) -> str | None:
    """Why kube-scheduler's first questions rule the node out (node selector, NoSchedule taints, extended
    resources), or None when it fits."""
    labels = node["metadata"].get("labels", {})
    wrong = {k: v for k, v in (pod.get("nodeSelector") or {}).items() if labels.get(k) != v}
    if wrong:
        return f"node selector {wrong}"
    tolerated = {(t.get("key"), t.get("value")) for t in pod.get("tolerations") or []}
    exists = {t.get("key") for t in pod.get("tolerations") or [] if t.get("operator") == "Exists"}
    for taint in node["spec"].get("taints") or []:
        if taint["effect"] in ("NoSchedule", "NoExecute") and taint["key"] not in exists \
                and (taint["key"], taint.get("value")) not in tolerated:
            return f"taint {taint}"
    allocatable = node["status"]["allocatable"]
    for c in pod["containers"]:
        for name, value in (c.get("resources", {}).get("limits") or {}).items():
            if name.startswith(("nvidia.com/", "rdma/")) and int(value) > int(allocatable.get(name, "0")):
                return f"{name}: {value} > {allocatable.get(name, '0')}"
    return None


def test_the_validation_suite_is_accepted_and_each_check_fits_the_nodes(cluster: Cluster):
    """The suite `gpucluster validate --kubeconfig` applies: its Jobs, volume and claim are accepted; each Job's
    pod passes the checks namespace's admission (baseline Pod Security) and finds as many nodes as it runs pods."""
    nodes = list(cluster.nodes().values())
    docs = [o for p in sorted((cluster.plan.dir / "validation").glob("*.yaml"))
            for o in yaml.safe_load_all(p.read_text()) if o]
    cluster.cp.apply_objects([o for o in docs if o["kind"] in ("Namespace", "PersistentVolume")])
    jobs = [o for o in docs if o["kind"] == "Job"]
    for obj in [o for o in docs if o["kind"] == "PersistentVolumeClaim"] + jobs:
        proc = cluster.cp.apply_objects([obj], dry_run=True, check=False)
        assert proc.returncode == 0, f"{obj['kind']} {obj['metadata']['name']}: {proc.stderr}"
    for job in jobs:
        template = job["spec"]["template"]
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": job["metadata"]["name"],
                                                               "namespace": job["metadata"]["namespace"]},
               "spec": {k: v for k, v in template["spec"].items() if k != "affinity"}}
        proc = cluster.cp.apply_objects([pod], dry_run=True, check=False)
        assert proc.returncode == 0, f"pod of {job['metadata']['name']}: {proc.stderr}"
        fitting = [n for n in nodes if _misfit(template["spec"], n) is None]
        assert len(fitting) >= job["spec"].get("parallelism", 1), job["metadata"]["name"]
    assert len(jobs) == len(list(cluster.spec.hosts())) + (cluster.spec.storage.kind != "none")


def test_a_node_patch_keeps_a_persons_taint_and_the_old_one_would_drop_it(cluster: Cluster):
    """On the real apiserver, Node.spec.taints is one atomic value under server-side apply: a forced apply of the
    library's taints alone removes a taint a person set with `kubectl taint`; the patch built from the live node
    (as `<pool>-<host>-live` reads it) keeps it, and a second apply changes nothing."""
    from components.nodes.node_pool import NodePoolArgs, live_taints, managed_before, render_node_patch
    pool, host = next(cluster.spec.hosts())
    args, name = NodePoolArgs.from_spec(cluster.spec, pool), host.hostname
    cp, persons = cluster.cp, {"key": "example.com/maintenance", "value": "disk", "effect": "NoSchedule"}

    def apply_patch(live_node: dict | None) -> list[dict]:
        spec, meta = (live_node or {}).get("spec"), (live_node or {}).get("metadata")
        patch = render_node_patch(args, host, (True, "passed"), live_taints(spec), managed_before(meta))
        cp.kubectl("apply", "--server-side", "--field-manager=pulumi-kubernetes", "--force-conflicts", "-f", "-",
                   input=yaml.safe_dump(patch))
        return cp.get("node", name)["spec"].get("taints") or []

    try:
        cp.kubectl("taint", "node", name, "example.com/maintenance=disk:NoSchedule")
        kept = apply_patch(cp.get("node", name))
        assert persons in kept, kept
        assert apply_patch(cp.get("node", name)) == kept                    # a re-apply changes nothing
        dropped = apply_patch(None)                                          # the patch without the live read
        assert persons not in dropped and dropped == render_node_patch(args, host, (True, "passed"))["spec"]["taints"]
    finally:
        cp.kubectl("taint", "node", name, "example.com/maintenance-", check=False)
        cluster.set_nodes()
