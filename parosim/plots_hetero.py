"""Figures of heterogeneous / jittered runs (matplotlib lives at the edges)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import InputError


def plot_step_distribution(step_times_s, path: str | Path, title: str) -> Path:
    """Histogram of step times with the mean, p50, p90 and p99 marked; PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = np.asarray(step_times_s, dtype=float)
    fig, ax = plt.subplots(figsize=(7, 4), layout="constrained")
    ax.hist(t, bins=max(5, min(50, len(t) // 3)), color="#4c72b0", alpha=0.8,
            label=f"{len(t)} steps")
    for q, style in ((50, "-"), (90, "--"), (99, ":")):
        v = float(np.percentile(t, q))
        ax.axvline(v, color="k", ls=style, label=f"p{q} = {v:.4f} s")
    ax.axvline(float(t.mean()), color="#c44e52", label=f"mean = {t.mean():.4f} s")
    ax.set_xlabel("step time (s)")
    ax.set_ylabel("steps")
    ax.set_title(f"Step-time distribution: {title}")
    ax.legend()
    p = Path(path)
    try:
        fig.savefig(p, dpi=120)
    except OSError as e:
        raise InputError(f"--plot file {str(p)!r} cannot be written: {e.strerror}") from None
    finally:
        plt.close(fig)
    return p
