"""One training step of one configuration, end to end: plan -> engine (or analytic) -> metrics.

This is the API the CLI, the sweeps and the notebooks call.

Metrics (per global step; seconds, bytes, FLOP/s)
    ``step_time_s``; ``tokens_per_s`` (global) and ``tokens_per_s_per_gpu``; ``samples_per_s``
    (sequences); ``tflops_per_gpu``: hardware FLOP/s per GPU in TFLOP/s, recomputation
    included (as Megatron-LM reports it); ``mfu``: model FLOPs (6Ψ·tokens + attention, no
    recomputation) / (step time x peak), as PaLM defines it; ``exposed_comm_s``: step time
    during which the compute stream is idle; ``bytes_intra`` / ``bytes_inter``: bytes one GPU
    sends per step over NVLink (intra-node hops) and to its NIC (inter-node hops), averaged
    over GPUs.

A configuration that does not fit in GPU memory is reported with ``fits: false`` and the
memory breakdown; it is not simulated and its time metrics are ``None``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

from ..collectives.lowering import lower
from ..collectives.types import Algo, RingSet, parse_enum
from ..cost.compute import compute_seconds  # noqa: F401  (re-exported for notebooks)
from ..cost.memory import MemoryBreakdown, memory_breakdown
from ..errors import InputError
from ..evaluate.analytic import evaluate
from ..evaluate.replay import replay
from ..fabric.engine import MAX_ENGINE_OPS
from ..fabric.network import MAX_SIM_SECONDS, horizon_error
from ..io import load_cluster
from ..io.runtime import as_runtime, training_for_runtime
from ..plan.dataparallel import CollectiveOp, ComputeOp, Plan, build_plan
from ..plan.layout import PairSet, layout_for
from ..spec.model import ModelSpec
from ..spec.runtime import effective_overlap_slowdown
from ..spec.strategy import ALL_STRATEGIES, Level, Strategy, parse_strategy
from ..spec.system import ClusterSpec
from ..spec.training import (
    TrainingSpec,
)
from ..units import parse_bandwidth, parse_size

MODES = ("engine", "analytic")

# The engine replays every operation of the step (docs/limits.md): at most MAX_ENGINE_OPS
# (parosim.fabric.engine), counted from a one-micro-step plan before the full plan is built;
# ~2 s and ~100 MB per 100,000 ops. The analytic mode evaluates one micro-step: no such limit.


def check_engine_size(model: ModelSpec, strategy: Strategy, cluster: ClusterSpec,
                      training: TrainingSpec, rt=None) -> None:
    """Refuse, before building it, an engine plan of more than :data:`MAX_ENGINE_OPS` ops."""
    one = build_plan(model, strategy, cluster, replace(training, accum_steps=1), rt)
    micro = sum(1 for o in one.ops if o.micro_step is not None)
    total = len(one.ops) - micro + micro * training.accum_steps
    if total > MAX_ENGINE_OPS:
        most = max(1, (MAX_ENGINE_OPS - (len(one.ops) - micro)) // max(1, micro))
        raise InputError(f"--accum {training.accum_steps} makes an engine step of {total} "
                         f"operations, more than the engine's limit of {MAX_ENGINE_OPS}; "
                         f"expected --accum <= {most} or --mode analytic (which evaluates one "
                         "micro-step and scales it)")


@dataclass
class StepResult:
    """Result of one configuration. Time metrics are None when it does not fit."""

    strategy: Strategy
    algo: Algo
    mode: str
    gpus: int
    memory: MemoryBreakdown
    step_time_s: float | None = None
    tokens_per_s: float | None = None
    tokens_per_s_per_gpu: float | None = None
    samples_per_s: float | None = None
    tflops_per_gpu: float | None = None
    mfu: float | None = None
    exposed_comm_s: float | None = None
    compute_s: float | None = None
    bytes_intra: float | None = None
    bytes_inter: float | None = None
    events: int = 0
    records: list = field(default_factory=list)
    runtime: str = "ideal"
    framework_stage: str = ""
    overlap_slowdown: float = 1.0
    algo_label: str = ""          # a runtime's per-call rule, e.g. "paro-cc"
    # heterogeneity / jitter outputs (docs/heterogeneity.md), merged into to_dict
    extra: dict = field(default_factory=dict)

    @property
    def fits(self) -> bool:
        return self.memory.fits

    def to_dict(self) -> dict:
        mem = self.memory
        return {
            "strategy": self.strategy.name, "algo": self.algo_label or self.algo.value,
            "mode": self.mode,
            "gpus": self.gpus, "fits": mem.fits,
            "step_time_s": self.step_time_s, "tokens_per_s": self.tokens_per_s,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "samples_per_s": self.samples_per_s, "tflops_per_gpu": self.tflops_per_gpu,
            "mfu": self.mfu, "exposed_comm_s": self.exposed_comm_s,
            "compute_s": self.compute_s, "bytes_intra": self.bytes_intra,
            "bytes_inter": self.bytes_inter, "events": self.events,
            "memory": memory_dict(self.strategy, self.gpus, mem),
            "runtime": self.runtime, "framework_stage": self.framework_stage,
            "label": (f"{self.strategy.short} ({self.framework_stage})"
                      if self.framework_stage else self.strategy.short),
            "overlap_slowdown": self.overlap_slowdown,
            **self.extra,
            **getattr(self, "parallel", {}),   # tp, pp, dp, bubble_fraction (3D only)
        }


def memory_dict(strategy: Strategy, gpus: int, mem: MemoryBreakdown) -> dict:
    """The ``memory`` JSON object (the stable JSON contract plus the detail terms)."""
    return {"strategy": strategy.name, "gpus": gpus,
            "model_states_bytes": mem.model_states_bytes,
            "activations_bytes": mem.activations_bytes, "buffers_bytes": mem.buffers_bytes,
            "margin_bytes": mem.margin_bytes, "total_bytes": mem.total_bytes,
            "capacity_bytes": mem.capacity_bytes, "fits": mem.fits,
            "shortfall_bytes": mem.shortfall_bytes, "params_bytes": mem.params_bytes,
            "grads_bytes": mem.grads_bytes, "optimizer_bytes": mem.optimizer_bytes,
            "recompute": mem.recompute, "memory_model": mem.memory_model,
            "attention": mem.attention, "logit_bytes": mem.logit_bytes}


@lru_cache(maxsize=256)
def cross_node_fraction(ringset: RingSet, gpus_per_node: int) -> float:
    """Share of a ring set's hops that leave their node (cached: O(n) to compute)."""
    hops = list(ringset.hops())
    if not hops:
        return 0.0
    return sum(1 for a, b in hops if a // gpus_per_node != b // gpus_per_node) / len(hops)


#: engine figures of the last replayed 3D plans: (plan, cluster, algorithm, slowdown) ->
#: (step s, intra bytes, inter bytes, events, pipeline phase); the symmetry period the
#: replay folds on is a function of the plan and the cluster
_REPLAYED: dict = {}

#: each collective's byte terms per phase, as :func:`_analytic_bytes` (key (cluster, "dp"))
#: and :func:`_bytes_3d` (key (cluster, algorithm, chunks)) derive them from its lowered
#: program, once per program (``advise`` costs hundreds of plans whose collectives repeat)
_BYTES_TERMS: dict = {}


def _analytic_bytes(plan: Plan, spec: ClusterSpec, algo: Algo,
                    repeat: int = 1) -> tuple[float, float]:
    """Bytes one GPU sends per step over intra-node and inter-node hops (average), from the
    lowered programs: a phase's per-rank bytes split by its share of node-crossing hops."""
    intra = inter = 0.0
    if len(_BYTES_TERMS) > 64:
        _BYTES_TERMS.clear()
    progs = _BYTES_TERMS.setdefault((spec, "dp"), {})   # one hash of the cluster
    if len(progs) > 100_000:
        progs.clear()
    for op in plan.ops:
        if not isinstance(op, CollectiveOp):
            continue
        a = op.algo or algo
        key = (op.op, op.scope, op.size_bytes, a)
        terms = progs.get(key)
        if terms is None:   # (bytes per rank, cross-node fraction) per phase, once per program
            terms = progs[key] = [
                (ph.bytes_per_rank, cross_node_fraction(ph.ringset, spec.gpus_per_node))
                for ph in lower(spec, op.op, op.scope, op.size_bytes, a).phases]
        times = 1 if op.micro_step is None else repeat
        for b, f in terms:
            inter += times * b * f
            intra += times * b * (1 - f)
    return intra, inter


def hardware_flops(plan: Plan, repeat: int = 1) -> float:
    """FLOPs one GPU executes per step (recomputation included); micro-step ops x repeat."""
    return sum(o.flops * (1 if o.micro_step is None else repeat)
               for o in plan.ops if isinstance(o, ComputeOp))


def simulate_step(model: ModelSpec, cluster: ClusterSpec, strategy: Strategy | str,
                  training: TrainingSpec, algo: Algo | str = Algo.HO_RING,
                  mode: str = "engine", trace: bool = False, runtime=None,
                  repeats: int = 1, seed: int = 0, jitter_cv: float | None = None,
                  record_links: bool = False, parallel=None) -> StepResult:
    """Simulate one global step.

    ``parallel``: a :class:`parosim.plan.layout.ParallelSpec` (TP / PP / sequence parallelism /
    selective recomputation; docs/parallelism.md); None or a trivial one is plain data
    parallelism, unchanged.

    ``runtime``: a :class:`parosim.spec.runtime.RuntimeSpec` or a profile name (``ideal``,
    ``deepspeed``, ``fsdp``, ``paro``); None = ideal. The compute slowdown beside collectives
    is ``training.overlap_slowdown`` if set, else the cluster's, else the runtime's default.

    With heterogeneous GPUs (cluster overrides) or compute jitter (``jitter_cv``, default the
    cluster's ``jitter_cv``) every rank gets its own timeline (:mod:`parosim.evaluate.ranks`) and
    ``repeats`` steps are drawn with one Generator seeded ``seed``: ``step_time_s`` is then
    the mean, and ``extra`` holds the percentiles and the critical rank.

    >>> from parosim.spec.model import preset
    >>> r = simulate_step(preset("llama-7b"), ClusterSpec(nodes=4), "NIG", TrainingSpec(),
    ...                   mode="analytic")
    >>> r.fits and r.step_time_s > 0
    True
    """
    three_d = parallel is not None and not parallel.trivial
    return _step(model, cluster, strategy, training, algo, mode, trace, runtime, repeats, seed,
                 jitter_cv, record_links, parallel if three_d else None)


def simulate_3d(model: ModelSpec, cluster: ClusterSpec, strategy: Strategy | str,
                training: TrainingSpec, par, algo: Algo | str = Algo.HO_RING,
                mode: str = "engine", trace: bool = False, runtime=None, repeats: int = 1,
                seed: int = 0, jitter_cv: float | None = None,
                record_links: bool = False) -> StepResult:
    """One global step of a TP x PP x DP job (docs/parallelism.md): :func:`simulate_step`
    on the 3D layout's planner even when ``par`` is trivial (tp = pp = 1; the tests compare
    it with the data-parallel planner). The result has ``tp``, ``pp``, ``dp`` and
    ``bubble_fraction`` added."""
    return _step(model, cluster, strategy, training, algo, mode, trace, runtime, repeats, seed,
                 jitter_cv, record_links, par)


def _step(model, cluster, strategy, training, algo, mode, trace, runtime, repeats, seed,
          jitter_cv, record_links, par) -> StepResult:
    """The one step driver of every layout: ``par`` None = the data-parallel planner
    (:mod:`parosim.plan`), else the TP x PP x DP planner (:mod:`parosim.plan.threed`). Both then
    go through the same checks, runtime profile, memory test, engine / per-rank / analytic
    evaluation and metrics."""
    three_d = par is not None
    strategy = parse_strategy(strategy)
    algo = algo if isinstance(algo, Algo) else parse_enum(Algo, algo, "--algo")
    if mode not in MODES:
        raise InputError(f"mode {mode!r} is not known; expected one of {', '.join(MODES)}")
    model.require_shape("a step simulation with tensor or pipeline parallelism" if three_d
                        else "a step simulation")
    cv = cluster.jitter_cv if jitter_cv is None else jitter_cv
    per_rank = cluster.compute_heterogeneous or cv > 0
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise InputError(f"--repeats = {repeats!r} must be a positive integer")
    if mode == "analytic" and (per_rank or not cluster.closed_form_exact):
        why = ("GPU overrides" if cluster.compute_heterogeneous else "compute jitter"
               if cv > 0 else "link overrides" if cluster.network_heterogeneous
               else "ECMP hashing")
        raise InputError(f"mode analytic assumes identical ranks and links, but cluster "
                         f"{cluster.name!r} has {why}; expected --mode engine")
    rt = resolve_runtime(runtime)
    rt.require(strategy.short)
    if three_d:
        # deferred: the 3D planner loads for TP / PP / CP steps only
        from ..plan.threed import check_runtime_3d, training_for_runtime_3d

        check_runtime_3d(rt, strategy, par)
        training = training_for_runtime_3d(training, rt)
    else:
        training = training_for_runtime(training, rt)   # memory settings the profile sets
    if rt.collective_algo is not None:   # the runtime fixes each call's algorithm
        algo = Algo.RING
    slow = effective_overlap_slowdown(training.overlap_slowdown,
                                      getattr(cluster, "overlap_slowdown", None), rt)
    if three_d:
        mem, extra3 = setup_3d(model, cluster, strategy, training, par, algo)
    else:
        mem = memory_breakdown(model, strategy, cluster, training, rt)
    res = StepResult(strategy, algo, mode, cluster.gpus, mem, runtime=rt.name,
                     framework_stage=rt.stage(strategy.short), overlap_slowdown=slow,
                     algo_label=rt.collective_algo or "")
    if three_d:
        res.parallel = extra3
    if not mem.fits:
        return res
    if three_d:
        return _run_3d(res, model, cluster, strategy, training, par, algo, mode, trace, rt,
                       slow, per_rank, repeats, seed, cv, record_links)
    repeat = 1
    if mode == "analytic":  # micro-steps are identical: evaluate one, count it s times
        repeat = training.accum_steps
        plan = build_plan(model, strategy, cluster, replace(training, accum_steps=1), rt)
    else:
        if training.accum_steps > 100:
            check_engine_size(model, strategy, cluster, training, rt)
        plan = build_plan(model, strategy, cluster, training, rt)
    if mode == "engine" and per_rank:
        from ..evaluate.ranks import hetero_step  # deferred: per-rank runs only (numpy timelines)
        step, exposed, compute, b_intra, b_inter = hetero_step(
            res, plan, cluster, algo, slow, repeats, seed, cv, trace, record_links)
    elif mode == "engine":
        rep = replay(plan, cluster, algo, slow, trace=trace, record_links=record_links)
        step, exposed, compute = rep.step_time_s, rep.exposed_comm_s, rep.compute_busy_s
        n = cluster.gpus
        b_intra = rep.gpu_egress.get("intra", 0.0) / n
        b_inter = rep.gpu_egress.get("inter", 0.0) / n
        res.events, res.records = rep.events, rep.records
        res.extra = {"step_time_p50_s": step, "step_time_p90_s": step,
                     "step_time_p99_s": step, "repeats": repeats, "seed": seed,
                     "jitter_cv": 0.0,
                     "critical_rank": None, "symmetry_period_nodes":
                     rep.symmetry_period_nodes, "hot_links": rep.hot_links}
        if record_links:
            res.extra["link_timeline"] = [{"time_s": t, "utilization": u}
                                          for t, u in rep.link_timeline]
    else:
        an = evaluate(plan, cluster, algo, repeat, slow)
        step, exposed = an.step_time_s, an.exposed_comm_s
        compute = an.t_comp_s + an.t_optimizer_s
        b_intra, b_inter = _analytic_bytes(plan, cluster, algo, repeat)
        if not step <= MAX_SIM_SECONDS:  # the same range as the engine's clock
            raise horizon_error(step)
        res.extra = {"step_time_p50_s": step, "step_time_p90_s": step,
                     "step_time_p99_s": step, "repeats": repeats, "seed": seed,
                     "jitter_cv": 0.0, "critical_rank": None}
    return step_metrics(res, cluster, training, step, exposed, compute, b_intra, b_inter,
                    plan.tokens_per_step * repeat, hardware_flops(plan, repeat),
                    plan.model_flops_per_step * repeat)


def step_metrics(res: StepResult, cluster: ClusterSpec, training: TrainingSpec, step: float,
             exposed: float, compute: float, b_intra: float, b_inter: float, tokens: float,
             hw_flops: float, model_flops: float) -> StepResult:
    """The per-step metrics of every layout from its step time, exposed communication,
    compute time, bytes and per-GPU FLOPs (module docstring)."""
    res.step_time_s = step
    res.exposed_comm_s = exposed
    res.compute_s = compute
    res.tokens_per_s = tokens / step
    res.tokens_per_s_per_gpu = res.tokens_per_s / cluster.gpus
    res.samples_per_s = res.tokens_per_s / training.seq_len
    res.tflops_per_gpu = hw_flops / step / 1e12
    peak = cluster.gpu.peak_flops
    if cluster.compute_heterogeneous:  # mean peak over the ranks' GPU types
        peak = sum(g.peak_flops for g, _, _ in cluster.gpu_specs()) / cluster.gpus
    res.mfu = model_flops / (step * peak)
    res.bytes_intra, res.bytes_inter = float(b_intra), float(b_inter)
    return res


def setup_3d(model, cluster, strategy, training, par, algo):
    """Checks, memory and the 3D result keys of a TP x PP x DP step."""
    from ..plan.threed import (  # deferred: the 3D planner loads for TP / PP / CP steps only
        check_cp,
        check_supported,
        chunk_units,
        memory_3d,
    )


    check_supported(cluster, training, algo)
    check_cp(cluster, training, par)
    lay = layout_for(cluster, par.tp, par.pp)
    chunk_units(model, par)
    if par.schedule == "interleaved" and training.accum_steps % par.pp:
        raise InputError(f"the interleaved schedule needs the micro-batches per step "
                         f"(--accum = {training.accum_steps}) to be a multiple of --pp "
                         f"{par.pp}")
    mem = memory_3d(model, strategy, cluster, training, par)
    extra = {"tp": par.tp, "pp": par.pp, "dp": lay.d // par.cp, "bubble_fraction": None,
             "pp_schedule": par.schedule, "virtual_stages": par.virtual,
             "sequence_parallel": par.sequence_parallel,
             "tp_comm_overlap": par.tp_comm_overlap,
             "dp_comm_overlap": par.dp_comm_overlap,
             "recompute_mode": ("full" if mem.recompute else
                                "selective" if par.selective_recompute else "none"),
             "micro_batches": training.accum_steps}
    if par.cp > 1:   # the key appears only with context parallelism (cp = 1: as before)
        extra["cp"] = par.cp
    return mem, extra


def _run_3d(res, model, cluster, strategy, training, par, algo, mode, trace, rt, slow,
            per_rank, repeats, seed, cv, record_links) -> StepResult:
    """The evaluation of a TP x PP x DP step: closed form, engine replay or per-rank
    timelines; then the shared metrics (:func:`step_metrics`).

    ``bubble_fraction`` and ``exposed_comm_s`` mean the same in every mode
    (docs/parallelism.md, "Bubble and exposed communication"): bubble_s = (p - 1)/v x T,
    T the mean over stages of one micro-batch's busy time on the stage's compute stream;
    bubble_fraction = bubble_s / the pipeline phase; exposed_comm_s = step - compute_s -
    bubble_s, compute_s the busiest stage's compute ops (its optimizer step included)."""
    from ..evaluate.threed import (  # deferred: the 3D planner loads for TP / PP / CP steps only
        evaluate_3d,
        pipeline_phase,
    )
    from ..plan.threed import (
        build_plan_3d,  # deferred: the 3D planner loads for TP / PP / CP steps only
    )


    extra = res.parallel
    m = training.accum_steps
    if mode == "analytic":
        m_small = par.pp if par.virtual > 1 else 1
        # the small plan stands for m micro-batches, so it must recompute as the m-micro-batch
        # step does: auto recomputation resolved on m_small would see fewer activations in
        # flight (1F1B holds min(p - k, m)) and could drop recomputation the step needs
        plan = build_plan_3d(model, strategy, cluster,
                             replace(training, accum_steps=m_small,
                                     recompute=res.memory.recompute), par, rt)
        an = evaluate_3d(plan, cluster, algo, m=m, overlap_slowdown=slow)
        step, exposed, compute = an.step_time_s, an.exposed_comm_s, an.compute_s
        extra["bubble_fraction"] = an.bubble_fraction
        scale = m / m_small
        b_intra, b_inter = _bytes_3d(plan, cluster, algo, scale)
        return step_metrics(res, cluster, training, step, exposed, compute, b_intra, b_inter,
                        plan.tokens_per_step * scale, plan.hardware_flops_per_gpu * scale,
                        plan.model_flops_per_step * scale)
    plan = build_plan_3d(model, strategy, cluster, training, par, rt)
    n = cluster.gpus
    if per_rank:

        from ..evaluate.ranks import hetero_step  # deferred: per-rank runs only (numpy timelines)
        step, _, _, b_intra, b_inter = hetero_step(
            res, plan, cluster, algo, slow, repeats, seed, cv, trace, record_links)
        ph = _rank_phase(plan, res.last_rank_step, n)
    else:

        # the engine is deterministic: an equal plan on the same cluster, algorithm and
        # slowdown replays to the same figures (advise meets such plans: e.g. eager and
        # flash attention under selective recomputation), so its figures are reused
        key = None if trace or record_links else (plan, cluster, algo, slow)
        seen = _REPLAYED.get(key) if key is not None else None
        if seen is not None:
            step, b_intra, b_inter, res.events, ph = seen
            res.records = []
        else:
            # the layout's symmetric period, or every node when a collective lowers to an
            # NCCL tree (not translation-invariant): replay's plan_period
            rep = replay(plan, cluster, algo, slow, trace=True, record_links=record_links)
            step, recs = rep.step_time_s, rep.records
            b_intra = rep.gpu_egress.get("intra", 0.0) / n
            b_inter = rep.gpu_egress.get("inter", 0.0) / n
            res.events, res.records = rep.events, (rep.records if trace else [])
            if record_links:
                res.extra = {"link_timeline": [{"time_s": t, "utilization": u}
                                               for t, u in rep.link_timeline]}
            ph = pipeline_phase(plan, [(r.lane, r.kind, r.start_s, r.end_s) for r in recs])
            if key is not None:
                if len(_REPLAYED) >= 8:   # the plans are kept as keys: a few at a time
                    _REPLAYED.clear()
                _REPLAYED[key] = (step, b_intra, b_inter, rep.events, ph)
    extra["bubble_fraction"] = ph.bubble_fraction
    if plan.tp_comm_overlap:   # the exposed chunks stand for time, not extra bytes
        c_intra, c_inter = _bytes_3d(plan, cluster, algo, 1.0, chunks=True)
        b_intra, b_inter = b_intra - c_intra, b_inter - c_inter
    return step_metrics(res, cluster, training, step, max(0.0, step - ph.compute_s - ph.bubble_s),
                    ph.compute_s, b_intra, b_inter, plan.tokens_per_step,
                    plan.hardware_flops_per_gpu, plan.model_flops_per_step)


def _rank_phase(plan, last, n: int):
    """The pipeline phase of a per-rank replay (:func:`parosim.plan.threed.pipeline_phase`): per
    stage, the busiest rank's compute and the mean rank's busy time (compute less the
    optimizer step, plus the TP / CP collectives of the stage's compute stream)."""
    from ..evaluate.threed import (
        pipeline_phase,  # deferred: the 3D planner loads for TP / PP / CP steps only
    )


    spans = [(o.stream, o.kind if isinstance(o, ComputeOp) else o.purpose,
              float(last.op_start_s[o.id]), float(last.op_end_s[o.id])) for o in plan.ops]
    per = n // plan.pp
    comp, busy = [], []
    for k in range(plan.pp):
        b = last.compute_busy_s[k * per:(k + 1) * per]
        opt = sum(e - s0 for st, kd, s0, e in spans if st == f"compute/s{k}" and kd == "optimizer")
        coll = sum(e - s0 for o, (st, kd, s0, e) in zip(plan.ops, spans, strict=True)
                   if st == f"compute/s{k}" and isinstance(o, CollectiveOp))
        comp.append(float(b.max()))
        busy.append(float(b.mean()) - opt + coll)
    return pipeline_phase(plan, spans, comp, busy)


def _bytes_3d(plan, spec: ClusterSpec, algo: Algo, scale: float,
              chunks: bool = False) -> tuple[float, float]:
    """Bytes one GPU sends per step over intra-node and inter-node hops (average over GPUs),
    from the lowered programs (micro-step ops x ``scale``). The exposed chunks of TP
    communication overlap (purpose ``tp-chunk``) are left out: they model the time of the
    pipeline's first / last chunk, whose bytes the overlapped collective already moves;
    ``chunks``: count only them, as the engine's links carry them (bytes / the protocol's
    wire efficiency): the engine subtracts them from its link bytes."""
    intra = inter = 0.0
    gpn, n = spec.gpus_per_node, spec.gpus
    if len(_BYTES_TERMS) > 64:
        _BYTES_TERMS.clear()
    progs = _BYTES_TERMS.setdefault((spec, algo, chunks), {})   # one hash of the cluster
    if len(progs) > 100_000:
        progs.clear()
    for op in plan.ops:
        if not isinstance(op, CollectiveOp) or (op.purpose == "tp-chunk") != chunks:
            continue
        key = (op.group, op.op, op.scope, op.size_bytes, op.algo, getattr(op, "scopes", None),
               op.chain)
        terms = progs.get(key)
        if terms is None:  # (bytes sent, cross-node fraction, share) per phase, once per program
            terms = progs[key] = []
            for ph in op.lower(spec, algo).phases:
                rings = ph.ringset.rings
                senders = (len(rings) if isinstance(ph.ringset, PairSet)
                           else sum(len(r) for r in rings))
                share = senders / n  # the ranks that send, averaged over all GPUs
                f = cross_node_fraction(ph.ringset, gpn)
                sent = ph.bytes_per_rank / ph.bw_eff if chunks else ph.bytes_per_rank  # wire
                terms.append((sent, f, share))
        times = op.count * (1 if op.micro_step is None else scale)
        for sent, f, share in terms:
            inter += times * sent * f * share
            intra += times * sent * (1 - f) * share
    return intra, inter


def resolve_runtime(runtime):
    """A RuntimeSpec from None (ideal), a profile name or a spec."""
    return as_runtime(runtime)


def rank_key(r: StepResult) -> tuple:
    """Fitting configurations first, fastest first; then the others by smallest shortfall."""
    if r.fits:
        return (0, r.step_time_s, r.strategy.short, r.algo.value)
    return (1, r.memory.shortfall_bytes, r.strategy.short, r.algo.value)


def _one(args: tuple) -> StepResult:
    return simulate_step(*args)


def compare(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
            algos: list[Algo] | None = None, mode: str = "engine",
            strategies: list[Strategy] | None = None, workers: int = 1,
            runtime=None, parallel=None) -> list[StepResult]:
    """Every strategy (x every algorithm in ``algos``), ranked best first.

    With a ``runtime`` that names its stages (deepspeed, fsdp) only those strategies run;
    with ``parallel.dp_comm_overlap`` (Megatron-Core's DDP buckets) only NNN, NNI and NNG.

    ``workers > 1`` simulates the configurations in that many processes (each is a pure
    function of its inputs, so the result is the same).
    """
    algos = algos or [Algo.HO_RING]
    rt = resolve_runtime(runtime)
    pool = [s for s in (strategies or ALL_STRATEGIES) if strategies or rt.supports(s.short)]
    jobs = [(model, cluster, s, training, a, mode, False, rt) for s in pool for a in algos]
    if parallel is not None and not parallel.trivial:   # 3D
        if not rt.is_ideal:   # a framework's schedule: p = N, g = N (plan3d.check_runtime_3d)

            pool = [s for s in pool if s.p is Level.N and s.g is Level.N]
            if not pool:
                raise InputError(f"--runtime {rt.name} with --tp / --pp / --cp models "
                                 "strategies with p = N and g = N; expected one of them "
                                 "among the strategies")
        if getattr(parallel, "dp_comm_overlap", False):

            pool = [s for s in pool if s.p is Level.N and s.g is Level.N]
            if not pool:
                raise InputError("--dp-comm-overlap applies to PaRO NNN, NNI and NNG; "
                                 "expected one of them among the strategies")
        jobs = [(model, cluster, s, training, a, mode, False, rt, 1, 0, None, False,
                 parallel) for s in pool for a in algos]
    if workers > 1 and mode == "engine" and len(jobs) > 2:

        # costliest first (p = G moves the most chunks), for load balance
        jobs.sort(key=lambda j: -j[2].p.rank)
        import multiprocessing as mp  # deferred: pools cost start-up
        from concurrent.futures import ProcessPoolExecutor  # deferred: as above
        with ProcessPoolExecutor(workers, mp_context=mp.get_context("fork")) as ex:
            out = list(ex.map(_one, jobs))
    else:
        out = [_one(j) for j in jobs]
    return sorted(out, key=rank_key)


def with_overrides(cluster: ClusterSpec, nic_bandwidth_Bps: float | None = None,
                   intra_bandwidth_Bps: float | None = None,
                   gpu_memory_bytes: int | None = None) -> ClusterSpec:
    """A what-if copy of the cluster with some figures replaced."""
    if nic_bandwidth_Bps is not None:
        cluster = replace(cluster, nic=replace(cluster.nic, bandwidth_Bps=nic_bandwidth_Bps))
    if intra_bandwidth_Bps is not None:
        cluster = replace(cluster, intra=replace(cluster.intra,
                                                 bandwidth_Bps=intra_bandwidth_Bps))
    if gpu_memory_bytes is not None:
        cluster = replace(cluster, gpu=replace(cluster.gpu, memory_bytes=gpu_memory_bytes))
    return cluster


def cluster_from_flags(a) -> ClusterSpec:
    """The cluster of ``parosim simulate``'s flags (``a``: the parsed namespace or any object
    with its attributes): ``--cluster``, ``--nodes``, ``--group-nodes``, ``--set``, then the
    ``--nic-bandwidth`` / ``--intra-bandwidth`` / ``--gpu-memory`` overrides."""
    cluster = load_cluster(a.cluster, a.nodes, a.group_nodes, a.set or ())
    return with_overrides(
        cluster,
        None if a.nic_bandwidth is None else parse_bandwidth(a.nic_bandwidth, "--nic-bandwidth"),
        None if a.intra_bandwidth is None
        else parse_bandwidth(a.intra_bandwidth, "--intra-bandwidth"),
        None if a.gpu_memory is None else parse_size(a.gpu_memory, "--gpu-memory"))


def seeded(cluster: ClusterSpec, seed: int) -> ClusterSpec:
    """The cluster with ``seed`` (``--seed``) as its ECMP hashing seed (when it hashes)."""
    if seed < 0:
        raise InputError(f"--seed = {seed} must be a non-negative integer")
    if cluster.network.ecmp == "hash":
        cluster = replace(cluster, network=replace(cluster.network, ecmp_seed=seed))
    return cluster


def dp_keys(d: dict) -> dict:
    """Plain data parallelism in the 3D vocabulary: tp = pp = 1, dp = GPUs, no bubble."""
    for k, v in (("tp", 1), ("pp", 1), ("dp", d.get("gpus")), ("bubble_fraction", 0.0)):
        d.setdefault(k, v)
    return d
