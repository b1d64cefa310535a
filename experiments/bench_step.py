"""Benchmark: one LLaMA-65B global step, PaRO-IIG, s = 10, at 128, 1,024 and 16,384 GPUs.

Engine (simpy replay) and analytic evaluator: wall time, simpy events, events/s, peak RSS, and
how wall time grows with GPU count. Targets (issue 3): engine < 5 s at 1,024 GPUs, < 60 s and
< 2 GiB at 16,384; analytic <= 10 ms per configuration.
Each point runs in a fresh subprocess so peak RSS is its own.

    python experiments/bench_step.py [--gpus 128 1024 16384] [--strategy IIG] [--algo ho-ring]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys

CHILD = r"""
import json, resource, sys, time
from parosim.io import load_cluster
from parosim.spec.model import preset
from parosim.plan.dataparallel import build_plan
from parosim.evaluate.analytic import evaluate
from parosim.evaluate.replay import replay
from parosim.collectives import Algo
from parosim.spec.training import TrainingSpec
nodes, strategy, algo, mode = int(sys.argv[1]), sys.argv[2], Algo(sys.argv[3]), sys.argv[4]
spec = load_cluster("paper-a100-roce", nodes=nodes)
model, train = preset("llama-65b"), TrainingSpec(accum_steps=10)
t0 = time.perf_counter()
plan = build_plan(model, strategy, spec, train)
t1 = time.perf_counter()
if mode == "engine":
    r = replay(plan, spec, algo)
    step, events = r.step_time_s, r.events
    wall = time.perf_counter() - t0
else:
    # what a sweep point in analytic mode costs: memory check, plan of one micro-step,
    # closed-form evaluation (micro-steps counted s times); mean of repeated runs
    from parosim.simulate.step import simulate_step
    reps = 20
    t2 = time.perf_counter()
    for _ in range(reps):
        step = simulate_step(model, spec, strategy, train, algo, mode="analytic").step_time_s
    wall = (time.perf_counter() - t2) / reps
    events = 0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"wall_s": wall, "plan_s": t1 - t0, "events": events, "step_time_s": step,
                  "ops": len(plan.ops), "peak_rss_bytes": rss}))
"""


def slope(xs, ys):
    lx, ly = [math.log(x) for x in xs], [math.log(max(y, 1e-9)) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum(
        (a - mx) ** 2 for a in lx)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, nargs="+", default=[128, 1024, 16384])
    ap.add_argument("--strategy", default="IIG")
    ap.add_argument("--algo", default="ho-ring")
    a = ap.parse_args()
    print(f"LLaMA-65B, {a.strategy}, s = 10, {a.algo}, paper-a100-roce")
    print(f"{'mode':<10}{'GPUs':>7}{'ops':>7}{'wall s':>10}{'events':>9}{'events/s':>10}"
          f"{'peak RSS MiB':>14}{'step s':>10}")
    for mode in ("engine", "analytic"):
        walls = []
        for n in a.gpus:
            out = subprocess.run([sys.executable, "-c", CHILD, str(n // 8), a.strategy, a.algo,
                                  mode], capture_output=True, text=True, check=True)
            r = json.loads(out.stdout)
            walls.append(r["wall_s"])
            evs = f"{r['events'] / r['wall_s']:>10.0f}" if r["events"] else f"{'-':>10}"
            print(f"{mode:<10}{n:>7}{r['ops']:>7}{r['wall_s']:>10.4f}{r['events']:>9}{evs}"
                  f"{r['peak_rss_bytes'] / 2**20:>14.1f}{r['step_time_s']:>10.3f}")
        print(f"{'':<10}wall time grows as n^{slope(a.gpus, walls):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
