"""Each plot's content: axes labels, bars / lines, legend entries, marked non-fitting points."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from matplotlib.container import BarContainer

from parosim.fabric.engine import Record
from parosim.plots.figures import (
    SWEEP_PLOTS,
    best_strategy,
    collectives,
    memory_throughput,
    pareto_front,
    save_figure,
    scalability,
    sweep_figures,
    throughput_bars,
    timeline,
)

NAN = math.nan
GiB = 2**30


def _legend(ax) -> list[str]:
    leg = ax.get_legend()
    return [t.get_text() for t in leg.get_texts()] if leg else []


def _bars(ax) -> list:
    return [b for c in ax.containers if isinstance(c, BarContainer) for b in c]


def _lines(ax) -> list:
    return [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]


def step_df(strategies=("NIG", "IIG", "GGG", "NNN"), algos=("ho-ring",)):
    rows = []
    for a in algos:
        for i, s in enumerate(strategies):
            fits = s != "NNN"
            rows.append({"strategy": s, "algo": a, "status": "ok" if fits else "does-not-fit",
                         "gpus": 32, "tokens_per_s_per_gpu": 1000.0 + 100 * i if fits else NAN,
                         "total_bytes": (40 + 10 * i) * GiB, "capacity_bytes": 80e9})
    return pd.DataFrame(rows)


def test_throughput_bars_one_bar_per_strategy_and_marks_non_fitting():
    fig = throughput_bars(step_df())
    ax = fig.axes[0]
    assert len(_bars(ax)) == 4
    assert [t.get_text() for t in ax.get_xticklabels()] == ["NIG", "IIG", "GGG (ZeRO-3 / FSDP)",
                                                           "NNN (DDP)"]
    assert ax.get_xlabel() == "strategy" and "tokens/s" in ax.get_ylabel()
    heights = [b.get_height() for b in _bars(ax)]
    assert heights == [1000.0, 1100.0, 1200.0, 0.0]
    assert sorted(t.get_text() for t in ax.texts) == ["does not fit", "★"]
    star = next(t for t in ax.texts if t.get_text() == "★")
    assert star.xy[1] == 1200.0  # the best bar (GGG) carries the star
    assert "does not fit / error" in _legend(ax)


def test_throughput_bars_grouped_by_algorithm():
    fig = throughput_bars(step_df(algos=("ring", "hierarchical", "ho-ring")))
    ax = fig.axes[0]
    assert len(_bars(ax)) == 12
    assert _legend(ax) == ["does not fit / error", "ring", "hierarchical", "ho-ring"]
    assert sum(t.get_text() == "does not fit" for t in ax.texts) == 3


def scaling_df():
    rows = []
    for s, eff in (("NIG", 1.0), ("GGG", 0.5)):
        for k, n in enumerate((16, 32, 64, 128)):
            per_gpu = 1000.0 * eff ** k
            rows.append({"strategy": s, "gpus": n, "status": "ok",
                         "tokens_per_s": per_gpu * n, "tokens_per_s_per_gpu": per_gpu})
    rows.append({"strategy": "NNN", "gpus": 16, "status": "does-not-fit",
                 "tokens_per_s": NAN, "tokens_per_s_per_gpu": NAN})
    return pd.DataFrame(rows)


def test_scalability_lines_and_efficiency():
    fig = scalability(scaling_df())
    ax, ax2 = fig.axes
    assert [ln.get_label() for ln in _lines(ax)] == ["NIG", "GGG (ZeRO-3 / FSDP)",
                                                     "no point fits: NNN (DDP)"]
    assert ax.get_xlabel() == ax2.get_xlabel() == "GPUs"
    assert "tokens/s" in ax.get_ylabel() and "efficiency" in ax2.get_ylabel()
    nig, ggg = _lines(ax2)[:2]
    assert list(nig.get_xdata()) == [16, 32, 64, 128]
    assert list(nig.get_ydata()) == pytest.approx([1, 1, 1, 1])
    assert list(ggg.get_ydata()) == pytest.approx([1, 0.5, 0.25, 0.125])
    assert "linear scaling" in _legend(ax2)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["16", "32", "64", "128"]


def test_scaling_efficiency_is_per_gpu_throughput_ratio_whatever_the_metric():
    """The panel is tokens/s per GPU at n / the same at the base n, also when the left panel
    already shows per-GPU throughput (it was divided by n twice: 0.5 at 2x GPUs)."""
    fig = scalability(scaling_df(), metric="tokens_per_s_per_gpu")
    nig, ggg = _lines(fig.axes[1])[:2]
    assert list(nig.get_ydata()) == pytest.approx([1, 1, 1, 1])
    assert list(ggg.get_ydata()) == pytest.approx([1, 0.5, 0.25, 0.125])


def coll_df():
    rows = []
    for a, bw in (("ring", 10.0), ("hierarchical", 15.0), ("ho-ring", 16.0)):
        for n in (16, 32, 64, 128):
            t = 1e9 / (bw * 1e9)
            rows.append({"algo": a, "gpus": n, "size_bytes": 1e9, "op": "all-gather",
                         "status": "ok", "time_s": t, "busbw_GBps": bw})
    return pd.DataFrame(rows)


def test_collectives_time_and_busbw_per_algorithm():
    fig = collectives(coll_df())
    ax_t, ax_b = fig.axes
    for ax in (ax_t, ax_b):
        assert [ln.get_label() for ln in _lines(ax)] == ["ring", "hierarchical", "ho-ring"]
        assert ax.get_xlabel() == "GPUs"
    assert ax_t.get_ylabel() == "time (ms)" and "bus bandwidth" in ax_b.get_ylabel()
    assert list(_lines(ax_t)[0].get_ydata()) == pytest.approx([100.0] * 4)  # 0.1 s in ms
    assert "all-gather" in ax_t.get_title()
    one = collectives(coll_df(), metric="busbw_GBps")
    assert len(one.axes) == 1


def test_collectives_against_size_when_size_varies():
    df = coll_df()
    df["size_bytes"] = [2**20 * 4**(i % 4) for i in range(len(df))]
    df["gpus"] = 32
    fig = collectives(df)
    assert fig.axes[0].get_xlabel() == "message size (MB, 1e6 bytes)"
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()][:2] == ["1.049", "4.194"]


def test_pareto_front_by_definition():
    assert pareto_front([1, 2, 3], [1, 2, 3]) == [True, True, True]
    assert pareto_front([1, 2, 3], [3, 2, 1]) == [True, False, False]
    assert pareto_front([2, 2], [5, 5]) == [True, True]  # ties dominate neither


def test_memory_throughput_highlights_the_front_and_non_fitting():
    df = step_df(("NIG", "IIG", "GGG", "NNN", "III"))
    # III uses more memory than IIG and is slower: dominated
    df.loc[df.strategy == "III", "tokens_per_s_per_gpu"] = 1050.0
    df.loc[df.strategy == "III", "status"] = "ok"
    df.loc[df.strategy == "GGG", "total_bytes"] = 30 * GiB  # least memory and fastest
    fig = memory_throughput(df)
    ax = fig.axes[0]
    front = next(ln for ln in ax.get_lines() if ln.get_label() == "Pareto-optimal")
    assert list(front.get_xdata()) == [30.0]
    assert list(front.get_ydata()) == [1200.0]
    labels = _legend(ax)
    assert {"Pareto-optimal", "fits, dominated", "does not fit", "GPU memory"} <= set(labels)
    assert {t.get_text() for t in ax.texts} == {"NIG", "IIG", "GGG (ZeRO-3 / FSDP)", "NNN (DDP)",
                                                "III (MiCS / HSDP)"}
    assert ax.get_xlabel() == "memory per GPU (GiB)"
    bold = {t.get_text() for t in ax.texts if t.get_fontweight() == "bold"}
    assert bold == {"GGG (ZeRO-3 / FSDP)"}


def test_best_strategy_names_the_winner_at_each_x():
    rows = []
    for bw, winner in (("25Gbps", "IIG"), ("100Gbps", "NIG"), ("800Gbps", "NNG")):
        for s in ("IIG", "NIG", "NNG"):
            rows.append({"strategy": s, "nic_bandwidth": bw, "status": "ok",
                         "tokens_per_s_per_gpu": 2000.0 if s == winner else 1000.0})
    fig = best_strategy(pd.DataFrame(rows))
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.texts] == ["IIG", "NIG", "NNG"]
    assert [t.get_position()[0] for t in ax.texts] == [25.0, 100.0, 800.0]
    assert "Gbps" in ax.get_xlabel()
    assert [ln.get_label() for ln in _lines(ax)] == ["IIG", "NIG", "NNG (ZeRO-1)"]


def test_timeline_one_row_per_lane_one_bar_per_record():
    recs = [Record("compute", "fwd0", 0.0, 0.010, "compute"),
            Record("compute", "bwd0", 0.012, 0.030, "compute"),
            Record("comm-param", "ag0", 0.0, 0.004, "intra"),
            {"lane": "comm-grad", "name": "rs0", "start_s": 0.030, "end_s": 0.045,
             "kind": "inter"}]
    fig = timeline(recs)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["compute", "comm-param",
                                                           "comm-grad"]
    assert len(_bars(ax)) == 4
    assert _legend(ax) == ["compute", "intra", "inter"]
    assert ax.get_xlabel() == "time (ms)"
    widths = sorted(round(b.get_width(), 9) for b in _bars(ax))
    assert widths == [4.0, 10.0, 15.0, 18.0]
    same = timeline(pd.DataFrame([r if isinstance(r, dict) else r.__dict__ for r in recs]))
    assert len(_bars(same.axes[0])) == 4


def test_sweep_figures_one_per_group_and_saved_as_png_and_svg(tmp_path):
    df = pd.concat([step_df().assign(model="llama-7b"), step_df().assign(model="llama-65b")])
    figs = [(stem, draw()) for stem, draw in
            sweep_figures(df, [{"plot": "throughput", "by": ["model"]}])]
    assert [stem for stem, _ in figs] == ["throughput-model=llama-7b",
                                          "throughput-model=llama-65b"]
    assert "llama-65b" in figs[1][1].get_suptitle()
    paths = save_figure(figs[0][1], tmp_path / figs[0][0])
    assert [p[-4:] for p in paths] == [".png", ".svg"]
    assert (tmp_path / "throughput-model=llama-7b.png").read_bytes()[:4] == b"\x89PNG"
    assert set(SWEEP_PLOTS) == {"throughput", "scalability", "collectives", "memory", "best"}
