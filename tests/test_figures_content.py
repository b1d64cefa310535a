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
