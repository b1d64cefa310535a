"""Hybrid-ZeRO scheduling (InternLM's ``HybridZeroOptimizer``) for the runtime Plan builder.

A :class:`~parosim.spec.runtime.RuntimeSpec` with the hybrid-ZeRO fields on schedules a
strategy whose gradients are not partitioned (``g = N``: NNN, NNI, NNG) as InternLM
(github InternLM/InternLM ``internlm/solver/optimizer/hybrid_zero_optim.py`` and
``internlm/solver/optimizer/utils.py`` ``ParamBcastSyncHandler``; docs/runtimes.md) runs it:

* ``grad_sync_all_reduce``: the gradients are all-reduced over every data-parallel rank
  (``reduce_tensor(..., dst_rank=None, parallel_mode=ParallelMode.DATA)``); the ZeRO group
  (``zero1``) only partitions the optimizer states.
* ``grad_sync_last_backward``: the reduction runs in buckets during the last micro-step's
  backward (the scheduler sets ``skip_grad_reduce`` on the others; ``overlap_sync_grad``).
* ``param_sync_per_owner``: after the optimizer step every shard owner broadcasts its
  updated parameters (``broadcast_params``: one ``dist.broadcast`` per rank of the ZeRO
  group that owns parameters). Ownership is InternLM's: parameter tensors in model order go
  to rank 0, 1, ... each taking about 1/m of the elements (a tensor is never split), so at
  most one call per tensor; ranks left without parameters issue no call. Each broadcast is
  modelled as an all-gather whose buffer is the owner's shard (the same ring and n - 1 steps,
  (n - 1) / n of a broadcast's bytes per rank) plus a chain's pipeline fill: the first chunk
  crosses n - 1 hops (``collective.chain_chunk``, :func:`parosim.collectives.lowering.
  chain_fill_s`; 0 = no fill), paid once per sync: the broadcasts are issued back to back
  from adjacent roots and every rank starts the next as soon as it has forwarded the last,
  so their fills overlap in one wave (docs/runtimes.md).
* ``param_sync_overlap_forward``: the broadcasts run beside the next step's forward
  (``overlap_sync_param``): a unit's forward waits for the calls of the owners of its
  tensors. The step is rotated to keep one step's ops: the previous step's broadcasts open
  it and the first micro-step's forward waits for them.

With tensor parallelism (:func:`hybrid_3d`, the TP x DP Plan of :mod:`parosim.plan.threed`,
pipeline size 1) the same schedule runs on one tensor-parallel rank's data-parallel group:
the ZeRO group is a subset of it, every owner broadcasts the 1/tp slice it holds of its
tensors, and the last backward's buckets all-reduce the rank's 1/tp gradients.
"""

from __future__ import annotations

from ..collectives.types import Op
from ..cost.runtime_memory import unit_tensor_sizes
from ..spec.model import ModelSpec
from ..spec.strategy import Level, Strategy
from .builder import COMM_PARAM, SYNC_PARAM


def owner_shards(model: ModelSpec, units, m: int) -> tuple[list[int], list[int]]:
    """(elements of every owner that holds parameters, in rank order; for every unit the
    index in that list of the last owner of its tensors). InternLM's allocation: a running
    count per rank, moving to the next rank (count reset to 0) when it exceeds 1.01 x the
    average and a next rank exists.

    >>> from parosim.spec.model import preset
    >>> from parosim.cost.decompose import model_units
    >>> m = preset("llama-7b"); u = model_units(m)
    >>> sizes, last = owner_shards(m, u, 1)
    >>> sizes == [m.params], last[-1]
    (True, 0)
    >>> len(owner_shards(m, u, 1024)[0]) <= sum(len(unit_tensor_sizes(m, x.kind)) for x in u)
    True
    """
    avg = float(model.params // m)
    per_rank: list[int] = [0]
    alloc, rank = 0, 0
    last_rank = []
    for u in units:
        for t in unit_tensor_sizes(model, u.kind):
            alloc += t
            if alloc > avg * 1.01 and rank < m - 1:
                rank += 1
                alloc = 0
                per_rank.append(0)
            per_rank[rank] += t
        last_rank.append(rank)
    index, sizes = {}, []
    for r, e in enumerate(per_rank):
        if e > 0:
            index[r] = len(sizes)
            sizes.append(e)
    # a rank left empty is skipped: a unit's last owner is the last non-empty rank up to it
    last = [max(index[r] for r in index if r <= lr) for lr in last_rank]
    return sizes, last


def owner_param_sync(b, model: ModelSpec, units, strategy: Strategy, ratio: float,
                     dep_ids, bytes_per_param: int, *, tp: int = 1, stage: int | None = None,
                     scopes=None) -> list[int | None] | None:
    """Emit the per-owner parameter sync of ``strategy`` (None when the strategy has no
    boundary parameter sync); returns, for every unit, the call its forward waits for.

    With tensor parallelism (``tp`` > 1, a TP x DP plan: ``stage`` and the stage's DP group
    set ``scopes``) every rank holds 1/tp of each tensor and InternLM's ZeRO group is a
    subset of its data-parallel group (the ranks of the same tensor-parallel rank): the
    owners are the same tensors' holders, each broadcasting its 1/tp slice over that group."""
    rules = SYNC_PARAM.get((strategy.os, strategy.p), ())
    if not rules or strategy.p is not Level.N:
        return None
    (op, scope, _size), = rules
    k = b.k[scope] if scopes is None else scopes.size(scope)
    sizes, last = owner_shards(model, units, k)
    stream = COMM_PARAM if stage is None else f"{COMM_PARAM}/s{stage}"
    kw = {} if scopes is None else {"stage": stage, "group": "dp", "scopes": scopes}
    ids: list[int | None] = []
    for i, e in enumerate(sizes):
        cid = b.collective(f"sync-param broadcast {scope.value} owner{i}", Op.ALL_GATHER, scope,
                           bytes_per_param * e * ratio / tp, "sync-param", None, None, stream,
                           dep_ids, chain=i == 0, **kw)
        ids.append(cid)
    return [ids[j] for j in last]


def hybrid_3d(strategy: Strategy, runtime) -> bool:
    """True when a TP x DP plan runs ``runtime``'s hybrid-ZeRO schedule for ``strategy``:
    gradients all-reduced over the data-parallel group in the last backward and the
    parameters broadcast per owner beside the next forward (InternLM with ``tensor`` > 1)."""
    return (strategy.g is Level.N and hybrid_grad_sync(strategy, runtime)
            and runtime.param_sync_per_owner and runtime.param_sync_overlap_forward)


def hybrid_grad_sync(strategy: Strategy, runtime) -> bool:
    """True when ``runtime`` all-reduces this strategy's gradients in the last backward."""
    return (runtime.grad_sync_last_backward and runtime.grad_sync_all_reduce
            and strategy.g is Level.N)


def engine_only_reason(strategy: Strategy, runtime) -> str:
    """Why analytic mode cannot evaluate this schedule ('' when it can): its closed form
    repeats one micro-step's communication and puts the parameter sync after the optimizer."""
    if strategy.g is not Level.N:
        return ""
    if runtime.grad_sync_last_backward:
        return "the gradients are reduced in the last micro-step only"
    if runtime.param_sync_per_owner and runtime.param_sync_overlap_forward:
        return "the parameter broadcasts overlap the next step's forward"
    return ""


__all__ = ["engine_only_reason", "hybrid_3d", "hybrid_grad_sync", "owner_param_sync",
           "owner_shards"]
