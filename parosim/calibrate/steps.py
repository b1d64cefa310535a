"""``parosim calibrate --steps runs.csv``: fit compute efficiency to measured step times.

The CSV holds one measured training step per row (``#`` lines are comments). Columns:

==================  ========  ==============================================================
column              required  meaning
==================  ========  ==============================================================
``model``           yes       preset name (``llama-7b``, ``mpt-7b``, ...) or model YAML path
``strategy``        yes       PaRO name or alias (``GGG``, ``zero3``, ``fsdp``, ``ddp``)
``nodes``           yes       nodes of the run (the base cluster's node count is replaced)
``micro_batch``     yes       sequences per GPU per micro-step
``accum``           yes       accumulation micro-steps per step
``seq_len``         yes       tokens per sequence
``step_time_s``     yes       measured seconds per global step (optimizer step included)
``trainable_ratio`` no        full | partial | peft | a number (default full)
``recompute``       no        on | off | auto (default auto)
``attention``       no        eager | flash (default flash)
``algo``            no        collective algorithm (default ring, i.e. NCCL's ring)
``group_nodes``     no        PaRO group size in nodes (default 1)
``runtime``         no        ideal | deepspeed | fsdp | paro | a runtime YAML (default ideal)
``tp``              no        tensor-parallel degree (default 1; Megatron TP, :mod:`.plan3d`)
``pp``              no        pipeline-parallel stages (default 1)
``virtual``         no        model chunks per stage, interleaved 1F1B when > 1 (default 1)
``cp``              no        context-parallel degree (default 1; Megatron-Core
                              context_parallel_size, ring attention, docs/parallelism.md)
``sequence_parallel`` no      on | off (default off; needs tp > 1)
``tp_comm_overlap`` no        on | off (default off; needs sequence_parallel on: Megatron-Core
                              / TE TP communication overlap, docs/parallelism.md)
``dp_comm_overlap`` no        on | off (default off; needs tp or pp > 1 and strategy NNN, NNI
                              or NNG: Megatron-Core overlap_grad_reduce +
                              overlap_param_gather, docs/parallelism.md)
``precision``       no        bf16 | fp8 (default bf16; fp8: Transformer Engine FP8 GEMMs,
                              docs/compute.md "FP8 training"; needs a GPU with FP8)
==================  ========  ==============================================================

With ``tp`` or ``pp`` above 1 (or ``recompute = selective``: Megatron's attention-only
recomputation) the row is simulated as a TP x PP x DP step (the 3D path of ``parosim
simulate --tp/--pp``: the strategy shards over the data-parallel group, memory is not
enforced; a ``runtime`` other than ``ideal`` as ``simulate --tp --runtime`` takes it: its
boundary buckets and, for ``internlm``, the hybrid-ZeRO schedule with TP, pp = 1).

What is fitted: the kernel compute model (:mod:`parosim.cost.kernels`) of the base cluster, scaled
by one factor ``k`` applied to ``gemm_ceiling``, ``attention_efficiency``,
``eager_attention_efficiency`` and ``hbm_efficiency`` (each capped at 1), with
:func:`scipy.optimize.least_squares` on log(simulated / measured step time). One factor,
because a handful of measured steps cannot identify more. With three or more fitted rows the
overlap interference factor (the cluster YAML's ``compute.overlap_slowdown``: compute runs 1/f
as fast while a collective runs beside it, :mod:`parosim.spec.runtime`) is fitted too, in [1, 3]; it
is reported as identified only if some fitted step overlaps compute with communication (else it
stays at its starting value, the base cluster's or 1). Communication is simulated with the base
cluster's network as given (fit that first with ``--nccl-tests``).

Each fitted parameter is reported with its one-standard-error range, s^2 (J^T J)^-1 from the
fit's Jacobian in log space (:func:`parosim.calibrate.scale.standard_errors`), and warned
about when the range reaches beyond x2 either side of the value (poorly identified).

``--holdout every-other`` keeps rows 2, 4, ... out of the fit and reports the error on them.
The written YAML is the base cluster with ``compute: {model: kernel, ...}`` replaced and a
comment with the fit and held-out errors.
"""

from __future__ import annotations

import argparse
import csv
import math
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import InputError
from .scale import fit_warnings, se_range_text, se_warnings, split_scale, standard_errors

REQUIRED = ("model", "strategy", "nodes", "micro_batch", "accum", "seq_len", "step_time_s")
OPTIONAL = ("trainable_ratio", "recompute", "attention", "algo", "group_nodes", "runtime",
            "tp", "pp", "virtual", "sequence_parallel", "tp_comm_overlap", "precision",
            "dp_comm_overlap", "cp")
HOLDOUTS = ("none", "every-other", "scale:N")


@dataclass(frozen=True)
class StepRun:
    """One measured step (a parsed CSV row); ``line`` is its line in the file."""

    line: int
    model: str
    strategy: str
    nodes: int
    micro_batch: int
    accum: int
    seq_len: int
    step_time_s: float
    trainable_ratio: str = "full"
    recompute: str = "auto"
    attention: str = "flash"
    algo: str = "ring"
    group_nodes: int = 1
    runtime: str = "ideal"
    tp: int = 1
    pp: int = 1
    virtual: int = 1
    sequence_parallel: bool = False
    tp_comm_overlap: bool = False
    precision: str = "bf16"
    dp_comm_overlap: bool = False
    cp: int = 1

    @property
    def is_3d(self) -> bool:
        return (self.tp > 1 or self.pp > 1 or self.recompute == "selective"
                or self.dp_comm_overlap or self.cp > 1)


MIN_STEP_S, MAX_STEP_S = 1e-6, 1e9   # a measured step: above 1 us, below ~32 years


def _int(text: str, col: str, where: str) -> int:
    try:
        v = int(str(text).strip())
    except ValueError:
        raise InputError(f"{where}: {col} = {text!r} must be a positive integer") from None
    if v < 1:
        raise InputError(f"{where}: {col} = {text!r} must be a positive integer")
    return v


def read_steps(path: str | Path) -> list[StepRun]:
    """Parse a steps CSV (columns in the module docstring); errors name the line and column."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise InputError(f"--steps {str(path)!r} cannot be read: {e.strerror}") from None
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise InputError(f"--steps {str(path)!r} is empty; expected a CSV with columns "
                         f"{', '.join(REQUIRED)}")
    reader = csv.DictReader(lines)
    cols = [c.strip() for c in (reader.fieldnames or [])]
    missing = [c for c in REQUIRED if c not in cols]
    if missing:
        raise InputError(f"--steps {str(path)!r}: missing column(s) {', '.join(missing)}; "
                         f"expected {', '.join(REQUIRED)} (optional: {', '.join(OPTIONAL)})")
    dup = sorted({c for c in cols if cols.count(c) > 1})
    if dup:
        raise InputError(f"--steps {str(path)!r}: column(s) {', '.join(dup)} appear twice in "
                         "the header; expected each column once")
    unknown = [c for c in cols if c not in REQUIRED + OPTIONAL]
    if unknown:
        raise InputError(f"--steps {str(path)!r}: unknown column(s) {', '.join(unknown)}; "
                         f"expected {', '.join(REQUIRED + OPTIONAL)}")
    runs = []
    for i, raw in enumerate(reader, start=2):
        where = f"--steps {p.name} line {i}"
        cells = len(cols) + len(raw.get(None) or ()) - sum(v is None for v in raw.values())
        if None in raw or any(v is None for v in raw.values()):
            raise InputError(f"{where} has {cells} cells and the header {len(cols)} columns; "
                             "expected one cell per column")
        row = {k.strip(): (v or "").strip() for k, v in raw.items() if k}
        try:
            t = float(row["step_time_s"])
        except ValueError:
            t = float("nan")
        if not (math.isfinite(t) and MIN_STEP_S <= t <= MAX_STEP_S):
            raise InputError(f"{where}: step_time_s = {row['step_time_s']!r} must be a "
                             f"number of seconds in [{MIN_STEP_S:g}, {MAX_STEP_S:g}] (a "
                             "measured training step)")
        kw = {c: row[c] for c in ("trainable_ratio", "recompute", "attention", "algo",
                                  "runtime", "precision") if row.get(c)}
        for c in ("group_nodes", "tp", "pp", "virtual", "cp"):
            if row.get(c):
                kw[c] = _int(row[c], c, where)
        for c in ("sequence_parallel", "tp_comm_overlap", "dp_comm_overlap"):
            if row.get(c):
                v = row[c].lower()
                if v not in ("on", "off"):
                    raise InputError(f"{where}: {c} = {row[c]!r}; expected on or off")
                kw[c] = v == "on"
        if kw.get("recompute", "auto") not in ("on", "off", "auto", "selective"):
            raise InputError(f"{where}: recompute = {kw['recompute']!r}; expected on, off, "
                             "auto or selective")
        runs.append(StepRun(i, row["model"], row["strategy"],
                            _int(row["nodes"], "nodes", where),
                            _int(row["micro_batch"], "micro_batch", where),
                            _int(row["accum"], "accum", where),
                            _int(row["seq_len"], "seq_len", where), t, **kw))
    if not runs:
        raise InputError(f"--steps {str(path)!r} has a header but no rows")
    return runs


def _scaled(profile, k: float):
    from ..cost.kernels import ComputeProfile  # noqa: F401  (type of profile)

    return replace(profile, model="kernel", gemm_ceiling=min(1.0, profile.gemm_ceiling * k),
                   attention_efficiency=min(1.0, profile.attention_efficiency * k),
                   hbm_efficiency=min(1.0, profile.hbm_efficiency * k),
                   eager_attention_efficiency=min(1.0, profile.eager_attention_efficiency * k))


def _setup(run: StepRun, base):
    # deferred: 'parosim calibrate' parses with this module; the simulator loads to fit
    from ..io.model import load_model
    from ..spec.training import TrainingSpec, parse_trainable_ratio

    where = f"--steps line {run.line}"
    try:
        cluster = replace(base, nodes=run.nodes, group_nodes=run.group_nodes)
        training = TrainingSpec(
            micro_batch=run.micro_batch, accum_steps=run.accum, seq_len=run.seq_len,
            trainable_ratio=parse_trainable_ratio(run.trainable_ratio),
            recompute={"on": True, "off": False, "auto": None, "selective": False}[
                run.recompute],
            compute_model="kernel", attention=run.attention, memory_model="runtime",
            precision=run.precision)
        model = load_model(run.model)
        if training.precision == "fp8":   # a GPU without FP8: refused, naming the line
            from ..cost.compute import fp8_peak_flops  # deferred: the simulator loads to fit

            fp8_peak_flops(cluster, training)
    except InputError as e:
        raise InputError(f"{where}: {e}") from None
    return model, cluster, training


def simulate_run(run: StepRun, base, profile, mode: str = "analytic",
                 overlap: float | None = None) -> float:
    """Simulated seconds of ``run`` on ``base`` with compute ``profile`` and overlap factor
    ``overlap`` (None: the cluster's, else the runtime's). Memory is not enforced: the run
    was measured, so it fitted."""
    # deferred: 'parosim calibrate' parses with this module; the simulator loads to fit
    from ..collectives import Algo, parse_enum
    from ..evaluate.analytic import evaluate
    from ..evaluate.replay import replay
    from ..plan.dataparallel import build_plan
    from ..simulate.step import resolve_runtime
    from ..spec.runtime import effective_overlap_slowdown
    from ..spec.strategy import parse_strategy

    model, cluster, training = _setup(run, base)
    cluster = replace(cluster, compute=profile)
    if run.is_3d:
        return _simulate_3d(run, model, cluster, training, mode, overlap)
    try:
        strategy = parse_strategy(run.strategy)
        algo = parse_enum(Algo, run.algo, "algo")
        rt = resolve_runtime(run.runtime)
        rt.require(strategy.short)
    except InputError as e:
        raise InputError(f"--steps line {run.line}: {e}") from None
    if rt.collective_algo is not None:
        algo = Algo.RING
    slow = effective_overlap_slowdown(
        None, overlap if overlap is not None else getattr(cluster, "overlap_slowdown", None), rt)
    if mode == "engine":
        plan = build_plan(model, strategy, cluster, training, rt)
        return replay(plan, cluster, algo, slow).step_time_s
    plan = build_plan(model, strategy, cluster, replace(training, accum_steps=1), rt)
    return evaluate(plan, cluster, algo, training.accum_steps, slow).step_time_s


def _simulate_3d(run: StepRun, model, cluster, training, mode: str,
                 overlap: float | None) -> float:
    """A TP x PP x DP row: the 3D path of ``simulate_step`` (memory not enforced)."""
    # deferred: 'parosim calibrate' parses with this module; the simulator loads to fit
    from ..plan.layout import ParallelSpec
    from ..simulate.step import simulate_step

    where = f"--steps line {run.line}"
    if overlap is not None and overlap != 1.0:
        cluster = replace(cluster, overlap_slowdown=overlap)
    try:
        par = ParallelSpec(tp=run.tp, pp=run.pp, sequence_parallel=run.sequence_parallel,
                           tp_comm_overlap=run.tp_comm_overlap,
                           dp_comm_overlap=run.dp_comm_overlap,
                           selective_recompute=run.recompute == "selective",
                           schedule="interleaved" if run.virtual > 1 else "1f1b",
                           virtual=run.virtual, cp=run.cp)
        t = replace(training, memory_model=None,
                    recompute={"on": True, "off": False, "selective": False}.get(
                        run.recompute))
        r = simulate_step(model, cluster, run.strategy, t, run.algo, mode, parallel=par,
                          runtime=run.runtime)
    except InputError as e:
        raise InputError(f"{where}: {e}") from None
    return r.step_time_s


def _stats(errs: list[float]) -> dict:
    if not errs:
        return {"n": 0, "median_abs_error_pct": None, "max_abs_error_pct": None}
    a = sorted(abs(e) * 100 for e in errs)
    mid = len(a) // 2
    med = a[mid] if len(a) % 2 else (a[mid - 1] + a[mid]) / 2
    return {"n": len(a), "median_abs_error_pct": med, "max_abs_error_pct": a[-1]}


def fit_steps(runs: list[StepRun], base, holdout: str = "none", mode: str = "analytic",
              params: list[str] | None = None) -> dict:
    """Fit the scale factor (and the overlap factor, and ``params``: cluster YAML fields
    such as ``collective.chain_chunk`` or ``nic.bandwidth``, searched in log space within
    their physical bounds); rows with ``what`` fit | held-out, simulated vs measured."""
    # deferred: 'parosim calibrate' parses with this module; the simulator loads to fit
    import numpy as np
    from scipy.optimize import least_squares

    from .links import make_param  # deferred: numpy and the collectives load to fit

    if holdout.startswith("scale:"):
        fit_runs, held = split_scale(runs, holdout, lambda r: r.nodes)
    elif holdout not in HOLDOUTS:
        raise InputError(f"--holdout {holdout!r} is not known for --steps; expected one of "
                         f"{', '.join(HOLDOUTS)}")
    else:
        held = runs[1::2] if holdout == "every-other" else []
        fit_runs = runs[0::2] if holdout == "every-other" else runs
    if not fit_runs:
        raise InputError("--steps: no row left to fit; give more rows or --holdout none")
    cps = [make_param(n) for n in (params or [])]
    profile0 = replace(base.compute, model="kernel")
    fit_overlap = len(fit_runs) >= 3
    f0 = float(getattr(base, "overlap_slowdown", None) or 1.0)
    x0, lo, hi = [1.0], [0.05], [5.0]
    if fit_overlap:
        x0, lo, hi = x0 + [f0], lo + [1.0], hi + [3.0]
    for p in cps:
        v = p.get(base)
        v = v if v > 0 else math.sqrt(p.lo * p.hi)    # off in the base: start mid-range
        x0.append(math.log(min(max(v, p.lo), p.hi)))
        lo.append(math.log(p.lo))
        hi.append(math.log(p.hi))
    n0 = 2 if fit_overlap else 1

    def cluster(x):
        c = base
        for p, v in zip(cps, x[n0:], strict=True):
            c = p.set(c, math.exp(float(v)))
        return c

    def resid(x):
        prof = _scaled(profile0, float(x[0]))
        f = float(x[1]) if fit_overlap else None
        c = cluster(x)
        return np.array([math.log(simulate_run(r, c, prof, mode, f) / r.step_time_s)
                         for r in fit_runs])

    res = least_squares(resid, x0, bounds=(lo, hi), diff_step=1e-3)
    identified = fit_overlap and bool(np.any(np.abs(res.jac[:, 1]) > 1e-9))
    ident_p = {p.name: bool(np.any(np.abs(res.jac[:, n0 + i]) > 1e-9))
               for i, p in enumerate(cps)}
    k = float(res.x[0])
    overlap = float(res.x[1]) if fit_overlap and identified else None
    fitted_base = cluster(res.x)
    values = {p.name: p.get(fitted_base) for p in cps}
    base = fitted_base
    prof = _scaled(profile0, k)
    rows = []
    for what, group in (("fit", fit_runs), ("held-out", held)):
        for r in group:
            sim = simulate_run(r, base, prof, mode, overlap)
            rows.append({"what": what, "line": r.line, "model": r.model,
                         "strategy": r.strategy, "nodes": r.nodes, "measured_s": r.step_time_s,
                         "simulated_s": sim, "error_pct": (sim / r.step_time_s - 1) * 100})
    fit_s = _stats([x["error_pct"] / 100 for x in rows if x["what"] == "fit"])
    ident = {"compute.scale": True, **({"compute.overlap_slowdown": identified}
                                       if fit_overlap else {}), **ident_p}
    warn = fit_warnings(fit_s["max_abs_error_pct"], ident, {r.nodes for r in fit_runs})
    se = standard_errors(res.jac, res.fun, {"compute.scale": k, **(
        {"compute.overlap_slowdown": float(res.x[1])} if fit_overlap else {}), **values},
        [True] * n0 + [False] * len(cps))
    warn += se_warnings(se, ident)
    return {"scale": k, "profile": prof, "overlap_slowdown": overlap, "warnings": warn,
            "cluster": fitted_base, "cluster_params": values, "cluster_identified": ident_p,
            "dof": se["dof"], "standard_errors": se["params"],
            "overlap_fitted": fit_overlap, "overlap_identified": identified,
            "fit": _stats([x["error_pct"] / 100 for x in rows if x["what"] == "fit"]),
            "held_out": _stats([x["error_pct"] / 100 for x in rows
                                if x["what"] == "held-out"]),
            "rows": rows}


def add_steps_argument(group) -> None:
    """Register ``--steps`` in the calibrate subcommand's mode group (or a parser)."""
    group.add_argument("--steps", default=None, metavar="CSV",
                       help="measured step times (columns: model, strategy, nodes, "
                            "micro_batch, accum, seq_len, step_time_s; see docs/compute.md); "
                            "fits the kernel compute model's efficiency")


def run_steps(a: argparse.Namespace) -> dict:
    """The ``--steps`` mode of ``parosim calibrate``: fit, write the YAML, return the result."""
    # deferred: 'parosim calibrate' parses with this module; the simulator loads to fit
    from ..io import cluster_to_yaml, load_cluster

    base = load_cluster(a.cluster, sets=getattr(a, "set", None) or ())
    runs = read_steps(a.steps)
    holdout = getattr(a, "holdout", "none") or "none"
    mode = getattr(a, "mode", None) or "analytic"
    raw = getattr(a, "params", None)
    params = [x.strip() for x in raw.split(",") if x.strip()] if raw else None
    f = fit_steps(runs, base, holdout, mode, params)
    base = f["cluster"]   # the base cluster with the fitted --params (if any)
    name = getattr(a, "name", None) or f"{base.name}-calibrated"
    prof = replace(f["profile"], source=(
        f"fitted by parosim calibrate --steps {Path(a.steps).name}: scale {f['scale']:.4f} "
        f"on the base cluster's kernel parameters"))
    fitted_nodes = tuple(sorted({r["nodes"] for r in f["rows"] if r["what"] == "fit"}))
    spec = replace(base, name=name, compute=prof, calibrated_nodes=fitted_nodes)
    if f["overlap_slowdown"] is not None:
        spec = replace(spec, overlap_slowdown=f["overlap_slowdown"])
    ov = (f"overlap_slowdown {f['overlap_slowdown']:.4f} (fitted)"
          if f["overlap_slowdown"] is not None else
          "overlap_slowdown not fitted (" + ("no fitted step overlaps compute with "
                                             "communication" if f["overlap_fitted"] else
                                             "fewer than 3 fitted steps") + ")")

    def pct(s):
        return "-" if s["median_abs_error_pct"] is None else f"{s['median_abs_error_pct']:.1f}"
    head = (f"# Calibrated from measured step times ({Path(a.steps).name}, {len(runs)} rows) "
            f"by parosim calibrate --steps.\n# compute: kernel model scaled by "
            f"{f['scale']:.4f}; fit |error| median {pct(f['fit'])} % over {f['fit']['n']} "
            f"steps; held-out ({holdout}) median {pct(f['held_out'])} % over "
            f"{f['held_out']['n']} steps.\n# {ov}.\n")
    # the algorithm of the rows whose runtime leaves it to --algo (a framework profile fixes
    # its own, and simulate refuses --algo beside it)
    from ..simulate.step import resolve_runtime  # deferred: the simulator loads to fit

    algos = sorted({r.algo for r in runs if r.is_3d
                    or resolve_runtime(r.runtime).collective_algo is None})
    if algos:
        head += (f"# the rows ran collective algorithm {', '.join(algos)} (their algo column, "
                 f"default ring); predict with the same --algo: simulate's default is nccl "
                 f"(NCCL's tuner)\n")
    for k, v in f["cluster_params"].items():
        head += (f"# {k} = {v:.6g} ({'fitted' if f['cluster_identified'][k] else 'not identified'}"
                 " from these step times)\n")
    for k, p in f["standard_errors"].items():
        head += f"# {k} = {se_range_text(k, p)}; dof {f['dof']}\n"
    out = Path(a.output)
    try:
        if not out.parent.exists():
            out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(head + cluster_to_yaml(spec))
    except OSError as e:
        raise InputError(f"-o {a.output!r} cannot be written: {e.strerror}") from None
    c = spec.compute
    return {"mode": "steps", "output": str(out), "cluster": name, "base": base.name,
            "holdout": holdout, "scale": f["scale"], "algos": algos,
            "overlap_slowdown": f["overlap_slowdown"],
            "params": {"gemm_ceiling": c.gemm_ceiling,
                       "attention_efficiency": c.attention_efficiency,
                       "hbm_efficiency": c.hbm_efficiency},
            "fit": f["fit"], "held_out": f["held_out"], "rows": f["rows"],
            "warnings": f["warnings"], "cluster_params": f["cluster_params"],
            "cluster_identified": f["cluster_identified"], "dof": f["dof"],
            "standard_errors": f["standard_errors"]}


def print_steps(res: dict) -> None:
    """Human-readable result of :func:`run_steps`."""
    print(f"calibrated {res['cluster']} from {res['base']}: compute scale {res['scale']:.4f} "
          f"-> " + ", ".join(f"{k} {v:.3f}" for k, v in res["params"].items()))
    o = res.get("overlap_slowdown")
    print(f"  overlap_slowdown: {o:.4f} (fitted)" if o is not None else
          "  overlap_slowdown: not fitted (needs >= 3 fitted steps that overlap compute and "
          "communication)")
    for k, v in res.get("cluster_params", {}).items():
        how = "fitted" if res["cluster_identified"][k] else "not identified"
        print(f"  {k}: {v:.6g} ({how})")
    if res.get("standard_errors"):
        print(f"  one standard error (s^2 (J^T J)^-1 in log space, dof {res['dof']}):")
        for k, p in res["standard_errors"].items():
            print(f"    {k}: {se_range_text(k, p)}")
    if res.get("algos"):
        print(f"  the rows ran collective algorithm {', '.join(res['algos'])}: predict with the "
              "same --algo (simulate's default is nccl, NCCL's tuner)")
    for what, s in (("fit", res["fit"]), ("held-out", res["held_out"])):
        if s["n"]:
            print(f"  {what}: median |error| {s['median_abs_error_pct']:.1f} %, worst "
                  f"{s['max_abs_error_pct']:.1f} % over {s['n']} steps")
    print(f"  {'what':<9}{'line':>5}  {'model':<14}{'strategy':<10}{'nodes':>6}"
          f"{'measured s':>12}{'simulated s':>13}{'error':>9}")
    for r in res["rows"]:
        print(f"  {r['what']:<9}{r['line']:>5}  {r['model']:<14}{r['strategy']:<10}"
              f"{r['nodes']:>6}{r['measured_s']:>12.4f}{r['simulated_s']:>13.4f}"
              f"{r['error_pct']:>+8.1f}%")
    for w in res.get("warnings", []):
        print(f"  warning: {w}")
    print(f"  wrote {res['output']}")
