"""The committed outputs of every experiment sweep (experiments/NN_*/out) are the current
code's: the same columns, in the same order, and the same columns.md as a sweep of the spec
writes now (a stale results.csv or figure set would show here; rerun
``experiments/run_all.sh`` and copy each ``out`` back). The numbers themselves are checked by
the tests of each experiment (tests/test_sweep_moe.py, tests/test_readme_commands.py)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from parosim.io.sweep import load_sweep_spec
from parosim.io.sweep_columns import columns_markdown, sweep_columns

ROOT = Path(__file__).resolve().parents[1]
SPECS = sorted(ROOT.glob("experiments/[0-9]*/sweep.yaml"))


def test_every_experiment_spec_is_found():
    assert len(SPECS) >= 9


@pytest.mark.parametrize("spec_path", SPECS, ids=lambda p: p.parent.name)
def test_committed_outputs_have_the_current_columns(spec_path):
    out = spec_path.parent / "out"
    spec = load_sweep_spec(spec_path)
    keys, moe = spec.input_keys(), spec.has_moe()
    with (out / "results.csv").open(newline="") as f:
        header = next(csv.reader(f))
    assert header == list(sweep_columns(spec.kind, keys, moe))
    assert (out / "columns.md").read_text() == columns_markdown(spec.kind, keys, moe)
    assert (out / "inputs.json").is_file()
    assert any((out / "figures").glob("*.png"))


def test_internlm_sweep_equals_the_fit_scripts_predictions():
    """experiments/13_internlm_sweep (a sweep on the clusters 12's run.py fitted) gives the
    very step times 12's run.py predicts, row by row."""
    with (ROOT / "experiments/12_scaling_internlm/out/results.csv").open(newline="") as f:
        fit = {(int(r["tp"]), r["strategy"], int(r["gpus"])): float(r["predicted_s"])
               for r in csv.DictReader(f)}
    with (ROOT / "experiments/13_internlm_sweep/out/results.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(fit) == 24
    for r in rows:
        key = (int(r["tp"]), r["strategy"], int(r["gpus"]))
        assert float(r["step_time_s"]) == pytest.approx(fit[key], rel=1e-6), key
        assert ("calibrated on runs of 1, 2, 4, 8 nodes" in r["warnings"]) == (key[2] > 64)
