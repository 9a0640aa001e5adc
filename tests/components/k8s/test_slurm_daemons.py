"""The Slurm files the component generates, read by real Slurm daemons (Debian's slurm-wlm, which .ci/run installs).

Debian 12 ships Slurm 22.05; Slinky 1.1.0 runs 25.11. slurm.conf is assembled here as the operator assembles it
(controllerbuilder.buildSlurmConf in slurm-operator v1.1.0: its general lines, `NodeSet=<pool> Feature=<pool>`,
`PartitionName=<pool> Nodes=<pool> <partition config>`, then the chart's extraConf), with 22.05's forms of the
operator's own lines (munge for auth/slurm, a local port and state directory). Its NodeSet pods register as
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

pytestmark = pytest.mark.skipif(shutil.which("slurmctld") is None or shutil.which("munged") is None,
                                reason="slurmctld or munged is not installed (.ci/run installs slurmctld, slurmd, "
                                       "slurm-client, munge and libpmix-dev, whose libpmix.so the mpi/pmix plugin loads)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def operator_slurm_conf(spec, values: dict, work: Path) -> str:
    base = [f"ClusterName={values['clusterName']}", "SlurmUser=root", "SlurmctldHost=localhost",
            f"SlurmctldPort={free_port()}", f"StateSaveLocation={work}/state", f"SlurmdSpoolDir={work}/spool",
            f"SlurmctldPidFile={work}/slurmctld.pid", f"SlurmctldLogFile={work}/slurmctld.log",
            f"SlurmdLogFile={work}/slurmd.log", "ReturnToService=2", "MaxNodeCount=1024", "GresTypes=gpu",
            "AuthType=auth/munge", f"AuthInfo=socket={work}/munge.sock", "SelectTypeParameters=CR_Core_Memory",
            "ProctrackType=proctrack/cgroup", "PrologFlags=Contain", "TaskPlugin=task/affinity,task/cgroup",
            "AccountingStorageType=accounting_storage/none", "JobAcctGatherType=jobacct_gather/none"]
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


@pytest.fixture(scope="module")
def controller(tmp_path_factory) -> Iterator[tuple[object, dict, dict[str, str]]]:
    import yaml

    from components.spec import parse_spec
    data = yaml.safe_load((Path(__file__).resolve().parents[3] / "stacks" / "dev.yaml").read_text())
    with_slurm_pool(data, hosts=3)
    spec = parse_spec(yaml.safe_dump(data))
    values = slurm.render_slurm_values(spec)
    work = tmp_path_factory.mktemp("slurm")
    (work / "state").mkdir()
    (work / "spool").mkdir()
    for name, text in values["configFiles"].items():
        (work / name).write_text(text)
    (work / "slurm.conf").write_text(operator_slurm_conf(spec, values, work))
    (work / "munge.key").write_bytes(os.urandom(1024))
    (work / "munge.key").chmod(0o600)
    env = {**os.environ, "SLURM_CONF": str(work / "slurm.conf")}
    subprocess.run(["munged", "--socket", f"{work}/munge.sock", "--key-file", f"{work}/munge.key", "--pid-file",
                    f"{work}/munged.pid", "--log-file", f"{work}/munged.log", "--seed-file", f"{work}/seed",
                    "--force"], check=True, timeout=30)
    ctld = subprocess.Popen(["slurmctld", "-D", "-f", str(work / "slurm.conf")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while subprocess.run(["scontrol", "ping"], env=env, capture_output=True).returncode != 0:
            assert ctld.poll() is None, f"slurmctld exited: {ctld.stdout.read()}"
            assert time.monotonic() < deadline, "slurmctld did not answer scontrol ping in 60 s"
            time.sleep(0.5)
        yield spec, env, {"work": str(work)}
    finally:
        ctld.terminate()
        ctld.wait(timeout=30)
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
    # A first start has no saved state; fair share's weights wait for accounting (slurmdbd), not generated yet;
    # the operator's MaxNodeCount=1024 leaves slots for nodes not registered yet, under no switch.
    expected = ("state file", "Trying backup state save file", "MailProg", "can only be used with SlurmDBD",
                f"switches lack access to {1024 - 3} nodes")
    assert [e for e in errors if not any(x in e for x in expected)] == []
    assert sum("can only be used with SlurmDBD" in e for e in errors) == 2       # PriorityWeightAge, Fairshare


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
