"""Bad input, third round: the day-2, health and Slurm sections. What would damage a running cluster is refused
by validate and plan alike (exit 2, the field named, no traceback); what is legal but risky is a warning."""

from __future__ import annotations

import copy

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from components.spec import parse_spec
from tests.components.k8s.slurm_specs import SLURM_POOL, with_slurm_pool
from tests.conftest import _DEV, problems_of, with_changes
from tests.spec.test_bad_input import _VALUES, _only_spec_errors, _paths, refused_alike


def _slurm():
    data = copy.deepcopy(_DEV)
    with_slurm_pool(data)
    return data


def _at(*path_and_value):
    *path, value = path_and_value

    def change(data):
        node = data
        for key in path[:-1]:
            node = node.setdefault(key, {}) if isinstance(node, dict) else node[key]
        node[path[-1]] = value
    return change


SLURM_CASES = [
    (_at("kubernetes", "slurm", "namespace", "kube-system"),
     "kubernetes.slurm.namespace: 'kube-system' is Kubernetes' or an operator's namespace: Pulumi would own it"),
    (_at("kubernetes", "slurm", "namespace", "slinky"),
     "kubernetes.slurm.namespace: 'slinky' is the Slinky operator's namespace"),
    (_at("kubernetes", "slurm", "namespace", "gpu-operator"),
     "kubernetes.slurm.namespace: 'gpu-operator' is Kubernetes' or an operator's namespace"),
    (lambda d: d["kubernetes"]["kueue"].setdefault("priority_classes", []).append({"name": "normal", "value": 100}),
     "kubernetes.kueue.priority_classes[2].name: 'normal' is Slurm's default QOS, which every job without --qos "
     "runs under"),
    (_at("tenants", 1, "name", "root"),
     "tenants[1].name: 'root' is Slurm's root account, the parent of every account"),
    (_at("kubernetes", "slurm", "accounting", {"database_user": "root"}),
     "kubernetes.slurm.accounting.database_user: 'root' is the in-cluster MariaDB's superuser"),
    (_at("tenants", 1, "gpu_quota", SLURM_POOL, {"nominal": 2, "lending_limit": 1}),
     f"tenants[1].gpu_quota.{SLURM_POOL}.lending_limit: Slurm pool {SLURM_POOL} has no lending limit"),
    (_at("kubernetes", "slurm", "login", {"directory": {
        "uris": ["ldaps://ldap.site.example"], "search_base": "dc=site,dc=example", "group_prefix": "bad prefix!"}}),
     "kubernetes.slurm.login.directory.group_prefix: 'bad prefix!' is not a group name prefix"),
]
HEALTH_CASES = [
    (_at("kubernetes", "health", "active_checks", {"schedule": "* * * * *"}),
     "kubernetes.health.active_checks.schedule: '* * * * *' queues a check every 1 minute(s)"),
    (_at("kubernetes", "health", "active_checks", {"schedule": "*/30 * * * *"}),
     "kubernetes.health.active_checks.schedule: '*/30 * * * *' queues a check every 30 minute(s)"),
    (_at("kubernetes", "health", "active_checks", {"schedule": "0 0 30 2 *"}),
     "kubernetes.health.active_checks.schedule: '0 0 30 2 *' never fires"),
    (_at("kubernetes", "health", "active_checks", {"schedule": "0 4 31 4,6,9,11 *"}),
     "kubernetes.health.active_checks.schedule: '0 4 31 4,6,9,11 *' never fires"),
    (_at("kubernetes", "health", "active_checks", {"schedule": "0 5-3 * * *"}),
     "kubernetes.health.active_checks.schedule: '0 5-3 * * *': '5-3' is not a valid hour"),
    (_at("kubernetes", "monitoring", "gpu_temperature_limit_c", 40),
     "kubernetes.monitoring.gpu_temperature_limit_c: 40 C is below what a busy GPU reaches"),
]


@pytest.mark.parametrize("change, message", SLURM_CASES + HEALTH_CASES,
                         ids=[m.split(":")[0] + f"-{i}" for i, (_, m) in enumerate(SLURM_CASES + HEALTH_CASES)])
def test_what_would_damage_a_running_cluster_is_refused_by_validate_and_plan_alike(change, message, tmp_path):
    data = _slurm()
    change(data)
    refused_alike(data, message, tmp_path)


@pytest.mark.parametrize("schedule", ["0 0 29 2 *", "0 0 30 2 1", "@hourly", "0 */6 * * *", "15 3 * * 0"])
def test_schedules_that_fire_at_most_hourly_are_accepted(schedule):
    data = copy.deepcopy(_DEV)
    data["kubernetes"]["health"]["active_checks"] = {"schedule": schedule}
    assert problems_of(data) == []


def test_an_external_database_may_use_any_user_it_has():
    data = _slurm()
    data["kubernetes"]["slurm"]["accounting"] = {"database_host": "db.site.example", "database_user": "root",
                                                 "password_secret": "slurmdb"}
    assert problems_of(data) == []


def test_a_tenant_named_root_without_slurm_gpus_is_no_slurm_account():
    data = copy.deepcopy(_DEV)
    data["tenants"][1]["name"] = "root"
    assert not [p for p in problems_of(data) if "root account" in p]


@pytest.mark.parametrize("rollout, said", [({"max_unavailable": "100%"}, "max_unavailable 100%"),
                                           ({"max_unavailable": 5}, "max_unavailable 5")])
def test_a_rollout_of_the_whole_pool_is_a_warning_in_the_plan_and_the_report(rollout, said):
    from components.offline.report import render_report
    data = copy.deepcopy(_DEV)
    data["node_pools"][0]["rollout"] = rollout
    spec = parse_spec(yaml.safe_dump(data))
    (warning,) = [w for w in spec.warnings() if "in one batch" in w]
    assert f"the rollout of pool(s) h100 (2 hosts, {said}) takes every host out of service in one batch" in warning
    assert f"- {warning}" in render_report(spec)


def test_a_low_temperature_limit_that_only_alerts_is_a_warning():
    data = copy.deepcopy(_DEV)
    data["kubernetes"]["monitoring"] = {"gpu_temperature_limit_c": 60}
    data["kubernetes"]["health"]["gpu_monitor"] = {"quarantine_on": ["nvlink"]}
    spec = parse_spec(yaml.safe_dump(data))
    assert any(w.startswith("kubernetes.monitoring.gpu_temperature_limit_c is 60 C, below what a busy GPU reaches")
               for w in spec.warnings())


def test_the_stock_stacks_have_no_whole_pool_rollout_and_no_low_limit():
    data = copy.deepcopy(_DEV)
    assert not [w for w in parse_spec(yaml.safe_dump(data)).warnings() if "one batch" in w or "busy GPU" in w]


# Every value anywhere in a spec that has every section of this round: Slurm with login and accounting, the health
# section, rollouts. Problems or a valid spec, never a crash.
_FULL = _slurm()
_FULL["kubernetes"]["slurm"]["login"] = {"directory": {
    "uris": ["ldaps://ldap.site.example"], "search_base": "dc=site,dc=example", "group_prefix": "oidc:",
    "bind_dn": "cn=sssd,ou=services,dc=site,dc=example"}}
_FULL["kubernetes"]["health"].update(active_checks={"schedule": "0 */6 * * *", "timeout_s": 900},
                                     quarantine={"mode": "enforce", "evict_at_most_percent": 10},
                                     gpu_monitor={"quarantine_on": ["temperature"]})
_FULL["node_pools"][0]["rollout"] = {"max_unavailable": "25%", "failure_budget_hosts": 1}
_FULL_PATHS = [p for p in _paths(_FULL) if p]


def test_the_full_spec_is_valid():
    assert problems_of(_FULL) == []


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(_FULL_PATHS), _VALUES), min_size=1, max_size=3))
def test_any_value_anywhere_in_a_spec_with_every_day2_section_gives_problems_not_a_crash(changes):
    _only_spec_errors(yaml.safe_dump(with_changes(_FULL, changes), allow_unicode=True))


# validate and plan agree: a spec validate accepts plans without errors. Names are where one component's
# object meets another's (a namespace, a queue, an account), so the values are names the spec already uses and
# names others own; any string field of the spec may take one.
def _value_at(doc, path):
    for part in path:
        doc = doc[part]
    return doc


_NAMES = sorted({v for p in _FULL_PATHS if isinstance(v := _value_at(_FULL, p), str) and len(v) < 40
                 and v.replace("-", "").isalnum()} | {"kube-system", "slinky", "slurm", "monitoring", "gpu-operator",
                                                     "kueue-system", "nrr-system", "normal", "root", "default"})


_TEXT_PATHS = [p for p in _FULL_PATHS if isinstance(_value_at(_FULL, p), str)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(_TEXT_PATHS), st.sampled_from(_NAMES)), min_size=1, max_size=2))
def test_a_spec_validate_accepts_plans_without_errors(tmp_path_factory, changes):
    from components.offline.plan import build_plan
    from components.offline.runner import run_program
    from components.spec.loader import SpecError
    from tests.conftest import ROOT
    data = with_changes(_FULL, changes)
    try:
        parse_spec(yaml.safe_dump(data))
    except SpecError:
        return                                      # validate refuses it: nothing more to agree on
    spec_file = tmp_path_factory.mktemp("agree") / "agree.yaml"
    spec_file.write_text(yaml.safe_dump(data, sort_keys=False))
    plan = build_plan(run_program(ROOT, "agree", spec_file=spec_file, secrets=("slurmDirectoryPassword",)))
    assert plan.errors == [], (changes, plan.errors[:3])
