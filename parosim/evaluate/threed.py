"""The closed form of a 3D Plan (:class:`parosim.plan.threed.Plan3D`) and the metrics of its
pipeline phase, shared by the closed form and the engine replay.

``bubble_fraction`` and ``exposed_comm_s`` mean the same in both (docs/tensor-pipeline.md):
bubble_s = (p - 1)/v x T, T the mean over stages of one micro-batch's busy time on the
stage's compute stream; bubble_fraction = bubble_s / the pipeline phase; exposed_comm_s =
step - compute_s - bubble_s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..collectives.cost import program_time
from ..collectives.types import Algo, Op, Scope
from ..cost.compute import compute_seconds
from ..errors import InputError
from ..evaluate.analytic import overlapped_time
from ..plan.builder import (
    LEVEL_SCOPE,
    SYNC_GRAD,
    SYNC_PARAM,
    ComputeOp,
    chunk_units,
)
from ..plan.layout import (
    ParallelSpec,
    layout_for,
    lower_group,
    lower_p2p,
)
from ..plan.memory3d import (
    check_cp,
    cp_local,
    stage_fp8_params,
    stage_params,
)
from ..plan.threed import Plan3D
from ..plan.threed_parts import (
    check_dp_overlap,
    cp_attention_step,
    cp_pairs,
    dp_buckets,
    optimizer_seconds_3d,
    recompute_flops,
    tp_buffer_bytes,
    tp_collectives,
    tp_overlap_pairs,
    unit_flops,
    unit_seconds,
)
from ..spec.model import ModelSpec
from ..spec.strategy import Level, Strategy
from ..spec.system import ClusterSpec
from ..spec.training import (
    BYTES_PER_GRAD,
    BYTES_PER_PARAM,
    TrainingSpec,
)
from .replay import replay


def grad_chain_exposed(chain, f: float = 1.0) -> float:
    """Time the bucketed gradient reduction adds after the last backward.

    ``chain``: [(w_i, r_i)]: w_i seconds of busy time (the bucket's backward), then its
    reduction r_i on the gradient stream, which starts when w_i ends and r_{i-1} has ended.
    The busy time runs at 1/f while a reduction is in flight (the engine's overlap gate).
    Returns (end of the last reduction or busy time) - Σ w_i.

    >>> grad_chain_exposed([(1.0, 0.5), (1.0, 0.5)])    # hidden but the last bucket
    0.5
    >>> grad_chain_exposed([(1.0, 3.0), (1.0, 0.5)])    # ends at 1 + 3 + 0.5, busy 2
    2.5
    """
    t, end = _grad_chain(chain, f)
    return end - sum(w for w, _ in chain)


def grad_chain_slowed(chain, f: float = 1.0) -> float:
    """How much later the chain's busy time ends than Σ w_i (its slowdown beside the
    reductions; 0 with f = 1): on a later stage it delays the last backwards of the
    stages before it (:func:`evaluate_3d`).

    >>> grad_chain_slowed([(1.0, 0.5), (1.0, 0.5)], 2.0)   # w_2 half beside r_1
    0.25
    """
    if f == 1.0:
        return 0.0
    return _grad_chain(chain, f)[0] - sum(w for w, _ in chain)


def _grad_chain(chain, f: float) -> tuple[float, float]:
    """(end of the busy time, end of the last reduction or busy time) of a chain."""
    t = 0.0          # now
    comm_end = 0.0   # end of the last reduction issued
    for w, r in chain:
        # w of work from t; at rate 1/f while a reduction runs (until comm_end)
        if f != 1.0 and comm_end > t:
            slow = (comm_end - t) / f          # work done before the reduction ends
            t = t + w * f if w <= slow else comm_end + (w - slow)
        else:
            t += w
        if r > 0:
            comm_end = max(t, comm_end) + r
    return t, max(t, comm_end)


def param_fill_exposed(chains, p: int, v: int, f: float = 1.0) -> float:
    """Delay the bucketed parameter all-gathers add to the pipeline: the first micro-batch's
    forward through the virtual stages 0..p·v-1 (the path every stage's work waits on),
    with and without the gathers. ``chains[vs]``: [(gather s, busy s)] of virtual stage vs's
    buckets in forward order. Every stage starts its gathers at the step's start, back to
    back on one stream in the order of use (Megatron-LM's default aligned launch, "all PP
    stages will launch param all-gathers simultaneously"); a bucket's forward starts when the
    previous one has ended, its input has arrived and its gather has ended, at 1/f while the
    stage's gathers are in flight. With the interleaved schedule stage k runs p - 1 more
    forwards of chunk c (micro-batches 1..p-1) before chunk c + 1's first.

    >>> param_fill_exposed([[(0.5, 1.0), (0.5, 1.0)]], 1, 1)   # the first gather shows
    0.5
    >>> param_fill_exposed([[(1.5, 1.0)] * 3], 1, 1)           # gathers end at 1.5, 3, 4.5
    2.5
    >>> param_fill_exposed([[(0.5, 1.0)], [(0.5, 1.0)]], 2, 1)  # stage 1's hides in the fill
    0.5
    """
    def run(gathers: bool) -> float:
        ends: dict[tuple[int, int], float] = {}
        total = [0.0] * p
        for k in range(p):
            acc = 0.0
            for vs in range(k, len(chains), p):
                for i, (g, _) in enumerate(chains[vs]):
                    acc += g if gathers else 0.0
                    ends[(vs, i)] = acc
            total[k] = acc
        free = [0.0] * p       # when stage k's compute stream is free
        arr = 0.0
        for vs, chain in enumerate(chains):
            k = vs % p
            t = max(arr, free[k])
            for i, (_, w) in enumerate(chain):
                start = max(t, ends[(vs, i)])
                busy = total[k] - start         # the stage's gathers still in flight
                if f != 1.0 and busy > 0:
                    t = start + (busy + (w - busy / f) if w > busy / f else w * f)
                else:
                    t = start + w
            arr = t
            extra = (p - 1) * sum(w for _, w in chain) if v > 1 and vs < p * (v - 1) else 0.0
            free[k] = t + extra
        return arr

    return run(True) - run(False)


def dp_overlap_exposed(grad, f: float = 1.0) -> float:
    """Exposed gradient time of one stage from its chain of (busy seconds, collective
    seconds, has a collective) entries (:func:`dp_chains`): an entry with no collective is
    busy time that joins the next bucket's backward; then :func:`grad_chain_exposed`."""
    return grad_chain_exposed(_grad_list(grad), f)


def dp_overlap_bound(grads, f: float = 1.0) -> list[float]:
    """Per stage, the gradient side of the boundary with DP communication overlap: its
    exposed reductions (:func:`dp_overlap_exposed`) plus, with f > 1, the slowdown of the
    last backwards of the later stages (:func:`grad_chain_slowed`): in the cool-down stage
    k's last backward waits for stage k + 1's, which ran at 1/f beside its own reductions.
    With f = 1 exactly the exposed reductions."""
    ex = [dp_overlap_exposed(g, f) for g in grads]
    if f == 1.0:
        return ex
    sl = [grad_chain_slowed(_grad_list(_last_chunk(g)), f) for g in grads]
    return [ex[k] + sum(sl[k + 1:]) for k in range(len(grads))]


def _last_chunk(grad):
    """The entries after the last one without a collective (the last chunk's buckets)."""
    i = max((j for j, e in enumerate(grad) if not e[2]), default=-1)
    return grad[i + 1:]


def _grad_list(grad) -> list[tuple[float, float]]:
    gl, pend = [], 0.0
    for w, c, has in grad:
        if not has:
            pend += w
            continue
        gl.append((pend + w, c))
        pend = 0.0
    if pend:
        gl.append((pend, 0.0))
    return gl


_TIMES: dict = {}   # closed-form time per (cluster, algo, collective, group set)


_SUMMARY_TIMES: dict = {}
_MAX_PARTS = 10_000   # summary_3d's cached per-stage sums (p floats each; 70B on 1,024 GPUs: 3,000)


@dataclass(frozen=True)
class Analytic3D:
    """Closed-form step of a 3D plan (seconds)."""

    step_time_s: float
    pipeline_s: float
    bubble_s: float
    boundary_s: float
    compute_s: float          # compute ops of the busiest stage over the step (+ its optimizer)
    stage_time_s: tuple[float, ...]   # per micro-batch, per stage (compute + TP, or DP comm)

    @property
    def bubble_fraction(self) -> float:
        return self.bubble_s / self.pipeline_s if self.pipeline_s > 0 else 0.0

    @property
    def exposed_comm_s(self) -> float:
        return max(0.0, self.step_time_s - self.compute_s - self.bubble_s)


def evaluate_3d(plan: Plan3D, spec: ClusterSpec, algo: Algo, m: int | None = None,
                overlap_slowdown: float = 1.0) -> Analytic3D:
    """Closed form of a 3D Plan (docs/parallelism.md, "Analytic"):

    per stage and micro-batch T_k = max(compute + TP collectives, PaRO micro-step
    collectives); pipeline = m·max T_k + (p-1)·(mean T_k / v + one activation and one
    gradient transfer); step = pipeline + max over stages of (gradient sync + optimizer +
    parameter sync). ``m`` (default: the plan's) lets a plan built with fewer micro-batches
    stand for one with m (per-micro-batch costs are identical provided the small plan was
    built with the recomputation decision of the m-micro-batch step: auto recomputation
    depends on m through the activations in flight; :func:`simulate_3d` passes it).

    With p = 1 and no DP traffic this is m x (compute + TP) exactly. With
    ``overlap_slowdown`` f > 1 the micro-step collectives slow the stage's busy time
    (T_k = ``overlapped_time(busy, dp, f)``), and with DP communication overlap the later
    stages' slowed last backwards delay the cool-down (:func:`dp_overlap_bound`): the
    engine's per-stage gates (:meth:`Plan3D.overlap_gates`).

    TP communication overlap (ops on ``tp-ovl/s{k}``): a collective of x seconds beside its
    GEMM of g seconds adds ``overlapped_time(g, x, f) - g`` to its stage (``max(0, x - g)``
    with ``overlap_slowdown`` f = 1; :func:`parosim.evaluate.analytic.overlapped_time`); its exposed
    chunk is a TP op on the compute stream.

    DP communication overlap (``plan.dp_grad_chains``): each stage's boundary holds its
    exposed bucket reductions (:func:`dp_overlap_exposed`) instead of the syncs, and the
    exposed parameter gathers of the pipeline fill (:func:`param_fill_exposed`) are added.
    """

    if plan.engine_only:
        raise InputError(f"runtime {plan.runtime!r} with {plan.strategy.short} and --tp "
                         f"{plan.tp}: {plan.engine_only}, which analytic mode cannot "
                         "represent; expected --mode engine")
    m_plan = plan.accum_steps
    m = m_plan if m is None else m
    p, v = plan.pp, plan.virtual

    def t_of(op) -> float:
        key = (spec, algo, op.group, op.op, op.scope, op.size_bytes, op.algo, op.scopes)
        t = _TIMES.get(key)
        if t is None:
            if len(_TIMES) > 100_000:
                _TIMES.clear()
            t = _TIMES[key] = program_time(spec, op.lower(spec, algo))
        return t * op.count

    busy = [0.0] * p
    comp = [0.0] * p
    dp = [0.0] * p
    p2p = [0.0] * p
    bound = [0.0] * p
    opt = [0.0] * p
    dpo = bool(plan.dp_grad_chains)
    own: dict[int, float] = {}    # DP communication overlap: each op's busy time / its time
    stage_of: dict[str, int] = {}   # stream -> its stage (parsed once per stream)
    for op in plan.ops:
        k = stage_of.get(op.stream)
        if k is None:
            k = stage_of[op.stream] = int(op.stream.rsplit("/s", 1)[1])
        if isinstance(op, ComputeOp):
            if op.micro_step is None:
                bound[k] += op.duration_s
                opt[k] += op.duration_s
            else:
                busy[k] += op.duration_s
                comp[k] += op.duration_s
                if dpo:
                    own[op.id] = op.duration_s
            continue
        t = t_of(op)
        if dpo and op.purpose in ("grad-bucket", "param-bucket"):
            own[op.id] = t      # exposed through the chains below
        elif op.micro_step is None:
            bound[k] += t
        elif op.stream.startswith("tp-ovl/"):
            g = plan.ops[op.pair].duration_s
            busy[k] += overlapped_time(g, t, overlap_slowdown) - g
            if dpo:
                own[op.id] = overlapped_time(g, t, overlap_slowdown) - g
        elif op.stream.startswith("compute/"):
            busy[k] += t
            if dpo:
                own[op.id] = t
        elif op.stream.startswith("p2p-"):
            p2p[k] += t
        else:
            dp[k] += t
    if dpo:   # the buckets' exposed reduction and gather join the boundary
        def ent(chain):
            return [(sc * sum(own[i] for i in ids), sum(own[i] for i in cs), bool(cs))
                    for ids, cs, sc in chain]

        gb = dp_overlap_bound([ent(plan.dp_grad_chains[k]) for k in range(p)],
                              overlap_slowdown)
        for k in range(p):
            bound[k] += gb[k]
        pre = param_fill_exposed([[(sum(own[i] for i in cs), sum(own[i] for i in ids))
                                   for ids, cs in ch] for ch in plan.dp_param_chains],
                                 p, v, overlap_slowdown) if plan.dp_param_chains else 0.0
        return _combine(busy, comp, dp, p2p, bound, opt, m_plan, m, p, v, pre,
                        f=overlap_slowdown)
    # one activation + one gradient transfer per (virtual) boundary, per micro-batch
    return _combine(busy, comp, dp, p2p, bound, opt, m_plan, m, p, v,
                    f=overlap_slowdown)


def summary_3d(model: ModelSpec, strategy: Strategy, cluster: ClusterSpec,
               training: TrainingSpec, par: ParallelSpec, algo: Algo,
               recompute: bool, overlap_slowdown: float = 1.0) -> Analytic3D:
    """:func:`evaluate_3d` of :func:`build_plan_3d` without building the ops (the same sums
    per stage, term by term; tested equal): ``advise`` screens thousands of configurations
    with it."""

    check_cp(cluster, training, par)
    given, training = training, cp_local(training, par)   # one CP rank: s/cp tokens
    lay = layout_for(cluster, par.tp, par.pp)
    p, t, v, sp = par.pp, par.tp, par.virtual, par.sequence_parallel
    r = training.trainable_ratio
    units = chunk_units(model, par)
    last_vs = len(units) - 1
    tp_size = tp_buffer_bytes(model, training)
    tp_algo = par.tp_algo if t > cluster.gpus_per_node else Algo.RING

    if len(_SUMMARY_TIMES) > 64:
        _SUMMARY_TIMES.clear()
    cache = _SUMMARY_TIMES.setdefault((cluster, algo), {})   # one hash of the cluster
    # per-stage sums that depend on a subset of the knobs, computed once per subset (the
    # same sums, term by term, as computed here on a miss): the compute stream's (busy,
    # compute, p2p) sums, the micro-step DP sums, the accumulation boundary (docs/performance.md)
    parts = _SUMMARY_TIMES.setdefault("parts", {})
    if len(parts) > _MAX_PARTS:
        parts.clear()
    dpo = par.dp_comm_overlap
    skey = ("stage", model, cluster, given, par, recompute, overlap_slowdown)
    dkey = ("dp", model, cluster, algo, p, t, v, strategy.p, strategy.g, r)
    bkey = ("bound", model, cluster, algo, p, t, v, strategy, r, training.precision,
            training.compute_model)
    stage, dps, bnd = parts.get(skey), parts.get(dkey), None if dpo else parts.get(bkey)

    def coll(group, op, scope, size, gs, own=None) -> float:
        if group == "p2p":
            k = 2
        else:
            k = gs.size(scope)
        if k <= 1 or size <= 0:
            return 0.0
        key = (group, op, scope, float(size), own, gs)
        tt = cache.get(key)
        if tt is None:
            prog = (lower_p2p(gs, float(size)) if group == "p2p" else
                    lower_group(cluster, op, scope, float(size), own or algo, gs))
            tt = cache[key] = program_time(cluster, prog)
        return tt

    ovl = par.tp_comm_overlap
    pairs = ({ph: tp_overlap_pairs(model, cluster, training, par, ph)
              for ph in ("fwd", "bwd", "recompute")} if ovl else {})

    def tp_time(k: int, kind: str, phase: str) -> float:
        if ovl and kind == "layer":   # each overlapped collective beside its GEMM + a chunk
            gs = lay.tp_scopes(k)
            tot = 0.0
            for pr in pairs[phase]:
                size = tp_size * pr.size_scale
                x = coll("tp", pr.op, Scope.GLOBAL, size, gs, tp_algo)
                tot += overlapped_time(pr.gemm_s, x, overlap_slowdown) - pr.gemm_s
                if pr.chunks:
                    tot += coll("tp", pr.op, Scope.GLOBAL, size / pr.chunks, gs, tp_algo)
            return tot
        return sum(c * coll("tp", op, Scope.GLOBAL, tp_size, lay.tp_scopes(k), tp_algo)
                   for op, c in tp_collectives(kind, phase, sp))

    busy = [0.0] * p
    comp = [0.0] * p
    dp = [0.0] * p
    p2p = [0.0] * p
    bound = [0.0] * p
    opt = [0.0] * p
    msg = tp_size / t
    if stage is None or dpo:
        rcf = recompute_flops(model, training, recompute, par.selective_recompute)
        flops = {(kind, ph): unit_flops(model, training, kind, ph)
                 for kind in ("embed", "layer", "head") for ph in ("fwd", "bwd")}
        ks = unit_seconds(model, cluster, training, par, recompute)   # None: flat model

    def cp_time(k: int, phase: str) -> tuple[float, float]:
        """Context parallelism, one layer pass: (compute added, busy time added): the
        attention steps beside their ring transfers (build_plan_3d's cp_ops), less the
        attention backward they replace in the layer's backward."""
        if par.cp == 1 or (phase == "recompute" and not rcf):
            return 0.0, 0.0
        c = x = 0.0
        for sec, _, size, cnt in cp_pairs(model, cluster, training, par, ks, phase):
            g = cnt * sec
            c += g
            x += overlapped_time(g, cnt * coll("p2p", Op.ALL_GATHER, Scope.GLOBAL, size,
                                               lay.cp_ring(k, par.cp)), overlap_slowdown)
        if phase == "bwd":
            a = cp_attention_step(model, cluster, training, par, ks)[1]
            c, x = c - a, x - a
        return c, x
    for vs, us in enumerate(units if stage is None or dps is None else ()):
        k = vs % p
        gs = lay.dp_scopes(k)
        kinds: dict[tuple[str, int], int] = {}
        for u in us:   # the layers of a chunk are identical: cost each kind once
            kinds[(u.kind, u.params)] = kinds.get((u.kind, u.params), 0) + 1
        for (kind, params), n in kinds.items():
            if dps is None:
                if strategy.p is not Level.N:
                    dp[k] += n * 2 * coll("dp", Op.ALL_GATHER, LEVEL_SCOPE[strategy.p],
                                          BYTES_PER_PARAM * params / t, gs)
                if strategy.g is not Level.N:
                    dp[k] += n * coll("dp", Op.REDUCE_SCATTER, LEVEL_SCOPE[strategy.g],
                                      BYTES_PER_GRAD * params * r / t, gs)
            if stage is not None:
                continue
            if ks is not None:
                secs = ks[(kind, "fwd")] + ks[(kind, "bwd")]
                if kind == "layer" and rcf:
                    secs += ks[("layer", "recompute")]
            else:
                secs = (compute_seconds(flops[(kind, "fwd")] / t, cluster, training)
                        + compute_seconds(flops[(kind, "bwd")] / t, cluster, training))
                if kind == "layer" and rcf:
                    secs += compute_seconds(rcf / t, cluster, training)
            comp[k] += n * secs
            busy[k] += n * (secs + tp_time(k, kind, "fwd") + tp_time(k, kind, "bwd"))
            if recompute and kind == "layer":
                busy[k] += n * tp_time(k, kind, "recompute")
            if kind == "layer" and par.cp > 1:
                for ph in ("fwd", "bwd", "recompute"):
                    c, x = cp_time(k, ph)
                    comp[k] += n * c
                    busy[k] += n * x
        if stage is not None:
            continue
        if vs < last_vs:
            nxt = (vs + 1) % p
            p2p[k] += coll("p2p", Op.ALL_GATHER, Scope.GLOBAL, msg, lay.pairs(k, nxt))
            if not sp and t > 1:
                p2p[k] += coll("tp", Op.ALL_GATHER, Scope.GLOBAL, tp_size,
                               lay.tp_scopes(nxt), tp_algo)
        if vs > 0:
            prv = (vs - 1) % p
            p2p[k] += coll("p2p", Op.ALL_GATHER, Scope.GLOBAL, msg, lay.pairs(k, prv))
            if not sp and t > 1:
                p2p[k] += coll("tp", Op.ALL_GATHER, Scope.GLOBAL, tp_size,
                               lay.tp_scopes(prv), tp_algo)
    if stage is None:
        stage = parts[skey] = (tuple(busy), tuple(comp), tuple(p2p))
    if dps is None:
        dps = parts[dkey] = tuple(dp)
    busy, comp, p2p, dp = list(stage[0]), list(stage[1]), list(stage[2]), list(dps)
    sparams = stage_params(model, par) if bnd is None else ()
    fp8p = stage_fp8_params(model, par) if bnd is None else ()
    for k in range(p if bnd is None else 0):
        gs = lay.dp_scopes(k)
        full = BYTES_PER_GRAD * sparams[k] * r
        sizes = {"full": full, "shard": full / lay.m_dp}
        for op, scope, size in () if dpo else SYNC_GRAD[(strategy.g, strategy.os)]:
            bound[k] += coll("dp", op, scope, sizes[size], gs)
        d_os = strategy.os.divisor(lay.d, lay.m_dp)
        opt[k] = optimizer_seconds_3d(sparams[k] * r, d_os, cluster, training, fp8p[k])
        bound[k] += opt[k]
        for op, scope, size in () if dpo else SYNC_PARAM.get((strategy.os, strategy.p), ()):
            bound[k] += coll("dp", op, scope, sizes[size], gs)
    if bnd is None and not dpo:
        bnd = parts[bkey] = (tuple(bound), tuple(opt))
    if bnd is not None:
        bound, opt = list(bnd[0]), list(bnd[1])
    if not dpo:
        return _combine(busy, comp, dp, p2p, bound, opt, 1, training.accum_steps, p, v,
                        f=overlap_slowdown)
    # DP communication overlap: the same bucket chains as build_plan_3d / evaluate_3d
    check_dp_overlap(strategy, par)
    buckets = dp_buckets(model, par, lay.d)

    def unit_busy(k: int, kind: str, phase: str) -> float:
        if ks is not None:
            sec = ks[(kind, phase)]
            if phase == "bwd" and kind == "layer" and rcf:
                sec += ks[("layer", "recompute")]
        else:
            sec = compute_seconds(flops[(kind, phase)] / t, cluster, training)
            if phase == "bwd" and kind == "layer" and rcf:
                sec += compute_seconds(rcf / t, cluster, training)
        sec += tp_time(k, kind, phase)
        if phase == "bwd" and recompute and kind == "layer":
            sec += tp_time(k, kind, "recompute")
        if kind == "layer" and par.cp > 1:
            sec += cp_time(k, phase)[1]
            if phase == "bwd":
                sec += cp_time(k, "recompute")[1]
        return sec

    def sync(k: int, us: list, table) -> float:
        full = BYTES_PER_GRAD * sum(u.params for u in us) * r / t
        sizes = {"full": full, "shard": full / lay.m_dp}
        return sum(coll("dp", op, scope, sizes[size], lay.dp_scopes(k))
                   for op, scope, size in table)

    gsync = SYNC_GRAD[(strategy.g, strategy.os)]
    psync = SYNC_PARAM.get((strategy.os, strategy.p), ())
    gb: dict[tuple[int, int], tuple[float, float]] = {}
    pchains = []
    for vs, us in enumerate(units):
        k = vs % p
        for bi, bucket in enumerate(buckets[vs]):
            bus = [us[i] for i in bucket]
            gb[(vs, bi)] = (sum(unit_busy(k, u.kind, "bwd") for u in bus), sync(k, bus, gsync))
        if psync:
            pchains.append([(sync(k, [us[i] for i in buckets[vs][bi]], psync),
                             sum(unit_busy(k, us[i].kind, "fwd") for i in buckets[vs][bi]))
                            for bi in range(len(buckets[vs]) - 1, -1, -1)])
    chains = []
    for k in range(p):
        chain = []
        for ci, c in enumerate(reversed(range(v))):
            vs = k + c * p
            ents = [gb[(vs, bi)] for bi in range(len(buckets[vs]))]
            if ci > 0:
                chain.append(((p - 1) * sum(w for w, _ in ents), 0.0, False))
            chain += [(w, x, True) for w, x in ents]
        chains.append(chain)
    for k, x in enumerate(dp_overlap_bound(chains, overlap_slowdown)):
        bound[k] += x
    pre = param_fill_exposed(pchains, p, v, overlap_slowdown) if pchains else 0.0
    return _combine(busy, comp, dp, p2p, bound, opt, 1, training.accum_steps, p, v, pre,
                    f=overlap_slowdown)


def _combine(busy, comp, dp, p2p, bound, opt, m_plan, m, p, v, pre=None,
             f: float = 1.0) -> Analytic3D:
    """The pipeline formula of :func:`evaluate_3d` on per-stage sums over m_plan
    micro-batches. ``compute_s`` is the busiest stage's compute ops over the step, its
    optimizer step included (as the engine's busiest compute stream and the
    data-parallel path count it)."""

    # PaRO micro-step collectives beside the stage's busy time, which runs at 1/f meanwhile
    per = [overlapped_time(busy[k], dp[k], f) / m_plan for k in range(p)]
    t_max, t_mean = max(per), sum(per) / p
    hop = sum(p2p) / m_plan / (p * v - 1) if p * v > 1 else 0.0
    bubble = (p - 1) * t_mean / v
    pipeline = m * t_max + bubble + (p - 1) * hop
    boundary = max(bound)
    if pre is not None:   # DP communication overlap: the first forwards' exposed gathers
        boundary += pre
    compute = max(m * comp[k] / m_plan + opt[k] for k in range(p))
    return Analytic3D(pipeline + boundary, pipeline, bubble, boundary, compute, tuple(per))


@dataclass(frozen=True)
class PipelinePhase:
    """What a replay of a 3D plan measured (seconds), as :class:`Analytic3D` states it in
    closed form (docs/parallelism.md, "Bubble and exposed communication").

    ``pipeline_s``: the pipeline phase, from the first micro-batch op to the last one over
    all stages (the accumulation boundary follows it). ``stage_busy_s``: per stage, the time
    its compute stream runs micro-batch work (compute ops and the TP / CP collectives on that
    stream). ``compute_s``: the busiest stage's compute ops over the step, its optimizer
    step included."""

    pipeline_s: float
    stage_busy_s: tuple[float, ...]
    compute_s: float
    pp: int
    virtual: int
    micro_batches: int

    @property
    def bubble_s(self) -> float:
        """The pipeline's fill and drain: (p - 1) / v x the mean over stages of one
        micro-batch's busy time (0 with p = 1). Idle time from stage imbalance or waiting
        for communication is not bubble: it is exposed communication or the busiest
        stage's own time."""
        if self.pp <= 1 or not self.stage_busy_s:
            return 0.0
        mean = sum(self.stage_busy_s) / len(self.stage_busy_s) / self.micro_batches
        return (self.pp - 1) * mean / self.virtual

    @property
    def bubble_fraction(self) -> float:
        """``bubble_s`` / ``pipeline_s``."""
        return self.bubble_s / self.pipeline_s if self.pipeline_s > 0 else 0.0

    def exposed_comm_s(self, step_s: float) -> float:
        """``step - compute_s - bubble_s`` (>= 0)."""
        return max(0.0, step_s - self.compute_s - self.bubble_s)


_BOUNDARY_KINDS = ("optimizer", "sync-grad", "sync-param")


_COMPUTE_KINDS = ("fwd", "bwd", "recompute", "head-fwd", "head-bwd", "embed-fwd", "embed-bwd",
                  "optimizer")


def pipeline_phase(plan: Plan3D, spans, stage_compute_s=None,
                   stage_busy_s=None) -> PipelinePhase:
    """The :class:`PipelinePhase` of a replay from its ``spans``: (stream, kind, start s,
    end s) of the ops (the engine's records). ``stage_compute_s`` / ``stage_busy_s``: per
    stage, measured otherwise (per-rank timelines: the mean over the stage's ranks)."""
    busy = [0.0] * plan.pp
    comp = [0.0] * plan.pp
    lo, hi = math.inf, 0.0
    for stream, kind, start, end in spans:
        if not stream.startswith("compute/"):
            continue
        k = int(stream.rsplit("/s", 1)[1])
        # (sum + end) - start, as the replay's earlier measurement summed: bit-identical
        if kind in _COMPUTE_KINDS:
            comp[k] = comp[k] + end - start
        if kind not in _BOUNDARY_KINDS:
            busy[k] = busy[k] + end - start
            lo, hi = min(lo, start), max(hi, end)
    if stage_compute_s is not None:
        comp = list(stage_compute_s)
    if stage_busy_s is not None:
        busy = list(stage_busy_s)
    return PipelinePhase(hi - lo if hi > lo else 0.0, tuple(busy), max(comp, default=0.0),
                         plan.pp, plan.virtual, plan.accum_steps)


def replay_3d(plan: Plan3D, spec: ClusterSpec, algo: Algo, overlap_slowdown: float = 1.0,
              trace: bool = False):
    """Engine replay of a 3D plan on the layout's symmetric period: (the
    :class:`~parosim.evaluate.replay.ReplayResult`, its :class:`PipelinePhase`). The step
    driver (:mod:`parosim.simulate.step`) and the real-rank harness use it alike."""
    rep = replay(plan, spec, algo, overlap_slowdown, trace=True)   # plan_period: the layout's
    # symmetric period, or every node when a collective lowers to an NCCL tree
    phase = pipeline_phase(plan, [(r.lane, r.kind, r.start_s, r.end_s) for r in rep.records])
    if not trace:
        rep.records = []
    return rep, phase
