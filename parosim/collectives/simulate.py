"""Simulate one collective alone on a cluster (``parosim collective``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import InputError
from ..fabric.engine import CountingEnvironment, DeadlockError, Record, run_program
from ..fabric.folded import network_graph
from ..fabric.network import MAX_PS, PS, Network, horizon_error, symmetry_period
from ..fabric.symmetry import transfer_period
from ..fabric.topology import cluster_graph
from ..spec.system import ClusterSpec
from .cost import program_time
from .lowering import lower
from .types import Algo, Op, Program, Scope

if TYPE_CHECKING:
    import networkx as nx


@dataclass
class CollectiveResult:
    """Result of one simulated collective; times in s, sizes in bytes, bandwidths in GB/s."""

    op: Op
    algo: Algo
    scope: Scope
    gpus: int              # GPUs in the cluster (all take part)
    ring_size: int         # k: ranks per instance of the scope
    size_bytes: float
    time_s: float
    closed_form_s: float | None  # None where the closed form does not hold (heterogeneous)
    chunks: int
    events: int
    link_bytes: dict[str, float] = field(default_factory=dict)
    link_busy_s: dict[str, float] = field(default_factory=dict)
    records: list[Record] = field(default_factory=list)
    protocol: str = ""     # protocols of the phases ("" = ideal wire model)
    choice: str = ""       # `nccl`: the (algorithm/protocol) it picked, e.g. "ring/simple"
    symmetry_period_nodes: int = 0     # the reduction the engine proved and used
    hot_links: list[dict] = field(default_factory=list)   # Network.hot_links

    @property
    def algbw_GBps(self) -> float:
        return self.size_bytes / self.time_s / 1e9 if self.time_s > 0 else 0.0

    @property
    def busbw_GBps(self) -> float:
        return self.algbw_GBps * self.op.busbw_factor(self.ring_size)

    def to_dict(self) -> dict:
        return {
            "op": self.op.value, "algo": self.algo.value, "scope": self.scope.value,
            "gpus": self.gpus, "ring_size": self.ring_size, "size_bytes": self.size_bytes,
            "time_s": self.time_s, "closed_form_s": self.closed_form_s,
            "algbw_GBps": self.algbw_GBps, "busbw_GBps": self.busbw_GBps,
            "chunks": self.chunks, "events": self.events,
            "protocol": self.protocol, "nccl_choice": self.choice,
            "links": {cls: {"bytes": self.link_bytes.get(cls, 0.0),
                            "busy_s": self.link_busy_s.get(cls, 0.0)}
                      for cls in sorted(self.link_bytes)},
            "symmetry_period_nodes": self.symmetry_period_nodes,
            "hot_links": self.hot_links,
        }


def closed_form_time(spec: ClusterSpec, op: Op, scope: Scope, size_bytes: float,
                     algo: Algo) -> float:
    """Alpha-beta time of one collective (no graph, no engine); refused for a cluster whose
    links are not all equal per class (overrides, ECMP hashing)."""
    if not spec.closed_form_exact:
        raise InputError(f"cluster {spec.name!r} has link overrides or ECMP hashing: the "
                         "closed form assumes equal links; expected the engine")
    return program_time(spec, lower(spec, op, scope, size_bytes, algo))


def simulate_program(spec: ClusterSpec, program: Program, graph: nx.DiGraph | None = None,
                     symmetric: bool = True, trace: bool = False) -> CollectiveResult:
    """Run a lowered collective on the simpy flow-level network of the cluster graph."""
    env = CountingEnvironment()
    # a tree is not invariant under translation: no symmetry reduction
    period = symmetry_period(spec) if symmetric and not program.tree else spec.nodes
    if period < spec.nodes:  # a hand-made program need not be invariant: check (symmetry.py)

        period = transfer_period({ph.ringset for ph in program.phases}, spec.nodes,
                                 spec.gpus_per_node, period)
    g = graph if graph is not None else network_graph(spec, period)
    net = Network(env, g, spec.nodes, period, spec.gpus_per_node)
    records: list[Record] = []
    proc = env.process(run_program(env, net, program, spec.collective,
                                   records.append if trace else None))
    env.run()
    if env.now > MAX_PS:
        raise horizon_error(env.now / PS)
    if not proc.triggered:
        raise DeadlockError(f"collective {program.op.value} ({program.algo.value}) did not "
                            f"finish: no event pending at t = {env.now / PS} s")
    st = net.link_stats()
    return CollectiveResult(program.op, program.algo, program.scope, spec.gpus, program.gpus,
                            program.size_bytes, env.now / PS,
                            program_time(spec, program) if spec.closed_form_exact else None,
                            program.chunks, env.events, st.bytes, st.busy_s, records,
                            program.protocols, program.choice, net.period,
                            net.hot_links(env.now / PS))


def simulate_collective(spec: ClusterSpec, op: Op, scope: Scope, size_bytes: float,
                        algo: Algo, **kw) -> CollectiveResult:
    """Lower and simulate one collective.

    >>> from parosim.io import load_cluster
    >>> r = simulate_collective(load_cluster("paper-a100-roce"), Op.ALL_GATHER, Scope.GLOBAL,
    ...                         2**30, Algo.RING)
    >>> abs(r.time_s / r.closed_form_s - 1) < 0.01
    True
    """
    if not size_bytes > 0:
        raise InputError(f"collective size {size_bytes!r} must be positive")
    return simulate_program(spec, lower(spec, op, scope, size_bytes, algo), **kw)


def simulate_concurrent(spec: ClusterSpec, programs: list[Program],
                        graph: nx.DiGraph | None = None) -> list[float]:
    """Run several lowered collectives at the same time on one network (they contend for
    links); return each one's completion time in seconds. No symmetry reduction is used, so
    programs need not be invariant.

    >>> from parosim.spec.system import ClusterSpec
    >>> c = ClusterSpec(nodes=2)
    >>> p = lower(c, Op.ALL_GATHER, Scope.GLOBAL, 2**28, Algo.RING)
    >>> alone = simulate_program(c, p).time_s
    >>> both = simulate_concurrent(c, [p, p])
    >>> 1.9 < both[0] / alone < 2.01
    True
    """
    g = graph if graph is not None else cluster_graph(spec, lite=True)
    env = CountingEnvironment()
    net = Network(env, g, spec.nodes, spec.nodes, spec.gpus_per_node)
    procs = [env.process(run_program(env, net, p, spec.collective, prefix=f"c{i}/"))
             for i, p in enumerate(programs)]
    ends: dict[int, float] = {}
    for i, pr in enumerate(procs):
        pr.callbacks.append(lambda ev, i=i: ends.__setitem__(i, env.now / PS))
    env.run()
    if env.now > MAX_PS:
        raise horizon_error(env.now / PS)
    missing = [i for i in range(len(programs)) if i not in ends]
    if missing:
        raise DeadlockError(f"collective {missing[0]} did not finish: no event pending at "
                            f"t = {env.now / PS} s")
    return [ends[i] for i in range(len(programs))]
