"""The Plan: one global training step of one PaRO strategy as a list of ops on streams.

The Plan is plain frozen data, the contract between the simulator (:mod:`parosim.fabric.engine`) and
the real-run executor (:mod:`parosim.validate`): one schedule, two executors.

Execution semantics (both executors follow them)
    Every op belongs to a *stream* (``"compute"``, ``"comm-param"``, ``"comm-grad"``). A stream
    runs its ops one at a time in plan order, like a CUDA stream. An op starts when the
    previous op of its stream has finished AND all ops in its ``deps`` have finished. Ops are
    listed in a topological order (deps point backwards) and ``ops[i].id == i``.

Units
    The model is cut into *units*: ``embed`` (token embedding, vocab·h), decoder layers
    ``L0 .. L{L-1}``, and ``head`` (final norm + untied LM head, vocab·h + h), so that
    per-unit traffic sums to the whole model. Units are gathered and reduced alike. The
    embedding's compute ops (``embed-fwd``, ``embed-bwd``) cost 0 FLOPs (a lookup and a
    scatter-add, not matmuls); they mark when its parameters are used.

One micro-step (repeated s = ``accum_steps`` times)
    Forward over embed, L0, ..., head; backward over head, ..., L0, embed.

    * p = I/G: before every use of a unit (forward and again backward) an all-gather of its
      bf16 parameters, size ``2·unit_params``, scope intra (I) or global (G), on
      ``comm-param``. **Prefetch, one unit ahead**: the gather for use j depends on the
      compute of use j-2 (whose buffer it reuses) and on stream order only, so it overlaps
      the compute of use j-1; at most two gathered units are live (the memory model's
      buffers). The sequence of uses runs across forward, backward and micro-steps.
    * recompute on: a ``recompute`` op (one forward of the layer) right before each decoder
      layer's backward, using the same gathered parameters.
    * g = I/G: after each unit's backward a reduce-scatter of its bf16 gradients, size
      ``2·unit_params·r`` (r = Ψ'/Ψ), scope intra (I) or global (G), on ``comm-grad``, so it
      overlaps the next unit's backward. **Bucketing: one bucket per unit.**
    * g = N: nothing per micro-step; gradients accumulate locally in full.

The accumulation boundary (once per step; **one collective op per sync**, the whole flat
buffer; an algorithm may chunk it). Ψ' = trainable params, m = GPUs per group.

    t_sync_g, gradients to the optimizer's partition (on ``comm-grad``):

    ====  =====  ===========================================================================
    g     os     collectives
    ====  =====  ===========================================================================
    N     N      global all-reduce of 2Ψ'                      (DDP)
    N     I      intra reduce-scatter of 2Ψ', then inter all-reduce of the 1/m shard, 2Ψ'/m
    N     G      global reduce-scatter of 2Ψ'
    I     I      inter all-reduce of the 1/m shard, 2Ψ'/m
    I     G      inter reduce-scatter of the 1/m shard, 2Ψ'/m
    G     G      nothing (already reduced to the 1/n shard every micro-step)
    ====  =====  ===========================================================================

    then the optimizer step (compute, on the local os shard Ψ'/d_os; memory-bound), then

    t_sync_p, updated trainable parameters to the parameter partition (on ``comm-param``):

    ====  =====  ===========================================================================
    os    p      collectives
    ====  =====  ===========================================================================
    x     x      nothing (p = os)
    I     N      intra all-gather of 2Ψ'
    G     N      global all-gather of 2Ψ'
    G     I      inter all-gather of the 1/m shard, 2Ψ'/m (rebuilds each GPU's 1/m shard)
    ====  =====  ===========================================================================

A collective over a scope of one GPU (e.g. inter with one group) moves nothing and is left
out of the plan.

>>> from parosim.spec.model import preset
>>> from parosim.spec.system import ClusterSpec
>>> from parosim.spec.training import TrainingSpec
>>> plan = build_plan(preset("llama-7b"), "NIG", ClusterSpec(nodes=4), TrainingSpec())
>>> [(o.name, o.op.value, o.scope.value) for o in plan.ops if o.micro_step is None
...  and isinstance(o, CollectiveOp)]
[('sync-grad reduce-scatter inter', 'reduce-scatter', 'inter'), \
('sync-param all-gather global', 'all-gather', 'global')]
"""

from __future__ import annotations

from ..collectives.types import Op
from ..cost.compute import (
    head_backward_flops,
    head_forward_flops,
    layer_backward_flops,
    layer_forward_flops,
    op_seconds,
    optimizer_step_seconds,
    step_flops,
)
from ..io.runtime import as_runtime, training_for_runtime
from ..spec.model import ModelSpec
from ..spec.strategy import Level, Strategy, parse_strategy
from ..spec.system import ClusterSpec
from ..spec.training import BYTES_PER_GRAD, BYTES_PER_PARAM, TrainingSpec
from .builder import (  # noqa: F401  (re-exported: the op types and tables live there)
    COMM_GRAD,
    COMM_PARAM,
    COMPUTE,
    COMPUTE_KINDS,
    LEVEL_SCOPE,
    PURPOSES,
    STREAMS,
    SYNC_GRAD,
    SYNC_PARAM,
    Builder,
    CollectiveOp,
    ComputeOp,
    Plan,
    boundary,
    collective_bytes_per_gpu,
    model_units,
    plan_summary,
    plan_traffic,
    resolve_recompute,
)
from .runtime import build_runtime_plan


def build_plan(model: ModelSpec, strategy: Strategy | str, cluster: ClusterSpec,
               training: TrainingSpec, runtime=None) -> Plan:
    """The op list of one global step (see the module docstring for the schedule).

    Recomputation follows :func:`parosim.cost.memory.resolve_recompute` (auto unless set).
    ``runtime`` (a :class:`parosim.spec.runtime.RuntimeSpec`): a framework's schedule, built by
    :func:`parosim.plan.runtime.build_runtime_plan`; None or an ideal profile = this one.
    """
    training = training_for_runtime(training, runtime)   # the profile's memory settings
    if runtime is not None:
        runtime = as_runtime(runtime)
        runtime.require(parse_strategy(strategy).short)
        if not runtime.is_ideal:
            return build_runtime_plan(model, strategy, cluster, training, runtime)
    model.require_shape("a training-step plan")
    strategy = parse_strategy(strategy)
    n, m = cluster.gpus, cluster.group_size
    r = training.trainable_ratio
    recompute = resolve_recompute(model, strategy, cluster, training)
    b = Builder(n, m)
    t_layer_f = layer_forward_flops(model, training)
    t_layer_b = layer_backward_flops(model, training)
    flops = {("layer", "fwd"): t_layer_f, ("layer", "bwd"): t_layer_b,
             ("head", "fwd"): head_forward_flops(model, training),
             ("head", "bwd"): head_backward_flops(model, training),
             ("embed", "fwd"): 0.0, ("embed", "bwd"): 0.0}
    seconds = op_seconds(model, cluster, training)
    kinds = {("layer", "fwd"): "fwd", ("layer", "bwd"): "bwd", ("head", "fwd"): "head-fwd",
             ("head", "bwd"): "head-bwd", ("embed", "fwd"): "embed-fwd",
             ("embed", "bwd"): "embed-bwd"}
    units = model_units(model)
    uses = [("fwd", u) for u in units] + [("bwd", u) for u in reversed(units)]
    done: list[int] = []             # compute op ending each use, across micro-steps
    for mb in range(training.accum_steps):
        for phase, u in uses:
            gather = None
            if strategy.p is not Level.N:
                gather = b.collective(
                    f"ag-param {phase} {u.label} mb{mb}", Op.ALL_GATHER,
                    LEVEL_SCOPE[strategy.p], BYTES_PER_PARAM * u.params, "param-gather",
                    u.layer, mb, COMM_PARAM, [done[-2] if len(done) >= 2 else None])
            if phase == "bwd" and recompute and u.kind == "layer":
                b.compute(f"recompute {u.label} mb{mb}", "recompute", u.layer, mb, t_layer_f,
                          seconds[("layer", "fwd")], [gather])
            f = flops[(u.kind, phase)]
            cid = b.compute(f"{phase} {u.label} mb{mb}", kinds[(u.kind, phase)], u.layer, mb,
                            f, seconds[(u.kind, phase)], [gather])
            done.append(cid)
            if phase == "bwd" and strategy.g is not Level.N:
                b.collective(f"rs-grad {u.label} mb{mb}", Op.REDUCE_SCATTER,
                             LEVEL_SCOPE[strategy.g], BYTES_PER_GRAD * u.params * r,
                             "grad-reduce", u.layer, mb, COMM_GRAD, [cid])
    _boundary(b, model, strategy, cluster, training, done[-1])
    tokens_gpu = training.tokens_per_gpu_step
    return Plan(ops=tuple(b.ops), strategy=strategy, gpus=n, group_size=m, model=model.name,
                micro_batch=training.micro_batch, accum_steps=training.accum_steps,
                seq_len=training.seq_len, trainable_ratio=r, tokens_per_step=tokens_gpu * n,
                model_flops_per_step=step_flops(model, training, tokens_gpu),
                recompute=recompute)


def _boundary(b: Builder, model: ModelSpec, strategy: Strategy, cluster: ClusterSpec,
              training: TrainingSpec, last_compute: int) -> None:
    """t_sync_g, the optimizer step, t_sync_p (module docstring tables;
    :func:`parosim.plan.builder.boundary`)."""
    boundary(b, strategy, BYTES_PER_GRAD * model.params * training.trainable_ratio,
             cluster.group_size, [last_compute, b.last.get(COMM_GRAD)],
             optimizer_step_seconds(model, strategy, cluster, training))
