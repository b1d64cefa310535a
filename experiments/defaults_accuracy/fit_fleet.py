"""Fit the compute scale of torchtitan's H100 fleet (``topologies/h100-hbm2e-500w.yaml``) on
that fleet's own Llama 3 70B benchmark, and check the preset on the 405B table it never saw.

torchtitan's published runs ran on Meta's Grand Teton H100s: 96 GB HBM2e parts under a 500 W
power limit (pytorch/torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md
@b5bcd76c, the rows' hardware field), not the 700 W HBM3 H100 SXM of ``dgx-h100-ib``. No
datasheet states the sustained clock of that part at 500 W, so the preset's one unknown, a
scale ``k`` on the kernel model's efficiencies (``gemm_ceiling``, ``attention_efficiency``,
``hbm_efficiency``, ``eager_attention_efficiency``; as ``parosim calibrate --steps`` scales
them, capped at 1), is measured on that fleet:

* **fit**: the four expressible Llama 3 70B rows of the fleet's async-TP benchmark
  (``all_tables.torchtitan_calibration_rows``: FSDP 32 x TP 8, bf16 and float8 tensorwise,
  vanilla and async TP), each simulated with the defaults (``evaluate_defaults.predict``) on
  ``dgx-h100-ib``;
* **held out**: the three Llama 3.1 405B rows of torchtitan docs/performance.md @3faaa1a0
  (``all_tables.torchtitan_rows``), simulated on the new preset with no factor.

Run: ``PYTHONPATH=$PWD python experiments/defaults_accuracy/fit_fleet.py`` (prints the scaled
parameters written into the preset, and both errors).
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import evaluate_defaults as ed  # noqa: E402

BASE = "dgx-h100-ib"


FIELDS = ("gemm_ceiling", "attention_efficiency", "hbm_efficiency",
          "eager_attention_efficiency")


def fit_rows() -> list[dict]:
    """The fleet's four Llama 3 70B rows, on the base preset."""
    return [{**r, "cluster": BASE} for r in ed.all_tables.torchtitan_calibration_rows()]


def fit() -> float:
    """k, least squares on log(predicted / published) of :func:`fit_rows`, 3 decimals."""
    from scipy.optimize import least_squares

    rows = fit_rows()

    def resid(x):
        return [math.log1p(ed.predict(r, float(x[0]))["error_pct"] / 100) for r in rows]

    return round(float(least_squares(resid, [0.8], bounds=([0.05], [1.0]),
                                     diff_step=1e-3).x[0]), 3)


def main() -> int:
    from parosim.io import load_cluster

    k, rows = fit(), fit_rows()
    c = load_cluster(BASE).compute
    print(f"k = {k:.3f} (fit on {len(rows)} rows of the fleet's 70B benchmark, base {BASE})")
    for f in FIELDS:
        print(f"  {f}: {min(1.0, getattr(c, f) * k):.4f}")
    fe = [ed.predict(r, k)["error_pct"] for r in rows]
    print(f"fit rows: median |error| {statistics.median(map(abs, fe)):.1f} % "
          f"({', '.join(f'{e:+.1f}' for e in fe)} %)")
    held = ed.all_tables.torchtitan_rows()
    he = [ed.predict(r)["error_pct"] for r in held]
    print(f"held-out 405B rows on {held[0]['cluster']}: median |error| "
          f"{statistics.median(map(abs, he)):.1f} % ({', '.join(f'{e:+.1f}' for e in he)} %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
