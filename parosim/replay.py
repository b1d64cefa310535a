"""The simpy replay of a Plan: one global training step on the flow-level network.

Streams are lanes (:func:`parosim.engine.run_lanes`): the ``compute`` stream runs compute ops,
``comm-param`` and ``comm-grad`` run collectives, each lowered by the chosen algorithm and
executed phase by phase on the shared network, so concurrent collectives contend for links.

Overlap slowdown: a compute op that *starts* while any collective is in flight runs
``training.overlap_slowdown`` times longer (NCCL kernels take SMs and memory bandwidth). The
start-time rule is a simplification of a fluid slowdown; with the default 1.0 it is exact.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .collectives.lowering import lower
from .collectives.types import Algo, Program
from .engine import CountingEnvironment, Record, check_finished, run_lanes, run_program
from .network import MAX_PS, PS, Network, horizon_error, symmetry_period, to_ps
from .plan import CollectiveOp, ComputeOp, Plan
from .specs import ClusterSpec
from .topology import cluster_graph


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


class ProgramCache:
    """Lowered collectives by (op, scope, size, algo): layers repeat the same sizes."""

    def __init__(self, spec: ClusterSpec, algo: Algo):
        self.spec, self.algo = spec, algo
        self._c: dict[tuple, Program] = {}

    def get(self, op: CollectiveOp) -> Program:
        key = (op.op, op.scope, op.size_bytes)
        p = self._c.get(key)
        if p is None:
            p = self._c[key] = lower(self.spec, op.op, op.scope, op.size_bytes, self.algo)
        return p


def replay(plan: Plan, spec: ClusterSpec, algo: Algo, overlap_slowdown: float = 1.0,
           trace: bool = False, graph=None) -> ReplayResult:
    """Run ``plan`` on the cluster with collective algorithm ``algo``."""
    env = CountingEnvironment()
    g = graph if graph is not None else cluster_graph(spec)
    net = Network(env, g, spec.nodes, symmetry_period(spec), spec.gpus_per_node)
    cache = ProgramCache(spec, algo)
    ops = plan.ops
    records: list[Record] = []
    in_flight = [0]
    busy = [0]

    def body(i: int):
        op = ops[i]
        if isinstance(op, ComputeOp):
            d = op.duration_s * (overlap_slowdown if in_flight[0] else 1.0)
            t = to_ps(d)
            busy[0] += t
            yield env.timeout(t)
        else:
            in_flight[0] += 1
            yield from run_program(env, net, cache.get(op), spec.collective)
            in_flight[0] -= 1

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
    step = env.now / PS
    compute = busy[0] / PS
    return ReplayResult(step, compute, max(0.0, step - compute), env.events, st.bytes,
                        st.busy_s, st.gpu_egress, records)
