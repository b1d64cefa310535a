"""Engine against closed form for every dense x expert pair of one MoE layout, per
all-to-all algorithm (docs/moe.md, "A MoE training step"): Qwen3-30B-A3B at EP 16 on 4 x 8
H100 (dgx-h100-ib), b = 1, s = 2048, accum 1, flat compute.

    PYTHONPATH=$PWD python experiments/moe_a2a_grid.py                    # both algorithms
    PYTHONPATH=$PWD python experiments/moe_a2a_grid.py --a2a-algo deepep-normal --workers 2
    PYTHONPATH=$PWD python experiments/moe_a2a_grid.py --pairs NGG:GGG,GGG:GGG -v

Prints, per algorithm: the fitting pairs, how many agree within 1 % (|engine / closed form
- 1| <= 0.01), the smallest and largest engine / closed form - 1 and the pairs outside 1 %
(``-v``: every pair). Every run is a pure function of its inputs (the same numbers each time).
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ProcessPoolExecutor

from parosim.io import load_cluster
from parosim.simulate.moe import simulate_moe_step
from parosim.spec.model import preset
from parosim.spec.strategy import ALL_STRATEGIES
from parosim.spec.training import TrainingSpec

MODEL = "qwen3-30b-a3b"
EP, NODES = 16, 4
TRAINING = TrainingSpec(micro_batch=1, seq_len=2048, accum_steps=1, compute_model="flat")


def _pair(args: tuple) -> tuple:
    """(dense, expert, engine / closed form - 1 or None where the pair does not fit)."""
    s, x, algo = args
    model, c = preset(MODEL), load_cluster("dgx-h100-ib", nodes=NODES)
    a = simulate_moe_step(model, c, s, x, TRAINING, EP, mode="analytic", a2a_algo=algo)
    if not a.fits:
        return s, x, None
    e = simulate_moe_step(model, c, s, x, TRAINING, EP, mode="engine", a2a_algo=algo)
    return s, x, e.step_time_s / a.step_time_s - 1.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a2a-algo", default="hierarchical-a2a,deepep-normal",
                    help="comma-separated all-to-all algorithms")
    ap.add_argument("--pairs", default="", help="DENSE:EXPERT,... (default: all 14 x 14)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("-v", action="store_true", help="print every pair")
    args = ap.parse_args()
    pairs = ([tuple(p.split(":")) for p in args.pairs.split(",")] if args.pairs else
             [(s.short, x.short) for s in ALL_STRATEGIES for x in ALL_STRATEGIES])
    for algo in args.a2a_algo.split(","):
        t0 = time.perf_counter()
        jobs = [(s, x, algo) for s, x in pairs]
        if args.workers > 1:
            with ProcessPoolExecutor(args.workers) as ex:
                out = list(ex.map(_pair, jobs))
        else:
            out = [_pair(j) for j in jobs]
        errs = [(s, x, r) for s, x, r in out if r is not None]
        within = sum(abs(r) <= 0.01 for _, _, r in errs)
        rs = [r for _, _, r in errs]
        print(f"{algo}: {len(errs)} fitting pairs, {within} within 1 %, engine / closed form "
              f"- 1 from {min(rs):+.4%} to {max(rs):+.4%} "
              f"({time.perf_counter() - t0:.0f} s)" if errs else f"{algo}: no fitting pair")
        for s, x, r in sorted(errs, key=lambda e: -abs(e[2])):
            if args.v or abs(r) > 0.01:
                print(f"  {s} x {x}: {r:+.4%}")


if __name__ == "__main__":
    main()
