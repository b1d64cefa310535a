"""Figures of heterogeneous / jittered runs (matplotlib lives at the edges)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import InputError


def step_distribution_figure(step_times_s, title: str):
    """Histogram of step times with the mean, p50, p90 and p99 marked; ``title`` names the
    model, strategy and cluster (the figure title adds the metric and its unit)."""
    from matplotlib.figure import Figure  # deferred: matplotlib loads only when this runs

    t = np.asarray(step_times_s, dtype=float)
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.add_subplot()
    ax.hist(t, bins=max(5, min(50, len(t) // 3)), color="#4c72b0", alpha=0.8,
            label=f"{len(t)} steps")
    for q, style in ((50, "-"), (90, "--"), (99, ":")):
        v = float(np.percentile(t, q))
        ax.axvline(v, color="k", ls=style, label=f"p{q} = {v:.4f} s")
    ax.axvline(float(t.mean()), color="#c44e52", label=f"mean = {t.mean():.4f} s")
    ax.set_xlabel("step time (s)")
    ax.set_ylabel("steps (count)")
    fig.suptitle(f"step time (s), distribution over {len(t)} steps: {title}", fontsize=10)
    ax.legend(fontsize=8)
    return fig


def plot_step_distribution(step_times_s, path: str | Path, title: str) -> Path:
    """:func:`step_distribution_figure` saved at ``path`` (format from the extension)."""
    from .figures import save_as  # deferred: loaded when the command runs (start-up)

    fig = step_distribution_figure(step_times_s, title)
    try:
        return save_as(fig, path)
    except (OSError, ValueError) as e:
        raise InputError(f"--plot file {str(path)!r} cannot be written: "
                         f"{getattr(e, 'strerror', None) or e}") from None
