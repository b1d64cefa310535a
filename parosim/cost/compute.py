"""Compute cost of one micro-step, per layer, from the model's shape.

FLOP counts (a multiply-add = 2 FLOPs), per token, following Narayanan et al. 2021
("Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", appendix:
a layer's forward is 24·b·s·h² + 4·b·s²·h for a 4h MLP), written for LLaMA's shapes:

* decoder-layer matmuls, forward: ``2·(4h² + 3·h·ffn)`` (q, k, v, o; SwiGLU gate, up, down);
  in general twice the layer's matmul weights, ``2·(2h² + 2·h·kv_dim + mlp)`` with
  grouped-query attention and ``mlp = 2·h·ffn`` for a GELU MLP;
* attention scores QKᵀ and the weighted sum AV, forward: ``2·2·s·h`` (causal masking not
  exploited, as in the reference);
* LM head, forward: ``2·h·vocab``; embedding lookup, norms, softmax, activation functions:
  ignored (not matmuls, < 1% of the FLOPs);
* backward = 2 x forward (gradient w.r.t. the input and w.r.t. the weights). When only a
  fraction r = Ψ'/Ψ of the weights is trained, the weight-gradient matmuls shrink to r of
  theirs: backward linear FLOPs = (1 + r) x forward; attention-core backward stays 2 x. For
  r = 1 this is exactly 2 x forward. (Assumes trainable weights are spread evenly over the
  layers, LoRA-like.)
* activation recomputation adds one forward before each layer's backward.

Times, flat model (the default): FLOPs / (peak FLOP/s x ``training.compute_efficiency``).
With ``training.precision = "fp8"`` the decoder-layer weight-GEMM FLOPs run at the GPU's FP8
peak (``GPUSpec.peak_fp8_flops``) x efficiency and the rest (attention, LM head) at the bf16
peak x efficiency (:func:`flat_layer_seconds`; docs/compute.md, "FP8").
Kernel model (:mod:`parosim.cost.kernels`, chosen by ``training.compute_model`` or the cluster's
``compute.model``): each kernel from its shape; :func:`op_seconds` gives both. The optimizer
step is memory-bound and costed by the bytes it touches over HBM bandwidth
(:data:`ADAM_BYTES_PER_PARAM`; x ``hbm_efficiency`` under the kernel model).

>>> from parosim.spec.model import preset
>>> from parosim.spec.training import TrainingSpec
>>> m, t = preset("llama-7b"), TrainingSpec()
>>> f"{layer_forward_flops(m, t) / 1e12:.3f} TFLOP"
'0.846 TFLOP'
"""

from __future__ import annotations

from ..errors import InputError
from ..spec.model import ModelSpec
from ..spec.strategy import Strategy
from ..spec.system import ClusterSpec
from ..spec.training import TrainingSpec
from .kernels import FP8_WEIGHT_CAST_BYTES_PER_PARAM, embed_times, head_times, layer_times

# Adam update of one trainable parameter of the local optimizer shard, bytes through HBM:
# read fp32 master (4) + m (4) + v (4) + bf16 gradient (2) = 14; write master, m, v (12) and
# the new bf16 parameter (2) = 14. A fused multi-tensor Adam kernel touches each once.
ADAM_BYTES_PER_PARAM = 28


def layer_linear_flops_per_token(model: ModelSpec) -> float:
    """Forward matmul FLOPs of one decoder layer per token: 2·(4h² + 3·h·ffn)."""
    model.require_shape("compute cost")
    return 2.0 * (model.attention_matmul_params + model.mlp_matmul_params)


def layer_attention_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """Forward FLOPs of QKᵀ and AV per token: 2·2·s·h (Narayanan et al. 2021)."""
    model.require_shape("compute cost")
    return 4.0 * seq_len * model.hidden


def layer_forward_flops(model: ModelSpec, training: TrainingSpec) -> float:
    """Forward FLOPs of one decoder layer for one micro-batch (b x seq tokens)."""
    per_token = (layer_linear_flops_per_token(model)
                 + layer_attention_flops_per_token(model, training.seq_len))
    return training.tokens_per_micro_step * per_token


def layer_backward_flops(model: ModelSpec, training: TrainingSpec) -> float:
    """Backward FLOPs of one decoder layer for one micro-batch: (1 + r)·linear + 2·attention.

    >>> from parosim.spec.model import preset
    >>> m, t = preset("llama-7b"), TrainingSpec()
    >>> layer_backward_flops(m, t) == 2 * layer_forward_flops(m, t)
    True
    """
    r = training.trainable_ratio
    per_token = ((1.0 + r) * layer_linear_flops_per_token(model)
                 + 2.0 * layer_attention_flops_per_token(model, training.seq_len))
    return training.tokens_per_micro_step * per_token


def head_forward_flops(model: ModelSpec, training: TrainingSpec) -> float:
    """LM-head forward FLOPs for one micro-batch: 2·h·vocab per token."""
    model.require_shape("compute cost")
    return training.tokens_per_micro_step * 2.0 * model.hidden * model.vocab


def head_backward_flops(model: ModelSpec, training: TrainingSpec) -> float:
    """LM-head backward FLOPs for one micro-batch: (1 + r) x forward."""
    return (1.0 + training.trainable_ratio) * head_forward_flops(model, training)


def fp8_peak_flops(cluster: ClusterSpec, training: TrainingSpec) -> float:
    """The FP8 peak the decoder-layer weight GEMMs run at: 0.0 for ``precision = "bf16"``,
    else ``cluster.gpu.peak_fp8_flops``. Refuses (one line) ``"fp8"`` on a GPU without FP8
    tensor cores, and on a cluster whose GPUs differ in their FP8 / bf16 peak ratio (per-rank
    speeds are scaled by the bf16 peak ratio, :mod:`parosim.evaluate.ranks`).

    >>> fp8_peak_flops(ClusterSpec(), TrainingSpec())
    0.0
    >>> fp8_peak_flops(ClusterSpec(), TrainingSpec(precision="fp8"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    parosim.errors.InputError: --precision fp8 needs FP8 tensor cores; GPU A100-SXM4-80GB ...
    """
    if training.precision != "fp8":
        return 0.0
    base = cluster.gpu
    # the GPUs the ranks have: an override of every node ("what if these GPUs had FP8")
    # replaces the base GPU, which then need not have FP8 itself
    gpus = list(dict.fromkeys(g for g, _, _ in cluster.gpu_specs())) if cluster.overrides \
        else [base]
    ref = gpus[0]
    for g in gpus:
        if not g.peak_fp8_flops > 0:
            raise InputError(f"--precision fp8 needs FP8 tensor cores; GPU {g.model} has none "
                             "(gpu.peak_fp8_tflops = 0); expected bf16, or a GPU with FP8 "
                             "(H100, H200) or gpu.peak_fp8_tflops in the cluster YAML")
        if abs(g.peak_fp8_flops * ref.peak_flops - ref.peak_fp8_flops * g.peak_flops) > (
                1e-12 * ref.peak_fp8_flops * g.peak_flops):
            raise InputError(f"--precision fp8 on cluster {cluster.name!r}: GPU {g.model} has "
                             "another FP8 / bf16 peak ratio than the cluster's "
                             f"{ref.model}; expected GPUs whose FP8 and bf16 peaks scale "
                             "alike (per-rank speeds use the bf16 peak ratio)")
    # per-rank speeds scale the base GPU's times by the bf16 peak ratio: the base's FP8 peak
    # at the ranks' FP8 / bf16 ratio gives each rank its own FP8 peak
    return ref.peak_fp8_flops * base.peak_flops / ref.peak_flops


def layer_fp8_params(model: ModelSpec) -> float:
    """Weights of one decoder layer's GEMMs (q, k, v, o and the MLP): the ones that run in
    FP8 and are cached in fp8 under ``precision = "fp8"``."""
    return float(model.attention_matmul_params + model.mlp_matmul_params)


def fp8_weight_cast_seconds(fp8_params: float, trainable_ratio: float, cluster: ClusterSpec,
                            training: TrainingSpec) -> float:
    """Once per optimizer step, the trained fp8-GEMM weights (``trainable_ratio`` x
    ``fp8_params`` on this rank) are cast to fp8 with their transpose: 4 bytes per
    parameter over HBM (x ``hbm_efficiency`` under the kernel model). 0.0 for bf16; frozen
    weights keep their cached fp8 copy."""
    if training.precision != "fp8":
        return 0.0
    bw = cluster.gpu.hbm_bandwidth_Bps
    if compute_model(cluster, training) == "kernel":
        bw *= cluster.compute.hbm_efficiency
    return FP8_WEIGHT_CAST_BYTES_PER_PARAM * fp8_params * trainable_ratio / bw


def flat_layer_seconds(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                       tp: int = 1) -> dict[str, float]:
    """Flat model under ``precision = "fp8"``: one decoder layer's seconds on one rank,
    keys ``fwd``, ``bwd``, ``attention_fwd``: the weight-GEMM FLOPs (linear, :func:`layer_
    linear_flops_per_token`) at the FP8 peak x efficiency, the attention FLOPs at the bf16
    peak x efficiency; FLOPs / ``tp`` (Megatron TP splits both evenly).

    >>> from parosim.spec.model import preset
    >>> from parosim.spec.system import GPUSpec
    >>> c = ClusterSpec(gpu=GPUSpec("H100-SXM5-80GB", 80 * 10**9, 989e12, 3.35e12, 1979e12))
    >>> t = flat_layer_seconds(preset("llama-7b"), c, TrainingSpec(precision="fp8"))
    >>> lin, att = 2048 * 2 * (4 * 4096**2 + 3 * 4096 * 11008), 2048 * 4 * 512 * 4096
    >>> t["fwd"] == lin / (1979e12 * 0.5) + att / (989e12 * 0.5)
    True
    >>> f"{t['fwd'] * 1e3:.4f} ms"
    '0.8725 ms'
    """
    e = training.compute_efficiency
    peak8, peak = fp8_peak_flops(cluster, training), cluster.gpu.peak_flops
    tokens, r = training.tokens_per_micro_step, training.trainable_ratio
    lin = tokens * layer_linear_flops_per_token(model) / tp
    att = tokens * layer_attention_flops_per_token(model, training.seq_len) / tp
    return {"fwd": lin / (peak8 * e) + att / (peak * e),
            "bwd": (1.0 + r) * lin / (peak8 * e) + 2.0 * att / (peak * e),
            "attention_fwd": att / (peak * e)}


def compute_seconds(flops: float, cluster: ClusterSpec, training: TrainingSpec) -> float:
    """Matmul time: FLOPs / (peak FLOP/s x compute_efficiency).

    >>> compute_seconds(156e12, ClusterSpec(), TrainingSpec())
    1.0
    """
    return flops / (cluster.gpu.peak_flops * training.compute_efficiency)


def optimizer_shard_params(model: ModelSpec, strategy: Strategy, cluster: ClusterSpec,
                           training: TrainingSpec) -> float:
    """Trainable parameters in this GPU's optimizer shard: Ψ'/d_os."""
    d_os = strategy.os.divisor(cluster.gpus, cluster.group_size)
    return model.params * training.trainable_ratio / d_os


def optimizer_step_seconds(model: ModelSpec, strategy: Strategy, cluster: ClusterSpec,
                           training: TrainingSpec) -> float:
    """Adam step on the local optimizer shard: 28 bytes per param / HBM bandwidth.

    Memory-bound (about 1 FLOP per byte, far below the A100's ~150 FLOP/byte ridge point);
    full datasheet bandwidth is assumed, so this is a lower bound.

    >>> from parosim.spec.model import preset
    >>> from parosim.spec.strategy import parse_strategy
    >>> t = optimizer_step_seconds(preset("llama-7b"), parse_strategy("NNN"),
    ...                            ClusterSpec(nodes=4), TrainingSpec())
    >>> f"{t * 1e3:.1f} ms"
    '94.3 ms'
    """
    shard = optimizer_shard_params(model, strategy, cluster, training)
    bw = cluster.gpu.hbm_bandwidth_Bps
    if compute_model(cluster, training) == "kernel":
        bw *= cluster.compute.hbm_efficiency
    adam = ADAM_BYTES_PER_PARAM * shard / bw
    if training.precision != "fp8":
        return adam
    # FP8: every rank computes with the whole model here (no TP/PP): it re-casts all its
    # trained fp8-GEMM weights once per step (docs/compute.md, "FP8")
    return adam + fp8_weight_cast_seconds(model.layers * layer_fp8_params(model),
                                          training.trainable_ratio, cluster, training)


def compute_model(cluster: ClusterSpec, training: TrainingSpec) -> str:
    """``training.compute_model`` if set, else the cluster's ``compute.model``.

    >>> kernel = TrainingSpec(compute_model="kernel")
    >>> compute_model(ClusterSpec(), TrainingSpec()), compute_model(ClusterSpec(), kernel)
    ('flat', 'kernel')
    """
    return training.compute_model or cluster.compute.model


def op_seconds(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec
               ) -> dict[tuple[str, str], float]:
    """Seconds of each compute op of a micro-step: keys ``(unit kind, phase)`` with kind in
    layer / head / embed and phase in fwd / bwd.

    Flat model: FLOPs / (peak x efficiency), the embedding free. Kernel model: the kernels
    of :mod:`parosim.cost.kernels`.

    >>> from parosim.spec.model import preset
    >>> t = op_seconds(preset("llama-7b"), ClusterSpec(), TrainingSpec())
    >>> t[("layer", "fwd")] == compute_seconds(layer_forward_flops(preset("llama-7b"),
    ...                                        TrainingSpec()), ClusterSpec(), TrainingSpec())
    True
    """
    peak8 = fp8_peak_flops(cluster, training)    # 0.0: bf16; refuses fp8 without FP8
    if compute_model(cluster, training) == "flat":
        def sec(f: float) -> float:
            return compute_seconds(f, cluster, training)
        if peak8:
            ls = flat_layer_seconds(model, cluster, training)
            return {("layer", "fwd"): ls["fwd"], ("layer", "bwd"): ls["bwd"],
                    ("head", "fwd"): sec(head_forward_flops(model, training)),
                    ("head", "bwd"): sec(head_backward_flops(model, training)),
                    ("embed", "fwd"): 0.0, ("embed", "bwd"): 0.0}
        return {("layer", "fwd"): sec(layer_forward_flops(model, training)),
                ("layer", "bwd"): sec(layer_backward_flops(model, training)),
                ("head", "fwd"): sec(head_forward_flops(model, training)),
                ("head", "bwd"): sec(head_backward_flops(model, training)),
                ("embed", "fwd"): 0.0, ("embed", "bwd"): 0.0}
    gpu, p = cluster.gpu, cluster.compute
    sms = p.sms(gpu.model)
    b, s, r = training.micro_batch, training.seq_len, training.trainable_ratio
    lt = layer_times(model, b, s, r, training.with_defaults().attention, gpu.peak_flops,
                     gpu.hbm_bandwidth_Bps, p, sms, peak_fp8_flops=peak8)
    hf, hb = head_times(model, b, s, r, gpu.peak_flops, gpu.hbm_bandwidth_Bps, p, sms)
    ef, eb = embed_times(model, b, s, r, gpu.hbm_bandwidth_Bps, p)
    return {("layer", "fwd"): lt.forward_s, ("layer", "bwd"): lt.backward_s,
            ("head", "fwd"): hf, ("head", "bwd"): hb, ("embed", "fwd"): ef,
            ("embed", "bwd"): eb}


def step_flops(model: ModelSpec, training: TrainingSpec, tokens: float) -> float:
    """Model FLOPs for MFU: 6·Ψ·tokens + 12·L·h·seq·tokens (docs/model.md).

    Recomputation is not counted (MFU counts the model's FLOPs, not the hardware's), nor is
    the cheaper backward of partly frozen models: MFU is defined on the full 6Ψ.

    >>> from parosim.spec.model import preset
    >>> f"{step_flops(preset('llama-7b'), TrainingSpec(), 1) / 1e9:.2f} GFLOP per token"
    '41.24 GFLOP per token'
    """
    model.require_shape("the MFU FLOP count")
    return (6.0 * model.params * tokens
            + 12.0 * model.layers * model.hidden * training.seq_len * tokens)
