"""DeepEP / HybridEP dispatch / combine time against EP size: fit on EP <= 32, predict EP >= 64.

DeepEP's published rows (tests/data/deepep/deepep_rows.csv, each with its source), expressed
as calls of :mod:`parosim.collectives.deepep`: DeepEP's H800 rows on the ``dgx-h800-ib``
preset (``collective.ep_normal``, ``collective.ep_ll``), HybridEP's H100 kernel-only rows on
dgx-h100-hybridep.yaml here (``collective.ep_hybrid``); the EP kernel costs fitted on the
rows at EP <= 32 by :func:`parosim.calibrate.deepep.calibrate`, the rows at EP >= 64
predicted. Writes out/results.csv (every row), out/fitted.yaml (the fitted ``collective``
keys per cluster, as the cluster files carry them) and out/deepep-time-vs-ep.png, and prints
the held-out medians.

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

from parosim.calibrate.deepep import (  # noqa: E402
    FAMILIES,
    calibrate,
    load_rows,
    medians,
    scored,
)
from parosim.collectives.deepep import EPCall, deepep_routing, ep_call_time  # noqa: E402
from parosim.io import load_cluster  # noqa: E402
from parosim.spec.system import EP_KERNELS, EPKernelCost  # noqa: E402

DATA = ROOT / "tests" / "data" / "deepep" / "deepep_rows.csv"
COLUMNS = ("line", "hardware", "family", "direction", "precision", "config", "ep", "role",
           "measured_us", "model_us", "error_pct", "metric", "value", "unit", "source")
#: the cluster of each hardware
CLUSTERS = {"NVIDIA H800": "dgx-h800-ib",
            "NVIDIA H100": str(HERE / "dgx-h100-hybridep.yaml")}


def fitted_yaml(spec, keys) -> str:
    """The ``collective`` keys of the fit, 4 significant digits, as the cluster files carry
    them."""
    out = []
    for key in keys:
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
        experts = 8 * ep if c.kernel == "hybrid" else 256   # HybridEP: 8 local experts
        r = deepep_routing(ep, 8, experts=experts, topk=c.routing.topk, grouped=grouped)
        call = EPCall(c.kernel, c.direction, c.tokens, c.token_bytes, r, c.nvlink)
        out.append(ep_call_time(spec, call) * 1e6)
    return out


def main() -> int:
    rows, aside = load_rows(DATA)
    specs, res, text = {}, [], ""
    for hw, cluster in CLUSTERS.items():
        mine = [r for r in rows if r.hardware == hw]
        specs[hw] = calibrate(load_cluster(cluster), mine)
        res += scored(specs[hw], mine)
        keys = sorted({FAMILIES[r.family][0] for r in mine}, key=EP_KERNELS.index)
        text += f"# {Path(cluster).name}\ncollective:\n" + fitted_yaml(specs[hw], keys)
    out = HERE / "out"
    out.mkdir(exist_ok=True)
    with open(out / "results.csv", "w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(COLUMNS)
        for r in res:
            w.writerow([r["line"], r["hardware"], r["family"], r["direction"], r["precision"],
                        r["config"], r["ep"], r["role"], f"{r['measured_us']:.1f}",
                        f"{r['model_us']:.1f}", f"{r['error_pct']:+.2f}", r["metric"],
                        r["value"], r["unit"], r["source"]])
    (out / "fitted.yaml").write_text(text)

    fig = Figure(figsize=(17, 4.9), layout="constrained")
    axes = fig.subplots(1, 4)
    panels = (("normal", "H800, DeepEP normal, 4096 tokens"),
              ("low-latency", "H800, DeepEP low-latency, pure RDMA, 128 tokens"),
              ("low-latency-nvlink", "H800, DeepEP low-latency, NVLink, 128 tokens"),
              ("hybrid-ep", "H100, HybridEP kernel, 4096 tokens, 8 SMs (16: light)"))
    marks = {"fit": ("o", "fitted"), "held-out": ("s", "held out"),
             "superseded": ("x", "superseded (2025-02)")}
    calls = (("C0", "dispatch", "FP8"), ("C2", "dispatch", "BF16"), ("C1", "combine", "BF16"))
    for ax, (fam, title) in zip(axes, panels, strict=True):
        fam_rows = [r for r in rows if r.family == fam]
        spec = specs[fam_rows[0].hardware]
        for color, direction, prec in calls:
            rs = [r for r in fam_rows if r.call.direction == direction and r.precision == prec]
            if not rs:
                continue
            live = sorted((r for r in rs if r.role != "superseded"), key=lambda r: r.ep)
            eps = sorted({r.ep for r in rs})
            ax.plot(eps, curve(spec, live[0], eps), "-", color=color,
                    label=f"{direction} {prec}: parosim")
            for role, (m, what) in marks.items():
                for cfg, alpha in (("", 1.0), ("8 SMs", 1.0), ("16 SMs", 0.5)):
                    pts = [r for r in rs if r.role == role and r.config == cfg]
                    if pts:
                        ax.plot([r.ep for r in pts], [r.time_s * 1e6 for r in pts], m,
                                color=color, alpha=alpha,
                                fillstyle="none" if role == "held-out" else "full",
                                label=(f"{direction} {prec}: measured, {what}"
                                       if cfg != "16 SMs" else None))
        ax.set_xscale("log", base=2)
        ax.set_xticks([8, 16, 32, 64, 128, 256], ["8", "16", "32", "64", "128", "256"])
        ax.set_xlabel("EP size (GPUs)")
        ax.set_ylabel("time per call (us)")
        top = max(r.time_s * 1e6 for r in fam_rows)
        ax.set_ylim(0, (1.6 if fam.startswith("low") else 2.0) * top)
        if fam == "hybrid-ep":
            ax.set_xlim(12, 90)
            ax.text(0.97, 0.03, "BF16 dispatch and combine move\nthe same bytes: one line",
                    transform=ax.transAxes, ha="right", va="bottom", fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.axvspan(48, 300, color="0.93", zorder=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6, loc="upper left")
    fig.suptitle("Expert all-to-all kernels: measured (DeepEP's published tables) vs parosim, "
                 "fitted at EP <= 32; grey: EP >= 64, predicted. 8 GPUs per node, one 400 "
                 "Gb/s NIC per GPU", fontsize=10)
    fig.savefig(out / "deepep-time-vs-ep.png", dpi=110, metadata={"Software": None})

    for r in res:
        print(f"{r['family']:<19} {r['direction']:<8} EP {r['ep']:>3} {r['role']:<10} "
              f"measured {r['measured_us']:8.1f} us model {r['model_us']:8.1f} us "
              f"({r['error_pct']:+.1f} %)")
    for (fam, hw), v in sorted(medians(res).items()):
        print(f"held-out median |error| {fam} {hw}: {v:.2f} %")
    print(f"rows kept aside: {sum(1 for _, why in aside if why != 'check')}, "
          f"bandwidth twins used as checks: {sum(1 for _, why in aside if why == 'check')}")
    print("fitted:\n" + text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
