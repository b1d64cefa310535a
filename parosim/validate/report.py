"""Comparison of simulated and measured times: rows, summary, ordering check, plot.

A row (JSON contract of ``parosim validate --json``, stable across versions)::

    {"what": "collective" | "step", "op", "algo", "strategy", "size_bytes",
     "simulated_s", "measured_s", "error_pct", ...}

``error_pct = 100 * (simulated - measured) / measured`` (positive: the simulator is slow).
pandas and matplotlib are imported only by :func:`to_frame` and :func:`plot`.
"""

from __future__ import annotations

import math
import statistics
from itertools import combinations


def error_pct(simulated_s: float, measured_s: float) -> float:
    """Signed relative error of the simulation in percent of the measurement."""
    return 100.0 * (simulated_s - measured_s) / measured_s


def row(what: str, simulated_s: float, measured_s: float, *, op: str | None = None,
        algo: str | None = None, strategy: str | None = None,
        size_bytes: float | None = None, **extra) -> dict:
    """One comparison row with its error.

    >>> row("collective", 1.1, 1.0, op="all-gather", algo="ring")["error_pct"]
    10.000000000000009
    """
    return {"what": what, "op": op, "algo": algo, "strategy": strategy,
            "size_bytes": size_bytes, "simulated_s": simulated_s, "measured_s": measured_s,
            "error_pct": error_pct(simulated_s, measured_s), **extra}


def summary(rows: list[dict]) -> dict:
    """``median_error_pct`` and ``max_error_pct`` (of absolute errors) over rows.

    >>> summary([row("step", 1.1, 1.0), row("step", 0.8, 1.0), row("step", 1.0, 1.0)])
    {'median_error_pct': 10.000000000000009, 'max_error_pct': 19.999999999999996, 'n_rows': 3}
    """
    errs = [abs(r["error_pct"]) for r in rows]
    return {"median_error_pct": statistics.median(errs) if errs else 0.0,
            "max_error_pct": max(errs, default=0.0), "n_rows": len(rows)}


def ordering_mismatches(rows: list[dict], key=("what", "op", "size_bytes", "strategy"),
                        by: str = "algo", margin: float = 0.10,
                        tie: float = 0.05) -> list[str]:
    """Pairs whose simulated order differs from their measured order.

    Rows are grouped by ``key``; within a group every pair (e.g. ring vs ho-ring) whose
    *simulated* times differ by more than ``margin`` (relative to the smaller) must not be
    measured in the opposite order: a violation is a measured order reversed by more than
    ``tie`` (relative). Measured times closer than ``tie`` are a tie within the run-to-run
    noise of one measurement (the size of that error is what the per-row error bound checks).
    Returns one line per violation (empty: orders agree).

    >>> a = row("collective", 1.0, 1.0, op="ag", algo="ring", size_bytes=1)
    >>> b = row("collective", 2.0, 0.9, op="ag", algo="ho-ring", size_bytes=1)
    >>> ordering_mismatches([a, b])
    ['ag size 1: simulated ring < ho-ring by 100%, measured 1 s vs 0.9 s']
    >>> c = row("collective", 2.0, 0.99, op="ag", algo="ho-ring", size_bytes=1)
    >>> ordering_mismatches([a, c])   # measured 1% apart: a tie, not a reversal
    []
    """
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r.get(k) for k in key), []).append(r)
    bad = []
    for g, rs in groups.items():
        for a, b in combinations(rs, 2):
            lo, hi = sorted((a, b), key=lambda r: r["simulated_s"])
            if hi["simulated_s"] <= lo["simulated_s"] * (1 + margin):
                continue
            if not hi["measured_s"] * (1 + tie) > lo["measured_s"]:
                g4 = (*g, None, None, None, None)   # keys of any length (steps use 3)
                label = " ".join(str(x) for x in (g4[1] or g4[0], g4[3]) if x)
                size = (f" size {g4[2]:g}" if isinstance(g4[2], (int, float)) and g4[2]
                        else "")
                bad.append(f"{label}{size}: simulated {lo[by]} < {hi[by]} by "
                           f"{100 * (hi['simulated_s'] / lo['simulated_s'] - 1):.0f}%, "
                           f"measured {lo['measured_s']:.3g} s vs {hi['measured_s']:.3g} s")
    return bad


def to_frame(rows: list[dict]):
    """The rows as a pandas DataFrame (the edge of the harness)."""
    import pandas as pd  # deferred: pandas loads only when this runs

    return pd.DataFrame(rows)


def log_ticks(lo: float, hi: float, most: int = 6) -> list[float]:
    """At most ``most`` round values (1, 2, 5 per decade; finer when the range is short)
    spread evenly over the log range ``lo..hi``, so their labels cannot collide.

    >>> log_ticks(8e-4, 1e-2)
    [0.001, 0.002, 0.005, 0.01]
    >>> log_ticks(1e-6, 1e2)
    [1e-06, 0.0001, 0.01, 1.0, 100.0]
    """
    e0, e1 = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    span = math.log10(hi / lo)
    for subs in ((1,), (1, 2, 5), (1, 1.5, 2, 3, 4, 5, 6, 7, 8, 9),
                 tuple(1 + k / 10 for k in range(90))):
        cands = [float(f"{m * 10.0 ** e:.6g}") for e in range(e0, e1 + 1) for m in subs]
        cands = sorted(v for v in cands if lo <= v <= hi)
        if len(cands) >= 3 or subs[-1] > 9 and cands:
            break
    out: list[float] = []
    for v in cands:  # evenly apart on the log axis
        if not out or math.log10(v / out[-1]) >= span / (most + 0.5):
            out.append(v)
    return out


def _log_ticks(ax, lo: float, hi: float) -> None:
    """Few labelled ticks on both log axes (:func:`log_ticks`), written plainly (``0.002``);
    minor ticks unlabelled (matplotlib labels the minor ticks of a short range, and those
    labels collide)."""
    from matplotlib.ticker import (  # deferred: matplotlib loads only when this runs
        FixedLocator,
        FuncFormatter,
        LogLocator,
        NullFormatter,
    )

    ticks = log_ticks(lo, hi)
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(FixedLocator(ticks))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_locator(LogLocator(base=10, subs="auto", numticks=12))
        axis.set_minor_formatter(NullFormatter())


def plot(df, title: str = "simulated vs measured time (s): parosim validate"):
    """Predicted vs measured (log-log), one marker per ``algo`` / ``what``, and y = x.

    Takes a DataFrame with ``simulated_s``, ``measured_s`` (and optionally ``algo``, ``what``)
    and returns a matplotlib Figure; the caller saves or shows it.
    """
    from matplotlib.figure import Figure  # deferred: matplotlib loads only when this runs

    fig = Figure(figsize=(6, 5.5), layout="constrained")
    ax = fig.add_subplot()
    label_col = "algo" if "algo" in df else None
    groups = df.groupby(df[label_col].fillna(df.get("what", "row"))) if label_col else [
        ("rows", df)]
    for (name, g), marker in zip(groups, "os^Dvx+*", strict=False):
        if "what" in g and (g["what"] == "step").all() and "strategy" in g:
            name = f"step {name}"
        ax.scatter(g["measured_s"], g["simulated_s"], marker=marker, label=str(name), alpha=0.8)
    lo = float(min(df["measured_s"].min(), df["simulated_s"].min())) * 0.8
    hi = float(max(df["measured_s"].max(), df["simulated_s"].max())) * 1.25
    ax.plot([lo, hi], [lo, hi], "k-", lw=1, label="y = x")
    ax.plot([lo, hi], [lo * 1.1, hi * 1.1], "k:", lw=0.8, label="±10%")
    ax.plot([lo, hi], [lo / 1.1, hi / 1.1], "k:", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    _log_ticks(ax, lo, hi)
    ax.set_xlabel("measured time (s)")
    ax.set_ylabel("simulated time (s)")
    fig.suptitle(title, fontsize=10)
    ax.legend(fontsize=8)
    return fig
