"""``parosim advise``: the fastest configurations of a model on a cluster for a global batch.

Search space (docs/advise.md, "Search space"; :mod:`parosim.studies.advise_space`): every
dimension is searched unless a flag fixes it (``--attention flash``, ``--precision fp8``,
``--runtime fsdp``, ``--tp 4``, ...; the flags and values of ``parosim simulate``):

* attention kernel: flash, eager;
* precision: bf16, and fp8 where the GPU has FP8 tensor cores;
* runtime profile: ideal (the closed-form schedule) and the bundled framework profiles
  (deepspeed, fsdp, paro; each with its own stages, buckets, overlap and memory model; with
  TP / PP only the strategies the profile runs there, :func:`parosim.plan.threed.check_runtime_3d`);
* TP degree t: the divisors of the GPUs per node (TP inside a node);
* PP degree p: divisors of the layer count with t·p dividing the GPUs; schedule 1F1B, and
  interleaved with v = 2 chunks when the layers split into 2p chunks and m is a multiple of p;
* CP degree c (context parallelism, flash attention only): 1, 2, 4, 8 with t·c·p dividing
  the GPUs and the sequence splitting into 2c chunks, from 8192 tokens per sequence on
  (shorter sequences: c = 1 unless ``--cp`` is given);
* sequence parallelism on / off (t > 1); ``--tp-comm-overlap`` / ``--dp-comm-overlap`` are
  fixed settings (not searched) applied where they can apply;
* recomputation: none, selective (attention core), full;
* the 14 PaRO strategies on the DP group, with PaRO groups of 1, 2, 4, ... nodes (strategies
  with an I level only; a layout whose DP groups do not split evenly is skipped);
* micro-batch b in 1, 2, 4, ... ``max_micro_batch``; accumulation m = B / (b·d) (B the global
  batch in sequences, d the DP degree), which must be a whole number;
* collective algorithm ring / hierarchical (PaRO-CC) / HO-Ring where they differ (a DP group
  with several ranks in a PaRO group and several groups), else ``ring``; a framework profile
  fixes its own.

Memory is tested with the fitted allocator margin of the Korthikanti estimate (the default
fidelity's, :data:`parosim.spec.training.KORTHIKANTI_MARGIN_FRACTION`; docs/memory.md).

Procedure: a compute-only upper bound of the throughput orders every configuration; from the
best bound down, each is tested for memory (what does not fit is dropped), and the search
stops where the bound falls below the top ``keep`` costed so far (the memory/throughput front
is that of the costed configurations); those that fit are costed in closed form
(:func:`parosim.evaluate.threed.summary_3d` for the ideal runtime, the analytic step of
:func:`parosim.simulate.simulate_step` for a framework profile); then the best are replayed on
the engine until the top ``top`` shown are all engine results (``engine_top`` None), or the
best ``engine_top`` only, shown apart from the closed-form ones. Counts (configurations, an
algorithm not counted): ``screened`` = ``pruned`` (bound below the top list, never tested) +
``not_fitting`` + ``fitting``; ``variants`` (the fitting configurations x their algorithms)
= ``evaluated`` + ``refused``; ``replayed`` of the evaluated ran on the engine.
"""

from __future__ import annotations

import bisect
import re
import time
from dataclasses import dataclass, field, replace

from ..collectives.types import Algo
from ..cost.compute import (
    head_backward_flops,
    head_forward_flops,
    layer_backward_flops,
    step_flops,
)
from ..cost.compute import layer_forward_flops as _lf
from ..cost.memory import memory_breakdown
from ..errors import InputError
from ..evaluate.threed import summary_3d
from ..io.runtime import training_for_runtime
from ..plan.layout import ParallelSpec, layout_for
from ..plan.memory3d import cp_local
from ..plan.threed import memory_3d, recompute_flops, training_for_runtime_3d
from ..plan.threed_parts import unit_seconds
from ..simulate.step import simulate_step
from ..spec.model import ModelSpec
from ..spec.runtime import effective_overlap_slowdown
from ..spec.strategy import Level, Strategy
from ..spec.system import ClusterSpec
from ..spec.training import KORTHIKANTI_MARGIN_FRACTION, TrainingSpec, efficiency_model
from ..units import fmt_count
from .advise_space import RECOMPUTE, Resolved, SearchSpace, resolve

#: the token budget GPU-hours are reported for when none is given (``--tokens``)
DEFAULT_TOKENS = 10**9
MAX_ENGINE_TOP = 20   # engine replays (each seconds to minutes): a bounded run
MAX_TOP = 1000        # configurations listed


def parse_global_batch(text: str | int, seq_len: int) -> int:
    """Global batch in sequences from ``2048``, ``2048seq``, ``4Mtok``, ``4194304tokens``.

    >>> parse_global_batch("2048", 2048), parse_global_batch("4Mtok", 2048)
    (2048, 2048)
    """
    raw = str(text).strip().lower().replace(" ", "")
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)([km]?)(seq|seqs|sequences|tok|tokens)?", raw)
    if not m:
        raise InputError(f"--global-batch {text!r} is not a batch; expected sequences (2048, "
                         "2048seq) or tokens (4Mtok, 4194304tokens)")
    value = float(m.group(1)) * {"": 1, "k": 2**10, "m": 2**20}[m.group(2)]
    if m.group(3) in ("tok", "tokens"):
        if value % seq_len:
            raise InputError(f"--global-batch {text!r} = {value:.0f} tokens is not a whole "
                             f"number of {seq_len}-token sequences")
        value /= seq_len
    if value != int(value) or value < 1:
        raise InputError(f"--global-batch {text!r} must be a positive whole number of "
                         "sequences")
    return int(value)


@dataclass
class Candidate:
    """One configuration and its figures (seconds, bytes, tokens/s)."""

    tp: int
    pp: int
    dp: int
    schedule: str
    virtual_stages: int
    sequence_parallel: bool
    strategy: str
    group_nodes: int
    micro_batch: int
    accum: int
    recompute: str
    algo: str
    tp_comm_overlap: bool = False
    dp_comm_overlap: bool = False
    cp: int = 1
    attention: str = "eager"
    precision: str = "bf16"
    runtime: str = "ideal"
    tokens_per_s: float = 0.0
    step_time_s: float = 0.0
    exposed_comm_s: float = 0.0
    bubble_fraction: float = 0.0
    compute_s: float = 0.0
    memory_bytes: float = 0.0
    capacity_bytes: float = 0.0
    mode: str = "analytic"
    analytic_tokens_per_s: float = 0.0
    tflops_per_gpu: float = 0.0
    mfu: float = 0.0
    gpu_hours: float = 0.0
    cost: float | None = None
    reason: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def headroom_bytes(self) -> float:
        return self.capacity_bytes - self.memory_bytes

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in (
            "tp", "pp", "cp", "dp", "strategy", "group_nodes", "micro_batch", "accum",
            "recompute", "algo", "schedule", "virtual_stages", "sequence_parallel",
            "tp_comm_overlap", "dp_comm_overlap", "attention", "precision", "runtime",
            "tokens_per_s", "step_time_s", "tflops_per_gpu", "mfu", "exposed_comm_s",
            "bubble_fraction", "compute_s", "memory_bytes", "capacity_bytes",
            "headroom_bytes", "mode", "analytic_tokens_per_s", "gpu_hours", "reason")}
        if self.cost is not None:
            d["cost"] = self.cost
        return d

    def label(self) -> str:
        sched = "" if self.pp == 1 else (" 1F1B" if self.virtual_stages == 1 else
                                         f" interleaved v={self.virtual_stages}")
        sp = (" +SP" if self.sequence_parallel else "") + (" +TP-overlap"
                                                          if self.tp_comm_overlap else "")
        sp += " +DP-overlap" if self.dp_comm_overlap else ""
        gn = f" groups of {self.group_nodes} nodes" if self.group_nodes > 1 else ""
        cp = f" CP{self.cp}" if self.cp > 1 else ""
        return (f"TP{self.tp} PP{self.pp}{sched}{cp} DP{self.dp}{sp} PaRO-{self.strategy}{gn} "
                f"b={self.micro_batch} m={self.accum} recompute={self.recompute} "
                f"{self.attention} {self.precision} runtime={self.runtime} {self.algo}")


def _structures(model: ModelSpec, cluster: ClusterSpec, space: Resolved, seq_len: int):
    """(tp, pp, cp, schedule, v, sp) tuples whose layout exists."""
    n = cluster.gpus
    for tp in space.tp:
        for pp in space.pp:
            for cp in space.cp:
                if n % (tp * pp * cp) or (cp > 1 and seq_len % (2 * cp)):
                    continue
                scheds = [("1f1b", 1)]
                if pp > 1 and model.layers % (2 * pp) == 0:
                    scheds.append(("interleaved", 2))
                for sched, v in scheds:
                    for sp in ((False, True) if tp > 1 else (False,)):
                        yield tp, pp, cp, sched, v, sp


def _compute_bound(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec,
                   par: ParallelSpec, recompute: bool, cache: dict) -> float:
    """Seconds per step if communication were free: m x busiest stage + the bubble. A lower
    bound of the step under every compute model: the flat model's FLOPs at ``--efficiency``,
    else the kernel / FP8 seconds of :func:`parosim.plan.threed_parts.unit_seconds`; one CP
    rank's s/c tokens (its attention over the other ranks' keys left out)."""
    local = cp_local(training, par)
    key = (par.tp, par.sequence_parallel, par.selective_recompute, par.cp, recompute,
           local.micro_batch, local.seq_len, local.attention, local.precision,
           local.compute_model)
    per_layer_head = cache.get(key)
    if per_layer_head is None:
        ks = unit_seconds(model, cluster, local, par, recompute)
        if ks is None:
            f_layer = (_lf(model, local) + layer_backward_flops(model, local)
                       + recompute_flops(model, local, recompute, par.selective_recompute))
            rate = cluster.gpu.peak_flops * local.compute_efficiency * par.tp
            head = (head_forward_flops(model, local) + head_backward_flops(model, local))
            per_layer_head = (f_layer / rate, head / rate)
        else:
            per_layer_head = (ks[("layer", "fwd")] + ks[("layer", "bwd")]
                              + ks[("layer", "recompute")],
                              ks[("head", "fwd")] + ks[("head", "bwd")])
        cache[key] = per_layer_head
    layer_s, head_s = per_layer_head
    per = model.layers // par.pp * layer_s
    last = per + head_s
    t_max, t_mean = last, (per * (par.pp - 1) + last) / par.pp
    return training.accum_steps * t_max + (par.pp - 1) * t_mean / par.virtual


def _algos(cluster: ClusterSpec, tp: int, pp: int, strategy: Strategy, rt,
           fixed: tuple[Algo, ...] | None) -> list[Algo]:
    if rt.collective_algo is not None:    # the framework fixes each call's algorithm
        return [Algo.RING]
    if fixed is not None:
        return list(fixed)
    lay = layout_for(cluster, tp, pp)
    uses_global = Level.G in (strategy.p, strategy.g, strategy.os) or (
        strategy.g is Level.N and strategy.os is Level.N)
    if uses_global and lay.m_dp > 1 and lay.d // lay.m_dp > 1:
        return [Algo.RING, Algo.HIERARCHICAL, Algo.HO_RING]
    return [Algo.RING]


def _runtime_applies(rt, is_ideal: bool, strat: Strategy, three_d: bool, cp: int) -> bool:
    """Whether a framework profile runs this strategy on this layout (check_runtime_3d)."""
    if is_ideal:
        return True
    if not rt.supports(strat.short):
        return False
    if three_d:
        return (cp == 1 and strat.p is Level.N and strat.g is Level.N
                and not rt.grad_sync_every_micro_step)
    return True


def advise(model: ModelSpec, cluster: ClusterSpec, global_batch: int, seq_len: int = 2048,
           top: int = 5, engine_top: int | None = None, max_micro_batch: int = 16,
           strategies: list[Strategy] | None = None, efficiency: float | None = None,
           engine_max_ops: int = 60_000, tp_comm_overlap: bool = False,
           dp_comm_overlap: bool = False, space: SearchSpace | None = None,
           compute_model: str | None = None, tokens: float | None = None,
           gpu_hour_price: float | None = None) -> dict:
    """Search the configurations (module docstring); return the ranked top ``top`` and every
    costed fitting point's (memory, throughput) for the Pareto plot. ``engine_top`` None:
    replay on the engine until the ``top`` shown are all engine results; an integer k: replay
    the best k only (``closed_form_candidates`` then holds the best of the rest, apart).
    ``tokens``: the budget GPU-hours (and, with ``gpu_hour_price`` per GPU-hour, the cost)
    are given for (default 1B tokens)."""

    model.require_shape("advise")
    if cluster.compute_heterogeneous or cluster.jitter_cv > 0 or not cluster.closed_form_exact:
        why = ("GPU overrides (speed, type or memory)" if cluster.compute_heterogeneous
               else f"compute jitter (jitter.cv = {cluster.jitter_cv:g})"
               if cluster.jitter_cv > 0 else "link overrides (bandwidth, latency or a failed "
               "link)" if cluster.network_heterogeneous else "ECMP hashing")
        raise InputError(f"parosim advise ranks layouts with the closed form of identical "
                         f"ranks and links; cluster {cluster.name!r} has {why}, where it does "
                         "not hold; expected a cluster without them (parosim simulate --mode "
                         "engine models it for a given configuration)")
    for name, v in (("--top", top), ("--max-micro-batch", max_micro_batch)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(f"{name} = {v!r} must be a positive integer")
    if engine_top is not None and (isinstance(engine_top, bool)
                                   or not isinstance(engine_top, int) or engine_top < 0):
        raise InputError(f"--engine-top = {engine_top!r} must be a non-negative integer")
    if engine_top is not None and engine_top > MAX_ENGINE_TOP:
        raise InputError(f"--engine-top = {engine_top} replays more than {MAX_ENGINE_TOP} "
                         "configurations on the engine (seconds to minutes each); expected "
                         f"at most {MAX_ENGINE_TOP}")
    if top > MAX_TOP:
        raise InputError(f"--top = {top} is more than {MAX_TOP}; expected at most {MAX_TOP} "
                         "configurations")
    if global_batch < 1:
        raise InputError(f"--global-batch = {global_batch!r} must be positive")
    budget = DEFAULT_TOKENS if tokens is None else tokens
    if not budget > 0:
        raise InputError(f"--tokens = {tokens!r} must be positive")
    if gpu_hour_price is not None and not 0 <= gpu_hour_price < float("inf"):
        raise InputError(f"--gpu-hour-price = {gpu_hour_price!r} must be a non-negative "
                         "number (currency per GPU-hour)")
    compute_model = efficiency_model(compute_model, efficiency)
    if compute_model is None:   # as simulate's accurate default: the kernel model, unless the
        # cluster YAML states its compute model
        compute_model = cluster.compute.model if cluster.compute.model_given else "kernel"
    t0 = time.perf_counter()
    space = space or SearchSpace()
    if strategies:
        space = replace(space, strategy=tuple(strategies))
    rs = resolve(space, model, cluster, max_micro_batch, seq_len)
    base = TrainingSpec(seq_len=seq_len, compute_model=compute_model,
                        korthikanti_margin=KORTHIKANTI_MARGIN_FRACTION,
                        **({} if efficiency is None else {"compute_efficiency": efficiency}))
    keep = 3 * max(top, engine_top or 0)   # room for the algorithm variants dropped at the end
    ideal = [rt.is_ideal for rt in rs.runtimes]
    clusters: dict[int, ClusterSpec | None] = {}
    trainings: dict[tuple, TrainingSpec] = {}
    bound_cache: dict = {}

    def cluster_of(gn: int, tp: int, pp: int) -> ClusterSpec | None:
        """The cluster with PaRO groups of gn nodes, None where the layout does not split."""
        key = (gn, tp, pp)
        if key not in clusters:
            cl = cluster.with_group_nodes(gn)
            try:
                layout_for(cl, tp, pp)
            except InputError:
                cl = None
            clusters[key] = cl
        return clusters[key]

    def training_of(rc: str, prec: str, att: str, b: int, m: int) -> TrainingSpec:
        key = (rc, prec, att, b, m)
        if key not in trainings:
            trainings[key] = replace(base, attention=att, precision=prec,
                                     recompute=rc == "full", micro_batch=b, accum_steps=m)
        return trainings[key]

    combos: dict[tuple, list[tuple[int, int, int]]] = {}

    def variants_of(tp: int, pp: int, cp: int, three_d: bool) -> list[tuple[int, int, int]]:
        """(runtime, strategy, group nodes) indices of a layout, in the search's order."""
        key = (tp, pp, cp, three_d)
        if key not in combos:
            combos[key] = [
                (ri, si, gn) for ri, rt in enumerate(rs.runtimes)
                for si, strat in enumerate(rs.strategies)
                if _runtime_applies(rt, ideal[ri], strat, three_d, cp)
                for gn in (rs.group_nodes if Level.I in (strat.p, strat.g, strat.os) else (1,))
                if cluster_of(gn, tp, pp) is not None]
        return combos[key]

    # 1. every configuration and its compute bound (no memory test yet)
    entries: list[tuple[float, int, tuple]] = []
    for tp, pp, cp, sched, v, sp in _structures(model, cluster, rs, seq_len):
        d = cluster.gpus // (tp * pp * cp)
        for rc in rs.recompute:
            three_d = tp > 1 or pp > 1 or cp > 1 or rc == "selective"
            par0 = ParallelSpec(tp=tp, pp=pp, schedule=sched, virtual=v, cp=cp,
                                sequence_parallel=sp, selective_recompute=rc == "selective",
                                tp_comm_overlap=sp and bool(tp_comm_overlap))
            for prec in rs.precision:
                for att in rs.attention:
                    if cp > 1 and att == "eager":
                        continue          # context parallelism runs with flash attention only
                    for b in rs.micro_batch:
                        if global_batch % (b * d):
                            continue
                        m = global_batch // (b * d)
                        if sched == "interleaved" and m % pp:
                            continue
                        tr = training_of(rc, prec, att, b, m)
                        try:
                            ub = global_batch * seq_len / _compute_bound(
                                model, tr, cluster, par0, rc == "full", bound_cache)
                        except InputError:
                            continue      # e.g. t not dividing the heads (kernel model)
                        for ri, si, gn in variants_of(tp, pp, cp, three_d):
                            entries.append((-ub, len(entries), (
                                tp, pp, cp, sched, v, sp, rc, prec, att, b, m, ri, si, gn,
                                three_d, d)))
    screened = len(entries)
    if not entries:
        ds = sorted({cluster.gpus // (tp * pp * cp)
                     for tp, pp, cp, *_ in _structures(model, cluster, rs, seq_len)}) or [
            cluster.gpus]
        raise InputError(
            f"--global-batch {global_batch} sequences has no layout on {cluster.gpus} GPUs in "
            f"the search space: it is not a multiple of micro-batch "
            f"({', '.join(map(str, rs.micro_batch))}) x any data-parallel degree "
            f"({', '.join(map(str, ds))}); expected a global batch divisible by one of them, "
            f"e.g. {-(-global_batch // ds[0]) * ds[0]} (a divisibility problem, not memory)")
    entries.sort()
    # 2. best bound first: memory test, then the closed form, until no bound beats the top
    best: list[Candidate] = []
    front_mem: list[float] = []     # Pareto front of the costed points: memory ascending,
    front_tps: list[float] = []     # throughput ascending
    points: list[tuple[float, float]] = []
    pool: list[tuple[Candidate, tuple]] = []
    fitting = not_fitting = evaluated = refused = variants = 0
    pruned = 0
    slow_ideal = effective_overlap_slowdown(None, getattr(cluster, "overlap_slowdown", None),
                                            None)
    for k, (neg_ub, _, e) in enumerate(entries):
        ub = -neg_ub
        if len(best) >= keep and ub <= best[-1].tokens_per_s:
            pruned = screened - k     # this bound and every later one: none can enter the top
            break
        tp, pp, cp, sched, v, sp, rc, prec, att, b, m, ri, si, gn, three_d, d = e
        rt, strat = rs.runtimes[ri], rs.strategies[si]
        cl = cluster_of(gn, tp, pp)
        par = ParallelSpec(tp=tp, pp=pp, schedule=sched, virtual=v, cp=cp,
                           sequence_parallel=sp, selective_recompute=rc == "selective",
                           tp_comm_overlap=sp and bool(tp_comm_overlap),
                           dp_comm_overlap=bool(dp_comm_overlap) and ideal[ri]
                           and (tp > 1 or pp > 1) and strat.p is Level.N
                           and strat.g is Level.N)
        tr = training_of(rc, prec, att, b, m)
        try:
            mem = _memory(model, strat, cl, tr, par, rt, ideal[ri], three_d)
        except InputError:
            mem = None
        if mem is None or not mem.fits:
            not_fitting += 1
            continue
        fitting += 1
        for algo in _algos(cl, tp, pp, strat, rt, rs.algos):
            variants += 1
            c = Candidate(tp, pp, d, sched, v, sp, strat.short, gn, b, m, rc, algo.value,
                          par.tp_comm_overlap, par.dp_comm_overlap, cp, att, prec, rt.name,
                          memory_bytes=mem.total_bytes, capacity_bytes=mem.capacity_bytes)
            try:
                if ideal[ri]:
                    an = summary_3d(model, strat, cl, tr, par, algo, rc == "full", slow_ideal)
                    c.step_time_s, c.exposed_comm_s = an.step_time_s, an.exposed_comm_s
                    c.compute_s, c.bubble_fraction = an.compute_s, an.bubble_fraction
                else:
                    r = simulate_step(model, cl, strat, tr, algo, "analytic", runtime=rt,
                                      parallel=par if three_d else None)
                    if not r.fits:
                        raise InputError("does not fit")
                    c.step_time_s, c.exposed_comm_s = r.step_time_s, r.exposed_comm_s
                    c.compute_s = r.compute_s
                    c.bubble_fraction = (getattr(r, "parallel", None) or {}).get(
                        "bubble_fraction") or 0.0
                    c.tflops_per_gpu = r.tflops_per_gpu
            except InputError:
                refused += 1    # a combination the model refuses
                continue
            evaluated += 1
            c.tokens_per_s = c.analytic_tokens_per_s = global_batch * seq_len / c.step_time_s
            pool.append((c, (cl, tr, par, strat, algo, rt, three_d)))
            points.append((c.memory_bytes, c.tokens_per_s))
            j = bisect.bisect_right(front_mem, c.memory_bytes)
            if not (j > 0 and front_tps[j - 1] >= c.tokens_per_s):
                front_mem.insert(j, c.memory_bytes)
                front_tps.insert(j, c.tokens_per_s)
                i = j + 1
                while i < len(front_mem) and front_tps[i] <= c.tokens_per_s:
                    del front_mem[i], front_tps[i]
            best.append(c)
            best.sort(key=lambda x: -x.tokens_per_s)
            del best[keep:]
    if not best:
        raise InputError(f"no configuration of {model.name} fits on {cluster.gpus} GPUs of "
                         f"{cluster.name} with a global batch of {global_batch} sequences "
                         f"(screened {screened}, {not_fitting} do not fit, {refused} refused "
                         "by the model); expected more GPUs, a smaller model or another batch")
    setups = {id(c): s for c, s in pool}

    def replay(c: Candidate) -> None:
        cl, tr, par, strat, algo, rt, three_d = setups[id(c)]
        if _plan_ops(model, tr, par, strat) > engine_max_ops:
            c.mode = "analytic (plan too large for the engine)"
            return
        r = simulate_step(model, cl, strat, tr, algo, "engine", runtime=rt,
                          parallel=par if three_d else None)
        c.mode = "engine"
        c.step_time_s, c.exposed_comm_s, c.compute_s = (r.step_time_s, r.exposed_comm_s,
                                                        r.compute_s)
        c.tokens_per_s = r.tokens_per_s
        c.tflops_per_gpu = r.tflops_per_gpu
        c.bubble_fraction = (getattr(r, "parallel", None) or {}).get("bubble_fraction") or 0.0

    ranked = _distinct(best)
    replayed = 0
    if engine_top is None:     # until the shown top are all engine results (at most
        attempts = 0           # MAX_ENGINE_TOP replays; what is left is listed apart)
        while attempts < MAX_ENGINE_TOP:
            eligible = [c for c in ranked if c.mode in ("engine", "analytic")]
            todo = [c for c in eligible[:top] if c.mode == "analytic"]
            if not todo:
                break
            for c in todo[:MAX_ENGINE_TOP - attempts]:
                replay(c)
                attempts += 1
                replayed += c.mode == "engine"
            ranked = _distinct(ranked)
        shown = [c for c in ranked if c.mode == "engine"][:top]
        apart = [c for c in ranked if c.mode not in ("engine",)][:max(0, top - len(shown))]
    else:
        for c in ranked[:engine_top]:
            replay(c)
            replayed += c.mode == "engine"
        ranked = _distinct(ranked)
        if replayed:
            shown = [c for c in ranked if c.mode == "engine"][:top]
            apart = [c for c in ranked if c.mode != "engine"][:top]
        else:
            shown, apart = ranked[:top], []
    for c in shown + apart:
        cl, tr, par, strat, algo, rt, three_d = setups[id(c)]
        if not c.tflops_per_gpu:
            c.tflops_per_gpu = _hw_flops_per_gpu(model, tr, par, c.recompute) / c.step_time_s
        # model FLOPs (6 Psi + attention, no recomputation) over the peak, as simulate's MFU
        c.mfu = (step_flops(model, tr, global_batch * seq_len / cluster.gpus)
                 / c.step_time_s / cluster.gpu.peak_flops)
        c.gpu_hours = budget / c.tokens_per_s * cluster.gpus / 3600
        if gpu_hour_price is not None:
            c.cost = c.gpu_hours * gpu_hour_price
    _reasons(shown)
    _reasons(apart)
    front = sorted(zip(front_mem, front_tps, strict=True))
    out = {"model": model.name, "cluster": cluster.name, "gpus": cluster.gpus,
           "nodes": cluster.nodes, "global_batch_sequences": global_batch,
           "seq_len": seq_len, "screened": screened, "pruned": pruned,
           "not_fitting": not_fitting, "fitting": fitting, "variants": variants,
           "evaluated": evaluated, "refused": refused, "replayed": replayed,
           "ranked_by": ("engine" if shown and all(c.mode == "engine" for c in shown)
                         else "closed form"),
           "search_space": rs.searched(), "tokens": budget, "compute_model": compute_model,
           "wall_s": time.perf_counter() - t0,
           "candidates": [c.to_dict() for c in shown], "points": points,
           "pareto_front": front,
           "top_labels": [c.label() for c in shown]}
    if apart:
        out["closed_form_candidates"] = [c.to_dict() for c in apart]
        out["closed_form_labels"] = [c.label() for c in apart]
    if gpu_hour_price is not None:
        out["gpu_hour_price"] = gpu_hour_price
    return out


def _memory(model, strat, cl, tr, par, rt, is_ideal, three_d):
    """The memory test of one configuration: the 3D estimate (ideal runtime, or a profile's
    attention and logit bytes on TP / PP), else the data-parallel planner's under the
    profile (its memory model)."""
    if is_ideal:
        return memory_3d(model, strat, cl, tr, par)
    if three_d:
        return memory_3d(model, strat, cl, training_for_runtime_3d(tr, rt), par)
    return memory_breakdown(model, strat, cl, training_for_runtime(tr, rt), rt)


def _distinct(cands: list[Candidate]) -> list[Candidate]:
    """One line per configuration (its best collective algorithm), best first; on equal
    throughput the one with less recomputation, then less memory."""
    cands = sorted(cands, key=lambda x: (-x.tokens_per_s, RECOMPUTE.index(x.recompute),
                                         x.memory_bytes))
    seen, out = set(), []
    for c in cands:
        key = c.label().rsplit(" ", 1)[0]
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def _plan_ops(model: ModelSpec, tr: TrainingSpec, par: ParallelSpec, strat: Strategy) -> int:
    """Rough op count of the full plan (to keep engine runs interactive)."""
    per_unit = not (strat.p is Level.N and strat.g is Level.N)
    units = (model.layers + 2) if per_unit else par.chunks
    ovl = 24 if par.tp_comm_overlap else 0   # 3 ops per overlapped collective, 8 per layer
    dpo = 2 * (model.layers + 2) * (8 + ovl) if par.dp_comm_overlap else 0   # bucketed passes
    return tr.accum_steps * units * ((8 if per_unit else 6) + ovl) + dpo


def _hw_flops_per_gpu(model, tr, par, rc) -> float:
    f = (_lf(model, tr) + layer_backward_flops(model, tr)
         + recompute_flops(model, tr, rc == "full", rc == "selective"))
    f = f * model.layers + head_forward_flops(model, tr) + head_backward_flops(model, tr)
    return f * tr.accum_steps / (par.tp * par.pp * par.cp) / 1e12


def _reasons(best: list[Candidate]) -> None:
    """Why each is where it is: its losses, and what it gains over the next one."""
    for i, c in enumerate(best):
        losses = [f"exposed communication {c.exposed_comm_s:.2f} s "
                  f"({100 * c.exposed_comm_s / c.step_time_s:.0f} % of the step)",
                  f"bubble {100 * c.bubble_fraction:.1f} %",
                  f"memory headroom {c.headroom_bytes / 2**30:.1f} GiB"]
        why = ""
        if i + 1 < len(best):
            n = best[i + 1]
            diffs = {"less exposed communication": n.exposed_comm_s - c.exposed_comm_s,
                     "a smaller bubble": (n.bubble_fraction * n.step_time_s
                                          - c.bubble_fraction * c.step_time_s),
                     "less compute (recomputation, efficiency)": n.compute_s - c.compute_s}
            k = max(diffs, key=diffs.get)
            if diffs[k] > 0:
                why = f"beats #{i + 2} by {k} ({diffs[k]:.2f} s per step); "
        c.reason = why + "; ".join(losses)


def format_advice(res: dict) -> str:
    """The text of an advice: the counts (each a number of configurations), how the list is
    ranked, one line per configuration and its reason (columns in docs/advise.md)."""
    n = res["screened"]
    lines = [f"{res['model']} on {res['cluster']} ({res['gpus']} GPUs), global batch "
             f"{res['global_batch_sequences']} x {res['seq_len']} tokens "
             f"({res['wall_s']:.1f} s):",
             f"  {n:,} configurations in the search space: {res['pruned']:,} pruned (compute "
             f"bound below the top list), {res['not_fitting']:,} do not fit in memory, "
             f"{res['fitting']:,} fit",
             f"  {res['variants']:,} fitting configuration x collective algorithm variants: "
             f"{res['evaluated']:,} costed in closed form"
             + (f", {res['refused']:,} refused by the model" if res.get("refused") else "")
             + f"; {res['replayed']:,} replayed on the engine"]
    price = res.get("gpu_hour_price")
    tok = fmt_count(res["tokens"])
    head = (f"{'#':>2} {'tokens/s':>10} {'TFLOPS':>7} {'step s':>8} {'mem GiB':>7} "
            f"{'GPU-h':>9} " + (f"{'cost':>10} " if price is not None else "")
            + f"{'mode':<8} configuration")

    def table(cands, labels, title):
        lines.append(title)
        lines.append(head)
        for i, (c, lab) in enumerate(zip(cands, labels, strict=True), 1):
            cost = f"{c['cost']:>10,.0f} " if price is not None else ""
            lines.append(f"{i:>2} {c['tokens_per_s']:>10.0f} {c['tflops_per_gpu']:>7.1f} "
                         f"{c['step_time_s']:>8.3f} {c['memory_bytes'] / 2**30:>7.1f} "
                         f"{c['gpu_hours']:>9,.0f} {cost}{c['mode'][:8]:<8} {lab}")
            lines.append(f"{'':>3}why: {c['reason']}")

    cands = res["candidates"]
    if cands and all(c["mode"] == "engine" for c in cands):
        title = (f"top {len(cands)}, ranked by the engine's step time (each replayed on the "
                 "engine)")
    else:
        title = f"top {len(cands)}, ranked by the closed form (none replayed on the engine)"
    table(cands, res["top_labels"], title)
    if res.get("closed_form_candidates"):
        table(res["closed_form_candidates"], res["closed_form_labels"],
              "costed in closed form only (not replayed on the engine; not comparable with "
              "the list above)")
    lines.append(f"GPU-h: GPU-hours for {tok} tokens at that throughput, without failures"
                 + (f"; cost: GPU-h x {price:g} per GPU-hour" if price is not None else "")
                 + "; mem GiB: peak memory per GPU (2**30 bytes)")
    if res.get("plot"):
        lines.append(f"Pareto plot written to {res['plot']}")
    return "\n".join(lines)
