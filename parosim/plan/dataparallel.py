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

from collections import Counter
from dataclasses import dataclass

from ..collectives.types import Algo, Op, Scope
from ..cost.compute import (
    head_backward_flops,
    head_forward_flops,
    layer_backward_flops,
    layer_forward_flops,
    op_seconds,
    optimizer_step_seconds,
    step_flops,
)
from ..cost.memory import resolve_recompute
from ..errors import InputError
from ..spec.model import ModelSpec
from ..spec.strategy import Level, Strategy, parse_strategy
from ..spec.system import ClusterSpec
from ..spec.training import BYTES_PER_GRAD, BYTES_PER_PARAM, TrainingSpec
from ..units import fmt_bytes, fmt_time

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
_LEVEL_SCOPE = {Level.I: Scope.INTRA, Level.G: Scope.GLOBAL}


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
class _Unit:
    label: str           # "embed", "L3", "head"
    layer: int | None
    params: int
    kind: str            # "embed", "layer", "head"


class _Builder:
    """Appends ops with consecutive ids; drops collectives over one-GPU scopes."""

    def __init__(self, n: int, m: int) -> None:
        self.ops: list[ComputeOp | CollectiveOp] = []
        self.k = {Scope.GLOBAL: n, Scope.INTRA: m, Scope.INTER: n // m}
        self.last: dict[str, int] = {}

    def compute(self, name: str, kind: str, layer: int | None, mb: int | None, flops: float,
                seconds: float, deps: list[int | None]) -> int:
        op = ComputeOp(len(self.ops), name, kind, layer, mb, flops, seconds, COMPUTE,
                       _deps(deps))
        return self._add(op)

    def collective(self, name: str, op: Op, scope: Scope, size: float, purpose: str,
                   layer: int | None, mb: int | None, stream: str,
                   deps: list[int | None]) -> int | None:
        if self.k[scope] <= 1 or size <= 0:
            return None
        c = CollectiveOp(len(self.ops), name, op, scope, float(size), purpose, layer, mb,
                         stream, _deps(deps))
        return self._add(c)

    def _add(self, op: ComputeOp | CollectiveOp) -> int:
        self.ops.append(op)
        self.last[op.stream] = op.id
        return op.id


def _deps(deps: list[int | None]) -> tuple[int, ...]:
    return tuple(sorted({d for d in deps if d is not None}))


def _units(model: ModelSpec) -> list[_Unit]:
    layers = [_Unit(f"L{i}", i, model.layer_params, "layer") for i in range(model.layers)]
    return ([_Unit("embed", None, model.embedding_params, "embed")] + layers
            + [_Unit("head", None, model.head_params, "head")])


def build_plan(model: ModelSpec, strategy: Strategy | str, cluster: ClusterSpec,
               training: TrainingSpec, runtime=None) -> Plan:
    """The op list of one global step (see the module docstring for the schedule).

    Recomputation follows :func:`parosim.cost.memory.resolve_recompute` (auto unless set).
    ``runtime`` (a :class:`parosim.spec.runtime.RuntimeSpec`): a framework's schedule, built by
    :func:`parosim.plan.runtime.build_runtime_plan`; None or an ideal profile = this one.
    """
    from ..io.runtime import training_for_runtime

    training = training_for_runtime(training, runtime)   # the profile's memory settings
    if runtime is not None:
        runtime.require(parse_strategy(strategy).short)
        if not runtime.is_ideal:
            from .runtime import build_runtime_plan

            return build_runtime_plan(model, strategy, cluster, training, runtime)
    model.require_shape("a training-step plan")
    strategy = parse_strategy(strategy)
    n, m = cluster.gpus, cluster.group_size
    r = training.trainable_ratio
    recompute = resolve_recompute(model, strategy, cluster, training)
    b = _Builder(n, m)
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
    units = _units(model)
    uses = [("fwd", u) for u in units] + [("bwd", u) for u in reversed(units)]
    done: list[int] = []             # compute op ending each use, across micro-steps
    for mb in range(training.accum_steps):
        for phase, u in uses:
            gather = None
            if strategy.p is not Level.N:
                gather = b.collective(
                    f"ag-param {phase} {u.label} mb{mb}", Op.ALL_GATHER,
                    _LEVEL_SCOPE[strategy.p], BYTES_PER_PARAM * u.params, "param-gather",
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
                             _LEVEL_SCOPE[strategy.g], BYTES_PER_GRAD * u.params * r,
                             "grad-reduce", u.layer, mb, COMM_GRAD, [cid])
    _boundary(b, model, strategy, cluster, training, done[-1])
    tokens_gpu = training.tokens_per_gpu_step
    return Plan(ops=tuple(b.ops), strategy=strategy, gpus=n, group_size=m, model=model.name,
                micro_batch=training.micro_batch, accum_steps=training.accum_steps,
                seq_len=training.seq_len, trainable_ratio=r, tokens_per_step=tokens_gpu * n,
                model_flops_per_step=step_flops(model, training, tokens_gpu),
                recompute=recompute)


def _boundary(b: _Builder, model: ModelSpec, strategy: Strategy, cluster: ClusterSpec,
              training: TrainingSpec, last_compute: int) -> None:
    """t_sync_g, the optimizer step, t_sync_p (module docstring tables)."""
    m = cluster.group_size
    full = BYTES_PER_GRAD * model.params * training.trainable_ratio      # 2Ψ'
    sizes = {"full": full, "shard": full / m}
    deps: list[int | None] = [last_compute, b.last.get(COMM_GRAD)]
    for op, scope, size in SYNC_GRAD[(strategy.g, strategy.os)]:
        cid = b.collective(f"sync-grad {op.value} {scope.value}", op, scope, sizes[size],
                           "sync-grad", None, None, COMM_GRAD, deps)
        deps = [cid] if cid is not None else deps
    opt = b.compute("optimizer step", "optimizer", None, None, 0.0,
                    optimizer_step_seconds(model, strategy, cluster, training), deps)
    deps = [opt]
    # bf16 parameters have the same 2 bytes as bf16 gradients: sizes carry over.
    for op, scope, size in SYNC_PARAM.get((strategy.os, strategy.p), ()):
        cid = b.collective(f"sync-param {op.value} {scope.value}", op, scope, sizes[size],
                           "sync-param", None, None, COMM_PARAM, deps)
        deps = [cid] if cid is not None else deps


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
