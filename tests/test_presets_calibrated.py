"""The calibrated presets against the published nccl-tests logs they were fitted to.

Acceptance: with the preset, ``parosim collective --compare`` (algorithm ``nccl``, the
flow-level engine) is within median |error| <= 10 % and worst <= 25 % for sizes >= 64 KiB,
per log. Smaller sizes are reported (experiments/calibrate_presets/results.md), not bounded.
The held-out error (a fit that never saw every other size) is recomputed here for the
single-node preset (fast) and bounded the same way.
"""

import re
from pathlib import Path

import pytest

from parosim.calibrate.links import fit, measurements_from_log, split_holdout
from parosim.collectives import Algo
from parosim.collectives.bench import SMALL_BYTES, cluster_for_log, compare_log, error_summary
from parosim.io import load_cluster
from parosim.io.nccltests import read_nccl_tests

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "nccl-tests"
FITTED = {
    "aws-p4de": ["aws-p4de-2node-all_reduce.txt"],
    "aws-p5": ["aws-p5-2node-all_reduce.txt", "aws-p5-batch-all_reduce.txt"],
    "azure-ndmv4": ["azure-ndmv4-superbench-all_reduce.txt"],
    # the EKS excerpt (older NCCL / aws-ofi-nccl): its own preset, fitted on it alone
    "aws-p5-eks": ["aws-p5-eks-excerpt-all_reduce.txt"],
    # the msccl tables (NCCL column): a node described as 8 x H100 (see its nominal file)
    "azure-ndv5-msccl": ["azure-ndmv4-msccl-all_reduce.txt",
                         "azure-ndmv4-msccl-all_gather.txt"],
}
CASES = [(p, f) for p, fs in FITTED.items() for f in fs]


@pytest.mark.parametrize("preset,log", CASES)
def test_preset_matches_its_logs(preset, log):
    lg = read_nccl_tests(DATA / log)
    spec = cluster_for_log(load_cluster(preset), lg)
    rows = compare_log(spec, lg, Algo.NCCL)
    s = error_summary(rows)
    table = "\n".join(f"{r['size_bytes']:>12} meas {r['measured_s'] * 1e6:10.1f} us sim "
                      f"{r['simulated_s'] * 1e6:10.1f} us {r['error_pct']:+6.1f}%" for r in rows)
    assert s["large_n"] >= 6
    assert s["small_n"] >= 1 or min(r["size_bytes"] for r in rows) >= SMALL_BYTES  # excerpt
    assert s["large_median_abs_error_pct"] <= 10, table
    assert s["large_max_abs_error_pct"] <= 25, table


@pytest.mark.parametrize("preset", sorted(FITTED))
def test_every_fitted_value_states_its_source(preset):
    text = (ROOT / "topologies" / f"{preset}.yaml").read_text()
    for log in FITTED[preset]:
        assert log in text
        src = read_nccl_tests(DATA / log).source.split(" (")[0]
        assert src in text, src
    assert "fitted parameters:" in text
    fitted = re.findall(r"^(.*)# (fitted from|not identified by) ", text, re.M)
    assert len(fitted) >= 5
    for line, _ in fitted:  # the comment sits on a value line
        assert re.match(r"^\s+\w+: \S+", line), line


def test_held_out_error_of_the_single_node_preset():
    """Fit azure-ndmv4's nominal description without every other size; predict those."""
    nominal = load_cluster(ROOT / "experiments" / "calibrate_presets" /
                           "azure-ndmv4-nominal.yaml")
    lg = read_nccl_tests(DATA / "azure-ndmv4-superbench-all_reduce.txt")
    fitted, held = split_holdout(measurements_from_log(nominal, lg), "every-other")
    f = fit(nominal, fitted, Algo.NCCL, held=held, holdout="every-other",
            starts=(0.0, -1.0, 1.0), max_nfev=200)  # as experiments/calibrate_presets.py
    big = [r for r in f.held_rows if r["size_bytes"] >= SMALL_BYTES]
    errs = sorted(abs(r["error_pct"]) for r in big)
    assert len(big) >= 8
    assert errs[len(errs) // 2] <= 10, errs
    assert errs[-1] <= 25, errs


RESULTS = ROOT / "experiments" / "calibrate_presets"


def test_results_report_held_out_and_small_sizes_for_every_fitted_log():
    """results.md's claim per (preset, log): the held-out error is reported beside the fit."""
    import json

    res = json.loads((RESULTS / "results.json").read_text())
    fitted = {(r["preset"], r["log"]): r for r in res if r["role"] == "fit"}
    assert set(fitted) == set(CASES)
    for r in fitted.values():
        h = r["held_out"]
        assert h is not None and h["large_n"] >= 3, r["log"]
        assert h["large_median_abs_error_pct"] is not None
        assert r["n_params"] >= 1 and r["n_fit_sizes"] >= r["calibrated"]["large_n"]


def test_single_published_numbers_checked_against_calibrated_presets():
    """The one-number sources (mscclpp tables, nccl-tests issues): every one checked against
    a calibrated preset is within 25 % at >= 64 KiB; the rest say why they were kept aside or
    are below 64 KiB / against a nominal preset (reported)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("calibrate_presets",
                                                  ROOT / "experiments" / "calibrate_presets.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    checks = mod.run_checks()  # simulated now, with the presets as committed
    assert len(checks) >= 10
    calibrated = set(FITTED)
    bounded = [c for c in checks if c["preset"] in calibrated and c["size_bytes"] >= SMALL_BYTES]
    assert len(bounded) >= 4
    for c in bounded:
        assert abs(c["error_pct"]) <= 25, c
    for c in checks:
        assert c["source"] and c["role"]
        assert (c["preset"] is None) == c["role"].startswith("kept aside"), c
