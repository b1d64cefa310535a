"""Lowering a collective to a :class:`~parosim.collectives.types.Program`.

Three algorithms (docs/model.md, "Collectives"), each a small object with one method ``lower``:

* :class:`Ring` - one flat ring per instance of the scope, in rank order (NCCL-style).
* :class:`Hierarchical` (PaRO-CC) - for the global scope: the intra-group and inter-group
  rings one after the other. RS = intra RS (S), inter RS (S/m); AG = inter AG (S/m), intra AG
  (S); AR = intra RS (S), inter AR (S/m), intra AG (S).
* :class:`HORing` - the hierarchical decomposition cut into K chunks, the intra and inter
  phases of different chunks in flight at once on two lanes (a two-stage pipeline; for AR the
  intra lane runs every chunk's RS, then every chunk's AG, and the inter lane the chunks' AR).
  K is chosen, like NCCL's tuner picks chunk sizes from its cost model, as the K in
  1..``collective.ho_ring_max_chunks`` that minimises the closed-form cost; K = 1 is the
  hierarchical algorithm, so HO-Ring is never slower than it in the model.

For the intra and inter scopes there is no hierarchy to exploit: every algorithm lowers to the
flat ring on that scope.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np

from ..errors import InputError
from ..spec.collective import A2A_ALGOS
from ..spec.system import ClusterSpec
from .cost import latency_part, phase_time, program_time
from .nccl import (
    channel_rings,
    channels,
    instance_shape,
    make_phase,
    ring_phase_costs,
    tree_parts,
    tree_phase,
    tuner_time,
)
from .types import Algo, Op, Phase, Program, RingSet, Scope


@lru_cache(maxsize=256)
def scope_rings(spec: ClusterSpec, scope: Scope) -> RingSet:
    """The rings of a scope. Ranks are node-major: rank = node * gpn + local. A ring that
    spans several nodes with several NICs each is NCCL's channel rings
    (:func:`parosim.collectives.nccl.channel_rings`); otherwise rings are in rank order.

    >>> from parosim.spec.system import ClusterSpec
    >>> c = ClusterSpec(nodes=2, gpus_per_node=2)
    >>> scope_rings(c, Scope.INTER).rings
    ((0, 2), (1, 3))
    """
    m, ng = spec.group_size, spec.groups
    gn = spec.group_nodes
    if scope is Scope.GLOBAL:
        rings = channel_rings(spec, list(range(spec.nodes)))
    elif scope is Scope.INTRA and (gn == 1 or spec.gpus_per_node == 1
                                   or spec.nic.per_node <= 1):
        rings = tuple(tuple(range(g * m, (g + 1) * m)) for g in range(ng))  # rank order
    elif scope is Scope.INTRA:
        rings = tuple(r for g in range(ng)
                      for r in channel_rings(spec, list(range(g * gn, (g + 1) * gn))))
    else:
        rings = tuple(tuple(g * m + j for g in range(ng)) for j in range(m))
    return RingSet(rings, scope.value)


def scope_size(spec: ClusterSpec, scope: Scope) -> int:
    """k: ranks per ring of the scope (n, m or n/m)."""
    return {Scope.GLOBAL: spec.gpus, Scope.INTRA: spec.group_size,
            Scope.INTER: spec.groups}[scope]


class Ring:
    """Flat pipelined ring: AG/RS cost (k-1)a + (k-1)/k S/B, AR 2(k-1)a + 2(k-1)/k S/B
    (Thakur, Rabenseifner & Gropp 2005), B = the slowest hop's bandwidth."""

    algo = Algo.RING

    def lower(self, spec: ClusterSpec, op: Op, scope: Scope, size: float,
              proto: str | None = None) -> Program:
        rs = scope_rings(spec, scope)
        phases = (make_phase(spec, f"{op.value} {scope.value}", op, rs, size, "main",
                             proto=proto),)
        return Program(op, scope, self.algo, size, rs.size, phases)


def _hierarchical(spec: ClusterSpec, op: Op, size: float, chunks: int, algo: Algo) -> Program:
    intra, inter = scope_rings(spec, Scope.INTRA), scope_rings(spec, Scope.INTER)
    m, k = spec.group_size, chunks
    c_intra, c_inter = size / k, size / (m * k)
    lane_a, lane_b = ("intra", "inter") if k > 1 else ("main", "main")
    ph: list[Phase] = []
    # one costed phase per kind (every chunk's phase of a kind costs the same)
    if op is Op.ALL_GATHER:
        pa = make_phase(spec, "", op, inter, c_inter, lane_b)
        pb = make_phase(spec, "", op, intra, c_intra, lane_a)
        for c in range(k):
            ph.append(pa.renamed(f"inter AG c{c}"))
            ph.append(pb.renamed(f"intra AG c{c}", (len(ph) - 1,)))
    elif op is Op.REDUCE_SCATTER:
        pa = make_phase(spec, "", op, intra, c_intra, lane_a)
        pb = make_phase(spec, "", op, inter, c_inter, lane_b)
        for c in range(k):
            ph.append(pa.renamed(f"intra RS c{c}"))
            ph.append(pb.renamed(f"inter RS c{c}", (len(ph) - 1,)))
    else:
        prs = make_phase(spec, "", Op.REDUCE_SCATTER, intra, c_intra, lane_a)
        par = make_phase(spec, "", Op.ALL_REDUCE, inter, c_inter, lane_b)
        pag = make_phase(spec, "", Op.ALL_GATHER, intra, c_intra, lane_a)
        rs = [prs.renamed(f"intra RS c{c}") for c in range(k)]
        ar = [par.renamed(f"inter AR c{c}", (c,)) for c in range(k)]
        ag = [pag.renamed(f"intra AG c{c}", (k + c,)) for c in range(k)]
        # list order is execution order within a lane: intra lane runs RS*, then AG*
        ph = rs + ar + ag
    return Program(op, Scope.GLOBAL, algo, size, spec.gpus, tuple(ph), chunks)


class Hierarchical:
    """PaRO-CC: intra and inter rings in sequence (sum of their ring costs)."""

    algo = Algo.HIERARCHICAL

    def lower(self, spec: ClusterSpec, op: Op, scope: Scope, size: float) -> Program:
        if scope is not Scope.GLOBAL or spec.groups == 1 or spec.group_size == 1:
            p = Ring().lower(spec, op, scope, size)
            return Program(op, scope, self.algo, size, p.gpus, p.phases)
        return _hierarchical(spec, op, size, 1, self.algo)


class HORing:
    """Hierarchical Overlapping Ring: K-chunk pipeline of the intra and inter phases.

    For AG/RS the cost is the two-stage pipeline a + b + (K-1) max(a, b), a and b the chunk's
    intra and inter ring costs; for AR the lane recurrence of
    :func:`parosim.collectives.cost.program_time`.
    """

    algo = Algo.HO_RING

    def lower(self, spec: ClusterSpec, op: Op, scope: Scope, size: float,
              chunks: int | None = None) -> Program:
        if scope is not Scope.GLOBAL or spec.groups == 1 or spec.group_size == 1:
            p = Ring().lower(spec, op, scope, size)
            return Program(op, scope, self.algo, size, p.gpus, p.phases)
        if chunks is None:
            chunks = best_chunks(spec, op, size)
        return _hierarchical(spec, op, size, chunks, self.algo)


def best_chunks(spec: ClusterSpec, op: Op, size: float, intra: RingSet | None = None,
                inter: RingSet | None = None, m: int | None = None) -> int:
    """The K in 1..max_chunks minimising the closed-form HO-Ring time (smallest K on ties).

    Evaluates the same lane recurrence as :func:`parosim.collectives.cost.program_time` on
    per-chunk phase costs (protocols chosen per chunk size), without building a Program per K.
    ``intra``/``inter``/``m`` default to the cluster's group scopes and group size; the 3D
    layout (:mod:`parosim.plan.layout`) passes its own group ring sets.
    """
    intra = intra if intra is not None else scope_rings(spec, Scope.INTRA)
    inter = inter if inter is not None else scope_rings(spec, Scope.INTER)
    m = m if m is not None else spec.group_size
    return _best_chunks(spec, op, float(size), intra, inter, m)


@lru_cache(maxsize=4096)
def _best_chunks(spec: ClusterSpec, op: Op, size: float, intra: RingSet, inter: RingSet,
                 m: int) -> int:
    """:func:`best_chunks`, cached by (cluster, op, bytes, ring sets): the phase costs of
    every K at once (:func:`parosim.collectives.nccl.ring_phase_costs`, the same doubles as
    one ``make_phase`` per K), then the lane recurrence per K."""
    serial = spec.collective.serial_progress
    ks = np.arange(1, spec.collective.ho_ring_max_chunks + 1)

    def cost(o: Op, rs, bufs) -> tuple[list[float], list[float]]:
        t, lat = ring_phase_costs(spec, o, rs, bufs)
        return t.tolist(), lat.tolist()

    if op is Op.ALL_REDUCE:
        (rs_t, rs_l), (ag_t, ag_l) = (cost(Op.REDUCE_SCATTER, intra, size / ks),
                                      cost(Op.ALL_GATHER, intra, size / ks))
        ar_t, ar_l = cost(Op.ALL_REDUCE, inter, size / (m * ks))
    elif op is Op.ALL_GATHER:
        a_t, a_l = cost(op, inter, size / (m * ks))
        b_t, b_l = cost(op, intra, size / ks)
    else:
        a_t, a_l = cost(op, intra, size / ks)
        b_t, b_l = cost(op, inter, size / (m * ks))
    best_k, best_t = 1, float("inf")
    for i, k in enumerate(ks.tolist()):
        if op is Op.ALL_REDUCE:
            rs, l_rs, ag, l_ag, ar, l_ar = rs_t[i], rs_l[i], ag_t[i], ag_l[i], ar_t[i], ar_l[i]
            t = _ar_pipeline(k, rs, ar, ag)
            if serial:  # as in cost.program_time
                t = max(t, k * (l_rs + l_ag + l_ar) + min(rs - l_rs, ag - l_ag, ar - l_ar))
        else:
            a, la, b, lb = a_t[i], a_l[i], b_t[i], b_l[i]
            t = a + b + (k - 1) * max(a, b)
            if serial:
                t = max(t, k * (la + lb) + min(a - la, b - lb))
        if t < best_t * (1 - 1e-12):
            best_k, best_t = k, t
    return best_k


def _best_chunks_loop(spec: ClusterSpec, op: Op, size: float, intra: RingSet,
                      inter: RingSet, m: int) -> int:
    """The reference search: one ``make_phase`` per phase and K (what :func:`_best_chunks`
    reproduces; the tests compare them)."""
    serial = spec.collective.serial_progress

    def cost(o: Op, rs, buf: float) -> tuple[float, float]:
        p = make_phase(spec, "", o, rs, buf, "x")
        return phase_time(spec, p), latency_part(spec, p)

    best_k, best_t = 1, float("inf")
    for k in range(1, spec.collective.ho_ring_max_chunks + 1):
        if op is Op.ALL_REDUCE:
            (rs, l_rs), (ag, l_ag) = (cost(Op.REDUCE_SCATTER, intra, size / k),
                                      cost(Op.ALL_GATHER, intra, size / k))
            ar, l_ar = cost(Op.ALL_REDUCE, inter, size / (m * k))
            t = _ar_pipeline(k, rs, ar, ag)
            if serial:  # as in cost.program_time
                t = max(t, k * (l_rs + l_ag + l_ar) + min(rs - l_rs, ag - l_ag, ar - l_ar))
        else:
            if op is Op.ALL_GATHER:
                a, la = cost(op, inter, size / (m * k))
                b, lb = cost(op, intra, size / k)
            else:
                a, la = cost(op, intra, size / k)
                b, lb = cost(op, inter, size / (m * k))
            t = a + b + (k - 1) * max(a, b)
            if serial:
                t = max(t, k * (la + lb) + min(a - la, b - lb))
        if t < best_t * (1 - 1e-12):
            best_k, best_t = k, t
    return best_k


def _ar_pipeline(k: int, rs: float, ar: float, ag: float | None = None) -> float:
    """End of the HO-Ring all-reduce lanes: intra RS x k, then intra AG x k; inter AR x k."""
    ag = rs if ag is None else ag
    intra_free = k * rs                  # every RS done back to back first
    inter_free = 0.0
    for c in range(k):
        inter_free = max(inter_free, (c + 1) * rs) + ar
        intra_free = max(intra_free, inter_free) + ag  # AG c
    return intra_free


class NCCL:
    """NCCL's tuner: every (algorithm, protocol) pair NCCL could run for this collective -
    Ring with LL / LL128 / Simple, and for an all-reduce spanning several nodes Tree with
    each protocol - lowered and costed; the fastest in the closed form is returned (ties:
    ring before tree, then LL, LL128, Simple). See :mod:`parosim.collectives.nccl`."""

    algo = Algo.NCCL

    def candidates(self, spec: ClusterSpec, op: Op, scope: Scope, size: float) -> list[Program]:
        tun = spec.collective
        protos = list(tun.protocols) if tun.model == "nccl" else [None]
        out = []
        if "ring" in tun.algorithms or op is not Op.ALL_REDUCE:
            for p in protos:
                prog = Ring().lower(spec, op, scope, size, proto=p)
                out.append(replace(prog, algo=self.algo,
                                   choice=f"ring/{p}" if p else "ring"))
        parts = tree_parts(spec, scope)
        if op is Op.ALL_REDUCE and "tree" in tun.algorithms and parts is not None:
            for p in protos:
                ph = tree_phase(spec, scope.value, size, p, parts)
                out.append(Program(op, scope, self.algo, size, ph.ringset.size, (ph,),
                                   choice=f"tree/{p}" if p else "tree"))
        return out

    def lower(self, spec: ClusterSpec, op: Op, scope: Scope, size: float) -> Program:
        """The fastest candidate in parosim's cost, or with ``collective.choice: tuner`` the
        one NCCL's own estimate picks (:func:`parosim.collectives.nccl.tuner_time`)."""
        tun = spec.collective
        cands = self.candidates(spec, op, scope, size)
        tuner = tun.model == "nccl" and tun.choice == "tuner"
        parts = tree_parts(spec, scope) if tuner else None
        best, best_t = None, float("inf")
        for prog in cands:
            if tuner:
                alg, proto = prog.choice.split("/")
                if alg == "tree":
                    nodes, nranks = len(parts[0][0]), len(parts[0][0]) * len(parts[0][1])
                else:
                    rs = prog.phases[0].ringset
                    nodes, nranks = instance_shape(spec, rs)[0], rs.size
                t = tuner_time(spec, alg, proto, op, size, nranks, nodes)
            else:
                t = program_time(spec, prog)
            if t < best_t * (1 - 1e-12):
                best, best_t = prog, t
        return best


ALGORITHMS = {Algo.RING: Ring(), Algo.HIERARCHICAL: Hierarchical(), Algo.HO_RING: HORing(),
              Algo.NCCL: NCCL()}


def lower(spec: ClusterSpec, op: Op, scope: Scope, size_bytes: float, algo: Algo) -> Program:
    """Lower one collective with the chosen algorithm.

    >>> from parosim.spec.system import ClusterSpec
    >>> p = lower(ClusterSpec(nodes=2), Op.ALL_GATHER, Scope.GLOBAL, 2**20, Algo.HIERARCHICAL)
    >>> [ph.name for ph in p.phases]
    ['inter AG c0', 'intra AG c0']
    """
    if op is Op.ALL_TO_ALL:
        if algo not in (*A2A_ALGOS, Algo.NCCL):
            raise InputError(f"--algo {algo.value} does not run an all-to-all; expected one of "
                             f"{', '.join(a.value for a in A2A_ALGOS)} or nccl (= p2p)")
        from .alltoall import lower_alltoall  # deferred: only an all-to-all needs it (start-up)

        return lower_alltoall(spec, scope, float(size_bytes), algo)
    if algo in A2A_ALGOS:
        raise InputError(f"--algo {algo.value} is an all-to-all algorithm; --op {op.value} "
                         "expected ring, hierarchical, ho-ring or nccl")
    return ALGORITHMS[algo].lower(spec, op, scope, float(size_bytes))


def chain_fill_s(spec: ClusterSpec, ringset: RingSet) -> float:
    """The pipeline fill of a chain (a broadcast) over one ring of ``ringset``: its first chunk
    (``collective.chain_chunk`` bytes per channel) crosses the k - 1 hops before the last rank
    receives anything, each hop at its per-channel bandwidth (a GPU's NVLink bandwidth, or a
    node's NICs together, shared by the C channels). 0 when ``chain_chunk`` is 0.

    >>> from parosim.spec.system import ClusterSpec, CollectiveTuning
    >>> c = ClusterSpec(nodes=2, gpus_per_node=2, collective=CollectiveTuning(
    ...     chain_chunk_bytes=1e6))
    >>> rs = scope_rings(c, Scope.GLOBAL)
    >>> chain_fill_s(c, rs) == 1e6 * (2 / c.intra.bandwidth_Bps + 1 / c.nic.bandwidth_Bps)
    True
    """
    chunk = spec.collective.chain_chunk_bytes
    if not chunk or ringset.size < 2:
        return 0.0
    C = channels(spec) if spec.collective.model == "nccl" else 1
    ring = ringset.rings[0]
    gpn = spec.gpus_per_node
    nodes = len({r // gpn for r in ring})
    k = len(ring)
    intra_Bps = spec.intra.bandwidth_Bps / C
    net_Bps = spec.nic.per_node * spec.nic.bandwidth_Bps / C
    return chunk * ((k - nodes) / intra_Bps + (nodes - 1) / net_Bps)


def with_chain_fill(spec: ClusterSpec, prog: Program) -> Program:
    """``prog`` as a chain (broadcast): every phase pays :func:`chain_fill_s` once, in its
    fixed latency (closed form and engine alike)."""
    if not spec.collective.chain_chunk_bytes:
        return prog
    phases = tuple(replace(p, fixed_s=p.fixed_s + chain_fill_s(spec, p.ringset))
                   for p in prog.phases)
    return replace(prog, phases=phases)
