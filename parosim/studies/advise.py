"""``parosim advise``: the fastest configurations of a model on a cluster for a global batch.

Search space (docs/parallelism.md, "advise"):

* TP degree t: the divisors of the GPUs per node (TP inside a node);
* PP degree p: divisors of the layer count with t·p dividing the GPUs; schedule 1F1B, and
  interleaved with v = 2 chunks when the layers split into 2p chunks and m is a multiple of p;
* sequence parallelism on / off (t > 1); with ``tp_comm_overlap`` (``--tp-comm-overlap``, a
  fixed setting, not searched) every sequence-parallel configuration runs with Megatron-Core's
  TP communication overlap (configurations without sequence parallelism cannot have it);
  with ``dp_comm_overlap`` (``--dp-comm-overlap``, fixed, not searched) every configuration
  with t or p > 1 and PaRO NNN, NNI or NNG runs with Megatron-Core's DP communication overlap
  (the others cannot have it);
* recomputation: none, selective (attention core), full;
* the 14 PaRO strategies on the DP group, with PaRO groups of 1, 2, 4, ... nodes (strategies
  with an I level only; a layout whose DP groups do not split evenly is skipped);
* micro-batch b in 1, 2, 4, ... ``max_micro_batch``; accumulation m = B / (b·d) (B the global
  batch in sequences, d the DP degree), which must be a whole number;
* collective algorithm ring / hierarchical (PaRO-CC) / HO-Ring where they differ (a DP group
  with several ranks in a PaRO group and several groups), else ``ring``.

Procedure: memory first (cheap; what does not fit is dropped); then a compute-only upper
bound of the throughput orders the survivors and prunes those that cannot enter the top
``keep``; the rest are costed by the closed form (:func:`parosim.plan.threed.evaluate_3d`, or
:func:`parosim.simulate.simulate_step` analytic for plain data parallelism); the best
``engine_top`` are replayed on the engine and the list re-ranked by the engine's figure.
"""

from __future__ import annotations

import bisect
import re
import time
from dataclasses import dataclass, field, replace

from ..collectives.types import Algo
from ..cost.compute import head_backward_flops, head_forward_flops, layer_backward_flops
from ..cost.compute import layer_forward_flops as _lf
from ..errors import InputError
from ..evaluate.threed import summary_3d
from ..plan.layout import ParallelSpec, layout_for
from ..plan.threed import memory_3d, recompute_flops
from ..simulate.step import simulate_step
from ..spec.model import ModelSpec
from ..spec.runtime import effective_overlap_slowdown
from ..spec.strategy import ALL_STRATEGIES, Level, Strategy, parse_strategy
from ..spec.system import ClusterSpec
from ..spec.training import TrainingSpec

RECOMPUTE = ("none", "selective", "full")
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
    reason: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def headroom_bytes(self) -> float:
        return self.capacity_bytes - self.memory_bytes

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in (
            "tp", "pp", "dp", "strategy", "group_nodes", "micro_batch", "accum", "recompute",
            "algo", "schedule", "virtual_stages", "sequence_parallel", "tp_comm_overlap",
            "dp_comm_overlap", "tokens_per_s",
            "step_time_s", "tflops_per_gpu", "exposed_comm_s", "bubble_fraction",
            "compute_s", "memory_bytes", "capacity_bytes", "headroom_bytes", "mode",
            "analytic_tokens_per_s", "reason")}
        return d

    def label(self) -> str:
        sched = "" if self.pp == 1 else (" 1F1B" if self.virtual_stages == 1 else
                                         f" interleaved v={self.virtual_stages}")
        sp = (" +SP" if self.sequence_parallel else "") + (" +TP-overlap"
                                                          if self.tp_comm_overlap else "")
        sp += " +DP-overlap" if self.dp_comm_overlap else ""
        gn = f" groups of {self.group_nodes} nodes" if self.group_nodes > 1 else ""
        return (f"TP{self.tp} PP{self.pp}{sched} DP{self.dp}{sp} PaRO-{self.strategy}{gn} "
                f"b={self.micro_batch} m={self.accum} recompute={self.recompute} "
                f"{self.algo}")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _structures(model: ModelSpec, cluster: ClusterSpec):
    """(tp, pp, schedule, v, sp) tuples whose layout exists."""
    n, gpn = cluster.gpus, cluster.gpus_per_node
    for tp in _divisors(gpn):
        for pp in _divisors(model.layers):
            if n % (tp * pp):
                continue
            scheds = [("1f1b", 1)]
            if pp > 1 and model.layers % (2 * pp) == 0:
                scheds.append(("interleaved", 2))
            for sched, v in scheds:
                for sp in ((False, True) if tp > 1 else (False,)):
                    yield tp, pp, sched, v, sp


def _compute_bound(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec,
                   par: ParallelSpec, recompute: bool) -> float:
    """Seconds per step if communication were free: m x busiest stage + the bubble."""
    f_layer = (_lf(model, training) + layer_backward_flops(model, training)
               + recompute_flops(model, training, recompute, par.selective_recompute))
    per = model.layers // par.pp * f_layer
    last = per + head_forward_flops(model, training) + head_backward_flops(model, training)
    rate = cluster.gpu.peak_flops * training.compute_efficiency * par.tp
    t_max, t_mean = last / rate, (per * (par.pp - 1) + last) / par.pp / rate
    return training.accum_steps * t_max + (par.pp - 1) * t_mean / par.virtual


def _algos(cluster: ClusterSpec, tp: int, pp: int, strategy: Strategy) -> list[Algo]:
    lay = layout_for(cluster, tp, pp)
    uses_global = Level.G in (strategy.p, strategy.g, strategy.os) or (
        strategy.g is Level.N and strategy.os is Level.N)
    if uses_global and lay.m_dp > 1 and lay.d // lay.m_dp > 1:
        return [Algo.RING, Algo.HIERARCHICAL, Algo.HO_RING]
    return [Algo.RING]


def advise(model: ModelSpec, cluster: ClusterSpec, global_batch: int, seq_len: int = 2048,
           top: int = 5, engine_top: int = 3, max_micro_batch: int = 16,
           strategies: list[Strategy] | None = None, efficiency: float | None = None,
           engine_max_ops: int = 60_000, tp_comm_overlap: bool = False,
           dp_comm_overlap: bool = False) -> dict:
    """Search the configurations (module docstring); return the ranked top ``top`` and every
    screened fitting point's (memory, throughput) for the Pareto plot."""

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
    if isinstance(engine_top, bool) or not isinstance(engine_top, int) or engine_top < 0:
        raise InputError(f"--engine-top = {engine_top!r} must be a non-negative integer")
    if engine_top > MAX_ENGINE_TOP:
        raise InputError(f"--engine-top = {engine_top} replays more than {MAX_ENGINE_TOP} "
                         "configurations on the engine (seconds to minutes each); expected "
                         f"at most {MAX_ENGINE_TOP}")
    if top > MAX_TOP:
        raise InputError(f"--top = {top} is more than {MAX_TOP}; expected at most {MAX_TOP} "
                         "configurations")
    if global_batch < 1:
        raise InputError(f"--global-batch = {global_batch!r} must be positive")
    t0 = time.perf_counter()
    strategies = [parse_strategy(s) for s in (strategies or ALL_STRATEGIES)]
    base = TrainingSpec(seq_len=seq_len, **({} if efficiency is None else
                                            {"compute_efficiency": efficiency}))
    group_options = [g for g in _divisors(cluster.nodes) if g <= 8]
    slow = effective_overlap_slowdown(None, getattr(cluster, "overlap_slowdown", None), None)
    keep = 3 * max(top, engine_top)   # room for the algorithm variants dropped at the end
    screened = fitting = 0
    pool: list[tuple[float, Candidate, tuple]] = []   # (upper bound tokens/s, cand, setup)
    points: list[tuple[float, float]] = []
    for tp, pp, sched, v, sp in _structures(model, cluster):
        d = cluster.gpus // (tp * pp)
        for rc in RECOMPUTE:
            if rc == "selective" and pp == 1 and tp == 1 and False:
                continue
            for strat in strategies:
                has_i = Level.I in (strat.p, strat.g, strat.os)
                for gn in (group_options if has_i else [1]):
                    cl = cluster.with_group_nodes(gn)
                    try:
                        layout_for(cl, tp, pp)
                    except InputError:
                        continue
                    par = ParallelSpec(tp=tp, pp=pp, schedule=sched, virtual=v,
                                       sequence_parallel=sp,
                                       selective_recompute=rc == "selective",
                                       tp_comm_overlap=sp and bool(tp_comm_overlap),
                                       dp_comm_overlap=bool(dp_comm_overlap)
                                       and (tp > 1 or pp > 1) and strat.p is Level.N
                                       and strat.g is Level.N)
                    b = 1
                    while b <= max_micro_batch:
                        if global_batch % (b * d):
                            b *= 2
                            continue
                        m = global_batch // (b * d)
                        if sched == "interleaved" and m % pp:
                            b *= 2
                            continue
                        tr = replace(base, micro_batch=b, accum_steps=m,
                                     recompute=rc == "full")
                        screened += 1
                        mem = memory_3d(model, strat, cl, tr, par)
                        if not mem.fits:
                            break               # memory grows with b
                        fitting += 1
                        ub = global_batch * seq_len / _compute_bound(model, tr, cl, par,
                                                                     rc == "full")
                        for algo in _algos(cl, tp, pp, strat):
                            c = Candidate(tp, pp, d, sched, v, sp, strat.short, gn, b, m, rc,
                                          algo.value, par.tp_comm_overlap,
                                          par.dp_comm_overlap,
                                          memory_bytes=mem.total_bytes,
                                          capacity_bytes=mem.capacity_bytes)
                            pool.append((ub, c, (cl, tr, par, strat, algo)))
                        b *= 2
    if not pool and not screened:
        ds = sorted({cluster.gpus // (tp * pp) for tp, pp, *_ in _structures(model, cluster)})
        raise InputError(
            f"--global-batch {global_batch} sequences has no layout on {cluster.gpus} GPUs: it "
            f"is not a multiple of micro-batch (1 .. {max_micro_batch}) x any data-parallel "
            f"degree ({', '.join(map(str, ds))}); expected a global batch divisible by one of "
            f"them, e.g. {-(-global_batch // ds[0]) * ds[0]} (a divisibility problem, not "
            "memory)")
    if not pool:
        raise InputError(f"no configuration of {model.name} fits on {cluster.gpus} GPUs of "
                         f"{cluster.name} with a global batch of {global_batch} sequences "
                         f"(screened {screened}); expected more GPUs, a smaller model or "
                         "another batch")
    pool.sort(key=lambda x: -x[0])
    best: list[Candidate] = []
    front_mem: list[float] = []     # Pareto front of the costed points: memory ascending,
    front_tps: list[float] = []     # throughput ascending
    evaluated = pruned = 0
    for ub, c, (cl, tr, par, strat, algo) in pool:
        i = bisect.bisect_right(front_mem, c.memory_bytes)
        dominated = i > 0 and front_tps[i - 1] >= ub
        if dominated and len(best) >= keep and ub <= best[-1].tokens_per_s:
            pruned += 1     # cannot be in the top list nor on the memory/throughput front
            continue
        evaluated += 1
        an = summary_3d(model, strat, cl, tr, par, algo, c.recompute == "full", slow)
        c.step_time_s, c.exposed_comm_s = an.step_time_s, an.exposed_comm_s
        c.compute_s, c.bubble_fraction = an.compute_s, an.bubble_fraction
        c.tokens_per_s = c.analytic_tokens_per_s = global_batch * seq_len / c.step_time_s
        points.append((c.memory_bytes, c.tokens_per_s))
        j = bisect.bisect_right(front_mem, c.memory_bytes)
        if not (j > 0 and front_tps[j - 1] >= c.tokens_per_s):
            front_mem.insert(j, c.memory_bytes)
            front_tps.insert(j, c.tokens_per_s)
            k = j + 1
            while k < len(front_mem) and front_tps[k] <= c.tokens_per_s:
                del front_mem[k], front_tps[k]
        best.append(c)
        best.sort(key=lambda x: -x.tokens_per_s)
        del best[keep:]
    def distinct(cands: list[Candidate]) -> list[Candidate]:
        """One line per configuration (its best collective algorithm); on equal throughput
        the one with less recomputation."""
        cands = sorted(cands, key=lambda x: (-x.tokens_per_s, RECOMPUTE.index(x.recompute)))
        seen, out = set(), []
        for c in cands:
            key = c.label().rsplit(" ", 1)[0]
            if key not in seen:
                seen.add(key)
                out.append(c)
        return out

    best = distinct(best)[:max(top, engine_top)]
    # the engine for the best few, then the final ranking
    setups = {id(c): s for _, c, s in pool}
    for c in best[:engine_top]:
        cl, tr, par, strat, algo = setups[id(c)]
        if _plan_ops(model, tr, par, strat) > engine_max_ops:
            c.mode = "analytic (plan too large for the engine)"
            continue
        r = simulate_step(model, cl, strat, tr, algo, "engine", parallel=par)
        c.mode = "engine"
        c.step_time_s, c.exposed_comm_s, c.compute_s = (r.step_time_s, r.exposed_comm_s,
                                                        r.compute_s)
        c.tokens_per_s = r.tokens_per_s
        c.tflops_per_gpu = r.tflops_per_gpu
        c.bubble_fraction = getattr(r, "parallel", {}).get("bubble_fraction") or 0.0
    for c in best:
        if not c.tflops_per_gpu:
            cl, tr, par, strat, algo = setups[id(c)]
            c.tflops_per_gpu = _hw_flops_per_gpu(model, tr, par, c.recompute) / c.step_time_s
    best = distinct(best)[:top]
    _reasons(best)
    front = sorted(zip(front_mem, front_tps, strict=True))
    return {"model": model.name, "cluster": cluster.name, "gpus": cluster.gpus,
            "nodes": cluster.nodes, "global_batch_sequences": global_batch,
            "seq_len": seq_len, "screened": screened, "fitting": fitting,
            "evaluated": evaluated, "pruned": pruned, "wall_s": time.perf_counter() - t0,
            "candidates": [c.to_dict() for c in best], "points": points,
            "pareto_front": front,
            "top_labels": [c.label() for c in best]}


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
    return f * tr.accum_steps / (par.tp * par.pp) / 1e12


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
    lines = [f"{res['model']} on {res['cluster']} ({res['gpus']} GPUs), global batch "
             f"{res['global_batch_sequences']} x {res['seq_len']} tokens: screened "
             f"{res['screened']} configurations, {res['fitting']} fit, {res['evaluated']} "
             f"costed in closed form, best replayed on the engine ({res['wall_s']:.1f} s)",
             f"{'#':>2} {'tokens/s':>10} {'TFLOPS':>7} {'step s':>8} {'mem GiB':>7} {'mode':<8} "
             "configuration"]
    for i, (c, lab) in enumerate(zip(res["candidates"], res["top_labels"], strict=True), 1):
        lines.append(f"{i:>2} {c['tokens_per_s']:>10.0f} {c['tflops_per_gpu']:>7.1f} "
                     f"{c['step_time_s']:>8.3f} {c['memory_bytes'] / 2**30:>7.1f} "
                     f"{c['mode'][:8]:<8} {lab}")
        lines.append(f"{'':>3}why: {c['reason']}")
    if res.get("plot"):
        lines.append(f"Pareto plot written to {res['plot']}")
    return "\n".join(lines)
