"""Stragglers, compute jitter and ECMP hash collisions (docs/heterogeneity.md).

1. One GPU of the paper's 32-GPU setting (LLaMA-7B, PaRO-IIG, b = 4, s = 10, HO-Ring) at
   speed 0.5 .. 1.0, against the critical-path prediction: the step of a cluster whose every
   GPU runs at that speed (a synchronous step waits for its slowest rank at every collective).
2. Lognormal compute jitter, cv 0 .. 0.2, 100 steps each (seed 0), at 32, 256 and 1,024 GPUs:
   mean, p50, p90, p99 of the step time.
3. ECMP hashing on eth-2spine-a100: a 1 GiB ring all-reduce over the inter scope for 200 seeds
   against ideal spreading.

Run from the repository root: ``PYTHONPATH=. python experiments/10_stragglers_ecmp/run.py``.
Writes out/*.csv and out/figures/*.png; prints the tables. ``python run.py --figures`` redraws
the figures from the committed CSVs only (no simulation).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from parosim.collectives import Algo, Op, Scope, simulate_collective
from parosim.io import load_cluster
from parosim.plots.figures import save_as
from parosim.simulate.step import simulate_step
from parosim.spec.model import preset
from parosim.spec.system import GPUSpec, Override
from parosim.spec.training import TrainingSpec

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
    return pd.DataFrame(rows)


def straggler_figure(df: pd.DataFrame) -> Figure:
    fig = Figure(figsize=(6.5, 4.2), layout="constrained")
    ax = fig.add_subplot()
    ax.plot(df.speed, df.step_time_s, "o", label="one GPU (rank 21) at this speed")
    ax.plot(df.speed, df.predicted_s, "-", label="critical path: every GPU at this speed")
    ax.set_xlabel("speed of the straggler GPU (x nominal)")
    ax.set_ylabel("step time (s)")
    ax.set_ylim(0.0, 1.08 * max(df.step_time_s.max(), df.predicted_s.max()))
    fig.suptitle("step time (s) vs one straggler GPU's speed: LLaMA-7B, PaRO-IIG,\n"
                 "paper-a100-roce (32 GPUs)", fontsize=10)
    ax.legend(fontsize=8, loc="lower left")
    return fig


def jitter() -> tuple[pd.DataFrame, pd.DataFrame]:
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
    steps = pd.DataFrame([{"gpus": g, "jitter_cv": cv, "step": i, "step_time_s": t}
                          for (g, cv), ts in dists.items() for i, t in enumerate(ts)])
    return df, steps


def jitter_figure(df: pd.DataFrame, steps: pd.DataFrame) -> Figure:
    """Left: the step-time histograms at 32 GPUs; right: mean and p99 over the step without
    jitter, per GPU count. ``df``: jitter.csv; ``steps``: jitter_steps.csv."""
    det = df[df.jitter_cv == 0].set_index("gpus").mean_s
    fig = Figure(figsize=(11, 4.4), layout="constrained")
    axes = fig.subplots(1, 2)
    for cv in (0.02, 0.05, 0.1, 0.2):
        t = steps[(steps.gpus == 32) & (steps.jitter_cv == cv)].step_time_s
        axes[0].hist(t, bins=20, alpha=0.6, label=f"cv {cv} ({len(t)} steps)")
    axes[0].axvline(float(det[32]), color="k", label="no jitter")
    axes[0].set_xlabel("step time (s)")
    axes[0].set_ylabel("steps (count)")
    axes[0].set_title("32 GPUs: step-time distribution", fontsize=9)
    axes[0].legend(fontsize=8)
    for g, sub in df.groupby("gpus"):
        axes[1].plot(sub.jitter_cv, sub.p99_s / det[g], "o-", label=f"{g} GPUs, p99")
        axes[1].plot(sub.jitter_cv, sub.mean_s / det[g], "x--", label=f"{g} GPUs, mean")
    axes[1].set_xlabel("compute jitter cv (lognormal, per op and rank; ratio)")
    axes[1].set_ylabel("step time / step without jitter (ratio)")
    axes[1].set_title("jitter penalty vs cv and GPU count", fontsize=9)
    axes[1].legend(fontsize=8, ncol=2)
    fig.suptitle("step time (s) under compute jitter (100 steps, seed 0): LLaMA-7B, PaRO-IIG, "
                 "paper-a100-roce (32 to 1,024 GPUs)", fontsize=10)
    return fig


def ecmp() -> pd.DataFrame:
    c = load_cluster("eth-2spine-a100")
    ideal = simulate_collective(replace(c, network=replace(c.network, ecmp="ideal")),
                                Op.ALL_REDUCE, Scope.INTER, 2**30, Algo.RING).time_s
    rows = []
    for seed in range(200):
        h = replace(c, network=replace(c.network, ecmp_seed=seed))
        t = simulate_collective(h, Op.ALL_REDUCE, Scope.INTER, 2**30, Algo.RING).time_s
        rows.append({"seed": seed, "time_s": t, "ideal_s": ideal, "ratio": t / ideal})
    return pd.DataFrame(rows)


def ecmp_figure(df: pd.DataFrame) -> Figure:
    fig = Figure(figsize=(6.5, 4.2), layout="constrained")
    ax = fig.add_subplot()
    ax.hist(df.ratio, bins=20)
    ax.axvline(1.0, color="k", label=f"ideal spreading ({df.ideal_s.iloc[0]:.3f} s)")
    ax.axvline(df.ratio.mean(), color="#c44e52", label=f"mean {df.ratio.mean():.2f}x")
    ax.set_xlabel("all-reduce time / time with ideal spreading (ratio)")
    ax.set_ylabel(f"seeds (count, of {len(df)})")
    fig.suptitle("1 GiB ring all-reduce time over the inter scope, ECMP hashed vs ideal (ratio):"
                 "\neth-2spine-a100 (128 GPUs), one hash seed per sample", fontsize=10)
    ax.legend(fontsize=8)
    return fig


def figures() -> list:
    """Draw the three figures from the CSVs under out/ (written by :func:`main`)."""
    FIG.mkdir(parents=True, exist_ok=True)
    return [save_as(straggler_figure(pd.read_csv(OUT / "stragglers.csv")),
                    FIG / "straggler.png"),
            save_as(jitter_figure(pd.read_csv(OUT / "jitter.csv"),
                                  pd.read_csv(OUT / "jitter_steps.csv")), FIG / "jitter.png"),
            save_as(ecmp_figure(pd.read_csv(OUT / "ecmp.csv")), FIG / "ecmp.png")]


def main() -> None:
    FIG.mkdir(parents=True, exist_ok=True)
    s = stragglers()
    s.to_csv(OUT / "stragglers.csv", index=False)
    print(s.to_string(index=False))
    j, steps = jitter()
    j.to_csv(OUT / "jitter.csv", index=False)
    steps.to_csv(OUT / "jitter_steps.csv", index=False)
    print(j.to_string(index=False))
    e = ecmp()
    e.to_csv(OUT / "ecmp.csv", index=False)
    print(f"ECMP hash over {len(e)} seeds: ideal {e.ideal_s[0]:.4f} s, mean "
          f"{e.time_s.mean():.4f} s ({e.ratio.mean():.3f}x), median {e.ratio.median():.3f}x, "
          f"worst {e.time_s.max():.4f} s ({e.ratio.max():.3f}x), best {e.ratio.min():.3f}x")
    assert (s.error_pct.abs() < 1e-6).all(), "a straggler step differs from the prediction"
    assert (e.ratio >= 1 - 1e-9).all(), "hashing beat ideal spreading"
    figures()


if __name__ == "__main__":
    figures() if sys.argv[1:] == ["--figures"] else main()
