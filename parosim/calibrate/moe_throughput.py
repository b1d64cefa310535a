"""Calibrating the MoE step model (:mod:`parosim.evaluate.moe_parallel`) on Megatron-Bridge's
published MoE training throughput (docs/moe.md, "Calibration on Megatron-Bridge throughput").

Rows: ``tests/data/moe_throughput/megatron_bridge.csv`` (the ``tokens_per_s_per_GPU`` rows of
Megatron-Bridge's performance tables, releases 25.09 - 26.08, with their sources). Each row is
parsed into a model preset, a cluster, a layout (TP / PP / CP / VP / EP), GBS / MBS, sequence
and precision; a row parosim cannot express is kept with its reason (:data:`EXCLUDED`).

**Split** (stated, fixed): the expressible rows are numbered in file order inside each model
family; even numbers fit, odd numbers are held out. **Parameters**: one of the candidate sets
:data:`VARIANTS` (which :class:`KernelEfficiency` fields are fitted per hardware, which once
for all hardware, and a throughput factor per software release, optionally per release and
platform or hardware, the newest release's fixed at 1: the releases changed kernels and
overlap between tables: GPT-OSS-120B on GB300 went from 20,288 to 33,024 tokens/s/GPU between
26.06 and 26.08 at the same layout). **Selection** (:func:`select_variant`) on the fit rows
only: 5-fold cross-validation inside them, the lowest mean over families of the median
|error| wins. The chosen set is fitted by least squares on log(predicted / measured) over the
fit rows (scipy); errors are reported on the held-out rows per family, once.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ..errors import InputError
from ..evaluate.moe_parallel import (  # noqa: F401  (the fitted constants live there)
    FITTED,
    FITTED_RELEASE,
    GPU_HARDWARE,
    KernelEfficiency,
    MoEParallel,
    fitted_efficiency,
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
# a note in the row naming a known software regression of that run: the run measured a bug
# its publisher says the next container fixes, not the hardware or the layout. Such a row is
# excluded, but keeps its place in its family's fit / held-out alternation, so the split of
# every other row is the one it would be without the exclusion.
REGRESSION_NOTE = "Performance regression"
REGRESSION_REASON = ("the source's footnote reports a known performance regression of this "
                     "run (fixed in the next container)")
HARDWARE = {
    "DGX-H100": ("dgx-h100-ib", 8),
    "DGX-B200": ("dgx-b200-ib", 8),
    "DGX-B300": ("dgx-b300-ib", 8),
    "GB200 NVL72": ("gb200-nvl72", 64),
    "GB300 NVL72": ("gb300-nvl72", 64),
}
HW_KEYS = ("H100", "B200", "B300", "GB200", "GB300")
PRECISION = {"BF16": "bf16", "FP8": "fp8", "FP8-CS": "fp8", "FP8-MX": "fp8", "MXFP8": "fp8"}
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
            if REGRESSION_NOTE in r["note"]:
                # counted in the alternation (see REGRESSION_NOTE), then set aside
                family = FAMILIES[fam]
                seen[family] = seen.get(family, 0) + 1
                excluded.append((i, fam, REGRESSION_REASON))
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
    """The cluster of a row: the hardware's preset (``topologies/``: dgx-h100-ib,
    dgx-b200-ib, dgx-b300-ib, gb200-nvl72, gb300-nvl72) sized to the row's GPUs (NVL72: one
    NVLink domain of min(GPUs, 64) GPUs per node)."""
    key = next(k for k in HARDWARE if hardware in k.replace("DGX-", "").split())
    name, gpn = HARDWARE[key]
    gpn = min(gpn, gpus)
    sets = [f"gpus_per_node={gpn}"]
    if "NVL72" in key:
        sets.append(f"nic.per_node={gpn}")
    return load_cluster(name, nodes=gpus // gpn, sets=sets)


def row_parts(row: BridgeRow):
    """The efficiency-free step parts of ``row`` (cached by the model)."""
    return moe_step_parts(preset(row.family), row_cluster(row.hardware, row.gpus), row.par,
                          row.global_batch, row.micro_batch, row.seq_len, row.precision)


def predict(row: BridgeRow, eff: KernelEfficiency, release_factor: float = 1.0) -> float:
    """Predicted tokens/s/GPU of ``row`` (``release_factor`` scales the throughput)."""
    return step_from_parts(row_parts(row), eff).tokens_per_s_per_gpu * release_factor


PLATFORM = {"H100": "DGX", "B200": "DGX", "B300": "DGX", "GB200": "NVL72", "GB300": "NVL72"}


def release_key(row: BridgeRow, by: str) -> tuple[str, str]:
    """The key of ``row``'s throughput factor: (release, "") with ``by = "release"``,
    (release, DGX / NVL72) with ``"platform"``, (release, hardware) with ``"hardware"``."""
    tag = {"release": "", "platform": PLATFORM[row.hardware], "hardware": row.hardware}[by]
    return row.release, tag


@dataclass(frozen=True)
class Fit:
    """Fitted parameters: per hardware a :class:`KernelEfficiency`, per release (and
    platform or hardware, see :class:`Variant`) a factor on the throughput (the newest
    release's is 1; a key the fit rows did not contain gets 1)."""

    hardware: dict
    releases: dict
    release_by: str = "release"

    def predict(self, row: BridgeRow) -> float:
        return predict(row, self.hardware[row.hardware],
                       self.releases.get(release_key(row, self.release_by), 1.0))


@dataclass(frozen=True)
class Variant:
    """A parameter set: which :class:`KernelEfficiency` fields are fitted per hardware,
    which once for all hardware (the rest keep their defaults), and how the throughput
    factor is keyed (:func:`release_key`)."""

    name: str
    per_hardware: tuple
    global_: tuple
    release_by: str = "release"

    def n_params(self, rows: list[BridgeRow]) -> int:
        hws = {r.hardware for r in rows}
        keys = {release_key(r, self.release_by) for r in rows}
        tags = {t for _, t in keys}
        return len(hws) * len(self.per_hardware) + len(self.global_) + len(keys) - len(tags)


# what is fitted per hardware; the rest is one value for all hardware
PER_HARDWARE = ("gemm_efficiency", "moe_layer_overhead_s")
GLOBAL = ("a2a_exposed", "attention_efficiency", "fp8_gemm_efficiency")
# the candidate parameter sets, fixed before any selection (docs/moe.md); the selection
# (:func:`select_variant`) sees only the fit rows
VARIANTS = (
    Variant("base: per hardware GEMM ceiling and host time; global a2a exposure, attention "
            "and FP8 efficiency; per release factor", PER_HARDWARE, GLOBAL),
    Variant("per hardware GEMM ceiling, attention efficiency and host time; global a2a "
            "exposure and HBM efficiency; per release factor",
            ("gemm_efficiency", "attention_efficiency", "moe_layer_overhead_s"),
            ("a2a_exposed", "hbm_efficiency")),
    Variant("base with a per-hardware HBM efficiency", PER_HARDWARE + ("hbm_efficiency",),
            GLOBAL),
    Variant("base with a per-hardware a2a exposure", PER_HARDWARE + ("a2a_exposed",),
            ("attention_efficiency", "fp8_gemm_efficiency")),
    Variant("base with the FP8 GEMM efficiency fixed at the dense kernel model's value",
            PER_HARDWARE, ("a2a_exposed", "attention_efficiency")),
    Variant("base with a factor per release and platform (DGX, NVL72)", PER_HARDWARE, GLOBAL,
            "platform"),
    Variant("base with a factor per release and hardware", PER_HARDWARE, GLOBAL, "hardware"),
)
CV_FOLDS = 5
_BOUNDS = {"gemm_efficiency": (0.05, 1.0), "attention_efficiency": (0.05, 1.0),
           "moe_layer_overhead_s": (0.0, 0.05), "a2a_exposed": (0.0, 1.0),
           "hbm_efficiency": (0.05, 1.0), "fp8_gemm_efficiency": (0.3, 1.0)}
_START = {"gemm_efficiency": 0.6, "attention_efficiency": 0.4, "moe_layer_overhead_s": 1e-3,
          "a2a_exposed": 0.5, "hbm_efficiency": 0.5, "fp8_gemm_efficiency": 0.716}


class RowBatch:
    """The step parts of ``rows`` as flat numpy arrays, so that a least-squares residual
    is a handful of array operations; :meth:`tokens` equals :func:`step_from_parts`
    (tests/test_moe_bridge.py checks it to 1e-12)."""

    def __init__(self, rows: list[BridgeRow]):
        import numpy as np  # deferred: numpy only for fitting

        parts = [row_parts(r) for r in rows]
        idx, comp, traf, f8 = [], [], [], []
        for i, sp in enumerate(parts):
            for c, m, fp8 in sp.gemm + sp.grouped:
                idx.append(i)
                comp.append(c)
                traf.append(m)
                f8.append(fp8)
        self.n = len(rows)
        self.idx, self.comp = np.array(idx), np.array(comp)
        self.traf, self.f8 = np.array(traf), np.array(f8, dtype=bool)
        self.ko = np.array([parts[i].kernel_overhead_s for i in idx])

        def col(f):
            return np.array([float(f(sp)) for sp in parts])
        self.attention, self.memory = col(lambda s: s.attention_s), col(lambda s: s.memory_s)
        self.a2a, self.tp = col(lambda s: s.a2a_s), col(lambda s: s.tp_s)
        self.layers, self.pp = col(lambda s: s.moe_layers), col(lambda s: s.pp)
        self.vp, self.m = col(lambda s: s.vp), col(lambda s: s.microbatches)
        self.p2p, self.opt = col(lambda s: s.p2p_s), col(lambda s: s.optimizer_bytes)
        self.hbm = col(lambda s: s.hbm_Bps)
        self.tok = col(lambda s: s.tokens_per_step / s.gpus)

    def tokens(self, p: dict):
        """Tokens/s/GPU of every row under per-row parameter arrays ``p`` (the
        :class:`KernelEfficiency` field names)."""
        import numpy as np  # deferred: numpy only for fitting

        ge, he = p["gemm_efficiency"], p["hbm_efficiency"]
        ceil = np.where(self.f8, (ge * p["fp8_gemm_efficiency"])[self.idx], ge[self.idx])
        t = np.maximum(np.maximum(self.comp / ceil, self.traf / he[self.idx]), self.ko)
        gemms = np.bincount(self.idx, weights=t, minlength=self.n)
        work = (gemms + self.attention / p["attention_efficiency"] + self.memory / he
                + self.a2a * p["a2a_exposed"] + self.tp
                + self.layers * p["moe_layer_overhead_s"])
        stage = work / self.pp
        step = (self.m * stage + (self.pp - 1) / self.vp * stage + self.p2p
                + self.opt / (self.hbm * he))
        return self.tok / step


def fit(rows: list[BridgeRow], variant: Variant = VARIANTS[0]) -> Fit:
    """Least squares on log(predicted / measured) over ``rows`` (the fit half), within the
    parameters' bounds (scipy ``least_squares``, trust-region reflective)."""
    import numpy as np  # deferred: numpy / scipy only for fitting
    from scipy.optimize import least_squares  # deferred: scipy only for fitting

    per_hw, glob, by = variant.per_hardware, variant.global_, variant.release_by
    hws = [h for h in HW_KEYS if any(r.hardware == h for r in rows)]
    keys = sorted({release_key(r, by) for r in rows}, key=lambda k: (k[1], _release_key(k[0])))
    newest = {tag: max((k for k in keys if k[1] == tag), key=lambda k: _release_key(k[0]))
              for _, tag in keys}
    free = [k for k in keys if k not in newest.values()]
    names = [(h, f) for h in hws for f in per_hw] + [(None, f) for f in glob]
    names += [("release", k) for k in free]
    batch = RowBatch(rows)
    hw_of = np.array([hws.index(r.hardware) for r in rows])
    rel_of = [free.index(release_key(r, by)) if release_key(r, by) in free else -1
              for r in rows]
    measured = np.array([r.measured for r in rows])
    default = KernelEfficiency()
    fields = ("gemm_efficiency", "attention_efficiency", "a2a_exposed", "hbm_efficiency",
              "moe_layer_overhead_s", "fp8_gemm_efficiency")
    n_hw, n_g = len(hws) * len(per_hw), len(glob)

    def resid(x):
        p = {}
        for f in fields:
            if f in per_hw:
                j = per_hw.index(f)
                p[f] = x[[h * len(per_hw) + j for h in range(len(hws))]][hw_of]
            elif f in glob:
                p[f] = np.full(len(rows), x[n_hw + glob.index(f)])
            else:
                p[f] = np.full(len(rows), getattr(default, f))
        logf = np.array([x[n_hw + n_g + k] if k >= 0 else 0.0 for k in rel_of])
        return np.log(batch.tokens(p) / measured) + logf

    lo = [(_BOUNDS[n][0] if h != "release" else -3.0) for h, n in names]
    hi = [(_BOUNDS[n][1] if h != "release" else 3.0) for h, n in names]
    x0 = [(_START[n] if h != "release" else 0.0) for h, n in names]
    res = least_squares(resid, np.array(x0), bounds=(lo, hi), method="trf")
    vals = dict(zip(names, res.x, strict=True))
    hw = {h: KernelEfficiency(**{f: float(vals[(h, f)]) for f in per_hw},
                              **{f: float(vals[(None, f)]) for f in glob},
                              source="fitted on Megatron-Bridge rows (docs/moe.md)")
          for h in hws}
    rel = {k: math.exp(vals[("release", k)]) if k in free else 1.0 for k in keys}
    return Fit(hw, rel, by)


def _release_key(r: str) -> tuple:
    return tuple(int(x) for x in r.split("."))


def cv_folds(rows: list[BridgeRow], k: int = CV_FOLDS) -> list[int]:
    """The fold of each of ``rows`` (fit rows only): its number among its family's rows,
    modulo ``k`` (file order, fixed)."""
    seen: dict[str, int] = {}
    out = []
    for r in rows:
        out.append(seen.get(r.family, 0) % k)
        seen[r.family] = seen.get(r.family, 0) + 1
    return out


def cross_validate(rows: list[BridgeRow], variant: Variant, k: int = CV_FOLDS) -> dict:
    """k-fold cross-validation inside the fit rows: each fold predicted by a fit on the
    other folds; per family the median |error| of those predictions, and their mean over
    families (``"score"``, the selection criterion)."""
    folds = cv_folds(rows, k)
    errs = []
    for j in range(k):
        train = [r for r, g in zip(rows, folds, strict=True) if g != j]
        test = [r for r, g in zip(rows, folds, strict=True) if g == j]
        f = fit(train, variant)
        errs += [(r, 0.0, f.predict(r) / r.measured - 1.0) for r in test]
    fam = {f: v["median_abs_error"] for f, v in family_errors(errs, held_out=False).items()}
    return {"families": fam, "score": sum(fam.values()) / len(fam),
            "params": variant.n_params(rows)}


def select_variant(rows: list[BridgeRow], variants=VARIANTS) -> tuple[Variant, list[dict]]:
    """The variant with the lowest cross-validated score on ``rows`` (the fit rows only);
    a tie goes to the one with fewer parameters. Returns (chosen, every variant's scores,
    the chosen one's marked ``"chosen": True``)."""
    table = [{"variant": v, **cross_validate(rows, v)} for v in variants]
    best = min(table, key=lambda t: (round(t["score"], 6), t["params"]))
    for t in table:
        t["chosen"] = t is best
    return best["variant"], table


def errors(f: Fit, rows: list[BridgeRow]) -> list[tuple[BridgeRow, float, float]]:
    """(row, predicted, relative error) per row."""
    out = []
    for r in rows:
        p = f.predict(r)
        out.append((r, p, p / r.measured - 1.0))
    return out


def calibrate(path: Path | str = DATA, variant: Variant | None = None):
    """Choose the variant by cross-validation inside the fit rows (:func:`select_variant`;
    ``variant`` skips the choice), fit it on all fit rows and predict every row:
    (fit, [(row, predicted, error)] of every row, excluded rows, the selection table or
    None)."""
    rows, excluded = parse_rows(path)
    train = [r for r in rows if r.fit]
    table = None
    if variant is None:
        variant, table = select_variant(train)
    f = fit(train, variant)
    return f, errors(f, rows), excluded, table


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
