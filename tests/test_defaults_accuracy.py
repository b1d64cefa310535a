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


# tables whose runs are not all predicted to fit: NeMo's GPT3-20B TP2, 13 of 14 (docs/accuracy.md,
# "Memory"): its terms leave 5.5 % free, under the Korthikanti estimate's fitted 10.5 % margin
# (fitted on the even rows of the TP / PP / CP tables, this row held out;
# tests/test_memory_margin.py)
FIT_MISSES = {"NVIDIA/NeMo"}
# expressible tables whose median error is above 12 % uncalibrated: BigScience's
# Megatron-DeepSpeed runs on Jean Zay carry a per-micro-batch cost the model lacks; every
# candidate mechanism checked is too small or already modelled (docs/accuracy.md, "Defaults";
# bigscience_candidates.py)
ERROR_MISSES = {"BigScience"}
# evaluated and reported, but not a step parosim's model spec can state (a 100-class head,
# pure fp16 AdamW: evaluate_defaults.NOT_EXPRESSIBLE); its miss (host-bound eager steps)
# stays in the output and the docs
NOT_EXPRESSIBLE = {"microsoft/superbench-results"}
# measured (analytic, deterministic): share predicted to fit, median |error| in %
MEASURED = {"mosaicml/llm-foundry": (1.0, 4.3), "Narayanan": (1.0, 5.5),
            "Korthikanti": (1.0, 3.2), "BigScience": (1.0, 24.4),
            "pytorch/torchtitan": (1.0, 7.7), "NVIDIA/NeMo": (13 / 14, 6.0),
            "microsoft/superbench-results": (1.0, 105.7)}


def test_every_expressible_table_is_evaluated(summary):
    assert set(summary) == {"mosaicml/llm-foundry", "Narayanan", "Korthikanti", "BigScience",
                            "pytorch/torchtitan", "NVIDIA/NeMo",
                            "microsoft/superbench-results"}
    assert summary["mosaicml/llm-foundry"]["rows"] == 61
    assert {n for n, s in summary.items() if not s["expressible"]} == NOT_EXPRESSIBLE


def test_published_runs_fit(summary):
    for name, s in summary.items():
        assert (s["fit_share"] >= 0.95) == (name not in FIT_MISSES), (name, s["fit_share"])
    assert summary["NVIDIA/NeMo"]["fit_share"] == pytest.approx(13 / 14)


def test_throughput_median_error(summary):
    for name, s in summary.items():
        ok = s["median_abs_error_pct"] <= 12.0
        assert ok == (name not in ERROR_MISSES | NOT_EXPRESSIBLE), (
            name, s["median_abs_error_pct"])


def test_not_expressible_tables_say_why():
    import evaluate_defaults as ed

    (why,) = ed.NOT_EXPRESSIBLE.values()
    assert "100-class" in why and "float16" in why and "pytorch_gpt2.py" in why
    text = (ROOT / "experiments" / "defaults_accuracy" / "out" / "defaults.md").read_text()
    assert "(not expressible, see below)" in text and why in text


def test_measured_numbers_are_the_documented_ones(summary):
    # the README's and docs/accuracy.md's table, to its printed precision
    for name, (fit, median) in MEASURED.items():
        s = summary[name]
        assert s["fit_share"] == pytest.approx(fit), name
        assert s["median_abs_error_pct"] == pytest.approx(median, abs=0.05), (
            name, s["median_abs_error_pct"])


def test_each_run_keeps_its_published_attention_kernel():
    # the attention kernel a run used is part of its configuration: FlashAttention for
    # llm-foundry, torchtitan and NeMo; eager (fused softmax) for the 2021-22 Megatron-LM /
    # Megatron-DeepSpeed tables and HuggingFace GPT-2
    import evaluate_defaults as ed

    kinds = {t.split(" ")[0]: {r["attention"] for r in rows} for t, rows in ed.tables().items()}
    assert kinds == {"mosaicml/llm-foundry": {"flash"}, "Narayanan": {"eager"},
                     "Korthikanti": {"eager"}, "BigScience": {"eager"},
                     "pytorch/torchtitan": {"flash"}, "NVIDIA/NeMo": {"flash"},
                     "microsoft/superbench-results": {"eager"}}
    row = ed.tables()[ed.FOUNDRY][0]
    assert ed.training_of(row).attention == "flash"
    assert ed.training_of({**row, "attention": "eager"}).attention == "eager"


def test_fleet_preset_carries_the_fitted_scale():
    # topologies/h100-hbm2e-500w.yaml: dgx-h100-ib's kernel efficiencies x k, k fitted on
    # the fleet's four Llama 3 70B rows (fit_fleet.py), never on the 405B table
    import fit_fleet

    from parosim.io import load_cluster

    k = fit_fleet.fit()
    assert k == pytest.approx(0.717, abs=0.0015)
    base, fleet = load_cluster("dgx-h100-ib").compute, load_cluster("h100-hbm2e-500w").compute
    for f in fit_fleet.FIELDS:
        assert getattr(fleet, f) == pytest.approx(min(1.0, getattr(base, f) * 0.717),
                                                  abs=1e-4), f
    assert not {r["config"] for r in fit_fleet.fit_rows()} & {
        r["config"] for r in fit_fleet.ed.all_tables.torchtitan_rows()}


def test_bigscience_candidates_are_sized():
    # docs/accuracy.md, "Defaults": each candidate mechanism of the BigScience miss sized
    # against the published micro-batch pair; main() asserts the statements of its table
    import bigscience_candidates as bc

    assert bc.main() == 0
    # DeepSpeed's TrainSchedule, replayed with blocking paired transfers, ends with 1F1B:
    # (m + p - 1)(t_f + t_b) on equal stages, the same instant on unequal ones ...
    assert bc.schedule_times(6, 64, [1.0] * 6, [3.0] * 6) == (69 * 4.0, 69 * 4.0)
    ds, ofob = bc.schedule_times(3, 7, [1.0, 1.2, 0.9], [3.0, 2.5, 3.3])
    assert ds == pytest.approx(ofob)
    # ... and a transfer cost shows on its critical path (4 transfers per slot, 1F1B's two
    # batched exchanges 2)
    slow_ds, slow_ofob = bc.schedule_times(6, 64, [1.0] * 6, [3.0] * 6, 0.01)
    assert slow_ds - 69 * 4.0 == pytest.approx(4 * 0.01 * 69, rel=0.1)
    assert 69 * 4.0 < slow_ofob < slow_ds
