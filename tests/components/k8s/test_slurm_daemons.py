"""The Slurm files the component generates, read by real Slurm daemons (Debian's slurm-wlm, which .ci/run installs),
and its QOS and accounts applied by sacctmgr through a real slurmdbd on a real MariaDB.

Debian 12 ships Slurm 22.05; Slinky 1.1.0 runs 25.11. slurm.conf is assembled here as the operator assembles it
(controllerbuilder.buildSlurmConf in slurm-operator v1.1.0: its general lines, `NodeSet=<pool> Feature=<pool>`,
`PartitionName=<pool> Nodes=<pool> <partition config>`, then the chart's extraConf), with 22.05's forms of the
operator's own lines (munge for auth/slurm, local ports and directories); slurmdbd.conf likewise
(accountingbuilder.buildSlurmdbdConf: the chart's storageConfig, the database reached at 127.0.0.1 here). Its
NodeSet pods register as dynamic nodes (`slurmd -Z --conf 'Features=<pool>,... Gres=...'`); 22.05's tree
topology does not take dynamic nodes, so each is declared here as the node it registers as. What the component
generates (extraConf, the partition config, gres.conf, cgroup.conf, topology.conf, each NodeSet's --conf, the
accounts and the node check) goes in unchanged. tests/slurm_site.py starts the daemons; jobs run on a slurmd for
one node, with cgroup.conf's constraints through cgroup v1 where this host mounts cgroups hybrid.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

from components.k8s import slurm_health
from tests.components.k8s.slurm_specs import SLURM_POOL
from tests.doubles import nvidia_smi
from tests.slurm_site import (MISSING, WHY_MISSING, apply_accounts, drained, fields, host_cgroup_conf, in_private_dev,
                               sacctmgr, scontrol, slurm_site, slurm_spec, slurmd)

pytestmark = pytest.mark.skipif(MISSING is not None, reason=WHY_MISSING)


@pytest.fixture(scope="module")
def controller(tmp_path_factory) -> Iterator[tuple[object, dict, dict[str, str]]]:
    spec, work = slurm_spec(), tmp_path_factory.mktemp("slurm")
    with slurm_site(spec, work) as env:
        yield spec, env, {"work": str(work)}


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


needs_root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                reason="needs root and unshare to give slurmd GPU device files in a mount namespace")


@needs_root
def test_slurmd_reads_gres_conf_as_gpus_with_their_numa_cores(controller, tmp_path):
    """slurmd -G: the GRES a node would register from gres.conf, each GPU's device file stat-ed."""
    _, env, where = controller
    conf = tmp_path / "etc"
    shutil.copytree(where["work"], conf, ignore=shutil.ignore_patterns("*.sock*", "state", "spool", "*.pid"))
    (conf / "spool").mkdir()
    (conf / "slurm.conf").write_text((conf / "slurm.conf").read_text().replace(where["work"], str(conf)))
    (conf / "cgroup.conf").write_text(host_cgroup_conf((conf / "cgroup.conf").read_text()))
    out = subprocess.run(in_private_dev(8, "slurmd -G -N gpu-slurm-01"),
                         env={**env, "SLURM_CONF": str(conf / "slurm.conf")}, capture_output=True, text=True,
                         timeout=60)
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


# --- jobs through the real controller, on a slurmd for one node of the pool -------------------------------------

JOB = """#!/bin/bash
echo "partition=$SLURM_JOB_PARTITION node=$SLURMD_NODENAME gpus=$CUDA_VISIBLE_DEVICES"
for gpu in 0 1 2 7; do head -c0 /dev/nvidia$gpu 2>&1 | sed 's/.*: //'; done
srun bash -c 'echo "rank $PMIX_RANK"' | sort
"""


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> Iterator[tuple[dict, Path]]:
    """A site of its own whose first Slurm node runs a slurmd (GPU device files, no driver), with the tenants'
    accounts applied and this test's user in team-a and team-b, as a site adds its users."""
    spec, work = slurm_spec(), tmp_path_factory.mktemp("slurm-node")
    with slurm_site(spec, work) as env:
        apply_accounts(spec, env, work)
        subprocess.run(["sacctmgr", "-i", "add", "user", "root", "account=team-a,team-b"], env=env, check=True,
                       capture_output=True)
        with slurmd(env, work, "gpu-slurm-01", gpus=8):
            yield env, work


def sbatch(env: dict, work: Path, *args: str) -> str:
    out = subprocess.run(["sbatch", "--parsable", "-o", f"{work}/job-%j.out", *args], env=env, capture_output=True,
                         text=True, check=True)
    return out.stdout.strip()


def job(env: dict, job_id: str) -> dict[str, str]:
    return fields(scontrol(env, "show", "job", "-o", job_id))


def until_state(env: dict, job_id: str, *states: str, timeout_s: float = 60) -> dict[str, str]:
    deadline = time.monotonic() + timeout_s
    while (now := job(env, job_id))["JobState"] not in states:
        assert time.monotonic() < deadline, f"job {job_id} not {'/'.join(states)} in {timeout_s:g} s: {now}"
        time.sleep(0.5)
    return now


@needs_root
def test_a_job_runs_on_its_partition_with_the_gpus_it_asked_for_confined_to_them_and_pmix_ranks(node):
    """sbatch through the real controller: the default partition, the tenant's account and QOS, two of the
    node's GPUs (gres.conf's files, CUDA_VISIBLE_DEVICES, the device cgroup denying the others), and srun
    starting the ranks through mpi/pmix (MpiDefault=pmix)."""
    env, work = node
    (work / "job.sh").write_text(JOB)
    job_id = sbatch(env, work, "-A", "team-a", "--qos=production", "--gres=gpu:h100-sxm5-80gb:2", "-n", "2",
                    str(work / "job.sh"))
    done = until_state(env, job_id, "COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL")
    out = (work / f"job-{job_id}.out").read_text()
    assert done["JobState"] == "COMPLETED", out
    assert (done["Partition"], done["Account"], done["QOS"]) == (SLURM_POOL, "team-a", "production")
    assert out.splitlines() == [
        f"partition={SLURM_POOL} node=gpu-slurm-01 gpus=0,1",
        "No such device or address", "No such device or address",    # its GPUs: allowed, no driver behind them
        "Operation not permitted", "Operation not permitted",        # the others: the device cgroup refuses
        "rank 0", "rank 1"]


@needs_root
def test_a_higher_priority_class_preempts_a_lower_ones_job_which_is_requeued(node):
    env, work = node
    low = sbatch(env, work, "-A", "team-b", "--qos=experiment", "--gres=gpu:h100-sxm5-80gb:8", "--wrap",
                 "sleep 300")
    until_state(env, low, "RUNNING")
    high = sbatch(env, work, "-A", "team-a", "--qos=production", "--gres=gpu:h100-sxm5-80gb:8", "--wrap", "true")
    assert until_state(env, high, "COMPLETED")["NodeList"] == "gpu-slurm-01"
    requeued = job(env, low)
    assert requeued["Restarts"] == "1" and requeued["JobState"] in ("PENDING", "RUNNING"), requeued
    subprocess.run(["scancel", low], env=env, check=True)


# --- the node check: Slurm's prolog and epilog drain a node that fails it ------------------------------------------

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
QUERY = (SAMPLES / "nvidia_smi_q_h800.txt").read_text()          # real `nvidia-smi -q` of an H800 host, one GPU shown
LINKS = (SAMPLES / "nvidia_smi_nvlink_s_8xh100.txt").read_text()
# The volatile ECC block as nvidia-smi -q prints it on an A100 (NVIDIA's XID 63 guide quotes it), with one
# uncorrectable DRAM error; inserted before the sample's Remapped Rows section.
ECC = ("    ECC Errors\n        Volatile\n            SRAM Correctable              : 0\n"
       "            SRAM Uncorrectable            : 0\n            DRAM Correctable              : 177\n"
       "            DRAM Uncorrectable            : 1\n        Aggregate\n"
       "            SRAM Correctable              : 0\n            SRAM Uncorrectable            : 0\n"
       "            DRAM Correctable              : 177\n            DRAM Uncorrectable            : 3\n")


def node_check(controller, tmp_path, when: str, node: str, query: str = QUERY, links: str = LINKS,
               smi_code: int = 0, dcgmi: str | None = None) -> subprocess.CompletedProcess:
    """The rendered check, run as slurmd runs it (SLURMD_NODENAME set), with nvidia-smi (and dcgmi) doubles
    printing real output, against the real slurmctld."""
    spec, env, _ = controller
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    nvidia_smi(bin_dir, query, links, code=smi_code)
    if dcgmi is not None:
        (bin_dir / "diag.txt").write_text(dcgmi)
        (bin_dir / "dcgmi").write_text(f"#!/bin/bash\ncat {bin_dir}/diag.txt\n")
        (bin_dir / "dcgmi").chmod(0o755)
    check = tmp_path / f"{when}.sh"
    check.write_text(slurm_health.render_node_check(spec, when))
    path = f"{bin_dir}:{os.environ['PATH']}"
    return subprocess.run(["bash", str(check)], env={**env, "PATH": path, "SLURMD_NODENAME": node},
                          capture_output=True, text=True, timeout=60)


def test_a_healthy_node_passes_and_stays_in_service(controller, tmp_path):
    out = node_check(controller, tmp_path, "epilog", "gpu-slurm-01")
    assert out.returncode == 0, out.stderr
    assert drained(controller[1], "gpu-slurm-01") is None


@pytest.mark.parametrize("fault, expected", [
    ({"query": QUERY.replace("Pending                           : No", "Pending                           : Yes")},
     "gpucluster: GPU 00000000:18:00.0: row remapping pending"),
    ({"query": QUERY.replace("    Remapped Rows\n", ECC + "    Remapped Rows\n")},
     "gpucluster: GPU 00000000:18:00.0: 1 DRAM Uncorrectable errors"),
    ({"query": re.sub(r"(Attached GPUs +: )8", r"\g<1>7", QUERY)}, "gpucluster: 7 of 8 GPUs visible"),
    ({"links": (SAMPLES / "nvidia_smi_nvlink_s_degraded.txt").read_text()},
     "gpucluster: NVLink: GPU 5 link 10: inactive, GPU 5 link 2: 1.562 of 26.562 GB/s"),
    ({"query": "Unable to determine the device handle for GPU0000:18:00.0: Unknown Error\n", "smi_code": 15},
     "gpucluster: nvidia-smi -q failed: Unable to determine the device handle for GPU0000:18:00.0: Unknown Error"),
    ({"dcgmi": (SAMPLES / "dcgmi_diag_r2_fail.txt").read_text()}, "gpucluster: dcgmi diag -r 1: GPU Memory: Fail"),
])
def test_a_failing_check_drains_the_node_with_the_reason(controller, tmp_path, fault, expected):
    out = node_check(controller, tmp_path, "epilog", "gpu-slurm-02", **fault)
    assert out.returncode == 0, out.stderr                # an epilog's failure is the drain, not its status
    reason = drained(controller[1], "gpu-slurm-02")
    assert reason is not None and reason.startswith(expected), (reason, out.stderr)


def test_a_failing_prolog_also_fails_so_slurm_requeues_the_job(controller, tmp_path):
    out = node_check(controller, tmp_path, "prolog", "gpu-slurm-03", query=QUERY.replace(
        "Remapping Failure Occurred        : No", "Remapping Failure Occurred        : Yes"))
    assert out.returncode == 1 and "gpu-slurm-03 drained" in out.stderr
    assert drained(controller[1], "gpu-slurm-03") == "gpucluster: GPU 00000000:18:00.0: row remapping failed"
