"""Expert-parallel dispatch and combine as DeepEP's kernels move the tokens.

A dispatch sends each of a rank's T tokens (``token_bytes`` each) to the ranks holding the
experts its router picked; a combine sends them back. DeepEP (github deepseek-ai/DeepEP) has
two kernel families, and each is lowered here to a :class:`~parosim.collectives.types.Program`
of point-to-point :class:`~parosim.collectives.alltoall.PairSet` phases, so the closed form
(:func:`~parosim.collectives.cost.program_time`) and the engine
(:func:`~parosim.collectives.simulate.simulate_program`) cost the same traffic:

* **normal kernels** (training, prefill). Inside one node: one NVLink phase, every rank sends
  to every other rank of the EP group the tokens routed to it, once per rank whatever the
  number of its experts a token picked (T·p_rank tokens per flow). Across nodes, DeepEP's
  NVLink + RDMA forwarding (the ``hierarchical-a2a`` shape with DeepEP's own byte counts):
  stage 1, RDMA, rank (g, j) sends to rank (h, j) of every other node h the tokens routed to
  node h, once per node (T·p_node per flow); stage 2, NVLink, rank (g, j) forwards to every
  other rank (g, l) of its node the tokens of all ng nodes' j-ranks routed to l
  (ng·T·p_rank per flow). The two stages are pipelined in K chunks, K in
  1..``collective.ho_ring_max_chunks`` minimising the closed form. A combine runs the same
  flows in the opposite order (NVLink, then RDMA).
* **low-latency kernels** (decoding): every (token, expert) pick is its own message, no
  deduplication per rank or node (T·k/EP per flow). The first release sends all of them
  over RDMA, to peers of the same node too (``nvlink=False``: modelled as a cluster of
  one-GPU nodes with the same NIC); since 2025-06 peers of the same node
  are reached over NVLink (github.com/deepseek-ai/DeepEP/pull/173; ``nvlink=True``: an
  NVLink phase and an RDMA phase at once).
* **HybridEP** (``hybrid``; DeepEP's hybrid-ep branch, docs/README_Hybrid-EP.md): the
  normal kernels' shape (RDMA to the rail-matched GPU of each node, NVLink forwarding) with
  its own costs, ``collective.ep_hybrid``.

Costs: each phase moves its bytes at ``collective.ep_normal`` / ``ep_ll`` / ``ep_hybrid``'s
``nvlink_efficiency`` or ``rdma_efficiency`` times the wire rate of its most loaded link, plus
the path latency of its slowest pair; the kernel's ``latency`` is paid once, before the first
phase. p_rank and p_node come from :func:`deepep_routing`, which replays the router of
DeepEP's benchmark scripts. docs/moe.md ("DeepEP dispatch and combine").
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from ..errors import InputError
from ..spec.system import ClusterSpec, EPKernelCost
from .alltoall import PairSet, check_flows
from .cost import program_time
from .types import Algo, Op, Phase, Program, Scope

KERNELS = ("normal", "low-latency", "hybrid")
#: the ``collective`` section of each kernel family
COST_KEYS = {"normal": "ep_normal", "low-latency": "ep_ll", "hybrid": "ep_hybrid"}
DIRECTIONS = ("dispatch", "combine")


class EPDispatcher(str, enum.Enum):
    """The DeepEP kernel families as dispatchers of a MoE layer or step (``--a2a-algo``,
    beside ``p2p`` and ``hierarchical-a2a``); :attr:`kernel` is the :data:`KERNELS` name."""

    DEEPEP_NORMAL = "deepep-normal"
    DEEPEP_LL = "deepep-ll"
    HYBRIDEP = "hybridep"

    @property
    def kernel(self) -> str:
        return {"deepep-normal": "normal", "deepep-ll": "low-latency",
                "hybridep": "hybrid"}[self.value]

#: tokens :func:`deepep_routing` draws to estimate the routing shares of the grouped router
#: (their sampling error, below 0.5 %, is checked in tests/test_deepep.py)
ROUTING_SAMPLES = 16384


def fp8_token_bytes(hidden: int) -> float:
    """Bytes of one FP8 token as DeepEP's normal kernels count it: ``hidden`` e4m3 values
    and one fp32 scale per 128 (``fp8_factor = (1 + 4/128) / 2`` of the bf16 bytes in
    tests/test_intranode.py and test_internode.py)."""
    return hidden * (1 + 4 / 128)


def ll_fp8_token_bytes(hidden: int) -> float:
    """Bytes of one FP8 token of the low-latency kernels (tests/test_low_latency.py,
    ``num_fp8_bytes = hidden + hidden / 128 * 4 + 16``: values, scales and 16 B of
    metadata)."""
    return hidden + hidden / 128 * 4 + 16


def bf16_token_bytes(hidden: int) -> float:
    """Bytes of one BF16 token (combine, and a BF16 dispatch)."""
    return 2.0 * hidden


@dataclass(frozen=True)
class Routing:
    """Where a rank's tokens go, on average: ``p_rank`` the share of its tokens routed to a
    given rank of the EP group (itself included), ``p_node`` to a given node (its own
    included), ``topk`` the experts each token picks."""

    ep: int
    gpus_per_node: int
    p_rank: float
    p_node: float
    topk: int


def _hit(n: int, own: int, k: int) -> float:
    """Probability that k of n experts drawn without replacement include one of a given
    ``own`` of them: 1 - C(n - own, k) / C(n, k)."""
    return 1.0 - math.comb(n - own, k) / math.comb(n, k)


@lru_cache(maxsize=64)
def deepep_routing(ep: int, gpus_per_node: int, experts: int = 256, topk: int = 8,
                   topk_groups: int = 4, grouped: bool = True,
                   samples: int = ROUTING_SAMPLES, seed: int = 0) -> Routing:
    """The routing shares of DeepEP's benchmark router, replayed with numpy (seeded: the same
    result on every run). Scores |N(0, 1)| + 1 per (token, expert) over
    ``(experts // ep) * ep`` experts; with ``grouped`` and several nodes (test_internode.py)
    each token first keeps the ``min(nodes, topk_groups)`` nodes with the highest expert
    score, then its ``topk`` best experts among theirs; else (test_intranode.py,
    test_low_latency.py) its ``topk`` best experts, k experts at random, whose shares are
    exact (hypergeometric, no sampling). Experts are laid out rank by rank."""
    if ep < 1 or topk < 1 or experts < ep:
        raise InputError(f"EP routing: ep = {ep}, experts = {experts}, top-k = {topk}: "
                         "expected 1 <= ep <= experts and top-k >= 1")
    nodes = max(1, ep // gpus_per_node)
    n_exp = (experts // ep) * ep
    if topk > n_exp:
        raise InputError(f"EP routing: top-k = {topk} is more than the {n_exp} experts")
    if not (grouped and nodes > 1):  # the plain top-k of i.i.d. scores: k experts at random
        return Routing(ep, gpus_per_node, _hit(n_exp, n_exp // ep, topk),
                       _hit(n_exp, n_exp // nodes, topk), topk)
    rng = np.random.default_rng(seed)
    scores = np.abs(rng.standard_normal((samples, n_exp), dtype=np.float32)) + 1.0
    g = min(nodes, topk_groups)
    best = scores.reshape(samples, nodes, -1).max(axis=2)
    keep = np.zeros((samples, nodes), dtype=bool)
    np.put_along_axis(keep, np.argpartition(-best, g - 1, axis=1)[:, :g], True, axis=1)
    scores = np.where(np.repeat(keep, n_exp // nodes, axis=1), scores, -np.inf)
    picks = np.argpartition(-scores, topk - 1, axis=1)[:, :topk]
    hit_rank = np.zeros((samples, ep), dtype=bool)
    np.put_along_axis(hit_rank, picks // (n_exp // ep), True, axis=1)
    hit_node = np.zeros((samples, nodes), dtype=bool)
    np.put_along_axis(hit_node, picks // (n_exp // nodes), True, axis=1)
    return Routing(ep, gpus_per_node, float(hit_rank.mean()), float(hit_node.mean()), topk)


@dataclass(frozen=True)
class EPCall:
    """One dispatch or combine call of every rank of an EP group of ``routing.ep`` ranks:
    ``tokens`` per rank of ``token_bytes`` each. ``nvlink``: low-latency kernels reach peers
    of the same node over NVLink (DeepEP since 2025-06) rather than RDMA."""

    kernel: str
    direction: str
    tokens: int
    token_bytes: float
    routing: Routing
    nvlink: bool = True

    def __post_init__(self) -> None:
        if self.kernel not in KERNELS:
            raise InputError(f"EP kernel {self.kernel!r} is not known; expected one of "
                             f"{', '.join(KERNELS)}")
        if self.direction not in DIRECTIONS:
            raise InputError(f"EP call direction {self.direction!r} is not known; expected "
                             f"one of {', '.join(DIRECTIONS)}")
        if self.kernel != "low-latency" and not self.nvlink:
            raise InputError(f"EP call: the {self.kernel} kernels forward over NVLink; "
                             "nvlink=False is for the low-latency kernels")
        if not (self.tokens >= 1 and self.token_bytes > 0):
            raise InputError(f"EP call: {self.tokens} tokens of {self.token_bytes} B: expected "
                             "at least one token of a positive size")


def ep_cluster(spec: ClusterSpec, call: EPCall) -> ClusterSpec:
    """The cluster one EP group of ``call`` runs on: ``spec`` with ep / gpus_per_node nodes
    (one node when the group fits in one); the pure-RDMA low-latency kernels see every GPU
    as a node of its own with its NIC."""
    ep, gpn = call.routing.ep, spec.gpus_per_node
    if not spec.closed_form_exact:
        raise InputError(f"cluster {spec.name!r} has link overrides or ECMP hashing: the EP "
                         "kernel costs take a cluster of equal links; expected one without")
    if call.routing.gpus_per_node != gpn:
        raise InputError(f"EP routing for {call.routing.gpus_per_node} GPUs per node on a "
                         f"cluster of {gpn}; expected the same")
    if ep > gpn and ep % gpn:
        raise InputError(f"EP {ep} over nodes of {gpn} GPUs: expected a multiple of {gpn}")
    if ep < gpn and gpn % ep:
        raise InputError(f"EP {ep} inside a node of {gpn} GPUs: expected a divisor of {gpn}")
    if call.kernel == "low-latency" and not call.nvlink:
        return replace(spec, nodes=ep, gpus_per_node=1, group_nodes=1, overrides=(),
                       nic=replace(spec.nic, per_node=1))
    return replace(spec, nodes=max(1, ep // gpn), group_nodes=1)


def _cost(spec: ClusterSpec, call: EPCall) -> EPKernelCost:
    return getattr(spec.collective, COST_KEYS[call.kernel])


def _ph(name: str, hops: list[tuple[int, int]], k: int, per_flow: float, lane: str,
        eff: float, fixed: float = 0.0, deps: tuple[int, ...] = ()) -> Phase:
    return Phase(name, Op.ALL_TO_ALL, PairSet(tuple(hops), name.split()[0], k), per_flow, lane,
                 deps, bw_eff=eff, fixed_s=fixed, tree_steps=1)


def lower_ep_call(spec: ClusterSpec, call: EPCall, chunks: int | None = None
                  ) -> tuple[ClusterSpec, Program]:
    """(the EP group's cluster, the program of ``call``) on ``spec``'s hardware (module
    docstring); ``chunks`` fixes K of the pipelined normal kernels (else the best)."""
    c = ep_cluster(spec, call)
    cost = _cost(c, call)
    ep, gpn, r, t, b = call.routing.ep, c.gpus_per_node, call.routing, call.tokens, \
        call.token_bytes
    ranks = range(ep)
    check_flows(ep * (ep - 1))
    if call.kernel == "low-latency":
        per_flow = t * r.topk / ep * b
        same = [(a, d) for a in ranks for d in ranks if a != d and a // gpn == d // gpn]
        other = [(a, d) for a in ranks for d in ranks if a // gpn != d // gpn]
        phases = [_ph(f"{name} ll", hops, ep, per_flow, name, eff, cost.latency_s)
                  for name, hops, eff in (("nvlink", same, cost.nvlink_efficiency),
                                          ("rdma", other, cost.rdma_efficiency)) if hops]
        return c, Program(Op.ALL_TO_ALL, Scope.GLOBAL, Algo.P2P, per_flow * ep, ep,
                          tuple(phases))
    if ep <= gpn:
        hops = [(a, d) for a in ranks for d in ranks if a != d]
        ph = _ph("nvlink a2a", hops, ep, t * r.p_rank * b, "main", cost.nvlink_efficiency,
                 cost.latency_s)
        return c, Program(Op.ALL_TO_ALL, Scope.GLOBAL, Algo.P2P, t * r.p_rank * b * ep, ep,
                          (ph,))
    if chunks is not None:
        return c, _forwarding(c, call, cost, chunks)
    best, best_t = None, float("inf")
    for k in range(1, c.collective.ho_ring_max_chunks + 1):
        prog = _forwarding(c, call, cost, k)
        tk = program_time(c, prog)
        if tk < best_t * (1 - 1e-12):
            best, best_t = prog, tk
    return c, best


def _forwarding(c: ClusterSpec, call: EPCall, cost: EPKernelCost, chunks: int) -> Program:
    """DeepEP's normal internode kernel in ``chunks`` pipelined chunks (module docstring)."""
    gpn, ep, r = c.gpus_per_node, call.routing.ep, call.routing
    ng = ep // gpn
    b = call.tokens * call.token_bytes
    rdma = [(g * gpn + j, h * gpn + j) for g in range(ng) for h in range(ng) if g != h
            for j in range(gpn)]
    nvl = [(g * gpn + j, g * gpn + q) for g in range(ng) for j in range(gpn)
           for q in range(gpn) if j != q]
    lanes = ("inter", "intra") if chunks > 1 else ("main", "main")
    pa = _ph("rdma", rdma, ep, b * r.p_node / chunks, lanes[0], cost.rdma_efficiency)
    pb = _ph("nvlink", nvl, ep, ng * b * r.p_rank / chunks, lanes[1], cost.nvlink_efficiency)
    first, second = (pa, pb) if call.direction == "dispatch" else (pb, pa)
    phases: list[Phase] = []
    for k in range(chunks):
        a = replace(first, name=f"{first.name} c{k}",
                    fixed_s=cost.latency_s if k == 0 else 0.0)
        phases.append(a)
        phases.append(replace(second, name=f"{second.name} c{k}", deps=(len(phases) - 1,)))
    return Program(Op.ALL_TO_ALL, Scope.GLOBAL, Algo.HIERARCHICAL_A2A,
                   b * r.p_rank * ep, ep, tuple(phases), chunks)


def ep_call_time(spec: ClusterSpec, call: EPCall) -> float:
    """Closed-form time in s of ``call`` on ``spec``'s hardware (:func:`lower_ep_call`)."""
    c, prog = lower_ep_call(spec, call)
    return program_time(c, prog)


def lower_ep_groups(spec: ClusterSpec, call: EPCall, groups: list[list[int]] | tuple
                    ) -> Program:
    """``call`` run by every EP group of ``groups`` at once on the whole cluster ``spec``
    (a MoE layer's or step's EP layout): :func:`lower_ep_call`'s program for one group with
    its ranks renamed to each group's, the flows of all groups in one phase, K (normal
    kernels across nodes) the best for the whole cluster's closed form. A group must be
    consecutive ranks starting on a multiple of min(EP, GPUs per node) (node-aligned, the
    layout of :class:`~parosim.plan.experts.ExpertLayout`); the pure-RDMA low-latency
    kernels (``nvlink=False``) are for one group alone."""
    ep, gpn = call.routing.ep, spec.gpus_per_node
    if call.kernel == "low-latency" and not call.nvlink:
        raise InputError("EP call over an EP layout: the pure-RDMA low-latency kernels "
                         "(nvlink=False) model one group alone; expected nvlink=True")
    for g in groups:
        if len(g) != ep or list(g) != list(range(g[0], g[0] + ep)) or g[0] % min(ep, gpn):
            raise InputError(f"EP group {list(g)[:4]}... of {len(g)} ranks: the DeepEP kernels "
                             f"take groups of {ep} consecutive ranks aligned to "
                             f"{min(ep, gpn)}; expected such a layout")
    check_flows(len(groups) * ep * (ep - 1))

    wide: dict = {}   # one group's pair set -> every group's (keyed by its hops)

    def widen(prog: Program) -> Program:
        def pairs(rs: PairSet) -> PairSet:
            key = (rs.hop_list, rs.label)
            if key not in wide:
                wide[key] = PairSet(tuple((g[0] + a, g[0] + b) for g in groups
                                          for a, b in rs.hop_list), rs.label, ep)
            return wide[key]
        return replace(prog, phases=tuple(replace(ph, ringset=pairs(ph.ringset))
                                          for ph in prog.phases))

    c, prog = lower_ep_call(spec, call, chunks=1)
    best = widen(prog)
    if call.kernel == "low-latency" or ep <= gpn:
        return best
    best_t = program_time(spec, best)
    for k in range(2, c.collective.ho_ring_max_chunks + 1):
        prog = widen(lower_ep_call(spec, call, chunks=k)[1])
        tk = program_time(spec, prog)
        if tk < best_t * (1 - 1e-12):
            best, best_t = prog, tk
    return best
