"""The simpy replay of a Plan: one global training step on the flow-level network.

Streams are lanes (:func:`parosim.fabric.engine.run_lanes`): the ``compute`` stream runs compute
ops,
``comm-param`` and ``comm-grad`` run collectives, each lowered by the chosen algorithm and
executed phase by phase on the shared network, so concurrent collectives contend for links.

Overlap slowdown (fluid, exact): while at least one collective is in flight that involves
the compute op's GPUs (any collective on data-parallel plans; on 3D plans one of the same
pipeline stage, :meth:`parosim.plan.threed.Plan3D.overlap_gates`), compute advances at 1/f of
its speed (f = ``overlap_slowdown``: NCCL kernels take SMs and memory
bandwidth from the matmuls). The rate changes at the instant a collective starts or ends
during a compute op, so a compute op of work W that overlaps collectives for a share x of
its work takes ``W (1 - x) + W x f``. With f = 1 the compute path is the plain timeout.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..collectives.lowering import lower, with_chain_fill
from ..collectives.types import Algo, Program
from ..fabric.engine import (
    CountingEnvironment,
    OverlapGate,
    Record,
    check_finished,
    run_counted,
    run_lanes,
)
from ..fabric.folded import network_graph
from ..fabric.network import MAX_PS, PS, Network, horizon_error, symmetry_period, to_ps
from ..plan.dataparallel import CollectiveOp, ComputeOp, Plan
from ..spec.system import ClusterSpec
from .periodic import (
    PLAN_LANE,
    ProbedEnvironment,
    Unproved,
    canon,
    fingerprint,
    frames_of,
    micro_layout,
    shortened,
)


@dataclass
class ReplayResult:
    """Step time and where the time and bytes went. Seconds and bytes."""

    step_time_s: float
    compute_busy_s: float        # time the compute stream was running ops
    exposed_comm_s: float        # step time during which compute was idle
    events: int
    link_bytes: dict[str, float] = field(default_factory=dict)
    link_busy_s: dict[str, float] = field(default_factory=dict)
    gpu_egress: dict[str, float] = field(default_factory=dict)
    records: list[Record] = field(default_factory=list)
    hot_links: list[dict] = field(default_factory=list)   # Network.hot_links
    symmetry_period_nodes: int = 0   # the reduction the engine proved and used (nodes)
    link_timeline: list = field(default_factory=list)     # Network.link_timeline


class ProgramCache:
    """Lowered collectives by (op, scope, size, algo): layers repeat the same sizes."""

    def __init__(self, spec: ClusterSpec, algo: Algo):
        self.spec, self.algo = spec, algo
        self._c: dict[tuple, Program] = {}

    def get(self, op: CollectiveOp) -> Program:
        own = getattr(op, "lower", None)  # group collectives of 3D plans (parosim.plan.threed)
        if own is not None:
            key = (op.cache_key, self.algo)
            p = self._c.get(key)
            if p is None:
                p = self._c[key] = own(self.spec, self.algo)
            return p
        algo = getattr(op, "algo", None) or self.algo   # a runtime may fix it per call
        chain = getattr(op, "chain", False)
        key = (op.op, op.scope, op.size_bytes, algo, chain)
        p = self._c.get(key)
        if p is None:
            p = lower(self.spec, op.op, op.scope, op.size_bytes, algo)
            p = self._c[key] = with_chain_fill(self.spec, p) if chain else p
        return p


def plan_period(plan: Plan, spec: ClusterSpec, cache: ProgramCache) -> int:
    """The symmetry period for a plan's network: ``symmetry_period(spec)``, or every node when
    a collective is lowered to an NCCL tree (not translation-invariant: no reduction)."""
    if any(cache.get(op).tree for op in plan.ops if isinstance(op, CollectiveOp)):
        return spec.nodes
    if hasattr(plan, "layout"):   # a 3D plan: its group sets' period (parosim.plan.threed)
        return plan.layout(spec).symmetric_period(plan.cp)
    return symmetry_period(spec)


def replay(plan: Plan, spec: ClusterSpec, algo: Algo, overlap_slowdown: float = 1.0,
           trace: bool = False, graph=None, record_links: bool = False,
           period_nodes: int | None = None) -> ReplayResult:
    """Run ``plan`` on the cluster with collective algorithm ``algo``. ``record_links``:
    fill ``link_timeline`` with the utilisation over time of the hottest links.
    ``period_nodes``: the symmetry period of the plan's ring sets (default: the cluster's,
    right for data-parallel plans; 3D plans pass their own, :mod:`parosim.plan.threed`).

    A data-parallel step of at least 4 micro-steps replays its identical micro-steps once
    when that is proved exact (:mod:`parosim.evaluate.periodic`); the result is the same,
    bit for bit, as the full replay's."""
    cache = ProgramCache(spec, algo)
    period = period_nodes if period_nodes is not None else plan_period(plan, spec, cache)
    g = graph if graph is not None else network_graph(spec, period)
    if (PERIODIC[0] and overlap_slowdown == 1.0 and not trace and not record_links
            and not spec.collective.serial_progress and not hasattr(plan, "layout")):
        res = periodic_replay(plan, spec, cache, period, g)
        if res is not None:
            return res
    env = CountingEnvironment()
    net = Network(env, g, spec.nodes, period, spec.gpus_per_node)
    net.record_links = record_links
    ops = plan.ops
    run = _simulate(ops, plan, spec, cache, env, net, overlap_slowdown, trace)
    env.run()
    return _finish(run, ops, env, net, overlap_slowdown, record_links)


# the switch of the identical-micro-step shortcut (tests turn it off to compare)
PERIODIC = [True]


@dataclass
class _Run:
    busy: list[int]
    last: list[int]
    start_ps: list[int]
    end_ps: list[int]
    records: list[Record]
    done: list


def _simulate(ops, plan, spec: ClusterSpec, cache: ProgramCache, env, net: Network,
              overlap_slowdown: float, trace: bool, on_start=None) -> _Run:
    """Start the processes replaying ``ops`` on ``env`` (the caller runs it)."""
    records: list[Record] = []
    busy = [0]
    gate = OverlapGate(env, overlap_slowdown)
    # per-stream gates (3D plans: one per pipeline stage, Plan3D.overlap_gates): an op's
    # gates are those of the GPUs it runs on; None: one gate for the whole step (data
    # parallel: every collective involves every rank's compute stream)
    keys = plan.overlap_gates() if (overlap_slowdown != 1.0
                                    and hasattr(plan, "overlap_gates")) else None
    gates = ({k: OverlapGate(env, overlap_slowdown) for ks in keys for k in ks}
             if keys is not None else {})

    def compute(op: ComputeOp):
        work = to_ps(op.duration_s)          # picoseconds at full speed
        start = env.now
        if overlap_slowdown == 1.0:
            yield env.timeout(work)
        elif keys is not None:
            yield from gates[keys[op.id][0]].compute(work)
        else:
            yield from gate.compute(work)
        busy[0] += env.now - start

    def flip(i: int, delta: int) -> None:
        if keys is None:
            gate.flip(delta)
        else:
            for k in keys[i]:
                gates[k].flip(delta)

    last = [0]           # when the last op ended (a superseded rate timer may fire later)
    start_ps = [0] * len(ops)
    end_ps = [0] * len(ops)

    def body(i: int):
        op = ops[i]
        start_ps[i] = env.now
        if on_start is not None:
            on_start(i)
        if isinstance(op, ComputeOp):
            yield from compute(op)
        else:
            flip(i, +1)
            # 3D plans coalesce a chunk's TP collectives (count)
            yield from run_counted(env, net, cache.get(op), spec.collective,
                                   getattr(op, "count", 1), owner=i)
            flip(i, -1)
        end_ps[i] = env.now
        last[0] = max(last[0], env.now)

    def kind(i: int) -> str:
        op = ops[i]
        return op.kind if isinstance(op, ComputeOp) else op.purpose

    lane: Callable[[int], str] = lambda i: ops[i].stream
    done = run_lanes(env, ops, lane, lambda i: ops[i].deps, lambda i: ops[i].name, body,
                     records.append if trace else None, kind)
    return _Run(busy, last, start_ps, end_ps, records, done)


def _finish(run: _Run, ops, env, net: Network, overlap_slowdown: float,
            record_links: bool, events: int | None = None) -> ReplayResult:
    """The result of a finished run (``events``: the count, when not the environment's)."""
    if env.now > MAX_PS:
        raise horizon_error(env.now / PS)
    if run.done is not None:
        check_finished(run.done, lambda i: ops[i].name, lambda i: ops[i].deps,
                       lambda i: ops[i].stream, env)
    st = net.link_stats()
    step = (run.last[0] if overlap_slowdown != 1.0 else env.now) / PS
    busy_s = run.busy[0] / PS
    critical = critical_collectives(ops, run.start_ps, run.end_ps)
    res = ReplayResult(step, busy_s, max(0.0, step - busy_s),
                       env.events if events is None else events, st.bytes,
                       st.busy_s, st.gpu_egress, run.records,
                       net.hot_links(step, 5, critical), net.period)
    if record_links:
        res.link_timeline = net.link_timeline([h["link"] for h in res.hot_links])
    return res


def periodic_replay(plan, spec: ClusterSpec, cache: ProgramCache, period: int, g,
                     keep: int = 2) -> ReplayResult | None:
    """The replay with micro-steps ``keep`` .. s - 2 cut out and put back, when proved exact
    (:mod:`parosim.evaluate.periodic`); None when not (the caller replays in full). The
    shortened replay is probed at the starts of micro-steps 1 .. ``keep``; the first two
    consecutive equal states give the period."""
    ops = plan.ops
    layout = micro_layout(ops)
    if layout is None or len(layout[0]) < keep + 2:
        return None
    first, p = layout
    jn = len(first) - 1 - keep      # periods cut out
    cut = first[keep]
    try:
        short = shortened(ops, first, p, keep)
    except Unproved:
        return None
    env = ProbedEnvironment()
    probe = env.probe
    probe.ops = short
    probe.tail = cut + p            # the shortened plan's boundary ops start here
    net = Network(env, g, spec.nodes, period, spec.gpus_per_node)
    marks = {first[m]: m for m in range(1, keep + 1)}
    snaps: dict[int, dict] = {}
    started = [-1]
    pending: list[int] = []
    run: _Run

    def on_start(i: int) -> None:
        started[0] = max(started[0], i)
        if i in marks:
            pending.append(marks[i])

    def snapshot() -> None:
        m = pending.pop()
        reached = [fr.f_locals["i"] for pr in probe.procs if pr.is_alive
                   for fr in frames_of(pr) if fr.f_code.co_qualname == PLAN_LANE]
        hi = max([started[0], *(i for i in reached if i < probe.tail)]) + 1
        try:
            fp = fingerprint(env, net, probe, first[m], hi)
        except Unproved:
            fp = None
        snaps[m] = {"t": env._now, "eid": env.events, "busy": run.busy[0], "fp": fp,
                    "key_dt": {k: v[1] for k, v in net._key_time.items()},
                    "paces": len(net._paces),
                    "lo": next((i for i, ev in enumerate(probe.done) if not ev.triggered),
                               len(short)),
                    "hi": hi}
        if m == keep and not any(
                snaps.get(k) is not None and snaps[k]["fp"] is not None
                and snaps[k]["fp"] == snaps.get(k + 1, {}).get("fp") for k in range(1, keep)):
            raise Unproved("no two micro-steps start in the same state")

    try:
        run = _simulate(short, plan, spec, cache, env, net, 1.0, False, on_start)
        probe.done = run.done
        env.run_cuts(pending, snapshot)
    except Exception:  # noqa: BLE001 - Unproved, or an error the full replay raises itself
        return None    # (with the full plan's times in its message)
    if any(not ev.triggered for ev in run.done):
        return None
    prog: dict[int, object] = {}

    def canon_of(op, shift: int) -> tuple:
        if isinstance(op, ComputeOp):
            return canon(op, shift, None)
        pr = prog.get(id(op))
        if pr is None:
            pr = prog[id(op)] = cache.get(op)
        return canon(op, shift, pr)

    for m in range(1, keep):
        s1, s2 = snaps.get(m), snaps.get(m + 1)
        if s1 is None or s2 is None or s1["fp"] is None or s1["fp"] != s2["fp"]:
            continue
        lo, hi = s1["lo"], s2["hi"]
        # up to T_m+1 the shortened replay looked at the full plan's ops; each later
        # period looks at the same ops shifted; after the splice the shortened plan's
        # ops are the full plan's shifted by jn periods
        if hi > len(short) or lo > hi:
            continue
        if any(canon_of(ops[i], 0) != canon_of(short[i], 0) for i in range(cut, hi)):
            continue
        if any(i + k * p >= len(ops) or canon_of(ops[i + k * p], k * p) != canon_of(ops[i], 0)
               for k in range(1, jn + 1) for i in range(lo, hi)):
            continue
        if any(canon_of(ops[i + jn * p], jn * p) != canon_of(ops[i], 0)
               for i in range(lo, cut)):
            continue
        return _splice(ops, run, env, net, s1, s2, jn, p)
    return None


def _splice(ops, run: _Run, env, net: Network, s1: dict, s2: dict, jn: int, p: int
            ) -> ReplayResult | None:
    """The full replay's record from the shortened one's: events up to T_1 (snapshot
    ``s1``) as they are, those of (T_1, T_2] (``s2``) also repeated jn times shifted by
    k(dt, p), the rest shifted by jn(dt, p)."""
    t1, t2 = s1["t"], s2["t"]
    dt = t2 - t1
    jdt, jp = jn * dt, jn * p
    n = len(ops)
    start: list = [None] * n
    end: list = [None] * n
    for src, dst in ((run.start_ps, start), (run.end_ps, end)):
        for o, t in enumerate(src):
            if t <= t2:
                if dst[o] is not None:
                    return None
                dst[o] = t
                if t > t1:
                    for k in range(1, jn + 1):
                        if dst[o + k * p] is not None:
                            return None
                        dst[o + k * p] = t + k * dt
            else:
                if dst[o + jp] is not None:
                    return None
                dst[o + jp] = t + jdt
    if any(x is None for x in start) or any(x is None for x in end):
        return None
    # rate regimes: the window's repeated, the rest shifted
    paces = net._paces
    a, b = s1["paces"], s2["paces"]
    if any(t <= t1 for t, _, _ in paces[a:b]) or any(t > t2 for t, _, _ in paces[a:b]) \
            or any(t <= t2 for t, _, _ in paces[b:]):
        return None

    def moved(pace, dt_, dp):
        t, owners, bns = pace
        return (t + dt_, tuple([None if o is None else o + dp for o in owners]), bns)

    full = paces[:b]
    for k in range(1, jn + 1):
        full.extend(moved(x, k * dt, k * p) for x in paces[a:b])
    full.extend(moved(x, jdt, jp) for x in paces[b:])
    net._paces = full
    # time under each rate regime: the window's added jn more times
    k1, k2 = s1["key_dt"], s2["key_dt"]
    for key, entry in net._key_time.items():
        entry[1] += jn * (k2.get(key, 0) - k1.get(key, 0))
    if env._now + jdt > MAX_PS:
        return None          # the full replay says where the clock runs out
    net._last += jdt
    env._now += jdt
    events = env.events + jn * (s2["eid"] - s1["eid"])
    busy = run.busy[0] + jn * (s2["busy"] - s1["busy"])
    full_run = _Run([busy], [0], start, end, [], None)
    return _finish(full_run, ops, env, net, 1.0, False, events)


def critical_collectives(ops, start_ps: list[int], end_ps: list[int]
                         ) -> list[tuple[int, int, int]]:
    """The collectives on the step's critical path, (op index, start ps, end ps): walking
    back from the op that ended last, each op is charged to what released it, the dep or the
    previous op of its stream that ended last, exactly when it started (docs/heterogeneity.md,
    "Outputs"). Their links' bottleneck time ranks the hottest links
    (:meth:`~parosim.fabric.network.Network.hot_links`)."""
    if not ops:
        return []
    prev: dict[str, int] = {}
    lane_prev = [-1] * len(ops)
    for i, op in enumerate(ops):
        lane_prev[i] = prev.get(op.stream, -1)
        prev[op.stream] = i
    out = []
    item = max(range(len(ops)), key=lambda i: (end_ps[i], isinstance(ops[i], ComputeOp), i))
    while item >= 0:
        if not isinstance(ops[item], ComputeOp):
            out.append((item, start_ps[item], end_ps[item]))
        cands = [*ops[item].deps, *([lane_prev[item]] if lane_prev[item] >= 0 else [])]
        if not cands:
            break
        p = max(cands, key=lambda d: (end_ps[d], isinstance(ops[d], ComputeOp), d))
        item = p if end_ps[p] == start_ps[item] else -1
    return out
