"""Calibrating the MoE step model (:mod:`parosim.evaluate.moe_parallel`) on Megatron-Bridge's
published MoE training throughput (docs/moe.md, "Calibration on Megatron-Bridge throughput").

Rows: ``tests/data/moe_throughput/megatron_bridge.csv`` (the ``tokens_per_s_per_GPU`` rows of
Megatron-Bridge's performance tables, releases 25.09 - 26.08, with their sources). Each row is
parsed into a model preset, a cluster, a layout (TP / PP / CP / VP / EP), GBS / MBS, sequence
and precision; a row parosim cannot express is kept with its reason (:data:`EXCLUDED`).

**Split** (stated, fixed): the expressible rows are numbered in file order inside each model
family; even numbers fit, odd numbers are held out. **Parameters**: per hardware (H100, B200,
B300, GB200, GB300) the GEMM ceiling and the host time per MoE layer and micro-batch; for all
hardware the all-to-all exposure, the attention efficiency and the FP8 GEMM efficiency
(relative to the ceiling); per software release one
throughput factor, the newest release's fixed at 1 (the releases
changed kernels and overlap between tables: GPT-OSS-120B on GB300 went from 20,288 to 33,024
tokens/s/GPU between 26.06 and 26.08 at the same layout). Fitted by least squares on
log(predicted / measured) over the fit rows (scipy). Errors are reported on the held-out rows
per family.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ..errors import InputError
from ..evaluate.moe_parallel import (
    KernelEfficiency,
    MoEParallel,
    moe_step_parts,
    step_from_parts,
)
from ..io.cluster import load_cluster
from ..spec.model import preset

# Megatron-Bridge family name -> parosim preset
FAMILIES = {
    "DeepSeekV3": "deepseek-v3",
    "DeepSeekV3 (w/o MTP)": "deepseek-v3",
    "GPT OSS 120B": "gpt-oss-120b",
    "Qwen3_30B_a3B": "qwen3-30b-a3b",
    "Qwen3_235B_a22B": "qwen3-235b-a22b",
}
# row groups parosim cannot express, with the reason
EXCLUDED = {
    "(tokendrop)": "token-drop runs: the capacity factor is not stated in the row",
    "(w/ MTP)": "the multi-token-prediction module is not modelled",
    "(dropless)": "25.09 table: precision not stated in the row",
    "Kimi_K2": "Kimi-K2: the row's architecture lacks the vocabulary and dense-layer count",
    "Nemotron_3": "Nemotron-3: hybrid Mamba-Transformer layers are not modelled",
    "DeepSeekV4": "DeepSeek-V4 Flash: architecture not stated in the source",
    "NVFP4": "NVFP4 precision: no FP4 peak in the GPU specs",
    "precision not stated": "precision not stated in the row",
}
HARDWARE = {
    "DGX-H100": ("dgx-h100-ib", 8),
    "DGX-B200": ("dgx-b200-ib", 8),
    "DGX-B300": ("dgx-b300-ib", 8),
    "GB200 NVL72": ("gb200-nvl72", 64),
    "GB300 NVL72": ("gb300-nvl72", 64),
}
HW_KEYS = ("H100", "B200", "B300", "GB200", "GB300")
PRECISION = {"BF16": "bf16", "FP8": "fp8", "FP8-CS": "fp8", "FP8-MX": "fp8", "MXFP8": "fp8"}
CLUSTER_DIR = Path(__file__).resolve().parents[2] / "experiments" / "17_moe_throughput" / \
    "clusters"
DATA = Path(__file__).resolve().parents[2] / "tests" / "data" / "moe_throughput" / \
    "megatron_bridge.csv"


@dataclass(frozen=True)
class BridgeRow:
    """One expressible Megatron-Bridge row."""

    index: int            # row number in the file (0-based)
    family: str           # parosim preset
    hardware: str         # H100 / B200 / B300 / GB200 / GB300
    release: str          # NeMo container, e.g. 26.08
    gpus: int
    par: MoEParallel
    global_batch: int
    micro_batch: int
    seq_len: int
    precision: str
    measured: float       # tokens/s/GPU
    label: str
    fit: bool = True      # in the fit half (even number inside its family)


def _hardware(text: str) -> str:
    for key in HARDWARE:
        if key in text:
            return key
    raise InputError(f"hardware {text!r} is not one of {', '.join(HARDWARE)}")


def parse_rows(path: Path | str = DATA) -> tuple[list[BridgeRow], list[tuple[int, str, str]]]:
    """(expressible rows, excluded rows as (index, family, reason))."""
    rows, excluded = [], []
    seen: dict[str, int] = {}
    with open(path, newline="") as f:
        for i, r in enumerate(csv.DictReader(f)):
            fam = r["workload"].split(" pre-training")[0]
            prec_text = re.search(r"precision (.+)$", r["software"]).group(1)
            reason = next((why for key, why in EXCLUDED.items()
                           if key in fam or key == prec_text or key in prec_text), None)
            if reason is None and fam not in FAMILIES:
                reason = f"{fam}: no preset"
            if reason:
                excluded.append((i, fam, reason))
                continue
            lay = re.search(r"TP(\d+) PP(\d+) CP(\d+) VP(\S+) EP(\d+)", r["strategy_or_op"])
            tp, pp, cp, vp, ep = lay.groups()
            vp = 1 if vp in ("n/a", "1") else int(vp)
            size = re.search(r"(\d+) GPUs; GBS (\d+); MBS (\d+)", r["size_or_config"])
            gpus, gbs, mbs = (int(x) for x in size.groups())
            seq = int(re.search(r"seq (\d+)", r["workload"]).group(1))
            hw_key = _hardware(r["hardware"])
            release = re.search(r"\((\d+\.\d+(?:\.\d+)?) NeMo", r["source"]).group(1)
            family = FAMILIES[fam]
            num = seen.get(family, 0)
            seen[family] = num + 1
            rows.append(BridgeRow(
                index=i, family=family, hardware=hw_key.split()[0].replace("DGX-", ""),
                release=release, gpus=gpus,
                par=MoEParallel(tp=int(tp), pp=int(pp), vp=vp, cp=int(cp), ep=int(ep)),
                global_batch=gbs, micro_batch=mbs, seq_len=seq,
                precision=PRECISION[prec_text], measured=float(r["value"]),
                label=f"{fam} {hw_key} {release} {prec_text} {r['strategy_or_op'].split(';')[0]}"
                      f" {gpus} GPUs GBS {gbs} MBS {mbs}",
                fit=num % 2 == 0))
    return rows, excluded


@lru_cache(maxsize=64)
def row_cluster(hardware: str, gpus: int):
    """The cluster of a row: the hardware's preset sized to the row's GPUs (NVL72: one
    NVLink domain of min(GPUs, 64) GPUs per node)."""
    key = next(k for k in HARDWARE if hardware in k.replace("DGX-", "").split())
    name, gpn = HARDWARE[key]
    gpn = min(gpn, gpus)
    path = CLUSTER_DIR / f"{name}.yaml"
    where = str(path) if path.exists() else name
    sets = [f"gpus_per_node={gpn}"]
    if "NVL72" in key:
        sets.append(f"nic.per_node={gpn}")
    return load_cluster(where, nodes=gpus // gpn, sets=sets)


def row_parts(row: BridgeRow):
    """The efficiency-free step parts of ``row`` (cached by the model)."""
    return moe_step_parts(preset(row.family), row_cluster(row.hardware, row.gpus), row.par,
                          row.global_batch, row.micro_batch, row.seq_len, row.precision)


def predict(row: BridgeRow, eff: KernelEfficiency, release_factor: float = 1.0) -> float:
    """Predicted tokens/s/GPU of ``row`` (``release_factor`` scales the throughput)."""
    return step_from_parts(row_parts(row), eff).tokens_per_s_per_gpu * release_factor


@dataclass(frozen=True)
class Fit:
    """Fitted parameters: per hardware a :class:`KernelEfficiency`, per release a factor
    on the throughput (the newest release's is 1)."""

    hardware: dict
    releases: dict

    def predict(self, row: BridgeRow) -> float:
        return predict(row, self.hardware[row.hardware], self.releases.get(row.release, 1.0))


# what is fitted per hardware; the rest is one value for all hardware
PER_HARDWARE = ("gemm_efficiency", "moe_layer_overhead_s")
GLOBAL = ("a2a_exposed", "attention_efficiency", "fp8_gemm_efficiency")
_BOUNDS = {"gemm_efficiency": (0.05, 1.0), "attention_efficiency": (0.05, 1.0),
           "moe_layer_overhead_s": (0.0, 0.05), "a2a_exposed": (0.0, 1.0),
           "hbm_efficiency": (0.05, 1.0), "fp8_gemm_efficiency": (0.3, 1.0)}
_START = {"gemm_efficiency": 0.6, "attention_efficiency": 0.4, "moe_layer_overhead_s": 1e-3,
          "a2a_exposed": 0.5, "hbm_efficiency": 0.5, "fp8_gemm_efficiency": 0.716}


def fit(rows: list[BridgeRow], per_hardware=PER_HARDWARE, global_=GLOBAL,
        releases: bool = True) -> Fit:
    """Least squares on log(predicted / measured) over ``rows`` (the fit half), within the
    parameters' bounds (scipy ``least_squares``, trust-region reflective)."""
    import numpy as np  # deferred: numpy / scipy only for fitting
    from scipy.optimize import least_squares  # deferred: scipy only for fitting

    hws = [h for h in HW_KEYS if any(r.hardware == h for r in rows)]
    rels = sorted({r.release for r in rows}, key=_release_key)
    free = rels[:-1] if releases else []
    names = [(h, f) for h in hws for f in per_hardware] + [(None, f) for f in global_]
    names += [("release", r) for r in free]

    def unpack(x):
        vals = dict(zip(names, x, strict=True))
        hw = {h: KernelEfficiency(**{f: float(vals[(h, f)]) for f in per_hardware},
                                  **{f: float(vals[(None, f)]) for f in global_},
                                  source="fitted on Megatron-Bridge rows (docs/moe.md)")
              for h in hws}
        rel = {r: math.exp(vals[("release", r)]) if r in free else 1.0 for r in rels}
        return Fit(hw, rel)

    def resid(x):
        f = unpack(x)
        return np.array([math.log(f.predict(r) / r.measured) for r in rows])

    lo = [(_BOUNDS[n][0] if h != "release" else -3.0) for h, n in names]
    hi = [(_BOUNDS[n][1] if h != "release" else 3.0) for h, n in names]
    x0 = [(_START[n] if h != "release" else 0.0) for h, n in names]
    res = least_squares(resid, np.array(x0), bounds=(lo, hi), method="trf")
    return unpack(res.x)


def _release_key(r: str) -> tuple:
    return tuple(int(x) for x in r.split("."))


def errors(f: Fit, rows: list[BridgeRow]) -> list[tuple[BridgeRow, float, float]]:
    """(row, predicted, relative error) per row."""
    out = []
    for r in rows:
        p = f.predict(r)
        out.append((r, p, p / r.measured - 1.0))
    return out


def calibrate(path: Path | str = DATA) -> tuple[Fit, list, list]:
    """Fit on the fit half of the rows; (fit, [(row, predicted, error)] of every row,
    excluded rows)."""
    rows, excluded = parse_rows(path)
    f = fit([r for r in rows if r.fit])
    return f, errors(f, rows), excluded


def family_errors(errs: list, held_out: bool = True) -> dict[str, dict]:
    """Per family: rows, median and max |error| (fractions) over the held-out (or fit) rows."""
    out: dict[str, dict] = {}
    for fam in sorted({r.family for r, _, _ in errs}):
        e = sorted(abs(x) for r, _, x in errs if r.family == fam and r.fit != held_out)
        if e:
            mid = len(e) // 2
            med = e[mid] if len(e) % 2 else (e[mid - 1] + e[mid]) / 2
            out[fam] = {"rows": len(e), "median_abs_error": med, "max_abs_error": e[-1]}
    return out
