"""Fabric: the data plane configured on hosts and switches from one spec, so both ends agree by construction.

Each host with data-plane NICs or a subnet manager gets one script (NIC settings, boot unit, /etc/nccl.conf,
OpenSM on SM hosts), rendered once per plan (`host_scripts`). Standalone, the component pushes it as
`<name>-<hostname>`; in a GpuCluster a GPU host runs it in the same SSH session as its preparation, and the
component pushes only the others (storage servers that run an SM). `<name>-<switch>` per managed RoCE switch.
On InfiniBand, every other host waits for the subnet managers, whose sweep makes ports Active.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import pulumi

from ..k8s.images import through_mirror
from ..spec import ClusterSpec, NodePool
from ..spec.hardware import Nic
from ..spec.topology import plan_topology
from ..ssh import Script, SshTarget, push
from ..yamltext import to_yaml_all
from ..types import token, with_aliases
from .checks import render_link_check, render_nccl_batch, render_nccl_job
from .host import render_fabric_host
from .nccl import nccl_envs
from .partitions import FabricPartitions
from .vlans import FabricVlans
from .switches import render_switch, switch_mtu_bytes, switch_target


class FabricHost(NamedTuple):
    hostname: str
    target: SshTarget
    nics: list[Nic]
    nccl: dict[str, str]
    storage_interfaces: list[str]      # RoCE NICs of the filesystem's RDMA traffic outside `nics`


def storage_roce_interfaces(spec: ClusterSpec, pool: NodePool | None) -> list[str]:
    """The NIC a host's filesystem RDMA traffic crosses when it is not one of its rails (a server's storage
    NIC, a GPU host's own storage NIC): on RoCE it needs the lossless class as much as NCCL's rails do."""
    if spec.fabric.effective_roce is None or not spec.storage_rdma:
        return []
    if pool is None:
        return [spec.storage.server_interface] if spec.storage.server_interface else []
    interface = spec.storage_client_interface(pool)
    return [interface] if interface and interface not in {n.interface for n in pool.nics} else []


def fabric_hosts(spec: ClusterSpec) -> list[FabricHost]:
    """Every host the fabric configures (GPU hosts' rails, storage servers' RoCE NICs, subnet managers);
    subnet managers first."""
    ssh = spec.ssh
    sms = spec.fabric.subnet_managers
    out = []
    if spec.fabric.rdma:
        envs = nccl_envs(spec)
        for pool, host in spec.hosts():
            storage = storage_roce_interfaces(spec, pool)
            if pool.nics or storage or host.hostname in sms:
                target = SshTarget(host.address, host.ssh_user or ssh.user, host.ssh_port or ssh.port, host.host_key,
                                   ssh.bastion)
                out.append(FabricHost(host.hostname, target, list(pool.nics), envs[pool.name], storage))
        server_storage = storage_roce_interfaces(spec, None)
        for server in spec.storage.servers:
            if server.hostname in sms or server_storage:
                out.append(FabricHost(server.hostname, SshTarget(server.address, ssh.user, ssh.port, server.host_key,
                                                                 ssh.bastion), [], {}, server_storage))
    return sorted(out, key=lambda h: (h.hostname not in sms, sms.index(h.hostname) if h.hostname in sms else 0))


def host_script(spec: ClusterSpec, host: FabricHost, *, in_place: bool) -> Script:
    """A host's fabric script; `in_place`: run in its pool's preparation, which restarts what bounces links
    only where no tenant works."""
    return render_fabric_host(spec, host.hostname, host.nics, host.nccl, host.storage_interfaces, in_place=in_place)


def data_plane(spec: ClusterSpec) -> dict[str, Any]:
    """What the fabric sets on each pool's hosts and each managed switch, registered so policies can check
    that hosts, switches and NCCL agree across the whole stack (per pool: its hosts share every setting)."""
    fabric = spec.fabric
    roce = fabric.effective_roce
    qos = {} if roce is None else {"priority": roce.priority, "dscp": roce.dscp,
                                   "pfc_priorities": list(roce.pfc_priorities)}
    pools = {p.name: {"hosts": len(p.hosts), "mtu_bytes": fabric.effective_mtu_bytes, **qos,
                      "data_interfaces": [n.interface for n in p.nics],
                      "control_interface": p.control_interface or fabric.control_interface}
             for p in spec.node_pools if fabric.rdma and p.nics}
    switches = {s.name: {"mtu_bytes": switch_mtu_bytes(s), **qos} for s in fabric.switches
                if fabric.kind == "rocev2" and s.managed}
    storage = {"servers": len(spec.storage.servers), "mtu_bytes": fabric.effective_mtu_bytes, **qos,
               "data_interfaces": storage_roce_interfaces(spec, None)} \
        if storage_roce_interfaces(spec, None) and spec.storage.servers else None
    return {"kind": fabric.kind, "pools": pools, "switches": switches,
            **({"storage_servers": storage} if storage else {})}


def render_checks(spec: ClusterSpec) -> dict[str, str]:
    """File name -> content of the after-apply checks."""
    out: dict[str, str] = {}
    for pool in spec.node_pools:
        links = render_link_check(spec, pool)
        if links:
            out[f"links-{pool.name}.sh"] = links
        if pool.name in spec.kubernetes.slurm.pools:          # Slurm holds its GPUs: its own batch job
            batch = render_nccl_batch(spec, pool)
            if batch:
                out[f"nccl-{pool.name}.sbatch"] = batch
        elif job := render_nccl_job(spec, pool):
            out[f"nccl-{pool.name}.yaml"] = to_yaml_all(through_mirror(job, spec))
    return out


class Fabric(pulumi.ComponentResource):
    TYPE: ClassVar[str] = token("Fabric")

    topology: dict[str, Any]
    """Rail-optimized or not, bisection bandwidth, and per leaf its links and oversubscription."""
    nccl_env: dict[str, dict[str, str]]
    """NCCL settings per node pool (also in /etc/nccl.conf on its hosts), for job templates."""
    data_plane: dict[str, Any]
    """MTU, RoCE priority, DSCP and PFC per pool's hosts and per managed switch; data and control interfaces."""
    checks: dict[str, str]
    """Scripts and job specs to run after `pulumi up` (ib_write_bw per rail, multi-node all_reduce_perf)."""
    host_scripts: dict[str, Script]
    """The fabric script of each host, by hostname, subnet managers first."""
    host_commands: dict[str, pulumi.Resource]
    """The commands this component pushed the host scripts with, by hostname."""
    subnet_managers: list[pulumi.Resource]
    """The commands that start subnet managers here (other hosts' settings wait for them)."""
    partitions: FabricPartitions | None
    """The isolated tenants' partitions, where this component pushes their hosts' steps itself (gpu_hosts)."""
    switch_commands: dict[str, pulumi.Resource]
    """The commands that push the managed switches' settings, by switch name."""
    vlans: FabricVlans | None
    """The isolated tenants' RoCE VLANs, where this component pushes the hosts' steps itself (gpu_hosts)."""

    def __init__(self, name: str, spec: ClusterSpec, ssh_private_key: pulumi.Input[str],
                 opts: pulumi.ResourceOptions | None = None, *, gpu_hosts: bool = True):
        """`gpu_hosts`: push the node pools' hosts' scripts too. False: whoever prepares those hosts runs
        `host_scripts` in the same session (GpuCluster's node pools do), one SSH session fewer per host, and
        applies what bounces links (MTU, trust, PFC) where no tenant works, or leaves it to the pool's rollout."""
        super().__init__(self.TYPE, name, intent(spec), with_aliases(self.TYPE, opts))
        compose(self, name, spec, ssh_private_key, gpu_hosts=gpu_hosts)


def intent(spec: ClusterSpec) -> dict[str, Any]:
    """A Fabric's registered inputs: the spec's fabric, for policies."""
    return {"spec": spec.fabric.model_dump(mode="json")}


def compose(fabric: Any, name: str, spec: ClusterSpec, ssh_private_key: pulumi.Input[str], *,
            gpu_hosts: bool) -> None:
    """A Fabric's children and outputs, under `fabric`: a Fabric, or the component provider's (provider.py)."""
    fabric.topology = plan_topology(spec)[0].summary({h.hostname: p.name for p, h in spec.hosts()})
    fabric.data_plane = data_plane(spec)
    fabric.nccl_env = nccl_envs(spec)
    fabric.checks = render_checks(spec)
    sms = set(spec.fabric.subnet_managers)
    pooled = {h.hostname for _, h in spec.hosts()}
    fabric.host_scripts, fabric.host_commands, fabric.subnet_managers = {}, {}, []
    hosts = fabric_hosts(spec)
    for host in hosts:
        hostname = host.hostname
        prepared_here = hostname in pooled and not gpu_hosts     # by its pool, which pays restart-fabric
        fabric.host_scripts[hostname] = host_script(spec, host, in_place=prepared_here)
        if prepared_here:
            continue
        resource = push(f"{name}-{hostname}", host.target, fabric.host_scripts[hostname], ssh_private_key,
                        parent=fabric, depends_on=[] if hostname in sms else fabric.subnet_managers)
        if hostname in sms:
            fabric.subnet_managers.append(resource)
        fabric.host_commands[hostname] = resource
    # Standalone, the hosts' own steps report their port GUIDs here; in a GpuCluster, their pools' preparations.
    fabric.partitions = None
    isolated = [h for h in spec.partitioned_hosts if h in fabric.host_commands]
    if isolated:
        fabric.partitions = FabricPartitions(
            f"{name}-partitions", spec, {h.hostname: h.target for h in hosts},
            {h: fabric.host_commands[h].stdout for h in isolated}, ssh_private_key,
            opts=pulumi.ResourceOptions(parent=fabric),
            depends_on=[*fabric.subnet_managers, *(fabric.host_commands[h] for h in isolated)])
    fabric.switch_commands = {}
    if spec.fabric.kind == "rocev2":
        for switch in spec.fabric.switches:
            if switch.managed:
                fabric.switch_commands[switch.name] = push(
                    f"{name}-{switch.name}", switch_target(switch, spec.ssh.bastion),
                    render_switch(switch, spec.fabric), ssh_private_key, parent=fabric)
    # Standalone, the tenants' VLANs follow the switches' own settings (one NVUE or EOS session at a time); in a
    # GpuCluster, they also wait for the drain of the Nodes whose ports move (nodes/handover.py).
    fabric.vlans = None
    if gpu_hosts and spec.vlan_pools:
        fabric.vlans = FabricVlans(f"{name}-vlans", spec, ssh_private_key, opts=pulumi.ResourceOptions(parent=fabric),
                                   depends_on=list(fabric.switch_commands.values()))
    fabric.register_outputs({**intent(spec), "topology": fabric.topology, "data_plane": fabric.data_plane,
                             "nccl_env": fabric.nccl_env, "checks": fabric.checks})
