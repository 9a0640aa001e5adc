"""Slurm 26.05's own daemons, from the root e2e/build-slurm-root.sh makes (Debian sid), for Slinky's operator to
talk to: slurmctld with JWT as its second authentication (the operator's tokens), a slurmd per Slurm node, and
slurmrestd on localhost:6820 (where the operator looks with DEBUG=1). Each runs under chroot in private mount and
PID namespaces (its own /proc, /dev and /sys), so nothing stays mounted and none of its job steps runs on when it
ends; their files are in a folder of the root's /tmp. Jobs run as the daemons would run them on a node: proctrack/linuxproc and no task plugin, since
what is tested here is the rollout's dealings with Slurm, not the job's confinement (tests/slurm_site.py runs the
generated cgroup.conf)."""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

from tests.slurm_site import fields, node_fields, wait_until

from .controlplane import TOOLS, free_port

ROOT = TOOLS / "slurm-root"
RESTAPI_PORT = 6820         # slurm-operator v1.1.0 internal/builder: SlurmrestdPort
SLURM_UID = "slurm"         # the Debian packages' SlurmUser, and the user the operator's tokens name ("sun")


class SlurmRoot:
    """The daemons of one Slurm cluster `name`: `nodes` (Slurm node names) in one partition `partition`, whose
    nodes carry the feature of the same name (as a NodeSet's do); `jwt_key`, the key the operator signs with."""

    def __init__(self, name: str, partition: str, nodes: list[str], jwt_key: bytes) -> None:
        self.name, self.partition, self.nodes, self.jwt_key = name, partition, nodes, jwt_key
        self.inside = Path("/tmp") / f"gc-{name}-{free_port()}"     # as the daemons see it
        self.dir = ROOT / self.inside.relative_to("/")
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def _conf(self, ports: dict[str, int]) -> str:
        d = self.inside
        lines = [f"ClusterName={self.name}", f"SlurmUser={SLURM_UID}", "SlurmctldHost=localhost(127.0.0.1)",
                 f"SlurmctldPort={ports['slurmctld']}", f"StateSaveLocation={d}/state", f"SlurmdSpoolDir={d}/spool/%n",
                 f"SlurmctldPidFile={d}/slurmctld.pid", f"SlurmdPidFile={d}/slurmd-%n.pid",
                 f"SlurmctldLogFile={d}/slurmctld.log", f"SlurmdLogFile={d}/slurmd-%n.log",
                 "AuthType=auth/munge", f"AuthInfo=socket={d}/munge.sock",
                 "AuthAltTypes=auth/jwt", f"AuthAltParameters=jwt_key={d}/jwt.key",
                 "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "ReturnToService=2",
                 "SlurmdParameters=config_overrides"]         # this machine is not the hardware nodes claim
        lines += [f"NodeName={n} NodeAddr=127.0.0.1 Port={ports[n]} CPUs=4 RealMemory=1000 "
                  f"Features={self.partition} State=UNKNOWN" for n in self.nodes]
        lines.append(f"PartitionName={self.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def _daemon(self, name: str, command: str, env: str = "") -> subprocess.Popen[bytes]:
        """`command` in the root, in mount and PID namespaces of its own, killed with whatever it started (a
        slurmd's job steps) when unshare is: the namespace's first process is a shell that waits for it (the
        kernel's kill on the parent's death, which unshare asks for, is lost by a process that changes its user,
        as slurmctld does); its output in the folder's NAME.out."""
        root = shlex.quote(str(ROOT.resolve()))
        mounts = f"mount -t proc proc {root}/proc && mount --rbind /dev {root}/dev && mount --rbind /sys {root}/sys"
        out = open(self.dir / f"{name}.out", "wb")
        proc = subprocess.Popen(["unshare", "--mount", "--pid", "--fork", "--kill-child=SIGKILL", "--propagation",
                                 "private", "sh", "-c", f"{mounts} && {{ chroot {root} env "
                                 f"SLURM_CONF={self.inside}/slurm.conf {env} {command} & wait $!; }}"],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        out.close()
        self.procs[name] = proc
        return proc

    def run(self, *args: str, timeout_s: float = 30, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A Slurm client command (scontrol, sbatch, squeue) in the root, as root."""
        proc = subprocess.run(["chroot", str(ROOT), "env", f"SLURM_CONF={self.inside}/slurm.conf", *args],
                              capture_output=True, text=True, timeout=timeout_s)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(args)}: {proc.returncode}\n{proc.stdout}{proc.stderr}")
        return proc

    def node(self, name: str) -> dict[str, str]:
        return node_fields(self.run("scontrol", "show", "node", "-o", name).stdout)

    def job(self, job_id: str) -> dict[str, str]:
        return fields(self.run("scontrol", "show", "job", "-o", job_id).stdout)

    def _wait(self, name: str, ready: Any, timeout_s: float = 60) -> None:
        """Until `ready()` holds (a probe that fails is not ready yet), as long as the daemon runs."""
        def probe() -> bool:
            try:
                return bool(ready())
            except (AssertionError, subprocess.SubprocessError, KeyError, OSError):
                return False
        try:
            wait_until(probe, self.procs[name], name, timeout_s)
        except AssertionError as e:
            raise AssertionError(f"{e}: {self.log(name)}") from None

    def log(self, name: str, lines: int = 30) -> str:
        text = ""
        for path in (self.dir / f"{name}.log", self.dir / f"{name}.out"):
            if path.exists():
                text += "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) + "\n"
        return text

    def start(self) -> None:
        """Writes the files, then starts munged, slurmctld, each slurmd (ready once IDLE) and slurmrestd."""
        if not (ROOT / "usr/sbin/slurmrestd").exists():
            raise AssertionError(f"no Slurm root at {ROOT}: run `make e2e-tools` (e2e/build-slurm-root.sh)")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", RESTAPI_PORT)) == 0:
                raise AssertionError(f"port {RESTAPI_PORT}, where the operator finds slurmrestd, is taken already")
        for sub in ("state", "spool"):
            (self.dir / sub).mkdir(parents=True)
        ports = {"slurmctld": free_port(), **{n: free_port() for n in self.nodes}}
        (self.dir / "slurm.conf").write_text(self._conf(ports))
        (self.dir / "jwt.key").write_bytes(self.jwt_key)
        (self.dir / "munge.key").write_bytes(os.urandom(1024))
        for key in ("jwt.key", "munge.key"):
            (self.dir / key).chmod(0o600)
        # slurmctld writes its state and log as SlurmUser, and reads the JWT key as it
        self.run("chown", "-R", f"{SLURM_UID}:{SLURM_UID}", str(self.inside))
        self.run("chown", "root:root", f"{self.inside}/munge.key")
        d = self.inside
        self._daemon("munged", f"munged --foreground --force --socket {d}/munge.sock --key-file {d}/munge.key "
                               f"--pid-file {d}/munged.pid --log-file {d}/munged.log --seed-file {d}/munge.seed")
        self._wait("munged", lambda: (self.dir / "munge.sock").exists())
        self._daemon("slurmctld", "slurmctld -D")
        self._wait("slurmctld", lambda: self.run("scontrol", "ping").returncode == 0)
        for n in self.nodes:
            self._daemon(f"slurmd-{n}", f"slurmd -D -N {n}")
            self._wait(f"slurmd-{n}", lambda n=n: self.node(n)["State"] == "IDLE")
        self._daemon("slurmrestd", f"slurmrestd -a rest_auth/jwt -u slurmrestd -g slurmrestd "
                                   f"127.0.0.1:{RESTAPI_PORT}", env="SLURM_JWT=daemon")
        self._wait("slurmrestd", lambda: socket.create_connection(("127.0.0.1", RESTAPI_PORT), timeout=2).close()
                   is None)

    def close(self) -> None:
        for proc in reversed(list(self.procs.values())):
            if proc.poll() is None:
                proc.kill()                 # unshare: the namespace's first process is killed with it, and all in it
                proc.wait(timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)
