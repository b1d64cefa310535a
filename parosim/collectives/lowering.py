"""Lowering a collective to a :class:`~parosim.collectives.types.Program`.

Three algorithms (PARO.md, "Collectives"), each a small object with one method ``lower``:

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

from functools import lru_cache

from ..specs import ClusterSpec
from .types import Algo, Op, Phase, Program, RingSet, Scope


@lru_cache(maxsize=256)
def scope_rings(spec: ClusterSpec, scope: Scope) -> RingSet:
    """The rings of a scope, in rank order. Ranks are node-major: rank = node * gpn + local.

    >>> from parosim.specs import ClusterSpec
    >>> c = ClusterSpec(nodes=2, gpus_per_node=2)
    >>> scope_rings(c, Scope.INTER).rings
    ((0, 2), (1, 3))
    """
    n, m, ng = spec.gpus, spec.group_size, spec.groups
    if scope is Scope.GLOBAL:
        rings = (tuple(range(n)),)
    elif scope is Scope.INTRA:
        rings = tuple(tuple(range(g * m, (g + 1) * m)) for g in range(ng))
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

    def lower(self, spec: ClusterSpec, op: Op, scope: Scope, size: float) -> Program:
        rs = scope_rings(spec, scope)
        phases = (Phase(f"{op.value} {scope.value}", op, rs, size, "main"),)
        return Program(op, scope, self.algo, size, rs.size, phases)


def _hierarchical(spec: ClusterSpec, op: Op, size: float, chunks: int, algo: Algo) -> Program:
    intra, inter = scope_rings(spec, Scope.INTRA), scope_rings(spec, Scope.INTER)
    m, k = spec.group_size, chunks
    c_intra, c_inter = size / k, size / (m * k)
    lane_a, lane_b = ("intra", "inter") if k > 1 else ("main", "main")
    ph: list[Phase] = []
    if op is Op.ALL_GATHER:
        for c in range(k):
            ph.append(Phase(f"inter AG c{c}", op, inter, c_inter, lane_b))
            ph.append(Phase(f"intra AG c{c}", op, intra, c_intra, lane_a, (len(ph) - 1,)))
    elif op is Op.REDUCE_SCATTER:
        for c in range(k):
            ph.append(Phase(f"intra RS c{c}", op, intra, c_intra, lane_a))
            ph.append(Phase(f"inter RS c{c}", op, inter, c_inter, lane_b, (len(ph) - 1,)))
    else:
        rs = [Phase(f"intra RS c{c}", Op.REDUCE_SCATTER, intra, c_intra, lane_a)
              for c in range(k)]
        ar = [Phase(f"inter AR c{c}", Op.ALL_REDUCE, inter, c_inter, lane_b, (c,))
              for c in range(k)]
        ag = [Phase(f"intra AG c{c}", Op.ALL_GATHER, intra, c_intra, lane_a, (k + c,))
              for c in range(k)]
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


def best_chunks(spec: ClusterSpec, op: Op, size: float) -> int:
    """The K in 1..max_chunks minimising the closed-form HO-Ring time (smallest K on ties).

    Evaluates the same lane recurrence as :func:`parosim.collectives.cost.program_time` on
    per-chunk phase costs, without building a Program per K.
    """
    from .cost import ring_alpha_beta

    a_in, b_in = ring_alpha_beta(spec, scope_rings(spec, Scope.INTRA))
    a_out, b_out = ring_alpha_beta(spec, scope_rings(spec, Scope.INTER))
    m, ng = spec.group_size, spec.groups

    over = spec.collective.phase_overhead_s

    def ring(k: int, f: int, alpha: float, bw: float, buf: float) -> float:
        return f * (k - 1) * alpha + f * (k - 1) / k * buf / bw + over

    best_k, best_t = 1, float("inf")
    for k in range(1, spec.collective.ho_ring_max_chunks + 1):
        intra = ring(m, 1, a_in, b_in, size / k)
        f = 2 if op is Op.ALL_REDUCE else 1
        inter = ring(ng, f, a_out, b_out, size / (m * k))
        if op is Op.ALL_REDUCE:
            t = _ar_pipeline(k, intra, inter)
        else:
            t = intra + inter + (k - 1) * max(intra, inter)
        if spec.collective.serial_progress:  # as in cost.program_time
            lat_in = (m - 1) * a_in + over
            lat_out = f * (ng - 1) * a_out + over
            n_intra = 2 * k if op is Op.ALL_REDUCE else k
            t = max(t, n_intra * lat_in + k * lat_out
                    + min(intra - lat_in, inter - lat_out))
        if t < best_t * (1 - 1e-12):
            best_k, best_t = k, t
    return best_k


def _ar_pipeline(k: int, rs: float, ar: float) -> float:
    """End of the HO-Ring all-reduce lanes: intra RS x k, then intra AG x k; inter AR x k."""
    intra_free = k * rs                  # every RS done back to back first
    inter_free = 0.0
    for c in range(k):
        inter_free = max(inter_free, (c + 1) * rs) + ar
        intra_free = max(intra_free, inter_free) + rs  # AG c (same cost as RS c)
    return intra_free


ALGORITHMS = {Algo.RING: Ring(), Algo.HIERARCHICAL: Hierarchical(), Algo.HO_RING: HORing()}


def lower(spec: ClusterSpec, op: Op, scope: Scope, size_bytes: float, algo: Algo) -> Program:
    """Lower one collective with the chosen algorithm.

    >>> from parosim.specs import ClusterSpec
    >>> p = lower(ClusterSpec(nodes=2), Op.ALL_GATHER, Scope.GLOBAL, 2**20, Algo.HIERARCHICAL)
    >>> [ph.name for ph in p.phases]
    ['inter AG c0', 'intra AG c0']
    """
    return ALGORITHMS[algo].lower(spec, op, scope, float(size_bytes))
