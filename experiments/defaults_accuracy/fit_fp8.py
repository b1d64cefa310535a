"""Fit the kernel model's ``fp8_gemm_efficiency`` (parosim.spec.compute) on the published FP8
runs: the even-numbered rows of the NeMo 24.07 / Megatron-Bridge 25.11 table on DGX-H100
(experiments/07_compute_model/all_tables.py ``nemo_rows``, sources there), the odd rows held
out. Each row is simulated with the defaults (evaluate_defaults.predict: the published
layout and precision, ``--fidelity accurate``), tokens/s per GPU compared.

Also prints the FP8 speed-up parosim predicts over bf16 for each row (the same
configuration in bf16), beside the error of the FP8 prediction: the shared data has no bf16
NeMo row of the same configurations, so the measured speed-up itself cannot be stated;
what the rows bound is how far the predicted FP8 throughput is off.

Run: ``PYTHONPATH=$PWD python experiments/defaults_accuracy/fit_fp8.py`` (about a minute).
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import evaluate_defaults as ed  # noqa: E402


def errors(rows: list[dict], e: float) -> list[float]:
    return [ed.predict(r, profile={"fp8_gemm_efficiency": e})["error_pct"] for r in rows]


def main() -> int:
    from scipy.optimize import least_squares

    rows = ed.all_tables.nemo_rows()
    fit, held = rows[0::2], rows[1::2]

    def resid(x):
        return [math.log1p(v / 100) for v in errors(fit, float(x[0]))]

    e = float(least_squares(resid, [0.8], bounds=([0.3], [1.0]), diff_step=1e-3).x[0])
    e = round(e, 3)
    fe, he = errors(fit, e), errors(held, e)
    print(f"fp8_gemm_efficiency = {e:.3f} (fit on {len(fit)} even rows)")
    print(f"fit rows: median |error| {statistics.median(map(abs, fe)):.1f} %, held-out "
          f"{len(held)} odd rows: median {statistics.median(map(abs, he)):.1f} %, worst "
          f"{max(map(abs, he)):.1f} %")
    print("| configuration | published tokens/s/GPU | predicted FP8 | error | predicted bf16 | "
          "predicted FP8 / bf16 |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        f8 = ed.predict(r, profile={"fp8_gemm_efficiency": e})
        b16 = ed.predict(replace_precision(r))
        print(f"| {r['config']} | {r['published']:.0f} | {f8['predicted']:.0f} | "
              f"{f8['error_pct']:+.1f} % | {b16['predicted']:.0f} | "
              f"{f8['predicted'] / b16['predicted']:.2f} |")
    return 0


def replace_precision(row: dict) -> dict:
    """The same configuration in bf16 (fp8-only settings dropped)."""
    return {**row, "precision": "bf16", "fp8_params": False}


if __name__ == "__main__":
    sys.exit(main())
