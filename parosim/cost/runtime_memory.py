"""Memory terms of a framework runtime's schedule (:mod:`parosim.spec.runtime`): persistent
parameters, gathered-parameter buffers and gradient buckets. A memory model: it imports no
planner (:mod:`parosim.plan.runtime` builds the schedule these terms describe).
"""

from __future__ import annotations

from functools import lru_cache

from ..spec.model import ModelSpec
from ..spec.runtime import RuntimeSpec
from ..spec.strategy import Level, Strategy
from ..spec.system import ClusterSpec
from ..spec.training import BYTES_PER_GRAD, BYTES_PER_PARAM, TrainingSpec
from .decompose import model_units

ELEMENT_BYTES = 2   # bf16/fp16 elements: bucket sizes in elements x 2 bytes
BUFFERED_LAYERS = 2                # the layer in use + the one being prefetched / reduced


def unit_tensor_sizes(model: ModelSpec, kind: str) -> list[int]:
    """Parameter tensors (elements) of a unit, HuggingFace layout: q, k, v, o projections
    (k and v of width kv_dim under grouped-query attention), the MLP's matrices (SwiGLU gate,
    up, down or GELU up, down), biases (one per projection) and the norms' weight (and bias
    for LayerNorm); the embedding (plus learned positions) and the LM head with the final
    norm.

    >>> from parosim.spec.model import preset
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


@lru_cache(maxsize=1024)   # integers: cached per (model, unit kind, threshold) for advise
def persistent_params(model: ModelSpec, kind: str, threshold: int) -> int:
    """Parameters of a unit that stay replicated: tensors with fewer than ``threshold``
    elements (DeepSpeed ``stage3_param_persistence_threshold``)."""
    if threshold <= 0:
        return 0
    return sum(s for s in unit_tensor_sizes(model, kind) if s < threshold)


@lru_cache(maxsize=256)
def model_persistent_params(model: ModelSpec, threshold: int) -> int:
    """All replicated (persistent) parameters of the model.

    >>> from parosim.spec.model import preset
    >>> model_persistent_params(preset("llama-7b"), 100_000)   # 65 RMSNorm weights of 4096
    266240
    """
    return sum(persistent_params(model, u.kind, threshold) for u in model_units(model))


def kept_at_turn(units, gathered: dict[str, int], runtime: RuntimeSpec) -> set[str]:
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
    n, m = cluster.gpus, cluster.group_size
    d_p = strategy.p.divisor(n, m)
    persistent = model_persistent_params(model, runtime.persistence_threshold)
    extra = 0.0
    if strategy.p is not Level.N:
        extra = BYTES_PER_PARAM * persistent * (1 - 1 / d_p)
    units = model_units(model)
    gathered = {u.label: u.params - persistent_params(model, u.kind,
                                                      runtime.persistence_threshold)
                for u in units}
    biggest = max(gathered.values())
    bufs = 0.0
    fwd_only = strategy.short in runtime.forward_only_gather
    if strategy.p is not Level.N and not fwd_only:
        ahead = max(runtime.prefetch_forward, runtime.prefetch_backward)
        kept = sum(gathered[k] for k in kept_at_turn(units, gathered, runtime))
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
