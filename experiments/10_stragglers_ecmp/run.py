"""Stragglers, compute jitter and ECMP hash collisions (docs/heterogeneity.md).

1. One GPU of the paper's 32-GPU setting (LLaMA-7B, PaRO-IIG, b = 4, s = 10, HO-Ring) at
   speed 0.5 .. 1.0, against the critical-path prediction: the step of a cluster whose every
   GPU runs at that speed (a synchronous step waits for its slowest rank at every collective).
2. Lognormal compute jitter, cv 0 .. 0.2, 100 steps each (seed 0), at 32, 256 and 1,024 GPUs:
   mean, p50, p90, p99 of the step time.
3. ECMP hashing on eth-2spine-a100: a 1 GiB ring all-reduce over the inter scope for 200 seeds
   against ideal spreading.

Run from the repository root: ``PYTHONPATH=. python experiments/10_stragglers_ecmp/run.py``.
Writes out/*.csv and out/figures/*.png; prints the tables.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from parosim.collectives import Algo, Op, Scope, simulate_collective  # noqa: E402
from parosim.io import load_cluster  # noqa: E402
from parosim.models import preset  # noqa: E402
from parosim.simulate import simulate_step  # noqa: E402
from parosim.specs import GPUSpec, Override  # noqa: E402
from parosim.training import TrainingSpec  # noqa: E402

OUT = Path(__file__).parent / "out"
FIG = OUT / "figures"
MODEL, T = preset("llama-7b"), TrainingSpec()


def stragglers() -> pd.DataFrame:
    base = load_cluster("paper-a100-roce")
    rows = []
    for speed in (0.5, 0.6, 0.7, 0.8, 0.9, 1.0):
        one = simulate_step(MODEL, replace(base, overrides=(
            Override(gpus=("n2/gpu5",), speed=speed),)), "IIG", T)
        g = base.gpu
        every = simulate_step(MODEL, replace(base, gpu=GPUSpec(
            g.model, g.memory_bytes, g.peak_flops * speed, g.hbm_bandwidth_Bps * speed)),
            "IIG", T)
        rows.append({"speed": speed, "step_time_s": one.step_time_s,
                     "predicted_s": every.step_time_s,
                     "error_pct": 100 * (one.step_time_s / every.step_time_s - 1),
                     "critical_rank": one.extra.get("critical_rank")})
    df = pd.DataFrame(rows)
    fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
    ax.plot(df.speed, df.step_time_s, "o", label="one GPU (rank 21) at this speed")
    ax.plot(df.speed, df.predicted_s, "-", label="critical path: every GPU at this speed")
    ax.set_xlabel("speed of the straggler GPU (x nominal)")
    ax.set_ylabel("step time (s)")
    ax.set_title("LLaMA-7B IIG, paper-a100-roce (32 GPUs): step time vs one straggler")
    ax.legend()
    fig.savefig(FIG / "straggler.png", dpi=120)
    plt.close(fig)
    return df


def jitter() -> pd.DataFrame:
    rows, dists = [], {}
    for nodes in (4, 32, 128):
        c = load_cluster("paper-a100-roce", nodes)
        for cv in (0.0, 0.02, 0.05, 0.1, 0.2):
            r = simulate_step(MODEL, c, "IIG", T, repeats=100, seed=0, jitter_cv=cv)
            e = r.extra
            rows.append({"gpus": c.gpus, "jitter_cv": cv, "mean_s": r.step_time_s,
                         "p50_s": e["step_time_p50_s"], "p90_s": e["step_time_p90_s"],
                         "p99_s": e["step_time_p99_s"]})
            dists[c.gpus, cv] = e.get("step_times_s", [r.step_time_s] * 100)
    df = pd.DataFrame(rows)
    det = df[df.jitter_cv == 0].set_index("gpus").mean_s
    df["mean_vs_deterministic_pct"] = 100 * (df.mean_s / df.gpus.map(det) - 1)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
    for cv in (0.02, 0.05, 0.1, 0.2):
        axes[0].hist(dists[32, cv], bins=20, alpha=0.6, label=f"cv {cv}")
    axes[0].axvline(float(det[32]), color="k", label="no jitter")
    axes[0].set_xlabel("step time (s)")
    axes[0].set_ylabel("steps (of 100)")
    axes[0].set_title("LLaMA-7B IIG, paper-a100-roce, 32 GPUs: step-time distribution")
    axes[0].legend()
    for g, sub in df.groupby("gpus"):
        axes[1].plot(sub.jitter_cv, sub.p99_s / det[g], "o-", label=f"{g} GPUs, p99")
        axes[1].plot(sub.jitter_cv, sub.mean_s / det[g], "x--", label=f"{g} GPUs, mean")
    axes[1].set_xlabel("compute jitter cv (lognormal, per op and rank)")
    axes[1].set_ylabel("step time / step without jitter")
    axes[1].set_title("LLaMA-7B IIG: jitter penalty vs cv and GPU count")
    axes[1].legend(fontsize=8)
    fig.savefig(FIG / "jitter.png", dpi=120)
    plt.close(fig)
    return df


def ecmp() -> pd.DataFrame:
    c = load_cluster("eth-2spine-a100")
    ideal = simulate_collective(replace(c, network=replace(c.network, ecmp="ideal")),
                                Op.ALL_REDUCE, Scope.INTER, 2**30, Algo.RING).time_s
    rows = []
    for seed in range(200):
        h = replace(c, network=replace(c.network, ecmp_seed=seed))
        t = simulate_collective(h, Op.ALL_REDUCE, Scope.INTER, 2**30, Algo.RING).time_s
        rows.append({"seed": seed, "time_s": t, "ideal_s": ideal, "ratio": t / ideal})
    df = pd.DataFrame(rows)
    fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
    ax.hist(df.ratio, bins=20)
    ax.axvline(1.0, color="k", label="ideal spreading")
    ax.axvline(df.ratio.mean(), color="#c44e52", label=f"mean {df.ratio.mean():.2f}x")
    ax.set_xlabel("all-reduce time / ideal spreading")
    ax.set_ylabel("seeds (of 200)")
    ax.set_title("1 GiB inter all-reduce, eth-2spine-a100 (128 GPUs): ECMP hash")
    ax.legend()
    fig.savefig(FIG / "ecmp.png", dpi=120)
    plt.close(fig)
    return df


def main() -> None:
    FIG.mkdir(parents=True, exist_ok=True)
    s = stragglers()
    s.to_csv(OUT / "stragglers.csv", index=False)
    print(s.to_string(index=False))
    j = jitter()
    j.to_csv(OUT / "jitter.csv", index=False)
    print(j.to_string(index=False))
    e = ecmp()
    e.to_csv(OUT / "ecmp.csv", index=False)
    print(f"ECMP hash over {len(e)} seeds: ideal {e.ideal_s[0]:.4f} s, mean "
          f"{e.time_s.mean():.4f} s ({e.ratio.mean():.3f}x), median {e.ratio.median():.3f}x, "
          f"worst {e.time_s.max():.4f} s ({e.ratio.max():.3f}x), best {e.ratio.min():.3f}x")
    assert (s.error_pct.abs() < 1e-6).all(), "a straggler step differs from the prediction"
    assert (e.ratio >= 1 - 1e-9).all(), "hashing beat ideal spreading"


if __name__ == "__main__":
    main()
