"""The plan report: the tables a reviewer reads and the topology picture, for the real environments."""

from __future__ import annotations

import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from components.offline.report import PolicyResults, Thresholds, render_report, render_topology_svg
from components.spec import load_spec
from components.spec.topology import plan_topology
from tests.conftest import ROOT
from tests.slurm_site import slurm_spec


def spec_of(path: str):
    return load_spec(ROOT / path)


def test_the_prod_report_shows_the_power_arithmetic_per_rack():
    text = render_report(spec_of("stacks/prod.yaml"))
    assert "| r01 | 4 x 10.2 kW (h100 host) | 40.8 | 60 | a+b | 48 | 68% | ok |" in text
    assert "GPUs alone: 44.8 kW at TDP." in text
    assert "| lustre 2.15 prodfs | 4 | 1200 | 240 | 64 | 3.75 | 0.15 | ok |" in text
    assert "| h100 | 64 | 64 |" in text                                 # guaranteed in all against capacity
    assert "| infiniband | 4096 | - | - | yes | 64 | 12800 | 1:1 (limit 2:1) |" in text


def test_the_reference_design_counts_dgx_base_power_storage_and_reaches_250_gb_per_s():
    text = render_report(spec_of("examples/reference-64gpu.yaml"))
    assert "| r01 | 4 x 10.2 kW (h100 host) | 40.8 | 60 | a+b | 48 | 68% | ok |" in text
    assert "| r02 | 5 x 1.5 kW (storage server) | 7.5 | 30 | a+b | 24 | 25% | ok |" in text
    assert "| 250 | 64 | 3.906 | 0.15 | ok |" in text


def test_thresholds_and_policy_results_change_the_verdicts():
    spec = spec_of("stacks/prod.yaml")
    text = render_report(spec, Thresholds(derating=0.6, min_read_gb_per_s_per_gpu=4, source="policy config x"),
                         PolicyResults(1, 0, [("power-rack-budget", "mandatory", "prod", "rack r01 draws ...")]))
    assert "| r01 | 4 x 10.2 kW (h100 host) | 40.8 | 60 | a+b | 36 | 68% | **over budget** |" in text
    assert "| 3.75 | 4 | **below target** |" in text and "Thresholds: policy config x." in text
    assert "| power-rack-budget | mandatory | prod | rack r01 draws ... |" in text


@pytest.mark.parametrize("path", ["stacks/dev.yaml", "stacks/staging.yaml", "stacks/prod.yaml",
                                  "examples/reference-64gpu.yaml", "examples/large.yaml",
                                  "examples/dev-l40s.yaml"])
def test_the_topology_picture_holds_every_switch_rack_host_and_server(path, tmp_path):
    spec = spec_of(path)
    svg = render_topology_svg(spec)
    root = ET.fromstring(svg)                                         # well-formed
    texts = " ".join(t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text"))
    titles = " ".join(t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}title"))
    for switch in spec.fabric.switches:
        assert switch.name in texts
    for rack in spec.racks:
        assert rack in texts
    for _, host in spec.hosts():
        assert host.hostname in texts
    for server in spec.storage.servers:
        assert server.hostname in texts
    for leaf in plan_topology(spec)[0].leaves.values():       # each leaf's oversubscription and link speeds
        ratio = "no uplinks" if leaf.oversubscription is None else f"{leaf.oversubscription:g}:1"
        assert f"leaf {leaf.name}: {leaf.downlinks} down ({leaf.down_gbps} Gb/s)" in titles and ratio in titles
    if shutil.which("rsvg-convert"):                              # and a real renderer draws it
        png, source = tmp_path / "t.png", tmp_path / "t.svg"
        source.write_text(svg)
        subprocess.run(["rsvg-convert", "-o", str(png), str(source)], check=True)
        assert png.stat().st_size > 10_000


def test_plan_and_check_write_the_report_beside_the_plan(tmp_path):
    from tests.cli.test_cli import gpucluster
    out = gpucluster("check", str(ROOT / "tests/policies/broken/prod-rack-power.yaml"), "--out", str(tmp_path))
    assert out.returncode == 1
    report = (tmp_path / "report.md").read_text()
    assert report.startswith("# Cluster prod (prod)\n")
    assert "## Policy results\n\n1 mandatory and 0 advisory finding(s)." in report
    assert "| r01 | 4 x 10.2 kW (h100 host, dgx-h100's base power) | 40.8 | 45 | a+b | 36 | 91% | **over budget** |" in report
    assert (tmp_path / "topology.svg").read_text().startswith("<svg ")
    assert Path(tmp_path / "summary.txt").exists()


def test_the_report_shows_each_pools_rollout_batches_in_order():
    report = render_report(load_spec(ROOT / "stacks" / "prod.yaml"))
    # 4 batches of (a 60 min drain + the roll's bounds: kubelet 60 s, the InfiniBand ports 180 s, dcgmi 900 s,
    # the driver stack install modelled at 1200 s = 39 min) = 6.6 h; one failed host may stay out
    assert ("| h100 | 8 | 2 | 2 | 4 | 1 | 60 min | 39 min | 6.6 h | 4 host(s): 4 | installs driver 570.172.08 + "
            "Fabric Manager, DOCA-OFED 2.9.5 from mirrors |") in report
    dev = render_report(load_spec(ROOT / "stacks" / "dev.yaml"))
    assert "| h100 | 2 | 10% | 1 | 2 | 0 | 60 min | 19 min | 2.63 h | 2 host(s): 2 | - |" in dev
    assert ("- h100: 1) gpu-prod-01 .. gpu-prod-02 (2); 2) gpu-prod-03 .. gpu-prod-04 (2); "
            "3) gpu-prod-05 .. gpu-prod-06 (2); 4) gpu-prod-07 .. gpu-prod-08 (2)") in report


def test_the_report_says_how_gpu_faults_show_and_when_nothing_watches_for_them():
    prod = load_spec(ROOT / "stacks" / "prod.yaml")
    report = render_report(prod)
    assert ("node-problem-detector v1.34.0 watches the kernel log of all 8 GPU nodes, each XID of `fault_xids` as "
            "NVIDIA's catalog resolves it: one that needs NVIDIA's diagnosis (48, 74, 144, 145, 146, 147, 148, 149, "
            "150) sets the node condition `GpuHardwareFault`") in report
    assert "a reboot (46, 62, 64, 79, 95, 109, 110, 119, 120, 136, 140, 143, 155, 156, 158, 160) sets " \
           "`GpuResetRequired`" in report
    off = prod.model_copy(update={"kubernetes": prod.kubernetes.model_copy(update={
        "health": prod.kubernetes.health.model_copy(update={"enabled": False})})})
    assert "Off (`kubernetes.health.enabled: false`)" in render_report(off)


def test_the_report_says_how_drained_slurm_nodes_are_listed_and_returned():
    spec = slurm_spec()
    report = render_report(spec)
    assert ("Slurm's pools (h100-slurm) run the node check before and after every job" in report
            and "`sinfo -R` lists the drained nodes with their reasons" in report
            and "reason starting `gpucluster:`" in report and "`SlurmNodesDrained` alert" in report
            and "its Comment starts `gpucluster: no verdict`" in report)
    assert "Slurm" not in render_report(load_spec(ROOT / "stacks" / "dev.yaml"))
