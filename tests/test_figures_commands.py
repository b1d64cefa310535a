"""The figures that commands and experiment scripts write (other than the sweep figures of
experiments/0*, checked in test_figures_content.py) say what they show and show all of it.

Each figure is made through its public path - the CLI (`advise --plot`, `simulate --plot`,
`collective -b/-e --plot`, `collective --compare --plot`), `parosim validate`'s writer, the
notebooks' `plots.timeline`, and the experiment scripts' figure functions drawn from their
committed CSVs - and checked: the title names the model (where one applies), the cluster and
the metric with its unit; both axes are labelled and numeric axes carry a unit in brackets;
the layout engine is constrained (or tight); no text lies outside the figure; a legend has at
most 12 entries; saving twice gives the same SVG bytes.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.layout_engine import ConstrainedLayoutEngine, TightLayoutEngine

import parosim.plots.figures
from parosim.cli.commands import main

ROOT = Path(__file__).resolve().parents[1]
NCCL = ROOT / "tests/data/nccl-tests"
UNIT = re.compile(r"[(\[][^)\]]*(/s|\bs\b|\bus\b|\bms\b|GB|GiB|bytes|count|fraction|ratio|"
                  r"min\b|days|x nominal|tokens)[^)\]]*[)\]]")


def check_figure(fig, must: list[str], categorical: tuple[str, ...] = ()) -> str:
    """Assert the content rules on ``fig``; ``must``: strings the title contains; axis labels
    in ``categorical`` need no unit. Returns the title."""
    assert isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine | TightLayoutEngine)
    title = fig.get_suptitle() or fig.axes[0].get_title()
    for m in must:
        assert m in title, (m, title)
    assert UNIT.search(title), f"no unit in the title {title!r}"
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    tight = fig.get_tightbbox(renderer)  # inches: everything drawn
    w, h = fig.get_size_inches()
    assert tight.x0 >= -0.01 and tight.y0 >= -0.01, (title, tight, w, h)
    assert tight.x1 <= w + 0.01 and tight.y1 <= h + 0.01, (title, tight, w, h)
    box = fig.bbox
    texts = list(fig.texts)
    for ax in fig.axes:
        texts += [*ax.texts, ax.title, ax._left_title, ax._right_title, ax.xaxis.label,
                  ax.yaxis.label]
        if ax.get_legend() is not None:
            texts += [*ax.get_legend().get_texts(), ax.get_legend().get_title()]
    for t in texts:
        if t.get_visible() and t.get_text().strip():
            e = t.get_window_extent(renderer)
            assert box.x0 - 1 <= e.x0 and e.x1 <= box.x1 + 1, (t.get_text(), e, box)
            assert box.y0 - 1 <= e.y0 and e.y1 <= box.y1 + 1, (t.get_text(), e, box)
    for ax in fig.axes:  # annotations inside their axes, and apart from each other
        inside = ax.get_window_extent(renderer)
        boxes = [t.get_window_extent(renderer) for t in ax.texts if t.get_text().strip()]
        for i, e in enumerate(boxes):
            assert inside.x0 - 1 <= e.x0 and e.x1 <= inside.x1 + 1, (ax.texts[i], e, inside)
            assert inside.y0 - 1 <= e.y0 and e.y1 <= inside.y1 + 1, (ax.texts[i], e, inside)
            for f in boxes[:i]:
                assert not e.overlaps(f), (ax.texts[i].get_text(), e, f)
    for ax in fig.axes:
        shared = [o.get_ylabel() for o in ax.get_shared_y_axes().get_siblings(ax)]
        for label in (ax.get_xlabel(), ax.get_ylabel() or (any(shared) and None)):
            if label is None:
                continue  # a shared y axis labelled once, on the first panel
            assert label, (title, ax.get_title())
            assert label in categorical or UNIT.search(label), f"no unit in {label!r}"
        leg = ax.get_legend()
        if leg is not None:
            assert 1 <= len(leg.get_texts()) <= 12, [t.get_text() for t in leg.get_texts()]
    return title


@pytest.fixture
def saved(monkeypatch):
    """Every figure a command saves through parosim.plots.figures.save_as, with its path."""
    got: list = []
    real = parosim.plots.figures.save_as

    def spy(fig, path, dpi=120):
        got.append((fig, Path(path)))
        return real(fig, path, dpi)

    monkeypatch.setattr(parosim.plots.figures, "save_as", spy)
    return got


def _same_svg(make, tmp_path) -> None:
    """Two figures made alike save to the same SVG bytes (no date, no random ids)."""
    a = parosim.plots.figures.save_as(make(), tmp_path / "a.svg").read_bytes()
    b = parosim.plots.figures.save_as(make(), tmp_path / "b.svg").read_bytes()
    assert a == b and b"<svg" in a


def _same_svg_cli(argv: list[str], tmp_path) -> None:
    """The command run twice with ``--plot x.svg`` writes the same bytes."""
    got = []
    for name in ("a.svg", "b.svg"):
        assert main([*argv, "--plot", str(tmp_path / name)]) == 0
        got.append((tmp_path / name).read_bytes())
    assert got[0] == got[1] and b"<svg" in got[0]


def test_advise_pareto_plot(saved, tmp_path, capsys):
    out = tmp_path / "pareto.svg"
    assert main(["advise", "--model", "llama-13b", "--nodes", "2", "--global-batch", "64",
                 "--strategies", "NNG,IIG", "--top", "2", "--engine-top", "0",
                 "--plot", str(out)]) == 0
    (fig, path), = saved
    assert path == out and out.stat().st_size > 5_000
    check_figure(fig, ["llama-13b", "dgx-a100-ib", "throughput (tokens/s)",
                       "memory per GPU (GiB)"])
    first = out.read_bytes()
    assert main(["advise", "--model", "llama-13b", "--nodes", "2", "--global-batch", "64",
                 "--strategies", "NNG,IIG", "--top", "2", "--engine-top", "0",
                 "--plot", str(out)]) == 0
    assert out.read_bytes() == first  # the same run -> the same SVG bytes


def test_simulate_step_time_distribution_plot(saved, tmp_path, capsys):
    out = tmp_path / "steps.png"
    argv = ["simulate", "--strategy", "IIG", "--nodes", "2", "--accum", "2", "--jitter-cv",
            "0.05", "--repeats", "20", "--seed", "1"]
    assert main([*argv, "--plot", str(out)]) == 0
    (fig, path), = saved
    assert path == out and out.stat().st_size > 5_000
    title = check_figure(fig, ["step time (s)", "paper-a100-roce", "IIG", "16 GPUs"])
    assert re.search(r"llama-7b", title, re.I)
    _same_svg_cli(argv, tmp_path)


def test_collective_sweep_plot(saved, tmp_path, capsys):
    out = tmp_path / "sweep.png"
    argv = ["collective", "--op", "all-gather", "--nodes", "2", "-b", "1M", "-e", "64M",
            "-f", "4", "--algo", "ring,hierarchical,ho-ring"]
    assert main([*argv, "--plot", str(out)]) == 0
    (fig, path), = saved
    assert path == out and out.stat().st_size > 5_000
    check_figure(fig, ["all-gather", "time (us)", "paper-a100-roce", "16 GPUs"])
    ax = fig.axes[0]
    ticks = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert ticks and all(re.fullmatch(r"\d+(\.\d+)? (B|KiB|MiB|GiB|kB|MB|GB)", t)
                         for t in ticks), ticks  # sizes, not 6.4e+07
    assert ax.get_legend_handles_labels()[1] == ["ring", "hierarchical", "ho-ring"]
    _same_svg_cli(argv, tmp_path)


def test_collective_compare_plot(saved, tmp_path, capsys):
    out = tmp_path / "cmp.svg"
    argv = ["collective", "--compare", str(NCCL / "aws-p4de-2node-all_reduce.txt"),
            "--cluster", "aws-p4de", "--algo", "ring"]
    assert main([*argv, "--plot", str(out)]) == 0
    (fig, path), = saved
    check_figure(fig, ["all-reduce", "time (us)", "aws-p4de", "16 GPUs", "measured"])
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert labels == ["measured: aws-p4de-2node-all_reduce.txt",
                      "simulated (ring): aws-p4de-2node-all_reduce.txt"]
    _same_svg_cli(argv, tmp_path)


def test_validate_report_plot(saved, tmp_path):
    from parosim.validate.cli import write_outputs

    rows = [{"what": "collective", "op": "all-gather", "algo": a, "size_bytes": s,
             "simulated_s": t * 1.05, "measured_s": t, "error_pct": 5.0}
            for a in ("ring", "hierarchical") for s, t in ((2**20, 1e-3), (2**24, 8e-3))]
    res = {"rows": rows, "cluster": "cpu-2x2", "nodes": 2, "ranks_per_node": 2,
           "emulated": True, "cluster_yaml": "name: cpu-2x2\n"}
    write_outputs(res, tmp_path)
    (fig, path), = saved
    assert path.name == "validate.png" and path.stat().st_size > 5_000
    check_figure(fig, ["simulated vs measured time (s)", "cpu-2x2", "2 nodes x 2 ranks",
                       "emulated links"])


def test_notebook_timeline(tmp_path):
    from parosim.io import load_cluster
    from parosim.simulate.step import simulate_step
    from parosim.spec.model import preset
    from parosim.spec.training import TrainingSpec

    r = simulate_step(preset("llama-7b"), load_cluster("paper-a100-roce", 2), "IIG",
                      TrainingSpec(accum_steps=2), "ho-ring", trace=True)
    def make():
        return parosim.plots.figures.timeline(
            r.records, title="PaRO-IIG, LLaMA-7B on paper-a100-roce")

    title = check_figure(make(), ["LLaMA-7B", "paper-a100-roce"], categorical=("stream",))
    assert re.search(r"time \((s|ms)\) per stream", title)
    _same_svg(make, tmp_path)


def _script(rel: str):
    path = ROOT / rel
    spec = importlib.util.spec_from_file_location(f"exp_{path.parent.name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _experiment_figures():
    s = "experiments/10_stragglers_ecmp/"
    return [
        pytest.param(s + "run.py", "straggler_figure", ("out/stragglers.csv",),
                     ["step time (s)", "LLaMA-7B", "IIG", "paper-a100-roce"], id="straggler"),
        pytest.param(s + "run.py", "jitter_figure", ("out/jitter.csv", "out/jitter_steps.csv"),
                     ["step time (s)", "LLaMA-7B", "IIG", "paper-a100-roce"], id="jitter"),
        pytest.param(s + "run.py", "ecmp_figure", ("out/ecmp.csv",),
                     ["all-reduce time", "(ratio)", "eth-2spine-a100"], id="ecmp"),
        pytest.param("experiments/10_failures_16k/failures.py", "interval_figure",
                     ("out/results.csv",), ["goodput (fraction", "LLaMA-65B", "dgx-h100-ib"],
                     id="failures-interval"),
        pytest.param("experiments/10_failures_16k/failures.py", "scale_figure",
                     ("out/results.csv",), ["goodput (fraction)", "(days)", "LLaMA-65B",
                                            "dgx-h100-ib"], id="failures-scale"),
        pytest.param("experiments/10_jobs_sharing/sharing.py", "slowdown_figure",
                     ("out/results.csv",), ["slowdown (ratio)", "LLaMA-7B", "eth-2tier-a100"],
                     id="jobs-sharing"),
    ]


@pytest.mark.parametrize("script,fn,csvs,must", _experiment_figures())
def test_experiment_figure(script, fn, csvs, must, tmp_path):
    """Drawn from the committed CSVs by the function the script saves the figure with."""
    mod = _script(script)
    frames = [pd.read_csv(ROOT / script.rsplit("/", 1)[0] / c) for c in csvs]
    check_figure(getattr(mod, fn)(*frames), must)
    _same_svg(lambda: getattr(mod, fn)(*frames), tmp_path)


def test_check_figure_catches_a_bad_figure():
    """The checker fails on a figure with a raw-key title, no unit and clipped text."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5, 3.5), layout="constrained")
    ax = fig.add_subplot()
    ax.plot([1, 2], [3, 4])
    ax.set_title("tokens_per_s_per_gpu")
    with pytest.raises(AssertionError):
        check_figure(fig, ["tokens_per_s_per_gpu"])
    fig.suptitle("throughput (tokens/s): llama-7b on paper-a100-roce")
    ax.set_xlabel("GPUs (count)")
    ax.set_ylabel("throughput (tokens/s)")
    check_figure(fig, ["llama-7b"])
    fig.text(0.9, 0.5, "a label running off the right-hand edge of the figure")
    with pytest.raises(AssertionError):
        check_figure(fig, ["llama-7b"])
