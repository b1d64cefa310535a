"""Figures from sweep results: each function takes a DataFrame and returns a Figure.

Thin shells over matplotlib's object API (``matplotlib.figure.Figure``, no pyplot state, so
no global backend is touched; saving uses the Agg canvas). Every plot function has the same
keyword-only options so a sweep spec can name them: ``x``, ``metric``, ``hue``, ``title``
(``None`` = the plot's default). Rows whose ``status`` is not ``ok`` are drawn as marked
(``does not fit`` / ``error``) rather than silently dropped where the plot has a place for them.

>>> import pandas as pd
>>> df = pd.DataFrame({"strategy": ["NIG", "GGG"], "status": ["ok", "does-not-fit"],
...                    "tokens_per_s_per_gpu": [3000.0, float("nan")]})
>>> fig = throughput_bars(df)
>>> [t.get_text() for t in fig.axes[0].texts]  # the best bar starred, the other marked
['★', 'does not fit']
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

LABELS: dict[str, str] = {
    "tokens_per_s": "throughput (tokens/s)",
    "tokens_per_s_per_gpu": "throughput per GPU (tokens/s)",
    "samples_per_s": "throughput (samples/s)",
    "step_time_s": "step time (s)",
    "tflops_per_gpu": "TFLOP/s per GPU",
    "mfu": "MFU (fraction of peak)",
    "exposed_comm_s": "exposed communication (s)",
    "total_bytes": "memory per GPU (GiB)",
    "model_states_bytes": "model states per GPU (GiB)",
    "time_s": "time (ms)",
    "busbw_GBps": "bus bandwidth (GB/s)",
    "algbw_GBps": "algorithm bandwidth (GB/s)",
    "size_bytes": "message size (MB, 1e6 bytes)",
    "gpus": "GPUs",
    "nic_bandwidth": "inter-node bandwidth per NIC (Gbps)",
    "intra_bandwidth": "intra-node bandwidth per GPU (Gbps)",
    "strategy": "strategy",
    "group_nodes": "nodes per group",
}
_SCALE = {"total_bytes": 2**-30, "model_states_bytes": 2**-30, "time_s": 1e3,
          "size_bytes": 1e-6}
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
          "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39")


def _log_x(ax, xs: Iterable[float]) -> None:
    """Log-2 x axis with ticks at the data values, written plainly (16, 32, ... not 2^4)."""
    from matplotlib.ticker import NullFormatter  # deferred: matplotlib loads only when this runs

    ticks = sorted({v for v in xs if v == v and v > 0})
    if ticks:  # nothing positive to show (e.g. every point failed): keep a linear axis
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [f"{int(v)}" if v == int(v) and v < 1e7 else f"{v:.4g}"
                              for v in ticks],
                      rotation=45 if len(ticks) > 4 else 0)
        ax.xaxis.set_minor_formatter(NullFormatter())


def bytes_x(ax) -> None:
    """A log-2 x axis of byte sizes with ticks written as sizes (``64 MiB``), not ``6.4e+07``."""
    from matplotlib.ticker import (  # deferred: matplotlib loads only when this runs
        FuncFormatter,
        LogLocator,
        NullFormatter,
    )

    from ..units import fmt_size  # deferred: loaded when the command runs (start-up)

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(LogLocator(base=2, numticks=9))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt_size(v) if v >= 1 else ""))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _label(col: str) -> str:
    return LABELS.get(col, col.replace("_", " "))


def _values(df, col: str) -> list[float]:
    """A column as floats in display units (GiB for memory, ms for time, Gbps for links)."""
    if col in ("nic_bandwidth", "intra_bandwidth"):
        from ..units import parse_bandwidth  # deferred: loaded when the command runs (start-up)
        return [parse_bandwidth(v) * 8 / 1e9 if isinstance(v, str) else float(v) * 8 / 1e9
                for v in df[col]]
    scale = _SCALE.get(col, 1.0)
    return [float(v) * scale for v in df[col]]


def _ok(df) -> Any:
    return df["status"] == "ok" if "status" in df.columns else df.index == df.index


def _uniq(values: Iterable) -> list:
    """Distinct values in order of first appearance (grid order)."""
    seen: dict = {}
    for v in values:
        seen.setdefault(v, None)
    return list(seen)


def _default_hue(df, candidates: tuple[str, ...]) -> str | None:
    for c in candidates:
        if c in df.columns and df[c].nunique(dropna=False) > 1:
            return c
    return None


def _fw(name: Any) -> str:
    """``GGG (ZeRO-3 / FSDP)``: a strategy with its framework name, when it has one."""
    from ..spec.strategy import FRAMEWORK_NAMES  # deferred: loaded when the command runs (start-up)

    short = str(name).replace("PaRO-", "")
    fw = FRAMEWORK_NAMES.get(short)
    return f"{name} ({fw})" if fw else str(name)


def _series_key(df, hue: str | None, base: str) -> list[str]:
    names = [_fw(v) if base == "strategy" else str(v) for v in df[base]]
    if hue is None:
        return names
    return [f"{a}, {hue.replace('_', ' ')} {b}" if hue not in ("algo",) else f"{a} / {b}"
            for a, b in zip(names, df[hue], strict=False)]


def _stem(v: Any) -> str:
    v = str(v)
    return Path(v).stem if v.endswith((".yaml", ".yml")) else v


def context(df) -> str:
    """What the data is about, for titles: ``llama-7b on paper-a100-roce, 32 GPUs``."""
    def vals(col: str) -> list[str]:
        if col not in df.columns:
            return []
        return [_stem(v) for v in _uniq(df[col].dropna())]

    parts = []
    models, clusters = vals("model"), vals("cluster")
    if models:
        parts.append(", ".join(models))
    if clusters:
        parts.append(("on " if models else "") + ", ".join(clusters))
    gpus = vals("gpus")
    if len(gpus) == 1:
        parts.append(f"({gpus[0]} GPUs)")
    return " ".join(parts) if parts else ""


def _suptitle(fig: Figure, df, metrics: Iterable[str], title: str | None) -> None:
    """The figure title: metric(s) with unit, model and cluster (and the spec's title)."""
    what = " and ".join(_label(m) for m in metrics)
    ctx = context(df)
    head = f"{what}: {ctx}" if ctx else what
    fig.suptitle(head if not title else f"{title}\n{head}", fontsize=10)


# ---------------------------------------------------------------------------------------------
# Throughput per strategy (bars).
# ---------------------------------------------------------------------------------------------


def _panel_col(df) -> str | None:
    """The column that splits throughput bars into panels: the node count (else the GPU
    count) when the rows have several."""
    for c in ("nodes", "gpus"):
        if c in df.columns and df[c].nunique(dropna=True) > 1:
            return c
    return None


def _panel_title(df, col: str, v: Any) -> str:
    sub = df[df[col] == v]
    if col == "nodes" and "gpus" in df.columns and sub["gpus"].nunique() == 1:
        return f"{v} nodes ({sub['gpus'].iloc[0]} GPUs)"
    return f"{v} {'nodes' if col == 'nodes' else 'GPUs'}"


def throughput_bars(df, *, x: str | None = None, metric: str | None = None,
                    hue: str | None = None, title: str | None = None) -> Figure:
    """Bars of ``metric`` (default tokens/s per GPU) per strategy; grouped by ``hue`` (default
    the algorithm or group size when they vary). Points that do not fit get an empty slot, a
    red cross and the text ``does not fit``; failed points ``error``. The best bar of each
    panel is starred. Rows with several node (or GPU) counts get one panel per count; rows
    that would still share a bar are refused (``ValueError``), never dropped.
    """
    x = x or "strategy"
    metric = metric or "tokens_per_s_per_gpu"
    hue = hue or _default_hue(df, ("algo", "group_nodes", "model", "trainable_ratio"))
    pcol = _panel_col(df) if x not in ("nodes", "gpus") and hue not in ("nodes", "gpus") \
        else None
    panels = _uniq(df[pcol]) if pcol else [None]
    keys = [c for c in (pcol, x, hue) if c]
    dup = df.duplicated(keys, keep=False)
    if dup.any():
        # a point's inputs: results.csv's columns before ``status``, and any other column
        # that is not a float measurement
        cols = list(df.columns)
        cut = cols.index("status") if "status" in cols else len(cols)
        inputs = cols[:cut] + [c for c in cols[cut:] if df[c].dtype.kind != "f"
                               and c not in ("status", "error", "fits")]
        varying = [c for c in inputs if c in df.columns and c not in keys
                   and df[dup][c].nunique(dropna=False) > 1]
        raise ValueError(f"plot 'throughput': {int(dup.sum())} rows share a bar (same "
                         f"{', '.join(keys)}); they differ in {', '.join(varying) or 'nothing'}"
                         "; expected that column in the figure's by: or hue:")
    cats = _uniq(df[x])
    groups = _uniq(df[hue]) if hue else [None]
    width = 0.8 / len(groups)
    w1 = max(6.0, 0.55 * len(cats) * max(1, len(groups) ** 0.5) + 2)
    fig = Figure(figsize=(w1 if len(panels) == 1 else min(6.0 + 0.5 * len(cats), 8.0)
                          * len(panels), 4.6), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False, sharey=True)[0]
    ok = _ok(df)
    top = df[ok][metric].max() if ok.any() else math.nan
    ymax = top if top == top else 1.0
    for ax, pv in zip(axes, panels, strict=True):
        pdf = df if pv is None else df[df[pcol] == pv]
        pok = _ok(pdf)
        best = pdf[pok][metric].max() if pok.any() else math.nan
        nofit_x: list[float] = []
        for gi, g in enumerate(groups):
            sub = pdf if g is None else pdf[pdf[hue] == g]
            pos, heights = [], []
            for ci, c in enumerate(cats):
                row = sub[sub[x] == c]
                px = ci - 0.4 + width * (gi + 0.5)
                pos.append(px)
                st = row["status"].iloc[0] if not row.empty and "status" in row else "ok"
                if row.empty or st != "ok":
                    heights.append(0.0)
                    if not row.empty:
                        nofit_x.append(px)
                        ax.text(px, ymax * 0.02,
                                "does not fit" if st == "does-not-fit" else "error",
                                rotation=90, ha="center", va="bottom", fontsize=7, color="#b00")
                else:
                    v = float(row[metric].iloc[0])
                    heights.append(v)
                    if v == best:
                        ax.annotate("★", (px, v), ha="center", va="bottom", fontsize=11)
            label = None if g is None else f"{hue.replace('_', ' ')} = {g}" if hue != "algo" \
                else str(g)
            ax.bar(pos, heights, width * 0.92, label=label, color=COLORS[gi % len(COLORS)])
        if nofit_x:
            ax.plot(nofit_x, [0.0] * len(nofit_x), linestyle="none", marker="x", color="#b00",
                    markersize=7, label="does not fit / error")
        ax.set_xlabel(_label(x))
        ax.set_ylabel(_label(metric))
        ax.set_ylim(0, ymax * 1.15)
        # vertical names: slanted ones overlap their neighbours when long
        ax.set_xticks(range(len(cats)), [_fw(c) if x == "strategy" else str(c) for c in cats],
                      rotation=90 if len(cats) > 4 else 0)
        head = f"{_label(metric)} per {_label(x)} (★ best)"
        ax.set_title(head if pv is None else f"{_panel_title(df, pcol, pv)}: {head}",
                     fontsize=9)
        if ax is axes[0]:
            _legend(ax, fig, loc="upper left")
    _suptitle(fig, df, [metric], title)
    return fig


# ---------------------------------------------------------------------------------------------
# Lines: scalability and metric vs any x, one line per strategy.
# ---------------------------------------------------------------------------------------------


def _lines(ax, df, x: str, metric: str, series: list[str], per_gpu_eff: bool = False) -> dict:
    xs_all = _values(df, x)
    ys_all = _values(df, metric) if metric in df.columns else [math.nan] * len(df)
    ok = list(_ok(df))
    out: dict[str, list[tuple[float, float]]] = {}
    for s in _uniq(series):
        pts = sorted((xs_all[i], ys_all[i] if ok[i] else math.nan)
                     for i in range(len(df)) if series[i] == s)
        out[s] = pts
    # series with the same points would draw on top of each other: one line, one legend entry
    # naming them all (``NGG = GNG``)
    groups: dict[tuple, list[str]] = {}
    never: list[str] = []
    for s, pts in out.items():
        if all(py != py for _, py in pts):
            never.append(s)  # no point fits: nothing to draw, named once below
            continue
        key = tuple((round(px, 9), None if py != py else float(f"{py:.9g}")) for px, py in pts)
        groups.setdefault(key, []).append(s)
    for k, names in enumerate(groups.values()):
        pts = out[names[0]]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=4,
                label=_wrap(" = ", names), color=COLORS[k % len(COLORS)])
    if never:
        ax.plot([], [], linestyle="none", marker="x", color="#b00",
                label=_wrap(", ", never, "no point fits: "))
    return out


def _wrap(sep: str, names: list[str], head: str = "", per_line: int = 3) -> str:
    """Names joined by ``sep``, ``per_line`` to a line (a legend entry stays narrow)."""
    lines = [sep.join(names[i:i + per_line]) for i in range(0, len(names), per_line)]
    return head + (sep.strip() + "\n").join(lines) if sep.strip() else head + "\n".join(lines)


def _legend(ax, fig: Figure | None = None, **kw) -> None:
    """A legend inside the axes when it is short, outside on the right when long."""
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    if len(handles) > 8 and fig is not None:
        kw = {k: v for k, v in kw.items() if k not in ("loc", "ncol", "fontsize")}
        ax.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                  borderaxespad=0.0, **kw)
    else:
        ax.legend(handles, labels, **{"fontsize": 8, **kw})


def scalability(df, *, x: str | None = None, metric: str | None = None,
                hue: str | None = None, title: str | None = None,
                measured: Iterable[dict] | None = None) -> Figure:
    """Left: ``metric`` (default tokens/s) vs GPUs; right: scaling efficiency vs GPUs, i.e.
    per-GPU throughput relative to the same strategy's smallest GPU count that fits (1 =
    linear). One line per strategy (per strategy / ``hue`` when given or varying).
    ``measured``: rows of measured points (``series``, x, the metric and / or
    ``scaling_efficiency``, optional ``source``; parosim.io.sweep validates them), drawn as
    open markers beside the lines, in a line's colour when ``series`` names it."""
    x = x or "gpus"
    metric = metric or "tokens_per_s"
    hue = hue or _default_hue(df, ("algo", "group_nodes"))
    series = _series_key(df, hue, "strategy")
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    ax, ax2 = fig.subplots(1, 2)
    data = _lines(ax, df, x, metric, series)
    # efficiency(n) = per-GPU throughput at n / per-GPU throughput at the smallest n that fits
    per_gpu = _per_gpu_throughput(df)
    xs_all = _values(df, x)
    ok = list(_ok(df))
    eff_series: dict[str, list[tuple[float, float]]] = {}
    for name in data:
        pts = sorted((xs_all[i], per_gpu[i] if ok[i] else math.nan)
                     for i in range(len(df)) if series[i] == name)
        base = next((py for _, py in pts if py == py), None)
        eff_series[name] = [(px, py / base if base and py == py else math.nan)
                            for px, py in pts]
    colors = {ln.get_label(): ln.get_color() for ln in ax.get_lines()}
    groups: dict[tuple, list[str]] = {}
    for name, pts in eff_series.items():
        if all(py != py for _, py in pts):
            continue
        key = tuple((px, None if py != py else round(py, 9)) for px, py in pts)
        groups.setdefault(key, []).append(name)
    for k, names in enumerate(groups.values()):
        pts = eff_series[names[0]]
        label = _wrap(" = ", names)
        ax2.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=4,
                 color=colors.get(label, COLORS[k % len(COLORS)]), label=label)
    ax2.ticklabel_format(axis="y", useOffset=False)
    tops, m_effs = _measured_points(ax, ax2, list(measured or ()), x, metric, colors)
    # anchored at 0: an auto-zoomed axis (0.993-1.000) makes a 0.7 % spread look like a fan
    effs = [py for pts in eff_series.values() for _, py in pts if py == py] + m_effs
    ax2.set_ylim(0.0, max(1.0, max(effs, default=1.0)) * 1.05)
    ideal = ax2.axhline(1.0, color="k", linestyle=":", linewidth=1, label="linear scaling")
    # the metric's panel too: a 1 % spread stays 1 % tall
    top = max([py for pts in data.values() for _, py in pts if py == py] + tops, default=1.0)
    ax.set_ylim(0.0, top * 1.05)
    for a in (ax, ax2):
        _log_x(a, _values(df, x))
        a.set_xlabel(_label(x))
        a.grid(alpha=0.3)
    ax.set_ylabel(_label(metric))
    ax2.set_ylabel("scaling efficiency (1 = linear)")
    ax.set_title(f"{_label(metric)} vs {_label(x)}", fontsize=9)
    ax2.set_title("tokens/s per GPU at n / the same at the smallest n", fontsize=9)
    handles, labels = ax.get_legend_handles_labels()
    ax2.legend(handles=[ideal], fontsize=8, loc="lower left")
    fig.legend(handles, labels, loc="outside lower center", fontsize=7,
               ncol=min(4, max(1, len(handles))))
    _suptitle(fig, df, [metric], title)
    return fig


def _measured_points(ax, ax2, rows: list[dict], x: str, metric: str,
                     colors: dict[str, str]) -> tuple[list[float], list[float]]:
    """Draw measured points (open markers) on the metric panel ``ax`` and the efficiency
    panel ``ax2``; return the metric values and the efficiencies drawn (for the axes' tops).
    A series' efficiency is its ``scaling_efficiency`` when given, else its per-GPU metric
    over the same at its smallest x (a total metric is divided by the GPUs when x is
    ``gpus``)."""
    by_name = {}
    for label, color in colors.items():
        for name in label.split(" = "):
            by_name[name] = color
            by_name.setdefault(name.split(" (")[0], color)
    drawn: list[float] = []
    drawn_effs: list[float] = []
    series = list(dict.fromkeys(r["series"] for r in rows))
    for k, name in enumerate(series):
        pts = sorted((r for r in rows if r["series"] == name), key=lambda r: r[x])
        color = by_name.get(name, COLORS[(len(colors) + k) % len(COLORS)])
        src = next((r["source"] for r in pts if r.get("source")), "")
        label = f"{name} measured" + (f" ({src})" if src else "")
        style = dict(linestyle="none", marker="D", markersize=7, markerfacecolor="none",
                     markeredgewidth=1.6, color=color)
        vals = [(r[x], r[metric]) for r in pts if isinstance(r.get(metric), float)]
        if vals:
            ax.plot([v[0] for v in vals], [v[1] for v in vals], label=label, **style)
            drawn += [v[1] for v in vals]
        effs = [(r[x], r["scaling_efficiency"]) for r in pts
                if isinstance(r.get("scaling_efficiency"), float)]
        if not effs and vals:
            per_gpu = [(px, py / px if x == "gpus" and metric == "tokens_per_s" else py)
                       for px, py in vals]
            effs = [(px, py / per_gpu[0][1]) for px, py in per_gpu]
        if effs:
            ax2.plot([e[0] for e in effs], [e[1] for e in effs],
                     label=None if vals else label, **style)
            drawn_effs += [e[1] for e in effs]
            if not vals:   # only efficiencies: the legend entry comes from the metric panel
                ax.plot([], [], label=label, **style)
    return drawn, drawn_effs


def _per_gpu_throughput(df) -> list[float]:
    """Tokens/s per GPU of each row (the column, or tokens/s divided by the GPU count)."""
    if "tokens_per_s_per_gpu" in df.columns:
        return [float(v) for v in df["tokens_per_s_per_gpu"]]
    if "tokens_per_s" in df.columns and "gpus" in df.columns:
        return [float(t) / float(g) for t, g in zip(df["tokens_per_s"], df["gpus"],
                                                     strict=False)]
    raise ValueError("scaling efficiency needs tokens_per_s_per_gpu, or tokens_per_s and gpus")


def best_strategy(df, *, x: str | None = None, metric: str | None = None,
                  hue: str | None = None, title: str | None = None) -> Figure:
    """``metric`` (default tokens/s per GPU) vs ``x`` (default the NIC bandwidth), one line
    per strategy, with the best strategy at each x written above the curves."""
    x = x or "nic_bandwidth"
    metric = metric or "tokens_per_s_per_gpu"
    if x not in df.columns or df[x].nunique(dropna=True) < 2:
        raise ValueError(f"plot 'best': x {x!r} has {df[x].nunique() if x in df else 0} "
                         "distinct values in these rows; expected a swept axis (x: in the "
                         "figure entry)")
    series = _series_key(df, hue, "strategy")
    fig = Figure(figsize=(8, 4.6), layout="constrained")
    ax = fig.add_subplot()
    data = _lines(ax, df, x, metric, series)
    xs = sorted({p[0] for pts in data.values() for p in pts})
    top = max((p[1] for pts in data.values() for p in pts if p[1] == p[1]), default=1.0)
    for xv in xs:
        cands = [(py, s) for s, pts in data.items() for px, py in pts if px == xv and py == py]
        if cands:
            # the short name (the legend carries the framework name): it stays in the axes
            ax.text(xv, top * 1.03, max(cands)[1].split(" (")[0], ha="center", va="bottom",
                    fontsize=8, rotation=90, fontweight="bold")
    _log_x(ax, xs)
    ax.set_ylim(0, top * 1.3)
    ax.set_xlabel(_label(x))
    ax.set_ylabel(_label(metric))
    ax.set_title(f"best strategy vs {_label(x)}", fontsize=9)
    _legend(ax, fig, fontsize=7, ncol=3, loc="lower right")
    ax.grid(alpha=0.3)
    _suptitle(fig, df, [metric], title)
    return fig


# ---------------------------------------------------------------------------------------------
# Collective algorithms.
# ---------------------------------------------------------------------------------------------


def collectives(df, *, x: str | None = None, metric: str | None = None,
                hue: str | None = None, title: str | None = None) -> Figure:
    """Ring vs hierarchical vs HO-Ring: time (ms) and bus bandwidth vs ``x`` (default message
    size when it varies, else GPU count); one line per algorithm (per algorithm / ``hue``).
    ``metric`` picks one panel only (e.g. ``busbw_GBps``)."""
    if x is None:
        x = "size_bytes" if "size_bytes" in df.columns and df["size_bytes"].nunique() > 1 \
            else "gpus"
    metrics = [metric] if metric else ["time_s", "busbw_GBps"]
    series = _series_key(df, hue, "algo")
    fig = Figure(figsize=(5.5 * len(metrics), 4.2), layout="constrained")
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    for ax, m in zip(axes, metrics, strict=False):
        _lines(ax, df, x, m, series)
        _log_x(ax, _values(df, x))
        ax.set_xlabel(_label(x))
        ax.set_ylabel(_label(m))
        ax.grid(alpha=0.3)
        _legend(ax, fig)
    op = df["op"].iloc[0] if "op" in df.columns and len(df) else "collective"
    axes[0].set_title(f"{op}: ring vs hierarchical vs HO-Ring", fontsize=9)
    _suptitle(fig, df, metrics, title)
    return fig


# ---------------------------------------------------------------------------------------------
# Memory vs throughput front.
# ---------------------------------------------------------------------------------------------


def pareto_front(memory: list[float], throughput: list[float]) -> list[bool]:
    """Which points no other point beats (memory <= and throughput >=, one strictly).

    >>> pareto_front([10, 20, 30, 15], [1, 3, 2, 1])
    [True, True, False, False]
    """
    out = []
    for i, (m, t) in enumerate(zip(memory, throughput, strict=False)):
        dominated = any((m2 <= m and t2 >= t and (m2 < m or t2 > t))
                        for j, (m2, t2) in enumerate(zip(memory, throughput, strict=False))
                        if j != i)
        out.append(not dominated)
    return out


def memory_throughput(df, *, x: str | None = None, metric: str | None = None,
                      hue: str | None = None, title: str | None = None) -> Figure:
    """Memory per GPU (x, default ``total_bytes`` in GiB) against ``metric`` (default tokens/s
    per GPU), one labelled point per strategy. Pareto-optimal strategies (no other uses less
    memory and runs faster) are highlighted and joined; points that do not fit are crosses on
    the x axis at their memory; the GPU capacity is a dashed line."""
    x = x or "total_bytes"
    metric = metric or "tokens_per_s_per_gpu"
    fig = Figure(figsize=(7.5, 4.8), layout="constrained")
    ax = fig.add_subplot()
    ok = list(_ok(df))
    mem = _values(df, x)
    thr = [v if o else math.nan for v, o in zip(_values(df, metric), ok, strict=False)]
    names = [_fw(s) for s in df["strategy"]]
    idx = [i for i in range(len(df)) if ok[i] and thr[i] == thr[i]]
    front = pareto_front([mem[i] for i in idx], [thr[i] for i in idx])
    on = [i for i, f in zip(idx, front, strict=False) if f]
    off = [i for i, f in zip(idx, front, strict=False) if not f]
    bad = [i for i in range(len(df)) if not ok[i] and mem[i] == mem[i]]
    ax.scatter([mem[i] for i in off], [thr[i] for i in off], color="#999", s=30,
               label="fits, dominated")
    on.sort(key=lambda i: mem[i])
    ax.plot([mem[i] for i in on], [thr[i] for i in on], color="#d62728", marker="o",
            markersize=8, drawstyle="steps-post", label="Pareto-optimal")
    if bad:
        ax.scatter([mem[i] for i in bad], [0.0] * len(bad), marker="x", color="#b00", s=40,
                   label="does not fit")
    yr = max((v for v in thr if v == v), default=1.0) or 1.0
    cap = None
    if "capacity_bytes" in df.columns and df["capacity_bytes"].notna().any():
        cap = float(df["capacity_bytes"].dropna().iloc[0]) * _SCALE.get(x, 1.0)
        ax.axvline(cap, color="k", linestyle="--", linewidth=1, label="GPU memory")
    ax.set_xlabel(_label(x))
    ax.set_ylabel(_label(metric))
    ax.set_ylim(0, yr * 1.25)
    # room on the right of the rightmost point for its label
    known = [v for v in mem if v == v] + ([cap] if cap is not None and cap == cap else [])
    if known:
        lo, hi = min(known), max(known)
        span = (hi - lo) or 1.0
        ax.set_xlim(lo - 0.05 * span, hi + 0.3 * span)
    # the legend outside the axes, so it never covers a point or a name
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    ax.grid(alpha=0.3)
    _suptitle(fig, df, [metric, x], title)
    order = sorted(idx + bad, key=lambda i: (i not in on, mem[i]))
    _place_labels(fig, ax, [(names[i], mem[i], thr[i] if thr[i] == thr[i] else 0.0,
                             i in on) for i in order])
    return fig


def _place_labels(fig: Figure, ax, items: list[tuple[str, float, float, bool]]) -> None:
    """Name each point next to it where the name overlaps no other name (Agg layout): tried
    above-right, stacked higher, then left and below; inside the axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # deferred: drawing only

    canvas = FigureCanvasAgg(fig)
    fig.draw_without_rendering()  # the constrained layout: final axes positions
    renderer = canvas.get_renderer()
    box = ax.get_window_extent(renderer)
    offsets = ([(4, 4 + 9 * k, "left") for k in range(12)]
               + [(-4, 4 + 9 * k, "right") for k in range(12)]
               + [(4, -12 - 9 * k, "left") for k in range(6)]
               + [(-4, -12 - 9 * k, "right") for k in range(6)])
    placed: list = []
    for name, px, py, bold in items:
        t = ax.annotate(name, (px, py), textcoords="offset points", xytext=offsets[0][:2],
                        fontsize=7, fontweight="bold" if bold else "normal",
                        annotation_clip=False)
        t.set_in_layout(False)  # the names do not move the axes (their places stay valid)
        for dx, dy, ha in offsets:
            t.set_position((dx, dy))
            t.set_ha(ha)
            e = t.get_window_extent(renderer)
            inside = (box.x0 <= e.x0 and e.x1 <= box.x1 and box.y0 <= e.y0 and e.y1 <= box.y1)
            if inside and not any(e.overlaps(f) for f in placed):
                break
        placed.append(t.get_window_extent(renderer))


# ---------------------------------------------------------------------------------------------
# Step timeline (Gantt) from trace records.
# ---------------------------------------------------------------------------------------------


def _records(records) -> list[dict]:
    if hasattr(records, "to_dict") and hasattr(records, "columns"):  # a DataFrame
        return records.to_dict("records")
    out = []
    for r in records:
        out.append(r if isinstance(r, dict) else
                   {k: getattr(r, k) for k in ("lane", "name", "start_s", "end_s", "kind")})
    return out


def timeline(records, *, x: str | None = None, metric: str | None = None,
             hue: str | None = None, title: str | None = None) -> Figure:
    """Gantt chart of a step: one row per lane (stream), one bar per record, coloured by
    ``kind`` (e.g. compute / intra / inter). ``records``: :class:`parosim.fabric.engine.Record`
    objects, dicts with ``lane, name, start_s, end_s, kind``, or a DataFrame of them."""
    recs = _records(records)
    lanes = _uniq(r["lane"] for r in recs)
    kinds = _uniq(r.get("kind") or "other" for r in recs)
    span = max((r["end_s"] for r in recs), default=1.0)
    unit, scale = ("ms", 1e3) if span < 1 else ("s", 1.0)
    fig = Figure(figsize=(10, 1.0 + 0.45 * max(len(lanes), 2)), layout="constrained")
    ax = fig.add_subplot()
    for k, kind in enumerate(kinds):
        mine = [r for r in recs if (r.get("kind") or "other") == kind]
        ax.barh([lanes.index(r["lane"]) for r in mine],
                [(r["end_s"] - r["start_s"]) * scale for r in mine],
                left=[r["start_s"] * scale for r in mine], height=0.7,
                color=COLORS[k % len(COLORS)], edgecolor="white", linewidth=0.3, label=kind)
    ax.set_yticks(range(len(lanes)), [str(lane) for lane in lanes])
    ax.invert_yaxis()
    ax.set_xlabel(f"time ({unit})")
    ax.set_ylabel("stream")
    head = f"step timeline, time ({unit}) per stream"
    fig.suptitle(f"{head}: {title}" if title else head, fontsize=10)
    ax.legend(fontsize=8, loc="upper right", ncol=min(len(kinds), 4))
    return fig


# ---------------------------------------------------------------------------------------------
# Sweep figures.
# ---------------------------------------------------------------------------------------------

SWEEP_PLOTS = {
    "throughput": throughput_bars,
    "scalability": scalability,
    "collectives": collectives,
    "memory": memory_throughput,
    "best": best_strategy,
}


def _slug(v: Any) -> str:
    if isinstance(v, str) and v.endswith((".yaml", ".yml")):
        v = Path(v).stem  # a spec file: its name
    return re.sub(r"[^A-Za-z0-9.=+-]+", "_", str(v)).strip("_")


def sweep_figures(df, figures: Iterable[dict]) -> Iterator[tuple[str, Callable[[], Figure]]]:
    """``(file stem, draw)`` for each figure entry of a sweep spec, one per ``by`` group;
    ``draw()`` makes the Figure (so one failing plot does not stop the others)."""
    for f in figures:
        fn = SWEEP_PLOTS[f["plot"]]
        by = [c for c in f.get("by", []) if c in df.columns]
        groups = df.groupby(by, sort=False, dropna=False) if by else [((), df)]
        for key, sub in groups:
            key = key if isinstance(key, tuple) else (key,)
            suffix = "-".join(f"{c}={_slug(v)}" for c, v in zip(by, key, strict=True))
            stem = f.get("file", f["plot"]) + (f"-{suffix}" if suffix else "")
            title = f.get("title")
            if title is None and suffix:  # model and cluster are in every title already
                title = ", ".join(f"{c.replace('_', ' ')} = {_stem(v)}"
                                  for c, v in zip(by, key, strict=True)
                                  if c not in ("model", "cluster")) or None
            extra = {}
            if f.get("measured_rows"):   # a row naming a by-column shows in its group only
                extra["measured"] = [r for r in f["measured_rows"] if all(
                    str(r[c]) == str(v) for c, v in zip(by, key, strict=True) if r.get(c))]
            yield stem, functools.partial(fn, sub.reset_index(drop=True), x=f.get("x"),
                                          metric=f.get("metric"), hue=f.get("hue"),
                                          title=title, **extra)


def save_figure(fig: Figure, stem: str | Path, dpi: int = 120) -> list[str]:
    """Save as ``stem.png`` and ``stem.svg``; return both paths."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    return [str(save_as(fig, f"{stem}.{ext}", dpi)) for ext in ("png", "svg")]


_NO_DATE = {"png": {"Software": None}, "svg": {"Date": None},
            "pdf": {"CreationDate": None, "ModDate": None}}


def save_as(fig: Figure, path: str | Path, dpi: int = 120) -> Path:
    """Save one file, its format from the extension (png, svg, pdf), reproducibly: the same
    figure -> the same bytes (no date or version stamp; SVG ids hashed from a fixed salt)."""
    from matplotlib import rc_context  # deferred: matplotlib loads only when this runs

    p = Path(path)
    with rc_context({"svg.hashsalt": "parosim"}):
        fig.savefig(p, dpi=dpi, metadata=_NO_DATE.get(p.suffix.lower().lstrip(".")))
    return p
