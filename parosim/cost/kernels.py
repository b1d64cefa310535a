"""Kernel-level compute: a layer's time as the sum of the kernels a framework launches.

The flat model (:func:`parosim.cost.compute.compute_seconds`) charges every FLOP at one fraction
of peak. This model (``compute.model: kernel`` in the cluster YAML, or
``TrainingSpec(compute_model="kernel")``, CLI ``--compute-model kernel``) costs each kernel of
a decoder layer from its shape, on the GPU's datasheet peak FLOP/s and HBM bandwidth:

* **GEMMs** (q/k/v, o, MLP; LM head): ``2·M·N·K / (peak x e)`` with
  ``e = gemm_ceiling x quantization(M, N) x K / (K + gemm_k_half)``. ``gemm_ceiling`` is the
  measured ceiling of a large bf16 GEMM (SuperBench cutlass-profiler, A100 80GB: 261.2 of
  312 TFLOP/s = 0.837); ``quantization`` is tile (256 x 128 output tiles) and wave
  (``sm_count`` tiles at a time) quantization; ``gemm_k_half`` (fitted) is the reduction
  depth at which the main loop's fixed prologue/epilogue halves the efficiency. A GEMM is
  never faster than moving its operands over HBM. Backward = data-gradient GEMM (same
  shape) + weight-gradient GEMM (``M = N_out, N = K_in, K = tokens``), the latter scaled by the
  trainable ratio r.
* **Attention**: with FlashAttention (``TrainingSpec.attention = "flash"``, default) one
  kernel doing ``4·b·s²·h`` FLOPs forward, halved by the causal mask (FlashAttention-2 skips
  masked blocks), backward 2.5 x forward (it recomputes QKᵀ: five matmuls instead of two),
  at ``attention_efficiency`` of peak (fitted). Without it (``"eager"``) QKᵀ and AV are
  batched GEMMs (K = head_dim) and the ``b·heads·s²`` scores go through HBM in softmax,
  masking and their backward (:data:`EAGER_SCORE_BYTES_FWD` / ``_BWD`` bytes per score).
* **Memory-bound kernels** (norms, residual adds, activation function, rotary embedding,
  cross-entropy over the logits, embedding lookup and its gradient, the optimizer):
  bytes / (HBM bandwidth x ``hbm_efficiency``); the bytes per token are itemised in
  :func:`layer_elementwise_bytes`; ``hbm_efficiency`` is fitted (it absorbs the copies our
  itemisation misses).
* **Launch**: every kernel takes at least ``kernel_overhead_s`` (the host issues PyTorch eager
  ops about that fast, so a stream of shorter kernels is host-bound).
* **FP8** (``TrainingSpec.precision = "fp8"``; ``layer_times(..., peak_fp8_flops=...)``): the
  layer's weight GEMMs at the GPU's FP8 peak (same efficiency formula, fp8 operands, bf16
  output) plus Transformer Engine's bf16 -> fp8 cast kernels; attention and the LM head stay
  bf16 (docs/compute.md, "FP8 training").

The fitted parameters and their held-out errors come from
``experiments/07_compute_model/fit_compute.py`` on published llm-foundry MFU rows (see
``docs/compute.md``).

>>> from parosim.spec.model import preset
>>> from parosim.spec.training import TrainingSpec
>>> p = ComputeProfile(model="kernel")
>>> g = gemm_seconds(8192, 4096, 4096, 312e12, 2e12, p)
>>> f"{2 * 8192 * 4096 * 4096 / g / 1e12:.0f} TFLOP/s"
'201 TFLOP/s'
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import InputError
from ..spec.compute import (  # noqa: F401  (the profile and its sourced defaults, re-exported)
    A100_GEMM_CEILING,
    ATTENTION_KINDS,
    COMPUTE_MODELS,
    DEFAULT_KERNEL_OVERHEAD_S,
    FITTED_ATTENTION_EFFICIENCY,
    FITTED_EAGER_ATTENTION_EFFICIENCY,
    FITTED_GEMM_K_HALF,
    FITTED_HBM_EFFICIENCY,
    SM_COUNTS,
    ComputeProfile,
)
from ..spec.model import ModelSpec

TILE_M, TILE_N = 256, 128      # largest cutlass/cuBLAS bf16 tile on Ampere/Hopper

# Eager attention: bytes through HBM per attention score (fp16/bf16, 2 B each), our
# itemisation: forward writes QKᵀ (2), scale+mask+softmax read/write (4), AV reads it (2);
# backward reads probabilities and grad (4), writes grad of scores (2), softmax backward
# read/write (4), QKᵀ-grad GEMMs read it (2).
EAGER_SCORE_BYTES_FWD = 8
EAGER_SCORE_BYTES_BWD = 12
# Cross-entropy over the logits, bytes per logit: forward reads bf16 logits (2), writes and
# reads the fp32 upcast (4 + 4); backward writes fp32 softmax grad (4) and the bf16 logits
# grad (2), reading the saved fp32 (4). Our itemisation.
LOSS_BYTES_FWD = 10
LOSS_BYTES_BWD = 10
# Kernels per decoder layer besides GEMMs and attention (our itemisation of a PyTorch eager
# pre-norm block): 2 norms, 2 residual adds, activation, 2 rotary (LLaMA), ~3 reshapes/copies
# forward; backward about twice as many.
ELEMENTWISE_KERNELS_FWD = 10
ELEMENTWISE_KERNELS_BWD = 20
# FP8 (Transformer Engine 1.x, transformer_engine/pytorch/module/linear.py @0004dbd0,
# _Linear.forward / backward): each weight GEMM's activation input (forward) and incoming
# gradient (backward) goes through one bf16 -> fp8 cast kernel that reads 2 bytes and writes
# the fp8 copy (1 byte) for the forward / data-gradient GEMM; when the weight is trained,
# the fused cast-transpose (fp8_cast_transpose_fused) also writes its fp8 transpose (1 byte)
# for the weight-gradient GEMM (Hopper FP8 GEMMs take only the TN layout). Per element:
# FP8_CAST_BYTES_PER_ELEMENT + trainable_ratio x FP8_CAST_TRANSPOSE_BYTES_PER_ELEMENT. The
# weights are cast once per optimizer step (TE caches them across micro-batches,
# is_first_microbatch): read 2 + write 2 (fp8 weight and its fp8 transpose) bytes per
# parameter, costed with the optimizer step (parosim.cost.compute.fp8_weight_cast_seconds).
FP8_CAST_BYTES_PER_ELEMENT = 3
FP8_CAST_TRANSPOSE_BYTES_PER_ELEMENT = 1
FP8_WEIGHT_CAST_BYTES_PER_PARAM = 4


def gemm_efficiency(m: float, n: float, k: float, p: ComputeProfile, sms: int = 108,
                    batch: int = 1, depth: float | None = None) -> float:
    """Fraction of peak a bf16 GEMM of output m x n and depth k reaches (module docstring).

    >>> p = ComputeProfile()
    >>> round(gemm_efficiency(16384, 16384, 16384, p), 3), round(gemm_efficiency(1024, 1024,
    ...                                                                         1024, p), 3)
    (0.79, 0.129)
    """
    tiles_m, tiles_n = math.ceil(m / TILE_M), math.ceil(n / TILE_N)
    tiles = tiles_m * tiles_n * batch     # a batched GEMM's tiles share the waves
    waves = math.ceil(tiles / sms)
    quant = (m * n) / (tiles_m * TILE_M * tiles_n * TILE_N) * tiles / (waves * sms)
    return p.gemm_ceiling * quant * (k / (k + p.gemm_k_half) if depth is None else depth)


def gemm_seconds(m: float, n: float, k: float, peak_flops: float, hbm_Bps: float,
                 p: ComputeProfile, batch: int = 1, sms: int = 108,
                 depth: float | None = None, operand_bytes: int = 2) -> float:
    """One (batched) GEMM: max(compute, operand traffic, launch). ``depth``: the
    efficiency factor that replaces ``K / (K + gemm_k_half)`` (eager attention's batched
    GEMMs use ``eager_attention_efficiency``). ``operand_bytes``: 2 (bf16 inputs and
    output) or 1 (an FP8 GEMM: fp8 inputs, bf16 output; ``peak_flops`` is then the FP8
    peak)."""
    flops = 2.0 * m * n * k * batch
    t_compute = flops / (peak_flops * gemm_efficiency(m, n, k, p, sms, batch, depth))
    if operand_bytes == 2:
        t_memory = 2.0 * (m * k + k * n + m * n) * batch / (hbm_Bps * p.hbm_efficiency)
    else:
        t_memory = ((operand_bytes * (m * k + k * n) + 2.0 * m * n) * batch
                    / (hbm_Bps * p.hbm_efficiency))
    return max(t_compute, t_memory, p.kernel_overhead_s)


def layer_gemm_shapes(model: ModelSpec) -> list[tuple[int, int]]:
    """(N_out, K_in) of a decoder layer's weight GEMMs (M is the token count)."""
    h, f, kv = model.hidden, model.ffn_hidden, model.kv_dim
    mlp = [(2 * f, h), (h, f)] if model.mlp == "swiglu" else [(f, h), (h, f)]
    return [(h + 2 * kv, h), (h, h), *mlp]


def layer_elementwise_bytes(model: ModelSpec, tokens: int, tp: int = 1,
                            sp: bool = False) -> float:
    """HBM bytes of a layer's forward memory-bound kernels (bf16, 2 bytes per element).

    Per token, in units of h elements read or written: 2 norms (read, write: 2 each),
    2 residual adds (3 each), the activation (GELU: read and write ffn; SwiGLU: read 2·ffn,
    write ffn), rotary embedding for RMSNorm/SwiGLU (LLaMA-style) models (read and write q and
    k). Biases are fused into the GEMM epilogue.

    With tensor parallelism of degree ``tp`` each rank runs the activation and rotary on its
    shard (ffn/tp, heads/tp); norms and residual adds run on the whole ``tokens x h`` (every
    TP rank repeats them, Megatron) unless ``sp`` (sequence parallelism: tokens/tp each).

    >>> from parosim.spec.model import preset
    >>> layer_elementwise_bytes(preset("llama-7b"), 1) / (2 * 4096)
    22.0625
    """
    h, f = model.hidden, model.ffn_hidden
    units = (2 * 2 + 2 * 3) / (tp if sp else 1)
    units += (3 * f if model.mlp == "swiglu" else 2 * f) / h / tp
    if model.mlp == "swiglu":          # LLaMA family: rotary on q and k
        units += 2 * (h + model.kv_dim) / h / tp
    return 2.0 * units * h * tokens


@dataclass(frozen=True)
class LayerTimes:
    """Seconds of one decoder layer for one micro-batch, split by kernel class."""

    gemm_fwd_s: float
    gemm_bwd_s: float
    attention_fwd_s: float
    attention_bwd_s: float
    elementwise_fwd_s: float
    elementwise_bwd_s: float
    cast_fwd_s: float = 0.0      # FP8 only: bf16 -> fp8 casts of the GEMMs' inputs
    cast_bwd_s: float = 0.0      # FP8 only: bf16 -> fp8 casts of the incoming gradients

    @property
    def forward_s(self) -> float:
        return self.gemm_fwd_s + self.attention_fwd_s + self.elementwise_fwd_s + self.cast_fwd_s

    @property
    def backward_s(self) -> float:
        return (self.gemm_bwd_s + self.attention_bwd_s + self.elementwise_bwd_s
                + self.cast_bwd_s)


def layer_times(model: ModelSpec, micro_batch: int, seq_len: int, trainable_ratio: float,
                attention: str, peak_flops: float, hbm_Bps: float, p: ComputeProfile,
                sms: int = 108, tp: int = 1, sp: bool = False,
                peak_fp8_flops: float = 0.0) -> LayerTimes:
    """Kernel times of one decoder layer on one rank (module docstring).

    ``tp``: Megatron tensor parallelism (column-parallel q/k/v and MLP-up GEMMs with
    ``N_out / tp``, row-parallel o and MLP-down with ``K_in / tp``; attention on
    ``heads / tp``; memory-bound kernels as :func:`layer_elementwise_bytes`); M stays the
    micro-batch's tokens (with ``sp`` the all-gather restores them before each GEMM).
    ``tp = 1`` is the unsplit layer, the same numbers to the bit.

    ``peak_fp8_flops`` > 0: FP8 training (Transformer Engine, docs/compute.md "FP8"): the
    weight GEMMs (forward, data gradient, weight gradient) run at this peak with the same
    efficiency formula, fp8 operands (1 byte) and bf16 output in their traffic bound; each
    weight GEMM's activation input (forward) and its incoming gradient (backward) is cast
    bf16 -> fp8 (read 2, write 1, and the fp8 transpose for the weight gradient: 1 x r bytes
    per element; one kernel per cast);
    attention stays bf16 at ``peak_flops``. 0 (the default): bf16.

    >>> from parosim.spec.model import preset
    >>> t = layer_times(preset("llama-7b"), 4, 512, 1.0, "flash", 312e12, 2e12,
    ...                 ComputeProfile(model="kernel"))
    >>> f"{t.forward_s * 1e3:.2f} ms fwd, {t.backward_s * 1e3:.2f} ms bwd"
    '4.52 ms fwd, 9.68 ms bwd'
    """
    if attention not in ATTENTION_KINDS:
        raise InputError(f"attention = {attention!r} is not known; expected one of "
                         f"{', '.join(ATTENTION_KINDS)}")
    model.require_shape("the kernel compute model")
    tokens = micro_batch * seq_len
    r = trainable_ratio

    def g(m, n, k, batch=1, depth=None):
        return gemm_seconds(m, n, k, peak_flops, hbm_Bps, p, batch, sms, depth)

    fp8 = peak_fp8_flops > 0

    def w(m, n, k):      # a weight GEMM: bf16, or fp8 operands at the FP8 peak
        if not fp8:
            return g(m, n, k)
        return gemm_seconds(m, n, k, peak_fp8_flops * p.fp8_gemm_efficiency, hbm_Bps, p, 1,
                            sms, None, 1)

    fwd = bwd = 0.0
    cast_in = cast_grad = 0.0     # elements cast bf16 -> fp8 (FP8 only)
    shapes = layer_gemm_shapes(model)
    for i, (n_out, k_in) in enumerate(shapes):
        if tp > 1:   # column-parallel (qkv, MLP up: even index) / row-parallel (o, down)
            n_out, k_in = (n_out / tp, k_in) if i % 2 == 0 else (n_out, k_in / tp)
        fwd += w(tokens, n_out, k_in)
        bwd += w(tokens, k_in, n_out) + r * w(n_out, k_in, tokens)
        cast_in += tokens * k_in
        cast_grad += tokens * n_out
    b, s, h, a, d = micro_batch, seq_len, model.hidden, model.heads, model.head_dim
    if tp > 1:       # each rank holds heads / tp
        h, a = h / tp, a // tp
    if attention == "flash":
        flops = 4.0 * b * s * s * h * 0.5
        att_f = max(flops / (peak_flops * p.attention_efficiency), p.kernel_overhead_s)
        att_b = max(2.5 * flops / (peak_flops * p.attention_efficiency), p.kernel_overhead_s)
    else:
        scores = float(b * a * s * s)
        bw = hbm_Bps * p.hbm_efficiency
        e = p.eager_attention_efficiency
        qk, av = g(s, s, d, b * a, e), g(s, d, s, b * a, e)
        att_f = qk + av + max(EAGER_SCORE_BYTES_FWD * scores / bw, p.kernel_overhead_s)
        att_b = 2 * qk + 2 * av + max(EAGER_SCORE_BYTES_BWD * scores / bw, p.kernel_overhead_s)
    ew = layer_elementwise_bytes(model, tokens, tp, sp) / (hbm_Bps * p.hbm_efficiency)
    ew_f = max(ew, ELEMENTWISE_KERNELS_FWD * p.kernel_overhead_s)
    ew_b = max(2.0 * ew, ELEMENTWISE_KERNELS_BWD * p.kernel_overhead_s)
    if not fp8:
        return LayerTimes(fwd, bwd, att_f, att_b, ew_f, ew_b)
    bw = hbm_Bps * p.hbm_efficiency
    n_casts = len(shapes) * p.kernel_overhead_s
    per_element = FP8_CAST_BYTES_PER_ELEMENT + r * FP8_CAST_TRANSPOSE_BYTES_PER_ELEMENT
    cast_f = max(per_element * cast_in / bw, n_casts)
    cast_b = max(per_element * cast_grad / bw, n_casts)
    return LayerTimes(fwd, bwd, att_f, att_b, ew_f, ew_b, cast_f, cast_b)


def head_times(model: ModelSpec, micro_batch: int, seq_len: int, trainable_ratio: float,
               peak_flops: float, hbm_Bps: float, p: ComputeProfile,
               sms: int = 108, tp: int = 1, sp: bool = False) -> tuple[float, float]:
    """(forward, backward) seconds of final norm + LM head GEMM + cross-entropy, on one rank.

    ``tp``: the vocabulary-parallel head (Megatron) splits the vocabulary: GEMMs with
    ``vocab / tp`` and the loss over the local logits; the final norm runs on all tokens
    unless ``sp``.
    """
    tokens = micro_batch * seq_len
    h, v = model.hidden, model.vocab
    if tp > 1:
        v = v / tp
    nt = tokens / tp if sp else tokens     # the final norm's tokens
    bw = hbm_Bps * p.hbm_efficiency
    fwd = (gemm_seconds(tokens, v, h, peak_flops, hbm_Bps, p, 1, sms)
           + max(LOSS_BYTES_FWD * tokens * v / bw, p.kernel_overhead_s)
           + max(2 * 2.0 * nt * h / bw, p.kernel_overhead_s))
    bwd = (gemm_seconds(tokens, h, v, peak_flops, hbm_Bps, p, 1, sms)
           + trainable_ratio * gemm_seconds(v, h, tokens, peak_flops, hbm_Bps, p, 1, sms)
           + max(LOSS_BYTES_BWD * tokens * v / bw, p.kernel_overhead_s)
           + max(3 * 2.0 * nt * h / bw, p.kernel_overhead_s))
    return fwd, bwd


def embed_times(model: ModelSpec, micro_batch: int, seq_len: int, trainable_ratio: float,
                hbm_Bps: float, p: ComputeProfile, tp: int = 1) -> tuple[float, float]:
    """(forward, backward) seconds of the embedding lookup and its gradient.

    Forward reads and writes ``tokens·h`` bf16 (plus the position rows when learned);
    backward zero-fills the ``vocab·h`` gradient and scatter-adds ``tokens·h`` into it (only
    when the embedding is trained, scaled by the trainable ratio). With ``tp`` (Megatron's
    vocabulary-parallel embedding) each rank zero-fills ``vocab·h / tp``; the lookup output
    is the whole ``tokens·h`` on every rank (masked, then all-reduced).
    """
    tokens = micro_batch * seq_len
    h = model.hidden
    bw = hbm_Bps * p.hbm_efficiency
    passes = 2 + (2 if model.pos_embedding else 0)
    fwd = max(passes * 2.0 * tokens * h / bw, p.kernel_overhead_s)
    vocab = model.vocab / tp if tp > 1 else model.vocab
    bwd = max(trainable_ratio * (2.0 * vocab * h + 3 * 2.0 * tokens * h) / bw,
              p.kernel_overhead_s)
    return fwd, bwd
