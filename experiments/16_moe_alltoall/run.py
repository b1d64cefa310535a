"""DeepEP dispatch / combine time against EP size on H800: fit on EP <= 32, predict EP >= 64.

DeepEP's published rows (tests/data/deepep/deepep_rows.csv, each with its source), expressed
as calls of :mod:`parosim.collectives.deepep` on the ``dgx-h800-ib`` preset; the EP kernel
costs ``collective.ep_normal`` and ``collective.ep_ll`` fitted on the rows at EP <= 32 by
:func:`parosim.calibrate.deepep.calibrate`, the rows at EP >= 64 predicted. Writes
out/results.csv (every row), out/fitted.yaml (the fitted ``collective`` keys, as the preset
carries them) and out/deepep-time-vs-ep.png, and prints the held-out medians.

    python experiments/16_moe_alltoall/run.py
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from matplotlib.figure import Figure  # noqa: E402

from parosim.calibrate.deepep import calibrate, load_rows, medians, scored  # noqa: E402
from parosim.collectives.deepep import EPCall, deepep_routing, ep_call_time  # noqa: E402
from parosim.io import load_cluster  # noqa: E402
from parosim.spec.system import EPKernelCost  # noqa: E402

DATA = ROOT / "tests" / "data" / "deepep" / "deepep_rows.csv"
COLUMNS = ("line", "family", "direction", "ep", "role", "measured_us", "model_us",
           "error_pct", "metric", "value", "unit", "source")


def fitted_yaml(spec) -> str:
    """The ``collective`` keys of the fit, 4 significant digits, as topologies/ carries them."""
    out = []
    for key in ("ep_normal", "ep_ll"):
        c: EPKernelCost = getattr(spec.collective, key)
        out.append(f"  {key}: {{nvlink_efficiency: {c.nvlink_efficiency:.4g}, "
                   f"rdma_efficiency: {c.rdma_efficiency:.4g}, "
                   f"latency: {c.latency_s * 1e6:.4g}us}}")
    return "\n".join(out) + "\n"


def curve(spec, row, eps):
    """Model times in us of ``row``'s call at other EP sizes."""
    out = []
    for ep in eps:
        c = row.call
        grouped = c.kernel == "normal" and ep > 8
        r = deepep_routing(ep, 8, topk=c.routing.topk, grouped=grouped)
        call = EPCall(c.kernel, c.direction, c.tokens, c.token_bytes, r, c.nvlink)
        out.append(ep_call_time(spec, call) * 1e6)
    return out


def main() -> int:
    rows, aside = load_rows(DATA)
    base = load_cluster("dgx-h800-ib")
    spec = calibrate(base, rows)
    res = scored(spec, rows)
    out = HERE / "out"
    out.mkdir(exist_ok=True)
    with open(out / "results.csv", "w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(COLUMNS)
        for r in res:
            w.writerow([r["line"], r["family"], r["direction"], r["ep"], r["role"],
                        f"{r['measured_us']:.1f}", f"{r['model_us']:.1f}",
                        f"{r['error_pct']:+.2f}", r["metric"], r["value"], r["unit"],
                        r["source"]])
    (out / "fitted.yaml").write_text("collective:\n" + fitted_yaml(spec))

    fig = Figure(figsize=(13, 4.8), layout="constrained")
    axes = fig.subplots(1, 3)
    panels = (("normal", "normal kernels, 4096 tokens per GPU"),
              ("low-latency", "low-latency, pure RDMA, 128 tokens"),
              ("low-latency-nvlink", "low-latency, NVLink in a node, 128 tokens"))
    marks = {"fit": ("o", "fitted"), "held-out": ("s", "held out (predicted)"),
             "superseded": ("x", "superseded (README 2025-02)")}
    for ax, (fam, title) in zip(axes, panels, strict=True):
        for color, direction in (("C0", "dispatch"), ("C1", "combine")):
            rs = [r for r in rows if r.family == fam and r.call.direction == direction]
            live = sorted((r for r in rs if r.role != "superseded"), key=lambda r: r.ep)
            eps = sorted({r.ep for r in rs})
            ax.plot(eps, curve(spec, live[0], eps), "-", color=color,
                    label=f"{direction}: parosim")
            for role, (m, what) in marks.items():
                pts = [r for r in rs if r.role == role]
                if pts:
                    ax.plot([r.ep for r in pts], [r.time_s * 1e6 for r in pts], m,
                            color=color, fillstyle="none" if role == "held-out" else "full",
                            label=f"{direction}: DeepEP, {what}")
        ax.set_xscale("log", base=2)
        ax.set_xticks([8, 16, 32, 64, 128, 256], ["8", "16", "32", "64", "128", "256"])
        ax.set_xlabel("EP size (GPUs)")
        ax.set_ylabel("time per call (us)")
        top = max(r.time_s * 1e6 for r in rows if r.family == fam)
        ax.set_ylim(0, (2.0 if fam == "normal" else 1.6) * top)
        ax.set_title(title, fontsize=9)
        ax.axvspan(48, 300, color="0.93", zorder=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6.5, loc="upper left")
    fig.suptitle("DeepEP dispatch / combine on H800 (8 GPUs per node, one 400 Gb/s NIC per "
                 "GPU; FP8 dispatch, BF16 combine): measured vs parosim, fitted at EP <= 32 "
                 "(grey: EP >= 64, predicted)",
                 fontsize=10)
    fig.savefig(out / "deepep-time-vs-ep.png", dpi=110, metadata={"Software": None})

    for r in res:
        print(f"{r['family']:<19} {r['direction']:<8} EP {r['ep']:>3} {r['role']:<10} "
              f"measured {r['measured_us']:8.1f} us model {r['model_us']:8.1f} us "
              f"({r['error_pct']:+.1f} %)")
    for (fam, hw), v in sorted(medians(res).items()):
        print(f"held-out median |error| {fam} {hw}: {v:.2f} %")
    print(f"rows kept aside: {sum(1 for _, why in aside if why != 'check')}, "
          f"bandwidth twins used as checks: {sum(1 for _, why in aside if why == 'check')}")
    print("fitted:\n" + fitted_yaml(spec), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
