"""A stack's plan as the control plane sees it: its objects, the KWOK nodes its hosts become, Kueue's config."""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from components.k8s.labels import BURN_IN_TAINT
from components.k8s.rails import rdma_resource
from components.nodes.host_prep import render_kubelet_config
from components.nodes.node_pool import NodePoolArgs, render_node_patch
from components.offline.recorder import SECRET
from components.spec import ClusterSpec, NodePool, load_spec
from components.spec.cluster import network_operator_enabled

from .controlplane import ROOT, TOOLS

SHARED_CRDS = ROOT.parent / "shared" / "schemas" / "crds"
PINNED_CRDS = Path(__file__).resolve().parent / "crds"
STACKS = sorted(p.stem for p in (ROOT / "stacks").glob("*.yaml"))


@dataclass
class StackPlan:
    stack: str
    spec: ClusterSpec
    dir: Path
    objects: list[dict[str, Any]]                 # every Kubernetes object of the plan but the node patches
    node_patches: list[dict[str, Any]]
    checks: list[dict[str, Any]]                  # the after-apply check manifests
    skipped: dict[str, list[str]] = field(default_factory=dict)   # why -> objects not applied

    def kueue_config(self) -> dict[str, Any]:
        values = yaml.safe_load((self.dir / "helm" / "kueue-system-kueue.values.yaml").read_text())
        return yaml.safe_load(values["managerConfig"]["controllerManagerConfigYaml"])


def plan_stack(stack: str | Path, out: Path) -> StackPlan:
    """Plan the stack (a name in stacks/, or a spec file) with the real command line, as a user would, and read
    back what it wrote."""
    proc = subprocess.run([sys.executable, "-m", "components", "plan", str(stack), "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise AssertionError(f"gpucluster plan {stack} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    spec = load_spec(stack if isinstance(stack, Path) else ROOT / "stacks" / f"{stack}.yaml")
    objects, patches, skipped = [], [], {}
    for path in sorted((out / "manifests").rglob("*.yaml")):
        obj = yaml.safe_load(path.read_text())
        if obj["kind"] == "Node":
            patches.append(obj)
            continue
        group = obj["apiVersion"].split("/")[0] if "/" in obj["apiVersion"] else ""
        if obj["kind"] == "Secret" and SECRET in (obj.get("stringData"), obj.get("data")):
            skipped.setdefault("its value exists only at apply", []).append(f"Secret/{obj['metadata']['name']}")
            continue
        if not _builtin(group) and obj["kind"] not in crd_kinds():
            skipped.setdefault(f"no {group} CRD here", []).append(f"{obj['kind']}/{obj['metadata']['name']}")
            continue
        objects.append(obj)
    checks = [o for p in sorted((out / "checks").glob("*.yaml")) for o in yaml.safe_load_all(p.read_text()) if o]
    return StackPlan(stack if isinstance(stack, str) else stack.stem, spec, out, objects, patches, checks, skipped)


def ordered(objects: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Apply order as Pulumi's dependencies give it: namespaces, then Kueue's cluster objects, then the rest."""
    first = [o for o in objects if o["kind"] == "Namespace"]
    kueue_base = [o for o in objects if o["kind"] in ("ResourceFlavor", "Topology", "Cohort", "WorkloadPriorityClass")]
    queues = [o for o in objects if o["kind"] == "ClusterQueue"]
    rest = [o for o in objects if o not in first and o not in kueue_base and o not in queues]
    return [first, kueue_base, queues, rest]


def external_crds() -> list[Path]:
    """The upstream CRDs of the NVIDIA operators and NFD (Kueue's come from its module; none without ../shared),
    those pinned here of engines that no module proxy serves (node-readiness-controller), and the Prometheus
    Operator's ServiceMonitor and PrometheusRule from its module (a stack with monitoring expects that stack)."""
    return sorted(p for p in SHARED_CRDS.glob("*.yaml") if not p.name.startswith("kueue.x-k8s.io_")) + \
        sorted(PINNED_CRDS.glob("*.yaml")) + sorted((TOOLS / "prometheus-operator-crds").glob("*.yaml"))


@functools.cache
def crd_kinds() -> frozenset[str]:
    """Kinds the control plane will know: Kueue's CRDs and the external ones (read from `spec.names.kind`
    without parsing the whole, very large, schemas)."""
    paths = [*external_crds(), *(TOOLS / "kueue-crds").glob("*.yaml")]
    names = (re.search(r"^  names:\n(?:    .*\n)*?    kind: (\w+)$", p.read_text(), re.M) for p in paths)
    return frozenset(m.group(1) for m in names if m)


def _builtin(group: str) -> bool:
    """The core group and the Kubernetes API groups every apiserver serves."""
    return "." not in group or (group.endswith(".k8s.io") and not group.endswith(".x-k8s.io"))


def kwok_node(spec: ClusterSpec, pool: NodePool, hostname: str, burn_in_failed: bool = False) -> dict[str, Any]:
    """The Node a host registers as, after its NodePatch: labels and taints from the pool's own renderer,
    capacity from the host model (GPUs as the device plugin advertises them, the RDMA devices, CPU, memory), and
    allocatable below it as on a real host."""
    host = next(h for h in pool.hosts if h.hostname == hostname)
    verdict = (False, "burn-in failed (e2e)") if burn_in_failed else (True, "passed")
    patch = render_node_patch(NodePoolArgs.from_spec(spec, pool), host, verdict)
    capacity = {"cpu": str(pool.cpu_cores_per_host), "memory": f"{pool.memory_gib_per_host}Gi", "pods": "110",
                pool.gpu_resource_name: str(pool.gpu_units_per_host)}
    if network_operator_enabled(spec) and pool.nics:
        capacity[rdma_resource(spec)] = str(spec.kubernetes.network_operator.rdma_hca_max)
    # As a real kubelet reports it from the KubeletConfiguration the preparation writes (node-allocatable rules,
    # written out here apart from the library's own derivation): memory less systemReserved, the 100Mi
    # hard-eviction default and pre-allocated hugepages; CPU less the static CPU manager's reservedSystemCPUs, or
    # else systemReserved's, in millicores as the kubelet reports it.
    tuning, kubelet = pool.tuning, render_kubelet_config(pool)
    reserved = sum(int(hi or lo) - int(lo) + 1 for lo, _, hi in (p.partition("-") for p in
                                                                 tuning.kubelet_reserved_cpus.split(",")))
    system = kubelet.get("systemReserved", {})
    cpu_m = pool.cpu_cores_per_host * 1000 - (reserved * 1000 if kubelet.get("cpuManagerPolicy") == "static"
                                              else int(system.get("cpu", "0m").rstrip("m")))
    memory_mi = pool.memory_gib_per_host * 1024 - int(system.get("memory", "0Mi").rstrip("Mi")) - 100 \
        - 2 * tuning.hugepages_2mi
    allocatable = {**capacity, "cpu": f"{cpu_m}m", "memory": f"{memory_mi}Mi"}
    meta = patch["metadata"]
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": hostname, "labels": {**meta["labels"], "kubernetes.io/hostname": hostname,
                                                  "kubernetes.io/os": "linux", "type": "kwok"},
                     "annotations": {**meta["annotations"], "kwok.x-k8s.io/node": "fake"}},
        "spec": {"taints": patch["spec"]["taints"]},
        "status": {"capacity": capacity, "allocatable": allocatable,
                   "nodeInfo": {"kubeletVersion": "fake", "kubeProxyVersion": "fake", "architecture": "amd64",
                                "operatingSystem": "linux"}},
    }


def kwok_nodes(spec: ClusterSpec, quarantined: set[str] = frozenset()) -> list[dict[str, Any]]:
    return [kwok_node(spec, pool, h.hostname, h.hostname in quarantined) for pool, h in spec.hosts()]


def burn_in_taint_of(node: dict[str, Any]) -> bool:
    return any(t["key"] == BURN_IN_TAINT for t in node.get("spec", {}).get("taints") or [])
