"""A simulated InfiniBand fabric for the real OpenSM and infiniband-diags (Debian's opensm 3.3, infiniband-diags
44, ibsim-utils): the programs reach ibsim through libumad2sim instead of a kernel's umad devices, and
`SIM_HOST` names the HCA (its node description) a program runs on."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, TypeVar

UMAD2SIM = Path("/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so")
TOOLS = ("opensm", "ibsim", "sminfo", "smpquery", "saquery")
FULL = 0x8000                       # the membership bit of a P_Key (IBTA 10.9.1): set, a full member
T = TypeVar("T")


def missing() -> str | None:
    lacking = [t for t in TOOLS if shutil.which(t) is None] + ([] if UMAD2SIM.exists() else [str(UMAD2SIM)])
    return f"missing {', '.join(lacking)} (.ci/run installs opensm, ibsim-utils and infiniband-diags)" \
        if lacking else None


def on(node: str, *cmd: str, timeout_s: float = 30) -> subprocess.CompletedProcess[str]:
    """`cmd` as it runs on the HCA named `node` of the simulated fabric."""
    env = {**os.environ, "SIM_HOST": node, "LD_PRELOAD": str(UMAD2SIM)}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)


def wait(probe: Callable[[], T], timeout_s: float = 30) -> T:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.5)
    return probe()


@contextmanager
def simulated(work: Path, nodes: list[str]) -> Iterator[Path]:
    """ibsim running a fabric of one leaf with an HCA per name in `nodes`."""
    net = [f'Switch\t{len(nodes) + 1} "leaf0"', *(f'[{i}]\t"{n}"[1]' for i, n in enumerate(nodes, 1)), ""]
    for i, n in enumerate(nodes, 1):
        net += [f'Hca\t1 "{n}"', f'[1]\t"leaf0"[{i}]', ""]
    (work / "net").write_text("\n".join(net))
    sim = subprocess.Popen(["ibsim", "-n", "-s", str(work / "net")], stdout=open(work / "ibsim.log", "w"),
                           stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    time.sleep(1)
    try:
        assert sim.poll() is None, (work / "ibsim.log").read_text()
        yield work
    finally:
        sim.terminate()
        sim.wait(timeout=10)


def port_guid(node: str) -> str:
    """The port GUID of `node`'s HCA, as its own umad view reports it."""
    out = on(node, "smpquery", "-D", "nodeinfo", "0").stdout
    return next(line.split(".")[-1] for line in out.splitlines() if line.startswith("PortGuid:"))


def lid(node: str) -> str:
    done = on(node, "smpquery", "portinfo", "-G", port_guid(node))
    assert "Lid:" in done.stdout, done.stdout + done.stderr
    return next(line.split(".")[-1] for line in done.stdout.splitlines() if line.startswith("Lid:"))


def pkey_table(node: str, reader: str) -> list[int]:
    """The P_Key table the subnet manager programmed into `node`'s port, by index (read over the fabric from
    `reader`), without its trailing empty entries."""
    table = on(reader, "smpquery", "pkeys", lid(node)).stdout
    keys = [int(k, 16) for line in table.splitlines() if ":" in line and line.strip()[0].isdigit()
            for k in line.split(":", 1)[1].split()]
    while keys and keys[-1] == 0:
        keys.pop()
    return keys


def path_between(src: str, dst: str) -> bool:
    """The subnet administrator gives `src` a path to `dst`: they share a partition in which one of them at
    least is a full member (OpenSM's PathRecord answer, asked from `src` as a job's connection setup does)."""
    done = on(src, "saquery", "-p", "--src-to-dst", f"{lid(src)}:{lid(dst)}")
    assert done.returncode == 0, done.stdout + done.stderr
    return "PathRecord" in done.stdout


def opensm(work: Path, node: str, conf: str, partitions: str) -> subprocess.Popen[str]:
    """OpenSM on `node` as its unit starts it, with `conf` (opensm.conf as rendered) and `partitions` (its
    partitions.conf), their paths moved under `work`/`node`."""
    d = work / node.replace("/", "_")
    d.mkdir(exist_ok=True)
    (d / "partitions.conf").write_text(partitions + "\n")
    conf = conf.replace("/etc/opensm/partitions.conf", str(d / "partitions.conf"))
    (d / "opensm.conf").write_text(conf.replace("/var/log/opensm.log", str(d / "opensm.log")) + "\n")
    env = {**os.environ, "SIM_HOST": node, "LD_PRELOAD": str(UMAD2SIM), "OSM_TMP_DIR": str(d), "OSM_CACHE_DIR": str(d)}
    return subprocess.Popen(["opensm", "--config", str(d / "opensm.conf")], env=env,
                            stdout=open(d / "out.log", "w"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, text=True)
