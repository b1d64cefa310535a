"""The PaRO paper's 8 headline ratios: parosim (paro runtime vs deepspeed runtime, nothing
fitted to them) puts every one on the paper's side of 1 (experiments/paper_table)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "paper_table" / "paper_table.py"


@pytest.fixture(scope="module")
def table():
    spec = importlib.util.spec_from_file_location("paper_table", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.headline("analytic")


def test_eight_headline_ratios_on_the_papers_side_of_one(table):
    assert len(table) == 8
    for r in table:
        assert r["paper"] > 1 and r["parosim"] > 1, r


def test_nig_and_nii_ahead_of_zero2_in_partial_training(table):
    """The result the ideal runtime missed (a tie): with DeepSpeed 0.10.0's overlap_comm
    default (false for ZeRO-2) the baseline's per-micro-step reduction is exposed."""
    partial = [r for r in table if "partial" in r["result"] and "ZeRO-2" in r["result"]]
    assert len(partial) == 2
    for r in partial:
        assert r["parosim"] > 1.05, r
        assert abs(r["error_pct"]) < 25, r
