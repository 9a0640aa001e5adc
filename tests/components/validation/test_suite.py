"""The validation suite: manifests valid and thresholds from the spec; verdicts from the tools' real output."""

from __future__ import annotations

import json
import subprocess

import kubernetes_validate
import pytest
import yaml

from components.fabric.checks import IB_BW_AWK
from components.spec import parse_spec
from components.validation import judge, plan_suite, render_suite_files
from components.validation.parse import dcgm_failures, fio_read_gb_per_s
from components.validation.runner import render_results, run_suite
from tests.conftest import ROOT

SAMPLES = ROOT / "tests" / "samples"


def by_name(spec):
    return {c.name: c for c in plan_suite(spec)}


def test_the_dev_suite_covers_links_nccl_storage_and_every_node(dev_spec):
    checks = by_name(dev_spec)
    assert sorted(checks) == ["dcgm-gpu-dev-01", "dcgm-gpu-dev-02", "links-h100", "nccl-h100", "nodes-h100",
                              "storage-read"]
    assert checks["links-h100"].threshold == 360          # 90% of 400 Gb/s
    assert checks["nccl-h100"].threshold == 85            # 85% of two 400 Gb/s NICs (100 GB/s)
    assert checks["storage-read"].threshold == 14         # 70% of one server's 20 GB/s


def test_thresholds_follow_the_spec(dev_data):
    dev_data["fabric"]["checks"] = {"nccl_min_percent": 90, "link_min_percent": 95}
    dev_data["validation"]["storage_min_read_percent"] = 50
    checks = by_name(parse_spec(yaml.safe_dump(dev_data)))
    assert (checks["nccl-h100"].threshold, checks["links-h100"].threshold, checks["storage-read"].threshold) == \
        (90, 380, 10)


def test_without_a_site_fio_image_the_read_check_is_left_out_and_the_plan_says_why(dev_data):
    """No personal registry build stands in for the site's image: the check is not run, and the warning names
    the field to set."""
    del dev_data["validation"]["fio_image"]
    spec = parse_spec(yaml.safe_dump(dev_data))
    assert "storage-read" not in by_name(spec)
    assert any("validation.fio_image is not set" in w for w in spec.warnings())
    dev_data["storage"] = {"kind": "none"}
    for tenant in dev_data["tenants"]:
        tenant.pop("storage", None)
    assert not any("fio_image" in w for w in parse_spec(yaml.safe_dump(dev_data)).warnings())


def test_every_manifest_is_schema_valid(dev_spec):
    for check in plan_suite(dev_spec):
        for obj in check.manifests:
            if obj["apiVersion"].startswith("kubeflow.org"):
                continue                                  # the MPIJob CRD is not in the core schemas
            kubernetes_validate.validate(obj, dev_spec.kubernetes.version, strict=True)


def test_storage_read_runs_one_client_per_gpu_node_through_a_claim(dev_spec):
    _, pv, pvc, job = by_name(dev_spec)["storage-read"].manifests
    assert pv["spec"]["hostPath"] == {"path": "/mnt/devfs/.gpucluster-validation", "type": "DirectoryOrCreate"}
    assert pvc["spec"]["volumeName"] == pv["metadata"]["name"]
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 2, 2)
    pod = spec["template"]["spec"]
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert anti["topologyKey"] == "kubernetes.io/hostname"
    assert not any("hostPath" in v for v in pod["volumes"])          # baseline pod security: through the claim


def test_dcgm_runs_on_each_node_with_all_its_gpus(dev_spec):
    job = by_name(dev_spec)["dcgm-gpu-dev-01"].manifests[1]
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"kubernetes.io/hostname": "gpu-dev-01"}
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": 8}
    assert pod["containers"][0]["command"][-1] == "nv-hostengine && dcgmi diag -r 2"


def test_the_link_check_reads_ib_write_bw_average_bandwidth():
    out = subprocess.run(["bash", "-c", IB_BW_AWK], input=(SAMPLES / "ib_write_bw_ndr.txt").read_text(),
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "389.94"


def fio_doc(gb_per_s):
    return json.dumps({"fio version": "fio-3.36", "jobs": [{"jobname": "read", "read": {
        "io_bytes": int(gb_per_s * 60e9), "bw_bytes": int(gb_per_s * 1e9), "bw": int(gb_per_s * 1e9 / 1024)}}]},
        indent=2)


def test_fio_read_is_read_from_real_fio_json_of_every_client(dev_spec):
    """Two clients' fio 3.36 JSON reports, as `kubectl logs` concatenates them."""
    log = (SAMPLES / "fio_read_2clients.log").read_text()
    assert fio_read_gb_per_s(log) == (15.0, 2)                   # 7.646 + 7.353 GB/s
    assert judge(by_name(dev_spec)["storage-read"], log).passed    # against 14 GB/s


def test_fio_read_is_summed_over_every_client():
    log = fio_doc(7.5) + "\nfio: some note\n" + fio_doc(6.25)
    assert fio_read_gb_per_s(log) == (13.75, 2)


def test_dcgm_reads_a_failed_gpu_among_passing_ones():
    failures, ran = dcgm_failures((SAMPLES / "dcgmi_diag_r2_fail.txt").read_text())
    assert failures == ["GPU Memory: Fail - GPU: 3"] and ran == 11


def test_verdicts(dev_spec):
    checks = by_name(dev_spec)
    assert judge(checks["storage-read"], fio_doc(7.5) + fio_doc(6.25)).passed is False
    assert judge(checks["storage-read"], fio_doc(7.5) + fio_doc(7)).measured == "14.5 GB/s from 2 nodes"
    nccl = judge(checks["nccl-h100"], "... bus bandwidth at 8 GiB 84.2 GB/s, floor 85 GB/s\n")
    assert (nccl.passed, nccl.measured, nccl.detail) == (False, "84.2 GB/s", "below the floor 85 GB/s")
    links = judge(checks["links-h100"], "links-h100: ok   rail 0 gpu-dev-02 -> gpu-dev-01 (mlx5_0): 389.94 Gb/s "
                                        "(>= 360)\nlinks-h100: FAIL rail 1 gpu-dev-02 -> gpu-dev-01 (mlx5_1): 180.2 "
                                        "Gb/s, below 360 Gb/s (90% of line rate)\n")
    assert (links.passed, links.measured) == (False, "1/2 links ok")
    assert links.detail == "rail 1 gpu-dev-02 -> gpu-dev-01: 180.2 Gb/s, below 360 Gb/s (90% of line rate)"
    diag = judge(checks["dcgm-gpu-dev-01"], (SAMPLES / "dcgmi_diag_r2_fail.txt").read_text())
    assert (diag.passed, diag.measured, diag.detail) == (False, "10/11 passed", "GPU Memory: Fail - GPU: 3")
    assert judge(checks["nccl-h100"], "").detail.startswith("all_reduce_perf printed no bus bandwidth")


def node(name, cpu="110", memory=f"{2048 * 1024 - 100}Mi", gpus="8", ready=True, cordoned=False, taints=()):
    """A Node as the apiserver lists it (allocatable as a real kubelet reports it)."""
    return {"metadata": {"name": name}, "spec": {"unschedulable": cordoned, "taints": list(taints)},
            "status": {"allocatable": {"cpu": cpu, "memory": memory, "nvidia.com/gpu": gpus},
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


class Cluster:
    """What kubectl answers for a cluster where every workload ran: its nodes, the logs of its pods."""

    def __init__(self, logs, nodes=None):
        self.logs, self.calls = logs, []
        self.nodes = nodes if nodes is not None else [node("gpu-dev-01"), node("gpu-dev-02")]

    def __call__(self, *args, stdin=None, timeout_s=300):
        self.calls.append((args, stdin))
        out = ""
        if args[0] == "logs":
            out = next(text for key, text in self.logs.items() if key in args[4])
        if args[:2] == ("get", "nodes"):
            out = json.dumps({"items": self.nodes})
        return subprocess.CompletedProcess(args, 0, out, "")


def test_the_suite_applies_once_waits_for_each_workload_and_judges_its_logs(dev_spec):
    checks = plan_suite(dev_spec)
    healthy = (SAMPLES / "dcgmi_diag_r2_fail.txt").read_text().replace("Fail - GPU: 3", "Pass - GPU: 3")
    cluster = Cluster({"nccl-check-h100": "bus bandwidth at 8 GiB 92.5 GB/s, floor 85 GB/s",
                       "storage-read": fio_doc(8) + fio_doc(8), "dcgm-": healthy})
    links = "x: ok   rail 0 a -> b (mlx5_0): 390 Gb/s (>= 360)\n"
    results = run_suite(checks, cluster, lambda text: subprocess.CompletedProcess([], 0, links, ""), 600)
    assert [(r.check, r.passed) for r in results] == [(c.name, True) for c in checks]
    applies = [[d["kind"] for d in yaml.safe_load_all(stdin)] for args, stdin in cluster.calls if args[0] == "apply"]
    # one phase at a time: node diagnostics, then NCCL, then the filesystem read (they share GPUs and NICs)
    assert applies == [["Namespace", "Job", "Job"], ["Namespace", "MPIJob"],
                       ["Namespace", "PersistentVolume", "PersistentVolumeClaim", "Job"]]
    waits = [args[-1] for args, _ in cluster.calls if args[0] == "wait"]
    assert waits == ["job/dcgm-gpu-dev-01", "job/dcgm-gpu-dev-02", "mpijob/nccl-check-h100", "job/storage-read"]
    table = render_results(results)
    assert "nccl-h100        pass    92.5 GB/s" in table and table.endswith("6 passed, 0 failed\n")


def test_a_workload_that_did_not_finish_fails_its_check(dev_spec):
    checks = [c for c in plan_suite(dev_spec) if c.name == "nccl-h100"]

    def cluster(*args, stdin=None, timeout_s=300):
        if args[0] == "wait":
            return subprocess.CompletedProcess(args, 1, "", "error: timed out waiting for the condition")
        return subprocess.CompletedProcess(args, 0, "bus bandwidth at 8 GiB 95 GB/s, floor 85 GB/s", "")
    [result] = run_suite(checks, cluster, lambda t: subprocess.CompletedProcess([], 0, "", ""), 5)
    assert not result.passed and result.detail == "did not complete: error: timed out waiting for the condition"


@pytest.mark.parametrize("name", ["validation/README.md", "validation/storage-read.yaml", "validation/links-h100.sh",
                                  "validation/dcgm-h100.yaml"])
def test_the_plan_shows_the_suite(dev_spec, name):
    files = render_suite_files(dev_spec)
    assert name in files
    assert "| storage-read | fio sequential read from 2 GPU nodes at once on beegfs devfs, each of another node's " \
           "512 GiB (70% of 20 GB/s expected) | >= 14 GB/s |" in files["validation/README.md"]


def test_a_pools_node_diagnostics_share_one_file_with_their_namespace_once(dev_spec):
    files = render_suite_files(dev_spec)
    docs = list(yaml.safe_load_all(files["validation/dcgm-h100.yaml"]))
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [
        ("Namespace", "gpucluster-checks"), ("Job", "dcgm-gpu-dev-01"), ("Job", "dcgm-gpu-dev-02")]
    assert not any(name.startswith("validation/dcgm-gpu-") for name in files)
    checks = by_name(dev_spec)
    assert docs[1:] == [checks["dcgm-gpu-dev-01"].manifests[1], checks["dcgm-gpu-dev-02"].manifests[1]]


def test_nodes_that_offer_pods_less_than_the_spec_assumes_fail_their_check(dev_spec):
    """memory_gib_per_host written as the installed RAM: the Node reports less, and templates would not fit."""
    check = by_name(dev_spec)["nodes-h100"]
    fine = judge(check, json.dumps({"items": [node("gpu-dev-01"), node("gpu-dev-02")]}))
    assert (fine.passed, fine.measured) == (True, "2/2 nodes as the spec")
    short = judge(check, json.dumps({"items": [node("gpu-dev-01", memory="1990Gi"), node("gpu-dev-02", cpu="108000m")]}))
    assert (short.passed, short.measured) == (False, "0/2 nodes as the spec")
    assert "gpu-dev-01 offers 1990.0 GiB, the spec assumes 2000.2 (memory_gib_per_host is the Node's " in short.detail
    assert "gpu-dev-02 offers 108 cores, the spec assumes 110" in short.detail
    missing = judge(check, json.dumps({"items": [node("gpu-dev-01", gpus="4")]}))
    assert "no Node for gpu-dev-02" in missing.detail and "gpu-dev-01 offers 4 nvidia.com/gpu, the spec 8" in missing.detail


def test_the_nccl_check_runs_on_the_schedulable_nodes_and_needs_two(dev_data):
    dev_data["sites"][0]["racks"][0]["pdu_capacity_kw"] = 60        # room for two more hosts
    for i in (3, 4):
        dev_data["node_pools"][0]["hosts"].append({"hostname": f"gpu-dev-0{i}", "address": f"10.10.0.1{i}",
                                                   "rack": "r01"})
    spec = parse_spec(yaml.safe_dump(dev_data))
    checks = [c for c in plan_suite(spec) if c.kind in ("nodes", "nccl")]
    nodes = [node("gpu-dev-01"), node("gpu-dev-02", cordoned=True), node("gpu-dev-03"),
             node("gpu-dev-04", taints=[{"key": "gpucluster.io/burn-in", "value": "failed", "effect": "NoSchedule"}])]
    cluster = Cluster({"nccl-check-h100": "bus bandwidth at 8 GiB 92.5 GB/s, floor 85 GB/s"}, nodes)
    results = run_suite(checks, cluster, lambda t: subprocess.CompletedProcess([], 0, "", ""), 60)
    assert [r.passed for r in results] == [True, True]
    [job] = [d for args, stdin in cluster.calls if args[0] == "apply" for d in yaml.safe_load_all(stdin)
             if d["kind"] == "MPIJob"]
    assert job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 2 and \
        job["spec"]["launcherCreationPolicy"] == "WaitForWorkersReady"
    lonely = Cluster({}, [node("gpu-dev-01"), node("gpu-dev-02", ready=False)])
    [_, nccl] = run_suite(checks, lonely, lambda t: subprocess.CompletedProcess([], 0, "", ""), 60)
    assert not nccl.passed and nccl.detail.startswith("1 schedulable node(s) in pool h100: NCCL across nodes needs two")
    assert not any(args[0] == "apply" for args, _ in lonely.calls)


def test_a_command_that_outlives_its_time_is_a_failed_check_not_a_traceback(dev_spec):
    checks = [c for c in plan_suite(dev_spec) if c.kind in ("links", "dcgm")]

    def hung(*args, stdin=None, timeout_s=300):
        raise subprocess.TimeoutExpired(["kubectl", *args], timeout_s)

    def slow_script(text):
        raise subprocess.TimeoutExpired(["bash"], 5)
    results = run_suite(checks, hung, slow_script, 5)
    assert [(r.check, r.passed) for r in results] == [(c.name, False) for c in checks]
    assert results[0].detail == "the link check did not finish within 5 s"
    assert "kubectl apply failed: did not finish within 300 s" in results[1].detail


def test_the_read_check_needs_every_client_and_reads_what_another_client_wrote(dev_spec, tmp_path):
    """Real sh runs each client's part with a fio that records what it is asked: every client writes its own
    files, waits for its neighbour's, reads those (never its own, which its servers may still cache), and cleans
    up once its reader is done. A sum from fewer clients than nodes fails the check."""
    check = by_name(dev_spec)["storage-read"]
    assert not judge(check, fio_doc(20)).passed and "only 1 of 2 clients reported" in judge(check, fio_doc(20)).detail
    job = check.manifests[-1]
    [container] = job["spec"]["template"]["spec"]["containers"]
    script = container["command"][2].replace("@DIR@", str(tmp_path))
    script = script.replace("d=/data/", f"d={tmp_path}/")
    (tmp_path / "fio").write_text("#!/bin/sh\necho \"$@\" >> \"$FIO_LOG\"\n"
                                  "case \"$*\" in *--rw=write*) for j in 0 1 2 3; do\n"
                                  "  f=$(printf '%s' \"$*\" | sed -n 's/.*--filename_format=\\(c[0-9]*\\)\\.\\$jobnum.*/\\1/p')\n"
                                  "  d=$(printf '%s' \"$*\" | sed -n 's/.*--directory=\\([^ ]*\\).*/\\1/p'); : > \"$d/$f.$j\"; done ;;\n"
                                  "*) echo '{\"jobs\": []}' ;; esac\n")
    (tmp_path / "fio").chmod(0o755)
    (tmp_path / "df").write_text("#!/bin/sh\necho 'Filesystem 1024-blocks Used Available Capacity Mounted'\n"
                                 "echo 'fs 10737418240 0 10737418240 0% /mnt'\n")       # 10 TiB, all free
    (tmp_path / "df").chmod(0o755)
    procs = [subprocess.Popen(["sh", "-c", script], env={"PATH": f"{tmp_path}:/usr/bin:/bin", "RUN": "u1",
                                                        "JOB_COMPLETION_INDEX": str(i), "FIO_LOG": str(tmp_path / f"log{i}")},
                              stdout=subprocess.PIPE, text=True) for i in (0, 1)]
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0] and all('"jobs"' in o for o in outs)
    for i, other in ((0, 1), (1, 0)):
        write, read = (tmp_path / f"log{i}").read_text().splitlines()
        assert f"--filename_format=c{i}.$jobnum --rw=write" in write and "--size=128g" in write
        assert f"--filename_format=c{other}.$jobnum --rw=read" in read and "--output-format=json" in read
    assert not list((tmp_path / "run-u1").glob("c*"))            # every client's files removed after the read


def test_the_read_check_refuses_to_fill_the_filesystem_before_writing_anything(dev_spec, tmp_path):
    """Its data sits outside every tenant's quota: with less free space than the test writes plus a tenth of the
    filesystem, a client stops before fio writes a byte, saying how much it needs."""
    from components.validation.suite import FIO_MOUNT
    job = by_name(dev_spec)["storage-read"].manifests[-1]
    script = job["spec"]["template"]["spec"]["containers"][0]["command"][-1].replace(FIO_MOUNT, str(tmp_path / "fs"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "df").write_text("#!/bin/sh\necho 'Filesystem 1024-blocks Used Available Capacity Mounted'\n"
                                "echo 'fs 10737418240 10000000000 524288000 94% /mnt'\n")   # 10 TiB, 500 GiB free
    (bin_dir / "fio").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/fio-calls\n")
    for tool in ("df", "fio"):
        (bin_dir / tool).chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "JOB_COMPLETION_INDEX": "0", "RUN": "uid-1"}
    out = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 1
    assert out.stderr.startswith("storage-read: the test writes 1024 GiB and keeps a tenth of the filesystem "
                                 "free, but only 500 GiB are free")
    assert not (tmp_path / "fio-calls").exists()
