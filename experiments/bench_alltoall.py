"""Benchmark: one 256 MiB all-to-all per algorithm (p2p, hierarchical-a2a) at 8 ... 512 GPUs.

Prints wall time, simpy events, events/s and peak RSS per point, then the growth exponent of
wall time with GPU count (least-squares slope of log wall vs log n). An all-to-all of n ranks
routes n(n-1) flows, so expect growth near n^2; 512 ranks in one group is the largest
accepted (docs/limits.md). Each point runs in a fresh subprocess so peak RSS is its own.
Timings are noisy on a shared machine: compare alternated runs.

    python experiments/bench_alltoall.py [--cluster dgx-h100-ib] [--gpus 8 16 64 256]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys

CHILD = r"""
import json, resource, sys, time
from parosim.collectives import Algo, Op, Scope, simulate_collective
from parosim.io import load_cluster
cluster, nodes, algo = sys.argv[1], int(sys.argv[2]), sys.argv[3]
spec = load_cluster(cluster, nodes=nodes)
t0 = time.perf_counter()
r = simulate_collective(spec, Op.ALL_TO_ALL, Scope.GLOBAL, 2**28, Algo(algo))
wall = time.perf_counter() - t0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"wall_s": wall, "events": r.events, "sim_time_s": r.time_s,
                  "closed_form_s": r.closed_form_s, "peak_rss_bytes": rss}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cluster", default="dgx-h100-ib")
    ap.add_argument("--gpus", type=int, nargs="+", default=[8, 16, 64, 256])
    ap.add_argument("--algos", nargs="+", default=["p2p", "hierarchical-a2a"])
    a = ap.parse_args()
    print(f"{'algo':<18}{'gpus':>6}{'wall s':>10}{'events':>9}{'events/s':>11}"
          f"{'peak RSS MB':>13}{'engine/closed':>15}")
    for algo in a.algos:
        pts = []
        for n in a.gpus:
            out = subprocess.run([sys.executable, "-c", CHILD, a.cluster, str(n // 8), algo],
                                 capture_output=True, text=True, check=True).stdout
            r = json.loads(out)
            pts.append((n, r["wall_s"]))
            print(f"{algo:<18}{n:>6}{r['wall_s']:>10.2f}{r['events']:>9}"
                  f"{r['events'] / r['wall_s']:>11.0f}{r['peak_rss_bytes'] / 1e6:>13.0f}"
                  f"{r['sim_time_s'] / r['closed_form_s']:>15.6f}")
        if len(pts) > 1:
            xs = [math.log(n) for n, _ in pts]
            ys = [math.log(w) for _, w in pts]
            mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
            slope = (sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
                     / sum((x - mx) ** 2 for x in xs))
            print(f"{algo}: wall time grows as n^{slope:.2f}")


if __name__ == "__main__":
    main()
