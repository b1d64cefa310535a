"""Benchmark: one 1 GiB all-gather and all-reduce per algorithm at 64 ... 4,096 GPUs.

Prints wall time, simpy events, events/s and peak RSS per point, then the growth exponent of
wall time with GPU count (least-squares slope of log wall vs log n).
Target (issue 2): < 0.4 s at 1,024 GPUs, growth no faster than ~n^1.1.

Each point runs in a fresh subprocess so peak RSS is that point's own.

    python experiments/bench_collectives.py [--cluster paper-a100-roce] [--gpus 64 256 1024 4096]

``--whole-process`` times instead what a user waits for: the command
``parosim collective --op all-reduce --size 1GiB --nodes N/8 --algo A`` as a new process,
start-up and imports included (targets at 1,024 GPUs: < 0.25 s hierarchical, < 0.5 s ring),
best of ``--repeat`` runs (wall and CPU = user + system time), for ring, hierarchical,
ho-ring and nccl; ``--algos`` narrows the list. It says whether parosim's bytecode was cached
(an installed package) or compiled in every run (``PYTHONDONTWRITEBYTECODE=1``, no
``__pycache__``).
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


def whole_process(a) -> int:
    """Best-of-``repeat`` wall and CPU time of the whole ``parosim collective`` process."""
    import os
    import resource
    import time

    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    rows = []
    print(f"{'algo':<14}{'GPUs':>6}{'best wall s':>13}{'best CPU s':>12}{'median wall s':>15}"
          f"   target")
    targets = {"hierarchical": 0.25, "ring": 0.5}
    for algo in a.algos:
        for n in a.gpus:
            walls, cpus = [], []
            for _ in range(a.repeat):
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                t0 = time.perf_counter()
                subprocess.run([sys.executable, "-m", "parosim.cli", "collective", "--op",
                                "all-reduce", "--size", "1GiB", "--cluster", a.cluster,
                                "--nodes", str(n // 8), "--algo", algo], env=env, check=True,
                               stdout=subprocess.DEVNULL)
                walls.append(time.perf_counter() - t0)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
            walls.sort()
            t = targets.get(algo) if n == 1024 else None
            rows.append({"algo": algo, "gpus": n, "best_wall_s": walls[0],
                         "median_wall_s": walls[len(walls) // 2], "best_cpu_s": min(cpus)})
            print(f"{algo:<14}{n:>6}{walls[0]:>13.3f}{min(cpus):>12.3f}"
                  f"{walls[len(walls) // 2]:>15.3f}   {f'< {t} s' if t else ''}")
    print(f"load average while measuring: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs "
          "(wall times inflate with load; CPU time much less)")
    # an installed package has bytecode; without it (PYTHONDONTWRITEBYTECODE and no
    # __pycache__) every run compiles parosim's sources first, about 0.03 s of CPU here
    cached = os.path.isdir(os.path.join(root, "parosim", "__pycache__"))
    print(f"parosim bytecode: {'cached' if cached else 'compiled in every run'} "
          f"(PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r}; "
          "`python -m compileall -q parosim` caches it)")
    if a.json:
        print(json.dumps(rows))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cluster", default="paper-a100-roce")
    ap.add_argument("--gpus", type=int, nargs="+", default=None,
                    help="GPU counts (default 64 256 1024 4096; whole-process: 1024)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--whole-process", action="store_true",
                    help="time the whole `parosim collective` command, start-up included")
    ap.add_argument("--repeat", type=int, default=5, help="runs per point (whole-process)")
    ap.add_argument("--algos", nargs="+", default=["ring", "hierarchical", "ho-ring", "nccl"])
    a = ap.parse_args()
    if a.whole_process:
        a.gpus = a.gpus or [1024]
        return whole_process(a)
    a.gpus = a.gpus or [64, 256, 1024, 4096]
    rows = []
    print(f"{'op':<12}{'algo':<14}{'GPUs':>6}{'wall s':>9}{'events':>8}{'events/s':>10}"
          f"{'peak RSS MiB':>14}{'sim time ms':>13}")
    for op in ("all-gather", "all-reduce"):
        for algo in ("ring", "hierarchical", "ho-ring", "nccl"):
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
            if len(a.gpus) > 1:
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
