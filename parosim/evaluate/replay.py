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
    right for data-parallel plans; 3D plans pass their own, :mod:`parosim.plan.threed`)."""
    env = CountingEnvironment()
    cache = ProgramCache(spec, algo)
    period = period_nodes if period_nodes is not None else plan_period(plan, spec, cache)
    g = graph if graph is not None else network_graph(spec, period)
    net = Network(env, g, spec.nodes, period, spec.gpus_per_node)
    net.record_links = record_links
    ops = plan.ops
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
    env.run()
    if env.now > MAX_PS:
        raise horizon_error(env.now / PS)
    check_finished(done, lambda i: ops[i].name, lambda i: ops[i].deps, lane, env)
    st = net.link_stats()
    step = (last[0] if overlap_slowdown != 1.0 else env.now) / PS
    busy_s = busy[0] / PS
    critical = critical_collectives(ops, start_ps, end_ps)
    res = ReplayResult(step, busy_s, max(0.0, step - busy_s), env.events, st.bytes,
                       st.busy_s, st.gpu_egress, records, net.hot_links(step, 5, critical),
                       net.period)
    if record_links:
        res.link_timeline = net.link_timeline([h["link"] for h in res.hot_links])
    return res


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
