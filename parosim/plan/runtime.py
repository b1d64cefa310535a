"""The Plan of one global step as a framework runtime schedules it (:mod:`parosim.spec.runtime`).

Same ops, streams and semantics as :mod:`parosim.plan` (whose module docstring describes the
ideal schedule); a :class:`~parosim.spec.runtime.RuntimeSpec` changes:

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

>>> from parosim.spec.model import preset
>>> from parosim.spec.system import ClusterSpec
>>> from parosim.spec.training import TrainingSpec
>>> from parosim.spec.runtime import RuntimeSpec
>>> rt = RuntimeSpec(name="t", grad_bucket_elements=500_000_000, overlap_comm=False)
>>> p = build_runtime_plan(preset("llama-7b"), "NGG", ClusterSpec(nodes=4),
...                        TrainingSpec(accum_steps=1), rt)
>>> sum(1 for o in p.ops if getattr(o, "purpose", "") == "grad-reduce")
14
"""

from __future__ import annotations

import math

from ..collectives.types import Op, Scope
from ..cost.compute import (
    head_backward_flops,
    head_forward_flops,
    layer_backward_flops,
    layer_forward_flops,
    op_seconds,
    optimizer_step_seconds,
    step_flops,
)
from ..cost.runtime_memory import (  # noqa: F401  (re-exported)
    ELEMENT_BYTES,
    kept_at_turn,
    model_persistent_params,
    persistent_params,
    runtime_memory_terms,
    unit_tensor_sizes,
)
from ..errors import InputError
from ..fabric.engine import MAX_ENGINE_OPS
from ..io.runtime import training_for_runtime
from ..spec.model import ModelSpec
from ..spec.runtime import RuntimeSpec
from ..spec.strategy import Level, Strategy, parse_strategy
from ..spec.system import ClusterSpec
from ..spec.training import BYTES_PER_GRAD, BYTES_PER_PARAM, TrainingSpec
from .builder import (
    COMM_GRAD,
    COMM_PARAM,
    COMPUTE,
    LEVEL_SCOPE,
    SYNC_GRAD,
    Builder,
    ComputeOp,
    Plan,
    boundary,
    model_units,
    resolve_recompute,
)
from .hybrid import engine_only_reason, hybrid_grad_sync, owner_param_sync


def owner_slices(offset: float, size: float, part: float) -> list[float]:
    """The slices of the bytes [offset, offset + size) of a flat buffer cut every ``part``
    bytes (one per partition the range touches, in order).

    >>> owner_slices(0.0, 10.0, 4.0)
    [4.0, 4.0, 2.0]
    >>> owner_slices(3.0, 2.0, 4.0)
    [1.0, 1.0]
    """
    out, pos, end = [], offset, offset + size
    while end - pos > 1e-9 * max(1.0, size):
        nxt = min(end, (math.floor(pos / part + 1e-12) + 1) * part)
        out.append(nxt - pos)
        pos = nxt
    return out


def check_bucket_count(model: ModelSpec, training: TrainingSpec, runtime: RuntimeSpec) -> None:
    """Refuse, before building anything, buckets so small that the step has more collectives
    than the engine's op limit (:data:`parosim.fabric.engine.MAX_ENGINE_OPS`): a bucket of 1
    element would be billions of ops (a hang, not an answer). Gradient buckets are counted
    per micro-step and once more at the boundary; all-gather buckets at the boundary."""
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
    model.require_shape("a training-step plan")
    strategy = parse_strategy(strategy)
    runtime.require(strategy.short)
    training = training_for_runtime(training, runtime)   # the profile's memory settings
    n, m = cluster.gpus, cluster.group_size
    r = training.trainable_ratio
    check_bucket_count(model, training, runtime)
    recompute = resolve_recompute(model, strategy, cluster, training, runtime)
    b = Builder(n, m, runtime)
    fwd_only = strategy.short in runtime.forward_only_gather
    gather_scope = Scope.GLOBAL if fwd_only else LEVEL_SCOPE.get(strategy.p)
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
    units = model_units(model)
    gathered = {u.label: u.params - persistent_params(model, u.kind,
                                                      runtime.persistence_threshold)
                for u in units}
    kept = kept_at_turn(units, gathered, runtime) if gathers else set()
    uses = [("fwd", u) for u in units] + [("bwd", u) for u in reversed(units)]
    cap = runtime.grad_bucket_elements
    cap_bytes = None if cap is None else cap * ELEMENT_BYTES
    done: list[int] = []          # compute op ending each use, across micro-steps
    block: list[int | None] = []  # reductions the next compute op must wait for
    g_scope = LEVEL_SCOPE.get(strategy.g)
    every = runtime.grad_sync_every_micro_step
    hybrid = hybrid_grad_sync(strategy, runtime)   # all-reduce in the last backward
    reduces = strategy.g is not Level.N or every or hybrid
    waits: list[int | None] | None = None          # unit -> parameter broadcast it waits for
    if runtime.param_sync_per_owner and runtime.param_sync_overlap_forward:
        waits = owner_param_sync(b, model, units, strategy, r, [], BYTES_PER_PARAM)

    # DeepSpeed ZeRO-2's per-partition reduce calls (grad_reduce_per_owner): a bucket of the
    # flat gradients is cut at the partition boundaries (trainable bytes / ranks); each slice
    # is one reduce, costed as a reduce-scatter whose buffer is n / (n - 1) x the slice (the
    # same n - 1 ring steps and the slice's bytes per rank)
    kg = b.k[g_scope] if g_scope is not None else 1
    per_owner = (runtime.grad_reduce_per_owner and runtime.reduce_scatter and kg > 1
                 and strategy.g is not Level.N and strategy.p is Level.N)
    part = sum(BYTES_PER_GRAD * u.params * r for u in units) / kg
    goff = [0.0]          # bytes of this micro-step's gradients already reduced

    def reduce_bucket(size: float, label: str, layer: int | None, mb: int, dep: int) -> list:
        ids: list[int | None] = []
        deps: list[int | None] = [dep]
        if hybrid:
            if mb == training.accum_steps - 1:
                ids.append(b.collective(f"ar-grad {label} mb{mb}", Op.ALL_REDUCE, Scope.GLOBAL,
                                        size, "grad-reduce", layer, mb, COMM_GRAD, deps))
            return ids
        if strategy.g is not Level.N and per_owner:
            for i, x in enumerate(owner_slices(goff[0], size, part)):
                cid = b.collective(f"reduce-grad {label} mb{mb} part{i}", Op.REDUCE_SCATTER,
                                   g_scope, x * kg / (kg - 1), "grad-reduce", layer, mb,
                                   COMM_GRAD, [dep])
                ids.append(cid)
                deps = [cid] if cid is not None else deps
            goff[0] += size
        elif strategy.g is not Level.N:
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
        goff[0] = 0.0
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
            if waits is not None and mb == 0 and phase == "fwd":
                block.append(waits[units.index(u)])
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

    boundary(b, strategy, BYTES_PER_GRAD * model.params * r, m,
             [done[-1], b.last.get(COMM_GRAD), *block],
             optimizer_step_seconds(model, strategy, cluster, training), runtime,
             fwd_only=fwd_only)
    if runtime.param_sync_per_owner and not runtime.param_sync_overlap_forward:
        owner_param_sync(b, model, units, strategy, r, [b.last.get(COMPUTE)], BYTES_PER_PARAM)
    tokens_gpu = training.tokens_per_gpu_step
    return Plan(ops=tuple(b.ops), strategy=strategy, gpus=n, group_size=m, model=model.name,
                micro_batch=training.micro_batch, accum_steps=training.accum_steps,
                seq_len=training.seq_len, trainable_ratio=r, tokens_per_step=tokens_gpu * n,
                model_flops_per_step=step_flops(model, training, tokens_gpu),
                recompute=recompute, runtime=runtime.name,
                engine_only=engine_only_reason(strategy, runtime))






__all__ = ["ComputeOp", "build_runtime_plan", "model_persistent_params", "owner_slices",
           "persistent_params", "unit_tensor_sizes"]


