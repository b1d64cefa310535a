"""With no modelling flags (``--fidelity accurate``, the default), against every published
table of training runs parosim can express (experiments/defaults_accuracy/evaluate_defaults.py,
analytic mode): the share of the runs predicted to fit in memory and the median error of
per-GPU throughput, per table, with no per-table factor. The bounds: >= 95 % fit, median
|error| <= 12 %. The tables that miss a bound are named here, so that a change that moves a
table across a bound (either way) fails until docs/accuracy.md says so."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments" / "defaults_accuracy"))


@pytest.fixture(scope="module")
def summary():
    import evaluate_defaults as ed

    return {s["table"].split(" ")[0]: s for s in ed.evaluate()}


# tables whose runs are not all predicted to fit: NeMo's GPT3-20B TP2 and Nemotron-340B
# (docs/accuracy.md, "Memory")
FIT_MISSES = {"NVIDIA/NeMo"}
# tables whose median error is above 12 % uncalibrated: BigScience's cluster computes ~20 %
# below Selene, torchtitan's 500 W H100 fleet ~35 % below an SXM H100, SuperBench's GPT-2
# steps are launch-bound (docs/accuracy.md, "Compute")
ERROR_MISSES = {"BigScience", "pytorch/torchtitan", "microsoft/superbench-results"}


def test_every_expressible_table_is_evaluated(summary):
    assert set(summary) == {"mosaicml/llm-foundry", "Narayanan", "Korthikanti", "BigScience",
                            "pytorch/torchtitan", "NVIDIA/NeMo",
                            "microsoft/superbench-results"}
    assert summary["mosaicml/llm-foundry"]["rows"] == 61


def test_published_runs_fit(summary):
    for name, s in summary.items():
        assert (s["fit_share"] >= 0.95) == (name not in FIT_MISSES), (name, s["fit_share"])
    assert summary["NVIDIA/NeMo"]["fit_share"] == pytest.approx(12 / 14)


def test_throughput_median_error(summary):
    for name, s in summary.items():
        ok = s["median_abs_error_pct"] <= 12.0
        assert ok == (name not in ERROR_MISSES), (name, s["median_abs_error_pct"])
