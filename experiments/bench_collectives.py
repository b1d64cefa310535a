"""Benchmark: one 1 GiB all-gather and all-reduce per algorithm at 64 ... 4,096 GPUs.

Prints wall time, simpy events, events/s and peak RSS per point, then the growth exponent of
wall time with GPU count (least-squares slope of log wall vs log n).
Target (issue 2): < 0.4 s at 1,024 GPUs, growth no faster than ~n^1.1.

Each point runs in a fresh subprocess so peak RSS is that point's own.

    python experiments/bench_collectives.py [--cluster paper-a100-roce] [--gpus 64 256 1024 4096]
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
cluster, nodes, op, algo = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
spec = load_cluster(cluster, nodes=nodes)
t0 = time.perf_counter()
r = simulate_collective(spec, Op(op), Scope.GLOBAL, 2**30, Algo(algo))
wall = time.perf_counter() - t0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"wall_s": wall, "events": r.events, "sim_time_s": r.time_s,
                  "peak_rss_bytes": rss, "chunks": r.chunks}))
"""


def slope(xs, ys):
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum(
        (a - mx) ** 2 for a in lx)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cluster", default="paper-a100-roce")
    ap.add_argument("--gpus", type=int, nargs="+", default=[64, 256, 1024, 4096])
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = []
    print(f"{'op':<12}{'algo':<14}{'GPUs':>6}{'wall s':>9}{'events':>8}{'events/s':>10}"
          f"{'peak RSS MiB':>14}{'sim time ms':>13}")
    for op in ("all-gather", "all-reduce"):
        for algo in ("ring", "hierarchical", "ho-ring"):
            walls = []
            for n in a.gpus:
                out = subprocess.run([sys.executable, "-c", CHILD, a.cluster, str(n // 8), op,
                                      algo], capture_output=True, text=True, check=True)
                r = json.loads(out.stdout)
                r.update(op=op, algo=algo, gpus=n)
                rows.append(r)
                walls.append(r["wall_s"])
                print(f"{op:<12}{algo:<14}{n:>6}{r['wall_s']:>9.3f}{r['events']:>8}"
                      f"{r['events'] / r['wall_s']:>10.0f}{r['peak_rss_bytes'] / 2**20:>14.1f}"
                      f"{r['sim_time_s'] * 1e3:>13.2f}")
            k = slope(a.gpus, walls)
            print(f"{'':<26}wall time grows as n^{k:.2f}")
            for r in rows[-len(a.gpus):]:
                r["growth_exponent"] = k
    worst = max(r["wall_s"] for r in rows if r["gpus"] == 1024) if 1024 in a.gpus else None
    if worst is not None:
        print(f"slowest point at 1,024 GPUs: {worst:.3f} s (target < 0.4 s)")
    if a.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
