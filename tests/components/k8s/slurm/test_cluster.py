"""The Slurm component: which pools Slurm gets, the chart values and config files it renders, what it registers."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from components.k8s.images import through_mirror
from components.k8s.platform import kueue, monitoring
from components.k8s.slurm import cluster as slurm
from components.k8s.gpu_stack import GpuKubernetesStack
from components.k8s.labels import BURN_IN_TAINT, POOL_LABEL, QUARANTINE_TAINT
from components.spec.cluster import checked_pools
from components.spec.slurm import tenant_directory_groups
from components.validation.suite import plan_suite
from tests.components.k8s.slurm_specs import H200_POOL, SLURM_POOL, with_h200_pool, with_slurm_pool
from tests.components.k8s.test_gpu_stack import PROMTOOL, panel_query, promtool
from tests.components.k8s.platform.test_values import unknown_keys
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
    values = through_mirror(slurm.render_slurm_values(mirror_spec), mirror_spec)
    images = [values["controller"]["slurmctld"]["image"], values["controller"]["logfile"]["image"],
              values["restapi"]["slurmrestd"]["image"], values["nodesets"][SLURM_POOL]["slurmd"]["image"]]
    assert all(i["repository"].startswith("registry.site.example/mirror/") for i in images), images
    operator = through_mirror(slurm.render_operator_values(mirror_spec), mirror_spec)
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
                                                              "MaxTime": "0-12:00:00"}}


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
    # a rollout's drain waits for the longest job Slurm lets run (Slinky holds a busy slurmd)
    (lambda d: d["kubernetes"]["slurm"].pop("partition_max_time_h"), "kubernetes.slurm.partition_max_time_h",
     "the rollout of Slurm pool h100-slurm drains a host only once its jobs end"),
    (lambda d: d["kubernetes"]["slurm"].update(partition_max_time_h=24), "node_pools[1].rollout.drain_timeout_s",
     "43500 s cannot cover a Slurm job of the partition's 24 h (kubernetes.slurm.partition_max_time_h): the "
     "drain waits for it (Slinky's disruption budget holds a busy slurmd), and fails where it runs longer; give "
     "at least 86520"),
    (lambda d: d["node_pools"][1]["rollout"].update(drain_timeout_s=43319), "node_pools[1].rollout.drain_timeout_s",
     "give at least 43320"),
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
    assert slurm.tenant_accounts(spec) == {"team-a": slurm.Account(4, {"h100-sxm5-80gb": 8}),
                                           "team-b": slurm.Account(2, {})}
    lines = slurm.render_accounts_file(spec).splitlines()
    assert lines[:2] == ["Cluster - 'dev'", "Parent - 'root'"]
    assert lines[2] == ("Account - 'team-a':Description='tenant team-a':Organization='gpucluster':Fairshare=4:"
                        "QOS='normal,experiment,production'")
    script = slurm.render_accounts_script(spec, "/opt/gpucluster/accounts.cfg")
    # the limits are set by the script, which lifts one the spec no longer sets (team-b's: none)
    assert "\nlimits team-a gres/gpu:h100-sxm5-80gb=8\nlimits team-b ''\n" in script
    assert "for name in gpu gpu:h100-sxm5-80gb; do" in script      # it waits for both TRES


def test_gpu_limits_are_per_model_as_the_kueue_quotas_per_pool(make_spec):
    """Per GPU model of the Slurm pools: guaranteed plus borrowing_limit on the pools of that model (two pools of
    one model add up), 0 where the tenant has no quota, none where a quota borrows without limit."""
    def pools(d):
        with_slurm_pool(d)
        with_h200_pool(d)
        second = {**d["node_pools"][-1], "name": "h200-more",
                  "hosts": [{"hostname": "gpu-h200-02.lab1.example", "address": "10.10.0.32", "rack": "r02"}]}
        d["node_pools"].append(second)
        d["sites"][0]["racks"][1]["pdu_capacity_kw"] = 60
        d["kubernetes"]["slurm"]["pools"].append("h200-more")
        d["tenants"][1]["gpu_quota"]["h200-more"] = {"nominal": 1, "borrowing_limit": 3}
    spec = make_spec(pools)
    assert slurm.gpu_types(spec) == {"h100-sxm5-80gb": [SLURM_POOL], "h200-sxm5-141gb": [H200_POOL, "h200-more"]}
    accounts = slurm.tenant_accounts(spec)
    assert accounts == {
        "team-a": slurm.Account(4, {"h100-sxm5-80gb": 8, "h200-sxm5-141gb": 0}),
        "team-b": slurm.Account(5, {"h200-sxm5-141gb": 8}),            # h100: no limit; h200: 2+2 and 1+3
        "team-c": slurm.Account(2, {"h100-sxm5-80gb": 0})}              # h200: borrows without limit
    assert slurm.gpu_limits(accounts["team-a"]) == "gres/gpu:h100-sxm5-80gb=8,gres/gpu:h200-sxm5-141gb=0"
    conf = slurm.render_extra_conf(spec).splitlines()
    assert "AccountingStorageTRES=gres/gpu,gres/gpu:h100-sxm5-80gb,gres/gpu:h200-sxm5-141gb" in conf
    assert "JobSubmitPlugins=lua" in conf


def test_the_job_submit_script_maps_each_partition_to_its_pools_model(make_spec):
    def pools(d):
        with_slurm_pool(d)
        with_h200_pool(d)
        d["kubernetes"]["slurm"]["default_pool"] = H200_POOL
    spec = make_spec(pools)
    lua = slurm.render_slurm_values(spec)["configFiles"]["job_submit.lua"]
    assert f'  ["{SLURM_POOL}"] = "h100-sxm5-80gb",\n  ["{H200_POOL}"] = "h200-sxm5-141gb",\n' in lua
    assert f'local DEFAULT_PARTITION = "{H200_POOL}"' in lua
    assert "@" not in lua


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
    service, statefulset = slurm.render_mariadb(spec.kubernetes.slurm)
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


# --- login nodes bound to the tenants' identity groups --------------------------------------------------------------

DIRECTORY = {"uris": ["ldaps://ldap.site.example"], "search_base": "dc=site,dc=example", "group_prefix": "oidc:",
             "bind_dn": "cn=sssd,ou=services,dc=site,dc=example", "ca_configmap": "directory-ca"}
BIND_PASSWORD = "s3cret-bind-pw"


def with_login(data, **directory):
    with_slurm_pool(data)
    data["kubernetes"]["slurm"]["login"] = {"directory": {**DIRECTORY, **directory}}


@pytest.fixture
def login(make_spec):
    return make_spec(with_login)


def directory(**fields):
    """An edit of the login fixture's directory (a field given None is left out)."""
    def edit(d):
        found = d["kubernetes"]["slurm"]["login"]["directory"]
        found.update(fields)
        for key in [k for k, v in fields.items() if v is None]:
            del found[key]
    return edit


def sssd_option(conf: str, key: str) -> str | None:
    return next((line.split(" = ", 1)[1] for line in conf.splitlines() if line.startswith(f"{key} = ")), None)


def test_only_the_edit_and_admin_groups_of_tenants_on_slurm_pools_may_log_in(login, make_spec):
    # dev: team-a is administered by oidc:ml-platform-admins and edited by oidc:team-a; team-b is edited by
    # oidc:team-b and viewed by oidc:auditors
    conf = slurm.render_sssd_conf(login)
    assert sssd_option(conf, "simple_allow_groups") == "ml-platform-admins, team-a, team-b"
    assert sssd_option(conf, "access_provider") == "simple" and "auditors" not in conf

    team_b_off_slurm = make_spec(lambda d: d["tenants"][1]["gpu_quota"].pop(SLURM_POOL))
    assert sssd_option(slurm.render_sssd_conf(team_b_off_slurm), "simple_allow_groups") == \
        "ml-platform-admins, team-a"


def test_sssd_verifies_the_directory_over_tls_and_keeps_no_password(login, make_spec):
    conf = slurm.render_sssd_conf(login)
    assert sssd_option(conf, "ldap_tls_reqcert") == "demand"
    assert sssd_option(conf, "ldap_tls_cacert") == slurm.DIRECTORY_CA
    assert sssd_option(conf, "ldap_default_bind_dn") == DIRECTORY["bind_dn"]
    assert sssd_option(conf, "cache_credentials") == "false" and "authtok" not in conf
    assert sssd_option(conf, "ldap_id_use_start_tls") is None                # ldaps: TLS from the start
    start_tls = slurm.render_sssd_conf(make_spec(directory(uris=["ldap://ldap.site.example:389"])))
    assert sssd_option(start_tls, "ldap_id_use_start_tls") == "true"
    anonymous = slurm.render_sssd_conf(make_spec(directory(bind_dn=None, ca_configmap=None)))
    assert "ldap_default_bind_dn" not in anonymous and "ldap_tls_cacert" not in anonymous


def test_the_bind_password_refuses_what_sssd_conf_cannot_carry():
    assert slurm.render_sssd_bind("pw") == (f"[domain/{slurm.SSSD_DOMAIN}]\nldap_default_authtok_type = password\n"
                                            "ldap_default_authtok = pw\n")
    for bad in ("", "two\nlines", " padded"):
        with pytest.raises(ValueError, match="slurmDirectoryPassword"):
            slurm.render_sssd_bind(bad)


def test_the_login_set_runs_off_the_gpu_pools_and_is_replaced_one_pod_at_a_time(login):
    values = slurm.render_slurm_values(login, credentials="digest")
    assert values["sssd"] == {"conf": slurm.render_sssd_conf(login)}      # the chart's Secret: shown in the plan
    ls = values["loginsets"][slurm.LOGIN_SET]
    assert values["loginsets"]["slinky"] == {"enabled": False}
    terms = ls["podSpec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [{"matchExpressions": [{"key": POOL_LABEL, "operator": "DoesNotExist"}]}]
    assert ls["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1} and ls["replicas"] == 2
    assert ls["login"]["image"] == defaults("slurm")["loginsets"]["slinky"]["login"]["image"]
    assert ls["metadata"] == {"annotations": {slurm.BIND_ANNOTATION: "digest"}}
    mounts = {m["mountPath"]: m for m in ls["login"]["volumeMounts"]}
    assert mounts[slurm.SSSD_BIND]["subPath"] == "bind.conf" and mounts[slurm.DIRECTORY_CA]["subPath"] == "ca.crt"
    volumes = {v["name"]: v for v in ls["podSpec"]["volumes"]}
    assert {mounts[p]["name"] for p in mounts} == set(volumes)
    assert volumes["sssd-bind"]["secret"]["defaultMode"] == 0o600     # sssd ignores a snippet others may read



def test_without_login_the_chart_gets_no_login_set_and_no_sssd(spec):
    values = slurm.render_slurm_values(spec)
    assert values["loginsets"] == {"slinky": {"enabled": False}} and "sssd" not in values


def test_every_rendered_login_set_key_exists_in_the_charts_example(login):
    chart = defaults("slurm")
    values = slurm.render_slurm_values(login, credentials="digest")
    assert unknown_keys({"sssd": values["sssd"]}, chart, "slurm") == []
    ls = values["loginsets"][slurm.LOGIN_SET]
    ls["metadata"].pop("annotations")          # a free-form map
    assert unknown_keys(ls, chart["loginsets"]["slinky"], "slurm") == []


def test_a_new_bind_password_changes_the_login_pods_and_the_digest_does_not_give_it_away(login):
    digest = slurm.credentials_digest(login, BIND_PASSWORD)
    assert digest == slurm.credentials_digest(login, BIND_PASSWORD) != slurm.credentials_digest(login, "other")
    assert BIND_PASSWORD not in digest and len(digest) == 32


@pytest.mark.parametrize("edit, where, words", [
    (lambda d: d["kubernetes"]["slurm"]["login"]["directory"].update(uris=["ldaps://a.example", "ldap://b.example"]),
     "kubernetes.slurm.login.directory.uris", "mix ldaps:// and ldap://"),
    (lambda d: d["kubernetes"]["slurm"]["login"]["directory"].update(uris=["https://ldap.example"]),
     "kubernetes.slurm.login.directory.uris[0]", "not an LDAP server URI"),
    (lambda d: d["kubernetes"]["slurm"]["login"]["directory"].update(search_base="dc=a,\ndc=b"),
     "kubernetes.slurm.login.directory.search_base", "distinguished name"),
    (lambda d: d["kubernetes"]["slurm"]["login"]["directory"].update(group_prefix="ldap:"),
     "tenants[0].groups.admin[0]", "group_prefix"),
    (lambda d: d["tenants"][0]["groups"].update(edit=["oidc:team,a"]), "tenants[0].groups.edit[0]", "comma"),
    (lambda d: [t.update(groups={}) for t in d["tenants"]], "kubernetes.slurm.login", "no one could log in"),
    (lambda d: d["kubernetes"]["slurm"].update(pools=[]), "kubernetes.slurm.login", "need Slurm"),
    (lambda d: d["kubernetes"]["slurm"]["login"].update(replicas=0), "kubernetes.slurm.login.replicas",
     "greater than or equal to 1"),
    (lambda d: d["kubernetes"]["slurm"]["login"].update(replicas="two"), "kubernetes.slurm.login.replicas",
     "valid integer"),
    (lambda d: d["kubernetes"]["slurm"]["login"].update(service_type="Ingress"),
     "kubernetes.slurm.login.service_type", "LoadBalancer"),
    (lambda d: d["kubernetes"]["slurm"]["login"]["directory"].update(bind_password="x"),
     "kubernetes.slurm.login.directory.bind_password", "unknown field"),
    (lambda d: d["kubernetes"]["slurm"]["login"]["directory"].update(uris=[]),
     "kubernetes.slurm.login.directory.uris", "at least 1"),
])
def test_a_bad_login_section_is_refused_naming_the_field(dev_data, edit, where, words):
    with_login(dev_data)
    edit(dev_data)
    found = [p for p in problems_of(dev_data) if f" {where}: " in p]
    assert found and words in found[0], problems_of(dev_data)


def test_the_bind_password_is_a_secret_of_its_own_and_never_in_the_plan(record, login):
    run = record(lambda: GpuKubernetesStack("k8s", login, slurm_directory_password=BIND_PASSWORD))
    by_name = {r.name: r for r in run.records}
    bind = by_name["k8s-slurm-login-directory"]
    assert bind.inputs["metadata"]["name"] == slurm.LOGIN_BIND
    assert "4dabf18193072939515e22adb298388d" in str(bind.inputs["stringData"])       # a secret
    release = by_name["k8s-slurm-cluster"]
    assert any(d.endswith("::k8s-slurm-login-directory") for d in release.dependencies)
    annotation = release.inputs["values"]["loginsets"][slurm.LOGIN_SET]["metadata"]["annotations"]
    assert annotation == {slurm.BIND_ANNOTATION: slurm.credentials_digest(login, BIND_PASSWORD)}   # values stay plain
    envelopes = [r.inputs["stringData"] for r in run.records if r.type == "kubernetes:core/v1:Secret"]
    assert BIND_PASSWORD in str(envelopes)          # inside secret envelopes only, which the plan redacts ...
    elsewhere = [r.inputs for r in run.records if r.type != "kubernetes:core/v1:Secret"]
    assert BIND_PASSWORD not in str(elsewhere) + str(run.component_outputs)            # ... and nowhere else


def test_a_bind_dn_without_its_password_is_refused_before_anything_registers(record, login):
    with pytest.raises(Exception, match="slurmDirectoryPassword"):
        record(lambda: GpuKubernetesStack("k8s", login))


def test_the_account_members_cronjob_runs_the_login_pods_sssd_files_off_the_gpu_pools(login):
    config, cron = slurm.render_user_sync(login)
    job = cron.obj["spec"]
    assert (job["schedule"], job["concurrencyPolicy"]) == (slurm.USER_SYNC_SCHEDULE, "Forbid")
    pod = job["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["affinity"] == slurm._off_gpu_pools()
    (container,) = pod["containers"]
    assert container["image"] == "ghcr.io/slinkyproject/login:25.11-ubuntu24.04"
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts == {"/etc/slurm": "etc-slurm", slurm.ACCOUNTS_DIR: "sync", "/etc/sssd/sssd.conf": "sssd-conf",
                      slurm.SSSD_BIND: "sssd-bind", slurm.DIRECTORY_CA: "directory-ca"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["sssd-conf"]["secret"]["secretName"] == slurm.SSSD_CONF_SECRET
    assert volumes["sync"]["configMap"]["name"] == config.obj["metadata"]["name"]
    assert config.obj["data"]["sync.sh"] == slurm.render_user_sync_script(login)


def test_each_tenant_account_takes_its_admin_and_edit_groups_and_one_without_groups_none(login, make_spec):
    assert tenant_directory_groups(login) == {"team-a": ["ml-platform-admins", "team-a"], "team-b": ["team-b"]}
    assert set(tenant_directory_groups(login)) == set(slurm.tenant_accounts(login))
    no_groups = make_spec(lambda d: d["tenants"][1].update(groups={"view": ["oidc:auditors"]}))
    assert tenant_directory_groups(no_groups)["team-b"] == []          # its users are removed, not kept
    assert "account team-b\n" in slurm.render_user_sync_script(no_groups)


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed (.ci/run installs it)")
def test_the_account_members_script_passes_shellcheck(login, tmp_path):
    path = tmp_path / "sync.sh"
    path.write_text(slurm.render_user_sync_script(login))
    proc = subprocess.run(["shellcheck", "-s", "bash", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_the_account_members_cronjob_is_there_only_with_login_nodes(record, login, make_spec):
    run = record(lambda: GpuKubernetesStack("k8s", login, slurm_directory_password=BIND_PASSWORD))
    cron = next(r for r in run.records if r.name == "k8s-slurm-account-members-cronjob")
    assert any(d.endswith("::k8s-slurm-cluster") for d in cron.dependencies)
    no_login = make_spec(lambda d: d["kubernetes"]["slurm"].pop("login"))
    without = record(lambda: GpuKubernetesStack("k8s", no_login))
    assert not [r for r in without.records if "account-members" in r.name or "login" in r.name]


# A stub of what slurmctld gives a job_submit script (the `slurm` table), and calls as the plugin makes them.
LUA_DRIVER = r"""
slurm = {SUCCESS = 0, ERROR = -1,
         log_user = function(f, ...) print("user: " .. string.format(f, ...)) end,
         log_info = function(f, ...) print("info: " .. string.format(f, ...)) end}
dofile(arg[1])
local function show(rc, job)
  print(rc, job.tres_per_job, job.tres_per_node, job.tres_per_socket, job.tres_per_task)
end
local job = {tres_per_node = "gres/gpu:8"}
show(slurm_job_submit(job, {}, 0), job)
job = {partition = "h200-slurm", tres_per_job = "gres/gpu:4", tres_per_task = "gres:gpu", tres_per_socket = "gpu:2"}
show(slurm_job_submit(job, {}, 0), job)
job = {tres_per_node = "gres/gpu:h100-sxm5-80gb:2,gres/nic:1"}
show(slurm_job_submit(job, {}, 0), job)
job = {partition = "h100-slurm,h200-slurm", tres_per_job = "gres/gpu:2"}
show(slurm_job_submit(job, {}, 0), job)
job = {tres_per_node = "gres/gpu:3"}
show(slurm_job_modify(job, {partition = "h100-slurm,h200-slurm", job_id = 7.0}, {}, 0), job)
job = {tres_per_node = "gres/gpu:3"}
show(slurm_job_modify(job, {partition = "h200-slurm", job_id = 7.0}, {}, 0), job)
"""


@pytest.mark.skipif(shutil.which("lua5.3") is None, reason="lua5.3 is not installed (.ci/run installs it)")
def test_the_job_submit_script_runs_under_the_lua_of_slinkys_images(make_spec, tmp_path):
    """Slinky's images build Slurm with Lua 5.3 (liblua5.3-dev in Slurm's debian/control); Debian's slurmctld,
    which runs the script in test_daemons, links 5.1. Under 5.3: GPUs without a model get the default
    partition's or the job's partition's, in every form the plugin sees (gres/gpu, gres:gpu, gpu; per job, node,
    socket and task), other entries and typed GPUs are kept, and two models are refused with the reason."""
    def pools(d):
        with_slurm_pool(d)
        with_h200_pool(d)
    (tmp_path / "job_submit.lua").write_text(slurm.render_job_submit(make_spec(pools)))
    (tmp_path / "driver.lua").write_text(LUA_DRIVER)
    out = subprocess.run(["lua5.3", str(tmp_path / "driver.lua"), str(tmp_path / "job_submit.lua")],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    why = ("gpucluster: partitions h100-slurm,h200-slurm hold different GPU models; ask for GPUs of one model "
           "(--gpus=<model>:<count>, --gres=gpu:<model>:<count>) or submit to one partition")
    assert out.stdout.splitlines() == [
        "0\tnil\tgres/gpu:h100-sxm5-80gb:8\tnil\tnil",
        "0\tgres/gpu:h200-sxm5-141gb:4\tnil\tgpu:h200-sxm5-141gb:2\tgres:gpu:h200-sxm5-141gb",
        "0\tnil\tgres/gpu:h100-sxm5-80gb:2,gres/nic:1\tnil\tnil",
        f"user: {why}", "-1\tgres/gpu:2\tnil\tnil\tnil",
        f"info: job 7: {why}", "-1\tnil\tgres/gpu:3\tnil\tnil",
        "0\tnil\tgres/gpu:h200-sxm5-141gb:3\tnil\tnil"]
