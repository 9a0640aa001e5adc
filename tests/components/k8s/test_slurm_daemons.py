"""The Slurm files the component generates, read by real Slurm daemons (Debian's slurm-wlm, which .ci/run installs),
and its QOS and accounts applied by sacctmgr through a real slurmdbd on a real MariaDB.

Debian 12 ships Slurm 22.05; Slinky 1.1.0 runs 25.11. slurm.conf is assembled here as the operator assembles it
(controllerbuilder.buildSlurmConf in slurm-operator v1.1.0: its general lines, `NodeSet=<pool> Feature=<pool>`,
`PartitionName=<pool> Nodes=<pool> <partition config>`, then the chart's extraConf), with 22.05's forms of the
operator's own lines (munge for auth/slurm, local ports and directories); slurmdbd.conf likewise
(accountingbuilder.buildSlurmdbdConf: the chart's storageConfig, the database reached at 127.0.0.1 here). Its NodeSet pods register as
dynamic nodes (`slurmd -Z --conf 'Features=<pool>,... Gres=...'`); 22.05's tree topology does not take dynamic
nodes, so each is declared here as the node it registers as. What the component generates (extraConf, the
partition config, gres.conf, cgroup.conf, topology.conf and each NodeSet's --conf) goes in unchanged.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

from components.k8s import slurm
from tests.components.k8s.slurm_specs import SLURM_POOL, with_slurm_pool

DAEMONS = ("slurmctld", "slurmdbd", "sacctmgr", "munged", "mariadbd", "mariadb-install-db")
pytestmark = pytest.mark.skipif(any(shutil.which(d) is None for d in DAEMONS),
                                reason="Slurm, munge or MariaDB is not installed (.ci/run installs slurmctld, slurmd, "
                                       "slurmdbd, slurm-client, munge, mariadb-server and libpmix-dev, whose "
                                       "libpmix.so the mpi/pmix plugin loads)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def operator_slurm_conf(spec, values: dict, work: Path, ports: dict[str, int]) -> str:
    base = [f"ClusterName={values['clusterName']}", "SlurmUser=root", "SlurmctldHost=localhost",
            f"SlurmctldPort={ports['slurmctld']}", f"StateSaveLocation={work}/state", f"SlurmdSpoolDir={work}/spool",
            f"SlurmctldPidFile={work}/slurmctld.pid", f"SlurmctldLogFile={work}/slurmctld.log",
            f"SlurmdLogFile={work}/slurmd.log", "ReturnToService=2", "MaxNodeCount=1024", "GresTypes=gpu",
            "AuthType=auth/munge", f"AuthInfo=socket={work}/munge.sock", "SelectTypeParameters=CR_Core_Memory",
            "ProctrackType=proctrack/cgroup", "PrologFlags=Contain", "TaskPlugin=task/affinity,task/cgroup",
            "AccountingStorageType=accounting_storage/slurmdbd", "AccountingStorageHost=localhost",
            f"AccountingStoragePort={ports['slurmdbd']}", "AccountingStorageTRES=gres/gpu",
            f"AccountingStoragePass={work}/munge.sock", "JobAcctGatherType=jobacct_gather/cgroup"]
    nodes, sets = [], []
    for pool in slurm.slurm_pools(spec):
        ns = values["nodesets"][pool.name]
        registers = {**ns["extraConfMap"], "Features": f"{pool.name},{ns['extraConfMap']['Features']}"}
        cores = pool.cpu_cores_per_host // pool.threads_per_core // pool.numa_nodes_per_host
        for host in pool.hosts:
            nodes.append(f"NodeName={slurm.node_name(host.hostname)} NodeAddr=127.0.0.1 "
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


def slurm_spec(**edits):
    import yaml

    from components.spec import parse_spec
    data = yaml.safe_load((Path(__file__).resolve().parents[3] / "stacks" / "dev.yaml").read_text())
    with_slurm_pool(data, hosts=3)
    for path, value in edits.items():
        node = data
        *parents, last = path.split(".")
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node[last] = value
    return parse_spec(yaml.safe_dump(data))


@pytest.fixture(scope="module")
def controller(tmp_path_factory) -> Iterator[tuple[object, dict, dict[str, str]]]:
    spec = slurm_spec()
    values = slurm.render_slurm_values(spec)
    work = tmp_path_factory.mktemp("slurm")
    (work / "state").mkdir()
    (work / "spool").mkdir()
    ports = {"slurmctld": free_port(), "slurmdbd": free_port(), "mariadb": free_port()}
    for name, text in values["configFiles"].items():
        (work / name).write_text(text)
    password = os.urandom(12).hex()
    (work / "slurm.conf").write_text(operator_slurm_conf(spec, values, work, ports))
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
        yield spec, env, {"work": str(work)}
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


def test_slurmctld_takes_the_generated_files_and_makes_one_partition_per_pool(controller):
    spec, env, _ = controller
    partition = fields(scontrol(env, "show", "partition", "-o", SLURM_POOL))
    assert partition["Nodes"] == "gpu-slurm-[01-03]" and partition["NodeSets"] == SLURM_POOL
    assert (partition["Default"], partition["State"], partition["MaxTime"]) == ("YES", "UP", "UNLIMITED")
    assert partition["TotalCPUs"] == str(3 * 112)
    config = scontrol(env, "show", "config")
    for line in ("SelectType              = select/cons_tres", "TopologyPlugin          = topology/tree",
                 "PriorityType            = priority/multifactor", "PriorityDecayHalfLife   = 7-00:00:00",
                 "MpiDefault              = pmix"):
        assert line in config, line


def test_each_node_has_its_pools_gpus_as_gres_and_its_features(controller):
    _, env, _ = controller
    for line in scontrol(env, "show", "node", "-o").splitlines():
        node = fields(line)
        assert node["Gres"] == "gpu:h100-sxm5-80gb:8"
        assert node["AvailableFeatures"] == f"{SLURM_POOL},h100-sxm5-80gb"
        assert (node["Sockets"], node["CoresPerSocket"], node["ThreadsPerCore"]) == ("2", "28", "2")


def test_the_switch_tree_is_the_cabling_plans(controller):
    _, env, _ = controller
    switches = {fields(line)["SwitchName"]: fields(line) for line in scontrol(env, "show", "topology").splitlines()}
    assert switches["leaf-dev-02"]["Nodes"] == "gpu-slurm-01,gpu-slurm-03" and switches["leaf-dev-02"]["Level"] == "0"
    assert switches["leaf-dev-01"]["Nodes"] == "gpu-slurm-02"
    assert switches["block-lab1"]["Switches"] == "leaf-dev-01,leaf-dev-02" and switches["block-lab1"]["Level"] == "1"


def test_the_controller_logs_no_error_about_the_generated_settings(controller):
    _, _, where = controller
    log = (Path(where["work"]) / "slurmctld.log").read_text()
    errors = [line for line in log.splitlines() if "error:" in line or "fatal:" in line]
    # A first start has no saved state; the operator's MaxNodeCount=1024 leaves slots for nodes not registered
    # yet, under no switch.
    expected = ("state file", "Trying backup state save file", "MailProg", f"switches lack access to {1024 - 3} nodes")
    assert [e for e in errors if not any(x in e for x in expected)] == []


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare to give slurmd GPU device files in a mount namespace")
def test_slurmd_reads_gres_conf_as_gpus_with_their_numa_cores(controller, tmp_path):
    """slurmd -G: the GRES a node would register from gres.conf. The GPUs' device files are made in a private
    /dev (slurmd stats them); cgroup.conf is swapped for cgroup/v1, as this test host mounts cgroups hybrid, which
    slurmd's cgroup/v2 (the generated one, for Slinky's pods) refuses."""
    _, env, where = controller
    conf = tmp_path / "etc"
    shutil.copytree(where["work"], conf, ignore=shutil.ignore_patterns("*.sock*", "state", "spool", "*.pid"))
    (conf / "spool").mkdir()
    (conf / "slurm.conf").write_text((conf / "slurm.conf").read_text().replace(where["work"], str(conf)))
    (conf / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
    devices = "; ".join(f"mknod /dev/nvidia{i} c 195 {i}" for i in range(8))
    out = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"mount -t tmpfs none /dev && mknod /dev/null c 1 3 && chmod 666 /dev/null && "
                                      f"{devices} && slurmd -G -N gpu-slurm-01"],
        env={**env, "SLURM_CONF": str(conf / "slurm.conf")}, capture_output=True, text=True, timeout=60)
    gres = [fields(line.split("slurmd: ", 1)[-1]) for line in out.stderr.splitlines() if "Gres Name=gpu" in line]
    assert [(g["Type"], g["Count"], g["File"], g["Cores"]) for g in gres] == [
        ("h100-sxm5-80gb", "4", "/dev/nvidia[0-3]", "0-27"), ("h100-sxm5-80gb", "4", "/dev/nvidia[4-7]", "28-55")], \
        out.stderr


def test_tenants_become_accounts_with_their_share_limit_and_the_qos_of_the_priority_classes(controller):
    spec, env, where = controller
    out = apply_accounts(spec, env, Path(where["work"]))
    assert "added QOS production" in out and "added QOS experiment" in out
    qos = {q["name"]: q for q in sacctmgr(env, "qos", "format=Name,Priority,Preempt,PreemptMode")}
    assert {n: (q["priority"], q["preempt"]) for n, q in qos.items()} == {
        "normal": ("0", ""), "experiment": ("1", "normal"), "production": ("2", "experiment,normal")}
    assoc = {a["account"]: a for a in sacctmgr(env, "assoc", "where", "user=",
                                               "format=Account,Share,GrpTRES,QOS")}
    assert (assoc["team-a"]["share"], assoc["team-a"]["grptres"]) == ("4", "gres/gpu=8")
    assert (assoc["team-b"]["share"], assoc["team-b"]["grptres"]) == ("2", "")
    assert assoc["team-a"]["qos"] == "experiment,normal,production"
    shares = subprocess.run(["sshare", "-n", "-P", "-o", "Account,RawShares,NormShares"], env=env,
                            capture_output=True, text=True, check=True).stdout
    rows = {line.split("|")[0].strip(): line.split("|") for line in shares.splitlines()}
    assert rows["team-a"][1] == "4" and rows["team-b"][1] == "2"
    assert float(rows["team-a"][2]) == pytest.approx(2 * float(rows["team-b"][2]), rel=1e-4)
    weights = subprocess.run(["sprio", "-w"], env=env, capture_output=True, text=True, check=True).stdout
    assert "100000" in weights and "10000" in weights          # fair share and QOS weigh in


def test_a_second_apply_changes_nothing_and_a_changed_quota_changes_the_account(controller, tmp_path):
    spec, env, where = controller
    apply_accounts(spec, env, Path(where["work"]))
    again = apply_accounts(spec, env, Path(where["work"]))
    assert "slurm-accounts: 0 change(s)" in again and "Nothing new added" in again
    # day 2: team-a borrows without limit and gets more guaranteed; the production class goes away
    changed = slurm_spec(**{"tenants.0.gpu_quota.h100-slurm": {"nominal": 6}})
    out = apply_accounts(changed, env, tmp_path)
    assert "Changed fairshare" in out and "4 -> 6" in out
    assoc = {a["account"]: a for a in sacctmgr(env, "assoc", "where", "user=", "format=Account,Share,GrpTRES")}
    assert (assoc["team-a"]["share"], assoc["team-a"]["grptres"]) == ("6", "")
    lower = slurm_spec(**{"kubernetes.kueue.priority_classes": [{"name": "experiment", "value": 100}]})
    apply_accounts(lower, env, tmp_path)
    qos = {q["name"]: q["preempt"] for q in sacctmgr(env, "qos", "format=Name,Preempt")}
    assert qos["experiment"] == "normal" and qos["production"] == "experiment,normal"   # kept, never deleted
