"""Slinky's charts, rendered by the real helm with the values the stack gives them, and what they render accepted
by the real control plane beside the stack's own objects for a Slurm pool (its MariaDB, its accounts Job).

Slinky's operator, built from its module, then reconciles them against the KWOK nodes: a slurmd pod on each
node of the Slurm pool, and the slurm.conf it writes."""

from __future__ import annotations

import base64
import copy
import secrets
import subprocess
import time
from typing import Any, Iterator

import pytest
import yaml

from components.k8s.health import quarantine
from components.k8s.slurm import cluster as slurm, node_check as slurm_health
from components.k8s.labels import POOL_LABEL, QUARANTINE_TAINT
from tests.components.k8s.slurm_specs import SLURM_POOL, with_slurm_pool
from tests.conftest import _DEV

from .conftest import Cluster, running_cluster, wait_for
from .controlplane import TOOLS

pytestmark = pytest.mark.e2e
SLINKY_KINDS = {"Accounting", "Controller", "LoginSet", "NodeSet", "RestApi", "Token"}
NODESET_LABEL = "nodeset.slinky.slurm.net/scaling-mode"     # slurm-operator v1.1.0 api/v1beta1/well_known.go
HOSTNAME_LABEL = "nodeset.slinky.slurm.net/pod-hostname"    # ... the Slurm node the pod registers as


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    work = tmp_path_factory.mktemp("e2e-slurm")
    data = copy.deepcopy(_DEV)
    with_slurm_pool(data)
    data["kubernetes"]["mpi_operator"] = {"enabled": False}       # no MPIJob in what Slurm's tests show
    # Login nodes on an anonymous directory (a bind_dn's password would be a stack secret the plan cannot read).
    data["kubernetes"]["slurm"]["login"] = {"directory": {
        "uris": ["ldaps://ldap.lab1.example"], "search_base": "dc=lab1,dc=example", "group_prefix": "oidc:",
        "ca_configmap": "directory-ca"}}
    path = work / "dev-slurm.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with running_cluster(path, work) as c:
        yield c


def helm_template(cluster: Cluster, release: str, chart: str, namespace: str) -> list[dict[str, Any]]:
    """`helm template` of the pinned chart with the values file the plan wrote for the release (what Pulumi's
    helm Release passes), for the spec's Kubernetes version."""
    values = cluster.plan.dir / "helm" / f"{namespace}-{release}.values.yaml"
    proc = subprocess.run([str(TOOLS / "bin" / "helm"), "template", release, str(TOOLS / "slinky-charts" / chart),
                           "--namespace", namespace, "--kube-version", f"{cluster.spec.kubernetes.version}.0",
                           "--values", str(values)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {[(o['kind'], o['metadata']['name']) for o in objects]}"
    return found[0]


@pytest.fixture(scope="module")
def rendered(slurm_cluster: Cluster) -> dict[str, list[dict[str, Any]]]:
    operator = helm_template(slurm_cluster, slurm.OPERATOR_RELEASE, "slurm-operator", "slinky")
    cluster = helm_template(slurm_cluster, slurm.RELEASE, "slurm", slurm_cluster.spec.kubernetes.slurm.namespace)
    return {"operator": operator, "cluster": cluster}


def test_the_operator_chart_brings_its_crds_and_the_pinned_images(rendered):
    crds = [o for o in rendered["operator"] if o["kind"] == "CustomResourceDefinition"]
    assert {c["spec"]["names"]["kind"] for c in crds} == SLINKY_KINDS
    images = {c["image"] for o in rendered["operator"] if o["kind"] == "Deployment"
              for c in o["spec"]["template"]["spec"]["containers"]}
    assert images == {"ghcr.io/slinkyproject/slurm-operator:1.1.0", "ghcr.io/slinkyproject/slurm-operator-webhook:1.1.0"}
    assert not [o for o in rendered["operator"] if o["apiVersion"].startswith("cert-manager.io/")]


def test_the_cluster_chart_carries_the_generated_config(slurm_cluster, rendered):
    spec, objects = slurm_cluster.spec, rendered["cluster"]
    controller = one(objects, "Controller", "slurm")["spec"]
    assert slurm.render_extra_conf(spec) in controller["extraConf"]
    assert controller["clusterName"] == spec.name and controller["accountingRef"]["name"] == "slurm"
    extra = one(objects, "ConfigMap", "slurm-config-extra")["data"]
    assert extra == {"gres.conf": slurm.render_gres_conf(spec), "cgroup.conf": slurm.render_cgroup_conf(),
                     "topology.conf": slurm.render_topology_conf(spec), "job_submit.lua": slurm.render_job_submit(spec)}
    scripts = {k: v for o in objects if o["kind"] == "ConfigMap" for k, v in (o.get("data") or {}).items()}
    for when in ("prolog", "epilog"):
        assert scripts[f"{when}-{slurm_health.SCRIPT}"] == slurm_health.render_node_check(spec, when)
    nodeset = one(objects, "NodeSet", f"slurm-worker-{SLURM_POOL}")["spec"]
    assert nodeset["scalingMode"] == "DaemonSet"
    assert sorted(nodeset["extraConf"].split()) == ["Features=h100-sxm5-80gb", "Gres=gpu:h100-sxm5-80gb:8"]
    assert sorted(nodeset["partition"]["config"].split()) == ["Default=YES", "MaxTime=0-12:00:00", "State=UP"]
    pod = nodeset["template"]["spec"]
    assert pod["nodeSelector"] == {POOL_LABEL: SLURM_POOL}    # a NodeSet of its own: not the example's defaults
    assert pod["hostname"] == f"{SLURM_POOL}-"          # the operator names the NodeSet's Slurm nodes by it
    storage = one(objects, "Accounting", "slurm")["spec"]["storageConfig"]
    assert storage["host"] == slurm.MARIADB and storage["passwordKeyRef"]["name"] == slurm.DATABASE_SECRET
    assert not [o for o in objects if o["kind"] in ("NodeSet", "LoginSet") and "slinky" in o["metadata"]["name"]]


@pytest.fixture(scope="module")
def stored(slurm_cluster: Cluster, rendered: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The operator chart's CRDs, then the cluster chart's objects (its Secrets are made by Helm at install, with
    keys of its own), dry run then for real; the objects sent."""
    cp = slurm_cluster.cp
    crds = [o for o in rendered["operator"] if o["kind"] == "CustomResourceDefinition"]
    cp.apply_objects(crds)
    cp.kubectl("wait", "--for=condition=Established", "--timeout=60s", *[f"crd/{c['metadata']['name']}" for c in crds])
    objects = rendered["cluster"]
    for dry_run in (True, False):
        proc = cp.apply_objects(objects, dry_run=dry_run, check=False)
        assert proc.returncode == 0, proc.stderr
    return objects


def test_the_control_plane_accepts_what_the_charts_render_and_keeps_every_field(slurm_cluster, stored):
    cp = slurm_cluster.cp
    namespace = slurm_cluster.spec.kubernetes.slurm.namespace
    for kind in ("Controller", "NodeSet", "Accounting", "RestApi", "LoginSet"):
        for sent in (o for o in stored if o["kind"] == kind):
            stored_object = cp.get(f"{kind.lower()}s.slinky.slurm.net", sent["metadata"]["name"], namespace)
            lost = _lost(sent["spec"], stored_object["spec"])
            assert not lost, f"{kind}/{sent['metadata']['name']} lost {lost}"
    # The stack's own objects for Slurm were applied with the plan (the database password's Secret excepted).
    applied = set(slurm_cluster.applied)
    assert {f"StatefulSet/{namespace}/{slurm.MARIADB}", f"Service/{namespace}/{slurm.MARIADB}"} <= applied
    assert any(a.startswith(f"Job/{namespace}/{slurm.ACCOUNTS}-") for a in applied)
    assert f"CronJob/{namespace}/{slurm.USER_SYNC}" in applied           # the login groups' members as users


def create_database_secret(c: Cluster) -> None:
    """The database password's Secret, which Pulumi makes from its generated secret (the plan shows none)."""
    c.cp.kubectl("create", "secret", "generic", slurm.DATABASE_SECRET, "-n", c.spec.kubernetes.slurm.namespace,
                 f"--from-literal=password={secrets.token_hex(12)}")


@pytest.fixture(scope="module")
def operator(slurm_cluster: Cluster, stored: list[dict[str, Any]]) -> Cluster:
    """Slinky's operator, built from its module, reconciling what the charts rendered. Its REST client would
    reach slurmctld through slurmrestd, which no KWOK pod runs, and the NodeSet controller stops at the first
    call it cannot make; without the RestApi object it has no client and runs as it does before slurmrestd is up.
    (test_slurm_rollout.py runs it against Slurm's own slurmrestd.)"""
    cp, namespace = slurm_cluster.cp, slurm_cluster.spec.kubernetes.slurm.namespace
    cp.kubectl("delete", "restapis.slinky.slurm.net", "--all", "-n", namespace)
    create_database_secret(slurm_cluster)
    cp.start_slurm_operator()
    return slurm_cluster


def slurmd_pods(cluster: Cluster) -> list[dict[str, Any]]:
    return cluster.cp.get("pods", namespace=cluster.spec.kubernetes.slurm.namespace,
                          selector=f"{NODESET_LABEL}=DaemonSet")["items"]


def slurmd_on(cluster: Cluster) -> dict[str, str]:
    """Node -> its slurmd pod, of those not being deleted."""
    return {p["spec"].get("nodeName"): p["metadata"]["name"] for p in slurmd_pods(cluster)
            if not p["metadata"].get("deletionTimestamp")}


def test_the_operator_runs_one_slurmd_on_each_node_of_the_slurm_pool_named_after_its_host(operator):
    pool = operator.spec.pools[SLURM_POOL]
    want = {h.hostname: slurm.node_name(h.hostname) for h in pool.hosts}

    def placed() -> dict[str, str]:
        return {p["spec"].get("nodeName"): p["metadata"]["labels"].get(HOSTNAME_LABEL) for p in slurmd_pods(operator)
                if p["status"].get("phase") == "Running"}

    wait_for(lambda: placed() == want and len(slurmd_pods(operator)) == len(want), 120,
             lambda: f"slurmd pods: {placed()}; want {want}\n{operator.cp.log('slurm-operator')[-3000:]}")
    pod = slurmd_pods(operator)[0]
    slurmd = next(c for c in pod["spec"]["containers"] if c["name"] == "slurmd")
    assert slurmd["resources"]["limits"][pool.gpu_resource_name] == str(pool.gpu.count)
    assert {t["key"] for t in pod["spec"].get("tolerations") or []} >= {t.key for t in pool.taints}
    assert pod["spec"]["hostname"] == pod["metadata"]["labels"][HOSTNAME_LABEL]


def test_a_quarantined_node_loses_its_slurmd_and_gets_it_back_once_released(operator):
    """Day 2: the evict rule's taint as node-readiness-controller sets it with `drain: true` (NoExecute). The
    slurmd pod tolerates only the pool's taints, so Kubernetes evicts it and the operator starts none there while
    the taint holds (Slurm then sees the node down and requeues its job); lifting the taint brings it back."""
    cp, spec = operator.cp, operator.spec
    pool = spec.pools[SLURM_POOL]
    host, others = pool.hosts[0].hostname, {h.hostname for h in pool.hosts[1:]}
    on = lambda: set(slurmd_on(operator))   # noqa: E731
    evict = quarantine.render_evict_rule(spec).obj["spec"]["taint"]         # on a node the breaker granted
    taint = f"{evict['key']}={evict['value']}:{evict['effect']}"
    cp.kubectl("taint", "node", host, taint)
    try:
        wait_for(lambda: on() == others, 90, lambda: f"slurmd pods on {on()}, want {others}")
        time.sleep(3)                                   # the operator's next passes start none on the tainted node
        assert on() == others
    finally:
        cp.kubectl("taint", "node", host, f"{taint}-")
    wait_for(lambda: on() == others | {host}, 90, lambda: f"slurmd pods on {on()} after the taint was lifted")


def test_with_drain_false_a_quarantined_node_keeps_its_slurmd(operator):
    """What the plan's warning says: NoSchedule stops new pods, not the slurmd already running, so Slurm keeps
    placing jobs there until the node check drains it."""
    cp = operator.cp
    host = operator.spec.pools[SLURM_POOL].hosts[0].hostname
    before = wait_for(lambda: slurmd_on(operator).get(host), 60, lambda: f"no slurmd pod on {host}")
    taint = f"{QUARANTINE_TAINT}=gpu-fault:NoSchedule"
    cp.kubectl("taint", "node", host, taint)
    try:
        time.sleep(5)                                   # the operator's and the taint manager's next passes
        assert slurmd_on(operator).get(host) == before
    finally:
        cp.kubectl("taint", "node", host, f"{taint}-")


def test_prometheus_finds_slurmctlds_metrics_and_takes_the_drained_nodes_alert(operator):
    """The ServiceMonitor the operator makes for slurmctld carries the labels Prometheus selects by and scrapes
    the partition series the alert reads; the stack's PrometheusRule, applied with the plan through the real CRD,
    is stored whole."""
    spec, cp = operator.spec, operator.cp
    monitors = wait_for(lambda: cp.get("servicemonitors.monitoring.coreos.com",
                                       namespace=spec.kubernetes.slurm.namespace)["items"], 60,
                        lambda: f"no ServiceMonitor made\n{cp.log('slurm-operator')[-3000:]}")
    (monitor,) = monitors
    assert dict(spec.kubernetes.monitoring.rule_labels).items() <= monitor["metadata"]["labels"].items()
    assert "/metrics/partitions" in {e.get("path") for e in monitor["spec"]["endpoints"]}
    (rule,) = [o for o in operator.plan.objects if o["kind"] == "PrometheusRule"]   # applied with the plan
    assert "SlurmNodesDrained" in {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    stored = cp.get("prometheusrules.monitoring.coreos.com", rule["metadata"]["name"], rule["metadata"]["namespace"])
    assert not _lost(rule["spec"], stored["spec"])


def test_the_operators_slurm_conf_is_the_one_the_daemon_tests_assemble(operator):
    """tests/slurm_site.py assembles slurm.conf as the operator does, for Debian's 22.05 daemons: the real
    operator's file has the lines it assembles, with the generated ones verbatim."""
    spec, cp = operator.spec, operator.cp
    namespace = spec.kubernetes.slurm.namespace

    def written() -> dict[str, str] | None:
        files = {k: v for c in cp.get("configmaps", namespace=namespace)["items"]
                 for k, v in (c.get("data") or {}).items()}
        return files if "slurm.conf" in files else None

    files = wait_for(written, 60, lambda: f"no slurm.conf written\n{cp.log('slurm-operator')[-3000:]}")
    conf = files["slurm.conf"]
    lines = conf.splitlines()
    assert slurm.render_extra_conf(spec) in conf
    values = slurm.render_slurm_values(spec)
    partition = values["nodesets"][SLURM_POOL]["partition"]["configMap"]
    assert [sorted(line.split()) for line in lines if line.startswith("PartitionName=")] == [sorted(
        [f"PartitionName={SLURM_POOL}", f"Nodes={SLURM_POOL}", *(f"{k}={v}" for k, v in partition.items())])]
    for line in (f"ClusterName={values['clusterName']}", f"NodeSet={SLURM_POOL} Feature={SLURM_POOL}",
                 "GresTypes=gpu", "SelectTypeParameters=CR_Core_Memory", "ProctrackType=proctrack/cgroup",
                 "PrologFlags=Contain", "TaskPlugin=task/affinity,task/cgroup",
                 "JobAcctGatherType=jobacct_gather/cgroup", "AccountingStorageType=accounting_storage/slurmdbd",
                 "AccountingStorageTRES=gres/gpu", "ReturnToService=2", "MaxNodeCount=1024",
                 "MetricsType=metrics/openmetrics"):       # the drained-nodes alert reads its metrics
        assert line in lines, (line, conf)
    # Slurm's prolog and epilog are the node check alone: not the chart's NVIDIA job mapping (see render_slurm_values)
    assert [line for line in lines if line.startswith(("Prolog=", "Epilog="))] == [
        f"Prolog=prolog-{slurm_health.SCRIPT}", f"Epilog=epilog-{slurm_health.SCRIPT}"]
    # The GPUs tracked per model: extraConf's AccountingStorageTRES comes after the operator's, so Slurm uses it
    assert [line for line in lines if line.startswith("AccountingStorageTRES=")] == [
        "AccountingStorageTRES=gres/gpu", "AccountingStorageTRES=gres/gpu,gres/gpu:h100-sxm5-80gb"]
    for name in ("gres.conf", "cgroup.conf", "topology.conf", "job_submit.lua"):
        assert files[name] == values["configFiles"][name]


def test_the_operators_slurmdbd_conf_reaches_the_stacks_database(operator):
    """slurmdbd.conf, which the operator writes into a Secret: the storage lines the daemon tests assemble."""
    spec, cp = operator.spec, operator.cp
    namespace, a = spec.kubernetes.slurm.namespace, spec.kubernetes.slurm.accounting

    def conf() -> str | None:
        found = [base64.b64decode(v).decode() for o in cp.get("secrets", namespace=namespace)["items"]
                 for k, v in (o.get("data") or {}).items() if k == "slurmdbd.conf"]
        return found[0] if found else None

    text = wait_for(conf, 60, lambda: f"no slurmdbd.conf written\n{cp.log('slurm-operator')[-3000:]}")
    lines = text.splitlines()
    for line in ("StorageType=accounting_storage/mysql", f"StorageHost={slurm.MARIADB}",
                 f"StoragePort={a.database_port}", f"StorageUser={a.database_user}", f"StorageLoc={a.database_name}"):
        assert line in lines, (line, text)


# --- login nodes ------------------------------------------------------------------------------------------------

LOGIN = f"{slurm.RELEASE}-login-{slurm.LOGIN_SET}"         # the chart's LoginSet name, and the operator's Deployment
SSSD_SECRET = f"{slurm.RELEASE}-sssd-conf"                # the chart's sssd.conf Secret (slurm.sssdConf.name)
SSSD_HASH = "slinky.slurm.net/sssd-conf-hash"               # slurm-operator v1.1.0 internal/builder/common/const.go


def test_the_login_set_takes_the_generated_sssd_conf_from_the_charts_secret(slurm_cluster, rendered):
    spec, objects = slurm_cluster.spec, rendered["cluster"]
    login = one(objects, "LoginSet", LOGIN)["spec"]
    assert login["sssdConfRef"] == {"name": SSSD_SECRET, "key": "sssd.conf"}
    assert one(objects, "Secret", SSSD_SECRET)["stringData"]["sssd.conf"] == slurm.render_sssd_conf(spec)
    assert login["extraSshdConfig"].strip() == slurm.LOGIN_SSHD and login["replicas"] == 2
    assert login["login"]["image"].startswith("ghcr.io/slinkyproject/login:")


@pytest.fixture(scope="module")
def cpu_node(operator: Cluster) -> Iterator[str]:
    """A node of no GPU pool, as the cluster's system nodes are: where login pods go."""
    name = "cpu-01"
    operator.cp.apply_objects([{
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                              "type": "kwok"}, "annotations": {"kwok.x-k8s.io/node": "fake"}},
        "status": {"capacity": {"cpu": "32", "memory": "128Gi", "pods": "110"},
                   "allocatable": {"cpu": "31", "memory": "125Gi", "pods": "110"},
                   "nodeInfo": {"kubeletVersion": "fake", "architecture": "amd64", "operatingSystem": "linux"}}}])
    yield name
    operator.cp.kubectl("delete", "node", name, "--wait=false")


def test_the_operator_runs_the_login_pods_off_the_gpu_pools_with_sssd_conf_mounted(operator, cpu_node):
    spec, cp = operator.spec, operator.cp
    namespace = spec.kubernetes.slurm.namespace

    def running() -> dict[str, str]:
        return {p["metadata"]["name"]: p["spec"].get("nodeName") for p in cp.get(
            "pods", namespace=namespace, selector=f"app.kubernetes.io/instance={LOGIN}")["items"]
            if p["status"].get("phase") == "Running"}

    wait_for(lambda: len(running()) == 2, 120,
             lambda: f"login pods: {running()}\n{cp.log('slurm-operator')[-3000:]}")
    assert set(running().values()) == {cpu_node}          # every other node is a GPU pool's
    pod = cp.get("deployments", LOGIN, namespace)["spec"]["template"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["sssd-conf"]["projected"]["sources"][0]["secret"]["name"] == SSSD_SECRET
    assert volumes["directory-ca"]["configMap"]["name"] == spec.kubernetes.slurm.login.directory.ca_configmap
    mounts = {m["mountPath"] for c in pod["spec"]["containers"] for m in c.get("volumeMounts") or []}
    assert {"/etc/sssd/sssd.conf", slurm.DIRECTORY_CA} <= mounts
    assert cp.get("services", LOGIN, namespace)["spec"]["type"] == spec.kubernetes.slurm.login.service_type


def test_day_two_a_new_sssd_conf_rolls_the_login_pods(operator, cpu_node):
    """What a `pulumi up` that changes the login groups does: helm updates the chart's sssd.conf Secret and the
    operator gives the login Deployment's template the new file's hash, so new pods (with the new groups) come up
    one at a time before the old ones go (maxUnavailable 0)."""
    spec, cp = operator.spec, operator.cp
    namespace = spec.kubernetes.slurm.namespace
    template = lambda: cp.get("deployments", LOGIN, namespace)["spec"]["template"]   # noqa: E731
    before = wait_for(lambda: template()["metadata"].get("annotations", {}).get(SSSD_HASH), 60,
                      lambda: f"no {SSSD_HASH} on {LOGIN}")
    conf = slurm.render_sssd_conf(spec).replace("team-b", "team-c")
    cp.apply_objects([{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": SSSD_SECRET, "namespace": namespace},
                       "stringData": {"sssd.conf": conf}}])
    after = wait_for(lambda: (h := template()["metadata"]["annotations"].get(SSSD_HASH)) != before and h, 60,
                     lambda: f"{LOGIN} kept {SSSD_HASH}={before}\n{cp.log('slurm-operator')[-3000:]}")
    assert after != before
    assert cp.get("deployments", LOGIN, namespace)["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def _lost(sent: Any, stored: Any, path: str = "spec") -> list[str]:
    """What was sent but is not stored (the API server prunes fields its schema lacks); defaults may be added."""
    if isinstance(sent, dict) and isinstance(stored, dict):
        return [p for k, v in sent.items()
                for p in ([f"{path}.{k}"] if k not in stored else _lost(v, stored[k], f"{path}.{k}"))]
    if isinstance(sent, list) and isinstance(stored, list) and len(sent) == len(stored):
        return [p for i, (a, b) in enumerate(zip(sent, stored)) for p in _lost(a, b, f"{path}[{i}]")]
    return [] if sent == stored or str(sent) == str(stored) else [f"{path}: {sent!r} -> {stored!r}"]
