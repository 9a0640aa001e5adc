"""The offline plan of the real program: complete, honest, deterministic, and free of secrets."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pulumi
import pytest
from pulumi_command import remote

from components.offline.plan import HONESTY, Plan, build_plan, write_plan
from components.offline.runner import load_stack_config, run_program
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def dev_plan():
    return build_plan(run_program(ROOT, "dev"))


def test_plan_says_what_it_is(dev_plan):
    assert dev_plan.document["note"] == HONESTY
    assert dev_plan.summary.startswith(HONESTY)


def test_every_resource_hangs_under_the_cluster_with_engine_urns(dev_plan):
    resources = {r["urn"]: r for r in dev_plan.document["resources"]}
    stack = next(u for u, r in resources.items() if r["type"] == "pulumi:pulumi:Stack")
    cluster = next(u for u, r in resources.items() if r["type"] == "gpucluster:index:GpuCluster")
    assert resources[cluster]["parent"] == stack
    for urn, r in resources.items():
        if urn not in (stack, cluster):
            assert r["parent"] in resources, urn
            assert urn.startswith("urn:pulumi:dev::gpucluster::gpucluster:index:GpuCluster$"), urn
    assert "urn:pulumi:dev::gpucluster::gpucluster:index:GpuCluster$gpucluster:index:Tenant$" \
           "kubernetes:core/v1:Namespace::dev-team-a-ns" in resources


def test_writes_one_manifest_per_kubernetes_object(dev_plan):
    # Not a Node read (the live object), nor the ConfigFiles of the MPIJob and NodeReadinessRule CRDs (fetched
    # at `pulumi up`).
    k8s = [r for r in dev_plan.document["resources"]
           if r["type"].startswith("kubernetes:") and r["type"] != "kubernetes:helm.sh/v3:Release"
           and not r.get("read") and "apiVersion" in r["inputs"]]
    manifests = [p for p in dev_plan.files if p.startswith("manifests/")]
    assert len(manifests) == len(k8s) == 81
    assert "manifests/_cluster/node-gpu-dev-01.yaml" in manifests
    assert "manifests/team-a/networkpolicy-default-deny.yaml" in manifests
    assert "manifests/_cluster/clusterqueue-team-b.yaml" in manifests


def test_the_same_spec_gives_byte_identical_plans(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    write_plan(build_plan(run_program(ROOT, "dev")), first)
    write_plan(build_plan(run_program(ROOT, "dev")), second)
    files = sorted(p.relative_to(first) for p in first.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(second) for p in second.rglob("*") if p.is_file())
    for f in files:
        assert (first / f).read_bytes() == (second / f).read_bytes(), f


def test_summary_counts_resources_and_tenants(dev_plan):
    assert "Stack dev of project gpucluster: 120 resources and 3 read(s) of live objects" in dev_plan.summary
    assert "Kubernetes: GPU Operator v26.7.0, Network Operator 26.4.1, Kueue 0.19.2, NFD 0.19.0; RDMA resource " \
           "rdma/rdma_shared_devices" in dev_plan.summary
    assert "Cluster dev (dev): 2 nodes, 16 GPUs, fabric rocev2, storage beegfs" in dev_plan.summary
    assert "team-b  team-b     h100: 6" in dev_plan.summary


KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA-very-secret\n-----END OPENSSH PRIVATE KEY-----"


def test_secrets_never_reach_the_plan_files_but_scripts_do(record, tmp_path):
    def program():
        key = pulumi.Output.secret(KEY)
        remote.Command("gpu-01-prepare", connection=remote.ConnectionArgs(host="10.0.0.5", user="ubuntu",
                                                                            private_key=key),
                       create="#!/usr/bin/env bash\nset -euo pipefail\necho prepared\n", delete="true")
        remote.Command("gpu-01-auth", connection=remote.ConnectionArgs(host="10.0.0.5", private_key=key),
                       create=pulumi.Output.concat("echo ", pulumi.Output.secret("token-123"), " > /etc/auth"))
        pulumi.export("key", key)
    plan = build_plan(record(program))
    write_plan(plan, tmp_path / "plan")
    text = "".join(p.read_text() for p in (tmp_path / "plan").rglob("*") if p.is_file())
    assert "very-secret" not in text and "token-123" not in text
    assert plan.files["scripts/10.0.0.5/gpu-01-prepare.sh"].endswith("echo prepared\n")
    assert plan.files["scripts/10.0.0.5/gpu-01-prepare.delete.sh"] == "true\n"
    assert "embeds a secret" in plan.files["scripts/10.0.0.5/gpu-01-auth.sh"]
    assert plan.document["outputs"]["key"] == "[secret]"
    command = next(r for r in plan.document["resources"] if r["name"] == "gpu-01-prepare")
    assert command["inputs"]["connection"] == "[secret]"


def test_an_update_script_is_written_only_where_it_differs_from_create(record):
    def program():
        conn = remote.ConnectionArgs(host="10.0.0.5", private_key=pulumi.Output.secret(KEY))
        remote.Command("converge", connection=conn, create="echo same\n", update="echo same\n")
        remote.Command("other", connection=conn, create="echo create\n", update="echo update\n")
    files = build_plan(record(program)).files
    assert "scripts/10.0.0.5/converge.sh" in files and "scripts/10.0.0.5/converge.update.sh" not in files
    assert files["scripts/10.0.0.5/other.update.sh"] == "echo update\n"


def test_a_spec_built_in_code_is_read_back_from_the_cluster_output(record, dev_data):
    from components import GpuCluster
    from components.spec import ClusterSpec
    from tests.conftest import ssh_key

    dev_data["name"] = "coded"
    spec = ClusterSpec.model_validate(dev_data, strict=False)      # never through load_spec
    plan = build_plan(record(lambda: GpuCluster("coded", spec, ssh_key()), stack="dev"))
    assert [c.name for c in plan.clusters] == ["coded"] and plan.clusters[0] == spec
    assert "Cluster coded (dev)" in plan.summary


def test_duplicate_kubernetes_objects_are_plan_errors(record):
    import pulumi_kubernetes as k8s

    def program():
        for name in ("a", "b"):
            k8s.core.v1.Namespace(name, metadata={"name": "same"})
    plan = build_plan(record(program))
    assert plan.errors == ["b and a both manage the Kubernetes object manifests/_cluster/namespace-same.yaml; "
                           "one would overwrite the other"]


def test_objects_the_api_server_would_refuse_for_their_size_are_plan_errors(record):
    import pulumi_kubernetes as k8s

    def program():
        k8s.core.v1.ConfigMap("small", metadata={"name": "small", "namespace": "x"}, data={"a": "b"})
        k8s.core.v1.ConfigMap("big", metadata={"name": "big", "namespace": "x"}, data={"a": "b" * (1024 * 1024)})
    (error,) = build_plan(record(program)).errors
    assert error.startswith("manifests/x/configmap-big.yaml is 1,048,") and "over 1,048,576" in error


def test_refuses_to_replace_a_folder_that_holds_no_plan(dev_plan, tmp_path):
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="holds no plan"):
        write_plan(dev_plan, tmp_path)
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def test_replaces_a_previous_plan_so_removed_objects_disappear(dev_plan, tmp_path):
    write_plan(dev_plan, tmp_path)
    (tmp_path / "manifests" / "stale.yaml").write_text("old")
    (tmp_path / "old-folder").mkdir()
    (tmp_path / "old-folder" / "gone.sh").write_text("old")
    (tmp_path / "summary.txt").write_text("edited by hand")
    kept = tmp_path / "report.md"
    os.utime(kept, (1, 1))
    write_plan(dev_plan, tmp_path)
    assert not (tmp_path / "manifests" / "stale.yaml").exists() and not (tmp_path / "old-folder").exists()
    assert (tmp_path / "summary.txt").read_text() == dev_plan.files["summary.txt"]
    assert kept.stat().st_mtime == 1          # unchanged files are left alone: a re-plan rewrites what changed
    assert {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()} == set(dev_plan.files)


def test_a_large_file_is_written_exactly_and_rewritten_when_it_differs_past_its_first_megabyte(tmp_path):
    text = "é≥ plan line\n" * 200_000           # several encoding slices, non-ASCII across their boundaries
    plan = Plan({}, {"resources.json": text})
    write_plan(plan, tmp_path)
    assert (tmp_path / "resources.json").read_bytes() == text.encode()
    for stale in (text[:-1] + "X", text[:-1], text + "more"):      # differs late, is shorter, is longer
        (tmp_path / "resources.json").write_text(stale, encoding="utf-8")
        write_plan(plan, tmp_path)
        assert (tmp_path / "resources.json").read_bytes() == text.encode()


def test_encrypted_stack_config_becomes_an_unresolved_placeholder(tmp_path):
    shutil.copy(ROOT / "Pulumi.yaml", tmp_path / "Pulumi.yaml")
    (tmp_path / "Pulumi.qa.yaml").write_text("config:\n  gpucluster:token:\n    secure: v1:abc\n  specFile: x.yaml\n")
    cfg = load_stack_config(tmp_path, "qa")
    assert cfg.values["gpucluster:specFile"] == "x.yaml"
    assert cfg.unresolved_secrets == ["gpucluster:sshPrivateKey", "gpucluster:token"]
    assert "gpucluster:token" in cfg.secret_keys
    assert "v1:abc" not in json.dumps(cfg.values)


def test_a_secret_only_the_spec_asks_for_is_a_placeholder_where_needed_and_absent_elsewhere(tmp_path):
    shutil.copy(ROOT / "Pulumi.yaml", tmp_path / "Pulumi.yaml")
    needed = load_stack_config(tmp_path, "qa", ("slurmDirectoryPassword",))
    assert "gpucluster:slurmDirectoryPassword" in needed.unresolved_secrets
    assert needed.values["gpucluster:slurmDirectoryPassword"].startswith("offline-placeholder-for-")
    assert "gpucluster:slurmDirectoryPassword" not in load_stack_config(tmp_path, "qa").values


# --- the fabric in plans of a RoCE stack (dev) and an InfiniBand stack (prod) -----------------------------

def test_roce_plan_shows_host_and_switch_scripts_checks_and_nccl(dev_plan):
    files = dev_plan.files
    for host in ("gpu-dev-01", "gpu-dev-02"):
        assert "mlnx_qos -i \"$if\" --pfc 0,0,0,1,0,0,0,0" in files[f"scripts/{host}/dev-h100-{host}-prepare.sh"]
    assert "nv set qos roce mode lossless" in files["scripts/leaf-dev-01/dev-fabric-leaf-dev-01.sh"]
    assert {"checks/links-h100.sh", "checks/nccl-h100.yaml"} <= set(files)
    assert "NCCL_IB_TC: '106'" in files["manifests/team-a/configmap-nccl-h100.yaml"]
    assert "RoCE priority 3 (PFC), DSCP 26, ToS 106" in dev_plan.summary
    assert "leaf-dev-01  0,1" in dev_plan.summary


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed (.ci/run installs it)")
def test_infiniband_plan_runs_opensm_on_the_subnet_managers_and_every_script_is_clean(tmp_path):
    plan = build_plan(run_program(ROOT, "prod"))
    assert plan.errors == []
    scripts = {p: t for p, t in plan.files.items() if p.endswith(".sh")}
    assert "sm_priority 15" in scripts["scripts/gpu-prod-01/prod-h100-gpu-prod-01-prepare.sh"]
    assert "sm_priority 14" in scripts["scripts/gpu-prod-05/prod-h100-gpu-prod-05-prepare.sh"]
    assert "opensm --config" not in scripts["scripts/gpu-prod-02/prod-h100-gpu-prod-02-prepare.sh"]
    assert not any(p.startswith("scripts/ib-") for p in scripts)          # IB switches: the SM configures them
    assert "rail-optimized, bisection 12800 Gb/s" in plan.summary and "1:1" in plan.summary
    for path, text in scripts.items():
        f = tmp_path / path.replace("/", "_")
        f.write_text(text)
    out = subprocess.run(["shellcheck", "-S", "style", *map(str, tmp_path.iterdir())], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[:3000]


def test_the_program_refuses_a_directory_password_sssd_cannot_carry_without_printing_it(tmp_path):
    """Under the engine the secret comes decrypted from the stack's config: the program checks it where it enters
    and stops with a RunError naming the setting (the engine prints it alone), never the value."""
    import copy

    import pulumi
    import yaml
    from components.offline.runner import _as_main, _program_dir, run_offline
    from tests.components.k8s.slurm_specs import with_slurm_pool
    from tests.conftest import _DEV
    data = copy.deepcopy(_DEV)
    with_slurm_pool(data)
    data["kubernetes"]["slurm"]["login"] = {"directory": {
        "uris": ["ldaps://ldap.site.example"], "search_base": "dc=site,dc=example", "group_prefix": "oidc:",
        "bind_dn": "cn=sssd,dc=site,dc=example"}}
    spec_file = tmp_path / "lab.yaml"
    spec_file.write_text(yaml.safe_dump(data, sort_keys=False))
    config = {"gpucluster:specFile": str(spec_file), "gpucluster:sshPrivateKey": "key",
              "gpucluster:slurmDirectoryPassword": "first-line\nsecond-line"}
    with _program_dir(ROOT), pytest.raises(pulumi.RunError) as e:
        run_offline(_as_main(ROOT / "__main__.py"), project="gpucluster", stack="lab", config=config,
                    secret_keys=["gpucluster:sshPrivateKey", "gpucluster:slurmDirectoryPassword"])
    assert str(e.value).startswith("the stack's secret slurmDirectoryPassword is empty, starts or ends with a space")
    assert "first-line" not in str(e.value)
