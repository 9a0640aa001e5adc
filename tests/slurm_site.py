"""A Slurm site on this machine for the tests: the daemons Debian packages (Slurm 22.05, munge, MariaDB) on
the files the Slurm component generates, assembled as Slinky's operator assembles them."""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from components.k8s.slurm import cluster as slurm
from tests.components.k8s.slurm_specs import with_slurm_pool

DAEMONS = ("slurmctld", "slurmdbd", "sacctmgr", "munged", "mariadbd", "mariadb-install-db")
MISSING = next((d for d in DAEMONS if shutil.which(d) is None), None)
WHY_MISSING = ("Slurm, munge or MariaDB is not installed (.ci/run installs slurmctld, slurmd, slurmdbd, slurm-client, "
               "munge, mariadb-server and libpmix-dev, whose libpmix.so the mpi/pmix plugin loads)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def operator_slurm_conf(spec, values: dict, work: Path, ports: dict[str, int], address: str | None = None) -> str:
    host = f"localhost({address})" if address else "localhost"
    base = [f"ClusterName={values['clusterName']}", "SlurmUser=root", f"SlurmctldHost={host}",
            f"SlurmctldPort={ports['slurmctld']}", f"StateSaveLocation={work}/state", f"SlurmdSpoolDir={work}/spool",
            f"SlurmctldPidFile={work}/slurmctld.pid", f"SlurmctldLogFile={work}/slurmctld.log",
            f"SlurmdLogFile={work}/slurmd.log", "ReturnToService=2", "MaxNodeCount=1024", "GresTypes=gpu",
            "AuthType=auth/munge", f"AuthInfo=socket={work}/munge.sock", "SelectTypeParameters=CR_Core_Memory",
            "ProctrackType=proctrack/cgroup", "PrologFlags=Contain", "TaskPlugin=task/affinity,task/cgroup",
            "AccountingStorageType=accounting_storage/slurmdbd", "AccountingStorageHost=localhost",
            f"AccountingStoragePort={ports['slurmdbd']}", "AccountingStorageTRES=gres/gpu",
            f"AccountingStoragePass={work}/munge.sock", "JobAcctGatherType=jobacct_gather/cgroup",
            "SlurmdParameters=config_overrides",      # this host is not the hardware the spec describes
            # the chart's prologScripts and epilogScripts, which the operator names prolog-<key> and epilog-<key>
            *(f"{when.capitalize()}={work}/{when}-{name}" for when in ("prolog", "epilog")
              for name in values[f"{when}Scripts"])]
    nodes, sets = [], []
    for pool in slurm.slurm_pools(spec):
        ns = values["nodesets"][pool.name]
        registers = {**ns["extraConfMap"], "Features": f"{pool.name},{ns['extraConfMap']['Features']}"}
        cores = pool.cpu_cores_per_host // pool.threads_per_core // pool.numa_nodes_per_host
        for host in pool.hosts:
            name = slurm.node_name(host.hostname)
            # each node its own port, so only the node a test starts slurmd for answers the controller
            nodes.append(f"NodeName={name} NodeAddr=127.0.0.1 Port={ports[name]} "
                         f"CPUs={pool.cpu_cores_per_host} Sockets={pool.numa_nodes_per_host} "
                         f"CoresPerSocket={cores} ThreadsPerCore={pool.threads_per_core} "
                         f"RealMemory={pool.memory_gib_per_host * 1024} "
                         + " ".join(f"{k}={v}" for k, v in sorted(registers.items())) + " State=UNKNOWN")
        partition = " ".join(f"{k}={v}" for k, v in ns["partition"]["configMap"].items())
        sets += [f"NodeSet={pool.name} Feature={pool.name}", f"PartitionName={pool.name} Nodes={pool.name} {partition}"]
    return "\n".join([*base, *nodes, *sets, values["controller"]["extraConf"]]) + "\n"


def operator_slurmdbd_conf(values: dict, work: Path, ports: dict[str, int], password: str) -> str:
    storage = values["accounting"]["storageConfig"]
    return "\n".join([
        "DbdHost=localhost", f"DbdPort={ports['slurmdbd']}", "SlurmUser=root", "AuthType=auth/munge",
        f"AuthInfo=socket={work}/munge.sock", "StorageType=accounting_storage/mysql", "StorageHost=127.0.0.1",
        f"StoragePort={ports['mariadb']}", f"StorageUser={storage['username']}", f"StorageLoc={storage['database']}",
        f"StoragePass={password}", f"LogFile={work}/slurmdbd.log", f"PidFile={work}/slurmdbd.pid"]) + "\n"


def start_mariadb(work: Path, port: int, database: str, user: str, password: str) -> subprocess.Popen:
    """MariaDB with the StatefulSet's own arguments, and the database and user its image's entrypoint makes."""
    data = work / "mysql"
    subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=root",
                    "--auth-root-authentication-method=normal", "--skip-test-db"], check=True, capture_output=True,
                   timeout=120)
    db = subprocess.Popen(["mariadbd", "--no-defaults", f"--datadir={data}", f"--socket={work}/mysql.sock",
                           "--bind-address=127.0.0.1", f"--port={port}", "--user=root", f"--pid-file={work}/m.pid",
                           f"--log-error={work}/mariadb.log", *slurm.MARIADB_ARGS])
    sql = (f"CREATE DATABASE {database}; CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY '{password}'; "
           f"GRANT ALL ON {database}.* TO '{user}'@'127.0.0.1';")
    wait_until(lambda: subprocess.run(["mariadb", "--no-defaults", f"--socket={work}/mysql.sock", "-uroot", "-e",
                                       sql], capture_output=True).returncode == 0, db, "MariaDB")
    return db


def wait_until(ready, process: subprocess.Popen, what: str, timeout_s: float = 120) -> None:
    """Polls `ready` until it holds; fails when `process` (the daemon it waits on) exits, or at `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert process.poll() is None, f"{what} exited with {process.returncode}"
        assert time.monotonic() < deadline, f"{what} was not ready in {timeout_s:g} s"
        time.sleep(0.5)


def apply_accounts(spec, env: dict, work: Path) -> str:
    """The accounts Job's script, as the Job runs it, against this site."""
    (work / "accounts.cfg").write_text(slurm.render_accounts_file(spec))
    (work / "accounts.sh").write_text(slurm.render_accounts_script(spec, str(work / "accounts.cfg"), tries=6))
    out = subprocess.run(["bash", str(work / "accounts.sh")], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def sacctmgr(env: dict, *args: str) -> list[dict[str, str]]:
    out = subprocess.run(["sacctmgr", "-n", "-P", "show", *args], env=env, capture_output=True, text=True,
                         check=True).stdout
    fmt = [f.lower() for f in args[-1].split("=", 1)[1].split(",")]
    return [dict(zip(fmt, line.split("|"))) for line in out.splitlines()]


def slurm_spec(*more, **edits):
    """The dev spec with a three-host Slurm pool, then `more` (functions that change the spec's data), then
    `edits` (dotted path -> value)."""
    import yaml

    from components.spec import parse_spec
    data = yaml.safe_load((Path(__file__).resolve().parents[1] / "stacks" / "dev.yaml").read_text())
    with_slurm_pool(data, hosts=3)
    for change in more:
        change(data)
    for path, value in edits.items():
        node = data
        *parents, last = path.split(".")
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node[last] = value
    return parse_spec(yaml.safe_dump(data))


@contextmanager
def slurm_site(spec, work: Path, address: str | None = None) -> Iterator[dict[str, str]]:
    """MariaDB, munged, slurmdbd and slurmctld on the files generated for `spec`, in `work`; yields the
    environment client commands need. `address`: where clients reach slurmctld, when not on this host's
    loopback (a test host's network namespace reaches the bridge's address)."""
    values = slurm.render_slurm_values(spec)
    (work / "state").mkdir()
    (work / "spool").mkdir()
    ports = {"slurmctld": free_port(), "slurmdbd": free_port(), "mariadb": free_port()}
    ports.update({slurm.node_name(h.hostname): free_port() for p in slurm.slurm_pools(spec) for h in p.hosts})
    for name, text in values["configFiles"].items():
        (work / name).write_text(text)
    for when in ("prolog", "epilog"):
        for name, text in values[f"{when}Scripts"].items():
            (work / f"{when}-{name}").write_text(text)
            (work / f"{when}-{name}").chmod(0o755)
    password = os.urandom(12).hex()
    (work / "slurm.conf").write_text(operator_slurm_conf(spec, values, work, ports, address))
    (work / "slurmdbd.conf").write_text(operator_slurmdbd_conf(values, work, ports, password))
    (work / "slurmdbd.conf").chmod(0o600)                 # slurmdbd refuses a password file others can read
    (work / "munge.key").write_bytes(os.urandom(1024))
    (work / "munge.key").chmod(0o600)
    env = {**os.environ, "SLURM_CONF": str(work / "slurm.conf")}
    storage = values["accounting"]["storageConfig"]
    daemons = [start_mariadb(work, ports["mariadb"], storage["database"], storage["username"], password)]
    try:
        subprocess.run(["munged", "--socket", f"{work}/munge.sock", "--key-file", f"{work}/munge.key",
                        "--pid-file", f"{work}/munged.pid", "--log-file", f"{work}/munged.log", "--seed-file",
                        f"{work}/seed", "--force"], check=True, timeout=30)
        daemons.append(subprocess.Popen(["slurmdbd", "-D"], env=env, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.STDOUT))
        wait_until(lambda: subprocess.run(["sacctmgr", "-n", "show", "cluster"], env=env,
                                          capture_output=True).returncode == 0, daemons[-1], "slurmdbd")
        daemons.append(subprocess.Popen(["slurmctld", "-D", "-f", str(work / "slurm.conf")], env=env,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        wait_until(lambda: subprocess.run(["scontrol", "ping"], env=env, capture_output=True).returncode == 0,
                   daemons[-1], "slurmctld")
        yield env
    finally:
        for daemon in reversed(daemons):
            daemon.terminate()
            daemon.wait(timeout=60)
        if (work / "munged.pid").exists():
            subprocess.run(["kill", (work / "munged.pid").read_text().strip()], check=False)


def scontrol(env: dict, *args: str) -> str:
    return subprocess.run(["scontrol", *args], env=env, capture_output=True, text=True, check=True).stdout


def fields(line: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in line.split() if "=" in part)


def node_fields(line: str) -> dict[str, str]:
    """`scontrol show node -o` as key -> value, with the whole Reason (its "[user@time]" left out; "" for none)."""
    head, _, reason = line.partition(" Reason=")
    return {**fields(head), "Reason": reason.rsplit(" [", 1)[0]}


def drained(env: dict, node: str) -> str | None:
    """The node's drain reason, or None when it is not drained (a drained one is returned to service)."""
    state = node_fields(scontrol(env, "show", "node", "-o", node))
    if "DRAIN" not in state["State"]:
        return None
    # resume, as an operator would: it clears the drain (these nodes have no slurmd, so are UNKNOWN, and
    # scontrol also says "Invalid node state specified" for them)
    subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], env=env, capture_output=True)
    assert "DRAIN" not in node_fields(scontrol(env, "show", "node", "-o", node))["State"]
    return state["Reason"]


def host_cgroup_conf(text: str) -> str:
    """The generated cgroup.conf as this host can run it: Slinky's pods mount cgroup v2, but where this host
    mounts cgroups hybrid (v1 controllers beside an empty v2 tree), 22.05's cgroup/v2 refuses to start, so the
    same constraints go through cgroup/v1."""
    if Path("/sys/fs/cgroup/cgroup.controllers").exists():
        return text
    return text.replace("CgroupPlugin=cgroup/v2", "CgroupPlugin=cgroup/v1")


def in_private_dev(gpus: int, command: str, tools: Path | None = None) -> list[str]:
    """`command` in a mount namespace whose /dev has the GPUs' device files (slurmd stats them; no driver backs
    them, so opening one fails with ENXIO where the cgroup allows it and EPERM where it does not), a /dev/shm and
    /dev/fd (which container runtimes make, and bash's process substitution needs).
    `tools`: a folder seen as /usr/local/bin there, on the PATH bash gives the node check, whose environment
    from slurmd has none (the doubles of nvidia-smi and dcgmi)."""
    devices = " && ".join(f"mknod /dev/nvidia{i} c 195 {i}" for i in range(gpus))
    bind = f"mount --bind {shlex.quote(str(tools))} /usr/local/bin && " if tools else ""
    return ["unshare", "-m", "sh", "-c",
            f"mount -t tmpfs none /dev && mknod -m 666 /dev/null c 1 3 && mknod -m 666 /dev/zero c 1 5 && "
            f"mkdir /dev/shm && mount -t tmpfs none /dev/shm && ln -s /proc/self/fd /dev/fd && {devices} && "
            f"{bind}exec {command}"]


@contextmanager
def slurmd(env: dict, work: Path, node: str, gpus: int, tools: Path | None = None) -> Iterator[None]:
    """slurmd as `node` on the site's files (cgroup.conf as this host runs it), with `gpus` device files and
    `tools` as its /usr/local/bin (see in_private_dev). It runs the generated prolog and epilog (the node check)
    around every job."""
    conf = work / "cgroup.conf"
    conf.write_text(host_cgroup_conf(conf.read_text()))
    daemon = subprocess.Popen(in_private_dev(gpus, f"slurmd -D -N {node}", tools), env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: fields(scontrol(env, "show", "node", "-o", node))["State"] == "IDLE", daemon,
                   f"slurmd {node}", 60)
        yield
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)
