"""The planning layer every layout shares: ops, the Plan, units, the builder, the boundary.

:mod:`parosim.plan` (data parallelism), :mod:`parosim.plan.runtime` (a framework's schedule)
and :mod:`parosim.plan.threed` (TP x PP x DP) all build their op lists with the pieces here:

* the op types (:class:`ComputeOp`, :class:`CollectiveOp`, :class:`GroupOp` for collectives
  over a layout's group sets) and the :class:`Plan`; every op carries its pipeline ``stage``
  (0 without pipelining) and, for collectives, its ``group`` (``"dp"``, ``"tp"``, ``"p2p"``);
* :data:`LEVEL_SCOPE` (PaRO level -> collective scope) and the boundary tables
  :data:`SYNC_GRAD` / :data:`SYNC_PARAM` (:mod:`parosim.plan` docstring);
* the unit decomposition (:func:`model_units`, :func:`chunk_units`);
* :class:`Builder` (consecutive ids, per-stream last op, collectives over one-GPU scopes
  dropped, a runtime profile's per-call algorithm) and :func:`deps`;
* :func:`resolve_recompute` (auto recomputation of every layout) and :func:`boundary` (the
  gradient sync, the optimizer step and the parameter sync, in a runtime's buckets).

Layering: this module imports the memory models (:mod:`parosim.cost.memory`,
:mod:`parosim.plan.memory3d`); they never import a planner.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

from ..collectives.lowering import with_chain_fill
from ..collectives.types import Algo, Op, Scope
from ..cost.decompose import Unit, chunk_units, model_units
from ..cost.memory import resolve_recompute as _resolve_dp
from ..errors import InputError
from ..spec.model import ModelSpec
from ..spec.strategy import Level, Strategy
from ..units import fmt_bytes, fmt_time
from .layout import PairSet, lower_group, lower_p2p
from .memory3d import resolve_recompute_3d

__all__ = ["COMM_GRAD", "COMM_PARAM", "COMPUTE", "COMPUTE_KINDS", "ELEMENT_BYTES",
           "LEVEL_SCOPE", "PURPOSES", "STREAMS", "SYNC_GRAD", "SYNC_PARAM", "Builder",
           "CollectiveOp", "ComputeOp", "GroupOp", "Plan", "Unit", "boundary", "chunk_units",
           "collective_bytes_per_gpu", "deps", "model_units", "pieces", "plan_summary",
           "plan_traffic", "resolve_recompute"]

ELEMENT_BYTES = 2   # bf16/fp16 elements: bucket sizes in elements x 2 bytes

COMPUTE, COMM_PARAM, COMM_GRAD = "compute", "comm-param", "comm-grad"
STREAMS = (COMPUTE, COMM_PARAM, COMM_GRAD)
COMPUTE_KINDS = ("fwd", "bwd", "recompute", "head-fwd", "head-bwd", "embed-fwd", "embed-bwd",
                 "optimizer")
PURPOSES = ("param-gather", "grad-reduce", "sync-grad", "sync-param")

# Boundary rules (module docstring tables): (op, scope, "full" = 2Ψ' | "shard" = 2Ψ'/m).
SYNC_GRAD: dict[tuple[Level, Level], tuple[tuple[Op, Scope, str], ...]] = {
    (Level.N, Level.N): ((Op.ALL_REDUCE, Scope.GLOBAL, "full"),),
    (Level.N, Level.I): ((Op.REDUCE_SCATTER, Scope.INTRA, "full"),
                         (Op.ALL_REDUCE, Scope.INTER, "shard")),
    (Level.N, Level.G): ((Op.REDUCE_SCATTER, Scope.GLOBAL, "full"),),
    (Level.I, Level.I): ((Op.ALL_REDUCE, Scope.INTER, "shard"),),
    (Level.I, Level.G): ((Op.REDUCE_SCATTER, Scope.INTER, "shard"),),
    (Level.G, Level.G): (),
}
SYNC_PARAM: dict[tuple[Level, Level], tuple[tuple[Op, Scope, str], ...]] = {
    (Level.I, Level.N): ((Op.ALL_GATHER, Scope.INTRA, "full"),),
    (Level.G, Level.N): ((Op.ALL_GATHER, Scope.GLOBAL, "full"),),
    (Level.G, Level.I): ((Op.ALL_GATHER, Scope.INTER, "shard"),),
}
LEVEL_SCOPE = {Level.I: Scope.INTRA, Level.G: Scope.GLOBAL}


@dataclass(frozen=True)
class ComputeOp:
    """A compute kernel (or a group of them) on one stream; ``duration_s`` excludes any
    overlap slowdown (the engine applies ``TrainingSpec.overlap_slowdown``)."""

    id: int
    name: str            # e.g. "fwd L3 mb0"
    kind: str            # one of COMPUTE_KINDS
    layer: int | None
    micro_step: int | None
    flops: float
    duration_s: float
    stream: str = COMPUTE
    deps: tuple[int, ...] = ()
    stage: int = 0       # the pipeline stage whose GPUs run it (0 without pipelining)


@dataclass(frozen=True)
class CollectiveOp:
    """One collective over every instance of its scope at once (all groups for intra, all m
    same-local-index rings for inter). ``size_bytes`` follows nccl-tests: the full buffer
    (all-gather output, reduce-scatter input, all-reduce buffer) of one instance."""

    id: int
    name: str            # e.g. "ag-param fwd L3 mb0"
    op: Op
    scope: Scope
    size_bytes: float
    purpose: str         # one of PURPOSES
    layer: int | None
    micro_step: int | None   # None = at the accumulation boundary
    stream: str
    deps: tuple[int, ...] = ()
    algo: Algo | None = None     # None = the run's algorithm; a runtime may fix it per call
    stage: int = 0       # the pipeline stage of its ranks (a transfer: the sending stage)
    group: str = "dp"    # "dp" (PaRO's data-parallel scopes), "tp" or "p2p"
    chain: bool = False  # a broadcast: pays the pipeline fill (collective.chain_chunk)


@dataclass(frozen=True)
class Plan:
    """One global step. ``model_flops_per_step`` is per GPU (6Ψ + attention, for MFU)."""

    ops: tuple[ComputeOp | CollectiveOp, ...]
    strategy: Strategy
    gpus: int
    group_size: int
    model: str
    micro_batch: int
    accum_steps: int
    seq_len: int
    trainable_ratio: float
    tokens_per_step: int
    model_flops_per_step: float
    recompute: bool = False
    runtime: str = "ideal"
    engine_only: str = ""   # why the analytic closed form cannot evaluate it ("" = it can)

    @property
    def groups(self) -> int:
        return self.gpus // self.group_size

    def scope_size(self, scope: Scope) -> int:
        """k, the ranks in one instance of ``scope``: n (global), m (intra), n/m (inter)."""
        return {Scope.GLOBAL: self.gpus, Scope.INTRA: self.group_size,
                Scope.INTER: self.groups}[scope]

    @property
    def compute_seconds(self) -> float:
        """Sum of compute durations: the step time if communication were free."""
        return sum(o.duration_s for o in self.ops if isinstance(o, ComputeOp))

    def __str__(self) -> str:
        return plan_summary(self)



@dataclass(frozen=True)
class GroupOp(CollectiveOp):
    """A collective (or point-to-point transfer) over a set of groups of one stage.

    ``group``: ``"tp"``, ``"dp"`` or ``"p2p"``; ``count``: identical collectives back to back
    (the engine moves count x the bytes and pays count x the latency and overheads);
    ``scopes``: the :class:`~parosim.plan.layout.GroupScopes` (or the
    :class:`~parosim.plan.layout.PairSet`); the inherited ``algo``, when set, overrides the
    step's algorithm (TP groups inside a node: ring); ``pair``: with TP communication
    overlap, the id of the GEMM compute op this collective runs beside (stream
    ``tp-ovl/s{k}``), else -1.
    """

    count: int = 1
    scopes: object = None   # GroupScopes | PairSet
    pair: int = -1       # TP communication overlap: the id of the GEMM this op runs beside

    def lower(self, spec, algo: Algo):
        """The lowered :class:`~parosim.collectives.types.Program` (one collective)."""
        if self.group == "p2p":
            return lower_p2p(self.scopes, self.size_bytes)
        prog = lower_group(spec, self.op, self.scope, self.size_bytes, self.algo or algo,
                           self.scopes)
        return with_chain_fill(spec, prog) if self.chain else prog

    @property
    def cache_key(self) -> tuple:
        return (self.group, self.stage, self.op, self.scope, self.size_bytes, self.algo,
                self.scopes.label if isinstance(self.scopes, PairSet) else None, self.chain)


def deps(ids) -> tuple[int, ...]:
    """Sorted unique op ids, None dropped."""
    if type(ids) is list and len(ids) < 2:   # the common case (plans of thousands of ops)
        return () if not ids or ids[0] is None else (ids[0],)
    return tuple(sorted({d for d in ids if d is not None}))


@lru_cache(maxsize=4096)
def _stage_of(stream: str) -> int:
    """``compute/s3`` -> 3; a data-parallel stream (no stage suffix) -> 0."""
    head, sep, tail = stream.rpartition("/s")
    return int(tail) if sep and tail.isdigit() else 0


class Builder:
    """Appends ops with consecutive ids; drops collectives over one-GPU scopes.

    ``n`` / ``m``: the cluster's GPUs and PaRO group size (the scopes of data-parallel
    collectives); a collective given ``scopes`` (a layout's group set) is a
    :class:`GroupOp` sized by them. ``runtime``: a profile whose ``collective_algo`` fixes
    each data-parallel call's algorithm (:meth:`algo_for`); None = the run's algorithm.
    """

    def __init__(self, n: int = 1, m: int = 1, runtime=None) -> None:
        self.ops: list[ComputeOp | CollectiveOp] = []
        self.k = {Scope.GLOBAL: n, Scope.INTRA: m, Scope.INTER: n // m}
        self.last: dict[str, int] = {}
        self.rt = runtime

    def algo_for(self, op: Op, scope: Scope, size: float, purpose: str) -> Algo | None:
        rule = None if self.rt is None else self.rt.collective_algo
        if rule is None:
            return None
        if rule == "ring":
            return Algo.RING
        # paro-cc: list-API calls of global scope (boundary all-gather / all-reduce) above
        # the element threshold go hierarchical; tensor-API calls stay flat NCCL rings.
        listapi = (scope is Scope.GLOBAL and op in (Op.ALL_GATHER, Op.ALL_REDUCE)
                   and purpose in ("sync-grad", "sync-param"))
        big = size / ELEMENT_BYTES >= self.rt.paro_cc_min_elements
        return Algo.HIERARCHICAL if listapi and big else Algo.RING

    def compute(self, name: str, kind: str, layer: int | None, mb: int | None, flops: float,
                seconds: float, dep_ids, stream: str = COMPUTE) -> int:
        op = ComputeOp(len(self.ops), name, kind, layer, mb, flops, seconds, stream,
                       deps(dep_ids), _stage_of(stream))
        return self._add(op)

    def collective(self, name: str, op: Op, scope: Scope, size: float, purpose: str,
                   layer: int | None, mb: int | None, stream: str, dep_ids, *,
                   stage: int | None = None, group: str = "dp", scopes=None, count: int = 1,
                   algo: Algo | None = None, pair: int = -1,
                   chain: bool = False) -> int | None:
        if scopes is None and group != "p2p":
            if self.k[scope] <= 1 or size <= 0:
                return None
            return self._add(CollectiveOp(len(self.ops), name, op, scope, float(size), purpose,
                                          layer, mb, stream, deps(dep_ids),
                                          self.algo_for(op, scope, size, purpose),
                                          chain=chain))
        if chain and group != "dp":
            raise InputError("a broadcast chain is a data-parallel collective; expected "
                             f"group 'dp', got {group!r}")
        k = 2 if group == "p2p" else scopes.size(scope)
        if k <= 1 or size <= 0 or count < 1:
            return None
        if algo is None and group == "dp":
            algo = self.algo_for(op, scope, size, purpose)
        return self._add(GroupOp(len(self.ops), name, op, scope, float(size), purpose, layer,
                                 mb, stream, deps(dep_ids), algo,
                                 _stage_of(stream) if stage is None else stage, group,
                                 count=count, scopes=scopes, pair=pair, chain=chain))

    def _add(self, op: ComputeOp | CollectiveOp) -> int:
        self.ops.append(op)
        self.last[op.stream] = op.id
        return op.id


def pieces(size: float, cap_elements: int | None) -> list[float]:
    """``size`` bytes cut into equal pieces of at most ``cap_elements`` elements.

    >>> pieces(10.0, None), pieces(12.0, 2)
    ([10.0], [4.0, 4.0, 4.0])
    """
    if cap_elements is None or size <= 0:
        return [size]
    k = max(1, -(-int(round(size)) // (cap_elements * ELEMENT_BYTES)))
    return [size / k] * k


def boundary(b: Builder, strategy: Strategy, full: float, m: int, dep_ids,
             optimizer_s: float, runtime=None, *, stage: int | None = None, scopes=None,
             syncs: bool = True, fwd_only: bool = False) -> None:
    """The accumulation boundary of every layout: t_sync_g, the optimizer step, t_sync_p
    (the :mod:`parosim.plan` tables; ``full`` = 2Ψ' bytes of the gradients / parameters
    synchronised, ``m`` the GPUs per PaRO group, so a ``shard`` is ``full / m``).

    ``runtime`` (not ideal): its buckets (``grad_bucket_elements``,
    ``allgather_bucket_elements``), ``reduce_scatter: false`` (ZeRO-1 all-reduces), no
    gradient sync when it synchronises every micro-step; ``fwd_only``: no parameter sync
    (the parameters are gathered in forward). ``stage`` / ``scopes``: one pipeline stage's
    boundary on its DP group set (streams ``.../s{stage}``); ``syncs`` False: the optimizer
    step only (DP communication overlap runs the syncs per bucket). A runtime with
    ``param_sync_per_owner``: no parameter sync here (the caller emits it,
    :mod:`parosim.plan.hybrid`)."""
    rt = runtime if runtime is not None and not runtime.is_ideal else None
    sizes = {"full": full, "shard": full / m}
    at = "" if stage is None else f"/s{stage}"
    tag = "" if stage is None else f" s{stage}"
    kw = {} if stage is None else {"stage": stage, "group": "dp", "scopes": scopes}
    hybrid_g = rt is not None and rt.grad_sync_all_reduce and strategy.g is Level.N
    if syncs and not (rt is not None and (rt.grad_sync_every_micro_step or (
            hybrid_g and rt.grad_sync_last_backward))):
        rules = ((Op.ALL_REDUCE, Scope.GLOBAL, "full"),) if hybrid_g else SYNC_GRAD[
            (strategy.g, strategy.os)]
        for op, scope, size in rules:
            if (rt is not None and op is Op.REDUCE_SCATTER and scope is Scope.GLOBAL
                    and not rt.reduce_scatter and strategy.p is Level.N):
                op = Op.ALL_REDUCE          # ZeRO-1 with reduce_scatter: false
            cap = None if rt is None else rt.grad_bucket_elements
            for i, piece in enumerate(pieces(sizes[size], cap)):
                name = f"sync-grad {op.value} {scope.value}{tag}" + (
                    f" #{i}" if rt is not None else "")
                cid = b.collective(name, op, scope, piece, "sync-grad", None, None,
                                   COMM_GRAD + at, dep_ids, **kw)
                dep_ids = [cid] if cid is not None else dep_ids
    opt = b.compute(f"optimizer step{tag}", "optimizer", None, None, 0.0, optimizer_s, dep_ids,
                    COMPUTE + at)
    dep_ids = [opt]
    if not syncs or fwd_only:
        return
    if rt is not None and rt.param_sync_per_owner and strategy.p is Level.N:
        return
    # bf16 parameters have the same 2 bytes as bf16 gradients: sizes carry over.
    for op, scope, size in SYNC_PARAM.get((strategy.os, strategy.p), ()):
        cap = None if rt is None else rt.allgather_bucket_elements
        for i, piece in enumerate(pieces(sizes[size], cap)):
            name = f"sync-param {op.value} {scope.value}{tag}" + (
                f" #{i}" if rt is not None else "")
            cid = b.collective(name, op, scope, piece, "sync-param", None, None,
                               COMM_PARAM + at, dep_ids, **kw)
            dep_ids = [cid] if cid is not None else dep_ids


def resolve_recompute(model: ModelSpec, strategy: Strategy, cluster, training, runtime=None,
                      par=None) -> bool:
    """Full recomputation of every layout: ``training.recompute`` if set; auto (None): on
    iff the step would not fit without it (:func:`parosim.cost.memory.resolve_recompute`;
    with a non-trivial ``par``, the 3D memory model's most loaded stage,
    :func:`parosim.plan.memory3d.resolve_recompute_3d`)."""
    if par is None:
        return _resolve_dp(model, strategy, cluster, training, runtime)
    return resolve_recompute_3d(model, strategy, cluster, training, par)


def collective_bytes_per_gpu(op: CollectiveOp, k: int) -> float:
    """Ring model: AG/RS send (k-1)/k·S per GPU, AR 2(k-1)/k·S (docs/model.md, "Collectives").

    >>> c = CollectiveOp(0, "x", Op.ALL_REDUCE, Scope.GLOBAL, 8.0, "sync-grad", None, None,
    ...                  COMM_GRAD)
    >>> collective_bytes_per_gpu(c, 4)
    12.0
    """
    if k < 1:
        raise InputError(f"scope size k = {k!r} must be a positive integer")
    return op.op.ring_factor * (k - 1) / k * op.size_bytes


def plan_traffic(plan: Plan) -> dict[str, float]:
    """Bytes sent per GPU per global step by scope: ``{"intra", "inter", "global"}``.

    >>> from parosim.spec.model import preset
    >>> from parosim.spec.system import ClusterSpec
    >>> from parosim.spec.training import TrainingSpec
    >>> from parosim.plan import build_plan
    >>> t = plan_traffic(build_plan(preset("llama-7b"), "NNN", ClusterSpec(nodes=4),
    ...                             TrainingSpec(accum_steps=1)))
    >>> t["global"] == 2 * 31 / 32 * 2 * preset("llama-7b").params
    True
    """
    out = {s.value: 0.0 for s in (Scope.INTRA, Scope.INTER, Scope.GLOBAL)}
    for op in plan.ops:
        if isinstance(op, CollectiveOp):
            out[op.scope.value] += collective_bytes_per_gpu(op, plan.scope_size(op.scope))
    return out


def plan_summary(plan: Plan) -> str:
    """A few lines for humans: ops per kind, compute time, traffic per scope."""
    kinds = Counter(o.kind if isinstance(o, ComputeOp) else f"{o.purpose} ({o.scope.value})"
                    for o in plan.ops)
    traffic = plan_traffic(plan)
    lines = [f"{plan.strategy.name} {plan.model} on {plan.gpus} GPUs (groups of "
             f"{plan.group_size}); b={plan.micro_batch} s={plan.accum_steps} "
             f"seq={plan.seq_len} r={plan.trainable_ratio:g} recompute={plan.recompute}",
             f"  {len(plan.ops)} ops; compute {fmt_time(plan.compute_seconds)} per step",
             "  ops: " + ", ".join(f"{k} x{v}" for k, v in sorted(kinds.items())),
             "  sent per GPU: " + ", ".join(f"{k} {fmt_bytes(v)}" for k, v in traffic.items())]
    return "\n".join(lines)
