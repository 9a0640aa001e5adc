"""`make bench-apply`: `pulumi up` of the synthetic clusters under the real engine, against its critical path.

The engine, its Python language host and the program are the real ones (`make engine-e2e` builds them); what
would touch machines stands in, as fast as it can or as slow as the model says:
- every command (`command:remote:Command`, `command:local:Command`) and copy (`command:remote:CopyToRemote`)
  sleeps its modelled duration (MODEL, each figure with its source, scaled by --scale: 1/60 by default, a
  modelled minute a second) and prints nothing;
- Kubernetes and random answer at once with their inputs (the echo provider of the engine tests): the apiserver's
  own time is not the subject here (bench/kueue_burst.py measures admission);
- a file backend in a fresh folder, as a self-managed site runs it.

For each size it prints the first apply's wall time, the critical path (the longest chain of modelled durations
through the state's dependencies, scaled the same way) and their ratio, the engine's CPU time and peak memory
(the CLI, the language host and the program), the state's size and the bytes the engine wrote to the backend;
then a preview with no changes against the offline plan's time. `python bench/apply.py 16 128` runs chosen sizes;
results land in bench/apply-results.json. `--shards K` applies each size split (README: Split stacks): the platform
stack, then K shard stacks as a pipeline's parallel jobs on runners of their own would (measured one at a time,
each alone on this machine: the slowest is the phase's time), their previews likewise; results in
bench/apply-split-results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from specs import split, synthetic, to_yaml  # noqa: E402
from tests.e2e.commands import CommandProvider  # noqa: E402
from tests.e2e.engine import PLUGINS, Engine, serve, serve_echo  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TOOLS = Path(os.environ.get("GPUCLUSTER_E2E_TOOLS", ROOT / ".e2e")) / "bin"

# Modelled duration of a command's create, in seconds, by the end of its resource name; the first match wins.
# Update and delete take the same. Sources, where there is one; the rest are stated assumptions.
MODEL: tuple[tuple[str, float, str], ...] = (
    ("-prepare", 300, "assumed: apt installs of the pinned driver stack and DOCA-OFED with DKMS builds, tuning"),
    ("-burn-in", 180, "dcgmi diag -r 2, 'approximately two minutes' (NVIDIA DCGM, dcgmi diag reference), "
                      "then one host's all_reduce_perf sweep (assumed 60 s)"),
    ("-roll", 5, "assumed: a first apply owes nothing, the roll checks and exits"),
    ("-drain", 2, "assumed: kubectl finds nothing to drain on a first apply"),
    ("-uncordon", 2, "assumed: one kubectl call"),
    ("-leave", 2, "assumed: records the host's pool"),
    ("-scripts", 2, "assumed: one SFTP session copying the pool's shared script parts, about 100 KB"),
    ("-deregister", 0, "acts on delete only"),
    ("-retire", 0, "acts on delete only"),
    ("-rollout", 1, "assumed: the pool's report, one local call"),
    ("-batch", 0, "no command: the point between two batches of the rollout"),
    ("-dirs", 10, "assumed: mkdir, lfs setstripe and setquota per tenant"),
)
STORAGE_SERVER_S = (120, "assumed: mkfs.lustre of two RAID-6 OSTs and their first mount")
STORAGE_CLIENT_S = (60, "assumed: LNet up and the first mount")
OTHER_S = (20, "assumed: any other SSH step (a switch, a subnet manager alone)")


def modelled_s(name: str) -> float:
    for suffix, seconds, _ in MODEL:
        if name.endswith(suffix):
            return seconds
    if "-storage-" in name:
        server = name.rsplit("-storage-", 1)[1].startswith(("mds-", "oss-"))
        return (STORAGE_SERVER_S if server else STORAGE_CLIENT_S)[0]
    return OTHER_S[0]


class SleepingCommands(CommandProvider):
    """pulumi-command's contract (tests/e2e/commands.py), each command slept for its modelled duration."""

    def __init__(self, version: str, workdir: Path, scale: float):
        super().__init__(version, workdir)
        self.scale = scale
        self.busy = self.peak = 0
        self.lock = threading.Lock()

    def _copy(self, context, op, urn, args):
        self._run(context, op, urn, args, "copy", {})

    def _run(self, context, op, urn, inputs, command, previous):
        if command is None:
            return "", ""
        name = urn.rsplit("::", 1)[-1]
        with self.lock:
            self.runs.append((op, name))
            self.busy += 1
            self.peak = max(self.peak, self.busy)
        try:
            time.sleep(modelled_s(name) * self.scale)
        finally:
            with self.lock:
                self.busy -= 1
        return "", ""


def critical_path_s(state: list[dict]) -> float:
    """The longest chain of modelled durations through the state's dependencies, in one pass: the engine keeps
    every resource after its dependencies. A component costs nothing (the engine does not wait for one before
    its children)."""
    finish: dict[str, float] = {}
    for r in state:
        start = max((finish[d] for d in r.get("dependencies", []) if d in finish), default=0.0)
        own = modelled_s(r["urn"].rsplit("::", 1)[-1]) if r["type"].startswith("command:") else 0.0
        finish[r["urn"]] = start + own
    return max(finish.values(), default=0.0)


def per_host_kib(state: list[dict], hosts: list[str]) -> dict[str, dict[str, float]]:
    """Where a GPU host's share of the state goes (KiB per host, averaged over the hosts): by the host's own
    resources (those named after it, `<pool>-<host>-prepare`, `storage-<host>`, `k8s-gpu-check-<host>` ...),
    and by what each of them stores: its inputs, its outputs (a command's repeat its inputs), the stack trace
    that registered it, and the rest (URNs, dependencies, provider, timestamps)."""
    named = re.compile("|".join(map(re.escape, sorted(hosts, key=len, reverse=True))))
    by_role: dict[str, int] = {}
    by_part = dict.fromkeys(("inputs", "outputs", "stackTrace", "rest"), 0)
    for r in state:
        name = r["urn"].rsplit("::", 1)[-1]
        found = named.search(name)
        if found is None or (found.end() < len(name) and name[found.end()] != "-"):
            continue
        role = (name[:found.start()] + "<host>" + name[found.end():]).split("-", 1)[-1]     # no cluster name
        size = {k: len(json.dumps(v, separators=(",", ":"))) for k, v in r.items()}
        by_role[role] = by_role.get(role, 0) + sum(size.values())
        for part in ("inputs", "outputs", "stackTrace"):
            by_part[part] += size.pop(part, 0)
        by_part["rest"] += sum(size.values())
    per = max(len(hosts), 1) * 1024
    return {"by_role": {k: round(v / per, 1) for k, v in sorted(by_role.items(), key=lambda kv: -kv[1])},
            "by_part": {k: round(v / per, 1) for k, v in by_part.items()}}


class WriteMeter:
    """What a process tree wrote to storage (/proc/PID/io write_bytes, counted when pages are dirtied) and each
    of its programs' peak memory (VmHWM), sampled until it exits."""

    def __init__(self):
        self.bytes = 0
        self.peaks: dict[str, int] = {}          # program name -> peak resident KiB
        self._stop = threading.Event()

    def watch(self, pid: int) -> None:
        seen: dict[int, int] = {}

        def loop() -> None:
            while not self._stop.is_set():
                for p in _tree(pid):
                    try:
                        io = dict(x.split(":", 1) for x in Path(f"/proc/{p}/io").read_text().splitlines())
                        status = dict(x.split(":", 1) for x in Path(f"/proc/{p}/status").read_text().splitlines())
                    except OSError:
                        continue
                    seen[p] = max(seen.get(p, 0), int(io["write_bytes"]))
                    name = status["Name"].strip()
                    self.peaks[name] = max(self.peaks.get(name, 0), int(status.get("VmHWM", "0 kB").split()[0]))
                self.bytes = sum(seen.values())
                time.sleep(0.2)
        threading.Thread(target=loop, daemon=True).start()

    def stop(self) -> None:
        self._stop.set()


def _tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            todo += [int(c) for t in Path(f"/proc/{p}/task").iterdir()
                     for c in (Path(t) / "children").read_text().split()]
        except OSError:
            pass
    return out


def timed(engine: Engine, *args: str) -> dict:
    """One engine command: wall and CPU seconds and peak memory of its process tree (os.wait4: the CLI with the
    language host and program it waited for), and the bytes they wrote."""
    meter = WriteMeter()
    with tempfile.TemporaryFile("w+") as out:
        start = time.monotonic()
        proc = subprocess.Popen([str(engine.tools / "pulumi"), *args, "--non-interactive", "--color", "never"],
                                cwd=engine.project, env=engine.env, stdout=out, stderr=subprocess.STDOUT, text=True)
        meter.watch(proc.pid)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - start
        meter.stop()
        if os.waitstatus_to_exitcode(status) != 0:
            out.seek(0)
            raise SystemExit(f"pulumi {' '.join(args)} failed:\n{out.read()[-5000:]}")
    return {"wall_s": round(wall, 1), "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
            "peak_mib": round(usage.ru_maxrss / 1024), "written_mib": round(meter.bytes / 2**20, 1),
            "peak_mib_by_program": {k: round(v / 1024) for k, v in sorted(meter.peaks.items()) if v > 10240}}


def on_runners(engine: Engine, commands: list[tuple[str, ...]]) -> dict:
    """Engine commands each on its own stack, as the parallel jobs of a pipeline run them on runners of their
    own: here one at a time, each alone on this machine, so that one machine's cores do not stand for many.
    The wall time is the slowest's (what the pipeline waits for); CPU time and bytes written summed."""
    runs = [timed(engine, *args) for args in commands]
    return {"wall_s": max(r["wall_s"] for r in runs), "cpu_s": round(sum(r["cpu_s"] for r in runs), 1),
            "peak_mib": max(r["peak_mib"] for r in runs),
            "written_mib": round(sum(r["written_mib"] for r in runs), 1), "stacks": len(runs),
            "walls_s": [r["wall_s"] for r in runs]}


def in_sequence(*phases: dict) -> dict:
    """Phases one after another (the platform stack, then the shards'), as one."""
    return {"wall_s": round(sum(p["wall_s"] for p in phases), 1), "cpu_s": round(sum(p["cpu_s"] for p in phases), 1),
            "peak_mib": max(p["peak_mib"] for p in phases),
            "written_mib": round(sum(p["written_mib"] for p in phases), 1),
            "phases_s": [p["wall_s"] for p in phases]}


def run_size(nodes: int, work: Path, scale: float, parallel: int, skip_checkpoints: bool, shards: int = 0,
             run_shards: int = 0) -> dict:
    """One size: the one stack of the environment, or (`shards`) its platform stack then its shards', of which
    `run_shards` (0: all) are applied: the shards are the same shape, and each would have a runner of its own."""
    project = work / "project"
    (project / "stacks").mkdir(parents=True)
    for name in ("Pulumi.yaml", "__main__.py"):
        shutil.copy(ROOT / name, project / name)
    spec = split(synthetic(nodes), shards) if shards else synthetic(nodes)
    (project / "stacks" / "bench.yaml").write_text(to_yaml(spec))
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "components", "plan", str(project / "stacks" / "bench.yaml"),
                    "--out", str(work / "plan")], cwd=ROOT, check=True, capture_output=True)
    plan_s = time.monotonic() - start
    commands = SleepingCommands(PLUGINS["command"], project, scale)
    parts = {"bench": "platform", **{f"bench-{s['name']}": s["name"]
                                     for s in spec.get("shards", [])[:run_shards or shards]}} \
        if shards else {"bench": None}
    servers = []
    try:
        server, port = serve(commands, workers=8192)
        servers.append(server)
        attach = {"command": port}
        for plugin in ("kubernetes", "random"):
            server, port, _ = serve_echo(PLUGINS[plugin])
            servers.append(server)
            attach[plugin] = port
        engine = Engine(TOOLS, work, project, attach)
        if skip_checkpoints:         # the engine writes the state once at the end, not at every step
            engine.env["PULUMI_SKIP_CHECKPOINTS"] = "true"
        for stack, part in parts.items():
            engine("stack", "init", stack)
            if part:
                engine("config", "set", "specFile", "stacks/bench.yaml")
                engine("config", "set", "part", part)
            if part and part != "platform":
                engine("config", "set", "platformStack", "organization/gpucluster/bench")
            engine("config", "set", "--secret", "sshPrivateKey", input="-----BEGIN OPENSSH PRIVATE KEY-----\nbench\n")
            engine("config", "set", "--secret", "kubernetes:kubeconfig", input="apiVersion: v1\nkind: Config\n")
        up_args = ("up", "--yes", "--skip-preview", "--parallel", str(parallel), "--stack")
        first = timed(engine, *up_args, "bench")
        up = in_sequence(first, on_runners(engine, [(*up_args, s) for s in parts if s != "bench"])) if shards else first
        backends = {s: next((work / "state").rglob(f"{s}.json")) for s in parts}   # the file backend's checkpoints
        states = {s: json.loads(b.read_text())["checkpoint"]["latest"]["resources"] for s, b in backends.items()}
        preview = on_runners(engine, [("preview", "--expect-no-changes", "--parallel", str(parallel), "--stack", s)
                                      for s in parts])
    finally:
        for s in servers:
            s.stop(0)
    # Split, the shards start when the platform stack is done: its path, then the longest shard's.
    path = (critical_path_s(states["bench"]) + max((critical_path_s(v) for k, v in states.items() if k != "bench"),
                                                   default=0.0)) * scale
    size = sum(b.stat().st_size for b in backends.values())
    applied = sorted({m.group(1) for v in states.values() for x in v
                      if (m := re.search(r"-(gpu-\d{5})-prepare$", x["urn"]))})        # the hosts this run built
    return {"nodes": nodes, "shards": shards, "shards_run": len(parts) - 1 if shards else 0,
            "resources": sum(len(v) for v in states.values()),
            "parallel": parallel, "scale": scale, "skip_checkpoints": skip_checkpoints,
            "up": up, "critical_path_s": round(path, 1),
            "up_over_path": round(up["wall_s"] / path, 2) if path else None,
            "commands_at_once": commands.peak, "state_mib": round(size / 2**20, 1),
            "state_kib_per_host": round(size / 1024 / max(len(applied), 1), 1),
            "largest_state_mib": round(max(b.stat().st_size for b in backends.values()) / 2**20, 1),
            "gpu_host_kib": per_host_kib([r for v in states.values() for r in v], applied),
            "preview": preview, "offline_plan_s": round(plan_s, 1),
            "preview_over_plan": round(preview["wall_s"] / plan_s, 2)}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sizes", nargs="*", type=int, default=[16, 128, 512, 2048])
    parser.add_argument("--scale", type=float, default=1 / 60, help="seconds slept per modelled second")
    parser.add_argument("--parallel", type=int, default=0,
                        help="the engine's --parallel (0: one per resource the plan holds, no limit)")
    parser.add_argument("--skip-checkpoints", action="store_true",
                        help="PULUMI_SKIP_CHECKPOINTS: no state written between steps (no crash safety)")
    parser.add_argument("--shards", type=int, default=0,
                        help="split into a platform stack and this many shard stacks (README: Split stacks); "
                             "0: one stack")
    parser.add_argument("--run-shards", type=int, default=0,
                        help="apply only this many of the shards (the same shape; each has a runner of its own); "
                             "0: all")
    args = parser.parse_args(argv)
    missing = [t for t in ("pulumi", "pulumi-language-python", "pulumi-language-python-exec")
               if not (TOOLS / t).exists()]
    if missing:
        raise SystemExit(f"bench/apply.py: {', '.join(missing)} not built in {TOOLS}: run `make engine-e2e` first")
    rows = []
    for nodes in args.sizes:
        with tempfile.TemporaryDirectory(prefix=f"apply{nodes}-") as tmp:
            row = run_size(nodes, Path(tmp), args.scale, args.parallel or 100_000, args.skip_checkpoints,
                           args.shards, args.run_shards)
        rows.append(row)
        print(json.dumps(row), flush=True)
    # Rows of other sizes (and shard counts) measured before stay.
    path = Path(__file__).parent / ("apply-split-results.json" if args.shards else "apply-results.json")
    measured = {_key(r) for r in rows}
    kept = [r for r in (json.loads(path.read_text()) if path.exists() else []) if _key(r) not in measured]
    path.write_text(json.dumps(sorted(kept + rows, key=_key), indent=2) + "\n")


def _key(row: dict) -> tuple:
    return row["nodes"], row.get("shards", 0), row.get("skip_checkpoints", False)


if __name__ == "__main__":
    main(sys.argv[1:])
