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

from components.fabric.fabric import render_checks
from components.k8s.slurm import cluster as slurm, node_check as slurm_health
from components.k8s.tenancy.jobs import render_example_batch_jobs, render_example_jobs
from tests.components.k8s.slurm_specs import H200_POOL, SLURM_POOL, with_h200_pool
from tests.doubles import DOUBLE_BIT_XID, dmesg, nvidia_smi
from tests.slurm_site import (MISSING, WHY_MISSING, apply_accounts, drained, fields, free_port, host_cgroup_conf,
                               in_private_dev, sacctmgr, scontrol, slurm_site, slurm_spec, slurmd)

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
    assert (partition["Default"], partition["State"], partition["MaxTime"]) == ("YES", "UP", "12:00:00")
    assert partition["TotalCPUs"] == str(3 * 112)
    config = scontrol(env, "show", "config")
    for line in ("SelectType              = select/cons_tres", "TopologyPlugin          = topology/tree",
                 "PriorityType            = priority/multifactor", "PriorityDecayHalfLife   = 7-00:00:00",
                 "MpiDefault              = pmix", "SchedulerParameters     = nohold_on_prolog_fail",
                 f"PrologEpilogTimeout     = {slurm_health.PROLOG_EPILOG_TIMEOUT_S}"):
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
    # yet, under no switch; extraConf's AccountingStorageTRES follows the operator's own (the test below shows
    # the latest one is used). slurmctld times gettimeofday() at start and says so when the machine is busy
    # (the test suite's other workers): a fact about this machine's load, not about the settings.
    expected = ("state file", "Trying backup state save file", "MailProg", f"switches lack access to {1024 - 3} nodes",
                "AccountingStorageTRES 1 specified more than once, latest value used",
                "High latency for 1000 calls to gettimeofday()")
    assert [e for e in errors if not any(x in e for x in expected)] == []


def test_gpus_are_tracked_per_model_and_jobs_pass_the_job_submit_script(controller):
    """extraConf's AccountingStorageTRES (after the operator's gres/gpu) is the one used: slurmctld registers a
    TRES per GPU model with slurmdbd; job_submit.lua is loaded (a script that does not load refuses every job)."""
    _, env, where = controller
    config = scontrol(env, "show", "config")
    assert re.search(r"^AccountingStorageTRES\s*= .*gres/gpu,gres/gpu:h100-sxm5-80gb$", config, re.M), config
    assert re.search(r"^JobSubmitPlugins\s*= lua$", config, re.M)
    tres = {t["name"] for t in sacctmgr(env, "tres", "type=gres", "format=Name")}
    assert tres == {"gpu", "gpu:h100-sxm5-80gb"}
    log = (Path(where["work"]) / "slurmctld.log").read_text()
    assert "job_submit" not in log or "error" not in log.split("job_submit", 1)[1].split("\n", 1)[0], log


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
    assert (assoc["team-a"]["share"], assoc["team-a"]["grptres"]) == ("4", "gres/gpu:h100-sxm5-80gb=8")
    assert (assoc["team-b"]["share"], assoc["team-b"]["grptres"]) == ("2", "")
    assert assoc["team-a"]["qos"] == "experiment,normal,production"
    shares = subprocess.run(["sshare", "-n", "-P", "-o", "Account,RawShares,NormShares"], env=env,
                            capture_output=True, text=True, check=True).stdout
    rows = {line.split("|")[0].strip(): line.split("|") for line in shares.splitlines()}
    assert rows["team-a"][1] == "4" and rows["team-b"][1] == "2"
    assert float(rows["team-a"][2]) == pytest.approx(2 * float(rows["team-b"][2]), rel=1e-4)
    weights = subprocess.run(["sprio", "-w"], env=env, capture_output=True, text=True, check=True).stdout
    assert "100000" in weights and "10000" in weights          # fair share and QOS weigh in


def test_day_two_a_pool_of_a_new_model_waits_for_slurmctld_to_track_it(controller, tmp_path):
    """A spec with an H200 pool, applied before slurmctld runs on the slurm.conf that tracks its model: the
    accounts script waits, then fails naming what is missing, having changed nothing (the Job retries)."""
    _, env, _ = controller
    spec = slurm_spec(with_h200_pool)
    (tmp_path / "accounts.cfg").write_text(slurm.render_accounts_file(spec))
    (tmp_path / "accounts.sh").write_text(slurm.render_accounts_script(spec, str(tmp_path / "accounts.cfg"), tries=1))
    out = subprocess.run(["bash", str(tmp_path / "accounts.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "slurmdbd does not know the GPU TRES (gres/gpu and gres/gpu:<model>)" in out.stderr, out.stderr
    assert "team-c" not in {a["account"] for a in sacctmgr(env, "assoc", "format=Account")}


def test_a_second_apply_changes_nothing_and_a_changed_quota_changes_the_account(controller, tmp_path):
    spec, env, where = controller
    apply_accounts(spec, env, Path(where["work"]))
    again = apply_accounts(spec, env, Path(where["work"]))
    assert "slurm-accounts: 0 change(s)" in again and "Nothing new added" in again
    # the limit an earlier release set over all GPUs (gres/gpu=N), and one a site set by hand on CPUs: the GPU
    # one gives way to the spec's, the CPU one stays
    subprocess.run(["sacctmgr", "-i", "modify", "account", "team-a", "set", "GrpTRES=gres/gpu=8,cpu=500"], env=env,
                   check=True, capture_output=True)
    out = apply_accounts(spec, env, Path(where["work"]))
    assert "GPU limits of account team-a: gres/gpu:h100-sxm5-80gb=8,gres/gpu=8 -> gres/gpu:h100-sxm5-80gb=8" in out
    assoc = {a["account"]: a for a in sacctmgr(env, "assoc", "where", "user=", "format=Account,GrpTRES")}
    assert assoc["team-a"]["grptres"] == "cpu=500,gres/gpu:h100-sxm5-80gb=8"
    subprocess.run(["sacctmgr", "-i", "modify", "account", "team-a", "set", "GrpTRES=cpu=-1"], env=env, check=True,
                   capture_output=True)
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


SAMPLES = Path(__file__).resolve().parents[3] / "samples"
QUERY = (SAMPLES / "nvidia_smi_q_h800.txt").read_text()          # real `nvidia-smi -q` of an H800 host, one GPU shown
LINKS = (SAMPLES / "nvidia_smi_nvlink_s_8xh100.txt").read_text()
XIDS = (SAMPLES / "xid_kernel_log.txt").read_text().splitlines()       # the driver's real lines
JOB_XIDS = "".join(f"{line}\n" for line in XIDS if re.search(r"\): (13|31|94),", line))   # jobs' faults only
FELL_OFF = next(line for line in XIDS if "): 79, pid='<unknown>'" in line)
# The volatile ECC block as nvidia-smi -q prints it on an A100 (NVIDIA's XID 63 guide quotes it), with one
# uncorrectable DRAM error; inserted before the sample's Remapped Rows section.
ECC = ("    ECC Errors\n        Volatile\n            SRAM Correctable              : 0\n"
       "            SRAM Uncorrectable            : 0\n            DRAM Correctable              : 177\n"
       "            DRAM Uncorrectable            : 1\n        Aggregate\n"
       "            SRAM Correctable              : 0\n            SRAM Uncorrectable            : 0\n"
       "            DRAM Correctable              : 177\n            DRAM Uncorrectable            : 3\n")


# --- jobs through the real controller, on a slurmd for one node of the pool -------------------------------------

JOB = """#!/bin/bash
echo "partition=$SLURM_JOB_PARTITION node=$SLURMD_NODENAME gpus=$CUDA_VISIBLE_DEVICES"
for gpu in 0 1 2 7; do head -c0 /dev/nvidia$gpu 2>&1 | sed 's/.*: //'; done
srun bash -c 'echo "rank $PMIX_RANK"' | sort
"""


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> Iterator[tuple[dict, Path]]:
    """A site of its own whose first Slurm node runs a slurmd (GPU device files, no driver), with the tenants'
    accounts applied and this test's user in team-a and team-b, as a site adds its users. Its spec adds an H200
    pool (no slurmd runs there) and limits team-b to 6 of the H100 pool's GPUs. The node check runs as its prolog
    and epilog, with an nvidia-smi that reports a healthy host (work/tools, which the node-check tests change)."""
    spec = slurm_spec(with_h200_pool, **{f"tenants.1.gpu_quota.{SLURM_POOL}": {"nominal": 2, "borrowing_limit": 4}})
    work = tmp_path_factory.mktemp("slurm-node")
    tools = work / "tools"
    tools.mkdir()
    nvidia_smi(tools, QUERY, LINKS, calls=work / "nvidia-smi-calls.txt")
    dmesg(tools, JOB_XIDS)
    with slurm_site(spec, work) as env:
        apply_accounts(spec, env, work)
        subprocess.run(["sacctmgr", "-i", "add", "user", "root", "account=team-a,team-b,team-c"], env=env, check=True,
                       capture_output=True)
        with slurmd(env, work, "gpu-slurm-01", gpus=8, tools=tools):
            yield env, work


def sbatch(env: dict, work: Path, *args: str) -> str:
    out = subprocess.run(["sbatch", "--parsable", "-o", f"{work}/job-%j.out", *args], env=env, capture_output=True,
                         text=True, check=True)
    return out.stdout.strip()


def job(env: dict, job_id: str) -> dict[str, str]:
    return fields(scontrol(env, "show", "job", "-o", job_id))


def until(env: dict, job_id: str, holds, what: str, timeout_s: float) -> dict[str, str]:
    """The job once `holds` holds of it (polled)."""
    deadline = time.monotonic() + timeout_s
    while not holds(now := job(env, job_id)):
        assert time.monotonic() < deadline, f"job {job_id} not {what} in {timeout_s:g} s: {now}"
        time.sleep(0.5)
    return now


def until_state(env: dict, job_id: str, *states: str, timeout_s: float = 60) -> dict[str, str]:
    return until(env, job_id, lambda j: j["JobState"] in states, "/".join(states), timeout_s)


def until_reason(env: dict, job_id: str, reason: str, timeout_s: float = 30) -> dict[str, str]:
    """The pending job once the scheduler gives `reason` (a job cancelled before may hold the node a moment)."""
    return until(env, job_id, lambda j: (j["JobState"], j["Reason"]) == ("PENDING", reason),
                 f"pending for {reason}", timeout_s)


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
    low = sbatch(env, work, "-A", "team-b", "--qos=experiment", "--gres=gpu:h100-sxm5-80gb:6", "--wrap",
                 "sleep 300")
    until_state(env, low, "RUNNING")
    high = sbatch(env, work, "-A", "team-a", "--qos=production", "--gres=gpu:h100-sxm5-80gb:8", "--wrap", "true")
    assert until_state(env, high, "COMPLETED")["NodeList"] == "gpu-slurm-01"
    requeued = job(env, low)
    assert requeued["Restarts"] == "1" and requeued["JobState"] in ("PENDING", "RUNNING"), requeued
    subprocess.run(["scancel", low], env=env, check=True)


@needs_root
def test_gpus_asked_without_a_model_get_the_pools_and_count_against_the_accounts_limit_there(node):
    """job_submit.lua gives --gres=gpu:N and --gpus=N the partition's GPU model, so team-b's limit on the pool
    (GrpTRES=gres/gpu:h100-sxm5-80gb=6) holds a second job back while the node still has idle GPUs."""
    env, work = node
    first = sbatch(env, work, "-A", "team-b", "--gres=gpu:4", "--wrap", "sleep 300")
    second = sbatch(env, work, "-A", "team-b", "--gpus=4", "--wrap", "true")
    try:
        running = until_state(env, first, "RUNNING")
        assert re.search(r"gres[:/]gpu:h100-sxm5-80gb:4$", running["TresPerNode"]), running
        assert "gres/gpu:h100-sxm5-80gb=4" in running["TRES"], running
        waiting = job(env, second)
        assert re.search(r"gres[:/]gpu:h100-sxm5-80gb:4$", waiting["TresPerJob"]), waiting
        waiting = until_reason(env, second, "AssocGrpGRES")
        held = fields(scontrol(env, "show", "node", "-o", "gpu-slurm-01"))
        assert "gres/gpu=8" in held["CfgTRES"] and "gres/gpu=4" in held["AllocTRES"], held   # 4 GPUs idle
    finally:
        subprocess.run(["scancel", first, second], env=env, check=True)


@needs_root
def test_a_tenant_without_quota_on_a_pool_runs_no_gpu_job_there(node):
    """team-c has GPUs on the H200 pool only: its account's limit on the H100 pool's model is 0, as Kueue would
    give it no flavor there, so its job waits on the limit while the node is idle."""
    env, work = node
    job_id = sbatch(env, work, "-A", "team-c", "--gpus=1", "--wrap", "true")
    try:
        waiting = until_reason(env, job_id, "AssocGrpGRES")
        assert re.search(r"gres[:/]gpu:h100-sxm5-80gb:1$", waiting["TresPerJob"]), waiting
    finally:
        subprocess.run(["scancel", job_id], env=env, check=True)


@needs_root
def test_gpus_without_a_model_over_partitions_of_two_models_are_refused_saying_how_to_ask(node):
    env, work = node
    out = subprocess.run(["sbatch", "-A", "team-b", "-p", f"{SLURM_POOL},{H200_POOL}", "--gpus=2", "--wrap", "true"],
                         env=env, capture_output=True, text=True)
    assert out.returncode != 0
    assert (f"gpucluster: partitions {SLURM_POOL},{H200_POOL} hold different GPU models; ask for GPUs of one model "
            "(--gpus=<model>:<count>, --gres=gpu:<model>:<count>) or submit to one partition") in out.stderr
    # naming the model is the way: the request is kept as it is
    job_id = sbatch(env, work, "-A", "team-b", "-p", f"{SLURM_POOL},{H200_POOL}", "--gres=gpu:h200-sxm5-141gb:2",
                    "--hold", "--wrap", "true")
    assert re.search(r"gres[:/]gpu:h200-sxm5-141gb:2$", job(env, job_id)["TresPerNode"])
    # day 2 of a pending job (job_submit.lua's slurm_job_modify): GPUs without a model get the model of the
    # partitions it is in; over two models they are refused (the reason in slurmctld's log: job_modify cannot
    # message the user)
    out = subprocess.run(["scontrol", "update", f"jobid={job_id}", "gres=gpu:3"], env=env, capture_output=True,
                         text=True)
    assert out.returncode != 0 and re.search(r"gres[:/]gpu:h200-sxm5-141gb:2$", job(env, job_id)["TresPerNode"])
    assert f"lua: job {job_id}: gpucluster: partitions {SLURM_POOL},{H200_POOL} hold different GPU models" in \
        (work / "slurmctld.log").read_text()
    scontrol(env, "update", f"jobid={job_id}", f"partition={H200_POOL}")
    scontrol(env, "update", f"jobid={job_id}", "gres=gpu:3")
    assert re.search(r"gres[:/]gpu:h200-sxm5-141gb:3$", job(env, job_id)["TresPerNode"]), job(env, job_id)
    subprocess.run(["scancel", job_id], env=env, check=True)


# --- what tenants and the operator submit to a Slurm pool: the batch scripts of the plan -------------------------

@needs_root
def test_the_tenants_batch_templates_are_jobs_the_controller_would_start(node):
    """Each tenant's template for the H100 pool, as the plan writes it, under its own account (sbatch
    --test-only: the real controller checks the account, partition, GPUs, CPUs and memory per GPU against the
    node a slurmd registered; one node runs here, so --nodes=1 on the command line overrides the script's)."""
    env, work = node
    spec = slurm_spec(with_h200_pool, **{f"tenants.1.gpu_quota.{SLURM_POOL}": {"nominal": 2, "borrowing_limit": 4}})
    templates = render_example_batch_jobs(spec)
    assert set(templates) == {f"team-a-{SLURM_POOL}", f"team-b-{SLURM_POOL}", f"team-b-{H200_POOL}",
                              f"team-c-{H200_POOL}"}
    assert not any(SLURM_POOL in name or H200_POOL in name for name in render_example_jobs(spec))
    for name in (f"team-a-{SLURM_POOL}", f"team-b-{SLURM_POOL}"):
        (work / f"{name}.sbatch").write_text(templates[name])
        out = subprocess.run(["sbatch", "--test-only", "--nodes=1", str(work / f"{name}.sbatch")], env=env,
                             capture_output=True, text=True, cwd=work)
        assert out.returncode == 0 and "to start at" in out.stderr and "gpu-slurm-01" in out.stderr, \
            (name, out.stderr)
    # a tenant's job under another tenant's account is the controller's to refuse
    out = subprocess.run(["sbatch", "--test-only", "--nodes=1", "-A", "team-x", str(work / f"team-a-{SLURM_POOL}.sbatch")],
                         env=env, capture_output=True, text=True, cwd=work)
    assert out.returncode != 0


@needs_root
@pytest.mark.parametrize("sample, state", [("all_reduce_perf_8xh100.txt", "COMPLETED"), (None, "FAILED")])
def test_the_nccl_check_of_a_slurm_pool_runs_its_ranks_on_the_pools_gpus_and_judges_the_bandwidth(
        node, sample, state):
    """The plan's check as a batch job on the real slurmd (one node here: --nodes on the command line overrides
    the script's), all_reduce_perf a double printing a real run's table; without a result it fails."""
    env, work = node
    spec = slurm_spec(with_h200_pool, **{f"tenants.1.gpu_quota.{SLURM_POOL}": {"nominal": 2, "borrowing_limit": 4}})
    check = work / "nccl-check.sbatch"
    check.write_text(render_checks(spec)[f"nccl-{SLURM_POOL}.sbatch"])
    assert f"nccl-{SLURM_POOL}.yaml" not in render_checks(spec)
    double = work / "all_reduce_perf"
    table = (SAMPLES / sample).read_text() if sample else "# nccl-tests: no result\n"
    (work / "table.txt").write_text(table)
    double.write_text(f"#!/bin/bash\n[[ -n $NCCL_IB_HCA && -n $PMIX_RANK ]] || exit 3\ncat {work}/table.txt\n")
    double.chmod(0o755)
    job_id = sbatch(env, work, "-A", "team-a", "--nodes=1", f"--export=ALL,NCCL_TESTS_BIN={double}", str(check))
    done = until_state(env, job_id, "COMPLETED", "FAILED", timeout_s=120)
    assert done["JobState"] == state, (work / f"job-{job_id}.out").read_text()
    if sample:
        assert "bus bandwidth at 8 GiB 473.39 GB/s" in (work / f"job-{job_id}.out").read_text()


# --- the node check: Slurm's prolog and epilog drain a node that fails it ------------------------------------------

def dcgmi_double(bin_dir: Path, output: str, code: int = 0) -> None:
    (bin_dir / "diag.txt").write_text(output)
    (bin_dir / "dcgmi").write_text(f"#!/bin/bash\ncat {bin_dir}/diag.txt\nexit {code}\n")
    (bin_dir / "dcgmi").chmod(0o755)


# What dcgmi prints when nv-hostengine is not running (DCGM's dcgmi/main_dcgmi.cpp and Diag.cpp messages): no
# result table, so the diagnostic gave no verdict.
NO_HOST_ENGINE = ("Error: unable to establish a connection to the specified host: localhost\n"
                  "Error: Unable to connect to host engine. Host engine connection invalid/disconnected.\n")


def node_check(controller, tmp_path, when: str, node: str, query: str = QUERY, links: str = LINKS,
               smi_code: int = 0, dcgmi: str | None = None, dcgmi_code: int = 0, smi_sleep_s: int = 0,
               slurm_conf: Path | None = None, kernel: str = "", kernel_code: int = 0,
               spec=None) -> subprocess.CompletedProcess:
    """The rendered check, run as slurmd runs it (SLURMD_NODENAME set), with nvidia-smi (and dcgmi) doubles
    printing real output, against the real slurmctld (or the controller `slurm_conf` names)."""
    site_spec, env, _ = controller
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    nvidia_smi(bin_dir, query, links, code=smi_code)
    dmesg(bin_dir, kernel, code=kernel_code)
    if smi_sleep_s:
        tool = bin_dir / "nvidia-smi"
        tool.write_text(tool.read_text().replace("\n", f"\nsleep {smi_sleep_s}\n", 1))
    if dcgmi is not None:
        dcgmi_double(bin_dir, dcgmi, dcgmi_code)
    check = tmp_path / f"{when}.sh"
    check.write_text(slurm_health.render_node_check(spec or site_spec, when))
    path = f"{bin_dir}:{os.environ['PATH']}"
    more = {"SLURM_CONF": str(slurm_conf)} if slurm_conf else {}
    return subprocess.run(["bash", str(check)], env={**env, "PATH": path, "SLURMD_NODENAME": node,
                                                     "TMPDIR": str(tmp_path), **more},
                          capture_output=True, text=True, timeout=120)


def comment(env: dict, node: str) -> str:
    """The node's Comment (free text, up to the next field)."""
    line = scontrol(env, "show", "node", "-o", node)
    return line.split(" Comment=", 1)[1].split(" Reason=", 1)[0].strip() if " Comment=" in line else ""


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


@pytest.mark.parametrize("kernel, expected", [
    (JOB_XIDS + FELL_OFF, "gpucluster: XID 79 since boot: reboot to reset the GPU"),
    (DOUBLE_BIT_XID + "\n", "gpucluster: XID 48 since boot: repair (NVIDIA's diagnosis), reboot and burn in"),
])
def test_an_xid_that_takes_a_node_out_drains_it_saying_what_it_needs(controller, tmp_path, kernel, expected):
    out = node_check(controller, tmp_path, "epilog", "gpu-slurm-02", kernel=kernel)
    assert out.returncode == 0, out.stderr
    assert drained(controller[1], "gpu-slurm-02") == expected


def test_a_jobs_own_xids_leave_the_node_in_service_and_the_spec_list_is_the_detectors(controller, tmp_path):
    out = node_check(controller, tmp_path, "epilog", "gpu-slurm-02", kernel=JOB_XIDS)
    assert out.returncode == 0 and not out.stderr, out.stderr
    assert drained(controller[1], "gpu-slurm-02") is None
    only_dbe = slurm_spec(**{"kubernetes.health.fault_xids": [48]})      # a site's own list: the same everywhere
    out = node_check(controller, tmp_path, "epilog", "gpu-slurm-02", kernel=JOB_XIDS + FELL_OFF, spec=only_dbe)
    assert out.returncode == 0 and drained(controller[1], "gpu-slurm-02") is None, out.stderr


def test_a_kernel_log_it_may_not_read_is_no_verdict(controller, tmp_path):
    out = node_check(controller, tmp_path, "epilog", "gpu-slurm-02", kernel_code=1,
                     kernel="dmesg: read kernel buffer failed: Operation not permitted\n")
    assert out.returncode == 0 and "no verdict: kernel log not read: dmesg: read kernel buffer failed" in out.stderr
    assert drained(controller[1], "gpu-slurm-02") is None


def test_a_failing_prolog_also_fails_so_slurm_requeues_the_job(controller, tmp_path):
    out = node_check(controller, tmp_path, "prolog", "gpu-slurm-03", query=QUERY.replace(
        "Remapping Failure Occurred        : No", "Remapping Failure Occurred        : Yes"))
    assert out.returncode == 1 and "gpu-slurm-03 drained" in out.stderr
    assert drained(controller[1], "gpu-slurm-03") == "gpucluster: GPU 00000000:18:00.0: row remapping failed"


def test_the_checks_own_trouble_is_no_verdict_leaving_the_node_in_service_and_saying_so(controller, tmp_path):
    """DCGM's host engine down: no result, so no verdict, never a pass nor a drain; the node's Comment says what
    could not be checked, and the next clean check clears it."""
    _, env, _ = controller
    out = node_check(controller, tmp_path, "epilog", "gpu-slurm-02", dcgmi=NO_HOST_ENGINE, dcgmi_code=255)
    assert out.returncode == 0 and "no verdict" in out.stderr, out.stderr
    assert drained(env, "gpu-slurm-02") is None
    assert comment(env, "gpu-slurm-02").startswith(slurm_health.NO_VERDICT), comment(env, "gpu-slurm-02")
    assert "dcgmi diag -r 1 gave no result: Error: unable to establish a connection" in comment(env, "gpu-slurm-02")
    out = node_check(controller, tmp_path, "epilog", "gpu-slurm-02",
                     dcgmi=(SAMPLES / "dcgmi_diag_r1_pass.txt").read_text())
    assert out.returncode == 0 and not out.stderr, out.stderr
    assert comment(env, "gpu-slurm-02") == ""


def test_a_hung_nvidia_smi_is_cut_off_at_its_bound_and_is_no_verdict(controller, tmp_path, monkeypatch):
    """Every command has a time bound (shortened here): a hung nvidia-smi neither hangs the job nor drains."""
    monkeypatch.setitem(slurm_health.BOUNDS_S, "nvidia-smi", 2)
    started = time.monotonic()
    out = node_check(controller, tmp_path, "prolog", "gpu-slurm-03", smi_sleep_s=600)
    assert out.returncode == 0, out.stderr
    assert time.monotonic() - started < 2 * (2 + 5) + 10
    assert "nvidia-smi did not answer within 2 s" in out.stderr
    assert drained(controller[1], "gpu-slurm-03") is None


def test_an_unreachable_controller_never_fails_a_healthy_node_and_a_faulty_one_still_fails(controller, tmp_path):
    """slurmctld restarting (the operator reconfigures it on every Helm upgrade): the check asks it nothing
    before its own verdict, so a healthy node passes; a faulty one it cannot drain fails the script, which Slurm
    answers by draining the node itself."""
    _, _, where = controller
    down = tmp_path / "slurm.conf"
    down.write_text(re.sub(r"SlurmctldPort=\d+", f"SlurmctldPort={free_port()}",
                           (Path(where["work"]) / "slurm.conf").read_text()))
    out = node_check(controller, tmp_path, "prolog", "gpu-slurm-01", slurm_conf=down)
    assert out.returncode == 0 and not out.stderr, out.stderr
    out = node_check(controller, tmp_path, "epilog", "gpu-slurm-01", slurm_conf=down, query=QUERY.replace(
        "Pending                           : No", "Pending                           : Yes"))
    assert out.returncode == 1, out.stderr
    assert "failed the check but could not be drained" in out.stderr and "row remapping pending" in out.stderr


def test_a_node_of_no_slurm_pool_is_checked_for_faults_but_its_gpu_count_is_no_verdict(controller, tmp_path):
    out = node_check(controller, tmp_path, "epilog", "gpu-h200-01",
                     query=re.sub(r"(Attached GPUs +: )8", r"\g<1>7", QUERY))
    assert out.returncode == 0 and "none of the Slurm pools' hosts" in out.stderr, out.stderr


# --- the node check inside the real slurmd: a node that slurmd registered, the check as its Prolog and Epilog ----

def node_fields(env: dict, node: str) -> dict[str, str]:
    return fields(scontrol(env, "show", "node", "-o", node).split(" Comment=", 1)[0])


@needs_root
def test_a_registered_node_runs_the_check_around_every_job_and_a_healthy_one_stays_in_service(node):
    """The check as slurmd runs it: its environment (no PATH: bash's default finds nvidia-smi), on a node that
    registered its GRES (`Gres=gpu:<model>:8(S:0-1)`, which the check no longer reads)."""
    env, work = node
    assert node_fields(env, "gpu-slurm-01")["Gres"] == "gpu:h100-sxm5-80gb:8(S:0-1)"
    calls = work / "nvidia-smi-calls.txt"
    calls.write_text("")
    job_id = sbatch(env, work, "-A", "team-a", "--gpus=1", "--wrap", "true")
    until_state(env, job_id, "COMPLETED")
    until(env, job_id, lambda _: calls.read_text().count("-q") == 2, "checked before and after", 90)
    assert calls.read_text().splitlines() == ["-q", "nvlink -s"] * 2
    state = node_fields(env, "gpu-slurm-01")
    assert "DRAIN" not in state["State"] and comment(env, "gpu-slurm-01") == "", state


@needs_root
def test_a_fault_found_before_a_job_drains_the_node_and_requeues_the_job_unheld(node):
    """The prolog finds a row remapping pending: slurmd's node is drained with the check's reason, the job goes
    back to the queue without a hold (nohold_on_prolog_fail) and runs once the node is repaired and resumed."""
    env, work = node
    healthy = (work / "tools" / "query.txt").read_text()
    (work / "tools" / "query.txt").write_text(healthy.replace("Pending                           : No",
                                                              "Pending                           : Yes"))
    try:
        job_id = sbatch(env, work, "-A", "team-a", "--gpus=1", "--wrap", "true")
        until(env, job_id, lambda j: j["Restarts"] != "0" and j["JobState"] == "PENDING", "requeued", 60)
        assert "DRAIN" in node_fields(env, "gpu-slurm-01")["State"]
        reason = scontrol(env, "show", "node", "-o", "gpu-slurm-01").split(" Reason=", 1)[1]
        assert reason.startswith("gpucluster: GPU 00000000:18:00.0: row remapping pending"), reason
        # not held: only Slurm's usual delay of a requeued job's start (BeginTime, two minutes), cut short here
        requeued = job(env, job_id)
        assert requeued["Priority"] != "0" and requeued["Reason"] == "BeginTime", requeued
    finally:
        (work / "tools" / "query.txt").write_text(healthy)
        subprocess.run(["scontrol", "update", "nodename=gpu-slurm-01", "state=resume"], env=env, check=True)
    scontrol(env, "update", f"jobid={job_id}", "starttime=now")
    until_state(env, job_id, "COMPLETED")


@needs_root
def test_dcgm_unreachable_after_a_job_is_no_verdict_in_the_nodes_comment(node):
    env, work = node
    dcgmi_double(work / "tools", NO_HOST_ENGINE, code=255)
    try:
        job_id = sbatch(env, work, "-A", "team-a", "--wrap", "true")
        until_state(env, job_id, "COMPLETED")
        until(env, job_id, lambda _: comment(env, "gpu-slurm-01") != "", "commented", 90)
        assert comment(env, "gpu-slurm-01").startswith(f"{slurm_health.NO_VERDICT} (")
        assert "epilog): dcgmi diag -r 1 gave no result" in comment(env, "gpu-slurm-01")
        assert "DRAIN" not in node_fields(env, "gpu-slurm-01")["State"]
    finally:
        (work / "tools" / "dcgmi").unlink()
    job_id = sbatch(env, work, "-A", "team-a", "--wrap", "true")
    until_state(env, job_id, "COMPLETED")
    until(env, job_id, lambda _: comment(env, "gpu-slurm-01") == "", "cleared", 90)
