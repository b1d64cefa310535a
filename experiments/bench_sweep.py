"""Benchmark of the sweep machinery (issue 4 acceptance): 14 strategies x 6 cluster sizes.

LLaMA-7B, full training, the paper's cluster from 16 to 512 GPUs (2 to 64 nodes), HO-Ring,
every PaRO strategy: 84 points. Engine mode with 2 local worker processes (target < 60 s on
a 2-core machine) and analytic mode (target < 5 s). Prints the wall time of each, process
start-up included; exits 1 if a target is missed.

    python experiments/bench_sweep.py [--workers 2] [--out DIR] [--points-200]

``--points-200``: a 200-point engine sweep instead (8 strategies x 5 sizes x 5 bandwidths,
target < 20 s on 2 workers), run as ``parosim sweep`` runs it (local worker processes).

Besides the wall time it prints the CPU time (user + system) and the peak RSS of the worker
processes (polled from the process tree every 0.1 s; CPU is the better guide on a loaded
machine) and, with ``--events``, the engine's simpy events per second of wall time (the
events are counted by evaluating every point again in this process afterwards).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from parosim.io.sweep import SweepSpec
from parosim.spec.strategy import ALL_STRATEGIES
from parosim.sweep.runner import run_sweep

TARGETS_S = {"engine": 60.0, "analytic": 5.0}


def bench_spec(mode: str) -> SweepSpec:
    return SweepSpec(
        name=f"bench-{mode}", kind="step", mode=mode,
        grid={"nodes": (2, 4, 8, 16, 32, 64),
              "strategy": tuple(s.short for s in ALL_STRATEGIES)},
        fixed={"model": "llama-7b", "cluster": "paper-a100-roce", "algo": "ho-ring",
               "trainable_ratio": "full", "micro_batch": 4, "accum": 10, "seq_len": 512})


def bench_spec_200() -> SweepSpec:
    """200 engine points: 8 strategies (the paper's and the ZeRO baselines) x 5 sizes (16 to
    256 GPUs) x 5 inter-node bandwidths (25 to 400 Gbps per node), LLaMA-7B."""
    return SweepSpec(
        name="bench-engine-200", kind="step", mode="engine",
        grid={"nodes": (2, 4, 8, 16, 32),
              "nic_bandwidth": ("25Gbps", "50Gbps", "100Gbps", "200Gbps", "400Gbps"),
              "strategy": ("NIG", "IIG", "IGG", "ING", "NNG", "NGG", "GGG", "III")},
        fixed={"model": "llama-7b", "cluster": "paper-a100-roce", "algo": "ho-ring",
               "trainable_ratio": "full", "micro_batch": 4, "accum": 10, "seq_len": 512})


class TreeWatch:
    """CPU seconds and peak RSS (MiB) of this process's descendants while it runs."""

    def __init__(self, every_s: float = 0.1):
        self.every_s, self.cpu, self.peak_mib = every_s, {}, 0.0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            for ch in me.children(recursive=True):
                try:
                    with ch.oneshot():
                        t = ch.cpu_times()
                        self.cpu[ch.pid] = t.user + t.system
                        self.peak_mib = max(self.peak_mib, ch.memory_info().rss / 2**20)
                except psutil.Error:
                    pass
            self._stop.wait(self.every_s)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join()


def count_events(spec: SweepSpec) -> int:
    """simpy events of every point of an engine sweep (evaluated here, one after another)."""
    from parosim.simulate.point import point_parallel, point_setup
    from parosim.simulate.step import simulate_step

    total = 0
    for p in spec.points():
        model, cluster, training, strategy, algo, mode, rt = point_setup(p)
        r = simulate_step(model, cluster, strategy, training, algo, mode, runtime=rt,
                          parallel=point_parallel(p))
        total += r.events
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default=None, help="keep results here (default: a temp dir)")
    ap.add_argument("--points-200", action="store_true",
                    help="only the 200-point engine sweep (target < 20 s on 2 workers)")
    ap.add_argument("--events", action="store_true",
                    help="also count the engine's events (runs the points again, serially)")
    a = ap.parse_args()
    root = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="parosim-bench-"))
    ok = True
    runs = [("engine-200", bench_spec_200(), 20.0)] if a.points_200 else [
        (mode, bench_spec(mode), TARGETS_S[mode]) for mode in ("engine", "analytic")]
    for mode, spec, target in runs:
        out = root / mode
        if (out / "results.csv").exists():
            (out / "results.csv").unlink()  # a benchmark never resumes
        t0 = time.perf_counter()
        with TreeWatch() as watch:
            res = run_sweep(spec, out, workers=a.workers, progress=False)
        wall = time.perf_counter() - t0
        hit = wall < target
        ok &= hit
        print(f"{mode:>8}: {res['points']} points ({res['ok']} ok, {res['does_not_fit']} do "
              f"not fit, {res['errors']} errors), {a.workers} workers: {wall:6.2f} s wall "
              f"(target < {target:.0f} s: {'met' if hit else 'MISSED'}), workers' CPU "
              f"{sum(watch.cpu.values()):.2f} s, workers' peak RSS {watch.peak_mib:.0f} MiB; "
              f"results in {out / 'results.csv'}")
        if a.events and spec.mode == "engine":
            n = count_events(spec)
            print(f"{mode:>8}: {n} simpy events, {n / wall:,.0f} events/s of the sweep's wall "
                  "time")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
