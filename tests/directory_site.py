"""A directory and a login node on this machine for the tests: OpenLDAP's slapd (Debian's) with users and groups
over TLS, and the login node's sssd and sshd (Debian's; Slinky's login image runs the same three programs under
supervisord, its PAM set up by `authselect select sssd`) on the files the Slurm component generates."""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from components.k8s.slurm import cluster as slurm
from tests.slurm_site import free_port, wait_until

PROGRAMS = ("slapd", "slapadd", "sssd", "sshd", "ssh", "openssl", "unshare")
MISSING = next((p for p in PROGRAMS if shutil.which(p) is None and not Path(f"/usr/sbin/{p}").exists()), None)
WHY_MISSING = "OpenLDAP, sssd or OpenSSH is not installed (.ci/run installs slapd, sssd, sssd-ldap and libpam-sss)"
BASE = "dc=example,dc=com"
BIND_DN = f"cn=sssd,ou=services,{BASE}"
BIND_PASSWORD = "bind-secret-7Q"
PEOPLE_GID = 30000                 # every user's primary group
ROOT_DN, ROOT_PASSWORD = f"cn=admin,{BASE}", "root-secret-3Z"
# Users, their password (their name reversed) and their groups: the dev stack's tenants' groups, without the
# prefix its OIDC authenticator adds. carol only views team-b; mallory is in no tenant's group.
USERS = {"alice": ["team-a"], "bob": ["team-b"], "carol": ["auditors"], "dana": ["ml-platform-admins"],
         "mallory": []}


def password(user: str) -> str:
    return user[::-1] + "-Pw1"


def _ldif() -> str:
    entries = [f"dn: {BASE}\nobjectClass: dcObject\nobjectClass: organization\ndc: example\no: example",
               f"dn: ou=people,{BASE}\nobjectClass: organizationalUnit\nou: people",
               f"dn: ou=groups,{BASE}\nobjectClass: organizationalUnit\nou: groups",
               f"dn: ou=services,{BASE}\nobjectClass: organizationalUnit\nou: services",
               f"dn: {BIND_DN}\nobjectClass: organizationalRole\nobjectClass: simpleSecurityObject\ncn: sssd\n"
               f"userPassword: {BIND_PASSWORD}"]
    for uid, (user, _) in enumerate(USERS.items(), start=20001):
        entries.append(f"dn: uid={user},ou=people,{BASE}\nobjectClass: inetOrgPerson\nobjectClass: posixAccount\n"
                       f"uid: {user}\ncn: {user}\nsn: {user}\nuidNumber: {uid}\ngidNumber: {PEOPLE_GID}\n"
                       f"homeDirectory: /home/{user}\nloginShell: /bin/bash\nuserPassword: {password(user)}")
    entries.append(f"dn: cn=people,ou=groups,{BASE}\nobjectClass: posixGroup\ncn: people\ngidNumber: {PEOPLE_GID}")
    groups = sorted({g for gs in USERS.values() for g in gs})
    for gid, group in enumerate(groups, start=30001):
        members = [u for u, gs in USERS.items() if group in gs]
        # Both schemas' memberships (rfc2307: memberUid; rfc2307bis: member), so either ldap_schema finds them;
        # Debian ships no rfc2307bis schema, so extensibleObject lets a posixGroup carry `member`.
        entries.append(f"dn: cn={group},ou=groups,{BASE}\nobjectClass: posixGroup\nobjectClass: extensibleObject\n"
                       f"cn: {group}\ngidNumber: {gid}\n"
                       + "\n".join(f"memberUid: {u}\nmember: uid={u},ou=people,{BASE}" for u in members))
    return "\n\n".join(entries) + "\n"


def _certificates(work: Path) -> None:
    """A CA and the directory's certificate for localhost, signed by it."""
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=work, check=True, capture_output=True)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
            "-subj", "/CN=directory test CA")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
            "-subj", "/CN=localhost")
    (work / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.crt", "-days", "2", "-extfile", "san.ext")


@contextmanager
def directory(work: Path) -> Iterator[dict[str, int]]:
    """slapd on 127.0.0.1 with ldaps:// and ldap:// (StartTLS) ports; yields them. Only the bind account (and a
    user, for its own entry) may read: an sssd that does not bind as BIND_DN finds no one."""
    work.mkdir(parents=True, exist_ok=True)
    _certificates(work)
    (work / "db").mkdir()
    conf = work / "slapd.conf"
    conf.write_text(textwrap.dedent(f"""\
        include /etc/ldap/schema/core.schema
        include /etc/ldap/schema/cosine.schema
        include /etc/ldap/schema/nis.schema
        include /etc/ldap/schema/inetorgperson.schema
        modulepath /usr/lib/ldap
        moduleload back_mdb
        pidfile {work}/slapd.pid
        TLSCACertificateFile {work}/ca.crt
        TLSCertificateFile {work}/server.crt
        TLSCertificateKeyFile {work}/server.key
        database mdb
        suffix "{BASE}"
        rootdn "{ROOT_DN}"
        rootpw {ROOT_PASSWORD}
        directory {work}/db
        access to attrs=userPassword by anonymous auth by self read by * none
        access to * by dn.exact="{BIND_DN}" read by self read by * none
        """))
    (work / "data.ldif").write_text(_ldif())
    subprocess.run(["slapadd", "-f", str(conf), "-l", str(work / "data.ldif")], check=True, capture_output=True)
    ports = {"ldaps": free_port(), "ldap": free_port()}
    log = open(work / "slapd.log", "wb")
    daemon = subprocess.Popen(["slapd", "-d", "256", "-f", str(conf), "-h",
                               f"ldaps://127.0.0.1:{ports['ldaps']}/ ldap://127.0.0.1:{ports['ldap']}/"],
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: subprocess.run(
            ["ldapsearch", "-x", "-H", f"ldap://127.0.0.1:{ports['ldap']}", "-D", BIND_DN, "-w", BIND_PASSWORD,
             "-b", BASE, "-s", "base"], capture_output=True).returncode == 0, daemon, "slapd", 30)
        yield ports
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
        log.close()


# PAM of the login image's `authselect select sssd` profile, in its sssd-only essentials: a directory user is
# authenticated and let in by sssd, whose access provider decides.
_PAM_SSHD = """\
auth     required   pam_sss.so
account  required   pam_sss.so
password required   pam_deny.so
session  required   pam_permit.so
"""


def pod_files(work: Path, sssd_conf: str, bind_conf: str | None, ca: Path, command: str,
              extra: dict[str, str] | None = None) -> list[str]:
    """`command` in a mount namespace as a login pod's container has it: /etc is this host's with the pod's files
    over it (sssd.conf and conf.d/bind.conf at 0600, the CA where the ConfigMap is mounted, NSS through sssd, and
    `extra`), and /var/lib/sss is empty; as `unshare` arguments."""
    files = {"sssd/sssd.conf": sssd_conf, slurm.DIRECTORY_CA.removeprefix("/etc/"): ca.read_text(),
             "nsswitch.conf": "passwd: files sss\ngroup: files sss\nshadow: files\nhosts: files\n", **(extra or {})}
    if bind_conf is not None:
        files[slurm.SSSD_BIND.removeprefix("/etc/")] = bind_conf
    staged = work / "etc"
    for rel, text in files.items():
        path = staged / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o600 if rel.startswith("sssd/") else 0o644)
    sss = "db pipes/private mc pubconf gpo_cache deskprofile keytabs secrets"
    ov = work / "ov"
    ov.mkdir(exist_ok=True)
    return ["unshare", "-m", "sh", "-c", " && ".join([
        f"mount -t tmpfs none {ov}", f"mkdir {ov}/u {ov}/w {ov}/sss",
        f"mount -t overlay overlay -o lowerdir=/etc,upperdir={ov}/u,workdir={ov}/w /etc",
        "rm -rf /etc/sssd/conf.d", f"cp -a {staged}/. /etc/",
        f"(cd {ov}/sss && mkdir -p {sss})", f"mount --bind {ov}/sss /var/lib/sss", command])]


@contextmanager
def login_node(work: Path, sssd_conf: str, bind_conf: str | None, ca: Path) -> Iterator[int]:
    """sssd and sshd as a login pod runs them (pod_files), sshd on the operator's sshd_config and the chart's
    extraSshdConfig; yields sshd's port."""
    work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    # The operator's sshd_config (loginbuilder.buildSshdConfig) less its Include, then the chart's extraSshdConfig.
    sshd_config = (f"UsePAM yes\nX11Forwarding yes\nSubsystem sftp internal-sftp\n{slurm.LOGIN_SSHD}\n"
                   f"Port {port}\nListenAddress 127.0.0.1\nHostKey {work}/host_key\nPidFile {work}/sshd.pid\n")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(work / "host_key")], check=True)
    # sssd (-i) stops its responders when it is stopped; both daemons are stopped with the shell.
    daemons = ("mkdir -p /run/sshd && { sssd -i --logger=stderr -d 3 & s=$!; "
               "/usr/sbin/sshd -D -e -f /etc/ssh/sshd_config.login & d=$!; trap 'kill $s $d; wait' TERM; wait; }")
    log = open(work / "login.log", "wb")
    node = subprocess.Popen(pod_files(work, sssd_conf, bind_conf, ca, daemons, {
        "pam.d/sshd": _PAM_SSHD, "ssh/sshd_config.login": sshd_config}),
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: all(line in (work / "login.log").read_bytes()
                               for line in (b"Server listening", b"[pam] [server_setup]")), node, "sshd and sssd", 30)
        yield port
    finally:
        node.terminate()
        node.wait(timeout=30)
        log.close()


def ssh_login(port: int, user: str, secret: str, work: Path, command: str = "id -Gn") -> subprocess.CompletedProcess:
    """`command` run by `user` logging in with `secret` as its password, as a tenant's member would."""
    askpass = work / "askpass"
    askpass.write_text("#!/bin/sh\nprintf '%s\\n' \"$LOGIN_SECRET\"\n")
    askpass.chmod(0o700)
    env = {**os.environ, "SSH_ASKPASS": str(askpass), "SSH_ASKPASS_REQUIRE": "force", "DISPLAY": ":0",
           "LOGIN_SECRET": secret}
    return subprocess.run(
        ["ssh", "-F", "/dev/null", "-p", str(port), "-o", "StrictHostKeyChecking=no",
         "-o", "UserKnownHostsFile=/dev/null", "-o", "PubkeyAuthentication=no", "-o", "LogLevel=ERROR",
         "-o", "PreferredAuthentications=keyboard-interactive,password", "-o", "NumberOfPasswordPrompts=1",
         "-o", "ConnectTimeout=20", f"{user}@127.0.0.1", command],
        env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, start_new_session=True)


def set_membership(port: int, user: str, group: str, member: bool) -> None:
    """`user` put into or taken out of `group` in the directory (both membership attributes), as its admins do."""
    op = "add" if member else "delete"
    change = (f"dn: cn={group},ou=groups,{BASE}\nchangetype: modify\n{op}: memberUid\nmemberUid: {user}\n-\n"
              f"{op}: member\nmember: uid={user},ou=people,{BASE}\n")
    subprocess.run(["ldapmodify", "-x", "-H", f"ldap://127.0.0.1:{port}", "-D", ROOT_DN, "-w", ROOT_PASSWORD],
                   input=change, text=True, check=True, capture_output=True)
