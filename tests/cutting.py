"""Cutting a generated script short (issue 28): SIGKILL of its shell before its k-th command, as a dropped SSH
session, a killed runner or Ctrl-C leaves it, and the steps worth cutting at."""

from __future__ import annotations

import re
import subprocess
from typing import Callable

_TRAP = ('set -o functrace; __steps=0\n'
         "trap '__steps=$((__steps + 1)); if (( __steps == @K@ )); then kill -9 $$; fi; "
         "if (( @K@ < 0 )); then printf \"step %s: %s\\\\n\" \"$__steps\" \"$BASH_COMMAND\" >&2; fi' DEBUG\n")
# Where a cut hurts: right after a file changes, a daemon is stopped or restarted, a running configuration
# changes or is saved, or an object changes in the apiserver (a cut before one is a cut after the step before it).
RISKY = re.compile(r"^(mv -f|rm -f|sed -i|cp |systemctl (stop|start|restart|daemon-reload|disable)|lnetctl import|"
                   r"owe |paid |saving |nv config|FastCli|config (save|interface|ecn|pfcwd)|sonic-db-cli CONFIG_DB hset|"
                   r"\"\$\{kc\[@\]\}\" (annotate|taint|cordon|uncordon|drain))")


def killed_at(script: str, k: int) -> str:
    """The script with a DEBUG trap that SIGKILLs its shell before its k-th command (functions included); with
    k < 0, it traces every command on standard error instead ("step N: COMMAND")."""
    head, sep, body = script.partition("set -euo pipefail\n")
    assert sep, "not a generated script"
    return head + sep + _TRAP.replace("@K@", str(k)) + body


def cut_points(trace: str, spread: int = 6) -> list[int]:
    """From a traced run's standard error: the step after every risky one, and `spread` evenly spread."""
    steps = [(int(n), cmd) for n, cmd in re.findall(r"^step (\d+): (.*)$", trace, re.M)]
    assert steps, "the traced run printed no steps"
    last = steps[-1][0] - 8          # the closing report and change count: nothing left to cut
    after_risky = {n + 1 for n, cmd in steps if RISKY.match(cmd) and n < last}
    return sorted(after_risky | {1 + i * (last - 1) // (spread - 1) for i in range(spread)})


def cut_everywhere(run: Callable[[str], subprocess.CompletedProcess], new: str, back: Callable[[], None],
                   check: Callable[[int], None], spread: int = 6) -> list[int]:
    """`new` cut at every risky step on its way from where `back` puts the host, then run whole again, and
    `check(k)` judges what the run after cut k left. `run` runs a script's text on the host. Returns the cuts."""
    back()
    traced = run(killed_at(new, -1))
    assert traced.returncode == 0, traced.stderr
    points = cut_points(traced.stderr, spread)
    for k in points:
        back()
        assert run(killed_at(new, k)).returncode != 0, f"step {k}: the kill did not happen"
        again = run(new)
        assert again.returncode == 0, (k, again.stdout, again.stderr)
        check(k)
    return points
