"""Rendered host scripts: shellcheck-clean, idempotent by construction, and shaped by the pool spec."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from components.fabric.checks import render_nccl_job
from components.fabric.nccl import LARGEST_BUSBW_AWK
from components.nodes.burn_in import parse_result, render_burn_in
from components.records import min_busbw
from components.k8s.platform.gpu_operator import render_gpu_operator_values
from components.nodes import NodePoolArgs
from components.nodes.host_prep import render_kubelet_config
from components.spec.hardware import xid_pattern
from components.nodes.node_pool import render_pool_preparation, render_preparation
from components.nodes.retire import render_retirement, undo_guard
from components.nodes.rollout import render_rollout
from components.ssh import digest
from components.spec import parse_spec
from tests.conftest import ROOT, problems_of

VARIANTS = {
    "dev": lambda d: None,
    "minimal": lambda d: d["node_pools"][0].update(tuning={"cpu_governor": "unchanged", "persistence": False},
                                                    burn_in={"enabled": False}),
    "tuned": lambda d: d["node_pools"][0].update(tuning={"gpu_clock_lock_mhz": 1980, "gpu_power_limit_w": 600,
                                                         "hugepages_2mi": 1024, "shm_size_gib": 64}),
    "pcie": lambda d: d["node_pools"][0]["gpu"].update(model="H100-PCIE-80GB"),
    "operator-driver": lambda d: (d["kubernetes"].update(gpu_operator={"driver_managed": True}),
                                  d["node_pools"][0].update(tuning={"persistence": False},
                                                            burn_in={"enabled": False})),
    "driver-stack": lambda d: d["node_pools"][0].update(software={
        "driver_version": "570.124.06", "doca_ofed_version": "2.9.5", "package_repositories": MIRRORS}),
    "driver-stack-proprietary-pcie": lambda d: (d["node_pools"][0]["gpu"].update(model="H100-PCIE-80GB"),
                                                d["node_pools"][0].update(software={
                                                    "driver_version": "550.163.01", "driver_kernel_modules":
                                                    "proprietary", "package_repositories": MIRRORS[1:]})),
    "doca-only-operator-driver": lambda d: (d["kubernetes"].update(gpu_operator={"driver_managed": True}),
                                            d["node_pools"][0].update(
                                                tuning={"persistence": False}, burn_in={"enabled": False},
                                                software={"doca_ofed_version": "2.9.5",
                                                          "package_repositories": MIRRORS})),
}
# NVIDIA's CUDA and DOCA repositories as a site mirrors them (the CUDA one signed, as NVIDIA's is).
MIRRORS = [{"os_family": "debian", "url": "https://mirror.example.internal/cuda/ubuntu2204/x86_64",
            "gpg_key_url": "https://mirror.example.internal/cuda/ubuntu2204/x86_64/3bf863cc.pub"},
           {"os_family": "debian", "url": "https://mirror.example.internal/doca/2.9.5/ubuntu22.04/x86_64"},
           {"os_family": "el", "url": "https://mirror.example.internal/cuda/rhel9/x86_64"}]


def spec_for(dev_data, variant):
    VARIANTS[variant](dev_data)
    return parse_spec(yaml.safe_dump(dev_data))


def scripts_of(spec):
    pool = spec.node_pools[0]
    host = pool.hosts[0]
    args = NodePoolArgs.from_spec(spec, pool)
    prep = render_preparation(args, host)
    rollout = render_rollout(pool, host)
    retirement = render_retirement(pool, host, args.system_namespaces)
    return {"prepare": prep.create, "undo-in-sequence": prep.delete,
            "undo": render_pool_preparation(args).for_host(host).delete, "undo-guard": undo_guard(pool, host),
            "burn-in": render_burn_in(pool, host).create,
            "roll": render_pool_preparation(args).roll_for_host(host, digest(prep)).create,
            "drain": rollout.drain, "uncordon": rollout.uncordon, "retire": retirement.retire,
            "deregister": retirement.deregister, "join": retirement.membership.create,
            "leave": retirement.membership.delete}


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed (.ci/run installs it)")
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_script_passes_shellcheck(variant, dev_data, tmp_path):
    for name, text in scripts_of(spec_for(dev_data, variant)).items():
        path = tmp_path / f"{name}.sh"
        path.write_text(text)
        out = subprocess.run(["shellcheck", "-S", "style", str(path)], capture_output=True, text=True)
        assert out.returncode == 0, f"{variant}/{name}:\n{out.stdout}"


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_scripts_are_strict_bash_and_report_changes(variant, dev_data):
    for name, text in scripts_of(spec_for(dev_data, variant)).items():
        assert text.startswith("#!/usr/bin/env bash\n"), name
        assert "\nset -euo pipefail\n" in text, name
        assert text.endswith("\nfinish\n") or name.endswith("-in-sequence"), name   # its parts end so
        assert not re.search(r"@[A-Z_]+@", text), name


def test_preparation_checks_the_gpus_the_pool_expects(dev_spec):
    prep = scripts_of(dev_spec)["prepare"]
    assert '[[ "$gpus" -eq 8 ]] || fail "found $gpus GPUs, the pool expects 8 (H100-SXM5-80GB)"' in prep
    assert "NVIDIA-H100-80GB-HBM3" in prep and "ecc.errors.uncorrected.volatile.total" in prep
    # the detector's XIDs (kubernetes.health.fault_xids), not a list of its own: a node it keeps in service
    # is never refused here
    assert xid_pattern(dev_spec.kubernetes.health.fault_xids) in prep
    assert "|94|" not in prep and "(46|48|62|64|74|79|95|" in prep


def test_a_sites_own_fault_xids_are_the_preparations_too(dev_data):
    dev_data["kubernetes"]["health"]["fault_xids"] = [48, 92]
    assert "): (48|92)," in scripts_of(parse_spec(yaml.safe_dump(dev_data)))["prepare"]


def test_nvswitch_boards_need_a_matching_fabric_manager(dev_spec, dev_data):
    assert "nv-fabricmanager --version" in scripts_of(dev_spec)["prepare"]
    assert "nv-fabricmanager" not in scripts_of(spec_for(dev_data, "pcie"))["prepare"]


def test_tuning_persists_through_a_boot_unit(dev_data):
    prep = scripts_of(spec_for(dev_data, "tuned"))["prepare"]
    assert "nvidia-smi -lgc 1980,1980" in prep and "nvidia-smi -pl 600" in prep
    assert "ExecStart=/usr/local/sbin/gpucluster-node-tuning" in prep
    assert "vm.nr_hugepages = 1024" in prep and "size=64G" in prep
    assert "power limit 600 W is outside" in prep


def test_hugepages_and_link_settings_are_decided_before_the_kubelet_and_rolled_in_their_order(dev_data):
    """A new hugepages count and what bounces links stop work: preparation decides them (busy or not) before
    it decides the kubelet's restart, which a new count needs; the rollout's step pays them in that order."""
    prep = render_pool_preparation(NodePoolArgs.from_spec(spec := spec_for(dev_data, "tuned"),
                                                          spec.node_pools[0]))
    create, roll = prep.create, prep.roll
    assert create.index("restart=(fabric)") < create.index("restart=(hugepages)") < create.index("restart=()")
    assert "put_file /etc/sysctl.d/90-gpucluster-hugepages.conf 0644 'vm.nr_hugepages = 1024' restart-hugepages" \
        in create and "hugepages_apply 1024" in create
    assert "sysctl -q -w" not in create.split("hugepages_apply() {")[0]      # only through hugepages_apply
    paid = [roll.index(s) for s in ("stack_apply; fi", "run_fabric all", "hugepages_apply 1024",
                                    "systemctl restart containerd", "restarted kubelet")]
    assert paid == sorted(paid)
    assert "owe restart-kubelet" in roll.split("hugepages_apply() {")[1].split("\n}\n")[0]
    none = render_pool_preparation(NodePoolArgs.from_spec(dev := parse_spec(yaml.safe_dump(
        {**dev_data, "node_pools": [{**dev_data["node_pools"][0], "tuning": {}}]})), dev.node_pools[0])).create
    assert "drop_file /etc/sysctl.d/90-gpucluster-hugepages.conf restart-hugepages" in none
    assert "hugepages_apply 0" in none          # what an earlier spec reserved is released, the kubelet told


def test_no_tuning_removes_the_boot_unit(dev_data):
    prep = scripts_of(spec_for(dev_data, "minimal"))["prepare"]
    assert "drop_file /etc/systemd/system/gpucluster-node-tuning.service" in prep
    assert "systemctl enable nvidia-persistenced" not in prep and "nvidia-persistenced.service.d" not in prep


def test_kubelet_registers_new_nodes_tainted_until_burn_in(dev_spec):
    config = render_kubelet_config(dev_spec.node_pools[0])
    assert config["registerWithTaints"][0] == {"key": "gpucluster.io/burn-in", "value": "pending",
                                               "effect": "NoSchedule"}
    assert config["cpuManagerPolicy"] == "static" and config["reservedSystemCPUs"] == "0-1"
    assert config["topologyManagerPolicy"] == "restricted" and config["topologyManagerScope"] == "pod"


def test_single_numa_node_is_refused_where_a_pod_can_ask_for_more_than_one_numa_node_holds(dev_data):
    """An 8-GPU pod on a dual-socket board spans both NUMA nodes: single-numa-node refuses it at admission."""
    dev_data["node_pools"][0]["tuning"]["kubelet_topology_policy"] = "single-numa-node"
    (msg,) = problems_of(dev_data)
    assert msg.startswith("spec.yaml:40: node_pools[0].tuning.kubelet_topology_policy: single-numa-node refuses every pod asking "
                          "for more than 4 of the pool's 8 GPUs (one NUMA node's of 2)")
    assert "use restricted" in msg
    dev_data["node_pools"][0]["numa_nodes_per_host"] = 1           # one NUMA node holds all eight
    assert problems_of(dev_data) == []
    dev_data["node_pools"][0]["numa_nodes_per_host"] = 2
    dev_data["node_pools"][0]["sharing"] = {"time_slicing_replicas": 4}   # pods get slices of one GPU
    dev_data["tenants"] = []
    assert problems_of(dev_data) == []


def test_an_operator_managed_driver_needs_hosts_without_one(dev_data):
    dev_data["kubernetes"]["gpu_operator"] = {"driver_managed": True}
    (msg,) = problems_of(dev_data)
    assert ("kubernetes.gpu_operator.driver_managed: the GPU Operator installs the driver, but node pool h100 sets "
            "burn_in.enabled, tuning.persistence, which run nvidia-smi") in msg
    VARIANTS["operator-driver"](dev_data)
    spec = parse_spec(yaml.safe_dump(dev_data))
    prep = scripts_of(spec)["prepare"]
    assert "lspci -n -d 10de::0302" in prep and "/proc/driver/nvidia/version" in prep
    assert "nvidia-smi" not in prep and "nvidia-peermem" not in prep      # the driver container does both
    assert render_gpu_operator_values(spec)["driver"]["rdma"]["enabled"] is True


def test_the_host_driver_loads_nvidia_peermem_for_gpudirect(dev_spec, dev_data):
    """The operator's driver.rdma acts only on a driver it installs; with the host's driver the host loads it."""
    prep = scripts_of(dev_spec)["prepare"]
    assert "modprobe nvidia-peermem" in prep and "/etc/modules-load.d/gpucluster-nvidia-peermem.conf" in prep
    dev_data["fabric"]["gpudirect_rdma"] = False
    assert "nvidia-peermem" not in scripts_of(parse_spec(yaml.safe_dump(dev_data)))["prepare"]


def test_persistence_overrides_the_packaged_unit_and_is_verified(dev_spec):
    prep = scripts_of(dev_spec)["prepare"]
    assert "/etc/systemd/system/nvidia-persistenced.service.d/50-gpucluster.conf" in prep
    assert "systemctl add-wants multi-user.target nvidia-persistenced.service" in prep
    assert "--query-gpu=index,persistence_mode" in prep and "--no-persistence-mode" not in prep


def test_rdma_fabric_lifts_the_memlock_limit(dev_spec, dev_data):
    assert "LimitMEMLOCK=infinity" in scripts_of(dev_spec)["prepare"]
    dev_data["fabric"] = {"kind": "ethernet"}
    assert "LimitMEMLOCK" not in scripts_of(parse_spec(yaml.safe_dump(dev_data)))["prepare"]


def test_burn_in_threshold_defaults_to_80_percent_of_typical(dev_spec):
    assert min_busbw(dev_spec.node_pools[0]) == 360.0
    burn = scripts_of(dev_spec)["burn-in"]
    assert "dcgmi diag -r 2" in burn and "-g 8" in burn and "min=360.0" in burn


@pytest.mark.parametrize("stdout, expected", [
    ("gpu-01: note\nGPUCLUSTER_BURN_IN=passed\ngpu-01: 0 change(s)\n", (True, "passed")),
    ("GPUCLUSTER_BURN_IN=failed: NCCL all_reduce bus bandwidth 100 GB/s is below 360 GB/s\n",
     (False, "failed: NCCL all_reduce bus bandwidth 100 GB/s is below 360 GB/s")),
    ("", (False, "failed: the burn-in printed no result")),
    (None, (False, "failed: the burn-in printed no result")),
])
def test_parses_the_burn_in_verdict(stdout, expected):
    assert parse_result(stdout) == expected


# --- bad input -----------------------------------------------------------------------------------------

def test_rejects_8_gpus_on_a_host_model_with_4(dev_data):
    dev_data["node_pools"][0]["host_model"] = "hgx-h100-4gpu"
    (msg,) = problems_of(dev_data)
    assert "node_pools[0].gpu.count: host model hgx-h100-4gpu has 4 GPUs, not 8; set gpu.count: 4" in msg


def test_rejects_a_burn_in_threshold_no_node_can_reach(dev_data):
    dev_data["node_pools"][0]["burn_in"] = {"nccl_min_busbw_gb_per_s": 900}
    (msg,) = problems_of(dev_data)
    assert "node_pools[0].burn_in.nccl_min_busbw_gb_per_s: 900.0 GB/s is more than H100-SXM5-80GB reaches" in msg


def test_rejects_a_dcgm_level_out_of_range(dev_data):
    dev_data["node_pools"][0]["burn_in"] = {"dcgm_level": 5}
    (msg,) = problems_of(dev_data)
    assert "node_pools[0].burn_in.dcgm_level: Input should be less than or equal to 4 (got 5)" in msg


def test_bus_bandwidth_is_read_at_the_largest_message_not_averaged_over_all_sizes():
    """nccl-tests' "Avg bus bandwidth" averages 8 B to 8 GiB; the floor is a large-message figure."""
    sample = (ROOT / "tests" / "samples" / "all_reduce_perf_8xh100.txt").read_text()
    out = subprocess.run(["bash", "-c", LARGEST_BUSBW_AWK], input=sample, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "473.39"
    avg = float(sample.split("# Avg bus bandwidth    :")[1].split()[0])
    assert avg < 0.8 * 473.39 < 473.39        # the average alone would fail this healthy node


def test_burn_in_and_nccl_check_both_use_the_largest_message(dev_spec):
    pool = dev_spec.node_pools[0]
    burn_in = render_burn_in(pool, pool.hosts[0]).create
    _, job = render_nccl_job(dev_spec, pool)
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"][2]
    for text in (burn_in, launcher):
        assert LARGEST_BUSBW_AWK in text and "Avg bus bandwidth" not in text


def test_a_pool_renders_its_preparation_once_and_each_host_differs_only_by_name(dev_spec):
    from components.nodes.node_pool import render_pool_preparation

    pool = dev_spec.node_pools[0]
    args = NodePoolArgs.from_spec(dev_spec, pool)
    once = render_pool_preparation(args)
    first, second = pool.hosts[0], pool.hosts[1]
    for host in (first, second):
        assert render_preparation(args, host, pool_prep=once) == render_preparation(args, host)
    a, b = (render_preparation(args, h, pool_prep=once) for h in (first, second))
    assert a.create != b.create
    assert a.create.replace(first.hostname, second.hostname) == b.create
    assert a.delete.replace(first.hostname, second.hostname) == b.delete
