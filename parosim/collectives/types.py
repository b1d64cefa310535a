"""Collective vocabulary: operations, scopes, algorithms, and the lowered program.

Sizes follow nccl-tests: ``size_bytes`` is the full buffer, i.e. the all-gather *output*, the
reduce-scatter *input*, the all-reduce buffer.

A collective is lowered by an algorithm to a :class:`Program`: a list of :class:`Phase` s. Each
phase is a set of rings that run in lockstep (one coupled transfer: a pipelined ring moves at
the speed of its slowest hop, and a collective ends when its slowest ring ends). Phases sit on
*lanes*; a lane runs its phases one after the other in list order, different lanes run at the
same time, and ``deps`` adds cross-lane data dependencies. The same lane semantics drive the
closed form (:func:`parosim.collectives.cost.program_time`), the simpy engine and the real
torch.distributed executor.
"""

from __future__ import annotations

from dataclasses import dataclass, replace  # noqa: F401  (replace: the doctest)
from functools import cached_property

import numpy as np

from ..spec.collective import Algo, Op, Scope, parse_enum  # noqa: F401  (re-exported)


@dataclass(frozen=True)
class RingSet:
    """Disjoint rings of global ranks, each in ring order (hop i -> i+1, last -> first)."""

    rings: tuple[tuple[int, ...], ...]
    label: str  # "global", "intra", "inter": which link class the rings mainly use

    def __hash__(self) -> int:  # cached: a ring set holds up to n ranks and keys caches
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.rings, self.label))
            self.__dict__["_hash"] = h
        return h

    @cached_property
    def size(self) -> int:
        """k: ranks per ring."""
        return len(self.rings[0]) if self.rings else 0

    def hops(self):
        """Every (src, dst) hop of every ring."""
        for ring in self.rings:
            k = len(ring)
            if k > 1:
                for i in range(k):
                    yield ring[i], ring[(i + 1) % k]

    def ring_hops(self):
        """The hops grouped per ring (the per-step latency is a ring's mean hop latency)."""
        for ring in self.rings:
            k = len(ring)
            if k > 1:
                yield [(ring[i], ring[(i + 1) % k]) for i in range(k)]

    @cached_property
    def hop_arrays(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(src, dst): int64 arrays of shape (rings, k), row r the hops of ring r in
        :meth:`hops` order, when every ring has the same k > 1; None otherwise. What the
        closed form and the network use instead of a Python loop over 100,000 hops.

        >>> src, dst = RingSet(((0, 1, 2), (3, 4, 5)), "g").hop_arrays
        >>> dst.tolist()
        [[1, 2, 0], [4, 5, 3]]
        """
        if not self.rings or type(self).hops is not RingSet.hops \
                or type(self).ring_hops is not RingSet.ring_hops:
            return None   # a subclass with other hops (parosim.plan.layout.PairSet)
        k = len(self.rings[0])
        if k < 2 or any(len(r) != k for r in self.rings):
            return None
        src = np.array(self.rings, dtype=np.int64)
        return src, np.roll(src, -1, axis=1)

    @cached_property
    def rings_per_rank(self) -> int:
        """Rings each rank takes part in (channels of a flat ring; 1 for scope rings)."""
        if not self.rings:
            return 0
        first = self.rings[0][0]
        return sum(1 for r in self.rings if first in r)


@dataclass(frozen=True)
class HopSet:
    """An explicit set of (src, dst) hops moving together (an NCCL tree: every edge of the
    trees of every channel, up and down). Duck-types :class:`RingSet` for the network and the
    closed form; ``size`` is k, the ranks of one instance."""

    hop_list: tuple[tuple[int, int], ...]
    label: str
    size: int
    rings_per_rank: int = 1
    rings: tuple = ()

    def __hash__(self) -> int:
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.hop_list, self.label))
            self.__dict__["_hash"] = h
        return h

    def hops(self):
        return iter(self.hop_list)

    def ring_hops(self):
        if self.hop_list:
            yield list(self.hop_list)


@dataclass(frozen=True)
class Phase:
    """One ring collective on every ring of ``ringset``, ``buffer_bytes`` per ring.

    ``bytes_per_rank`` (what each rank sends, = factor x (k-1)/k x buffer) and ``steps``
    (ring steps, each paying the per-step latency) follow from op, k and buffer.
    """

    name: str
    op: Op
    ringset: RingSet
    buffer_bytes: float
    lane: str
    deps: tuple[int, ...] = ()
    # protocol costs resolved at lowering (collectives.nccl); the defaults are the ideal wire
    proto: str = ""              # "", "ll", "ll128", "simple"
    bw_eff: float = 1.0          # data fraction of the wire rate
    cap_Bps: float = float("inf")  # per-flow data-rate cap (channel caps, HBM)
    fixed_s: float = 0.0         # protocol latency + reduction time, added once
    tree_steps: int = 0          # > 0: an NCCL tree (``ringset`` is a HopSet)

    @cached_property
    def steps(self) -> int:
        if self.tree_steps:
            return self.tree_steps
        k = self.ringset.size
        return self.op.ring_factor * (k - 1) if k > 1 else 0

    @cached_property
    def bytes_per_rank(self) -> float:
        """Bytes every flow of the phase moves (a tree flow moves its buffer once)."""
        if self.tree_steps:
            return self.buffer_bytes
        k = self.ringset.size
        return self.op.ring_factor * (k - 1) / k * self.buffer_bytes if k > 1 else 0.0

    @property
    def kind(self) -> str:
        return "tree" if self.tree_steps else "ring"

    def renamed(self, name: str, deps: tuple[int, ...] | None = None) -> Phase:
        """This phase under another name (and deps): ``dataclasses.replace`` without its
        introspection, keeping the derived figures (a lowering copies one costed phase per
        HO-Ring chunk).

        >>> ph = Phase("a", Op.ALL_GATHER, RingSet(((0, 1),), "g"), 8.0, "main")
        >>> ph.renamed("b", (0,)) == replace(ph, name="b", deps=(0,))
        True
        """
        new = object.__new__(Phase)
        new.__dict__.update(self.__dict__)
        new.__dict__["name"] = name
        if deps is not None:
            new.__dict__["deps"] = deps
        return new


@dataclass(frozen=True)
class Program:
    """A lowered collective: phases on lanes (see module docstring)."""

    op: Op
    scope: Scope
    algo: Algo
    size_bytes: float
    gpus: int           # ranks taking part in one instance (k of the scope)
    phases: tuple[Phase, ...]
    chunks: int = 1     # HO-Ring chunk count (1 otherwise)
    choice: str = ""    # what the `nccl` algorithm picked, e.g. "ring/simple", "tree/ll"

    @property
    def protocols(self) -> str:
        """The protocols the phases use, e.g. "simple" or "ll128+simple" ("" = ideal)."""
        return "+".join(sorted({p.proto for p in self.phases if p.proto}))

    @property
    def tree(self) -> bool:
        return any(p.tree_steps for p in self.phases)
