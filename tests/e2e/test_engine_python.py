"""The project's own `__main__.py` under the real Pulumi engine: the CLI, the Python language host and the real
Kubernetes provider (all built from Go modules by `make engine-e2e`), against the e2e control plane and real SSH
test hosts, with a file backend.

What stands in, and why (the README says the same):
- pulumi-command: the module proxy refuses every version of its provider. tests/e2e/commands.py implements its
  three resources as it documents them and really runs the commands and copies: remote ones over OpenSSH on the test hosts
  (network namespaces with hardware doubles, tests/realssh), local ones (kubectl drains) here.
- pulumi-random: its provider is a Terraform bridge the proxy does not serve; the echo provider answers for it.
- Charts: none of the stack's four is served here. Each is a chart of the same name in the project carrying only
  the upstream CRDs it would install (`STAND_IN_CHARTS`, with the reason), so Helm really installs a release and
  the objects that need those CRDs apply through the provider. Kueue itself runs in the control plane, built
  from its pinned module. The network operator is left out of this stack (`network_operator.enabled: false`):
  neither its chart nor nv-ipam's IPPool CRD is served here.
- Hosts and switches are the real SSH test hosts under their spec names, with their own addresses and host keys;
  the spec is dev's otherwise.

Needs root (network namespaces) and the tools of `make e2e-tools` and `make engine-e2e`; skips, saying why,
without them (fails under GPUCLUSTER_ENGINE_E2E=1).
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import grpc
import pytest
import yaml

from components.fabric.nccl import NCCL_CONF
from components.k8s.health.checks import NAMESPACE as HEALTH_CHECKS, cronjob_name
from components.nodes.handover import HANDOVER_MARK, PARTITION_MARK
from components.nodes.retire import POOL_FILE
from components.nodes.rollout import ROLLOUT_TAINT
from components.offline.diff import diff_plans, load_plan
from components.spec import load_spec, parse_spec
from components.storage.scripts import BEEGFS_AUTH
from tests.conftest import ROOT
from tests.doubles import SWITCH_CLIS
from tests.realssh.doubles import STATE_DIR
from tests.realssh.hosts import TestHosts, unavailable
from tests.realssh.storage_host import beegfs_client_installed, beegfs_client_module, storage_host
from tests.realssh.test_driver_stack import driver_repo
from tests.realssh.test_fabric_scripts import mtu

from .commands import CommandProvider
from .conftest import Cluster, wait_for
from .controlplane import ControlPlane, ControlPlaneError, missing_tools
from .engine import PLUGINS, Engine, serve, serve_echo
from .stack import PINNED_CRDS, SHARED_CRDS, StackPlan, external_crds, kwok_nodes, plan_stack

pytestmark = pytest.mark.e2e

TOOLS = Path(os.environ.get("GPUCLUSTER_E2E_TOOLS", ROOT / ".e2e")) / "bin"
ENGINE = ("pulumi", "pulumi-language-python", "pulumi-language-python-exec", "pulumi-resource-kubernetes")
REQUIRED = os.environ.get("GPUCLUSTER_ENGINE_E2E") == "1"
# The stacks applied on their own machines: all three in `make engine-e2e`; CI's hour holds dev's alone (.ci/run).
STACKS = os.environ.get("GPUCLUSTER_ENGINE_STACKS", "dev,staging,prod,isolated").split(",")
SOURCES = {"isolated": ROOT / "examples" / "isolated-tenants.yaml"}      # stacks whose spec is an example
# Charts that cannot be had here, each stood in for by a chart of its name carrying the upstream CRDs it installs.
STAND_IN_CHARTS = {
    "gpu_operator": ("gpu-operator", "NVIDIA's gpu-operator module is not served", ["nvidia.com_*.yaml"]),
    "nfd": ("node-feature-discovery", "its chart's workloads need a schedulable CPU node the KWOK cluster lacks",
            ["nfd.k8s-sigs.io_*.yaml"]),
    "kueue": ("kueue", "Kueue runs in the control plane from its pinned module (a second one would fight it for "
                       "its webhooks)", []),
}


def _missing() -> str | None:
    lacking = [t for t in ENGINE if not (TOOLS / t).exists()]
    if lacking:
        return f"the engine's tools are not built in {TOOLS} ({', '.join(lacking)}): `make engine-e2e` builds them"
    if missing_tools():
        return f"control-plane tools missing ({', '.join(missing_tools())}): `make e2e-tools`"
    return unavailable()


def engine_spec(spec: dict[str, Any], hosts: TestHosts, devices: dict[str, str],
                mirror: Path | None = None) -> dict[str, Any]:
    """A stack's spec on the test hosts, its storage targets on `devices` (loop devices by the spec's device
    path), the GPU hosts' driver stack from `mirror` (the site's mirror: a flat apt repository) where it pins
    one, with the charts and CRDs it pulls taken from the project."""
    data = vendored(spec)
    for server in data["storage"]["servers"]:
        for target in server["targets"]:
            target["device"] = devices[target["device"]]
    data["ssh"]["user"] = "root"
    for machine in _machines(data):      # each pinned as the stack pins it
        host = hosts.hosts[machine.get("hostname") or machine["name"]]
        machine.update(address=host.address, **({"host_key": host.host_key} if "host_key" in machine else {}))
    for switch in _managed(data):        # the test hosts let root alone in
        switch["ssh_user"] = "root"
    for pool in data["node_pools"]:
        if mirror and (pool.get("software") or {}).get("package_repositories"):
            pool["software"]["package_repositories"] = [{"os_family": "debian", "url": f"file://{mirror}"}]
    return data


def _managed(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The switches the stack configures over SSH (an unmanaged one is only cabled to)."""
    return [s for s in spec["fabric"]["switches"] if s.get("managed", True)]


def _machines(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Every machine of a spec reached over SSH: GPU hosts, storage servers, managed switches."""
    return [*(h for p in spec["node_pools"] for h in p["hosts"]), *spec["storage"]["servers"], *_managed(spec)]


def site_hosts(spec: dict[str, Any], work: Path) -> TestHosts:
    """Test hosts (not started) under the names of a stack's machines: GPU hosts with their pool's NICs,
    storage servers with their RDMA NIC, on the fabric's link layer."""
    storage = spec["storage"]
    layer = ("InfiniBand",) if spec["fabric"]["kind"] == "infiniband" else ()
    nics = {h["hostname"]: tuple((n["device"], n["interface"], *layer) for n in p["nics"])
            for p in spec["node_pools"] for h in p["hosts"]}
    if storage.get("server_interface"):
        nics.update((s["hostname"], (("mlx5_0", storage["server_interface"], *layer),)) for s in storage["servers"])
    client = storage.get("client_interface")
    if client and layer:                # a storage HCA beside the rails
        nics = {h: (*n, ("mlx5_8", client, *layer)) if client not in {i for _, i, *_ in n} else n
                for h, n in nics.items()}
    (work / "hosts").mkdir(parents=True)
    return TestHosts(work / "hosts", [m.get("hostname") or m["name"] for m in _machines(spec)], nics)


def site(hosts: TestHosts, spec: dict[str, Any], work: Path, loops: list[str]) -> dict[str, str]:
    """`hosts` started as a site's machines are before its first `pulumi up`: GPU hosts with the filesystem
    client's packages (and apt able to install from the site's mirror), storage servers with their packages,
    data-plane address and empty disks (loop devices, appended to `loops`; returned by the spec's device path),
    switches with their network OS. The caller stops the hosts and detaches the loops, also when this fails
    half-way."""
    storage = spec["storage"]
    parsed = parse_spec(yaml.safe_dump(spec))
    beegfs = storage.get("version", "7.4") if storage["kind"] == "beegfs" else "7.4"
    net = parsed.storage_lnet if storage["kind"] == "lustre" else "tcp"
    servers = [s["hostname"] for s in storage["servers"]]
    gpu_hosts = [h["hostname"] for p in spec["node_pools"] for h in p["hosts"]]
    hosts.start()
    for switch in _managed(spec):
        network_os(hosts.hosts[switch["name"]], switch["vendor"])
    for name in gpu_hosts:
        h = hosts.hosts[name]
        storage_host(h, beegfs, nid=f"{h.address}@{net}")
        h.put("/etc/apt/apt.conf.d/99sandbox", 'APT::Sandbox::User "root";\n')  # _apt cannot write the overlay
    for server in parsed.storage.servers:
        h = hosts.hosts[server.hostname]
        storage_host(h, beegfs, nid=f"{server.data_address or h.address}@{net}")
        if server.data_address and storage.get("server_interface"):       # the site's addressing
            subprocess.run(["ip", "netns", "exec", h.netns, "ip", "addr", "add",
                            f"{server.data_address}/24", "dev", storage["server_interface"]], check=True)
    if storage["kind"] == "beegfs":
        for server in servers:             # the servers' packages are installed, the licence in place
            hosts.hosts[server].sh("mkdir -p /opt/beegfs/lib && touch /opt/beegfs/lib/libbeegfs_ib.so")
            if storage.get("license_file"):
                hosts.hosts[server].put(storage["license_file"], "-----BEGIN CERTIFICATE-----\n(site licence)\n")
        manager = hosts.hosts[servers[0]]
        for name in gpu_hosts:             # ... and the clients' on the GPU hosts
            beegfs_client_installed(hosts.hosts[name], beegfs, storage["mount_point"])
            beegfs_client_module(hosts.hosts[name], manager.name, manager.address)
    return {t["device"]: loop_device(work / "disks", loops) for s in storage["servers"] for t in s["targets"]}


def vendored(spec: dict[str, Any]) -> dict[str, Any]:
    """A stack's spec with the charts and CRDs it would pull taken from the project (make_project's), as an
    air-gapped site vendors them, and without the network operator (see the module docstring)."""
    data = copy.deepcopy(spec)
    k8s = data.setdefault("kubernetes", {})
    for field, (name, _, _) in STAND_IN_CHARTS.items():
        k8s[field] = {**{k: v for k, v in (k8s.get(field) or {}).items() if k != "chart_repository"},
                      "chart_path": f"charts/{name}"}
    k8s["network_operator"] = {"enabled": False}
    for settings, crd in ((k8s.setdefault("mpi_operator", {}), "kubeflow.org_mpijobs.yaml"),
                          (k8s.setdefault("health", {}).setdefault("quarantine", {}),
                           "readiness.node.x-k8s.io_nodereadinessrules.yaml")):
        settings.pop("crd_url", None)
        settings["crd_path"] = f"crds/{crd}"
    return data


def make_project(project: Path, spec: dict[str, Any]) -> None:
    project.mkdir(parents=True)
    for name in ("Pulumi.yaml", "__main__.py"):
        shutil.copy(ROOT / name, project / name)
    (project / "policies").symlink_to(ROOT / "policies")
    (project / "stacks").mkdir()
    (project / "stacks" / "dev.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    for field, (name, reason, crds) in STAND_IN_CHARTS.items():
        chart = project / "charts" / name
        (chart / "crds").mkdir(parents=True)
        (chart / "Chart.yaml").write_text(yaml.safe_dump({
            "apiVersion": "v2", "name": name, "version": "0.0.0-standin",
            "description": f"Stands in for the {name} chart in the engine e2e: {reason}."}))
        for pattern in crds:
            for crd in SHARED_CRDS.glob(pattern):
                shutil.copy(crd, chart / "crds" / crd.name)
    (project / "crds").mkdir()
    shutil.copy(TOOLS.parent / "mpi-operator-crds" / "kubeflow.org_mpijobs.yaml", project / "crds")
    shutil.copy(PINNED_CRDS / "readiness.node.x-k8s.io_nodereadinessrules.yaml", project / "crds")


def loop_device(disks: Path, made: list[str]) -> str:
    """An empty block device (a loop device over a sparse file), as a new storage target is."""
    disks.mkdir(exist_ok=True)
    image = disks / f"disk{len(made)}.img"
    subprocess.run(["truncate", "-s", "64M", str(image)], check=True)
    made.append(subprocess.run(["losetup", "-f", "--show", str(image)], check=True, capture_output=True,
                               text=True).stdout.strip())
    return made[-1]


# Each network OS's CLI on a test host standing in for a switch (recording doubles: no switch here).
SWITCH_CLI = {"cumulus": "nv", "sonic": "config", "eos": "FastCli"}
SWITCH_STATE = "/var/lib/switch-double/state.json"


def network_os(host: Any, vendor: str) -> None:
    cli = SWITCH_CLI[vendor]
    host.put(f"/usr/local/bin/{cli}", SWITCH_CLIS[cli].replace("os.environ['SWITCH_STATE']", repr(SWITCH_STATE)))
    host.sh(f"chmod 0755 /usr/local/bin/{cli}")
    host.put(SWITCH_STATE, json.dumps({"running": [], "saved": []}))


def registered(node: dict[str, Any]) -> dict[str, Any]:
    """A KWOK node as its kubelet registers it, before the pool's patch: the kubelet's own labels only."""
    labels = {k: v for k, v in node["metadata"]["labels"].items()
              if k in ("kubernetes.io/hostname", "kubernetes.io/os", "type")}
    return {**node, "metadata": {"name": node["metadata"]["name"], "labels": labels,
                                 "annotations": {"kwok.x-k8s.io/node": "fake"}}, "spec": {}}


@dataclass
class World:
    work: Path
    project: Path
    engine: Engine
    cp: ControlPlane
    hosts: TestHosts
    commands: CommandProvider
    plan: StackPlan
    devices: list[str]             # the storage targets' loop devices, in the spec's order


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    why = _missing()
    if why:
        pytest.fail(why) if REQUIRED else pytest.skip(why)
    work = tmp_path_factory.mktemp("engine-python")
    dev = yaml.safe_load((ROOT / "stacks" / "dev.yaml").read_text())
    servers: list[grpc.Server] = []
    loops: list[str] = []
    cp: ControlPlane | None = None
    hosts = site_hosts(dev, work)
    try:
        devices = site(hosts, dev, work, loops)
        project = work / "project"
        make_project(project, engine_spec(dev, hosts, devices))
        plan = plan_stack(project / "stacks" / "dev.yaml", work / "plan")
        cp = ControlPlane(plan.kueue_config(), work / "cp").start()
        cp.apply_files(p for p in external_crds() if "readiness" not in p.name)
        cp.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
        cp.kubectl("create", "namespace", plan.spec.kubernetes.monitoring.namespace)
        cp.apply_objects([{"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                           "metadata": {"name": plan.spec.kubernetes.health.gpu_monitor.runtime_class},
                           "handler": "nvidia"}])
        cp.apply_objects([registered(n) for n in kwok_nodes(plan.spec)])
        commands = CommandProvider(PLUGINS["command"], project)
        server, port = serve(commands)
        servers.append(server)
        random_server, random_port, _ = serve_echo(PLUGINS["random"])
        servers.append(random_server)
        engine = Engine(TOOLS, work, project, {"command": port, "random": random_port})
        engine("stack", "init", "dev")
        engine("config", "set", "--secret", "sshPrivateKey", input=hosts.client_key.read_text())
        engine("config", "set", "--secret", "kubernetes:kubeconfig", input=cp.kubeconfig.read_text())
        yield World(work, project, engine, cp, hosts, commands, plan, list(devices.values()))
    finally:
        for s in servers:
            s.stop(0)
        if cp is not None:
            cp.close()
        _stop(hosts, loops)


def _stop(hosts: TestHosts, loops: list[str]) -> None:
    hosts.stop()
    for device in loops:
        subprocess.run(["losetup", "-d", device], check=False)


def _urns(resources: Iterable[dict[str, Any]]) -> set[str]:
    """The program's resources: neither the stack nor the providers."""
    return {r["urn"] for r in resources if not r["type"].startswith(("pulumi:providers:", "pulumi:pulumi:Stack"))}


def _state(engine: Engine, stack: str | None = None) -> list[dict[str, Any]]:
    """The resources in a stack's state: the selected stack's, or `stack`'s."""
    return json.loads(engine("stack", "export", *(("--stack", stack) if stack else ())))["deployment"].get(
        "resources") or []


def _steps(preview_json: str) -> dict[str, str]:
    """What a `preview --json` would do, by resource name: create, update, replace, delete (same and read left
    out; a replacement's own create and delete steps folded into it)."""
    ops = {"create-replacement": "replace", "delete-replaced": "replace", "replace": "replace",
           "create": "create", "update": "update", "delete": "delete"}
    return {step["urn"].rsplit("::", 1)[-1]: ops[step["op"]] for step in json.loads(preview_json).get("steps", [])
            if step["op"] in ops}


def test_up_builds_what_the_offline_plan_registers_and_a_second_preview_changes_nothing(world):
    w = world
    w.engine("preview")
    assert w.commands.runs == [], "a preview runs no command"
    w.engine("up", "--yes")
    state = _state(w.engine)
    plan = json.loads((w.plan.dir / "resources.json").read_text())
    _every_planned_create_ran_once(w, plan["resources"])
    # Each resource's stack trace is its program's frames (components.trim_stack_traces), the first its source
    # position: no frame of the event loop, the SDK or the language host, stored once per resource. (Not the
    # stack resource, the SDK's own, registered before the program runs; nor what the Kubernetes provider's
    # ConfigFile registers from its Go code.)
    foreign = {r["urn"].rsplit("::", 1)[-1]: f for r in state
               if r["type"] != "pulumi:pulumi:Stack" and ".py#" in r.get("sourcePosition", "")
               for f in (x.get("sourcePosition", "") for x in r.get("stackTrace", []))
               if not f or re.search(r"asyncio|/pulumi/|language-python-exec", f)}
    assert sum(len(r.get("stackTrace", [])) for r in state) > len(state) and not foreign, foreign
    # What the offline plan registers, plus what the real provider's ConfigFile components construct inside
    # themselves (the mocks register them without children): the CRD of each vendored file.
    built, planned = _urns(state), _urns(plan["resources"])
    assert planned <= built
    assert sorted(u.rsplit("::", 1)[-1] for u in built - planned) == [
        "dev-k8s-mpijob-crd:mpijobs.kubeflow.org",
        "dev-k8s-nodereadinessrule-crd:nodereadinessrules.readiness.node.x-k8s.io"]
    _applied_by_the_provider(w.cp, w.plan)
    # The hosts were prepared and burned in over SSH, the switch configured and saved, the storage server's
    # targets formatted and its daemons started.
    outputs = json.loads(w.engine("stack", "output", "--json"))
    assert outputs["burnIn"] == {"gpu-dev-01": "passed", "gpu-dev-02": "passed"}
    for name in ("gpu-dev-01", "gpu-dev-02"):
        assert w.hosts.hosts[name].exists("/var/lib/gpucluster/burn-in"), name
    switch = json.loads(w.hosts.hosts["leaf-dev-01"].read(SWITCH_STATE))
    assert switch["running"] and switch["saved"] == switch["running"]
    server = w.hosts.hosts["stor-dev-01"]
    # ext4 for management and metadata is the real mkfs; the storage targets' mkfs.xfs is a recording double
    assert sorted(c.split()[-1] for c in server.calls() if c.startswith("mkfs.xfs")) == sorted(w.devices[-2:])
    assert all(any(c.startswith(f"beegfs-daemon-{r}") for c in server.calls()) for r in ("mgmtd", "meta", "storage"))
    # Secrets are secrets in the state: neither the SSH key nor the kubeconfig's client key is in the clear.
    text = "\n".join(p.read_text() for p in (w.work / "state").rglob("*.json"))
    key_body = w.hosts.client_key.read_text().splitlines()[1]
    client_key = yaml.safe_load(w.cp.kubeconfig.read_text())["users"][0]["user"]
    assert key_body not in text
    assert all(v not in text for k, v in client_key.items() if "key" in k)
    # ... but the provider copies the kubeconfig it is given, client key and all, into $TMPDIR at every start
    # (provider/v4 pkg/provider/util.go, writeKubeconfigToFile): the README says to give pulumi a folder of its
    # own there, as the harness does, where the copies go with it.
    copies = [p for p in w.engine.tmp.glob("kubeconfig*") if client_key["client-key-data"] in p.read_text()]
    assert copies, "the provider no longer copies its kubeconfig into $TMPDIR: README's advice can go"
    w.engine("preview", "--expect-no-changes")


def _every_planned_create_ran_once(w: World, resources: list[dict[str, Any]]) -> None:
    """Every command the plan has a create for ran once, on its host or here, and every copy of a pool's shared
    script parts was made once."""
    assert sorted(n for op, n in w.commands.runs if op == "create") == sorted(
        r["urn"].rsplit("::", 1)[-1] for r in resources
        if r["type"].startswith("command:") and (r["inputs"].get("create") or r["type"].endswith(":CopyToRemote")))


def _applied_by_the_provider(cp: ControlPlane, plan: StackPlan) -> None:
    """Every Kubernetes object of the plan is on the apiserver, applied by the Kubernetes provider."""
    for obj in plan.objects:
        meta = obj["metadata"]
        live = cp.get(obj["kind"], meta["name"], meta.get("namespace"), managed_fields=True)
        managers = {m["manager"] for m in live["metadata"].get("managedFields", [])}
        assert any(m.startswith("pulumi-kubernetes") for m in managers), (obj["kind"], meta["name"], managers)


def test_refresh_finds_the_cluster_as_up_left_it(world):
    w = world
    w.engine("refresh", "--yes")
    w.engine("preview", "--expect-no-changes")


def test_the_policy_pack_under_the_engine_finds_what_gpucluster_check_finds(world):
    assert _same_findings(world, "dev"), "dev's unpinned switch and storage server are findings"


def _same_findings(w: World, stack: str) -> list[tuple[str, str, str]]:
    """`pulumi preview` of the selected stack with the pack (and the stack's pack config, where it has one)
    reports the same findings, levels and messages as `gpucluster check` of its spec."""
    config = w.project / "policies" / "config" / f"{stack}.json"
    settings = ["--policy-pack-config", str(config)] if config.exists() else []
    report = _check(w, stack, settings)
    mandatory = any(v["level"] == "mandatory" for v in report["violations"])
    out = w.engine("preview", "--policy-pack", "policies/analyzer", *settings, ok=not mandatory)
    found = sorted(re.findall(r"^ +- \[(\w+)\] +(\S+) +\(\S+: (\S+)\)$", out, re.M))
    expected = sorted((v["level"], v["policy"], v["urn"].rsplit("::", 1)[-1]) for v in report["violations"])
    assert "gpucluster@v" in out and found == expected, out     # the pack ran, and found what check finds
    assert all(v["message"] in out for v in report["violations"])
    return found


def _check(w: World, stack: str, settings: list[str]) -> dict[str, Any]:
    """check.json of `gpucluster check` on the stack's spec in the project (exit 1: mandatory findings)."""
    out = w.work / f"check-{stack}"
    check = subprocess.run([sys.executable, "-m", "components", "check", str(w.project / "stacks" / f"{stack}.yaml"),
                            "--project-dir", str(w.project), *[s.replace("--policy-pack-config", "--policy-config")
                                                               for s in settings], "--out", str(out)],
                           cwd=ROOT, capture_output=True, text=True)
    assert check.returncode in (0, 1), check.stdout + check.stderr
    return json.loads((out / "check.json").read_text())


@pytest.mark.parametrize("stack", ["staging", "prod"])
def test_the_other_stacks_previewed_with_the_policy_pack_give_what_gpucluster_check_gives(world, stack):
    """Their preview under the engine (no SSH, no apply), on the same cluster: their hosts registered as nodes,
    their charts and CRDs vendored as dev's are."""
    w = world
    spec = vendored(yaml.safe_load((ROOT / "stacks" / f"{stack}.yaml").read_text()))
    spec_file = w.project / "stacks" / f"{stack}.yaml"
    spec_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    w.cp.apply_objects([registered(n) for n in kwok_nodes(load_spec(spec_file))])
    w.engine("stack", "init", stack)
    w.engine("config", "set", "--secret", "sshPrivateKey", input=w.hosts.client_key.read_text())
    w.engine("config", "set", "--secret", "kubernetes:kubeconfig", input=w.cp.kubeconfig.read_text())
    try:
        _same_findings(w, stack)
    finally:
        w.engine("stack", "select", "dev")


def _changed(w: World, edit: Callable[[dict[str, Any]], None], name: str) -> dict[str, Any]:
    """`edit` made to the stack's spec: the engine's preview and up change exactly what `gpucluster diff` of
    the two offline plans predicts, and a preview after finds nothing more to do. The edited spec."""
    spec_file = w.project / "stacks" / "dev.yaml"
    data = yaml.safe_load(spec_file.read_text())
    edit(data)
    spec_file.write_text(yaml.safe_dump(data, sort_keys=False))
    after = plan_stack(spec_file, w.work / f"plan-{name}")
    predicted = {d.urn.rsplit("::", 1)[-1]: d.action for d in diff_plans(
        load_plan(w.plan.dir), load_plan(after.dir)) if d.action not in ("read", "discard")}
    assert predicted, "the change changes something"
    assert _steps(w.engine("preview", "--json")) == predicted
    w.engine("up", "--yes")
    w.engine("preview", "--expect-no-changes")
    w.plan = after
    return data


def test_a_tenant_quota_change_updates_exactly_what_gpucluster_diff_predicts(world):
    data = _changed(world, lambda d: d["tenants"][0]["gpu_quota"]["h100"].update(
        nominal=d["tenants"][0]["gpu_quota"]["h100"]["nominal"] - 2), "quota")
    queue = world.cp.get("clusterqueue", data["tenants"][0]["name"])
    gpus = queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"][2]
    assert gpus["nominalQuota"] == str(data["tenants"][0]["gpu_quota"]["h100"]["nominal"])


def test_a_pool_label_change_updates_exactly_what_gpucluster_diff_predicts(world):
    _changed(world, lambda d: d["node_pools"][0].setdefault("labels", {}).update({"example.com/owner": "ml"}),
             "label")
    for node in ("gpu-dev-01", "gpu-dev-02"):
        assert world.cp.get("node", node)["metadata"]["labels"]["example.com/owner"] == "ml"


@contextmanager
def kubelets(w: World, hosts: Iterable[str]) -> Iterator[None]:
    """What each host's container runtime shows (`crictl pods`, the test hosts' double) follows the pods the
    apiserver has running on its node, as a kubelet makes it: a pod the drain evicted is gone from its host."""
    done = threading.Event()
    shown = dict.fromkeys(hosts, "")            # the pods each host's runtime shows now
    failed: list[BaseException] = []

    def sync() -> None:
        try:
            follow()
        except BaseException as e:     # said when the block ends
            failed.append(e)

    def follow() -> None:
        while not done.is_set():
            running: dict[str, list[str]] = {h: [] for h in shown}
            for pod in w.cp.get("pods")["items"]:
                node = pod["spec"].get("nodeName")
                if node in running and pod["status"].get("phase") == "Running" \
                        and not pod["metadata"].get("deletionTimestamp"):
                    running[node].append(f"{pod['metadata']['namespace']}/{pod['metadata']['name']}")
            for host, pods in running.items():
                if " ".join(pods) != shown[host]:
                    w.hosts.hosts[host].set_hardware(PODS=" ".join(pods))
                    shown[host] = " ".join(pods)
            done.wait(0.3)

    thread = threading.Thread(target=sync, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=10)
        for host in shown:
            w.hosts.hosts[host].set_hardware()
    assert not failed, f"following the pods onto the hosts failed: {failed[0]!r}"


def test_a_kubelet_change_rolls_the_busy_host_through_the_drain_and_its_tenant_job_goes_on(world):
    """Day 2 under the engine: a tenant's job runs on one host when the pool's kubelet topology policy changes.
    The idle host takes the restart at once; on the busy one it is owed, and the same `pulumi up` drains that
    node (the job's pod evicted and made again by its Job), restarts kubelet there and gives the node back."""
    w = world
    cluster = Cluster(w.plan, w.cp)
    pool = w.plan.spec.node_pools[0]
    tenant = next(t for t in w.plan.spec.tenants if pool.name in t.gpu_quota and t.gpu_quota[pool.name].nominal)
    job = cluster.submit(cluster.job(tenant, pool, "busy-through-roll", pods=1, gpus_per_pod=1))
    try:
        cluster.wait_admitted(job)
        (pod,) = cluster.wait_running(job)
        busy = pod["spec"]["nodeName"]
        hosts = [h.hostname for h in pool.hosts]
        for h in hosts:
            w.hosts.hosts[h].clear_calls()
        with kubelets(w, hosts):
            wait_for(lambda: pod["metadata"]["name"] in w.hosts.hosts[busy].read(f"{STATE_DIR}/state.env"), 30,
                     lambda: "the busy host's runtime never showed the pod")
            _changed(w, lambda d: d["node_pools"][0]["tuning"].update(kubelet_topology_policy="best-effort"),
                     "kubelet")
        restarts = {h: sum(c in ("systemctl restart kubelet", "systemctl start kubelet")
                           for c in w.hosts.hosts[h].calls()) for h in hosts}
        assert restarts == dict.fromkeys(hosts, 1), restarts
        stdout = {r["urn"].rsplit("::", 1)[-1]: (r.get("outputs") or {}).get("stdout") or ""
                  for r in _state(w.engine)}
        idle = next(h for h in hosts if h != busy)
        assert "rollout owed: kubelet" in stdout[f"dev-h100-{busy}-prepare"]
        assert re.search(rf"^{busy}: changed: drained: \d+ pod\(s\) evicted$", stdout[f"dev-h100-{busy}-drain"], re.M)
        assert "back in service" in stdout[f"dev-h100-{busy}-uncordon"]
        assert "restarted kubelet" in stdout[f"dev-h100-{idle}-prepare"]
        assert "no restart is owed here: not drained" in stdout[f"dev-h100-{idle}-drain"]
        node = w.cp.get("node", busy)
        assert not node["spec"].get("unschedulable") and not [
            t for t in node["spec"].get("taints") or [] if t["key"] == ROLLOUT_TAINT], node["spec"]
        assert pod["metadata"]["uid"] not in {p["metadata"]["uid"] for p in cluster.pods(job)
                                              if not p["metadata"].get("deletionTimestamp")}, "the pod was not evicted"
        cluster.wait_running(job, timeout_s=120)         # its Job made it again, and it runs
    finally:
        cluster.delete_jobs(job)


def test_a_team_onboarded_from_the_tenants_project_reads_the_platform_through_a_stack_reference(world):
    """tenants/ on top of this platform stack: the real StackReference hands it the platform's `tenancy`
    export, and its Tenant is built on the same cluster; destroying it removes the team alone."""
    w = world
    tenants = w.project / "tenants"
    shutil.copytree(ROOT / "tenants", tenants, ignore=shutil.ignore_patterns("stacks"))
    (tenants / "stacks").mkdir()
    (tenants / "stacks" / "dev.yaml").write_text(yaml.safe_dump({
        "platform_stack": "organization/gpucluster/dev",
        "tenants": [{"name": "team-d", "groups": {"edit": ["oidc:team-d"]},
                     "gpu_quota": {"h100": {"nominal": 0, "borrowing_limit": 8}}}]}))
    w.engine("stack", "init", "dev", cwd=tenants)
    w.engine("config", "set", "--secret", "kubernetes:kubeconfig", input=w.cp.kubeconfig.read_text(), cwd=tenants)
    w.engine("up", "--yes", cwd=tenants)
    assert json.loads(w.engine("stack", "output", "--json", cwd=tenants))["tenantNamespaces"] == {"team-d": "team-d"}
    queue = w.cp.get("clusterqueue", "team-d")
    platform_cohort = w.cp.get("clusterqueue", "team-a")["spec"]["cohortName"]
    assert queue["spec"]["cohortName"] == platform_cohort
    w.engine("preview", "--expect-no-changes", cwd=tenants)
    w.engine("destroy", "--yes", cwd=tenants)
    assert w.cp.get("clusterqueue", "team-a")
    with pytest.raises(ControlPlaneError):
        w.cp.get("clusterqueue", "team-d")


def test_destroy_stops_at_a_storage_server_until_it_is_unprotected_then_leaves_nothing(world):
    w = world
    before = len(_state(w.engine))
    refused = w.engine("destroy", "--yes", ok=False)
    assert "dev-storage-stor-dev-01\" cannot be deleted" in refused and len(_state(w.engine)) == before
    # A GPU host's deletes over SSH (its undoing, its leaving, its filesystem client) run their parts from the
    # host's copy: what the leaving removes is there before and gone after.
    remote = [r for r in _state(w.engine) if r["type"] == "command:remote:Command" and "gpu-dev" in r["urn"]
              and r["inputs"].get("delete")]
    assert {r["urn"].rsplit("-", 1)[-1] for r in remote} >= {"prepare", "leave", "01", "02"}
    assert all("# gpucluster: shared part " in r["inputs"]["delete"] for r in remote)
    gpu_hosts = [w.hosts.hosts[h] for h in ("gpu-dev-01", "gpu-dev-02")]
    assert all(h.exists(POOL_FILE) for h in gpu_hosts)
    _destroy(w, w.plan)
    assert not any(h.exists(POOL_FILE) for h in gpu_hosts)
    # The storage server's data stays: its daemons stopped, its targets unmounted, never formatted again or wiped.
    calls = w.hosts.hosts["stor-dev-01"].calls()
    assert sum(c.startswith("mkfs.xfs") for c in calls) == 2 and not any(c.startswith("wipefs") for c in calls)
    assert any(c.startswith("umount") for c in calls)


def split_spec(dev: dict[str, Any]) -> dict[str, Any]:
    """Dev's environment on machines of its own (`-spl-` for `-dev-`) with two more single-host pools, each
    the shard of a stack of its own (README: Split stacks), in a rack of their own."""
    data = yaml.safe_load(yaml.safe_dump(dev).replace("-dev-", "-spl-"))
    data["name"] = "split"
    data["sites"][0]["racks"].append({**data["sites"][0]["racks"][0], "name": "r02"})
    pool = data["node_pools"][0]
    for shard, host, address in (("b", "gpu-spl-03", "10.10.0.13"), ("c", "gpu-spl-04", "10.10.0.14")):
        data["node_pools"].append({**copy.deepcopy(pool), "name": f"h100{shard}", "hosts": [
            {**pool["hosts"][0], "hostname": host, "address": address, "rack": "r02"}]})
    data["shards"] = [{"name": "b", "node_pools": ["h100b"]}, {"name": "c", "node_pools": ["h100c"]}]
    return data


SPLIT = {"split": "platform", "split-b": "b", "split-c": "c"}       # stack: its gpucluster:part


def _in_parallel(w: World, *commands: tuple[str, ...]) -> list[str]:
    """Engine commands at once, each on its own stack (`--stack`), as a pipeline's parallel jobs run them."""
    with futures.ThreadPoolExecutor(len(commands)) as pool:
        return list(pool.map(lambda args: w.engine(*args), commands))


def test_a_split_environment_applies_its_shards_in_parallel_after_the_platform_and_destroys_in_reverse(
        world, tmp_path):
    """The platform stack, then two shard stacks at once, each reading the platform through a real
    StackReference: together they build what the whole environment's plan holds, each resource in one state.
    A shard refuses to run against a platform not yet applied from its spec; destroyed shards first."""
    w = world
    spec = split_spec(yaml.safe_load((ROOT / "stacks" / "dev.yaml").read_text()))
    loops: list[str] = []
    hosts = site_hosts(spec, tmp_path)
    try:
        devices = site(hosts, spec, tmp_path, loops)
        spec_file = w.project / "stacks" / "split.yaml"
        spec_file.write_text(yaml.safe_dump(engine_spec(spec, hosts, devices), sort_keys=False))
        plan = plan_stack(spec_file, tmp_path / "plan")
        w.cp.apply_objects([registered(n) for n in kwok_nodes(plan.spec)])
        for stack, part in SPLIT.items():
            w.engine("stack", "init", stack)
            for key, value in (("specFile", "stacks/split.yaml"), ("part", part)):
                w.engine("config", "set", key, value)
            if part != "platform":
                w.engine("config", "set", "platformStack", "organization/gpucluster/split")
            w.engine("config", "set", "--secret", "sshPrivateKey", input=hosts.client_key.read_text())
            w.engine("config", "set", "--secret", "kubernetes:kubeconfig", input=w.cp.kubeconfig.read_text())
        w.commands.runs.clear()
        refused = w.engine("up", "--yes", "--stack", "split-b", ok=False)
        assert "platform stack organization/gpucluster/split has no `platform` output: apply it first" in refused
        assert "Traceback" not in refused and w.commands.runs == [], refused
        w.engine("up", "--yes", "--stack", "split")
        _in_parallel(w, ("up", "--yes", "--stack", "split-b"), ("up", "--yes", "--stack", "split-c"))
        states = {stack: _state(w.engine, stack) for stack in SPLIT}
        resources = json.loads((plan.dir / "resources.json").read_text())["resources"]
        _every_planned_create_ran_once(w, resources)
        # Each resource in one stack's state; together, what the plan of the whole environment registers.
        names = [u.rsplit("::", 1)[-1] for stack in SPLIT for u in _urns(states[stack])
                 if not u.split("::")[2].endswith(("GpuCluster", "GpuKubernetesStack", "ParallelFilesystem",
                                                   "StackReference"))]
        assert len(names) == len(set(names))
        assert {u.rsplit("::", 1)[-1] for u in _urns(resources)} <= set(names) | {"split", "split-storage", "split-k8s"}
        for stack, host in (("split-b", "gpu-spl-03"), ("split-c", "gpu-spl-04")):
            commands = {u.rsplit("::", 1)[-1] for u in _urns(states[stack])
                        if u.split("::")[2].rsplit("$", 1)[-1].startswith("command:")}
            pool = f"split-h100{stack[-1]}-"         # its pool's (the rollout's report) and its host's own
            assert commands and all(c.startswith(pool) or c == f"split-storage-{host}" for c in commands), commands
            assert f"split-storage-{host}" in commands
            # its host's active check is its own (the platform's length does not grow with the shards' hosts)
            check = f"split-k8s-gpu-check-{host}"
            assert check in {u.rsplit("::", 1)[-1] for u in _urns(states[stack])}
            assert not any(u.endswith(f"::{check}") for u in _urns(states["split"]))
            assert w.cp.get("cronjob", cronjob_name(host), HEALTH_CHECKS)
            assert json.loads(w.engine("stack", "output", "--json", "--stack", stack))["burnIn"] == {host: "passed"}
            # its filesystem client has the connection secret the platform made, read through the reference
            assert hosts.hosts[host].read(BEEGFS_AUTH) == hosts.hosts["gpu-spl-01"].read(BEEGFS_AUTH)
        assert w.cp.get("node", "gpu-spl-03")["metadata"]["labels"]["gpucluster.io/pool"] == "h100b"
        for stack in SPLIT:
            w.engine("preview", "--expect-no-changes", "--stack", stack)
        # The policy pack on a shard's stack finds nothing `gpucluster check` of the whole spec does not.
        whole = {(v["level"], v["policy"], v["urn"].rsplit("::", 1)[-1])
                 for v in _check(w, "split", [])["violations"]}
        out = w.engine("preview", "--policy-pack", "policies/analyzer", "--stack", "split-b")
        found = set(re.findall(r"^ +- \[(\w+)\] +(\S+) +\(\S+: (\S+)\)$", out, re.M))
        assert "gpucluster@v" in out and found <= whole, found - whole
        # Day 2: a label on a shard's pool. The shard waits for the platform applied from the new spec.
        edited = yaml.safe_load(spec_file.read_text())
        edited["node_pools"][1]["labels"] = {"example.com/tier": "b"}
        spec_file.write_text(yaml.safe_dump(edited, sort_keys=False))
        w.commands.runs.clear()
        refused = w.engine("up", "--yes", "--stack", "split-b", ok=False)
        assert "was last applied from another version of the spec: apply it first, then the shards" in refused
        assert w.commands.runs == []
        w.engine("up", "--yes", "--stack", "split")
        w.engine("up", "--yes", "--stack", "split-b")
        assert w.cp.get("node", "gpu-spl-03")["metadata"]["labels"]["example.com/tier"] == "b"
        w.engine("preview", "--expect-no-changes", "--stack", "split-c")
        # Destroyed in reverse: the shards at once (their hosts leave the pool), then the platform.
        _in_parallel(w, ("destroy", "--yes", "--stack", "split-b"), ("destroy", "--yes", "--stack", "split-c"))
        assert not any(hosts.hosts[h].exists(POOL_FILE) for h in ("gpu-spl-03", "gpu-spl-04"))
        assert hosts.hosts["gpu-spl-01"].exists(POOL_FILE)
        left = {c["metadata"]["name"] for c in w.cp.get("cronjob", namespace=HEALTH_CHECKS)["items"]}
        assert cronjob_name("gpu-spl-01") in left and not {cronjob_name("gpu-spl-03"), cronjob_name("gpu-spl-04")} & left
        w.engine("stack", "select", "split")
        _destroy(w, plan)
    finally:
        w.engine("stack", "select", "dev")
        _stop(hosts, loops)


def _destroy(w: World, plan: StackPlan) -> None:
    """The selected stack's protected resources (its storage servers) unprotected, then destroyed: nothing of
    it is left in the state or on the apiserver."""
    for r in _state(w.engine):
        if r.get("protect"):
            w.engine("state", "unprotect", r["urn"], "--yes")
    w.engine("destroy", "--yes")
    assert _state(w.engine) == []
    left = []
    for obj in plan.objects:
        meta = obj["metadata"]
        try:
            live = w.cp.get(obj["kind"], meta["name"], meta.get("namespace"))
        except ControlPlaneError:
            continue
        if not live.get("metadata", {}).get("deletionTimestamp"):
            left.append(f"{obj['kind']}/{meta['name']}")
    assert left == []


@contextmanager
def applied(w: World, stack: str, work: Path,
            mirror: Path | None = None) -> Iterator[tuple[dict[str, Any], TestHosts, StackPlan]]:
    """`stack`'s own machines (after dev is gone, on the same control plane), its spec on them, its nodes
    registered and `pulumi up` run for it: every planned create ran once and every plan object is applied.
    Yields its spec, hosts and offline plan; dev is the selected stack again after."""
    if stack not in STACKS:
        pytest.skip(f"GPUCLUSTER_ENGINE_STACKS={','.join(STACKS)} (CI's time holds dev alone): "
                    f"make engine-e2e applies {stack}")
    spec = yaml.safe_load(SOURCES.get(stack, ROOT / "stacks" / f"{stack}.yaml").read_text())
    loops: list[str] = []
    hosts = site_hosts(spec, work)
    try:
        devices = site(hosts, spec, work, loops)
        spec_file = w.project / "stacks" / f"{stack}.yaml"
        spec_file.write_text(yaml.safe_dump(engine_spec(spec, hosts, devices, mirror), sort_keys=False))
        plan = plan_stack(spec_file, work / "plan")
        w.cp.apply_objects([registered(n) for n in kwok_nodes(plan.spec)])
        w.engine("stack", "select", "--create", stack)
        w.engine("config", "set", "--secret", "sshPrivateKey", input=hosts.client_key.read_text())
        w.engine("config", "set", "--secret", "kubernetes:kubeconfig", input=w.cp.kubeconfig.read_text())
        w.commands.runs.clear()
        w.engine("up", "--yes")
        resources = json.loads((plan.dir / "resources.json").read_text())["resources"]
        _every_planned_create_ran_once(w, resources)
        assert _urns(resources) <= _urns(_state(w.engine))
        _applied_by_the_provider(w.cp, plan)
        gpu_hosts = [h["hostname"] for p in spec["node_pools"] for h in p["hosts"]]
        assert json.loads(w.engine("stack", "output", "--json"))["burnIn"] == dict.fromkeys(gpu_hosts, "passed")
        yield spec, hosts, plan
    finally:
        w.engine("stack", "select", "dev")
        _stop(hosts, loops)


def test_staging_on_eight_rails_two_leaves_and_beegfs_8_applies_then_leaves_nothing(world, tmp_path):
    """Staging's own machines after dev is gone, on the same control plane: four GPU hosts with eight RoCE NICs
    each, even and odd rails on two Cumulus leaves, BeeGFS 8 on two servers with the site's licence. Up, no
    changes after, destroy."""
    w = world
    with applied(w, "staging", tmp_path) as (spec, hosts, plan):
        gpu_hosts = [h["hostname"] for p in spec["node_pools"] for h in p["hosts"]]
        rails = [n["interface"] for n in spec["node_pools"][0]["nics"]]
        for name in gpu_hosts:                  # every rail's real interface at the fabric's MTU
            assert {i: mtu(hosts, hosts.hosts[name], i) for i in rails} == \
                dict.fromkeys(rails, spec["fabric"]["mtu_bytes"]), name
        for leaf in spec["fabric"]["switches"]:
            config = json.loads(hosts.hosts[leaf["name"]].read(SWITCH_STATE))
            assert config["running"] and config["saved"] == config["running"], leaf["name"]
        manager, second = (hosts.hosts[s["hostname"]] for s in spec["storage"]["servers"])
        toml = manager.read("/etc/beegfs/beegfs-mgmtd.toml")
        assert f'license-cert-file = "{spec["storage"]["license_file"]}"' in toml and "quota-enforce = true" in toml
        assert [c.split()[0] for c in manager.calls() if c.startswith("beegfs-")] == [
            "beegfs-mgmtd", "beegfs-setup-meta", "beegfs-setup-storage",       # initialised once each, then
            "beegfs-mgmtd", "beegfs-daemon-meta", "beegfs-daemon-storage"]     # the daemons started
        assert [c.split()[0] for c in second.calls() if c.startswith("beegfs-")] == [
            "beegfs-setup-storage", "beegfs-daemon-storage"]
        # each tenant's directory got its group's quota through BeeGFS 8's CLI, on one client
        quotas = sorted(re.search(r"--space=(\d+)GiB", c).group(1) for h in gpu_hosts
                        for c in hosts.hosts[h].calls() if c.startswith("beegfs quota set-limits"))
        assert quotas == sorted(str(t["storage"]["filesystem_gib"]) for t in spec["tenants"])
        w.engine("preview", "--expect-no-changes")
        _destroy(w, plan)


def test_isolated_tenants_get_their_partitions_from_the_guids_their_hosts_reported_and_lose_them_drained(world, tmp_path):
    """The isolated example's machines (prod's, as a shared and two dedicated pools): each dedicated host's
    preparation reports its rails' port GUIDs (the real ibstat over the device tree), the engine hands those
    outputs to the partitions step on both subnet managers, which writes them into partitions.conf (limited in
    the shared partitions, full in the tenant's at index 0) and has OpenSM re-read it; a second preview has
    nothing to do. Isolation turned off, the tenants' Nodes are drained before the partitions go."""
    w = world
    software = yaml.safe_load(SOURCES["isolated"].read_text())["node_pools"][0]["software"]
    mirror = None if "isolated" not in STACKS else driver_repo(
        tmp_path / "mirror", [software["driver_version"]], [f"{software['doca_ofed_version']}-0.1.8"])
    with applied(w, "isolated", tmp_path / "site", mirror) as (spec, hosts, plan):
        pkeys = plan.spec.tenant_pkeys
        isolated = plan.spec.isolated_hosts
        guid = {h: {d: hosts.hosts[h].port_guid(d) for d in (f"mlx5_{r}" for r in range(8))} for h in isolated}
        for sm in spec["fabric"]["infiniband"]["subnet_managers"]:
            text = hosts.hosts[sm].read("/etc/opensm/partitions.conf")
            for host, tenant in isolated.items():
                for g in guid[host].values():
                    assert f"  {g}=limited" in text and f"  {g}=full" in text, (sm, host)
                assert f"tenant-{tenant}={pkeys[tenant]:#06x}, indx0, ipoib" in text, sm
            assert hosts.hosts["gpu-prod-03"].port_guid("mlx5_0") not in text          # shared: ALL=full
        for host in isolated:
            assert "NCCL_IB_PKEY=0" in hosts.hosts[host].read(NCCL_CONF), host
        w.engine("preview", "--expect-no-changes")

        # Day 2, isolation turned off: pulumi deletes the steps at the run's end, dependents first, so the
        # reopen's delete drains the tenants' Nodes before the partitions steps' deletes give every port the
        # shared partitions, and the handover's delete reopens the Nodes after.
        spec_file = w.project / "stacks" / "isolated.yaml"
        flat = yaml.safe_load(spec_file.read_text())
        flat["fabric"]["infiniband"]["isolate_dedicated_pools"] = False
        spec_file.write_text(yaml.safe_dump(flat, sort_keys=False))
        w.commands.runs.clear()
        w.engine("up", "--yes")
        deletes = [n for op, n in w.commands.runs if op == "delete"]
        reopen, handover = (next(i for i, n in enumerate(deletes) if n.endswith(f"-partitions-{role}"))
                            for role in ("reopen", "handover"))
        steps = [i for i, n in enumerate(deletes) for sm in spec["fabric"]["infiniband"]["subnet_managers"]
                 if n.endswith(f"-partitions-{sm}")]
        assert len(steps) == 2 and reopen < min(steps) and max(steps) < handover, deletes
        for sm in spec["fabric"]["infiniband"]["subnet_managers"]:
            text = hosts.hosts[sm].read("/etc/opensm/partitions.conf")
            assert "tenant-" not in text and "=limited" not in text and "ALL=full" in text, (sm, text)
        for host in isolated:
            node = w.cp.get("node", host)
            assert node["metadata"]["annotations"][PARTITION_MARK] == "shared", host
            assert not node["spec"].get("unschedulable") and HANDOVER_MARK not in node["metadata"]["annotations"]
        w.engine("preview", "--expect-no-changes")
        _destroy(w, plan)


def test_prod_on_infiniband_with_its_subnet_managers_lustre_over_o2ib_and_a_pinned_driver_applies(world, tmp_path):
    """Prod's own machines: eight GPU hosts with eight NDR ports each, read by the real ibstat; OpenSM on two
    of them, primary and standby; Lustre on five servers over LNet o2ib; the driver stack pinned to 570 and
    DOCA 2.9.5 from the site's mirror (a flat apt repository of packages under NVIDIA's names). Up, no changes
    after, destroy."""
    w = world
    software = yaml.safe_load((ROOT / "stacks" / "prod.yaml").read_text())["node_pools"][0]["software"]
    mirror = None if "prod" not in STACKS else driver_repo(
        tmp_path / "mirror", [software["driver_version"]], [f"{software['doca_ofed_version']}-0.1.8"])
    with applied(w, "prod", tmp_path / "site", mirror) as (spec, hosts, plan):
        pool = spec["node_pools"][0]
        gpu_hosts = [h["hostname"] for h in pool["hosts"]]
        sms = spec["fabric"]["infiniband"]["subnet_managers"]
        ipoib = plan.spec.fabric.effective_mtu_bytes - 4          # IPoIB's header inside the IB MTU
        pkeys = [p["pkey"] | 0x8000 for p in spec["fabric"]["infiniband"]["partitions"]]
        for name in gpu_hosts:
            h = hosts.hosts[name]
            # the driver stack at the spec's versions, loaded
            assert h.read("/opt/nvidia-test/driver-version").strip() == software["driver_version"], name
            assert h.sysfs("/sys/module/nvidia/version").read_text().strip() == software["driver_version"], name
            # each port's IPoIB child for the partition (pkey with the full-member bit) at the IPoIB MTU
            children = {f"{n['interface']}.{k:04x}": ipoib for n in pool["nics"] for k in pkeys}
            assert {c: mtu(hosts, h, c) for c in children} == children, name
            # the subnet manager on its two hosts only, master and standby by priority
            sm = h.read("/etc/opensm/opensm.conf") if h.exists("/etc/opensm/opensm.conf") else None
            if name in sms:
                assert f"sm_priority {15 - sms.index(name)}" in sm and "guid 0xb83fd203" in sm, name
                assert h.exists(f"{STATE_DIR}/active/gpucluster-opensm"), name
            else:
                assert sm is None and not h.exists(f"{STATE_DIR}/active/gpucluster-opensm"), name
            # NCCL over the rails, bootstrapping on the management network
            nccl = h.read(NCCL_CONF)
            assert "NCCL_SOCKET_IFNAME==enp90s0f0" in nccl and "NCCL_IB_HCA==mlx5_0:1," in nccl, name
        # each tenant's project and quota through lfs, on one client
        lfs = [c for name in gpu_hosts for c in hosts.hosts[name].calls() if c.startswith("lfs setquota")]
        assert sorted(int(re.search(r"-B (\d+)G", c).group(1)) for c in lfs) == \
            sorted(t.storage.filesystem_gib for t in plan.spec.tenants if t.storage.filesystem_gib)
        for server in spec["storage"]["servers"]:      # LNet on o2ib over the servers' IPoIB interface
            h = hosts.hosts[server["hostname"]]
            assert "net type: o2ib" in h.read("/etc/lnet.conf") and "0: ib0" in h.read("/etc/lnet.conf")
            assert sum(c.startswith("mkfs.lustre") for c in h.calls()) == len(server["targets"]), server["hostname"]
        w.engine("preview", "--expect-no-changes")
        _destroy(w, plan)
