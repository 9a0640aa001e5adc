"""`make bench`: how the library scales from 16 to 2,048 nodes, against Pulumi's own floor.

For each size, in one run on one machine: `gpucluster plan` time and peak memory (whole process), the floor
(floor.py: the same resources registered with no library logic), resources per GPU node, SSH commands per host,
the dependency graph's depth, and the blast radius of three everyday changes (from `gpucluster diff`'s engine).
Prints one table and writes bench/results.json. `python bench/bench.py 16 128` runs chosen sizes.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from components.offline.diff import diff_plans, load_plan  # noqa: E402
from specs import add_node, synthetic, to_yaml  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SIZES = (16, 128, 512, 2048)


def measured(argv: list[str]) -> tuple[float, float, str]:
    """(seconds, peak RSS in MiB, stdout) of one whole child process (os.wait4 reads that child's own usage)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        text = out.read()
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}):\n{text[-2000:]}\n{err.read()[-2000:]}")
    return seconds, usage.ru_maxrss / 1024, text


def plan(spec: dict, work: Path, name: str) -> tuple[float, float, Path]:
    """Plan a spec as stack `name` (every variant of a size is the same stack, so URNs compare) into a folder
    never used before, as a first plan on a fresh checkout writes every file. Nothing is deleted until the bench
    ends: ext4 without a journal (this machine's disk) steps over every inode freed in the last minutes when it
    allocates one, so deleting the last run's 4,000 files just before a plan made its file writing several times
    slower, and more so the more had been deleted - noise that fell on the plan alone."""
    work.mkdir(parents=True, exist_ok=True)
    path = work / f"{name}.yaml"
    path.write_text(to_yaml(spec))
    out = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=work))
    seconds, peak, _ = measured([sys.executable, "-m", "components", "plan", str(path), "--out", str(out)])
    return seconds, peak, out


def graph_depth(resources: list[dict]) -> int:
    """The longest chain of custom resources that must be created one after another (a dependency on a
    component waits for everything under it)."""
    by_urn = {r["urn"]: r for r in resources}
    children: dict[str, list[str]] = {}
    for r in resources:
        if r.get("parent"):
            children.setdefault(r["parent"], []).append(r["urn"])

    def customs(urn: str) -> list[str]:
        r = by_urn.get(urn)
        if r is None:
            return []
        if r["custom"]:
            return [urn]
        return [c for child in children.get(urn, []) for c in customs(child)]

    deps = {r["urn"]: {d for dep in [*r.get("dependsOn", []), *[u for us in r.get("propertyDependencies", {}).values()
                                                                 for u in us]] for d in customs(dep)}
            for r in resources if r["custom"]}
    depth: dict[str, int] = {}
    for urn in deps:                       # iterative longest path (no recursion limit at 2,048 nodes)
        stack = [urn]
        while stack:
            top = stack[-1]
            pending = [d for d in deps.get(top, ()) if d not in depth and d in deps]
            if pending:
                stack.extend(pending)
                continue
            stack.pop()
            depth[top] = 1 + max((depth[d] for d in deps.get(top, ()) if d in depth), default=0)
    return max(depth.values(), default=0)


def commands_per_host(out: Path) -> int:
    """SSH sessions a first apply opens to a GPU host: its scripts, and the copy of its pool's shared parts."""
    copies = [r["urn"].rsplit("::", 1)[1] for r in load_plan(out)["resources"]
              if r["type"] == "command:remote:CopyToRemote"]
    counts = [sum(1 for f in d.iterdir() if not f.name.endswith((".delete.sh", ".update.sh")))
              + sum(1 for c in copies if c.endswith(f"-{d.name}-scripts"))
              for d in (out / "scripts").iterdir() if d.name.startswith("gpu-")]
    return max(counts, default=0)


def blast(base: Path, changed: Path) -> dict:
    """What a change does to what exists: resources (what the engine acts on) and components (whose inputs,
    their slice of the spec, changed) apart; and how many resources it creates."""
    before = {r["urn"]: r for r in load_plan(base)["resources"]}
    diffs = diff_plans(load_plan(base), load_plan(changed))
    touched = [d for d in diffs if d.action not in ("create", "read")]     # a new read (Resource.get) makes nothing
    customs = sorted(d.urn.rsplit("::", 1)[-1] for d in touched if before[d.urn]["custom"])
    components = sorted(d.urn.rsplit("::", 1)[-1] for d in touched if not before[d.urn]["custom"])
    return {"created": sum(d.action == "create" for d in diffs), "read": sum(d.action == "read" for d in diffs),
            "changed": len(touched),
            "resources": customs[:8], "components": components[:8]}


def repeats(nodes: int) -> int:
    """Pairs of plan and floor runs per size, a minute or two of each at the small sizes."""
    return 15 if nodes <= 64 else 7 if nodes <= 256 else 3 if nodes <= 1024 else 2


def run_size(nodes: int, work: Path, repeat: int) -> dict:
    spec = synthetic(nodes)
    plans, floors = [], []
    for _ in range(repeat):      # in pairs, each plan followed by its floor
        plans.append(plan(spec, work, f"bench{nodes}"))
        floors.append(measured([sys.executable, str(ROOT / "bench" / "floor.py"),
                                str(plans[-1][2] / "resources.json")]))
    # This machine is shared and its speed moves by 20% or more from one run to the next (a bare Python loop
    # takes 1.1 to 1.8 s); a rare fast run of either side decided the ratio of the fastest runs (the same
    # 16-node plan measured 1.03x to 1.37x its floor that way). The median of the pairs' ratios is steady.
    ratio = median(p[0] / f[0] for p, f in zip(plans, floors))
    plan_s, floor_s = median(r[0] for r in plans), median(r[0] for r in floors)
    plan_mib, floor_mib = median(r[1] for r in plans), median(r[1] for r in floors)
    out = plans[0][2]
    document = json.loads((out / "resources.json").read_text())
    resources = [r for r in document["resources"] if r["type"] != "pulumi:pulumi:Stack"]
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "components", "validate", str(work / f"bench{nodes}.yaml")], cwd=ROOT,
                   check=True, capture_output=True)
    validate_s = time.perf_counter() - started
    quota = synthetic(nodes)
    quota["tenants"][0]["gpu_quota"]["h100"]["nominal"] = 120
    bump = synthetic(nodes)
    bump["kubernetes"] = {"gpu_operator": {"chart_version": "v26.7.1"}, "allow_unknown_versions": True}
    radius = {}
    for label, variant in (("add a node", add_node(synthetic(nodes))), ("tenant quota", quota),
                           ("GPU Operator bump", bump)):
        radius[label] = blast(out, plan(variant, work / label.split()[0], f"bench{nodes}")[2])
    return {"nodes": nodes, "gpus": nodes * 8, "resources": len(resources),
            "resources_per_added_node": radius["add a node"]["created"],
            "reads_per_added_node": radius["add a node"]["read"],
            "plan_s": round(plan_s, 2), "plan_mib": round(plan_mib), "floor_s": round(floor_s, 2),
            "floor_mib": round(floor_mib), "time_x_floor": round(ratio, 2), "pairs": repeat,
            "fastest_plan_s": round(min(r[0] for r in plans), 2),
            "fastest_floor_s": round(min(r[0] for r in floors), 2),
            "memory_x_floor": round(plan_mib / floor_mib, 2),
            "resources_per_node": round(len(resources) / nodes, 2), "commands_per_host": commands_per_host(out),
            "graph_depth": graph_depth(resources), "validate_s": round(validate_s, 2),
            "types": dict(Counter(r["type"] for r in resources).most_common(6)), "blast_radius": radius}


def table(rows: list[dict]) -> str:
    head = ["nodes", "resources", "plan s", "floor s", "x floor", "plan MiB", "floor MiB", "x floor",
            "res/added node", "res/node (all)", "cmds/host", "depth", "validate s",
            "add node: changed", "quota: changed", "GPU Op bump: changed"]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        b = r["blast_radius"]
        lines.append(" | ".join(map(str, [
            r["nodes"], r["resources"], r["plan_s"], r["floor_s"], r["time_x_floor"], r["plan_mib"], r["floor_mib"],
            r["memory_x_floor"], r["resources_per_added_node"], r["resources_per_node"], r["commands_per_host"],
            r["graph_depth"], r["validate_s"], *(radius(b[k]) for k in ("add a node", "tenant quota",
                                                                        "GPU Operator bump"))])))
    return "\n".join(lines)


def radius(b: dict) -> str:
    return (", ".join(b["resources"]) or "no resource") + " (+ " + (", ".join(b["components"]) or "no") + \
        " component)"


def verdicts(rows: list[dict]) -> list[tuple[str, bool, str]]:
    """Each target of issues 15 and 29, met or not, with the figures that decide it."""
    by = {r["nodes"]: r for r in rows}
    out = [("plan time <= 1.25x the floor", all(r["time_x_floor"] <= 1.25 for r in rows),
            ", ".join(f"{r['nodes']}: {r['time_x_floor']}x" for r in rows)),
           ("peak memory <= 1.25x the floor", all(r["memory_x_floor"] <= 1.25 for r in rows),
            ", ".join(f"{r['nodes']}: {r['memory_x_floor']}x" for r in rows)),
           # issue 15's 4 and 3, plus what issue 29's rollout needs (a drain, a roll over SSH and an uncordon)
           # and its retirement (a deregister, a leave over SSH and a retire), the host's active health check
           # (its CronJob), and issue 55's copy of the pool's shared script parts (one SFTP session), which
           # takes some 200 KB of scripts out of each host's state
           ("<= 12 resources per GPU node", all(r["resources_per_added_node"] <= 12 for r in rows),
            ", ".join(f"{r['nodes']}: {r['resources_per_added_node']} (+ {r['reads_per_added_node']} read)"
                      for r in rows)),
           ("<= 6 SSH sessions per host", all(r["commands_per_host"] <= 6 for r in rows),
            ", ".join(f"{r['nodes']}: {r['commands_per_host']}" for r in rows)),
           ("blast radius exact", all(
               not r["blast_radius"]["add a node"]["resources"]
               and r["blast_radius"]["tenant quota"]["resources"] == [f"bench{r['nodes']}-team-0000-cq"]
               and r["blast_radius"]["GPU Operator bump"]["resources"] == [f"bench{r['nodes']}-k8s-gpu-operator"]
               and set(r["blast_radius"]["add a node"]["components"]) <= {f"bench{r['nodes']}-h100",
                                                                           f"bench{r['nodes']}-fabric"}
               and set(r["blast_radius"]["tenant quota"]["components"]) <= {f"bench{r['nodes']}-team-0000"}
               for r in rows), "see the table")]
    if 16 in by and 2048 in by:
        growth = by[2048]["plan_s"] / by[16]["plan_s"]
        out.append(("linear: 2,048 nodes <= 140x the time of 16", growth <= 140, f"{growth:.1f}x"))
    if 128 in by and 2048 in by:
        out.append(("graph depth the same at 128 and 2,048", by[128]["graph_depth"] == by[2048]["graph_depth"],
                    f"{by[128]['graph_depth']} and {by[2048]['graph_depth']}"))
    if 2048 in by:
        out.append(("validation of 2,048 nodes < 2 s", by[2048]["validate_s"] < 2, f"{by[2048]['validate_s']} s"))
    return out


def main(argv: list[str]) -> None:
    sizes = sorted(int(a) for a in argv) or list(SIZES)
    # Both sides run from bytecode: pip compiled the SDK's modules when it installed them; the project's are
    # compiled here, since an environment with PYTHONDONTWRITEBYTECODE would compile them again on every run.
    subprocess.run([sys.executable, "-m", "compileall", "-q", "components", "policies", "bench", "__main__.py"],
                   cwd=ROOT, check=True, capture_output=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpucluster-bench-") as tmp:
        for n in sizes:
            rows.append(run_size(n, Path(tmp), repeat=repeats(n)))
            print(f"... {n} nodes done", file=sys.stderr)
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    print(f"gpucluster bench on {machine}\n")
    print(table(rows))
    print("\ntargets:")
    checks = verdicts(rows)
    for label, met, figures in checks:
        print(f"  {'met   ' if met else 'MISSED'} {label}: {figures}")
    (ROOT / "bench" / "results.json").write_text(json.dumps(
        {"machine": machine, "rows": rows, "targets": [{"target": t, "met": m, "figures": f} for t, m, f in checks]},
        indent=2) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
