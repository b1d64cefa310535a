"""Fit the kernel model's ``eager_attention_efficiency`` on half of the Megatron-LM tables.

Eager attention (Megatron-LM's fused softmax, no FlashAttention) runs QKᵀ and AV as batched
GEMMs of depth ``head_dim``. The FlashAttention runs that fitted the other kernel parameters
(llm-foundry, ``fit_compute.py``) launch no such GEMM, so their efficiency is fitted here, on
the two published tables of eager-attention training in the calibration set, both Megatron-LM
on Selene (A100 80GB): Narayanan et al. 2021 Table 1 (10 configurations) and Korthikanti et
al. 2022 Tables 3-5 + §6.3 (9). Fit rows: the even-numbered configurations of each table
(0, 2, 4, ... in ``all_tables.py`` order); held out: the odd ones. One parameter, bounded to
(0.05, 1], scipy ``least_squares`` on log(predicted / published throughput), every other
kernel parameter as committed.

Run: ``PYTHONPATH=$PWD python experiments/07_compute_model/fit_eager_attention.py``
(about 30 s; writes ``out/fit_eager_attention.md``).
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

import all_tables  # noqa: E402


def split(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(fit, held-out): even- and odd-numbered rows."""
    return rows[0::2], rows[1::2]


def tables() -> dict[str, list[dict]]:
    return {"Narayanan Table 1": all_tables.narayanan_rows(),
            "Korthikanti Tables 3-5": all_tables.korthikanti_rows()}


def fit() -> dict:
    import numpy as np
    from scipy.optimize import least_squares

    fit_rows = [r for rows in tables().values() for r in split(rows)[0]]

    def resid(x):
        prof = {"eager_attention_efficiency": float(x[0])}
        return np.array([math.log1p(all_tables.predict(r, profile=prof)["error_pct"] / 100)
                         for r in fit_rows])

    res = least_squares(resid, [0.3], bounds=([0.05], [1.0]), diff_step=1e-3)
    return {"eager_attention_efficiency": float(res.x[0]), "fit_rows": len(fit_rows)}


def report(e: float) -> list[str]:
    prof = {"eager_attention_efficiency": e}
    lines = [f"eager_attention_efficiency = {e:.3f} (committed value: "
             f"{round(e, 2)})", "",
             "| table | rows | fit: median abs. error | held out: median | held out: worst |",
             "|---|---:|---:|---:|---:|"]
    for name, rows in tables().items():
        fit_rows, held = split(rows)
        fe = [abs(all_tables.predict(r, profile=prof)["error_pct"]) for r in fit_rows]
        he = [abs(all_tables.predict(r, profile=prof)["error_pct"]) for r in held]
        lines.append(f"| {name} | {len(rows)} | {statistics.median(fe):.1f} % | "
                     f"{statistics.median(he):.1f} % | {max(he):.1f} % |")
    return lines


def main() -> int:
    t0 = time.perf_counter()
    f = fit()
    lines = report(f["eager_attention_efficiency"])
    (HERE / "out").mkdir(exist_ok=True)
    (HERE / "out" / "fit_eager_attention.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"({f['fit_rows']} fit rows, {time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
