"""Per-rank timelines: stragglers, heterogeneous GPUs and compute jitter in one step.

The default replay (:mod:`parosim.evaluate.replay`) runs one compute stream that stands for
every rank,
which is exact when every rank is identical. Here every rank has its own compute stream:

* compute op i of rank r lasts ``duration_s x factor[i, r]`` (``factor`` = the GPU's speed
  relative to the cluster's own GPU type, times the jitter draw) and starts when rank r's
  previous compute op and the op's collective deps have ended;
* a collective starts when the last of its members has arrived: when its deps have ended
  on *every* rank (all ranks take part in every collective op of a Plan: an intra or inter
  op runs all its instances at once, coupled as in the phase model), and runs on the shared
  flow-level network exactly as in the default replay.

The ranks are one vector (numpy, integer picoseconds), so a step on 16,384 ranks costs about as
many simpy events as on one. With every factor 1 the result equals the default replay bit for
bit (same picosecond rounding of every duration).

Jitter: each compute op of each rank is multiplied by a lognormal draw of mean 1 and
coefficient of variation ``cv`` (sigma^2 = ln(1 + cv^2), mu = -sigma^2 / 2), from an explicit
seeded ``numpy.random.Generator``.

Critical path: walking back from the step's end, each item is charged to what it waited for
last (rank r's previous op, or the collective that released it; a collective to the rank whose
arrival started it, or its stream predecessor). ``critical_rank`` is the rank with the most
compute time on that path (lowest rank on ties).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..collectives.types import Algo
from ..errors import InputError
from ..fabric.engine import CountingEnvironment, OverlapGate, Record, run_program, run_repeated
from ..fabric.network import MAX_SIM_SECONDS, PS, Network, horizon_error
from ..fabric.topology import cluster_graph
from ..plan.dataparallel import ComputeOp, Plan
from ..spec.system import ClusterSpec
from .replay import ProgramCache, plan_period


def rank_factors(spec: ClusterSpec) -> tuple[np.ndarray, np.ndarray]:
    """Per rank, the time factor of matmul-bound ops (cluster peak FLOP/s / this GPU's /
    speed) and of memory-bound ops (the optimizer: HBM bandwidth ratio / speed).

    >>> from parosim.spec.system import Override
    >>> c = ClusterSpec(nodes=1, gpus_per_node=2, overrides=(Override(gpus=("n0/gpu1",),
    ...                 speed=0.8),))
    >>> rank_factors(c)[0].tolist()
    [1.0, 1.25]
    """
    base = spec.gpu
    fl, mem = [], []
    for g, speed, _ in spec.gpu_specs():
        fl.append(base.peak_flops / g.peak_flops / speed)
        mem.append(base.hbm_bandwidth_Bps / g.hbm_bandwidth_Bps / speed)
    return np.array(fl), np.array(mem)


def jitter_factors(rng: np.random.Generator, cv: float, shape: tuple[int, int]) -> np.ndarray:
    """Lognormal factors of mean 1 and coefficient of variation ``cv`` (ones if cv = 0).

    >>> f = jitter_factors(np.random.default_rng(0), 0.1, (2000, 50))
    >>> bool(abs(f.mean() - 1) < 0.002), bool(abs(f.std() / f.mean() - 0.1) < 0.002)
    (True, True)
    """
    if cv <= 0:
        return np.ones(shape)
    sigma2 = np.log1p(cv * cv)
    return rng.lognormal(-sigma2 / 2, np.sqrt(sigma2), size=shape)


def stream_ranks(plan: Plan, n: int) -> dict[str, np.ndarray]:
    """The ranks each compute stream runs on: every rank for a data-parallel plan's one
    ``compute`` stream; stage k's ranks (``k·t·d .. (k+1)·t·d - 1``, the layout's rank
    order) for a 3D plan's ``compute/s{k}``."""
    streams = {o.stream for o in plan.ops if isinstance(o, ComputeOp)}
    pp = getattr(plan, "pp", 1)
    if pp == 1 and len(streams) == 1:
        return {s: np.arange(n) for s in streams}
    per = n // pp
    return {s: np.arange(o * per, (o + 1) * per)
            for s in streams for o in [next(op.stage for op in plan.ops
                                             if isinstance(op, ComputeOp) and op.stream == s)]}


def _stream_order_deps(ops, is_comp) -> dict[int, tuple[int, ...]]:
    """Implicit deps of stream order between a compute op and a collective on the same
    stream (the compute process and the collective lanes are separate): each op waits for
    the op before it on its stream when that one is of the other type."""
    out: dict[int, tuple[int, ...]] = {}
    last: dict[str, int] = {}
    for i, o in enumerate(ops):
        p = last.get(o.stream)
        if p is not None and bool(is_comp[p]) != bool(is_comp[i]):
            out[i] = (p,)
        last[o.stream] = i
    return out


@dataclass
class RankStepResult:
    """One step with per-rank timelines. Seconds; bytes."""

    step_time_s: float
    compute_busy_s: np.ndarray          # per rank
    events: int
    critical_rank: int
    critical_path_compute_s: float      # compute time on the critical path (all ranks)
    critical_path_comm_s: float         # collective time on the critical path
    link_bytes: dict[str, float] = field(default_factory=dict)
    link_busy_s: dict[str, float] = field(default_factory=dict)
    gpu_egress: dict[str, float] = field(default_factory=dict)
    records: list[Record] = field(default_factory=list)
    hot_links: list[dict] = field(default_factory=list)
    link_timeline: list = field(default_factory=list)
    symmetry_period_nodes: int = 0
    op_start_s: np.ndarray | None = None   # per op: its first rank's start
    op_end_s: np.ndarray | None = None     # per op: its last rank's end

    @property
    def exposed_comm_s(self) -> float:
        """Step time during which the busiest rank's compute stream was idle."""
        return max(0.0, self.step_time_s - float(self.compute_busy_s.max()))


def _durations_ps(plan: Plan, comp: list[int], spec: ClusterSpec,
                  jitter: np.ndarray | None) -> np.ndarray:
    """(compute ops x ranks) durations in picoseconds, rounded up like :func:`to_ps`."""
    fl, mem = rank_factors(spec)
    d = np.array([plan.ops[i].duration_s for i in comp])
    is_mem = np.array([plan.ops[i].kind == "optimizer" for i in comp])
    f = np.where(is_mem[:, None], mem[None, :], fl[None, :])
    if jitter is not None:
        f = f * jitter
    sec = d[:, None] * f
    if sec.size and not float(sec.max()) <= MAX_SIM_SECONDS:   # an int64 cast would wrap
        raise horizon_error(float(sec.max()))
    return np.ceil(sec * PS - 1e-6).astype(np.int64)


def replay_ranks(plan: Plan, spec: ClusterSpec, algo: Algo, jitter: np.ndarray | None = None,
                 trace: bool = False, trace_ranks: list[int] | None = None,
                 record_links: bool = False, net: Network | None = None,
                 cache: ProgramCache | None = None, hot_links: int = 5,
                 overlap_slowdown: float = 1.0) -> RankStepResult:
    """Run ``plan`` with one compute timeline per rank (module docstring).

    ``jitter``: (compute ops x ranks) factors or None. ``net``: a network to reuse (it is
    :meth:`~parosim.fabric.network.Network.reset` onto a new environment). ``trace_ranks``: the
    ranks whose compute ops become trace records (default: all up to 64 ranks, else the
    first rank of every speed class).

    ``overlap_slowdown`` f != 1: a compute op progresses at 1/f of its speed while any
    collective is in flight (the fluid rule of :func:`parosim.evaluate.replay.replay`). Ranks are
    then
    grouped into classes with identical durations (every rank its own class under jitter),
    each class a simpy process with that rule, so one class reproduces the default replay bit
    for bit.
    """
    env = CountingEnvironment()
    cache = cache or ProgramCache(spec, algo)
    if net is None:
        g = cluster_graph(spec)
        net = Network(env, g, spec.nodes, plan_period(plan, spec, cache), spec.gpus_per_node)
    else:
        net.reset(env)
    net.record_links = record_links
    ops = plan.ops
    n = spec.gpus
    comp = [i for i, o in enumerate(ops) if isinstance(o, ComputeOp)]
    is_comp = np.zeros(len(ops), dtype=bool)
    is_comp[comp] = True
    sranks = stream_ranks(plan, n)
    streams = sorted({ops[i].stream for i in comp})
    if len(streams) > 1 and overlap_slowdown != 1.0:
        raise InputError(f"per-rank timelines (GPU overrides, --jitter-cv) of a pipelined plan "
                         f"model no compute slowdown beside collectives; got overlap slowdown "
                         f"{overlap_slowdown:g}; expected --overlap-slowdown 1")
    # a collective on a compute stream (3D plans: TP collectives) runs in that stream's order
    xdeps = _stream_order_deps(ops, is_comp)
    dur = _durations_ps(plan, comp, spec, jitter)
    if jitter is not None and jitter.shape != dur.shape:
        raise ValueError(f"jitter has shape {jitter.shape}; expected {dur.shape}")
    end_ps = np.zeros(len(ops), dtype=np.int64)
    start_ps = np.zeros(len(ops), dtype=np.int64)
    pred: list[int] = [-1] * len(ops)        # collectives: the item that released them
    gate = np.zeros(len(ops), dtype=np.int64)  # compute ops: the rank that ended last
    bound: list[np.ndarray] = []             # per compute op: ranks released by a collective
    floor_dep = [-1] * len(comp)
    done = [env.event() for _ in ops]
    busy = np.zeros(n, dtype=np.int64)
    records: list[Record] = []
    if trace_ranks is None:
        if n <= 64:
            trace_ranks = list(range(n))
        else:
            fl, _ = rank_factors(spec)
            _, first = np.unique(fl, return_index=True)
            trace_ranks = sorted(set(first.tolist()))
    trace_ranks = sorted(set(trace_ranks)) if trace else []
    tr = np.array(trace_ranks, dtype=np.int64)
    starts_tr: list[np.ndarray] = []
    ends_tr: list[np.ndarray] = []

    def fire(i: int):
        return lambda _ev: done[i].succeed()

    elapsed = None  # class mode: (compute ops x classes) elapsed ps, and rank -> class
    overlap = OverlapGate(env, overlap_slowdown)

    def fluid(work: int):
        """One compute op of ``work`` ps at full speed under the slowdown rule (as
        :func:`parosim.evaluate.replay.replay` does it, step for step)."""
        return overlap.compute(work)

    if overlap_slowdown != 1.0:
        classes, inv = np.unique(dur.T, axis=0, return_inverse=True)
        inv = np.asarray(inv).reshape(-1)
        n_cls = len(classes)
        s_c = np.zeros((len(comp), n_cls), dtype=np.int64)
        e_c = np.zeros((len(comp), n_cls), dtype=np.int64)
        b_c = np.zeros((len(comp), n_cls), dtype=bool)
        left_c = [n_cls] * len(comp)
        bound.extend([None] * len(comp))
        elapsed = (s_c, e_c, inv)

        def finish(k: int, i: int) -> None:
            e, st = e_c[k, inv], s_c[k, inv]
            r = int(np.argmax(e))
            gate[i], end_ps[i], start_ps[i] = r, e[r], int(st.min())
            bound[k] = b_c[k, inv]
            busy[:] += e - st
            if len(tr):
                starts_tr.append(st[tr])
                ends_tr.append(e[tr])
            done[i].succeed()

        def class_proc(c: int):
            prev_end = 0
            for k, i in enumerate(comp):
                cdeps = [d for d in ops[i].deps if not is_comp[d]]
                floor = 0
                if cdeps:
                    yield env.all_of([done[d] for d in cdeps])
                    j = max(cdeps, key=lambda d: (end_ps[d], d))
                    floor = int(end_ps[j])
                    floor_dep[k] = j
                start = env.now
                b_c[k, c] = floor > prev_end
                yield from fluid(int(classes[c, k]))
                s_c[k, c], e_c[k, c] = start, env.now
                prev_end = env.now
                left_c[k] -= 1
                if left_c[k] == 0:
                    finish(k, i)

    kpos = {i: k for k, i in enumerate(comp)}
    bound.extend([None] * len(comp) if elapsed is None else [])
    if len(tr) and elapsed is None:
        starts_tr.extend([None] * len(comp))
        ends_tr.extend([None] * len(comp))
    prev_same = [-1] * len(comp)      # the previous compute op of the same stream

    def compute_proc(stream: str):
        rk = sranks[stream]
        t = np.zeros(len(rk), dtype=np.int64)
        mine = [i for i in comp if ops[i].stream == stream]
        prev = -1
        for i in mine:
            k = kpos[i]
            prev_same[k] = prev
            prev = k
            cdeps = [d for d in ops[i].deps + xdeps.get(i, ())
                     if not (is_comp[d] and ops[d].stream == stream)]
            if cdeps:
                yield env.all_of([done[d] for d in cdeps])
                j = max(cdeps, key=lambda d: (end_ps[d], d))
                floor = int(end_ps[j])
                floor_dep[k] = j
            else:
                floor = 0
            d = dur[k][rk]
            b = np.zeros(n, dtype=bool)
            b[rk] = t < floor
            bound[k] = b
            s = np.maximum(t, floor)
            t = s + d
            busy[rk] += d
            r = int(np.argmax(t))
            gate[i], end_ps[i], start_ps[i] = int(rk[r]), t[r], int(s.min())
            if len(tr):
                full_s = np.zeros(n, dtype=np.int64)
                full_e = np.zeros(n, dtype=np.int64)
                full_s[rk], full_e[rk] = s, t
                starts_tr[k], ends_tr[k] = full_s[tr], full_e[tr]
            ev = env.timeout(int(t[r]) - env.now)
            ev.callbacks.append(fire(i))

    def lane_proc(idx: list[int]):
        prev = -1
        for i in idx:
            deps = list(ops[i].deps + xdeps.get(i, ()))
            if deps:
                yield env.all_of([done[d] for d in deps])
            start = env.now
            cands = deps + ([prev] if prev >= 0 else [])
            if cands:
                p = max(cands, key=lambda d: (end_ps[d], is_comp[d], d))
                pred[i] = p if end_ps[p] == start else -1
            start_ps[i] = start
            overlap.flip(+1)
            count = getattr(ops[i], "count", 1)   # 3D plans coalesce identical collectives
            if count == 1:
                yield from run_program(env, net, cache.get(ops[i]), spec.collective, owner=i)
            else:
                yield from run_repeated(env, net, cache.get(ops[i]), spec.collective, count,
                                        i)
            overlap.flip(-1)
            end_ps[i] = env.now
            if trace:
                records.append(Record(ops[i].stream, ops[i].name, start / PS, env.now / PS,
                                      ops[i].purpose))
            done[i].succeed()
            prev = i

    lanes: dict[str, list[int]] = {}
    for i, o in enumerate(ops):
        if not is_comp[i]:
            lanes.setdefault(o.stream, []).append(i)
    if elapsed is None:
        for stream in streams:
            env.process(compute_proc(stream))
    else:
        prev_same[:] = [k - 1 for k in range(len(comp))]
        for c in range(n_cls):
            env.process(class_proc(c))
    for idx in lanes.values():
        env.process(lane_proc(idx))
    env.run()
    left = [i for i, ev in enumerate(done) if not ev.triggered]
    if left:
        raise RuntimeError(f"deadlock: {len(left)} op(s) never ran; first is "
                           f"{ops[left[0]].name!r}")
    step_ps = int(end_ps.max()) if len(ops) else 0  # a superseded rate timer may fire later

    # critical path, backwards from the item that ended last
    on_path = np.zeros(n, dtype=np.int64)
    comm_ps = 0
    critical: list[tuple[int, int, int]] = []   # the collectives on it: (op, start, end) ps
    last = max(range(len(ops)), key=lambda i: (end_ps[i], is_comp[i], i))
    item, rank = last, int(gate[last]) if is_comp[last] else -1
    while item >= 0:
        if is_comp[item]:
            k = kpos[item]
            if elapsed is None:
                on_path[rank] += dur[k][rank]
            else:
                s_c, e_c, inv = elapsed
                on_path[rank] += e_c[k, inv[rank]] - s_c[k, inv[rank]]
            if bound[k][rank]:
                item = floor_dep[k]
            else:
                item = comp[prev_same[k]] if prev_same[k] >= 0 else -1
        else:
            comm_ps += int(end_ps[item] - start_ps[item])
            critical.append((item, int(start_ps[item]), int(end_ps[item])))
            p = pred[item]
            if p >= 0 and is_comp[p]:
                rank = int(gate[p])
            item = p
    if trace and len(tr):
        for k, i in enumerate(comp):
            mine = set(sranks[ops[i].stream].tolist())
            for col, r in enumerate(trace_ranks):
                if r not in mine:
                    continue
                records.append(Record(f"rank {r} compute", ops[i].name,
                                      starts_tr[k][col] / PS, ends_tr[k][col] / PS,
                                      ops[i].kind))
    st = net.link_stats()
    res = RankStepResult(step_ps / PS, busy / PS, env.events, int(np.argmax(on_path)),
                         float(on_path.sum() / PS), comm_ps / PS, st.bytes, st.busy_s,
                         st.gpu_egress, records,
                         net.hot_links(step_ps / PS, hot_links, critical),
                         symmetry_period_nodes=net.period, op_start_s=start_ps / PS,
                         op_end_s=end_ps / PS)
    if record_links:
        names = [h["link"] for h in res.hot_links]
        res.link_timeline = net.link_timeline(names)
    return res


@dataclass
class StepDistribution:
    """Step times over ``repeats`` jittered steps, and what decided them."""

    step_times_s: np.ndarray
    critical_ranks: list[int]
    last: RankStepResult          # the last repeat (trace, link statistics)

    def summary(self) -> dict:
        """``step_time_s`` (mean), ``step_time_p50_s`` / ``_p90_s`` / ``_p99_s``
        (percentiles, linear interpolation), ``step_time_std_s``, ``step_time_min_s``,
        ``step_time_max_s``, ``critical_rank`` (most frequent over repeats, lowest on ties)
        and ``critical_rank_share`` (fraction of repeats it was critical)."""
        t = self.step_times_s
        p50, p90, p99 = np.percentile(t, [50, 90, 99])
        ranks, counts = np.unique(np.array(self.critical_ranks), return_counts=True)
        best = int(ranks[np.argmax(counts)])
        return {"step_time_s": float(t.mean()), "step_time_p50_s": float(p50),
                "step_time_p90_s": float(p90), "step_time_p99_s": float(p99),
                "step_time_std_s": float(t.std()), "step_time_min_s": float(t.min()),
                "step_time_max_s": float(t.max()), "repeats": int(len(t)),
                "critical_rank": best,
                "critical_rank_share": float(counts.max() / len(t))}


#: jittered steps are replayed one by one; their cost, measured on a 2-core machine (the
#: default llama-7b step, 1,703 ops: 43 ms a repeat on 32 GPUs, 65 ms on 1,024, with
#: symmetric ranks folded), is about ops x (JITTER_OP_S + ranks x JITTER_RANK_OP_S) a repeat;
#: a request estimated above MAX_JITTER_S is refused (p99 needs a few hundred repeats)
JITTER_OP_S = 25e-6
JITTER_RANK_OP_S = 12.5e-9
MAX_JITTER_S = 100.0


def step_distribution(plan: Plan, spec: ClusterSpec, algo: Algo, repeats: int = 1,
                      seed: int = 0, jitter_cv: float = 0.0, trace: bool = False,
                      record_links: bool = False,
                      overlap_slowdown: float = 1.0) -> StepDistribution:
    """``repeats`` steps, each with fresh jitter draws from one Generator seeded ``seed``
    (the same inputs give the same distribution bit for bit). Routing and max-min rates are
    computed once and reused across repeats."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise InputError(f"--repeats = {repeats!r} must be a positive integer")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InputError(f"--seed = {seed!r} must be a non-negative integer")
    if not (np.isfinite(jitter_cv) and jitter_cv >= 0):
        raise InputError(f"--jitter-cv = {jitter_cv!r} must be a non-negative number")
    per_repeat_s = len(plan.ops) * (JITTER_OP_S + spec.gpus * JITTER_RANK_OP_S)
    if jitter_cv > 0 and repeats * per_repeat_s > MAX_JITTER_S:   # replayed one by one
        most = max(1, int(MAX_JITTER_S // per_repeat_s))
        raise InputError(f"--repeats {repeats} jittered steps of {len(plan.ops)} ops on "
                         f"{spec.gpus} ranks: ~{repeats * per_repeat_s:.3g} s of replay, more "
                         f"than the limit of {MAX_JITTER_S:.0f} s; expected --repeats <= {most}")
    rng = np.random.default_rng(seed)
    comp = sum(1 for o in plan.ops if isinstance(o, ComputeOp))
    env = CountingEnvironment()
    cache = ProgramCache(spec, algo)
    net = Network(env, cluster_graph(spec), spec.nodes, plan_period(plan, spec, cache),
                  spec.gpus_per_node)
    times, crit = [], []
    res = None
    for k in range(repeats):
        jit = jitter_factors(rng, jitter_cv, (comp, spec.gpus)) if jitter_cv > 0 else None
        if res is not None and jit is None:  # deterministic: every repeat is the same
            times.append(res.step_time_s)
            crit.append(res.critical_rank)
            continue
        last = k == repeats - 1
        res = replay_ranks(plan, spec, algo, jit, trace and last, None,
                           record_links and last, net, cache,
                           overlap_slowdown=overlap_slowdown)
        times.append(res.step_time_s)
        crit.append(res.critical_rank)
    return StepDistribution(np.array(times), crit, res)


def hetero_step(res, plan: Plan, spec: ClusterSpec, algo: Algo, overlap_slowdown: float,
                repeats: int, seed: int, jitter_cv: float, trace: bool, record_links: bool):
    """The per-rank branch of :func:`parosim.simulate.simulate_step`: fills ``res.extra``,
    ``res.events`` and ``res.records``; returns (mean step, exposed comm, compute busy,
    intra bytes per GPU, inter bytes per GPU) of the last repeat's traffic."""
    dist = step_distribution(plan, spec, algo, repeats, seed, jitter_cv, trace, record_links,
                             overlap_slowdown)
    last = dist.last
    res.last_rank_step = last      # the last repeat's timelines (3D: the pipeline phase)
    summ = dist.summary()
    step = summ["step_time_s"]
    res.events, res.records = last.events, last.records
    res.extra = {k: v for k, v in summ.items() if k != "step_time_s"}
    res.extra.update(
        seed=seed, jitter_cv=jitter_cv, step_times_s=dist.step_times_s.tolist(),
        critical_path_compute_s=last.critical_path_compute_s,
        critical_path_comm_s=last.critical_path_comm_s,
        compute_busy_min_s=float(last.compute_busy_s.min()),
        compute_busy_max_s=float(last.compute_busy_s.max()),
        symmetry_period_nodes=last.symmetry_period_nodes, hot_links=last.hot_links)
    if record_links:
        res.extra["link_timeline"] = [{"time_s": t, "utilization": u}
                                      for t, u in last.link_timeline]
    n = spec.gpus
    return (step, last.exposed_comm_s, float(last.compute_busy_s.max()),
            last.gpu_egress.get("intra", 0.0) / n, last.gpu_egress.get("inter", 0.0) / n)
