"""The Plan of one global step as a framework runtime schedules it (:mod:`parosim.runtime`).

Same ops, streams and semantics as :mod:`parosim.plan` (whose module docstring describes the
ideal schedule); a :class:`~parosim.runtime.RuntimeSpec` changes:

* **gradient buckets** (``grad_bucket_elements``): the trainable gradients of the units, in
  backward order, fill a bucket; a bucket is reduced when full (a unit larger than the
  bucket is cut into full buckets) and the rest at the end of the backward (DeepSpeed's
  ``reduce_bucket_size`` and IPG bucket). None = one reduction per unit (ideal, FSDP's
  FlatParameter per wrapped layer).
* **overlap** (``overlap_comm``): when False the next compute op waits for each reduction
  (it runs on the compute stream in DeepSpeed: exposed); ``sync_grads_end_of_backward``:
  the next micro-step's first compute waits for the last reduction (DeepSpeed's epilogue
  synchronises the reduction stream; FSDP's post-backward final callback waits for it).
* **prefetch** (``prefetch_forward`` / ``prefetch_backward``): the gather for use j is
  issued when the compute of use j-1-d has finished (d units ahead; d = 1 is the ideal
  schedule, d = 0 is fetch on demand, fully exposed).
* **persistence** (``persistence_threshold``): parameter tensors below the threshold (the
  RMSNorm weights of LLaMA) are never gathered; the memory model keeps them replicated.
* **reuse** (``max_reuse_distance``, ``max_live_parameters``): at the forward-to-backward
  turn, units whose parameters are reused within that many fetched elements stay live and
  are not gathered again in backward (DeepSpeed ZeRO-3's parameter coordinator).
* **FSDP**: ``grad_sync_every_micro_step`` moves the boundary gradient sync after every
  bucket of every micro-step (HYBRID_SHARD: intra reduce-scatter, then inter all-reduce of the
  1/m shard; NO_SHARD: all-reduce); ``forward_only_gather`` (SHARD_GRAD_OP) gathers the
  parameters over all GPUs once per micro-step in forward, keeps them for the backward and
  has no boundary parameter sync.
* **collective algorithm per call** (``collective_algo``): ``ring`` = flat NCCL ring for
  every collective (stock DeepSpeed / FSDP on NCCL); ``paro-cc`` = the PaRO fork: the
  sequential hierarchical algorithm for the list-API collectives of global scope with at
  least ``paro_cc_min_elements`` elements (boundary all-gathers and all-reduces), the flat
  ring for the tensor-API calls (coalesced reduce-scatters, ZeRO-3 parameter fetches).
* **all-reduce instead of reduce-scatter** (``reduce_scatter: false``): each gradient
  bucket of a strategy with unpartitioned parameters is all-reduced over the gradient scope
  (DeepSpeed ZeRO-1/2's ``reduce_scatter: false``; ZeRO-3 always reduce-scatters).
* **boundary buckets**: the boundary gradient sync in ``grad_bucket_elements`` pieces and the
  boundary parameter all-gather in ``allgather_bucket_elements`` pieces (DeepSpeed's
  ``reduce_bucket_size`` / ``allgather_bucket_size``).

>>> from parosim.models import preset
>>> from parosim.specs import ClusterSpec
>>> from parosim.training import TrainingSpec
>>> from parosim.runtime import RuntimeSpec
>>> rt = RuntimeSpec(name="t", grad_bucket_elements=500_000_000, overlap_comm=False)
>>> p = build_runtime_plan(preset("llama-7b"), "NGG", ClusterSpec(nodes=4),
...                        TrainingSpec(accum_steps=1), rt)
>>> sum(1 for o in p.ops if getattr(o, "purpose", "") == "grad-reduce")
14
"""

from __future__ import annotations

import math

from .collectives.types import Algo, Op, Scope
from .compute import (
    head_backward_flops,
    head_forward_flops,
    layer_backward_flops,
    layer_forward_flops,
    op_seconds,
    step_flops,
)
from .errors import InputError
from .models import ModelSpec
from .plan import (
    _LEVEL_SCOPE,
    COMM_GRAD,
    COMM_PARAM,
    SYNC_GRAD,
    SYNC_PARAM,
    CollectiveOp,
    ComputeOp,
    Plan,
    _Builder,
    _deps,
    _units,
)
from .runtime import RuntimeSpec, training_for_runtime
from .specs import ClusterSpec
from .strategies import Level, Strategy, parse_strategy
from .training import BYTES_PER_GRAD, BYTES_PER_PARAM, TrainingSpec

ELEMENT_BYTES = 2   # bf16/fp16 elements: bucket sizes in elements x 2 bytes


def unit_tensor_sizes(model: ModelSpec, kind: str) -> list[int]:
    """Parameter tensors (elements) of a unit, HuggingFace layout: q, k, v, o projections
    (k and v of width kv_dim under grouped-query attention), the MLP's matrices (SwiGLU gate,
    up, down or GELU up, down), biases (one per projection) and the norms' weight (and bias
    for LayerNorm); the embedding (plus learned positions) and the LM head with the final
    norm.

    >>> from parosim.models import preset
    >>> m = preset("llama-7b")
    >>> all(sum(unit_tensor_sizes(m, k)) == p for k, p in
    ...     (("layer", m.layer_params), ("embed", m.embedding_params), ("head", m.head_params)))
    True
    """
    h, ffn = model.hidden, model.ffn_hidden
    kv = getattr(model, "kv_dim", h)
    norm = [h] * (2 if getattr(model, "norm", "rmsnorm") == "layernorm" else 1)
    if kind == "embed":
        pos = getattr(model, "pos_embedding", 0) * h
        return [model.embedding_params - pos] + ([pos] if pos else [])
    if kind == "head":
        return ([model.head_params - sum(norm)] if model.head_params > sum(norm) else []) + norm
    swiglu = getattr(model, "mlp", "swiglu") == "swiglu"
    mats = [h * h, h * kv, h * kv, h * h] + [h * ffn] * (3 if swiglu else 2)
    sizes = mats + norm * 2
    if getattr(model, "bias", False):
        sizes += [h, kv, kv, h] + ([ffn, ffn] if swiglu else [ffn]) + [h]
    rest = model.layer_params - sum(sizes)          # anything a richer model adds
    return sizes + ([rest] if rest > 0 else [])


def persistent_params(model: ModelSpec, kind: str, threshold: int) -> int:
    """Parameters of a unit that stay replicated: tensors with fewer than ``threshold``
    elements (DeepSpeed ``stage3_param_persistence_threshold``)."""
    if threshold <= 0:
        return 0
    return sum(s for s in unit_tensor_sizes(model, kind) if s < threshold)


def model_persistent_params(model: ModelSpec, threshold: int) -> int:
    """All replicated (persistent) parameters of the model.

    >>> from parosim.models import preset
    >>> model_persistent_params(preset("llama-7b"), 100_000)   # 65 RMSNorm weights of 4096
    266240
    """
    return sum(persistent_params(model, u.kind, threshold) for u in _units(model))


class _RtBuilder(_Builder):
    """A plan builder that stamps each collective with the runtime's algorithm."""

    def __init__(self, n: int, m: int, runtime: RuntimeSpec) -> None:
        super().__init__(n, m)
        self.rt = runtime

    def algo_for(self, op: Op, scope: Scope, size: float, purpose: str) -> Algo | None:
        rule = self.rt.collective_algo
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

    def collective(self, name, op, scope, size, purpose, layer, mb, stream, deps):
        if self.k[scope] <= 1 or size <= 0:
            return None
        c = CollectiveOp(len(self.ops), name, op, scope, float(size), purpose, layer, mb,
                         stream, _deps(deps), self.algo_for(op, scope, size, purpose))
        return self._add(c)


def _pieces(size: float, cap_elements: int | None) -> list[float]:
    """``size`` bytes cut into equal pieces of at most ``cap_elements`` elements."""
    if cap_elements is None or size <= 0:
        return [size]
    k = max(1, -(-int(round(size)) // (cap_elements * ELEMENT_BYTES)))
    return [size / k] * k


def check_bucket_count(model: ModelSpec, training: TrainingSpec, runtime: RuntimeSpec) -> None:
    """Refuse, before building anything, buckets so small that the step has more collectives
    than the engine's op limit (:data:`parosim.simulate.MAX_ENGINE_OPS`): a bucket of 1
    element would be billions of ops (a hang, not an answer). Gradient buckets are counted
    per micro-step and once more at the boundary; all-gather buckets at the boundary."""
    from .simulate import MAX_ENGINE_OPS

    ds = runtime.name.startswith("deepspeed (")   # from --deepspeed-config: its key names
    grad_elems = BYTES_PER_GRAD * model.params * training.trainable_ratio / ELEMENT_BYTES
    for fld, key, count_of in (
            ("grad_bucket_elements", "reduce_bucket_size", training.accum_steps + 1),
            ("allgather_bucket_elements", "allgather_bucket_size", 1)):
        cap = getattr(runtime, fld)
        if cap is None:
            continue
        name = key if ds else fld
        where = f"--deepspeed-config {runtime.name[11:-1]}" if ds else f"runtime {runtime.name!r}"
        if cap < 1:
            raise InputError(f"{where}: {name} = {cap} must be at least 1 element")
        buckets = math.ceil(grad_elems / cap) * count_of
        if buckets > MAX_ENGINE_OPS:
            least = math.ceil(grad_elems * count_of / MAX_ENGINE_OPS)
            raise InputError(f"{where}: {name} = {cap} elements makes {buckets:.3g} buckets of "
                             f"{model.name}'s gradients per step, more than the engine's "
                             f"limit of {MAX_ENGINE_OPS} operations; expected {name} >= "
                             f"{least}")


def build_runtime_plan(model: ModelSpec, strategy: Strategy | str, cluster: ClusterSpec,
                       training: TrainingSpec, runtime: RuntimeSpec) -> Plan:
    """The op list of one global step under ``runtime`` (see the module docstring)."""
    from .memory import resolve_recompute

    model.require_shape("a training-step plan")
    strategy = parse_strategy(strategy)
    runtime.require(strategy.short)
    training = training_for_runtime(training, runtime)   # the profile's memory settings
    n, m = cluster.gpus, cluster.group_size
    r = training.trainable_ratio
    check_bucket_count(model, training, runtime)
    recompute = resolve_recompute(model, strategy, cluster, training, runtime)
    b = _RtBuilder(n, m, runtime)
    fwd_only = strategy.short in runtime.forward_only_gather
    gather_scope = Scope.GLOBAL if fwd_only else _LEVEL_SCOPE.get(strategy.p)
    gathers = fwd_only or strategy.p is not Level.N
    overlap = runtime.overlaps_grad_reduce(strategy.p is not Level.N)
    t_layer_f = layer_forward_flops(model, training)
    flops = {("layer", "fwd"): t_layer_f, ("layer", "bwd"): layer_backward_flops(model, training),
             ("head", "fwd"): head_forward_flops(model, training),
             ("head", "bwd"): head_backward_flops(model, training),
             ("embed", "fwd"): 0.0, ("embed", "bwd"): 0.0}
    kinds = {("layer", "fwd"): "fwd", ("layer", "bwd"): "bwd", ("head", "fwd"): "head-fwd",
             ("head", "bwd"): "head-bwd", ("embed", "fwd"): "embed-fwd",
             ("embed", "bwd"): "embed-bwd"}
    seconds = op_seconds(model, cluster, training)
    units = _units(model)
    gathered = {u.label: u.params - persistent_params(model, u.kind,
                                                      runtime.persistence_threshold)
                for u in units}
    kept = _kept_at_turn(units, gathered, runtime) if gathers else set()
    uses = [("fwd", u) for u in units] + [("bwd", u) for u in reversed(units)]
    cap = runtime.grad_bucket_elements
    cap_bytes = None if cap is None else cap * ELEMENT_BYTES
    done: list[int] = []          # compute op ending each use, across micro-steps
    block: list[int | None] = []  # reductions the next compute op must wait for
    g_scope = _LEVEL_SCOPE.get(strategy.g)
    every = runtime.grad_sync_every_micro_step
    reduces = strategy.g is not Level.N or every

    def reduce_bucket(size: float, label: str, layer: int | None, mb: int, dep: int) -> list:
        ids: list[int | None] = []
        deps: list[int | None] = [dep]
        if strategy.g is not Level.N:
            rs = runtime.reduce_scatter or strategy.p is not Level.N   # ZeRO-3: always RS
            op = Op.REDUCE_SCATTER if rs else Op.ALL_REDUCE
            cid = b.collective(f"{'rs' if rs else 'ar'}-grad {label} "
                               f"mb{mb}", op, g_scope, size, "grad-reduce", layer, mb,
                               COMM_GRAD, deps)
            ids.append(cid)
            deps = [cid] if cid is not None else deps
        if every:
            sizes = {"full": size, "shard": size / m}
            for op, scope, kind in SYNC_GRAD[(strategy.g, strategy.os)]:
                if op is Op.REDUCE_SCATTER and strategy.g is not Level.N:
                    continue  # already reduce-scattered above
                cid = b.collective(f"{op.value}-grad {scope.value} {label} mb{mb}", op, scope,
                                   sizes[kind], "grad-reduce", layer, mb, COMM_GRAD, deps)
                ids.append(cid)
                deps = [cid] if cid is not None else deps
        return ids

    for mb in range(training.accum_steps):
        bucket, nb = 0.0, 0
        for phase, u in uses:
            gather = None
            skip = phase == "bwd" and (fwd_only or u.label in kept)
            if gathers and not skip and gathered[u.label] > 0:
                d = runtime.prefetch_forward if phase == "fwd" else runtime.prefetch_backward
                after = done[-1 - d] if len(done) >= 1 + d else None
                gather = b.collective(
                    f"ag-param {phase} {u.label} mb{mb}", Op.ALL_GATHER, gather_scope,
                    BYTES_PER_PARAM * gathered[u.label], "param-gather", u.layer, mb,
                    COMM_PARAM, [after])
            if phase == "bwd" and recompute and u.kind == "layer":
                b.compute(f"recompute {u.label} mb{mb}", "recompute", u.layer, mb, t_layer_f,
                          seconds[("layer", "fwd")], [gather, *block])
                block = []
            f = flops[(u.kind, phase)]
            cid = b.compute(f"{phase} {u.label} mb{mb}", kinds[(u.kind, phase)], u.layer, mb,
                            f, seconds[(u.kind, phase)], [gather, *block])
            block = []
            done.append(cid)
            if phase != "bwd" or not reduces:
                continue
            g = BYTES_PER_GRAD * u.params * r
            if cap_bytes is None:
                ids = reduce_bucket(g, u.label, u.layer, mb, cid)
            else:
                bucket += g
                ids = []
                while bucket >= cap_bytes:
                    ids += reduce_bucket(cap_bytes, f"bucket{nb}", None, mb, cid)
                    bucket -= cap_bytes
                    nb += 1
                if u.kind == "embed" and bucket > 0:    # end of backward: flush
                    ids += reduce_bucket(bucket, f"bucket{nb}", None, mb, cid)
                    bucket = 0.0
            if not overlap:
                block += ids
        if runtime.sync_grads_end_of_backward and reduces:
            block.append(b.last.get(COMM_GRAD))
    _boundary(b, model, strategy, cluster, training, done[-1], runtime, fwd_only, block)
    tokens_gpu = training.tokens_per_gpu_step
    return Plan(ops=tuple(b.ops), strategy=strategy, gpus=n, group_size=m, model=model.name,
                micro_batch=training.micro_batch, accum_steps=training.accum_steps,
                seq_len=training.seq_len, trainable_ratio=r, tokens_per_step=tokens_gpu * n,
                model_flops_per_step=step_flops(model, training, tokens_gpu),
                recompute=recompute, runtime=runtime.name)


def _kept_at_turn(units, gathered: dict[str, int], runtime: RuntimeSpec) -> set[str]:
    """Units not gathered again in backward: reuse distance (elements fetched between the
    forward and the backward use) below ``max_reuse_distance`` while the kept units' live
    elements stay within ``max_live_parameters`` (DeepSpeed ZeRO-3 defaults 1e9 and 1e9)."""
    if runtime.max_reuse_distance <= 0:
        return set()
    kept: set[str] = set()
    distance = live = 0
    for u in reversed(units):             # the last unit of the forward is reused first
        if distance >= runtime.max_reuse_distance:
            break
        if live + gathered[u.label] > runtime.max_live_parameters:
            break
        kept.add(u.label)
        live += gathered[u.label]
        distance += gathered[u.label]
    return kept


def _boundary(b: _RtBuilder, model: ModelSpec, strategy: Strategy, cluster: ClusterSpec,
              training: TrainingSpec, last_compute: int, runtime: RuntimeSpec,
              fwd_only: bool, block: list) -> None:
    """t_sync_g (unless synced every micro-step), the optimizer step, t_sync_p (unless the
    parameters are gathered in forward), in the runtime's buckets."""
    from .compute import optimizer_step_seconds

    m = cluster.group_size
    full = BYTES_PER_GRAD * model.params * training.trainable_ratio      # 2Ψ'
    sizes = {"full": full, "shard": full / m}
    deps: list[int | None] = [last_compute, b.last.get(COMM_GRAD), *block]
    if not runtime.grad_sync_every_micro_step:
        for op, scope, size in SYNC_GRAD[(strategy.g, strategy.os)]:
            if (op is Op.REDUCE_SCATTER and scope is Scope.GLOBAL and not runtime.reduce_scatter
                    and strategy.p is Level.N):
                op = Op.ALL_REDUCE          # ZeRO-1 with reduce_scatter: false
            for i, piece in enumerate(_pieces(sizes[size], runtime.grad_bucket_elements)):
                cid = b.collective(f"sync-grad {op.value} {scope.value} #{i}", op, scope,
                                   piece, "sync-grad", None, None, COMM_GRAD, deps)
                deps = [cid] if cid is not None else deps
    opt = b.compute("optimizer step", "optimizer", None, None, 0.0,
                    optimizer_step_seconds(model, strategy, cluster, training), deps)
    deps = [opt]
    if fwd_only:
        return
    for op, scope, size in SYNC_PARAM.get((strategy.os, strategy.p), ()):
        for i, piece in enumerate(_pieces(sizes[size], runtime.allgather_bucket_elements)):
            cid = b.collective(f"sync-param {op.value} {scope.value} #{i}", op, scope, piece,
                               "sync-param", None, None, COMM_PARAM, deps)
            deps = [cid] if cid is not None else deps


__all__ = ["ComputeOp", "build_runtime_plan", "model_persistent_params", "persistent_params",
           "unit_tensor_sizes"]


def runtime_memory_terms(model: ModelSpec, strategy: Strategy, cluster: ClusterSpec,
                         training: TrainingSpec, runtime: RuntimeSpec) -> tuple[float, float]:
    """(extra model-state bytes, buffer bytes) per GPU under ``runtime``.

    * persistent parameters (below ``persistence_threshold``) are replicated on every GPU:
      ``2 x persistent x (1 - 1/d_p)`` more than the partitioned count;
    * gathered parameters: the unit in use plus ``max(prefetch)`` units in flight, or the
      units kept live at the forward-to-backward turn plus the unit in use, whichever is
      larger (bf16);
    * gradient buckets: ``grad_bucket_elements`` bf16 elements, doubled when the reduction
      overlaps the backward (DeepSpeed allocates two IPG buffers with ``overlap_comm``);
      without buckets, the unit being reduced and the next one, as in the ideal model.
    """
    from .memory import BUFFERED_LAYERS

    n, m = cluster.gpus, cluster.group_size
    d_p = strategy.p.divisor(n, m)
    persistent = model_persistent_params(model, runtime.persistence_threshold)
    extra = 0.0
    if strategy.p is not Level.N:
        extra = BYTES_PER_PARAM * persistent * (1 - 1 / d_p)
    units = _units(model)
    gathered = {u.label: u.params - persistent_params(model, u.kind,
                                                      runtime.persistence_threshold)
                for u in units}
    biggest = max(gathered.values())
    bufs = 0.0
    fwd_only = strategy.short in runtime.forward_only_gather
    if strategy.p is not Level.N and not fwd_only:
        ahead = max(runtime.prefetch_forward, runtime.prefetch_backward)
        kept = sum(gathered[k] for k in _kept_at_turn(units, gathered, runtime))
        bufs += BYTES_PER_PARAM * max((1 + ahead) * biggest, kept + biggest)
    r = training.trainable_ratio
    if strategy.g is not Level.N or runtime.grad_sync_every_micro_step:
        overlap = runtime.overlaps_grad_reduce(strategy.p is not Level.N)
        if runtime.grad_bucket_elements is None:
            bufs += BUFFERED_LAYERS * BYTES_PER_GRAD * max(u.params for u in units) * r
        else:
            bucket = min(runtime.grad_bucket_elements, model.params * r)
            bufs += (2 if overlap else 1) * ELEMENT_BYTES * bucket
    return extra, bufs
