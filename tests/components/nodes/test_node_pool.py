"""GpuNodePool and the SSH machinery under mocks: names keyed by host, secret connections, triggers."""

from __future__ import annotations

import pulumi
import yaml

from components.nodes import GpuNodePool, NodePoolArgs
from components.nodes.node_pool import live_taints, node_taints, render_node_patch
from components.offline.recorder import EchoMocks
from components.offline.runner import run_offline
from components.offline.plan import build_plan
from components.spec import parse_spec
from components.offline.diff import diff_plans
from components.ssh import Script, SshTarget, as_command, digest, push, unwrap
from tests.conftest import ssh_key


def short(urn: str) -> str:
    return urn.rsplit("::", 1)[-1]


def pool_run(record, spec):
    return record(lambda: GpuNodePool("dev-h100", NodePoolArgs.from_spec(spec, spec.node_pools[0]), ssh_key()))


def test_each_hosts_resources_are_keyed_by_hostname(dev_spec, record):
    run = pool_run(record, dev_spec)
    pool = next(r for r in run.records if r.type == GpuNodePool.TYPE)
    children = sorted(short(r.urn) for r in run.records if r.parent == pool.urn)
    assert children == sorted([f"dev-h100-{h}-{role}" for h in ("gpu-dev-01", "gpu-dev-02")
                              for role in ("prepare", "burn-in", "node", "live", "drain", "roll", "uncordon",
                                           "deregister", "leave", "retire", "scripts")]
                              + ["dev-h100-rollout", "dev-h100-cluster", "dev-h100-gpu-dev-02-batch"])
    assert {r.kind for r in run.records if short(r.urn).endswith("-live")} == {"read"}


def test_connection_is_secret_and_pins_the_host_key(dev_spec, record):
    run = pool_run(record, dev_spec)
    prepare = next(r for r in run.records if short(r.urn) == "dev-h100-gpu-dev-01-prepare")
    conn = prepare.inputs["connection"]
    assert pulumi.runtime.rpc.is_rpc_secret(conn)
    value = pulumi.runtime.rpc.unwrap_rpc_secret(conn)
    assert value["host"] == "10.10.0.11" and value["user"] == "ubuntu"
    assert value["hostKey"] == dev_spec.node_pools[0].hosts[0].host_key
    assert "environment" not in prepare.inputs and prepare.inputs["addPreviousOutputInEnv"] is False
    assert prepare.options["deleteBeforeReplace"] is True
    assert prepare.inputs["create"].startswith("sudo -n /bin/bash -s <<'GPUCLUSTER_SCRIPT'\n#!/usr/bin/env bash")


def test_burn_in_follows_preparation_and_the_patch_follows_burn_in(dev_spec, record):
    urns = {short(r.urn): r for r in pool_run(record, dev_spec).records}
    assert urns["dev-h100-gpu-dev-01-prepare"].urn in urns["dev-h100-gpu-dev-01-burn-in"].dependencies
    assert urns["dev-h100-gpu-dev-01-burn-in"].urn in urns["dev-h100-gpu-dev-01-node"].dependencies
    patch = urns["dev-h100-gpu-dev-01-node"].inputs
    assert patch["metadata"]["name"] == "gpu-dev-01"
    assert patch["metadata"]["labels"]["gpucluster.io/pool"] == "h100"
    assert patch["metadata"]["labels"]["gpucluster.io/rack"] == "r01"
    assert patch["metadata"]["labels"]["gpucluster.io/rails"] == "2"
    assert patch["metadata"]["labels"]["gpucluster.io/rail-gbps"] == "400"


def test_a_gpu_hosts_fabric_settings_run_first_in_its_preparation_session(dev_spec, record):
    """In a whole cluster, a GPU host's fabric script is no command of its own: its preparation runs it first,
    in the same SSH session, and undoes it last; the node opens only after the burn-in that follows."""
    from components.cluster import GpuCluster
    urns = {short(r.urn): r for r in record(lambda: GpuCluster("dev", dev_spec, ssh_key())).records}
    assert not [n for n in urns if n.startswith("dev-fabric-gpu-")]
    for host, other in (("gpu-dev-01", "gpu-dev-02"), ("gpu-dev-02", "gpu-dev-01")):
        prepare = urns[f"dev-h100-{host}-prepare"].inputs
        create, delete = unwrap(prepare["create"]), unwrap(prepare["delete"])
        assert create.index(f"# Fabric of {host}") < create.index(f"# Prepare {host}") and other not in create
        assert delete.index(f"# Undo the preparation of {host}") < delete.index(f"# Undo the fabric setup of {host}")
        assert "update" not in prepare and "triggers" not in prepare    # converges: a fabric change is an update
        assert urns[f"dev-h100-{host}-burn-in"].urn in urns[f"dev-h100-{host}-node"].dependencies


def test_hosts_are_prepared_after_the_subnet_managers(record):
    """On InfiniBand the subnet managers' preparations (which start OpenSM) come first; every other host's
    waits for them, since its ports go Active only once an SM has swept the fabric."""
    from components.cluster import GpuCluster
    from components.spec import load_spec
    prod_spec = load_spec("stacks/prod.yaml")
    sms = prod_spec.fabric.infiniband.subnet_managers
    records = record(lambda: GpuCluster("prod", prod_spec, ssh_key())).records
    prepares = {short(r.urn).split("-", 2)[2].rsplit("-prepare", 1)[0]: r for r in records
                if short(r.urn).endswith("-prepare")}
    sm_urns = {prepares[h].urn for h in sms}
    for host, r in prepares.items():
        assert (set(r.dependencies) & sm_urns) == (set() if host in sms else sm_urns), host
    assert "sm_priority 15" in unwrap(prepares[sms[0]].inputs["create"])


def test_a_changed_preparation_or_burn_in_is_an_update_never_a_replacement(dev_data, record):
    """Host preparation converges from any earlier state, so a new script runs as an update and its delete (which
    restarts kubelet without the settings) never runs between versions. A changed burn-in is an update too: the
    script decides on each host whether it may run again (never next to tenants' pods)."""
    def plan(data):
        return build_plan(pool_run(record, parse_spec(yaml.safe_dump(data)))).document
    before = plan(dev_data)
    assert diff_plans(before, plan(dev_data)) == []
    dev_data["node_pools"][0]["tuning"]["shm_size_gib"] = 256
    dev_data["node_pools"][0]["burn_in"] = {"dcgm_level": 3}
    actions = {d.urn.split("::")[-1]: d.action for d in diff_plans(before, plan(dev_data)) if "command:" in d.urn}
    # the new parts copied to each host, the rollout's steps run again for the new preparation (each does
    # nothing where no restart is owed), and the pool's report, which reads the uncordons' output, as the
    # engine previews it
    assert actions == {**{f"dev-h100-{h}-{role}": "update" for h in ("gpu-dev-01", "gpu-dev-02")
                          for role in ("scripts", "prepare", "burn-in", "drain", "roll", "uncordon")},
                       "dev-h100-rollout": "update"}
    prepare = next(r for r in before["resources"] if r["urn"].endswith("gpu-dev-01-prepare"))
    assert "update" not in prepare["inputs"] and "triggers" not in prepare["inputs"]      # `create` runs again


def test_adding_a_host_changes_nothing_for_the_others(dev_data, record):
    def plan(data):
        spec = parse_spec(yaml.safe_dump(data))
        return {r["urn"]: r for r in build_plan(pool_run(record, spec)).document["resources"]
                if r["type"] != GpuNodePool.TYPE}
    before = plan(dev_data)
    dev_data["sites"][0]["racks"][0]["pdu_capacity_kw"] = 60
    dev_data["node_pools"][0]["hosts"].append({"hostname": "gpu-dev-03", "address": "10.10.0.13", "rack": "r01"})
    after = plan(dev_data)
    # the pool's rollout report alone: it waits for every host's uncordon
    assert {u.rsplit("::", 1)[1] for u in before if before[u] != after.get(u)} == {"dev-h100-rollout"}
    # its scripts' copy, prepare, burn-in, the node's patch and its live read, the rollout's drain, roll and
    # uncordon, and what retires it: deregister, leave, retire; and, a batch of its own, the point before it
    assert len(after) - len(before) == 12 and any(u.endswith("::dev-h100-gpu-dev-03-batch") for u in after)


def test_a_failed_burn_in_quarantines_the_node_and_says_why(dev_spec):
    args = NodePoolArgs.from_spec(dev_spec, dev_spec.node_pools[0])
    host = dev_spec.node_pools[0].hosts[0]
    failed = render_node_patch(args, host, (False, "failed: dcgmi diag -r 2 failed"))
    assert failed["spec"]["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
                                        {"key": "gpucluster.io/burn-in", "value": "failed", "effect": "NoSchedule"}]
    assert failed["metadata"]["annotations"]["gpucluster.io/burn-in"] == "failed: dcgmi diag -r 2 failed"
    passed = render_node_patch(args, host, (True, "passed"))
    assert passed["spec"]["taints"] == node_taints(dev_spec.node_pools[0], None)
    assert passed["metadata"]["annotations"]["pulumi.com/patchForce"] == "true"


def test_a_bastion_becomes_a_pinned_proxy(record):
    from components.spec.hardware import Bastion
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIIjPvsb1auu+FHfwP0boHL4g7PTUuBh+Kb48FXfnr632"
    target = SshTarget("10.0.0.5", "admin", 22, None, Bastion(host="bastion.example.com", host_key=key))

    def program():
        push("h-x", target, Script("echo hi"), ssh_key(), parent=None)
    (cmd,) = [r for r in record(program).records if r.type == "command:remote:Command"]
    proxy = pulumi.runtime.rpc.unwrap_rpc_secret(cmd.inputs["connection"])["proxy"]
    assert proxy["host"] == "bastion.example.com" and proxy["hostKey"] == key
    assert cmd.options["deleteBeforeReplace"] is False       # nothing to undo, so plain replacement


def test_commands_wrap_scripts_reversibly():
    text = "#!/usr/bin/env bash\necho 'x'\n"
    assert unwrap(as_command(text, "root")) == text and unwrap(as_command(text, "ubuntu")) == text
    assert as_command(text, "root").startswith("/bin/bash -s <<'GPUCLUSTER_SCRIPT'")
    assert digest(Script("a", "b")) != digest(Script("a", None))


def test_a_node_opens_to_work_only_once_its_filesystem_client_has_mounted(dev_spec, record):
    """The client is set up after the host's preparation, yet the Node patch (which lifts the burn-in taint)
    waits for it: a pod scheduled there finds its tenant directory mounted."""
    from components.cluster import GpuCluster
    urns = {short(r.urn): r for r in record(lambda: GpuCluster("dev", dev_spec, ssh_key())).records}
    for host in ("gpu-dev-01", "gpu-dev-02"):
        client = urns[f"dev-storage-{host}"]
        assert urns[f"dev-h100-{host}-prepare"].urn in client.dependencies
        assert client.urn in urns[f"dev-h100-{host}-node"].dependencies
        assert urns[f"dev-h100-{host}-burn-in"].urn in urns[f"dev-h100-{host}-node"].dependencies


PEOPLES = {"key": "example.com/maintenance", "value": "disk", "effect": "NoSchedule"}
NOT_READY = {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute", "timeAdded": "2026-11-24T03:00:00Z"}


def test_taints_of_keys_the_library_does_not_manage_are_kept(dev_spec):
    pool = dev_spec.node_pools[0]                 # the pool's own: nvidia.com/gpu
    stale = [{"key": "nvidia.com/gpu", "value": "old", "effect": "NoExecute"},
             {"key": "gpucluster.io/burn-in", "value": "pending", "effect": "NoSchedule"}]
    assert node_taints(pool, (True, "passed"), [PEOPLES, *stale, NOT_READY]) == [
        PEOPLES, NOT_READY, {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]


def test_a_taint_key_dropped_from_the_spec_is_removed_not_adopted(dev_spec):
    """The node's annotation names what the last apply managed, so a removed pool taint goes with it."""
    pool = dev_spec.node_pools[0]
    dropped = {"key": "example.com/old-pool-taint", "value": "x", "effect": "NoSchedule"}
    assert dropped not in node_taints(pool, None, [dropped], managed_before=["example.com/old-pool-taint"])
    assert dropped in node_taints(pool, None, [dropped])


class LiveNode(EchoMocks):
    """A Node read from the cluster with a person's and the node controller's taints on it."""

    def new_resource(self, args):
        if args.typ == "kubernetes:core/v1:Node":
            return args.resource_id, {"metadata": {"name": args.resource_id, "annotations": {
                "gpucluster.io/managed-taints": "example.com/old-pool-taint,nvidia.com/gpu"}},
                "spec": {"taints": [PEOPLES, NOT_READY, {"key": "example.com/old-pool-taint", "effect": "NoSchedule"}]}}
        return super().new_resource(args)


def test_the_patch_carries_the_live_taints_read_after_the_burn_in(dev_data):
    dev_data["node_pools"][0]["burn_in"] = {"enabled": False}
    spec = parse_spec(yaml.safe_dump(dev_data))
    run = run_offline(lambda: GpuNodePool("dev-h100", NodePoolArgs.from_spec(spec, spec.node_pools[0]), ssh_key()),
                      project="gpucluster", stack="test", mocks=LiveNode())
    urns = {short(r.urn): r for r in run.records}
    live, patch = urns["dev-h100-gpu-dev-01-live"], urns["dev-h100-gpu-dev-01-node"]
    assert urns["dev-h100-gpu-dev-01-prepare"].urn in live.dependencies and live.urn in patch.dependencies
    assert patch.inputs["spec"]["taints"] == [PEOPLES, NOT_READY,
                                              {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    assert patch.inputs["metadata"]["annotations"]["gpucluster.io/managed-taints"] == \
        "gpucluster.io/burn-in,nvidia.com/gpu"


def test_live_taints_read_typed_outputs_as_the_engine_hands_them():
    from pulumi_kubernetes.core.v1.outputs import NodeSpec, Taint
    spec = NodeSpec(taints=[Taint(key="a", effect="NoExecute", time_added="2026-11-24T03:00:00Z"),
                            Taint(key="b", effect="NoSchedule", value="v")])
    assert live_taints(spec) == [{"key": "a", "effect": "NoExecute", "timeAdded": "2026-11-24T03:00:00Z"},
                                 {"key": "b", "effect": "NoSchedule", "value": "v"}]
    assert live_taints(None) == [] and live_taints({"taints": [NOT_READY]}) == [NOT_READY]
    assert live_taints({"taints": [{**PEOPLES, "time_added": "t"}]}) == [{**PEOPLES, "timeAdded": "t"}]
