"""InternLM-7B NNG vs NNI, 8 to 256 GPUs: fit on the rows at <= 8 nodes, predict 16 and 32.

The published step rows (internlm_steps_tp1.csv), the fit of ``parosim calibrate --steps
--holdout scale:8 --mode engine --params nic.bandwidth,collective.step_latency`` and a
figure of measured points beside the predicted curves (tokens/s per GPU; scaling
efficiency = per-GPU throughput / that at 8 GPUs, its axis anchored at 0). Writes
out/results.csv and out/internlm-scaling.png.

    python experiments/12_scaling_internlm/run.py
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from matplotlib.figure import Figure  # noqa: E402

from parosim.calibrate.steps import fit_steps, read_steps  # noqa: E402
from parosim.io import load_cluster  # noqa: E402

TOKENS_PER_GPU_STEP = 2 * 4 * 2048   # micro_bsz x micro_num x seq_len (tp = 1)


def main() -> int:
    runs = read_steps(HERE / "internlm_steps_tp1.csv")
    f = fit_steps(runs, load_cluster("internlm-a100-roce"), "scale:8", "engine",
                  ["nic.bandwidth", "collective.step_latency"])
    out = HERE / "out"
    out.mkdir(exist_ok=True)
    rows = sorted(f["rows"], key=lambda r: (r["strategy"], r["nodes"]))
    with open(out / "results.csv", "w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(["strategy", "gpus", "what", "measured_s", "predicted_s", "error_pct",
                    "measured_tokens_per_s_per_gpu", "predicted_tokens_per_s_per_gpu"])
        for r in rows:
            w.writerow([r["strategy"], 8 * r["nodes"], r["what"], f"{r['measured_s']:.4f}",
                        f"{r['simulated_s']:.4f}", f"{r['error_pct']:+.2f}",
                        f"{TOKENS_PER_GPU_STEP / r['measured_s']:.0f}",
                        f"{TOKENS_PER_GPU_STEP / r['simulated_s']:.0f}"])
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    ax, ax2 = fig.subplots(1, 2)
    names = {"NNG": "NNG (zero1=-1)", "NNI": "NNI (zero1=8)"}
    for color, s in (("C0", "NNG"), ("C1", "NNI")):
        rs = [r for r in rows if r["strategy"] == s]
        g = [8 * r["nodes"] for r in rs]
        meas = [TOKENS_PER_GPU_STEP / r["measured_s"] for r in rs]
        pred = [TOKENS_PER_GPU_STEP / r["simulated_s"] for r in rs]
        ax.plot(g, pred, "-", color=color, label=f"{names[s]} predicted")
        ax.plot(g, meas, "o", color=color, label=f"{names[s]} measured (InternLM)")
        ax2.plot(g, [p / pred[0] for p in pred], "-", color=color,
                 label=f"{names[s]} predicted")
        ax2.plot(g, [m / meas[0] for m in meas], "o", color=color,
                 label=f"{names[s]} measured")
    for a in (ax, ax2):
        a.set_xscale("log", base=2)
        a.set_xticks([8, 16, 32, 64, 128, 256], ["8", "16", "32", "64", "128", "256"])
        a.set_xlabel("GPUs")
        a.axvspan(90, 300, color="0.92", zorder=0, label="predicted, not fitted")
        a.grid(True, alpha=0.3)
    ax.set_ylabel("tokens/s per GPU")
    ax.set_title("InternLM-7B, A100-80GB, 4 x 100 Gb RoCE per node")
    ax2.set_ylim(0.0, 1.05)
    ax2.axhline(1.0, color="k", linestyle=":", linewidth=1)
    ax2.set_ylabel("scaling efficiency (per-GPU throughput / at 8 GPUs)")
    ax2.set_title("fit at <= 64 GPUs, predicted at 128 and 256")
    ax.legend(fontsize=8)
    ax2.legend(fontsize=8, loc="lower left")
    fig.savefig(out / "internlm-scaling.png", dpi=110, metadata={"Software": None})
    for r in rows:
        print(f"{r['strategy']} {8 * r['nodes']:>4} GPUs {r['what']:<9} measured "
              f"{r['measured_s']:.3f} s predicted {r['simulated_s']:.3f} s "
              f"({r['error_pct']:+.1f} %)")
    cp = f["cluster_params"]
    print(f"nic.bandwidth {cp['nic.bandwidth'] / 1e9:.2f} GB/s per NIC, "
          f"collective.step_latency {cp['collective.step_latency'] * 1e6:.2f} us, "
          f"overlap_slowdown {f['overlap_slowdown']:.3f}, compute scale {f['scale']:.3f}; "
          f"warnings: {f['warnings'] or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
