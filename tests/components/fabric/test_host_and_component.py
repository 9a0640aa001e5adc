"""Fabric host scripts, NCCL settings, checks, and the component's resource graph under mocks."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from components.fabric import Fabric
from components.fabric.checks import _pairs, link_waves, nccl_floor_gb_per_s, render_link_check, render_nccl_job
from components.fabric.fabric import data_plane, fabric_hosts, render_checks
from components.fabric.host import render_apply, render_fabric_host, render_partitions
from components.fabric.nccl import NCCL_CONF, nccl_envs, render_nccl_conf
from components.spec import parse_spec
from tests.components.k8s.conftest import infiniband
from tests.conftest import problems_of, ssh_key

VARIANTS = {
    "roce": lambda d: None,
    "roce-custom": lambda d: d["fabric"].update(roce={"priority": 5, "pfc_priorities": [5], "dscp": 46}),
    "infiniband": infiniband,
    "infiniband-partitions": lambda d: (infiniband(d), d["fabric"]["infiniband"].update(
        partitions=[{"name": "ipoib-a", "pkey": 0x0A01}])),
}


def spec_for(dev_data, variant):
    VARIANTS[variant](dev_data)
    return parse_spec(yaml.safe_dump(dev_data))


def scripts_of(spec):
    for hostname, _, nics, env, storage in fabric_hosts(spec):
        s = render_fabric_host(spec, hostname, nics, env, storage)
        yield f"{hostname}.sh", s.create
        yield f"{hostname}.delete.sh", s.delete
        yield f"{hostname}.apply.sh", render_apply(spec, hostname, nics, env, storage)   # travels inside the heredoc
    for name, text in render_checks(spec).items():
        if name.endswith(".sh"):
            yield name, text


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed (.ci/run installs it)")
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_fabric_script_passes_shellcheck(variant, dev_data, tmp_path):
    for name, text in scripts_of(spec_for(dev_data, variant)):
        path = tmp_path / name
        path.write_text(text)
        out = subprocess.run(["shellcheck", "-S", "style", str(path)], capture_output=True, text=True)
        assert out.returncode == 0, f"{name}:\n{out.stdout}"


def test_roce_host_settings_use_the_fabric_class(dev_spec):
    pool = dev_spec.node_pools[0]
    text = render_apply(dev_spec, "gpu-dev-01", pool.nics, nccl_envs(dev_spec)[pool.name])
    assert "mlnx_qos -i \"$if\" --pfc 0,0,0,1,0,0,0,0" in text and '"$pfc" != 00010000' in text
    assert 'dscp_prio "$if" 26 3' in text and 'dscp_prio "$if" 48 6' in text
    assert "set_mtu \"$if\" 9000" in text and "default_roce_tos\" 106" in text
    assert "ecn/$point/enable/3" in text and "ethtool -A \"$if\" autoneg off rx off tx off" in text
    # NICs are all checked before any is changed
    assert text.index("check_nic mlx5_1 ens2f0np0 1 Ethernet") < text.index("roce_nic mlx5_0 ens1f0np0")


def test_the_boot_unit_runs_before_kubelet_and_retries_until_the_fabric_is_up(dev_spec, dev_data):
    """A node takes no pods before its fabric is set; an IB port not yet Active fails an attempt, not the boot."""
    for spec in (dev_spec, spec_for(dev_data, "infiniband")):
        pool = spec.node_pools[0]
        text = render_fabric_host(spec, "gpu-dev-01", pool.nics, {}).create
        start = text.index("Description=RoCE/InfiniBand host settings")
        unit = text[start:text.index("[Install]", start)]
        for line in ("Before=kubelet.service", "StartLimitIntervalSec=0", "Restart=on-failure", "RestartSec=30"):
            assert f"\n{line}\n" in unit, line


@pytest.mark.parametrize("variant", ["dev", "infiniband"])
def test_each_host_installs_its_own_boot_script_from_one_shared_text(variant, dev_data):
    """The push is one text for the pool's hosts (shipped once, ssh.Lib); bash puts each host's name into the
    boot script, which is byte for byte the one rendered for that host (a different file would owe the host a
    fabric restart on the next rollout)."""
    spec = parse_spec(yaml.safe_dump(dev_data)) if variant == "dev" else spec_for(dev_data, variant)
    pool = spec.node_pools[0]
    env = nccl_envs(spec)[pool.name]
    pushes = {h: render_fabric_host(spec, h, pool.nics, env).create for h in ("gpu-dev-07", "gpu-dev-08")}
    parts = {h: text[text.index("# gpucluster: shared part begins"):] for h, text in pushes.items()}
    assert parts["gpu-dev-07"] == parts["gpu-dev-08"] and "gpu-dev-0" not in parts["gpu-dev-07"]
    for host, text in pushes.items():
        doc = re.search(r"^apply_doc=\$\(cat <<'(\w+)'\n.*?\n\1\n\)\n", text, re.S | re.M)[0]
        put = re.search(r"^put_file \S+ 0755 (.*)$", text, re.M)[1]
        out = subprocess.run(["bash", "-c", f"HOST={host}\n{doc}printf '%s' {put}"], capture_output=True,
                             text=True, check=True, timeout=30).stdout
        assert out == render_apply(spec, host, pool.nics, env).rstrip("\n")


def test_a_name_that_needs_quoting_is_rendered_into_its_boot_script_not_put_in_by_bash(dev_spec):
    """Only a plain name is put in on the host; any other (the spec refuses it) stays quoted where it is
    rendered, so bash never places it unquoted into a script."""
    pool = dev_spec.node_pools[0]
    text = render_fabric_host(dev_spec, "gpu-01;x", pool.nics, {}).create
    assert text.count("__GPUCLUSTER_HOST__") == 1 and "HOST='gpu-01;x'" in text     # the substitution alone


def test_nccl_settings_match_the_fabric(dev_spec, dev_data):
    env = nccl_envs(dev_spec)[dev_spec.node_pools[0].name]
    assert env == {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1", "NCCL_IB_TC": "106", "NCCL_IB_ROCE_VERSION_NUM": "2",
                   "NCCL_IB_ADDR_FAMILY": "AF_INET", "NCCL_NET_GDR_LEVEL": "PHB", "NCCL_SOCKET_IFNAME": "=eno1"}
    assert render_nccl_conf(env).splitlines()[1:3] == ["NCCL_IB_HCA==mlx5_0:1,mlx5_1:1", "NCCL_IB_TC=106"]
    assert all('"' not in line and "export" not in line for line in render_nccl_conf(env).splitlines())
    ib = spec_for(dev_data, "infiniband")
    env = nccl_envs(ib)[ib.node_pools[0].name]
    assert "NCCL_IB_TC" not in env and env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1"


def test_hcas_are_listed_in_rail_order(dev_data):
    dev_data["node_pools"][0]["nics"].reverse()
    spec = parse_spec(yaml.safe_dump(dev_data))
    assert nccl_envs(spec)[spec.node_pools[0].name]["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1"


def test_no_gpudirect_turns_nccl_gdr_off(dev_data):
    dev_data["fabric"]["gpudirect_rdma"] = False
    spec = parse_spec(yaml.safe_dump(dev_data))
    assert nccl_envs(spec)[spec.node_pools[0].name]["NCCL_NET_GDR_LEVEL"] == "LOC"


def test_partitions_carry_the_fabric_mtu_and_rate(dev_data):
    dev_data["storage"]["servers"][0]["link_speed_gbps"] = 400
    spec = spec_for(dev_data, "infiniband-partitions")
    assert render_partitions(spec).splitlines()[1:] == [
        "Default=0x7fff, ipoib, mtu=5, rate=21 : ALL=full, ALL_SWITCHES=full, SELF=full ;",
        "ipoib-a=0x0a01, ipoib, mtu=5, rate=21 : ALL=full ;"]


def test_partitions_are_ipoib_networks_and_do_not_pretend_to_isolate_tenants(dev_data):
    """Every port is a full member of every partition: they separate IP traffic, not RDMA between tenants."""
    infiniband(dev_data)
    dev_data["fabric"]["infiniband"]["partitions"] = [{"name": "team-a", "pkey": 0x0A01, "tenants": ["team-a"]}]
    (msg,) = problems_of(dev_data)
    assert "fabric.infiniband.partitions[0].tenants: unknown field 'tenants': removed in release 0.1.0 " \
           "(CHANGELOG.md): partitions are IPoIB networks and do not isolate tenants' RDMA traffic" in msg


def sm_guard(tmp_path, spec, master_desc):
    """Run the subnet manager host's script up to its OpenSM start, with sminfo/smpquery answering as a fabric
    whose master SM has node description `master_desc` (None: no SM answers)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    tools = {"opensm": "exit 0", "systemctl": "exit 1",
             "sminfo": 'echo "sminfo: sm lid 7 sm guid 0x0002c90300a1b2c3, activity count 4 priority 15 state 3 '
                       'SMINFO_MASTER"' if master_desc else "exit 1",
             "smpquery": f'echo "Node Description:..........{master_desc}"'}
    for name, body in tools.items():
        (bin_dir / name).write_text(f"#!/usr/bin/env bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    text = render_fabric_host(spec, "gpu-dev-01", spec.node_pools[0].nics, {}).create
    guard = text[:text.index("conf=$(cat")] + "note guard-passed\n"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    return subprocess.run(["bash", "-c", guard], capture_output=True, text=True, env=env)


def test_opensm_never_takes_over_an_existing_master_silently(dev_data, tmp_path):
    infiniband(dev_data)
    spec = parse_spec(yaml.safe_dump(dev_data))
    out = sm_guard(tmp_path, spec, "ufm-01 HCA-1")
    assert out.returncode == 1
    assert ("a subnet manager is already master of this fabric (lid 7, 'ufm-01 HCA-1': UFM or a switch SM?); use it "
            "and remove fabric.infiniband.subnet_managers, or set fabric.infiniband.take_over_existing_sm: true"
            ) in out.stderr
    assert sm_guard(tmp_path, spec, "gpu-dev-02 mlx5_0").stdout.endswith("guard-passed\n")   # our standby SM
    assert sm_guard(tmp_path, spec, None).stdout.endswith("guard-passed\n")                  # no SM yet
    dev_data["fabric"]["infiniband"]["take_over_existing_sm"] = True
    taken = sm_guard(tmp_path, parse_spec(yaml.safe_dump(dev_data)), "ufm-01 HCA-1")
    assert taken.returncode == 0 and "taking over from the master subnet manager at lid 7" in taken.stdout


def test_infiniband_hosts_get_ipoib_children_and_the_primary_sm_the_top_priority(dev_data):
    spec = spec_for(dev_data, "infiniband-partitions")
    pool = spec.node_pools[0]
    apply = render_apply(spec, "gpu-dev-02", pool.nics, nccl_envs(spec)[pool.name])
    assert "ib_nic mlx5_0 ibp0s0 400\nipoib_child ibp0s0 0x8a01" in apply and "set_mtu \"$if\" 4092" in apply
    primary = render_fabric_host(spec, "gpu-dev-01", pool.nics, {}).create
    standby = render_fabric_host(spec, "gpu-dev-02", pool.nics, {}).create
    assert "sm_priority 15" in primary and "sm_priority 14" in standby


def test_link_checks_reach_hosts_as_the_program_does_through_the_bastion(dev_data, tmp_path):
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIIjPvsb1auu+FHfwP0boHL4g7PTUuBh+Kb48FXfnr632"
    dev_data["ssh"] = {"user": "ubuntu", "port": 2222, "bastion": {"host": "bastion.lab", "user": "jump",
                                                                   "host_key": key}}
    dev_data["node_pools"][0]["hosts"][1]["ssh_user"] = "ops"
    spec = parse_spec(yaml.safe_dump(dev_data))
    text = render_link_check(spec, spec.node_pools[0])
    # run the script's SSH set-up with an ssh that prints the configuration it would use
    fake = tmp_path / "ssh"
    fake.write_text("#!/usr/bin/env bash\nwhile [[ $1 == -* ]]; do [[ $1 == -F ]] && cfg=$2; shift 2; done\n"
                    "cat \"$cfg\"\necho \"TARGET $1\"\n"
                    "cat \"${cfg%/config}/known_hosts\"\n")
    fake.chmod(0o755)
    setup = text[:text.index("# check_link SERVER")] + "remote 10.10.0.12 true\n"
    out = subprocess.run(["bash", "-c", setup], capture_output=True, text=True,
                         env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert "Host 10.10.0.12\n  User ops\n  Port 2222\n  StrictHostKeyChecking yes\n  ProxyJump jump@bastion.lab:22" \
        in out.stdout
    assert "TARGET 10.10.0.12" in out.stdout and f"bastion.lab {key}" in out.stdout
    assert f"[10.10.0.11]:2222 {dev_data['node_pools'][0]['hosts'][0]['host_key']}" in out.stdout


def test_link_check_pairs_hosts_per_rail_with_the_threshold(dev_spec):
    text = render_link_check(dev_spec, dev_spec.node_pools[0])
    assert "launch gpu-dev-01 10.10.0.11 gpu-dev-02 10.10.0.12 mlx5_0 0 360" in text
    assert "launch gpu-dev-01 10.10.0.11 gpu-dev-02 10.10.0.12 mlx5_1 1 360" in text
    assert "--tclass=106" in text and "-p $((18515 + $6))" in text


@pytest.mark.parametrize("hosts", [2, 3, 4, 7, 128])
def test_link_tests_of_a_wave_never_share_a_host(hosts):
    names = [f"h{i:03d}" for i in range(hosts)]
    waves = link_waves(names)
    assert len(waves) <= 3 and sorted(p for w in waves for p in w) == sorted(_pairs(names))
    for wave in waves:
        members = [h for pair in wave for h in pair]
        assert len(members) == len(set(members))


def test_link_tests_run_together_and_every_result_is_judged(dev_data, tmp_path):
    """Four hosts, two rails: the script's own launcher runs a wave's tests at once (each host once per wave,
    rails on their own ports) and reports every line; one slow link fails the whole check."""
    dev_data["sites"][0]["racks"][0]["pdu_capacity_kw"] = 60        # room for two more hosts
    for i in (3, 4):
        dev_data["node_pools"][0]["hosts"].append({"hostname": f"gpu-dev-0{i}", "address": f"10.10.0.1{i}",
                                                   "rack": "r01"})
    dev_data["tenants"] = []
    spec = parse_spec(yaml.safe_dump(dev_data))
    text = render_link_check(spec, spec.node_pools[0])
    log = tmp_path / "log"
    fake = tmp_path / "ssh"         # the server side waits; the client prints perftest's row (slow on mlx5_1 of .14)
    fake.write_text(f"""#!/usr/bin/env bash
while [[ $1 == -* ]]; do shift 2; done
host=$1; cmd=$2
echo "$(date +%s.%N) $host $cmd" >> {log}
if [[ "$cmd" =~ 10[.]10[.]0[.][0-9]+$ ]]; then
  sleep 0.5
  bw=395.1; [[ $host == 10.10.0.14 && "$cmd" == *mlx5_1* ]] && bw=120.0
  echo " 1048576    5000    396.0    $bw    0.047"
else
  sleep 1
fi
""")
    fake.chmod(0o755)
    out = subprocess.run(["bash", "-c", text], capture_output=True, text=True,
                         env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert out.returncode == 1 and "some links are below 90% of line rate" in out.stderr
    lines = [line for line in out.stdout.splitlines() if " rail " in line]
    assert len(lines) == 8 and sum(": FAIL " in line for line in lines) == 1     # 4 pairs x 2 rails
    assert "FAIL rail 1 gpu-dev-04 -> gpu-dev-03 (mlx5_1): 120 Gb/s, below 360 Gb/s" in out.stdout
    ports = {re.search(r"-p (\d+)", line).group(1) for line in log.read_text().splitlines()}
    assert ports == {"18515", "18516"}


def test_nccl_job_runs_one_rank_per_gpu_and_fails_below_the_floor(dev_spec, dev_data):
    namespace, job = render_nccl_job(dev_spec, dev_spec.node_pools[0])
    assert namespace["kind"] == "Namespace" and job["kind"] == "MPIJob"
    workers = job["spec"]["mpiReplicaSpecs"]["Worker"]
    assert workers["replicas"] == 2 and job["spec"]["slotsPerWorker"] == 8
    limits = workers["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/gpu": 8, "rdma/rdma_shared_devices": 1}
    # The launcher runs on the pool's (tainted) nodes too: a cluster may have no untainted node for it.
    assert all(e["name"] != "NCCL_SOCKET_IFNAME" for e in workers["template"]["spec"]["containers"][0]["env"])
    launcher_pod = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    assert (launcher_pod["nodeSelector"], launcher_pod["tolerations"]) == \
        (workers["template"]["spec"]["nodeSelector"], workers["template"]["spec"]["tolerations"])
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"][2]
    assert "mpirun --allow-run-as-root -N 8 " in launcher and "-np" not in launcher and "f=85.0" in launcher
    assert nccl_floor_gb_per_s(dev_spec, dev_spec.node_pools[0]) == 85.0
    dev_data["fabric"]["checks"] = {"nccl_min_busbw_gb_per_s": 70}
    spec = parse_spec(yaml.safe_dump(dev_data))
    assert nccl_floor_gb_per_s(spec, spec.node_pools[0]) == 70


def test_nccl_job_fits_a_time_sliced_pool_and_skips_a_mig_pool(dev_data):
    """A time-sliced pool refuses a pod more than one slice: one rank per host, over the fastest NIC."""
    dev_data["node_pools"][0]["sharing"] = {"time_slicing_replicas": 4}
    dev_data["node_pools"][0]["nics"][1]["speed_gbps"] = 200
    spec = parse_spec(yaml.safe_dump(dev_data))
    _, job = render_nccl_job(spec, spec.node_pools[0])
    workers = job["spec"]["mpiReplicaSpecs"]["Worker"]
    assert job["spec"]["slotsPerWorker"] == 1
    assert workers["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu.shared"] == 1   # a renamed slice
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"][2]
    assert "-N 1 " in launcher and "f=42.5" in launcher          # one 400G NIC = 50 GB/s, 85%
    dev_data["node_pools"][0]["sharing"] = {"mig_config": "all-1g.10gb"}
    spec = parse_spec(yaml.safe_dump(dev_data))
    assert render_nccl_job(spec, spec.node_pools[0]) == []


def test_nccl_job_objects_are_valid_kubernetes(dev_spec):
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    namespace, _ = render_nccl_job(dev_spec, dev_spec.node_pools[0])
    kubernetes_validate.validate(namespace, dev_spec.kubernetes.version, strict=True)


# --- the component under mocks ------------------------------------------------------------------------------

def short(urn: str) -> str:
    return urn.rsplit("::", 1)[-1]


def test_what_bounces_links_is_left_to_the_preparation_only_on_hosts_a_pool_prepares(dev_spec, record):
    pool = dev_spec.node_pools[0]
    text = render_apply(dev_spec, "gpu-dev-01", pool.nics, nccl_envs(dev_spec)[pool.name])
    bouncing = re.findall(r'may_bounce "([^"]*)"', text)
    assert bouncing == ["$1: MTU ${mtu:-unknown} -> $2", "$if: trust ${trust:-unknown} -> dscp",
                        "$if: PFC ${pfc:-unknown} -> 00010000", "$if: global pause off"]
    assert "set_sysfs \"/sys/class/net/$if/ecn/$point/enable/3\" 1" in text      # ECN goes in place
    assert text.index("owe restart-fabric") > text.index("put_file /etc/nccl.conf")
    made = {}
    run = record(lambda: made.setdefault("fabric", Fabric("f", dev_spec, ssh_key(), gpu_hosts=False)))
    assert [short(r.urn) for r in run.records if "gpu-dev" in r.urn] == []      # their pool pushes them
    scripts = made["fabric"].host_scripts
    host, server = scripts["gpu-dev-01"].create, scripts["stor-dev-01"].create
    assert "\nrun_fabric in-place\n" in host and "\nrun_fabric all\n" in server


def test_one_script_per_host_and_managed_switch_keyed_by_name(dev_spec, record):
    run = record(lambda: Fabric("f", dev_spec, ssh_key()))
    fabric = next(r for r in run.records if r.type == Fabric.TYPE)
    children = sorted(short(r.urn) for r in run.records if r.parent == fabric.urn)
    assert children == ["f-gpu-dev-01", "f-gpu-dev-02", "f-leaf-dev-01", "f-stor-dev-01"]
    switch = next(r for r in run.records if short(r.urn) == "f-leaf-dev-01")
    assert switch.inputs["connection"] is not None and run.duplicates == []
    outputs = run.component_outputs[fabric.urn]
    assert set(outputs["checks"]) == {"links-h100.sh", "nccl-h100.yaml"}
    assert outputs["topology"]["leaves"]["leaf-dev-01"]["downlinks"] == 4


def test_infiniband_hosts_wait_for_the_subnet_managers(dev_data, record):
    infiniband(dev_data)
    dev_data["fabric"]["infiniband"]["subnet_managers"] = ["gpu-dev-01"]
    spec = parse_spec(yaml.safe_dump(dev_data))
    run = record(lambda: Fabric("f", spec, ssh_key()))
    by_name = {short(r.urn): r for r in run.records}
    assert by_name["f-gpu-dev-01"].urn in by_name["f-gpu-dev-02"].dependencies
    assert by_name["f-gpu-dev-01"].dependencies == []
    assert not any(r.type == "command:remote:Command" and "leaf" in short(r.urn) for r in run.records)


def test_unmanaged_switches_get_no_script(dev_data, record):
    dev_data["fabric"]["switches"][0]["managed"] = False
    spec = parse_spec(yaml.safe_dump(dev_data))
    run = record(lambda: Fabric("f", spec, ssh_key()))
    assert "f-leaf-dev-01" not in {short(r.urn) for r in run.records}


def test_an_ethernet_fabric_configures_no_host(dev_data, record):
    dev_data["fabric"] = {"kind": "ethernet"}
    dev_data["kubernetes"].pop("network_operator", None)
    spec = parse_spec(yaml.safe_dump(dev_data))
    assert fabric_hosts(spec) == []
    assert nccl_envs(spec)[spec.node_pools[0].name] == {"NCCL_IB_DISABLE": "1"}


# IBTA rate encodings (linux-rdma/opensm include/iba/ib_types.h IB_PATH_RECORD_RATE_*, as Gb/s); OpenSM lets a
# port join a multicast group only when the group's rate is not above the port's (osm_sa_mcmember_record.c,
# validate_port_caps with ib_path_compare_rates, which orders the codes by bandwidth).
IBTA_RATE_GBPS = {2: 2.5, 3: 10, 4: 30, 5: 5, 6: 20, 7: 40, 8: 60, 9: 80, 10: 120, 11: 14, 12: 56, 13: 112,
                  14: 168, 15: 25, 16: 100, 17: 200, 18: 300, 19: 28, 20: 50, 21: 400, 22: 600, 23: 800}


@pytest.mark.parametrize("server_gbps", [None, 56, 100, 200, 800])
def test_every_member_port_can_join_the_ipoib_groups(dev_data, server_gbps):
    """A storage server's HDR or FDR HCA on an NDR fabric: a group at the GPU NICs' rate would lock it out of
    IPoIB, and LNet with it. Omitted, the server's rate is taken as the slowest one."""
    if server_gbps is not None:
        dev_data["storage"]["servers"][0]["link_speed_gbps"] = server_gbps
    spec = spec_for(dev_data, "infiniband-partitions")
    members = [n.speed_gbps for p in spec.node_pools for n in p.nics]
    members += [s.link_speed_gbps or 40 for s in spec.storage.servers]
    for line in render_partitions(spec).splitlines()[1:]:
        rate = IBTA_RATE_GBPS[int(line.split("rate=")[1].split(" ")[0].rstrip(","))]
        assert all(rate <= port for port in members), (line, members)
        assert rate == min(members)          # and no slower than it must be


def test_storage_rdma_on_roce_puts_the_servers_and_a_hosts_own_storage_nic_in_the_lossless_class(dev_data):
    """BeeGFS over RDMA on RoCE: the servers' storage NIC gets the RoCE settings; a GPU host's storage NIC
    outside its rails too; the data plane registers the servers' settings for the QoS policies."""
    dev_data["storage"]["client_interface"] = "ens9f0np0"
    spec = parse_spec(yaml.safe_dump(dev_data))
    hosts = {h.hostname: h for h in fabric_hosts(spec)}
    assert hosts["stor-dev-01"].storage_interfaces == ["ens1f0np0"] and hosts["stor-dev-01"].nics == []
    assert hosts["gpu-dev-01"].storage_interfaces == ["ens9f0np0"]
    apply = render_apply(spec, "stor-dev-01", [], {}, ["ens1f0np0"])
    assert 'dev=$(rdma_dev ens1f0np0)\nroce_nic "$dev" ens1f0np0\n' in apply and NCCL_CONF not in apply
    assert data_plane(spec)["storage_servers"] == {"servers": 1, "mtu_bytes": 9000, "priority": 3, "dscp": 26,
                                                   "pfc_priorities": [3], "data_interfaces": ["ens1f0np0"]}


@pytest.mark.parametrize("variant", ["ethernet", "infiniband"])
def test_storage_off_roce_gets_no_roce_settings(dev_data, variant):
    """Without RDMA there is no lossless class to join; on InfiniBand the fabric is lossless by design."""
    if variant == "infiniband":
        infiniband(dev_data)
    else:
        dev_data["fabric"]["kind"] = "ethernet"
    spec = parse_spec(yaml.safe_dump(dev_data))
    assert all(not h.storage_interfaces for h in fabric_hosts(spec))
    assert "storage_servers" not in data_plane(spec)
