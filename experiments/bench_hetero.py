"""Benchmarks of heterogeneous runs (docs/heterogeneity.md): wall time, events/s, peak RSS.

1. LLaMA-7B, PaRO-IIG, s = 10, on 1,024 GPUs (128 nodes of paper-a100-roce) with one
   straggler node (every GPU of node 5 at 0.8x): target < 10 s.
2. 100 jittered steps (lognormal, cv 0.05) of the paper's 32-GPU setting (LLaMA-7B IIG,
   4 nodes, b = 4, s = 10): target < 30 s.
3. How cost grows with GPU count without symmetry: one slow NIC (node 0 at 25 Gbps) breaks
   the translation symmetry, so the engine routes every flow; LLaMA-7B IIG s = 10 at
   32 .. 1,024 GPUs, against the homogeneous (reduced) run.

Run: ``PYTHONPATH=. python experiments/bench_hetero.py [--quick]``; prints one line per case.
"""

from __future__ import annotations

import argparse
import resource
import time
from dataclasses import replace

from parosim.io import load_cluster
from parosim.simulate.step import simulate_step
from parosim.spec.model import preset
from parosim.spec.system import Override
from parosim.spec.training import TrainingSpec


def rss_MiB() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run(label, cluster, **kw):
    t0 = time.perf_counter()
    r = simulate_step(preset("llama-7b"), cluster, "IIG", TrainingSpec(), "ho-ring", **kw)
    wall = time.perf_counter() - t0
    ex = r.extra
    print(f"{label:<48} gpus {cluster.gpus:>5}  step {r.step_time_s:8.4f} s  "
          f"p99 {ex['step_time_p99_s']:8.4f} s  wall {wall:7.2f} s  "
          f"events {r.events:>8}  events/s {r.events * ex['repeats'] / wall:>10.0f}  "
          f"period {ex['symmetry_period_nodes']:>4} nodes  peak RSS {rss_MiB():7.0f} MiB",
          flush=True)
    return wall, r


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller third sweep")
    a = ap.parse_args()
    base = load_cluster("paper-a100-roce")
    big = base.with_nodes(128)
    straggler = replace(big, overrides=(Override(nodes=(5,), speed=0.8),))
    run("homogeneous (reference)", big)
    wall, _ = run("1. one straggler node (node 5 at 0.8x)", straggler)
    assert wall < 10, f"straggler step took {wall:.1f} s; target < 10 s"
    wall, _ = run("2. 100 jittered steps (cv 0.05)", base, repeats=100, seed=0,
                  jitter_cv=0.05)
    assert wall < 30, f"100 jittered steps took {wall:.1f} s; target < 30 s"
    for nodes in (4, 16, 32, 64) if a.quick else (4, 16, 64, 128, 512, 2048):
        c = base.with_nodes(nodes)
        run(f"3. symmetric, {nodes} nodes", c)
        slow = replace(c, overrides=(Override(nodes=(0,), nic_bandwidth_Bps=25e9 / 8),))
        run(f"3. node 0 NIC at 25 Gbps (no symmetry), {nodes} nodes", slow)


if __name__ == "__main__":
    main()
