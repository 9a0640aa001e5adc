"""Read the tools' own output: fio's JSON, dcgmi diag's table, the link check's and NCCL launcher's lines."""

from __future__ import annotations

import json
import re

_NCCL = re.compile(r"bus bandwidth at 8 GiB (\S+) GB/s, floor (\S+) GB/s")
_LINK = re.compile(r"^\S+: (ok  |FAIL) rail (\d+) (\S+) -> (\S+) \((\S+)\): (.*)$")
_DIAG_ROW = re.compile(r"^\|([^|]*)\|([^|]*)\|$")


def nccl_busbw(log: str) -> float | None:
    """The launcher's verdict line: bus bandwidth at the largest message (8 GiB), as it judged it."""
    matches = _NCCL.findall(log)
    if not matches or matches[-1][0] == "none":
        return None
    return float(matches[-1][0])


def link_lines(output: str) -> list[tuple[bool, str]]:
    """(ok, line) for every rail pair the link check measured."""
    out = []
    for line in output.splitlines():
        m = _LINK.match(line.strip())
        if m:
            out.append((m.group(1).strip() == "ok", f"rail {m.group(2)} {m.group(3)} -> {m.group(4)}: {m.group(6)}"))
    return out


def fio_read_gb_per_s(output: str) -> tuple[float, int]:
    """(aggregate read GB/s, clients) from the fio JSON documents of every client pod, concatenated in a log."""
    total, clients, decoder, i = 0.0, 0, json.JSONDecoder(), 0
    while True:
        start = output.find("{", i)
        if start < 0:
            break
        try:
            doc, end = decoder.raw_decode(output, start)
        except json.JSONDecodeError:
            i = start + 1
            continue
        i = end
        if isinstance(doc, dict) and "jobs" in doc:
            clients += 1
            total += sum(job.get("read", {}).get("bw_bytes", 0) for job in doc["jobs"])
    return round(total / 1e9, 2), clients


def dcgm_failures(output: str) -> tuple[list[str], int]:
    """(failed tests with their detail, tests run) from `dcgmi diag`'s result table; a test's result may go on
    over rows whose name column is blank (some GPUs pass, one fails)."""
    failed, ran, name = [], set(), ""
    for line in output.splitlines():
        m = _DIAG_ROW.match(line.strip())
        if not m:
            continue
        name = m.group(1).strip() or name
        result = m.group(2).strip()
        if re.match(r"(Pass|Fail|Skip|Warn)\b", result):
            ran.add(name)
            if result.startswith("Fail"):
                failed.append(f"{name}: {result}")
    return failed, len(ran)


_SUFFIX = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def quantity(text: str) -> float:
    """A Kubernetes resource quantity ("110", "110000m", "2097052Mi", "2.5Gi", "1e3") as a number of units."""
    m = re.fullmatch(r"\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?\s*", text)
    if not m:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    return float(m.group(1)) * _SUFFIX[m.group(2) or ""]
