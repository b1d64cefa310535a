"""3D parallelism layout: rank <-> (tp, dp, pp) coordinates, groups as scopes, their lowering.

A job of n GPUs runs tensor parallelism of degree t (TP), pipeline parallelism of degree p (PP)
and data parallelism over the remaining d = n / (t·p) GPUs (DP). Ranks follow Megatron-LM's
default order (TP fastest, then DP, then PP; ``megatron/core/parallel_state.py``, order
"tp-dp-pp"):

    rank = tp + t·(dp + d·pp)

so with t dividing the GPUs of a node a TP group lies inside one node (NVLink), consecutive DP
ranks sit on the same node when t < GPUs per node, and a pipeline stage is a block of n/p ranks.

Groups as scopes
    * TP group of stage k: the t ranks (0..t-1, dp, k); one op covers the d TP groups of
      stage k at once (like a Plan's ``intra`` scope covers every group);
    * DP group: the d ranks (tp, 0..d-1, k). PaRO's three levels apply to the DP group: its
      ``intra`` part is the DP ranks inside one PaRO group of nodes (``cluster.group_nodes``
      nodes, default 1: a node), m_dp of them; ``inter`` the DP ranks at the same position in
      every PaRO group (d/m_dp of them); ``global`` the whole DP group. With t = 8 on 8-GPU
      nodes a node holds one DP rank of a group (m_dp = group_nodes).
    * pipeline neighbours: (tp, dp, k) -> (tp, dp, k+1) (and stage p-1 -> 0 for the
      interleaved schedule's wrap from chunk c to chunk c+1).

Lowering (:func:`lower_group`): a collective over a set of groups is lowered like the
cluster-wide scopes of :mod:`parosim.collectives.lowering`: ``ring`` = one flat ring per group
in group order; ``hierarchical`` (PaRO-CC) = the intra rings then the inter rings (RS), the
reverse (AG), RS + AR + AG (AR); ``ho-ring`` = the same phases cut into K chunks on two lanes,
K minimising the closed form. A point-to-point transfer is a :class:`PairSet`: one flow per
(sender, receiver) pair, one step. Costs come from the same
:func:`parosim.collectives.cost.ring_alpha_beta` (NIC and uplink sharing counted from the
pairs), so the closed form and the engine agree as for the existing scopes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property, lru_cache

from ..collectives.cost import program_time
from ..collectives.lowering import best_chunks, lower, scope_rings
from ..collectives.nccl import make_phase, tree_phase
from ..collectives.types import Algo, Op, Phase, Program, RingSet, Scope, parse_enum
from ..errors import InputError
from ..fabric.network import symmetry_period
from ..spec.system import ClusterSpec

SCHEDULES = ("1f1b", "interleaved")
RECOMPUTE_MODES = ("none", "selective", "full")


def _pos_int(v: object, name: str) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise InputError(f"{name} = {v!r} must be a positive integer")


@dataclass(frozen=True)
class ParallelSpec:
    """Model parallelism of a job. ``tp``: tensor-parallel degree t; ``pp``: pipeline stages p;
    ``schedule``: ``1f1b`` (PipeDream-flush, Narayanan et al. 2021 §2.2.1) or ``interleaved``
    (``virtual`` model chunks per stage, §2.2.2); ``sequence_parallel``: Korthikanti et al.
    2022 §4.2.2 (all-gather + reduce-scatter instead of all-reduce, activations split by t);
    ``selective_recompute``: recompute only the attention core (Korthikanti §5);
    ``tp_algo``: collective algorithm of TP collectives whose group crosses nodes (None: the
    step's algorithm); ``tp_comm_overlap``: Megatron-Core / Transformer Engine userbuffers
    overlap of the sequence-parallel all-gathers / reduce-scatters with their GEMMs (needs
    ``sequence_parallel``; docs/parallelism.md, "TP communication overlap");
    ``dp_comm_overlap``: Megatron-Core's ``overlap_grad_reduce`` + ``overlap_param_gather``:
    the data-parallel gradient reduction and parameter all-gather run bucket by bucket beside
    the last micro-batch's backward and the first micro-batch's forward (needs t or p > 1;
    docs/parallelism.md, "DP communication overlap"); ``cp``: Megatron-Core's
    ``context_parallel_size`` (ring attention, Transformer Engine's ``p2p`` CP: the sequence
    split over cp ranks; docs/parallelism.md, "Context parallelism").

    >>> ParallelSpec(tp=8, pp=4).trivial, ParallelSpec().trivial
    (False, True)
    >>> ParallelSpec(pp=4, schedule="interleaved").virtual
    2
    """

    tp: int = 1
    pp: int = 1
    schedule: str = "1f1b"
    virtual: int | None = None
    sequence_parallel: bool = False
    selective_recompute: bool = False
    tp_algo: Algo | None = None
    tp_comm_overlap: bool = False
    dp_comm_overlap: bool = False
    cp: int = 1

    def __post_init__(self) -> None:
        _pos_int(self.tp, "--tp")
        _pos_int(self.pp, "--pp")
        _pos_int(self.cp, "--cp")
        if self.schedule not in SCHEDULES:
            raise InputError(f"--pp-schedule {self.schedule!r} is not known; expected one of "
                             f"{', '.join(SCHEDULES)}")
        v = self.virtual
        if v is None:
            v = 2 if self.schedule == "interleaved" else 1
            object.__setattr__(self, "virtual", v)
        _pos_int(v, "--virtual-stages")
        if self.schedule == "1f1b" and v != 1:
            raise InputError(f"--virtual-stages {v} needs --pp-schedule interleaved; the 1f1b "
                             "schedule has one model chunk per stage")
        if self.schedule == "interleaved":
            if self.pp < 2:
                raise InputError("--pp-schedule interleaved needs --pp >= 2 (it interleaves "
                                 "model chunks over several pipeline stages)")
            if v < 2:
                raise InputError(f"--virtual-stages {v} with --pp-schedule interleaved is "
                                 "1f1b (one chunk per stage); expected --virtual-stages >= 2")
        if self.tp_comm_overlap and not (self.sequence_parallel and self.tp >= 2):
            got = f"--tp {self.tp}" + ("" if self.sequence_parallel
                                        else " without --sequence-parallel")
            raise InputError(f"--tp-comm-overlap needs --sequence-parallel and --tp >= 2 (got "
                             f"{got}); "
                             "Megatron-Core overlaps only the sequence-parallel all-gathers and "
                             "reduce-scatters and refuses tp_comm_overlap without them")
        if self.dp_comm_overlap and self.tp == 1 and self.pp == 1:
            raise InputError("--dp-comm-overlap needs --tp >= 2 or --pp >= 2 (the 3D path); "
                             "with data parallelism alone the bucketed gradient / parameter "
                             "overlap is the --runtime profile's (deepspeed, fsdp, paro; "
                             "docs/runtimes.md)")
        if self.sequence_parallel and self.tp < 2:
            raise InputError("--sequence-parallel needs --tp >= 2 (it splits the sequence "
                             "over the tensor-parallel group)")
        if self.tp_algo is not None and not isinstance(self.tp_algo, Algo):
            object.__setattr__(self, "tp_algo", parse_enum(Algo, self.tp_algo, "--tp-algo"))
        if self.tp_algo not in (None, Algo.RING, Algo.HIERARCHICAL, Algo.HO_RING):
            raise InputError(f"--tp-algo {self.tp_algo.value} is not modelled for tensor-"
                             "parallel groups; expected ring, hierarchical or ho-ring")

    @property
    def trivial(self) -> bool:
        """True when this is plain data parallelism (today's Plan, unchanged)."""
        return (self.tp == 1 and self.pp == 1 and not self.sequence_parallel
                and not self.selective_recompute and self.cp == 1)

    @property
    def chunks(self) -> int:
        """Virtual pipeline stages in all: p·v."""
        return self.pp * self.virtual


@dataclass(frozen=True, eq=False)
class PairSet(RingSet):
    """Point-to-point transfers: one flow per (src, dst) pair, one direction, one step.

    ``rings`` holds the pairs; :attr:`size` is 2 so a :class:`Phase` of an all-gather with a
    buffer of 2x the message has ``steps = 1`` and ``bytes_per_rank`` = the message.
    """

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, PairSet) and self.rings == other.rings
                and self.label == other.label)

    def __hash__(self) -> int:  # cached, as RingSet's
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(("pairs", self.rings, self.label))
            self.__dict__["_hash"] = h
        return h

    @cached_property
    def size(self) -> int:
        return 2

    def hops(self):
        yield from self.rings

    def ring_hops(self):
        for pair in self.rings:
            yield [pair]


@dataclass(frozen=True, eq=False)
class GroupScopes:
    """The ring sets of a set of equal groups: whole groups, their intra parts (m ranks in a
    PaRO group of nodes) and inter parts (ng = k/m ranks, one per PaRO group). Compared and
    hashed by identity: a :class:`Layout` (cached by :func:`layout_for`) builds each once."""

    glob: RingSet
    intra: RingSet
    inter: RingSet
    m: int
    ng: int
    native: bool = False     # the cluster's own scopes (t = p = 1): lowered by collectives

    def size(self, scope: Scope) -> int:
        """k of a scope over this group set."""
        if scope is Scope.INTRA:   # (costed thousands of times by advise: no dict)
            return self.m
        if scope is Scope.INTER:
            return self.ng
        return {Scope.GLOBAL: self.m * self.ng}[scope]

    def rings(self, scope: Scope) -> RingSet:
        return {Scope.GLOBAL: self.glob, Scope.INTRA: self.intra, Scope.INTER: self.inter}[scope]


def group_scopes(groups: tuple[tuple[int, ...], ...], m: int, label: str) -> GroupScopes:
    """Split each group (in order) into consecutive chunks of m (intra) and strided sets
    (inter)."""
    k = len(groups[0])
    if k % m:
        raise InputError(f"groups of {k} ranks do not split into parts of {m}")
    ng = k // m
    intra = tuple(g[c * m:(c + 1) * m] for g in groups for c in range(ng))
    inter = tuple(tuple(g[c * m + j] for c in range(ng)) for g in groups for j in range(m))
    return GroupScopes(RingSet(groups, f"{label}-global"), RingSet(intra, f"{label}-intra"),
                       RingSet(inter, f"{label}-inter"), m, ng)


def group_channel_rings(groups: tuple[tuple[int, ...], ...], gpn: int,
                        nics: int) -> tuple[tuple[int, ...], ...]:
    """NCCL's channel rings of every group of a layout (the rule of
    :func:`parosim.collectives.nccl.channel_rings` on the group's own GPUs): a group with q > 1
    ranks on each of several nodes of several NICs gets q rings, ring c entering a node at the
    group's c-th local GPU and leaving at its (c + q/2)-th (swapped on every other node), so
    each communicator spreads its channels over the node's NICs as NCCL does for any
    communicator; otherwise the group itself (one ring in rank order).

    >>> group_channel_rings(((0, 2, 4, 6),), 4, 2)
    ((0, 2, 6, 4), (2, 0, 4, 6))
    >>> group_channel_rings(((0, 4),), 4, 2)
    ((0, 4),)
    """
    out = []
    for g in groups:
        nodes: dict[int, list[int]] = {}
        for r in g:
            nodes.setdefault(r // gpn, []).append(r)
        q = len(g) // len(nodes)
        if nics <= 1 or len(nodes) < 2 or q < 2 or any(len(v) != q for v in nodes.values()):
            out.append(g)
            continue
        for c in range(q):
            a, z = c, (c + q // 2) % q
            ring: list[int] = []
            for pos, rs in enumerate(nodes.values()):
                enter, leave = (a, z) if pos % 2 == 0 else (z, a)
                mid = [(enter + j) % q for j in range(1, q)]
                ring += [rs[i] for i in [enter] + [x for x in mid if x != leave] + [leave]]
            out.append(tuple(ring))
    return tuple(out)


class Layout:
    """Rank <-> (tp, dp, pp) coordinates of a job on a cluster, and its groups.

    >>> from parosim.spec.system import ClusterSpec
    >>> lay = Layout(ClusterSpec(nodes=4, gpus_per_node=8), ParallelSpec(tp=2, pp=2))
    >>> lay.d, lay.coords(13), lay.rank(1, 6, 0)
    (8, (1, 6, 0), 13)
    >>> lay.tp_groups(1)[0], lay.dp_groups(0)[1][:3], lay.m_dp
    ((16, 17), (1, 3, 5), 4)
    """

    def __init__(self, cluster: ClusterSpec, par: ParallelSpec):
        n, t, p, gpn = cluster.gpus, par.tp, par.pp, cluster.gpus_per_node
        if n % (t * p):
            raise InputError(f"--tp {t} x --pp {p} = {t * p} does not divide the {n} GPUs of "
                             f"cluster {cluster.name!r}; expected a divisor of {n}")
        if gpn % t and t % gpn:
            raise InputError(f"--tp {t} and {gpn} GPUs per node: expected one to divide the "
                             "other (TP groups fill whole nodes or lie inside one)")
        self.cluster, self.par = cluster, par
        self.t, self.p, self.d, self.n = t, p, n // (t * p), n
        self.m_dp = self._paro_group_size()
        self._pairs: dict[tuple, PairSet] = {}

    def rank(self, tp: int, dp: int, pp: int) -> int:
        return tp + self.t * (dp + self.d * pp)

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(tp, dp, pp) of a rank."""
        return rank % self.t, (rank // self.t) % self.d, rank // (self.t * self.d)

    def tp_groups(self, stage: int) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(self.rank(i, j, stage) for i in range(self.t))
                     for j in range(self.d))

    def dp_groups(self, stage: int) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(self.rank(i, j, stage) for j in range(self.d))
                     for i in range(self.t))

    def pairs(self, src_stage: int, dst_stage: int) -> PairSet:
        """Point-to-point pairs from every rank of one stage to its peer in another."""
        key = (src_stage, dst_stage)
        got = self._pairs.get(key)
        if got is None:
            got = self._pairs[key] = self._make_pairs(src_stage, dst_stage)
        return got

    def cp_ring(self, stage: int, cp: int) -> PairSet:
        """Context parallelism (cp > 1): every rank of a stage to the next rank of its CP
        ring. With cp folded into the DP index (``dp' = cp_rank + cp·dp``, Megatron's order
        tp-cp-dp-pp) a CP group is cp consecutive DP indices; the ring sends cp_rank ->
        cp_rank + 1 (mod cp), all rings at once (Transformer Engine's p2p KV exchange)."""
        key = ("cp", stage, cp)
        got = self._pairs.get(key)
        if got is None:
            if self.d % cp:
                raise InputError(f"--cp {cp} does not divide the {self.d} ranks left for "
                                 "context x data parallelism; expected --tp x --cp x --pp to "
                                 f"divide the {self.n} GPUs")
            got = self._pairs[key] = PairSet(tuple(
                (self.rank(i, j, stage), self.rank(i, j - j % cp + (j + 1) % cp, stage))
                for j in range(self.d) for i in range(self.t)), f"cp ring s{stage}")
        return got

    def _make_pairs(self, src_stage: int, dst_stage: int) -> PairSet:
        return PairSet(tuple((self.rank(i, j, src_stage), self.rank(i, j, dst_stage))
                             for j in range(self.d) for i in range(self.t)),
                       f"p2p s{src_stage}->s{dst_stage}")

    def _paro_node_group(self, rank: int) -> int:
        c = self.cluster
        return rank // c.gpus_per_node // c.group_nodes

    def _paro_group_size(self) -> int:
        """m_dp: DP ranks of a group inside one PaRO group of nodes (checked uniform)."""
        g0 = self.dp_groups(0)[0]
        first = self._paro_node_group(g0[0])
        m = sum(1 for r in g0 if self._paro_node_group(r) == first)
        for k in range(self.p):
            for g in self.dp_groups(k):
                for c in range(0, self.d, m):
                    parts = {self._paro_node_group(r) for r in g[c:c + m]}
                    if len(parts) != 1 or self.d % m:
                        raise InputError(
                            f"the data-parallel groups of --tp {self.t} --pp {self.p} on "
                            f"{self.cluster.nodes} nodes x {self.cluster.gpus_per_node} GPUs "
                            f"do not split evenly over PaRO groups of "
                            f"{self.cluster.group_nodes} node(s); expected --group-nodes "
                            "such that every DP group has the same ranks in every group")
        return m

    @cached_property
    def _dp_scopes(self) -> dict[int, GroupScopes]:
        if self.t == 1 and self.p == 1:   # the DP group is the cluster: its own scopes

            c = self.cluster
            return {0: GroupScopes(scope_rings(c, Scope.GLOBAL), scope_rings(c, Scope.INTRA),
                                   scope_rings(c, Scope.INTER), c.group_size, c.groups,
                                   native=True)}
        c = self.cluster
        out = {}
        for k in range(self.p):
            gs = group_scopes(self.dp_groups(k), self.m_dp, f"dp s{k}")
            rings = group_channel_rings(self.dp_groups(k), c.gpus_per_node, c.nic.per_node)
            if len(rings) != len(gs.glob.rings):    # NCCL's channels over the NICs
                gs = replace(gs, glob=RingSet(rings, gs.glob.label))
            out[k] = gs
        return out

    def dp_scopes(self, stage: int) -> GroupScopes:
        return self._dp_scopes[stage]

    @cached_property
    def _tp_scopes(self) -> dict[int, GroupScopes]:
        gpn = self.cluster.gpus_per_node
        m = min(self.t, gpn)
        return {k: group_scopes(self.tp_groups(k), m, f"tp s{k}") for k in range(self.p)}

    def tp_scopes(self, stage: int) -> GroupScopes:
        """TP groups of a stage; intra = the part inside a node (all of it when t <= GPUs per
        node)."""
        return self._tp_scopes[stage]

    def symmetric_period(self, cp: int = 1) -> int:
        """Nodes by which the cluster and every group set of this layout translate onto
        themselves (the engine's symmetry reduction); ``cluster.nodes`` = no reduction.
        ``cp`` > 1: the context-parallel rings must translate onto themselves too."""
        c = self.cluster
        if self.p > 1:
            return c.nodes
        per = symmetry_period(c)
        shift, n = per * c.gpus_per_node, self.n
        sets = [self.dp_scopes(0).glob, self.dp_scopes(0).intra, self.dp_scopes(0).inter,
                self.tp_scopes(0).glob, self.tp_scopes(0).intra, self.tp_scopes(0).inter]
        if cp > 1:
            sets.append(self.cp_ring(0, cp))
        for rs in sets:
            hops = set(rs.hops())
            if any(((a + shift) % n, (b + shift) % n) not in hops for a, b in hops):
                return c.nodes
        return per


@lru_cache(maxsize=256)
def layout_for(cluster: ClusterSpec, tp: int, pp: int) -> Layout:
    """A cached :class:`Layout` (its group ring sets then key the cost caches)."""
    return Layout(cluster, ParallelSpec(tp=tp, pp=pp))


# -- lowering ----------------------------------------------------------------------------

def _phases(spec: ClusterSpec, op: Op, gs: GroupScopes, size: float,
            chunks: int) -> tuple[Phase, ...]:
    """Hierarchical phases (PaRO-CC, chunked for HO-Ring) over a group set; the same
    decomposition as :func:`parosim.collectives.lowering._hierarchical`."""

    k = chunks
    c_intra, c_inter = size / k, size / (gs.m * k)
    lane_a, lane_b = ("intra", "inter") if k > 1 else ("main", "main")
    ph: list[Phase] = []
    if op is Op.ALL_GATHER:
        pa = make_phase(spec, "", op, gs.inter, c_inter, lane_b)
        pb = make_phase(spec, "", op, gs.intra, c_intra, lane_a)
        for c in range(k):
            ph.append(pa.renamed(f"inter AG c{c}"))
            ph.append(pb.renamed(f"intra AG c{c}", (len(ph) - 1,)))
    elif op is Op.REDUCE_SCATTER:
        pa = make_phase(spec, "", op, gs.intra, c_intra, lane_a)
        pb = make_phase(spec, "", op, gs.inter, c_inter, lane_b)
        for c in range(k):
            ph.append(pa.renamed(f"intra RS c{c}"))
            ph.append(pb.renamed(f"inter RS c{c}", (len(ph) - 1,)))
    else:
        prs = make_phase(spec, "", Op.REDUCE_SCATTER, gs.intra, c_intra, lane_a)
        par = make_phase(spec, "", Op.ALL_REDUCE, gs.inter, c_inter, lane_b)
        pag = make_phase(spec, "", Op.ALL_GATHER, gs.intra, c_intra, lane_a)
        rs = [prs.renamed(f"intra RS c{c}") for c in range(k)]
        ar = [par.renamed(f"inter AR c{c}", (c,)) for c in range(k)]
        ag = [pag.renamed(f"intra AG c{c}", (k + c,)) for c in range(k)]
        ph = rs + ar + ag
    return tuple(ph)


@lru_cache(maxsize=4096)
def lower_group(spec: ClusterSpec, op: Op, scope: Scope, size: float, algo: Algo,
                gs: GroupScopes) -> Program:
    """Lower one collective over every group of ``gs`` (see the module docstring).

    >>> from parosim.spec.system import ClusterSpec
    >>> c = ClusterSpec(nodes=2, gpus_per_node=4)
    >>> lay = Layout(c, ParallelSpec(tp=2))
    >>> p = lower_group(c, Op.ALL_REDUCE, Scope.GLOBAL, 1e6, Algo.HIERARCHICAL,
    ...                 lay.dp_scopes(0))
    >>> [ph.name for ph in p.phases], p.phases[0].ringset.rings
    (['intra RS c0', 'inter AR c0', 'intra AG c0'], ((0, 2), (4, 6), (1, 3), (5, 7)))
    """

    if gs.native:   # the cluster's own scopes: exactly the data-parallel lowering

        return lower(spec, op, scope, size, algo)
    k = gs.size(scope)
    if algo is Algo.NCCL:
        return _nccl_group(spec, op, scope, size, gs, k)
    if scope is not Scope.GLOBAL or algo is Algo.RING or gs.m == 1 or gs.ng == 1:
        rs = gs.rings(scope)
        return Program(op, scope, algo, size, k,
                       (make_phase(spec, f"{op.value} {rs.label}", op, rs, size, "main"),))
    chunks = (1 if algo is Algo.HIERARCHICAL
              else best_chunks(spec, op, size, gs.intra, gs.inter, gs.m))
    return Program(op, scope, algo, size, k, _phases(spec, op, gs, size, chunks), chunks)


def _nccl_group(spec: ClusterSpec, op: Op, scope: Scope, size: float, gs: GroupScopes,
                k: int) -> Program:
    """NCCL's tuner on a group set (:class:`parosim.collectives.lowering.NCCL`): the ring
    over each group's ranks with the protocol of least cost, and, for an all-reduce whose
    groups span several nodes with the same local GPUs on each, the NCCL tree over those
    (nodes, local GPUs); the cheaper in the closed form (ties: ring)."""

    rs = gs.rings(scope)
    best = Program(op, scope, Algo.NCCL, size, k,
                   (make_phase(spec, f"{op.value} {rs.label}", op, rs, size, "main"),),
                   choice="ring")
    tun = spec.collective
    if op is not Op.ALL_REDUCE or "tree" not in tun.algorithms:
        return best
    gpn = spec.gpus_per_node
    parts = []
    for ring in rs.rings:
        nodes = sorted({r // gpn for r in ring})
        local = tuple(sorted({r % gpn for r in ring}))
        if len(nodes) < 2 or len(ring) != len(nodes) * len(local):
            return best
        parts.append((tuple(nodes), local))
    parts = list(dict.fromkeys(parts))   # a group's channel rings: one tree per group
    ph = tree_phase(spec, scope.value, size, None, tuple(parts))
    tree = Program(op, scope, Algo.NCCL, size, ph.ringset.size, (ph,), choice="tree")
    return tree if program_time(spec, tree) < program_time(spec, best) * (1 - 1e-12) else best


def lower_p2p(pairs: PairSet, message_bytes: float) -> Program:
    """A point-to-point transfer of ``message_bytes`` on every pair, as one phase (wire
    costs: bandwidth and path latency; no collective-protocol costs)."""
    ph = Phase(pairs.label, Op.ALL_GATHER, pairs, 2.0 * message_bytes, "main")
    return Program(Op.ALL_GATHER, Scope.GLOBAL, Algo.RING, message_bytes, 2, (ph,))
