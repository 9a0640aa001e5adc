"""The Slurm login nodes' sssd.conf and bind snippet, read by a real sssd (Debian 12's 2.8; Slinky's login image
runs Ubuntu 24.04's 2.9) behind a real sshd with PAM, against a real OpenLDAP over TLS: the tenants' admin and
edit groups log in with their directory passwords, viewers and everyone else are refused."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from components.k8s.slurm import cluster as slurm
from tests.directory_site import (BASE, BIND_DN, BIND_PASSWORD, MISSING, WHY_MISSING, directory,
                                  login_node, password, pod_files, set_membership,
                                  ssh_login)
from tests.slurm_site import MISSING as SLURM_MISSING, WHY_MISSING as WHY_SLURM_MISSING
from tests.slurm_site import apply_accounts, sacctmgr, slurm_site, slurm_spec

pytestmark = [pytest.mark.skipif(MISSING is not None, reason=WHY_MISSING),
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root for sssd, sshd and a mount namespace")]


def login_spec(uri: str, **directory_fields):
    return slurm_spec(**{"kubernetes.slurm.login": {"directory": {
        "uris": [uri], "search_base": BASE, "group_prefix": "oidc:", "bind_dn": BIND_DN,
        "ca_configmap": "directory-ca", **directory_fields}}})


@pytest.fixture(scope="module")
def ldap(tmp_path_factory) -> Iterator[tuple[dict[str, int], Path]]:
    work = tmp_path_factory.mktemp("ldap")
    with directory(work) as ports:
        yield ports, work


def uri(ports: dict[str, int], scheme: str) -> str:
    return f"{scheme}://127.0.0.1:{ports[scheme]}"


@pytest.mark.parametrize("scheme,schema", [("ldaps", "rfc2307bis"), ("ldap", "rfc2307")])
def test_tenant_editors_and_admins_log_in_and_no_one_else(ldap, tmp_path, scheme, schema):
    """ldaps:// and ldap:// with StartTLS, the server's certificate verified against the mounted CA, the
    lookups made as the bind account (anonymous reads are refused by the directory); groups naming their
    members by DN (rfc2307bis) and by uid (rfc2307)."""
    ports, work = ldap
    spec = login_spec(uri(ports, scheme), ldap_schema=schema)
    with login_node(tmp_path, slurm.render_sssd_conf(spec), slurm.render_sssd_bind(BIND_PASSWORD),
                    work / "ca.crt") as port:
        # team-a's edit group, team-b's edit group, team-a's admin group (the dev stack's, less "oidc:")
        for user, group in (("alice", "team-a"), ("bob", "team-b"), ("dana", "ml-platform-admins")):
            done = ssh_login(port, user, password(user), tmp_path)
            assert done.returncode == 0, (user, done.stderr, (tmp_path / "login.log").read_text()[-3000:])
            assert group in done.stdout.split(), done.stdout
        for user in ("carol", "mallory"):          # team-b's viewers; in no tenant's group
            assert ssh_login(port, user, password(user), tmp_path).returncode == 255, user
        assert ssh_login(port, "alice", "not-" + password("alice"), tmp_path).returncode == 255
    log = (tmp_path / "login.log").read_text()
    # carol and mallory gave their right password and were refused by sssd's access check; alice's wrong
    # password was refused by the directory
    for user in ("carol", "mallory"):
        assert f"Access denied for user {user} by PAM account configuration" in log, log[-3000:]
    assert "Access denied for user alice" not in log and "Failed password for alice" in log, log[-3000:]


def test_without_the_bind_snippet_sssd_finds_no_one(ldap, tmp_path):
    """The password reaches sssd only through conf.d/bind.conf: without it (or with a wrong one) the directory
    answers no lookup, so the snippet is what sssd binds with."""
    ports, work = ldap
    spec = login_spec(uri(ports, "ldaps"))
    with login_node(tmp_path, slurm.render_sssd_conf(spec), None, work / "ca.crt") as port:
        assert ssh_login(port, "alice", password("alice"), tmp_path).returncode == 255
    assert "Invalid user alice" in (tmp_path / "login.log").read_text()


def test_an_untrusted_directory_certificate_is_refused(ldap, tmp_path):
    """ldap_tls_reqcert = demand: a login node that does not trust the server's CA does not talk to it."""
    ports, work = ldap
    other = tmp_path / "other-ca"
    other.mkdir()
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "k", "-out", "ca.crt",
                    "-days", "1", "-subj", "/CN=another CA"], cwd=other, check=True, capture_output=True)
    spec = login_spec(uri(ports, "ldaps"))
    with login_node(tmp_path / "node", slurm.render_sssd_conf(spec), slurm.render_sssd_bind(BIND_PASSWORD),
                    other / "ca.crt") as port:
        assert ssh_login(port, "alice", password("alice"), tmp_path).returncode == 255
    log = (tmp_path / "node" / "login.log").read_text()
    assert "ldap_install_tls failed" in log and "Invalid user alice" in log, log[-3000:]


def test_day_two_a_group_dropped_from_the_spec_is_refused_on_the_new_login_pods(ldap, tmp_path):
    """team-b's edit group removed from the spec: sssd.conf changes, so the operator rolls the login pods
    (its hash of sssd.conf is in their template) and the new pods refuse bob while alice still logs in."""
    ports, work = ldap
    before = login_spec(uri(ports, "ldaps"))
    after = slurm_spec(**{"kubernetes.slurm.login": before.kubernetes.slurm.login.model_dump(mode="json",
                                                                                           exclude_defaults=True),
                          "tenants.1.groups.edit": []})
    assert slurm.render_sssd_conf(after) != slurm.render_sssd_conf(before)
    with login_node(tmp_path, slurm.render_sssd_conf(after), slurm.render_sssd_bind(BIND_PASSWORD),
                    work / "ca.crt") as port:
        assert ssh_login(port, "bob", password("bob"), tmp_path).returncode == 255
        assert ssh_login(port, "alice", password("alice"), tmp_path).returncode == 0


# --- the login groups' members as their tenants' Slurm users --------------------------------------------------------

@pytest.fixture(scope="module")
def accounts(ldap, tmp_path_factory) -> Iterator[tuple[dict, object]]:
    """The Slurm site (slurmctld, slurmdbd, MariaDB) with the tenants' accounts and QOS applied."""
    if SLURM_MISSING is not None:
        pytest.skip(WHY_SLURM_MISSING)
    ports, _ = ldap
    spec = login_spec(uri(ports, "ldaps"))
    work = tmp_path_factory.mktemp("slurm-login")
    with slurm_site(spec, work) as env:
        apply_accounts(spec, env, work)
        yield env, spec


def sync(ldap, env: dict, spec, work: Path) -> subprocess.CompletedProcess:
    """The CronJob's script as its container runs it: its own sssd on the login pods' files, then sacctmgr."""
    _, directory_work = ldap
    work.mkdir(parents=True, exist_ok=True)
    (work / "sync.sh").write_text(slurm.render_user_sync_script(spec, tries=2))
    return subprocess.run(pod_files(work, slurm.render_sssd_conf(spec), slurm.render_sssd_bind(BIND_PASSWORD),
                                    directory_work / "ca.crt", f"exec bash {work}/sync.sh"),
                          env=env, capture_output=True, text=True, timeout=300)


def users(env: dict, account: str) -> set[str]:
    return {a["user"] for a in sacctmgr(env, "assoc", f"account={account}", "format=user") if a["user"]}


def test_the_login_groups_members_become_their_tenants_slurm_users_and_leavers_are_removed(ldap, accounts, tmp_path):
    """team-a's account: its admins' and editors' members (dana, alice); team-b's: bob; carol (a viewer) and
    mallory in none. A second run changes nothing; bob taken out of team-b in the directory leaves its account at
    the next run."""
    env, spec = accounts
    first = sync(ldap, env, spec, tmp_path / "1")
    assert first.returncode == 0, first.stdout + first.stderr
    assert (users(env, "team-a"), users(env, "team-b")) == ({"alice", "dana"}, {"bob"})
    assert first.stdout.strip().endswith(": 3 change(s)"), first.stdout
    again = sync(ldap, env, spec, tmp_path / "2")
    assert again.returncode == 0 and again.stdout.strip().endswith(": 0 change(s)"), again.stdout + again.stderr
    set_membership(ldap[0]["ldap"], "bob", "team-b", member=False)
    try:
        left = sync(ldap, env, spec, tmp_path / "3")
        assert left.returncode == 0 and "removed bob from account team-b" in left.stdout, left.stdout + left.stderr
        assert (users(env, "team-a"), users(env, "team-b")) == ({"alice", "dana"}, set())
    finally:
        set_membership(ldap[0]["ldap"], "bob", "team-b", member=True)


def test_a_group_the_directory_does_not_answer_for_stops_the_run_before_anyone_is_removed(ldap, accounts, tmp_path):
    """A tenant group the directory lacks (a typo, or the directory down) is not an empty group: the run fails
    with its name and removes no one."""
    env, spec = accounts
    first = sync(ldap, env, spec, tmp_path / "1")
    assert first.returncode == 0, first.stdout + first.stderr
    before = users(env, "team-a")
    ghost = slurm_spec(**{"kubernetes.slurm.login": spec.kubernetes.slurm.login.model_dump(
        mode="json", exclude_defaults=True), "tenants.0.groups.edit": ["oidc:no-such-group"]})
    failed = sync(ldap, env, ghost, tmp_path / "2")
    assert failed.returncode != 0 and "group no-such-group" in failed.stderr, failed.stdout + failed.stderr
    assert users(env, "team-a") == before
