"""`python bench/kueue_burst.py [NODES]`: the real Kueue admitting a fleet's active health checks (issue 52.11).

On the control plane of `make e2e` (etcd, apiserver, scheduler, controllers, KWOK GPU nodes, the pinned Kueue;
`make e2e-tools` first), a synthetic spec of NODES hosts (bench/specs.py; 64 by default) is planned and applied,
and each host's check Job is created as the CronJob controller would create it:
- burst: every host's check in one minute, as one schedule everywhere (`0 */6 * * *`) had them;
- spread: the same hosts grouped by the minute `health_checks.spread` gives each (its largest group).
For each it prints the Jobs created, how long until Kueue admitted all of them, and the median and worst
admission delay (from each Workload's creation to its Admitted condition; the apiserver keeps seconds).
Figures, not a verdict: tests judge behaviour, this measures it.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from components.k8s.health import checks as health_checks
from specs import synthetic, to_yaml  # noqa: E402
from tests.e2e.conftest import running_cluster  # noqa: E402
from tests.e2e.test_health_checks import check_job  # noqa: E402


def _seconds(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").timestamp()


def admit(c, hosts: list[str], tag: str, timeout_s: float = 600) -> dict[str, float]:
    """Create the hosts' check Jobs at once; wait until Kueue admitted all; the figures. Deletes them after."""
    jobs = [check_job(c, h, tag) for h in hosts]
    host_of = {j["metadata"]["name"]: h for j, h in zip(jobs, hosts)}
    start = time.monotonic()
    c.cp.apply_objects(jobs)
    pending = set(hosts)
    delays: list[float] = []
    while pending and time.monotonic() - start < timeout_s:
        for wl in c.cp.get("workloads.kueue.x-k8s.io", namespace=health_checks.NAMESPACE)["items"]:
            host = next((host_of[o["name"]] for o in wl["metadata"].get("ownerReferences", [])
                         if o["name"] in host_of), None)
            admitted = next((x for x in wl.get("status", {}).get("conditions", [])
                             if x["type"] == "Admitted" and x["status"] == "True"), None)
            if host in pending and admitted:
                pending.discard(host)
                delays.append(_seconds(admitted["lastTransitionTime"]) -
                              _seconds(wl["metadata"]["creationTimestamp"]))
        time.sleep(0.5)
    elapsed = time.monotonic() - start
    for job in jobs:
        c.cp.kubectl("delete", "job", job["metadata"]["name"], "-n", health_checks.NAMESPACE, "--wait=false",
                     "--ignore-not-found")
    return {"jobs": len(jobs), "admitted": len(jobs) - len(pending), "all_admitted_s": round(elapsed, 1),
            "median_delay_s": median(delays) if delays else None, "worst_delay_s": max(delays) if delays else None}


def main(nodes: int) -> dict[str, dict[str, float]]:
    spec_data = synthetic(nodes)
    with tempfile.TemporaryDirectory() as work:
        path = Path(work) / f"burst-{nodes}.yaml"
        path.write_text(to_yaml(spec_data))
        with running_cluster(path, Path(work)) as c:
            hosts = sorted(n for n in c.nodes() if any(
                o["kind"] == "CronJob" and o["metadata"]["labels"].get(health_checks.HOST_LABEL) == n
                for o in c.plan.objects))
            schedule = c.spec.kubernetes.health.active_checks.schedule
            minutes = Counter(health_checks.spread(schedule, h) for h in hosts)
            (busiest, _), = minutes.most_common(1)
            group = [h for h in hosts if health_checks.spread(schedule, h) == busiest]
            burst = admit(c, hosts, "burst")
            spread = admit(c, group, "spread")
            spread["distinct_minutes"] = len(minutes)
    return {"burst": burst, "spread": spread}


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    result = main(n)
    print(f"{n} GPU hosts, their active checks admitted by the real Kueue:")
    for name, r in result.items():
        print(f"  {name:<6} {r['jobs']:>5} job(s) at once, {r['admitted']} admitted in {r['all_admitted_s']} s; "
              f"delay median {r['median_delay_s']} s, worst {r['worst_delay_s']} s"
              + (f" ({r['distinct_minutes']} distinct minutes over the fleet)" if "distinct_minutes" in r else ""))
    print(json.dumps(result))
