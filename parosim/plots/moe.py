"""The layer-time distribution of ``parosim experts --routing ... --plot FILE`` (matplotlib
at the edges)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import InputError


def layer_distribution_figure(res: dict, title: str):
    """Histogram of the MoE layer's time per drawn step (ms), with forced balance, the mean
    and p99 marked; ``res`` is the ``moe_layer`` result of ``parosim experts``."""
    from matplotlib.figure import Figure  # deferred: matplotlib loads only when this runs

    t = np.asarray(res["times_s"], dtype=float) * 1e3
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.add_subplot()
    ax.hist(t, bins=max(5, min(50, len(t) // 3)), color="#4c72b0", alpha=0.8,
            label=f"{len(t)} steps, routing {res['routing']}")
    ax.axvline(res["balanced_s"] * 1e3, color="#55a868", lw=2,
               label=f"forced balance = {res['balanced_s'] * 1e3:.3f} ms")
    ax.axvline(float(t.mean()), color="#c44e52",
               label=f"mean = {t.mean():.3f} ms ({100 * res['imbalance_cost']:+.1f} %)")
    ax.axvline(res["p99_s"] * 1e3, color="k", ls=":", label=f"p99 = {res['p99_s'] * 1e3:.3f} ms")
    ax.set_xlabel("MoE layer time, forward + backward (ms)")
    ax.set_ylabel("steps (count)")
    fig.suptitle(f"MoE layer time (ms) over {len(t)} routing draws\n{title}", fontsize=10)
    ax.legend(fontsize=8)
    return fig


def plot_layer_distribution(res: dict, path: str | Path, title: str) -> Path:
    """:func:`layer_distribution_figure` saved at ``path`` (format from the extension)."""
    from .figures import save_as  # deferred: loaded when the command runs (start-up)

    fig = layer_distribution_figure(res, title)
    try:
        return save_as(fig, path)
    except (OSError, ValueError) as e:
        raise InputError(f"--plot file {str(path)!r} cannot be written: "
                         f"{getattr(e, 'strerror', None) or e}") from None
