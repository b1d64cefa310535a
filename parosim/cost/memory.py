"""GPU memory per rank: model states, activations, gathered buffers, margin; fits or not.

``total = model_states + activations + buffers + margin`` against the GPU's memory.

* **Model states** (docs/model.md): ``2Ψ/d_p + 2Ψ'/d_g + 12Ψ'/d_os``
  (:func:`parosim.spec.strategy.model_states_bytes`).
* **Activations** (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
  Transformer Models", eq. 1 and section 4.3), fp16/bf16, sequence s, micro-batch b, hidden h,
  heads a, L layers:

  - per decoder layer without recomputation ``s·b·h·(34 + 5·a·s/h)``;
  - with full recomputation only each layer's input ``2·s·b·h`` is kept, plus one layer's
    full working set ``s·b·h·(34 + 5·a·s/h)`` while that layer is recomputed;
  - output side (section 4.3): final-norm and LM-head inputs ``4·s·b·h`` plus fp32 logits for
    the cross-entropy ``4·s·b·vocab``. The embedding output is layer 0's input, already
    counted.

  The 34 + 5as/h coefficients are derived for a GPT layer (4h GeLU MLP, dropout); we apply
  them to LLaMA unchanged. LLaMA has no dropout masks (fewer bytes) but a wider gated MLP
  (more bytes); for LLaMA-7B the two roughly cancel (45.5 vs 54 sbh by our itemisation with
  eager attention), so the published formula is a slightly conservative estimate.
* **Buffers**: p = I/G hold the gathered bf16 parameters of the layer computing and of the
  next one being prefetched (one-layer-ahead prefetch, see :mod:`parosim.plan`):
  ``2 x 2·max_layer_params``. g = I/G hold the full bf16 gradient of the layer whose
  reduce-scatter is in flight and of the layer the next backward writes:
  ``2 x 2·max_layer_trainable``. Boundary syncs run in place on the flat buffers (no extra).
  "Layer" includes the embedding and head pseudo-layers.
* **Margin**: a fraction of the rest (PyTorch caching-allocator fragmentation) plus
  :data:`RUNTIME_RESERVE_BYTES` (CUDA context, cuBLAS workspaces, NCCL buffers; 1 GiB, an
  uncalibrated default that no source we found measures). The fraction is
  ``training.korthikanti_margin`` (:func:`korthikanti_margin`): under ``--fidelity accurate``
  :data:`parosim.spec.training.KORTHIKANTI_MARGIN_FRACTION`, fitted one-sided on the even
  rows of the published TP / PP / CP tables (docs/memory.md); unset (the Python API's
  default and ``--fidelity paper``) :data:`MARGIN_FRACTION`, the former 10 %, a choice kept
  so that the paper fidelity reproduces its numbers.

Two memory models (``TrainingSpec.memory_model``; unset, the runtime profile's: korthikanti
for the ideal runtime, runtime for deepspeed / fsdp / paro, see ``runtimes/*.yaml``):

* ``"korthikanti"`` (the ideal runtime's): the estimate above, unchanged (with ``attention =
  "flash"`` the ``5·a·s/h`` term is replaced by the kernel's fp32 log-sum-exp ``4·b·a·s``).
* ``"runtime"``: as PyTorch runtimes (FSDP, DeepSpeed) keep memory, itemised
  per saved tensor of a pre-norm decoder layer in bf16, without dropout (LLaMA, MPT, GPT-3
  reproductions train with dropout 0) — :func:`runtime_layer_activation_bytes`:

  - ``s·b·h·(4 + 2 + 2 + 4·kv_dim/h + 2 + 2)``: the two norm inputs (residual stream), the
    q/k/v projection input, q, k and v (grouped-query attention shrinks k and v), the
    attention output (also the o-projection input), the MLP input;
  - MLP: ``4·s·b·ffn`` for GELU (its input and output), ``8·s·b·ffn`` for SwiGLU (gate and up
    outputs, SiLU output, their product);
  - attention: FlashAttention (``attention = "flash"``) keeps only the fp32 log-sum-exp,
    ``4·b·heads·s``; eager attention keeps the bf16 probabilities, ``2·b·heads·s²``;
  - output side: final-norm and LM-head inputs ``4·s·b·h``, and ``training.logit_bytes``
    per logit (default :data:`LOGIT_BYTES` = 10: the bf16 logits autocast produces (2), their
    fp32 upcast (4) and the fp32 log-softmax cross-entropy saves (4), all live at the loss;
    2 for a fused bf16 cross-entropy such as flash-attn's, llm-foundry's default);
  - with full recomputation: each layer's bf16 input ``2·s·b·h`` plus one layer's working set;
  - margin: :data:`FRAGMENTATION_FRACTION` (fitted on published llm-foundry runs, see
    docs/memory.md) of everything else, plus :data:`RUNTIME_RESERVE_BYTES`.

A configuration that does not fit is a result (``fits`` False, ``shortfall_bytes`` > 0), not
an error.

>>> from parosim.spec.model import preset
>>> from parosim.spec.system import ClusterSpec
>>> from parosim.spec.strategy import parse_strategy
>>> from parosim.spec.training import TrainingSpec
>>> mb = memory_breakdown(preset("llama-7b"), parse_strategy("NIG"), ClusterSpec(nodes=4),
...                       TrainingSpec())
>>> mb.fits, f"{mb.total_bytes / 1e9:.1f} GB"
(True, '37.7 GB')
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..errors import InputError
from ..io.runtime import as_runtime, training_for_runtime
from ..spec.model import ModelSpec, nominal_shape
from ..spec.strategy import Strategy, model_states_bytes, parse_strategy
from ..spec.system import ClusterSpec
from ..spec.training import (
    BYTES_PER_ACTIVATION,
    BYTES_PER_GRAD,
    BYTES_PER_PARAM,
    FP8_WEIGHT_CACHE_BYTES_PER_PARAM,
    TrainingSpec,
)
from .compute import fp8_peak_flops, layer_fp8_params
from .fp8mem import (  # noqa: F401  (output_activation_bytes: re-exported)
    FP8_PARAMS_CACHE_BYTES_PER_PARAM,
    fp8_activation_bytes,
    korthikanti_mask_bytes,
    output_activation_bytes,
)
from .runtime_memory import BUFFERED_LAYERS, runtime_memory_terms

# Allocator fragmentation of the Korthikanti estimate, fraction of everything else, when
# ``TrainingSpec.korthikanti_margin`` is unset (``--fidelity paper``, the Python API's
# default): the former default, a choice and not a measurement, kept so that the paper fidelity
# reproduces its numbers. ``--fidelity accurate`` uses the fitted
# parosim.spec.training.KORTHIKANTI_MARGIN_FRACTION (docs/memory.md).
MARGIN_FRACTION = 0.10
# CUDA context + cuBLAS workspace + NCCL buffers, 1 GiB: a default, not calibrated (both
# margin fits, the runtime model's and the Korthikanti estimate's, are made with it)
RUNTIME_RESERVE_BYTES = 2**30
# Runtime memory model. Bytes per logit at the loss: bf16 logits (2) + fp32 upcast (4) + fp32
# log-softmax saved for backward (4) (PyTorch autocast + F.cross_entropy).
LOGIT_BYTES = 10
# Caching-allocator fragmentation, fraction of the allocated bytes: fitted one-sided on half
# of the llm-foundry runs (the largest fraction under which every fit-half run still fits;
# experiments/08_memory/check_memory.py, docs/memory.md). 0.075 since the GPU capacities are
# nvidia-smi totals (81920MiB for "80GB"): the earlier fit (0.0) was made against 80e9-byte
# GPUs, and the 7 % capacity error stood in for the fragmentation.
FRAGMENTATION_FRACTION = 0.075


def margin_bytes(fraction: float, allocated: float) -> float:
    """The memory estimates' margin: ``fraction`` of the allocated bytes (states +
    activations + buffers) plus :data:`RUNTIME_RESERVE_BYTES`.

    >>> margin_bytes(0.1, 10 * 2**30) == 2 * 2**30
    True
    """
    return fraction * allocated + RUNTIME_RESERVE_BYTES


def korthikanti_margin(training: TrainingSpec) -> float:
    """The Korthikanti estimate's allocator margin, a fraction of states + activations +
    buffers: ``training.korthikanti_margin``, :data:`MARGIN_FRACTION` when unset.

    >>> t = TrainingSpec(korthikanti_margin=0.105)
    >>> korthikanti_margin(TrainingSpec()), korthikanti_margin(t)
    (0.1, 0.105)
    """
    k = training.korthikanti_margin
    return MARGIN_FRACTION if k is None else k


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per GPU. ``shape_estimated``: activations used :func:`nominal_shape`.
    ``memory_model``, ``attention``, ``logit_bytes`` (bytes per logit): the settings used."""

    model_states_bytes: float
    activations_bytes: float
    buffers_bytes: float
    margin_bytes: float
    total_bytes: float
    capacity_bytes: float
    fits: bool
    shortfall_bytes: float
    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    recompute: bool
    shape_estimated: bool = False
    memory_model: str = "korthikanti"   # the settings used (the runtime profile's if unset)
    attention: str = "eager"
    logit_bytes: int = 4                 # bytes per logit at the loss
    # precision fp8: the fp8 copy + fp8 transpose of the GEMM weights this GPU computes
    # with (2 bytes per parameter), included in model_states_bytes; 0 for bf16
    fp8_weight_cache_bytes: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


def layer_activation_bytes(model: ModelSpec, micro_batch: int, seq_len: int,
                           attention: str = "eager") -> float:
    """Korthikanti et al. 2022, eq. 1: s·b·h·(34 + 5·a·s/h) bytes per layer, no recompute.

    With FlashAttention the 5·a·s/h term (scores, softmax output, its dropout mask) is not
    stored; the kernel keeps an fp32 log-sum-exp per row instead, ``4·b·a·s``.

    >>> from parosim.spec.model import preset
    >>> f"{layer_activation_bytes(preset('llama-7b'), 4, 512) / 2**20:.0f} MiB"
    '432 MiB'
    """
    model.require_shape("activation memory")
    s, b, h, a = seq_len, micro_batch, model.hidden, model.heads
    if attention == "flash":
        return s * b * h * 34 + 4 * b * a * s
    return s * b * h * (34 + 5 * a * s / h)


def runtime_layer_activation_bytes(model: ModelSpec, micro_batch: int, seq_len: int,
                                   attention: str = "flash") -> float:
    """Bytes one decoder layer keeps for backward, runtime model (module docstring).

    >>> from parosim.spec.model import preset
    >>> f"{runtime_layer_activation_bytes(preset('llama-7b'), 4, 512) / 2**20:.0f} MiB"
    '300 MiB'
    """
    model.require_shape("activation memory")
    s, b, h, a = seq_len, micro_batch, model.hidden, model.heads
    sb = s * b
    per = sb * h * (4 + 2 + 2 + 4 * model.kv_dim / h + 2 + 2)
    per += sb * model.ffn_hidden * (8 if model.mlp == "swiglu" else 4)
    per += 4 * b * a * s if attention == "flash" else 2 * b * a * s * s
    return per


def runtime_output_activation_bytes(model: ModelSpec, micro_batch: int, seq_len: int,
                                    logit_bytes: int = LOGIT_BYTES) -> float:
    """Final norm + LM-head inputs (bf16) and the logits at the loss: 4·s·b·h +
    logit_bytes·s·b·vocab (10 for autocast + F.cross_entropy, 2 for a fused bf16 loss)."""
    model.require_shape("activation memory")
    sb = seq_len * micro_batch
    return 4 * sb * model.hidden + logit_bytes * sb * model.vocab


def activation_bytes(model: ModelSpec, micro_batch: int, seq_len: int, recompute: bool,
                     attention: str = "eager", memory_model: str = "korthikanti",
                     logit_bytes: int | None = None) -> float:
    """Activation bytes per GPU for one micro-batch in flight (see module docstring).

    The defaults are the Korthikanti estimate; ``memory_model="runtime"`` the runtime one.
    ``logit_bytes`` None: 4 (korthikanti) or :data:`LOGIT_BYTES` (runtime).
    """
    if memory_model == "runtime":
        per_layer = runtime_layer_activation_bytes(model, micro_batch, seq_len, attention)
        out = runtime_output_activation_bytes(model, micro_batch, seq_len,
                                              logit_bytes or LOGIT_BYTES)
    else:
        per_layer = layer_activation_bytes(model, micro_batch, seq_len, attention)
        out = output_activation_bytes(model, micro_batch, seq_len, logit_bytes or 4)
    kept = (BYTES_PER_ACTIVATION * seq_len * micro_batch * model.hidden if recompute
            else per_layer)
    working = per_layer if recompute else 0.0
    return model.layers * kept + working + out


def buffer_bytes(model: ModelSpec, strategy: Strategy, trainable_ratio: float) -> float:
    """Gathered-parameter and gradient-reduction buffers (see module docstring)."""
    biggest = max(model.layer_params, model.embedding_params, model.head_params)
    total = 0.0
    if strategy.p.value != "N":
        total += BUFFERED_LAYERS * BYTES_PER_PARAM * biggest
    if strategy.g.value != "N":
        total += BUFFERED_LAYERS * BYTES_PER_GRAD * biggest * trainable_ratio
    return total


def _breakdown(model: ModelSpec, strategy: Strategy, cluster: ClusterSpec,
               training: TrainingSpec, recompute: bool, runtime=None) -> MemoryBreakdown:
    runtime = as_runtime(runtime)
    training = training_for_runtime(training, runtime)   # the profile's memory settings
    n, m = cluster.gpus, cluster.group_size
    psi, psi_t = model.params, model.params * training.trainable_ratio
    d_p, d_g, d_os = strategy.divisors(n, m)
    states = model_states_bytes(strategy, psi, psi_t, n, m, training.optim_state_bytes)
    shaped = nominal_shape(model)
    if training.precision == "fp8" and training.memory_model == "korthikanti":
        # TE keeps fp8 GEMM inputs (docs/memory.md)
        acts = fp8_activation_bytes(shaped, training, recompute)
    else:
        acts = activation_bytes(shaped, training.micro_batch, training.seq_len, recompute,
                                training.attention, training.memory_model,
                                training.logit_bytes)
        if training.hidden_dropout is not None:   # explicit dropout: masks as told
            acts += _dropout_adjust(shaped, training, recompute)
    bufs = buffer_bytes(shaped, strategy, training.trainable_ratio)
    extra_params = 0.0
    if not runtime.is_ideal:  # the framework's persistence and buffers
        extra_params, bufs = runtime_memory_terms(shaped, strategy, cluster, training, runtime)
        states += extra_params
    cache = fp8_weight_cache_bytes(shaped, training, d_p=d_p)
    states += cache
    if training.fp8_params:   # fp8 primary weights: 1 byte instead of 2, sharded as params
        fp8_w = shaped.layers * _layer_fp8_params(shaped)
        states -= fp8_w / d_p
        extra_params -= fp8_w / d_p
    frac = (FRAGMENTATION_FRACTION if training.memory_model == "runtime"
            else korthikanti_margin(training))
    margin = margin_bytes(frac, states + acts + bufs)
    total = states + acts + bufs + margin
    cap = float(cluster.min_gpu_memory_bytes)  # overrides: the smallest GPU decides
    return MemoryBreakdown(
        model_states_bytes=states, activations_bytes=acts, buffers_bytes=bufs,
        margin_bytes=margin, total_bytes=total, capacity_bytes=cap, fits=total <= cap,
        shortfall_bytes=max(0.0, total - cap),
        params_bytes=BYTES_PER_PARAM * psi / d_p + extra_params,
        grads_bytes=BYTES_PER_GRAD * psi_t / d_g,
        optimizer_bytes=training.optim_state_bytes * psi_t / d_os, recompute=recompute,
        shape_estimated=not model.has_shape, memory_model=training.memory_model,
        attention=training.attention,
        logit_bytes=training.logit_bytes or (LOGIT_BYTES if training.memory_model == "runtime"
                                             else 4),
        fp8_weight_cache_bytes=cache)


def _layer_fp8_params(model: ModelSpec) -> float:
    return layer_fp8_params(model)


def _dropout_adjust(model: ModelSpec, training: TrainingSpec, recompute: bool) -> float:
    """An explicit ``hidden_dropout`` on a bf16 (or runtime-model) estimate: the Korthikanti
    estimate drops its two per-layer masks when it is 0; the runtime model (no masks) adds
    them when it is > 0 (``2·s·b·h`` bytes per layer, :mod:`parosim.cost.fp8mem`)."""
    sbh = training.seq_len * training.micro_batch * model.hidden
    if training.memory_model == "runtime":
        per = 2.0 * sbh if training.hidden_dropout else 0.0
        return per * (1 if recompute else model.layers)
    return -korthikanti_mask_bytes(model, training) * (1 if recompute else model.layers)


def fp8_weight_cache_bytes(model: ModelSpec, training: TrainingSpec,
                           fp8_params: float | None = None, d_p: int = 1,
                           layer_params: float | None = None) -> float:
    """``precision = "fp8"``: Transformer Engine keeps an fp8 copy and an fp8 transpose of
    every decoder-layer GEMM weight it computes with (cached across micro-batches), 2 bytes
    per parameter (:data:`parosim.spec.training.FP8_WEIGHT_CACHE_BYTES_PER_PARAM`), besides the
    bf16 parameters and fp32 states (kept as for bf16). ``fp8_params``: those weights on
    this GPU (default: all layers', as without TP/PP). 0.0 for bf16.

    ``d_p`` > 1 (parameters sharded: PaRO P level I or G, ZeRO-3, FSDP) with bf16 primary
    weights: a rank holds only its 1/``d_p`` shard of the weights between layers, so it
    caches only its shard's fp8 copy and transpose (cast once per optimizer step, then
    all-gathered in fp8 like torchao's float8 all-gather), plus the fp8 copies of the
    gathered layers in use (:data:`BUFFERED_LAYERS` of ``layer_params`` each, default one
    decoder layer's GEMM weights): ``2 x (fp8_params / d_p + BUFFERED_LAYERS x
    layer_params)``. Unsharded (``d_p`` = 1): the whole cache. ``fp8_params`` primary
    weights: the cached transposes, 1 byte per weight, stay whole (Megatron FSDP's
    ``keep_fp8_transpose_cache``, docs/memory.md "FP8").

    >>> from parosim.spec.model import preset
    >>> m = preset("llama-7b")
    >>> w = 4 * 4096**2 + 3 * 4096 * 11008          # one layer's GEMM weights
    >>> fp8_weight_cache_bytes(m, TrainingSpec(precision="fp8")) == 2 * 32 * w
    True
    >>> fp8_weight_cache_bytes(m, TrainingSpec(precision="fp8"), d_p=32) == 2 * (w + 2 * w)
    True
    """
    if training.precision != "fp8":
        return 0.0

    if fp8_params is None:
        fp8_params = model.layers * layer_fp8_params(model)
    if training.fp8_params:   # the weight is fp8 itself; only its transpose is cached, whole
        return FP8_PARAMS_CACHE_BYTES_PER_PARAM * fp8_params
    per = FP8_WEIGHT_CACHE_BYTES_PER_PARAM
    if d_p <= 1:
        return per * fp8_params
    if layer_params is None:
        layer_params = layer_fp8_params(model)
    return per * (fp8_params / d_p + BUFFERED_LAYERS * layer_params)


def resolve_recompute(model: ModelSpec, strategy: Strategy | str, cluster: ClusterSpec,
                      training: TrainingSpec, runtime=None) -> bool:
    """``training.recompute`` if set; auto (None): on iff it would not fit without.

    >>> from parosim.spec.model import preset
    >>> args = (parse_strategy("GGG"), ClusterSpec(nodes=4), TrainingSpec())
    >>> resolve_recompute(preset("llama-7b"), *args), resolve_recompute(preset("65b"), *args)
    (False, True)
    """
    if training.recompute is not None:
        return training.recompute
    strategy = parse_strategy(strategy)
    return not _breakdown(model, strategy, cluster, training, False,
                          as_runtime(runtime)).fits


def memory_breakdown(model: ModelSpec, strategy: Strategy | str, cluster: ClusterSpec,
                     training: TrainingSpec, runtime=None) -> MemoryBreakdown:
    """Bytes per GPU for ``strategy`` on ``cluster`` (see module docstring for the terms).

    Works for params-only models too: activations then use :func:`nominal_shape` and
    ``shape_estimated`` is True.
    """
    strategy = parse_strategy(strategy)
    if model.params * training.trainable_ratio < 1:
        raise InputError(f"trainable ratio {training.trainable_ratio!r} leaves less than one "
                         f"trainable parameter of the {model.params} of {model.name}; expected "
                         f"a ratio of at least {1 / model.params:.3g}")
    if training.precision == "fp8":   # refuses a GPU without FP8 (one line)

        fp8_peak_flops(cluster, training)
    runtime = as_runtime(runtime)
    recompute = resolve_recompute(model, strategy, cluster, training, runtime)
    return _breakdown(model, strategy, cluster, training, recompute, runtime)


def max_micro_batch(model: ModelSpec, strategy: Strategy | str, cluster: ClusterSpec,
                    training: TrainingSpec, limit: int = 1 << 16, runtime=None) -> int:
    """The largest micro-batch that fits (0 if even 1 does not), up to ``limit``.

    Memory grows with b (activations are linear in b), and under auto recomputation
    "fits" = fits without or fits with recomputation, also monotone; so bisection is exact.

    >>> from parosim.spec.model import preset
    >>> max_micro_batch(preset("llama-7b"), "NNN", ClusterSpec(nodes=4), TrainingSpec())
    0
    """
    strategy = parse_strategy(strategy)
    if not isinstance(limit, int) or limit < 1:
        raise InputError(f"limit = {limit!r} must be a positive integer")
    runtime = as_runtime(runtime)

    def fits(b: int) -> bool:
        return memory_breakdown(model, strategy, cluster, training.with_micro_batch(b),
                                runtime).fits

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)          # lo fits, hi does not (or is past the limit)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo
