"""Measured points beside a sweep's predicted scaling curves (a scalability figure's
``measured`` CSV, docs/sweeps.md): drawn where the file says, in the matching line's colour,
counted in the axes' limits; bad files refused in one line naming the key."""

from __future__ import annotations

import pandas as pd
import pytest

from parosim.errors import InputError
from parosim.io.sweep import load_sweep_spec, sweep_from_dict
from parosim.plots.figures import sweep_figures

SPEC = {"kind": "step", "mode": "analytic",
        "grid": {"nodes": [2, 4], "strategy": ["NGG", "IIG"]},
        "fixed": {"model": "llama-7b", "cluster": "paper-a100-roce", "fidelity": "paper"}}


def _rows():
    return pd.DataFrame({
        "strategy": ["NGG", "NGG", "IIG", "IIG"], "gpus": [16, 32, 16, 32],
        "nodes": [2, 4, 2, 4], "status": ["ok"] * 4, "model": ["llama-7b"] * 4,
        "cluster": ["paper-a100-roce"] * 4,
        "tokens_per_s": [16000.0, 30000.0, 50000.0, 96000.0],
        "tokens_per_s_per_gpu": [1000.0, 937.5, 3125.0, 3000.0]})


def _spec(tmp_path, csv_text: str, **fig):
    (tmp_path / "m.csv").write_text(csv_text)
    entry = {"plot": "scalability", "measured": "m.csv", **fig}
    return sweep_from_dict({**SPEC, "figures": [entry]}, base_dir=tmp_path)


def _draw(spec):
    (stem, draw), = list(sweep_figures(_rows(), spec.figures))
    return draw()


def test_measured_points_drawn_on_both_panels_in_the_lines_colour(tmp_path):
    spec = _spec(tmp_path, "# a comment\nseries,gpus,tokens_per_s,source\n"
                           "NGG,16,15000,bench\nNGG,32,24000,bench\n")
    fig = _draw(spec)
    ax, ax2 = fig.axes[:2]
    pts = [ln for ln in ax.get_lines() if ln.get_marker() == "D"]
    assert len(pts) == 1 and pts[0].get_label() == "NGG measured (bench)"
    assert list(pts[0].get_ydata()) == [15000.0, 24000.0]
    line = next(ln for ln in ax.get_lines() if ln.get_label().startswith("NGG"))
    assert pts[0].get_color() == line.get_color()
    # efficiency: the per-GPU throughput (tokens/s / GPUs) over the same at 16 GPUs
    eff = [ln for ln in ax2.get_lines() if ln.get_marker() == "D"]
    assert len(eff) == 1
    assert list(eff[0].get_ydata()) == pytest.approx([1.0, 24000 / 32 / (15000 / 16)])
    assert ax.get_ylim()[0] == 0.0 and ax2.get_ylim()[0] == 0.0


def test_measured_efficiency_only_and_above_the_curves(tmp_path):
    spec = _spec(tmp_path, "series,gpus,scaling_efficiency\nIIG,16,1.0\nIIG,32,1.3\n"
                           "paper run,32,0.5\n")
    fig = _draw(spec)
    ax, ax2 = fig.axes[:2]
    effs = {ln.get_label(): list(ln.get_ydata()) for ln in ax2.get_lines()
            if ln.get_marker() == "D"}
    assert sorted(map(tuple, effs.values())) == [(0.5,), (1.0, 1.3)]
    assert ax2.get_ylim()[1] >= 1.3                      # the axis holds the measured point
    labels = [ln.get_label() for ln in ax.get_lines()]
    assert "IIG measured" in labels and "paper run measured" in labels


def test_paper_points_of_experiment_02():
    spec = load_sweep_spec("experiments/02_scalability/sweep.yaml")
    rows = [r for f in spec.figures for r in f["measured_rows"]]
    assert {(r["series"], r["gpus"], r["scaling_efficiency"]) for r in rows} >= {
        ("IIG", 128, 0.92), ("NIG", 128, 0.84), ("NGG", 128, 0.63), ("GGG", 128, 0.63)}


@pytest.mark.parametrize("text,fig,needle", [
    ("series,gpus,tokens_per_s\nNGG,16,1\n", {"plot": "throughput"}, "scalability figures"),
    ("series,tokens_per_s\nNGG,1\n", {}, "expected series, gpus"),
    ("series,gpus,foo\nNGG,16,1\n", {}, "columns series, gpus, foo"),
    ("series,gpus,tokens_per_s\nNGG,16,-5\n", {}, "tokens_per_s = '-5'"),
    ("series,gpus,tokens_per_s\nNGG,x,5\n", {}, "gpus = 'x'"),
    ("series,gpus,tokens_per_s\n,16,5\n", {}, "series is empty"),
    ("series,gpus,tokens_per_s,scaling_efficiency\nNGG,16,,\n", {}, "neither tokens_per_s"),
    ("", {}, "columns none"),
])
def test_bad_measured_files_are_refused_in_one_line(tmp_path, text, fig, needle):
    with pytest.raises(InputError) as e:
        _spec(tmp_path, text, **fig)
    msg = str(e.value)
    assert "\n" not in msg and "measured" in msg and needle in msg


def test_missing_measured_file_is_refused(tmp_path):
    with pytest.raises(InputError, match="cannot be read"):
        sweep_from_dict({**SPEC, "figures": [{"plot": "scalability",
                                              "measured": "nope.csv"}]}, base_dir=tmp_path)
