"""DeepEP dispatch / combine measurements: load, express, fit, hold out.

The rows are DeepEP's published benchmark tables (``tests/data/deepep/deepep_rows.csv``, each
row with its source). A row becomes a time in s and an :class:`~parosim.collectives.deepep.
EPCall` on the hardware it ran on:

* low-latency rows print the time (``latency``, us); their ``RDMA_bandwidth`` twin is that
  time's bandwidth, ``tokens x top-k x token bytes / time`` (tests/test_low_latency.py), and
  only checks the byte count;
* normal-kernel rows print a *logical* bandwidth, which DeepEP's scripts define as a byte
  count over the time: intranode ``recv_x.numel() x 2 x fp8_factor`` (every token a rank
  receives, from itself too: EP x T x p_rank tokens), internode ``num_rdma_token_sent x
  hidden x 2 x fp8_factor`` (every (token, node) pair, the rank's own node included:
  T x nodes x p_node), ``fp8_factor = (1 + 4/128) / 2`` for FP8 (tests/test_intranode.py,
  test_internode.py). The time is that count over the printed bandwidth, with p_rank and
  p_node from the same router (:func:`~parosim.collectives.deepep.deepep_routing`).

* HybridEP kernel-only rows (H100) print an IB bandwidth, the same (token, node) count as the
  internode normal kernels, over 8 local experts per rank and a uniform top-k router
  (tests/test_hybrid_ep.py).

A row of an older README that a later one re-measured ("Fix the performance data",
2025-04-22) is ``superseded``: kept, reported, neither fitted nor scored. Rows parosim cannot
express are kept aside with the reason (:data:`ASIDE`).

The fit (:func:`fit_family`): per kernel family the three fields of
``collective.ep_normal`` / ``ep_ll`` (:class:`~parosim.spec.system.EPKernelCost`) minimise
sum ln(T_model / T_measured)^2 over the fit rows (``scipy.optimize.least_squares``, bounded,
log-space parameters). The split holds out the largest EP sizes: fit on EP <= 32, score on
EP >= 64. docs/calibration.md, "Expert all-to-all kernels".
"""

from __future__ import annotations

import csv
import re
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from ..collectives.deepep import (
    EPCall,
    bf16_token_bytes,
    deepep_routing,
    ep_call_time,
    fp8_token_bytes,
    ll_fp8_token_bytes,
)
from ..errors import InputError
from ..spec.system import ClusterSpec, EPKernelCost

#: largest EP size of the fit rows; larger ones are held out
FIT_MAX_EP = 32
#: rows kept aside: (text in the source, in the software, in the hardware, reason); the
#: first match wins
ASIDE = (
    ("V2 release", "", "", "DeepEP V2 rows: the GPU SKU (SM90 / SM100) and the NIC speed "
                           "are not stated, so there is no cluster to express them on"),
    ("README_Hybrid-EP", "Torch API", "H100",
     "HybridEP through its torch API: the time includes host-side work (allocation, "
     "synchronisation) that the EP kernel costs do not model; the kernel-only rows of the "
     "same runs are used"),
    ("README_Hybrid-EP", ", 4 SMs", "H100",
     "HybridEP on 4 SMs: the kernel is bound by its SMs (its FP8 dispatch moves fewer bytes/s "
     "than its BF16 one), which the EP kernel costs do not take as an input; the rows at 8 "
     "and 16 SMs are used"),
    ("README_Hybrid-EP", "", "GB200", "GB200 NVL72 rows: no preset for a 72-GPU NVLink "
                                      "domain yet, each at its own SM count"),
    ("README_Hybrid-EP", "", "B200", "B200 rows: one node (8 ranks) only, no EP sizes to "
                                     "fit and hold out, each at its own SM count"),
    ("README_PCIe", "", "", "H20 with NVLink disabled, NIC speed not stated: no cluster to "
                            "express it on"),
)
#: a row's kernel family: the EP kernel costs it fits, and whether low-latency peers of a node
#: use NVLink
FAMILIES = {"normal": ("ep_normal", True), "low-latency": ("ep_ll", False),
            "low-latency-nvlink": ("ep_ll", True), "hybrid-ep": ("ep_hybrid", True)}


@dataclass(frozen=True)
class DeepEPRow:
    """One measured call: ``time_s`` (measured or derived, module docstring) of ``call``;
    ``line`` is the row's line in the CSV (header = 1)."""

    line: int
    source: str
    hardware: str
    family: str
    call: EPCall
    ep: int
    metric: str
    value: float
    unit: str
    time_s: float
    logical_bytes: float
    superseded: bool = False
    config: str = ""          # the row's own setting beyond EP (HybridEP: its SM count)
    precision: str = ""       # the tokens' format: FP8 or BF16

    @property
    def role(self) -> str:
        if self.superseded:
            return "superseded"
        return "fit" if self.ep <= FIT_MAX_EP else "held-out"


def _int(pattern: str, text: str, what: str, line: int) -> int:
    m = re.search(pattern, text)
    if not m:
        raise InputError(f"DeepEP row {line}: no {what} in {text!r}")
    return int(m.group(1))


def _version(source: str) -> str:
    m = re.search(r"\((\d{4}-\d{2}-\d{2})", source)
    return m.group(1) if m else ""


def load_rows(path: str | Path) -> tuple[list[DeepEPRow], list[tuple[int, str]]]:
    """(the rows parosim expresses, [(CSV line, reason)] of the rows kept aside). The
    ``RDMA_bandwidth`` twins of the low-latency latencies are checks, not rows of their own:
    they are returned with reason ``"check"``."""
    with open(path, newline="") as f:
        raw = list(csv.DictReader(f))
    rows: list[DeepEPRow] = []
    aside: list[tuple[int, str]] = []
    for i, r in enumerate(raw, start=2):
        if r["kind"] != "collective":
            continue
        reason = next((why for src, soft, hw, why in ASIDE if src in r["source"]
                       and soft in r["software"] and hw in r["hardware"]), None)
        if reason is None and r["metric"] == "RDMA_bandwidth":
            reason = "check"
        if reason is not None:
            aside.append((i, reason))
            continue
        rows.append(_row(i, r))
    newest: dict[tuple[str, str, int], str] = {}
    for x in rows:
        key = (x.family, x.call.direction, x.ep)
        newest[key] = max(newest.get(key, ""), _version(x.source))
    rows = [replace(x, superseded=_version(x.source) < newest[x.family, x.call.direction, x.ep])
            for x in rows]
    return rows, aside


def _hybrid_row(line: int, r: dict) -> DeepEPRow:
    """A HybridEP kernel-only row (H100, several nodes): its IB bandwidth counts every
    (token, node) pair, the local node's too (tests/test_hybrid_ep.py,
    ``count_rdma_send_from_routing_map``), over 8 local experts per rank, uniform top-k."""
    op, work = r["strategy_or_op"], r["workload"]
    ep = _int(r"(\d+) ranks", r["size_or_config"], "rank count", line)
    tokens = _int(r"Tokens (\d+)", work, "token count", line)
    hidden = _int(r"hidden (\d+)", work, "hidden size", line)
    topk = _int(r"TopK (\d+)", work, "top-k", line)
    local = _int(r"(\d+) local experts", work, "local experts", line)
    direction = "dispatch" if "dispatch" in op else "combine"
    b = fp8_token_bytes(hidden) if "FP8" in op else bf16_token_bytes(hidden)  # combine: BF16
    routing = deepep_routing(ep, 8, experts=local * ep, topk=topk, grouped=False)
    logical = tokens * (ep // 8) * routing.p_node * b
    value = float(r["value"])
    if r["unit"] != "GB/s":
        raise InputError(f"DeepEP row {line}: unit {r['unit']!r}; expected GB/s")
    call = EPCall("hybrid", direction, tokens, b, routing)
    sms = _int(r"(\d+) SMs", r["size_or_config"], "SM count", line)
    return DeepEPRow(line, r["source"], r["hardware"], "hybrid-ep", call, ep, r["metric"],
                     value, r["unit"], logical / (value * 1e9), logical,
                     config=f"{sms} SMs", precision="FP8" if "FP8" in op else "BF16")


def _row(line: int, r: dict) -> DeepEPRow:
    if "README_Hybrid-EP" in r["source"]:
        return _hybrid_row(line, r)
    op, work = r["strategy_or_op"], r["workload"]
    ep = _int(r"EP (\d+)", r["size_or_config"], "EP size", line)
    tokens = _int(r"(\d+) tokens per batch", work, "token count", line)
    hidden = _int(r"hidden (\d+)", work, "hidden size", line)
    topk = _int(r"top-(\d+) experts", work, "top-k", line)
    direction = "dispatch" if "dispatch" in op else "combine"
    value = float(r["value"])
    if "low-latency" in op:
        nvlink = "NVLink where possible" in r["note"]
        family = "low-latency-nvlink" if nvlink else "low-latency"
        b = ll_fp8_token_bytes(hidden) if direction == "dispatch" else bf16_token_bytes(hidden)
        routing = deepep_routing(ep, 8, topk=topk, grouped=False)
        call = EPCall("low-latency", direction, tokens, b, routing, nvlink)
        if r["metric"] != "latency" or r["unit"] != "us":
            raise InputError(f"DeepEP row {line}: metric {r['metric']!r} in {r['unit']!r}; "
                             "expected latency in us")
        logical = tokens * topk * b
        return DeepEPRow(line, r["source"], r["hardware"], family, call, ep, r["metric"],
                         value, r["unit"], value * 1e-6, logical,
                         precision="FP8" if direction == "dispatch" else "BF16")
    b = fp8_token_bytes(hidden) if "FP8" in op else bf16_token_bytes(hidden)
    internode = "RDMA" in r["metric"]
    routing = deepep_routing(ep, 8, topk=topk, grouped=internode)
    if internode:
        logical = tokens * (ep // 8) * routing.p_node * b
    else:
        logical = ep * tokens * routing.p_rank * b
    if r["unit"] != "GB/s":
        raise InputError(f"DeepEP row {line}: unit {r['unit']!r}; expected GB/s")
    call = EPCall("normal", direction, tokens, b, routing)
    return DeepEPRow(line, r["source"], r["hardware"], "normal", call, ep, r["metric"], value,
                     r["unit"], logical / (value * 1e9), logical,
                     precision="FP8" if "FP8" in op else "BF16")


def with_cost(spec: ClusterSpec, key: str, cost: EPKernelCost) -> ClusterSpec:
    """``spec`` with ``collective.<key>`` (``ep_normal`` / ``ep_ll``) set to ``cost``."""
    return replace(spec, collective=replace(spec.collective, **{key: cost}))


def predict(spec: ClusterSpec, row: DeepEPRow) -> float:
    """The closed-form time in s of ``row``'s call on ``spec`` (its hardware)."""
    return ep_call_time(spec, row.call)


#: the fit's starting point (efficiencies, latency in s) and bounds (log space)
START = EPKernelCost(0.8, 0.8, 10e-6)
_LO = np.log([0.01, 0.01, 1e-8])
_HI = np.log([1.0, 1.0, 1e-3])


def fit_family(spec: ClusterSpec, rows: list[DeepEPRow], key: str,
               start: EPKernelCost = START) -> EPKernelCost:
    """The :class:`EPKernelCost` of ``collective.<key>`` minimising the squared log ratios
    of the model to ``rows``' times (module docstring). Deterministic."""
    if not rows:
        raise InputError(f"no DeepEP rows to fit collective.{key} on")

    def cost_of(x: np.ndarray) -> EPKernelCost:
        e = np.exp(np.clip(x, _LO, _HI))
        return EPKernelCost(float(min(e[0], 1.0)), float(min(e[1], 1.0)), float(e[2]))

    def resid(x: np.ndarray) -> np.ndarray:
        s = with_cost(spec, key, cost_of(x))
        return np.array([np.log(predict(s, r) / r.time_s) for r in rows])

    x0 = np.log([start.nvlink_efficiency, start.rdma_efficiency, start.latency_s])
    res = least_squares(resid, np.clip(x0, _LO, _HI), bounds=(_LO, _HI), method="trf",
                        x_scale=1.0, diff_step=1e-4)
    return cost_of(res.x)


def calibrate(spec: ClusterSpec, rows: list[DeepEPRow]) -> ClusterSpec:
    """``spec`` with the EP kernel costs of ``rows``' families (``ep_normal``, ``ep_ll``,
    ``ep_hybrid``) fitted on their fit rows (EP <= 32); the rows must share one hardware."""
    hardware = {r.hardware for r in rows}
    if len(hardware) != 1:
        raise InputError(f"DeepEP rows of {len(hardware)} kinds of hardware "
                         f"({', '.join(sorted(hardware))}); expected those of one cluster")
    out = spec
    for key in sorted({FAMILIES[r.family][0] for r in rows}):
        fit_rows = [r for r in rows if FAMILIES[r.family][0] == key and r.role == "fit"]
        out = with_cost(out, key, fit_family(spec, fit_rows, key))
    return out


def scored(spec: ClusterSpec, rows: list[DeepEPRow]) -> list[dict]:
    """Every row with the model's time and its error: ``line``, ``source``, ``hardware``,
    ``family``, ``direction``, ``precision`` (FP8 / BF16), ``config``, ``ep``, ``role`` (fit /
    held-out / superseded), ``measured_us``,
    ``model_us``, ``error_pct`` (model / measured - 1, in %), ``metric``, ``value``, ``unit``."""
    out = []
    for r in rows:
        t = predict(spec, r)
        out.append({"line": r.line, "source": r.source, "hardware": r.hardware,
                    "family": r.family, "direction": r.call.direction,
                    "precision": r.precision, "config": r.config, "ep": r.ep,
                    "role": r.role, "measured_us": r.time_s * 1e6, "model_us": t * 1e6,
                    "error_pct": (t / r.time_s - 1) * 100, "metric": r.metric,
                    "value": r.value, "unit": r.unit})
    return out


def medians(results: list[dict], role: str = "held-out") -> dict[tuple[str, str], float]:
    """Median |error| in % of the ``role`` rows per (family, hardware), and over all of
    them under ("all", "all")."""
    groups: dict[tuple[str, str], list[float]] = {}
    for r in results:
        if r["role"] == role:
            groups.setdefault((r["family"], r["hardware"]), []).append(abs(r["error_pct"]))
            groups.setdefault(("all", "all"), []).append(abs(r["error_pct"]))
    return {k: statistics.median(v) for k, v in groups.items()}
