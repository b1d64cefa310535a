"""Megatron-Bridge MoE training throughput against parosim's MoE step model.

Chooses the parameter set among the candidates (parosim.calibrate.moe_throughput.VARIANTS) by
5-fold cross-validation inside the fit half of the Megatron-Bridge rows
(tests/data/moe_throughput/megatron_bridge.csv; even rows of each model family), fits the
chosen one on the whole fit half, predicts every row once, and writes out/rows.csv (every
row: measured, predicted, error, fit or held out), out/fit.json (the selection table, the
fitted parameters, per-family errors, the excluded row groups) and out/moe_throughput.png
(predicted against measured). Run from the repository root:

    PYTHONPATH=. python experiments/17_moe_throughput/run.py
"""

from __future__ import annotations

import csv
import json
import time
from collections import Counter
from pathlib import Path

from parosim.calibrate.moe_throughput import CV_FOLDS, calibrate, family_errors

FIELDS = ("gemm_efficiency", "moe_layer_overhead_s", "a2a_exposed", "attention_efficiency",
          "hbm_efficiency", "fp8_gemm_efficiency")

OUT = Path(__file__).resolve().parent / "out"


def main() -> None:
    t0 = time.perf_counter()
    f, errs, excluded, selection = calibrate()
    OUT.mkdir(exist_ok=True)
    with open(OUT / "rows.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["row", "family", "hardware", "release", "precision", "gpus", "tp", "pp",
                    "vp", "ep", "gbs", "mbs", "seq_len", "split", "measured_tokens_per_s_per_gpu",
                    "predicted_tokens_per_s_per_gpu", "error_pct"])
        for r, p, e in errs:
            w.writerow([r.index, r.family, r.hardware, r.release, r.precision, r.gpus,
                        r.par.tp, r.par.pp, r.par.vp, r.par.ep, r.global_batch,
                        r.micro_batch, r.seq_len, "fit" if r.fit else "held-out",
                        f"{r.measured:.0f}", f"{p:.0f}", f"{100 * e:+.1f}"])
    summary = {
        "split": "even rows of each family (file order) fit, odd rows held out",
        "selection": {
            "rule": f"{CV_FOLDS}-fold cross-validation inside the fit rows (fold = number "
                    f"among the family's fit rows mod {CV_FOLDS}); score = mean over families "
                    "of the median |error|; lowest score wins, ties to fewer parameters",
            "candidates": [{"variant": t["variant"].name, "params": t["params"],
                            "cv_score": round(t["score"], 4),
                            "cv_median_abs_error": {k: round(v, 4)
                                                    for k, v in t["families"].items()}}
                           for t in selection],
            "chosen": next(t["variant"].name for t in selection if t["chosen"]),
        },
        "hardware": {h: {k: round(getattr(e, k), 6) for k in FIELDS}
                     for h, e in f.hardware.items()},
        "release_factor_by": f.release_by,
        "release_factor": {" ".join(x for x in k if x): round(v, 4)
                           for k, v in f.releases.items()},
        "held_out": {k: {kk: round(vv, 4) for kk, vv in v.items()}
                     for k, v in family_errors(errs).items()},
        "fit": {k: {kk: round(vv, 4) for kk, vv in v.items()}
                for k, v in family_errors(errs, held_out=False).items()},
        "excluded": dict(Counter(why for _, _, why in excluded)),
    }
    (OUT / "fit.json").write_text(json.dumps(summary, indent=1) + "\n")
    table(errs)
    plot(errs)
    print(json.dumps(summary, indent=1))
    print(f"wall {time.perf_counter() - t0:.1f} s")


def table(errs) -> None:
    """out/table.md: every expressible row, measured, predicted, error, split."""
    lines = ["| row | family | hardware | release | precision | GPUs | TP/PP/VP/EP | GBS/MBS "
             "| split | measured (tokens/s/GPU) | predicted (tokens/s/GPU) | error |",
             "|---:|---|---|---|---|---:|---|---|---|---:|---:|---:|"]
    for r, p, e in errs:
        lines.append(f"| {r.index} | {r.family} | {r.hardware} | {r.release} | {r.precision} "
                     f"| {r.gpus} | {r.par.tp}/{r.par.pp}/{r.par.vp}/{r.par.ep} "
                     f"| {r.global_batch}/{r.micro_batch} | {'fit' if r.fit else 'held out'} "
                     f"| {r.measured:,.0f} | {p:,.0f} | {100 * e:+.1f} % |")
    (OUT / "table.md").write_text("\n".join(lines) + "\n")


def plot(errs) -> None:
    import matplotlib  # deferred: plotting only
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred: plotting only

    fig, ax = plt.subplots(figsize=(7, 6))
    marks = {"deepseek-v3": "o", "gpt-oss-120b": "s", "qwen3-30b-a3b": "^",
             "qwen3-235b-a22b": "D"}
    for fam, mk in marks.items():
        for held, face in ((False, "none"), (True, None)):
            pts = [(r.measured, p) for r, p, _ in errs if r.family == fam and r.fit != held]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.scatter(xs, ys, marker=mk, facecolors=face,
                           label=f"{fam} ({'held out' if held else 'fit'})",
                           edgecolors=f"C{list(marks).index(fam)}",
                           color=f"C{list(marks).index(fam)}")
    lo, hi = 1000, 60000
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8, label="predicted = measured")
    ax.plot([lo, hi], [lo * 1.12, hi * 1.12], "k:", lw=0.8, label="±12 %")
    ax.plot([lo, hi], [lo / 1.12, hi / 1.12], "k:", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured throughput (tokens/s per GPU)")
    ax.set_ylabel("parosim predicted throughput (tokens/s per GPU)")
    ax.set_title("Megatron-Bridge MoE training: parosim vs measured")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(OUT / "moe_throughput.png", dpi=120)


if __name__ == "__main__":
    main()
