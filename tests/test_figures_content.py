"""Every documented figure (the figures of experiments/*/sweep.yaml, drawn from their committed
results.csv) says what it shows and shows all of it: the title names the metric with its unit,
the model (step sweeps) and the cluster; the layout engine is constrained; no text artist lies
outside the figure; the scaling-efficiency panel is the per-GPU throughput ratio; the same
figure saves to the same SVG bytes twice."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.layout_engine import ConstrainedLayoutEngine
from matplotlib.text import Text

from parosim.io.sweep import load_sweep_spec
from parosim.plots.figures import LABELS, save_figure, sweep_figures
from parosim.sweep.runner import read_results

ROOT = Path(__file__).resolve().parents[1]
SPECS = sorted(ROOT.glob("experiments/0*/sweep.yaml"))


def _first_figures():
    """(spec folder, figure entry, stem, draw, the group's rows) - the first group of each
    figure entry of each committed sweep."""
    out = []
    for path in SPECS:
        res = path.parent / "out" / "results.csv"
        if not res.exists():
            continue
        spec = load_sweep_spec(path)
        df = read_results(res)
        for entry in spec.figures:
            stem, draw = next(iter(sweep_figures(df, [entry])))
            by = [c for c in entry.get("by", []) if c in df.columns]
            sub = df
            if by:
                key = next(iter(df.groupby(by, sort=False, dropna=False)))[0]
                key = key if isinstance(key, tuple) else (key,)
                for c, v in zip(by, key, strict=True):
                    sub = sub[sub[c] == v]
            out.append(pytest.param(path.parent.name, entry, draw, sub,
                                    id=f"{path.parent.name}:{stem}"))
    return out


def _stem(v) -> str:
    v = str(v)
    return Path(v).stem if v.endswith((".yaml", ".yml")) else v


def test_every_experiment_has_figures():
    assert len(_first_figures()) >= 8


@pytest.mark.parametrize("name,entry,draw,sub", _first_figures())
def test_documented_figure_content(name, entry, draw, sub):
    fig = draw()
    assert isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine)
    title = fig.get_suptitle()
    for col in ("model", "cluster"):
        if col in sub.columns:
            for v in sub[col].dropna().unique():
                assert _stem(v) in title, (col, v, title)
    metric = entry.get("metric")
    if metric:
        assert LABELS.get(metric, metric) in title
    assert re.search(r"\([^)]*(/s|GiB|ms|GB|s|fraction)[^)]*\)", title), title  # a unit
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    # everything drawn (titles, tick and axis labels, legends, annotations) inside the figure
    tight = fig.get_tightbbox(renderer)  # inches
    w, h = fig.get_size_inches()
    assert tight.x0 >= -0.01 and tight.y0 >= -0.01, (tight, w, h)
    assert tight.x1 <= w + 0.01 and tight.y1 <= h + 0.01, (tight, w, h)
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    assert texts
    # annotations inside the plot stay inside their axes (not over titles or the legend)
    for ax in fig.axes:
        box = ax.get_window_extent(renderer)
        for t in ax.texts:
            e = t.get_window_extent(renderer)
            assert box.y0 - 1 <= e.y0 and e.y1 <= box.y1 + 1, (t.get_text(), e, box)
            assert box.x0 - 1 <= e.x0 and e.x1 <= box.x1 + 1, (t.get_text(), e, box)
    for ax in fig.axes:
        assert ax.get_xlabel() and ax.get_ylabel()


def test_scaling_efficiency_panel_of_experiment_02():
    df = read_results(ROOT / "experiments/02_scalability/out/results.csv")
    spec = load_sweep_spec(ROOT / "experiments/02_scalability/sweep.yaml")
    entry = next(f for f in spec.figures if f.get("metric") == "tokens_per_s_per_gpu")
    fig = next(iter(sweep_figures(df, [entry])))[1]()
    eff_ax = fig.axes[1]
    ok = df[df.status == "ok"]
    for line in eff_ax.get_lines():
        name = line.get_label().split(" = ")[0].split(" (")[0]
        rows = ok[ok.strategy == name].sort_values("gpus")
        if rows.empty:
            continue
        per_gpu = rows.tokens_per_s_per_gpu.to_numpy()
        assert list(line.get_ydata()) == pytest.approx(list(per_gpu / per_gpu[0]))


def test_svg_bytes_are_reproducible(tmp_path):
    params = _first_figures()
    draw = params[0].values[2]
    a = save_figure(draw(), tmp_path / "a")[1]
    b = save_figure(draw(), tmp_path / "b")[1]
    assert Path(a).read_bytes() == Path(b).read_bytes()


# --- figure defects found in review: each test failed before its fix --------------------------

def _drawn_ticklabels(axis, renderer):
    """The (text, window box) of the tick labels drawn inside the axis' view, major and minor."""
    lo, hi = sorted(axis.get_view_interval())
    return [(t.label1.get_text(), t.label1.get_window_extent(renderer))
            for t in axis.get_major_ticks() + axis.get_minor_ticks()
            if t.get_visible() and t.label1.get_visible() and t.label1.get_text().strip()
            and lo <= t.get_loc() <= hi]


def _collisions(boxes):
    return [(a[0], b[0]) for i, a in enumerate(boxes) for b in boxes[:i] if a[1].overlaps(b[1])]


def test_best_without_a_swept_axis_is_refused_or_inferred(capsys):
    from parosim.errors import InputError
    from parosim.io.sweep import sweep_from_dict
    from parosim.plots.figures import best_strategy

    base = {"kind": "step", "fixed": {"model": "llama-7b", "cluster": "paper-a100-roce"}}
    with pytest.raises(InputError, match=r"figure 'best' needs x"):
        sweep_from_dict({**base, "grid": {"strategy": ["NIG", "GGG"]}, "figures": ["best"]})
    spec = sweep_from_dict({**base, "grid": {"strategy": ["NIG", "GGG"], "nodes": [2, 4]},
                            "figures": ["best"]})
    assert spec.figures[0]["x"] == "nodes"  # the one swept axis: inferred
    import pandas as pd
    df = pd.DataFrame({"strategy": ["NIG", "GGG"], "status": ["ok", "ok"],
                       "nic_bandwidth": [float("nan")] * 2, "tokens_per_s_per_gpu": [1.0, 2.0]})
    with pytest.raises(ValueError, match=r"plot 'best': x 'nic_bandwidth'"):
        best_strategy(df)  # never an empty plot


def test_throughput_bars_one_panel_per_node_count():
    import pandas as pd
    from matplotlib.container import BarContainer

    from parosim.plots.figures import throughput_bars

    rows = [{"strategy": s, "nodes": n, "gpus": 8 * n, "status": "ok",
             "tokens_per_s_per_gpu": 1000.0 * n + (s == "GGG")} for n in (2, 4)
            for s in ("NIG", "GGG")]
    fig = throughput_bars(pd.DataFrame(rows))
    assert len(fig.axes) == 2
    heights = [[b.get_height() for c in ax.containers if isinstance(c, BarContainer) for b in c]
               for ax in fig.axes]
    assert heights == [[2000.0, 2001.0], [4000.0, 4001.0]]  # every row drawn
    assert [ax.get_title().split(":")[0] for ax in fig.axes] == ["2 nodes (16 GPUs)",
                                                                "4 nodes (32 GPUs)"]
    dup = pd.DataFrame([{**r, "seq_len": q} for r in rows[:2] for q in (512, 1024)])
    with pytest.raises(ValueError, match="seq_len"):
        throughput_bars(dup)  # rows that would share a bar: refused, not dropped


def test_scaling_efficiency_axis_is_anchored_at_zero():
    df = read_results(ROOT / "experiments/02_scalability/out/results.csv")
    spec = load_sweep_spec(ROOT / "experiments/02_scalability/sweep.yaml")
    for entry in spec.figures:
        fig = next(iter(sweep_figures(df, [entry])))[1]()
        lo, hi = fig.axes[1].get_ylim()
        assert lo == 0.0 and hi >= 1.0, (lo, hi)


def _sweep_figs(name, plot):
    path = ROOT / "experiments" / name
    spec, df = load_sweep_spec(path / "sweep.yaml"), read_results(path / "out/results.csv")
    entries = [e for e in spec.figures if e["plot"] == plot]
    return [(stem, draw) for stem, draw in sweep_figures(df, entries)]


@pytest.mark.parametrize("plot", ["memory", "throughput"])
def test_strategy_names_do_not_overlap(plot):
    for stem, draw in _sweep_figs("01_paper_32gpu", plot):
        fig = draw()
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        r = canvas.get_renderer()
        for ax in fig.axes:
            assert not _collisions(_drawn_ticklabels(ax.xaxis, r)), stem
            names = [(t.get_text(), t.get_window_extent(r)) for t in ax.texts
                     if t.get_text().strip()]
            assert not _collisions(names), (stem, _collisions(names))


@pytest.mark.parametrize("t0,k", [(3e-4, 20), (3e-4, 1.05), (1e-3, 8), (0.05, 1000)])
def test_validate_figure_log_ticks_do_not_collide(t0, k):
    import pandas as pd

    from parosim.validate.report import plot

    rows = [{"algo": a, "what": "collective", "measured_s": t0 * k ** (i / 3),
             "simulated_s": t0 * k ** (i / 3) * 1.05} for a in ("ring", "hier") for i in range(4)]
    fig = plot(pd.DataFrame(rows))
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    r = canvas.get_renderer()
    for axis in (fig.axes[0].xaxis, fig.axes[0].yaxis):
        labels = _drawn_ticklabels(axis, r)
        assert len(labels) >= 2
        assert not _collisions(labels), _collisions(labels)


def test_simulate_cautions_a_p99_from_few_repeats(capsys):
    import json

    from parosim.cli.commands import main

    argv = ["simulate", "--jitter-cv", "0.05", "--repeats", "20"]
    assert main(argv) == 0
    assert "p99 from 20 steps: an estimate near the sample maximum; use --repeats >= 100" \
        in capsys.readouterr().out
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["warnings"] == ["p99 from 20 steps: an estimate near the sample maximum; use "
                               "--repeats >= 100"]
    assert main(["simulate", "--json"]) == 0
    assert "warnings" not in json.loads(capsys.readouterr().out)
