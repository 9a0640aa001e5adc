"""The Slurm component: which pools Slurm gets, the chart values and config files it renders, what it registers."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from components.k8s import kueue, monitoring, slurm
from components.k8s.gpu_stack import GpuKubernetesStack
from components.k8s.labels import BURN_IN_TAINT, POOL_LABEL, QUARANTINE_TAINT
from components.spec.cluster import checked_pools
from components.validation.suite import plan_suite
from tests.components.k8s.slurm_specs import SLURM_POOL, with_slurm_pool
from tests.components.k8s.test_gpu_stack import PROMTOOL, panel_query, promtool
from tests.components.k8s.test_values import unknown_keys
from tests.conftest import problems_of

CHARTS = Path(__file__).parent / "slinky"


@pytest.fixture
def spec(make_spec):
    return make_spec(with_slurm_pool)


def defaults(chart: str) -> dict:
    return yaml.safe_load((CHARTS / f"{chart}_v1.1.0_values.yaml").read_text())


def test_every_rendered_key_exists_in_the_pinned_charts_defaults(spec):
    values, chart = slurm.render_slurm_values(spec), defaults("slurm")
    nodesets = values.pop("nodesets")            # keyed by NodeSet name: each is checked against the example's keys
    assert unknown_keys(values, chart, "slurm") == []
    for ns in nodesets.values():
        ns.get("podSpec", {}).pop("nodeSelector", None)     # a label map (a new NodeSet does not get the example's)
        assert unknown_keys(ns, chart["nodesets"]["slinky"], "slurm") == []
    assert unknown_keys(slurm.render_operator_values(spec), defaults("slurm-operator"), "slurm-operator") == []


def test_the_images_are_the_charts_own_and_follow_the_mirror(spec, make_spec):
    values = slurm.render_slurm_values(spec)
    chart = defaults("slurm")
    assert values["controller"]["slurmctld"]["image"] == chart["controller"]["slurmctld"]["image"]
    assert values["nodesets"][SLURM_POOL]["slurmd"]["image"] == chart["nodesets"]["slinky"]["slurmd"]["image"]

    def mirrored(d):
        d["kubernetes"]["image_registry"] = "registry.site.example/mirror"

    mirror_spec = make_spec(mirrored)           # the fixture's data, the Slurm pool already in it
    values = slurm.render_slurm_values(mirror_spec)
    images = [values["controller"]["slurmctld"]["image"], values["controller"]["logfile"]["image"],
              values["restapi"]["slurmrestd"]["image"], values["nodesets"][SLURM_POOL]["slurmd"]["image"]]
    assert all(i["repository"].startswith("registry.site.example/mirror/") for i in images), images
    operator = slurm.render_operator_values(mirror_spec)
    assert operator["operator"]["image"]["repository"] == \
        "registry.site.example/mirror/ghcr.io/slinkyproject/slurm-operator"


def test_each_slurm_pool_is_a_daemonset_nodeset_holding_all_gpus_of_its_nodes(spec):
    values = slurm.render_slurm_values(spec)
    assert set(values["nodesets"]) == {"slinky", SLURM_POOL}
    assert values["nodesets"]["slinky"] == {"enabled": False}     # the chart's example NodeSet
    assert values["partitions"] == {"all": {"enabled": False}} and values["loginsets"]["slinky"]["enabled"] is False
    ns = values["nodesets"][SLURM_POOL]
    assert ns["scalingMode"] == "DaemonSet"
    assert ns["podSpec"]["nodeSelector"] == {POOL_LABEL: SLURM_POOL}
    # The pool's own taints only: a node under burn-in or in quarantine runs no slurmd, so takes no job.
    keys = {t["key"] for t in ns["podSpec"]["tolerations"]}
    assert keys == {"nvidia.com/gpu"} and not keys & {BURN_IN_TAINT, QUARANTINE_TAINT}
    assert ns["slurmd"]["resources"]["limits"] == {"nvidia.com/gpu": "8", "rdma/rdma_shared_devices": "1"}
    assert ns["extraConfMap"]["Gres"] == "gpu:h100-sxm5-80gb:8"
    assert {"name": "NCCL_IB_HCA", "value": "=mlx5_0:1,mlx5_1:1"} in ns["slurmd"]["env"]
    assert ns["podSpec"]["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "512Gi"}}]
    assert ns["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"]     # RoCE GIDs need the rails' netdevs
    assert ns["partition"] == {"enabled": True, "configMap": {"State": "UP", "Default": "YES",
                                                              "MaxTime": "UNLIMITED"}}


def test_gres_conf_ties_each_gpu_to_the_cores_of_its_numa_node(make_spec):
    def four_numa(d):
        with_slurm_pool(d, hosts=1)
        d["node_pools"][1].update(numa_nodes_per_host=4, cpu_cores_per_host=128, threads_per_core=2)

    lines = slurm.render_gres_conf(make_spec(four_numa)).splitlines()[1:]
    assert lines == [f"NodeName=gpu-slurm-01 Name=gpu Type=h100-sxm5-80gb File=/dev/nvidia[{2 * n}-{2 * n + 1}] "
                     f"Cores={16 * n}-{16 * n + 15}" for n in range(4)]


def test_topology_conf_is_the_cabling_plans_leaves_under_their_block(spec):
    assert slurm.render_topology_conf(spec).splitlines()[1:] == [
        "SwitchName=leaf-dev-01 Nodes=gpu-slurm-02", "SwitchName=leaf-dev-02 Nodes=gpu-slurm-01",
        "SwitchName=block-lab1 Switches=leaf-dev-01,leaf-dev-02"]


def test_kueue_does_not_see_a_slurm_pool(spec):
    flavors = [m.obj["metadata"]["name"] for m in kueue.render_kueue_objects(spec) if m.obj["kind"] == "ResourceFlavor"]
    assert flavors == ["h100"]
    assert [p.name for p in checked_pools(spec)] == ["h100"]
    assert SLURM_POOL not in spec.pool_capacities()             # nor do tenants onboarded elsewhere
    names = {c.name for c in plan_suite(spec)}
    assert "nccl-h100" in names and f"nccl-{SLURM_POOL}" not in names
    assert not any(n.startswith("dcgm-gpu-slurm") for n in names)
    assert {"slinky", "slurm"} <= spec.reserved_namespaces
    assert "slurm" in spec.system_namespaces and "slurm" not in spec.agent_namespaces


@pytest.mark.parametrize("edit, where, words", [
    (lambda d: d["kubernetes"]["slurm"].update(pools=["nope"]), "kubernetes.slurm.pools[0]", "no node pool named"),
    (lambda d: d["kubernetes"]["slurm"].update(pools=[SLURM_POOL, SLURM_POOL]), "kubernetes.slurm.pools[1]",
     "already used"),
    (lambda d: d["kubernetes"]["slurm"].update(default_pool="h100"), "kubernetes.slurm.default_pool",
     "not one of slurm.pools"),
    (lambda d: d["tenants"][0]["gpu_quota"].update({SLURM_POOL: 20}), f"tenants[0].gpu_quota.{SLURM_POOL}",
     "holds 16"),
    (lambda d: d["kubernetes"]["slurm"].update(accounting={"database_host": "db.site.example"}),
     "kubernetes.slurm.accounting.password_secret", "needs password_secret"),
    (lambda d: d["kubernetes"]["slurm"].update(accounting={"password_secret": "mine"}),
     "kubernetes.slurm.accounting.password_secret", "generated"),
    (lambda d: d["node_pools"][1].update(sharing={"time_slicing_replicas": 4}), "kubernetes.slurm.pools[0]",
     "shares its GPUs"),
    (lambda d: d["node_pools"][1].update(cpu_cores_per_host=110), "node_pools[1].cpu_cores_per_host",
     "NUMA nodes"),
    (lambda d: d["kubernetes"]["slurm"].update(version="9.9.9"), "kubernetes.slurm.version", "not known"),
])
def test_a_bad_slurm_section_is_refused_naming_the_field(dev_data, edit, where, words):
    with_slurm_pool(dev_data)
    edit(dev_data)
    found = [p for p in problems_of(dev_data) if f" {where}: " in p]
    assert found and words in found[0], problems_of(dev_data)


def test_two_hosts_that_would_be_one_slurm_node_are_refused(dev_data):
    with_slurm_pool(dev_data)
    dev_data["node_pools"][1]["hosts"][1]["hostname"] = "gpu-slurm-01.other.example"
    assert any("gpu-slurm-01" in p and "Slurm node" in p for p in problems_of(dev_data)), problems_of(dev_data)


def test_the_stack_composes_the_slurm_cluster_after_the_operators(record, spec):
    run = record(lambda: GpuKubernetesStack("k8s", spec))
    by_name = {r.name: r for r in run.records}
    cluster = by_name["k8s-slurm"]
    assert cluster.type == "gpucluster:index:SlurmCluster" and cluster.parent.endswith("::k8s")
    operator, release = by_name["k8s-slurm-operator"], by_name["k8s-slurm-cluster"]
    assert operator.inputs["namespace"] == "slinky" and release.inputs["namespace"] == "slurm"
    assert operator.inputs["chart"] == "oci://ghcr.io/slinkyproject/charts/slurm-operator"
    assert operator.inputs["version"] == release.inputs["version"] == "1.1.0"
    assert any(d.endswith("::k8s-slurm-operator") for d in release.dependencies)
    assert any(d.endswith("::k8s-gpu-operator") for d in cluster.dependencies)
    assert yaml.safe_load(yaml.safe_dump(release.inputs["values"]))["configFiles"]["topology.conf"]


def test_without_slurm_pools_nothing_of_slurm_is_registered(record, dev_spec):
    run = record(lambda: GpuKubernetesStack("k8s", dev_spec))
    assert not [r for r in run.records if "slurm" in r.name]
    assert "slurm" not in dev_spec.reserved_namespaces


def test_priority_classes_are_qos_in_the_same_order_each_preempting_the_lower(spec):
    assert slurm.render_qos(spec) == [slurm.Qos("normal", 0, ()), slurm.Qos("experiment", 1, ("normal",)),
                                      slurm.Qos("production", 2, ("experiment", "normal"))]


def test_a_class_below_zero_ranks_below_normal_and_equal_values_do_not_preempt_each_other(make_spec):
    def classes(d):
        with_slurm_pool(d)
        d["kubernetes"]["kueue"]["priority_classes"] = [{"name": "scavenger", "value": -5},
                                                        {"name": "a", "value": 10}, {"name": "b", "value": 10}]
    qos = {q.name: q for q in slurm.render_qos(make_spec(classes))}
    assert qos["scavenger"] == slurm.Qos("scavenger", 0, ())
    assert qos["normal"].preempts == ("scavenger",)
    assert qos["a"].preempts == qos["b"].preempts == ("normal", "scavenger")


def test_each_tenant_with_slurm_gpus_is_an_account_with_its_share_and_limit(spec):
    assert slurm.tenant_accounts(spec) == {"team-a": (4, 8), "team-b": (2, None)}
    lines = slurm.render_accounts_file(spec).splitlines()
    assert lines[:2] == ["Cluster - 'dev'", "Parent - 'root'"]
    assert lines[2] == ("Account - 'team-a':Description='tenant team-a':Organization='gpucluster':Fairshare=4:"
                        "GrpTRES=gres/gpu=8:QOS='normal,experiment,production'")
    assert "GrpTRES" not in lines[3]                   # no limit: the script lifts any left from before
    script = slurm.render_accounts_script(spec, "/opt/gpucluster/accounts.cfg")
    assert "\nunlimit team-b\n" in script and "unlimit team-a" not in script


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed (.ci/run installs it)")
def test_the_accounts_script_passes_shellcheck(spec, tmp_path):
    path = tmp_path / "accounts.sh"
    path.write_text(slurm.render_accounts_script(spec, "/opt/gpucluster/accounts.cfg"))
    out = subprocess.run(["shellcheck", "-S", "style", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout


def test_the_accounts_job_is_named_by_what_it_applies(spec, make_spec):
    cm, job = slurm.render_accounts_job(spec)
    assert job.obj["metadata"]["name"] == cm.obj["metadata"]["name"]
    pod = job.obj["spec"]["template"]["spec"]
    assert pod["containers"][0]["command"] == ["/bin/bash", "/opt/gpucluster/accounts.sh"]
    sources = pod["volumes"][0]["projected"]["sources"]        # the operator's slurm.conf and auth key
    assert sources[0]["configMap"]["name"] == "slurm-config" and sources[1]["secret"]["name"] == "slurm-auth-slurm"
    assert slurm.render_accounts_job(spec)[1].obj["metadata"]["name"] == job.obj["metadata"]["name"]
    more = make_spec(lambda d: d["tenants"][1]["gpu_quota"].update({SLURM_POOL: 3}))
    assert slurm.render_accounts_job(more)[1].obj["metadata"]["name"] != job.obj["metadata"]["name"]


def test_the_database_is_in_cluster_unless_the_site_gives_one(spec, make_spec):
    values = slurm.render_slurm_values(spec)["accounting"]
    assert values["storageConfig"] == {"host": "slurm-mariadb", "port": 3306, "database": "slurm_acct_db",
                                       "username": "slurm", "passwordKeyRef": {"name": "slurm-database",
                                                                               "key": "password"}}
    service, statefulset = slurm.render_mariadb(spec)
    db = statefulset.obj["spec"]
    assert db["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}
    env = {e["name"]: e for e in db["template"]["spec"]["containers"][0]["env"]}
    assert env["MARIADB_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "slurm-database", "key": "password"}
    site = make_spec(lambda d: d["kubernetes"]["slurm"].update(accounting={
        "database_host": "db.site.example", "password_secret": "site-slurmdb"}))
    storage = slurm.render_slurm_values(site)["accounting"]["storageConfig"]
    assert storage["host"] == "db.site.example" and storage["passwordKeyRef"]["name"] == "site-slurmdb"


def test_the_database_password_is_a_secret_and_never_in_the_plan(record, spec):
    run = record(lambda: GpuKubernetesStack("k8s", spec))
    by_name = {r.name: r for r in run.records}
    assert by_name["k8s-slurm-database-password"].type == "random:index/randomPassword:RandomPassword"
    secret = by_name["k8s-slurm-database-secret"]
    assert "4dabf18193072939515e22adb298388d" in str(secret.inputs["stringData"])     # the secret envelope
    release = by_name["k8s-slurm-cluster"]
    assert any(d.endswith("::k8s-slurm-mariadb") for d in release.dependencies)
    job = by_name["k8s-slurm-accounts-job"]
    assert any(d.endswith("::k8s-slurm-cluster") for d in job.dependencies)


# --- drained nodes: slurmctld's own metrics, an alert and a panel ---------------------------------------------------

def test_slurmctld_metrics_are_scraped_where_there_is_monitoring(spec, make_spec, dev_spec):
    metrics = slurm.render_slurm_values(spec)["controller"]["metrics"]
    assert metrics == {"enabled": True,
                       "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}}}
    off = make_spec(lambda d: d["kubernetes"].update(monitoring={"enabled": False}))
    assert slurm.render_slurm_values(off)["controller"]["metrics"]["enabled"] is False
    assert "SlurmNodesDrained" not in {r["alert"] for r in monitoring.render_alert_rules(dev_spec)}


@PROMTOOL
def test_a_drained_partition_alerts_with_how_to_list_and_resume_its_nodes(spec, tmp_path):
    """Over slurmctld's partition series (Slurm 25.11's openmetrics.c names them)."""
    series = 'slurm_partition_nodes_drain{{partition="{}", job="slurm-controller"}}'
    promtool(spec, tmp_path, [{"series": series.format(SLURM_POOL), "values": "0 0 2 2 0"},
                              {"series": series.format("cpu"), "values": "0 0 0 0 0"}], [
        {"eval_time": "1m", "alertname": "SlurmNodesDrained", "exp_alerts": []},
        {"eval_time": "2m", "alertname": "SlurmNodesDrained", "exp_alerts": [{
            "exp_labels": {"severity": "warning", "partition": SLURM_POOL},
            "exp_annotations": {"summary": f"2 node(s) of Slurm partition {SLURM_POOL} drained: `sinfo -R -p "
                                           f"{SLURM_POOL}` lists each with its reason (the node check's start with "
                                           "\"gpucluster:\"); after the repair, `scontrol update nodename=<node> "
                                           "state=resume`"}}]},
        {"eval_time": "4m", "alertname": "SlurmNodesDrained", "exp_alerts": []},     # resumed
    ])
    panel = panel_query(spec, tmp_path, "Drained Slurm", [{"series": series.format(SLURM_POOL), "values": "3"}],
                        "0m", [{"labels": f'{{partition="{SLURM_POOL}"}}', "value": 3}])
    assert panel["targets"][0]["legendFormat"] == "{{partition}}"


def test_a_quarantine_that_does_not_drain_warns_that_slurm_keeps_using_the_node(spec, make_spec):
    assert not [w for w in spec.warnings() if "slurmd" in w]
    kept = make_spec(lambda d: d["kubernetes"].setdefault("health", {}).update(quarantine={"drain": False}))
    (warning,) = [w for w in kept.warnings() if "slurmd" in w]
    assert f"Slurm pool(s) {SLURM_POOL} keeps its slurmd" in warning and "set drain: true" in warning
