"""Text tables of step results (``simulate``, ``compare``).
"""

from __future__ import annotations

COLS = (("strategy", 10, "<"), ("algo", 12, "<"), ("step s", 9, ">"),
         ("tokens/s", 10, ">"), ("TFLOPS", 7, ">"), ("MFU", 6, ">"), ("exposed s", 10, ">"),
         ("inter/GPU", 11, ">"), ("memory/GPU", 11, ">"), ("recomp", 7, ">"))


def table_line(cells: list[str], w: int = 10) -> str:
    """Columns of :data:`COLS` (the strategy column ``w`` wide), two spaces apart: a long
    value never runs into the next."""
    widths = [w] + [c[1] for c in COLS[1:]]
    return "  ".join(f"{c:{col[2]}{wd}}" for c, col, wd in zip(cells, COLS, widths,
                                                               strict=False))


def table_row(r: dict, w: int = 10) -> str:
    from ..units import fmt_bytes  # deferred: loaded when the command runs (start-up)

    mem = r["memory"]
    recomp = "yes" if mem.get("recompute") else "no"
    if not r["fits"]:
        lacks = "does not fit: lacks " + fmt_bytes(mem["shortfall_bytes"])
        return (table_line([strategy_label(r), r["algo"]], w) + "  " + f"{lacks:<60}" + "  "
                + f"{fmt_bytes(mem['total_bytes']):>11}  {recomp:>7}")
    return table_line([strategy_label(r), r["algo"], f"{r['step_time_s']:.3f}",
                       f"{r['tokens_per_s']:.0f}", f"{r['tflops_per_gpu']:.1f}", f"{r['mfu']:.3f}",
                  f"{r['exposed_comm_s']:.3f}", fmt_bytes(r["bytes_inter"]),
                  fmt_bytes(mem["total_bytes"]), recomp], w)


HEADER = table_line([c[0] for c in COLS])


FOOTER = ("TFLOPS: hardware FLOP/s per GPU, recomputation included; MFU: model FLOPs (no "
           "recomputation) / peak; recomp: activation recomputation on")


def strategy_label(r: dict) -> str:
    """``NGG (ZeRO-2)``: the framework name beside the PaRO name, when there is one (the
    runtime's stage, else the strategy's usual framework name)."""
    from ..spec.strategy import FRAMEWORK_NAMES  # deferred: loaded when the command runs (start-up)

    if r.get("expert_strategy"):   # a MoE step: dense x expert strategy
        return f"{r['strategy'].replace('PaRO-', '')} x {r['expert_strategy'].replace('PaRO-', '')}"
    st = r.get("framework_stage")
    short = r["strategy"].replace("PaRO-", "")
    st = st or FRAMEWORK_NAMES.get(short)
    return f"{r['strategy']} ({st})" if st else r["strategy"]


def label_width(rows: list[dict]) -> int:
    """Width of the strategy column: 10, or the longest name with its stage."""
    return max([10] + [len(strategy_label(r)) for r in rows])


def table_header(w: int) -> str:
    return table_line([c[0] for c in COLS], w)
