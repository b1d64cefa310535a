"""Compute cost of one micro-step, per layer, from the model's shape.

FLOP counts (a multiply-add = 2 FLOPs), per token, following Narayanan et al. 2021
("Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", appendix:
a layer's forward is 24·b·s·h² + 4·b·s²·h for a 4h MLP), written for LLaMA's shapes:

* decoder-layer matmuls, forward: ``2·(4h² + 3·h·ffn)`` (q, k, v, o; SwiGLU gate, up, down);
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

Times are FLOPs / (peak FLOP/s x ``training.compute_efficiency``). The optimizer step is
memory-bound and costed by the bytes it touches over HBM bandwidth (:data:`ADAM_BYTES_PER_PARAM`).

>>> from parosim.models import preset
>>> from parosim.training import TrainingSpec
>>> m, t = preset("llama-7b"), TrainingSpec()
>>> f"{layer_forward_flops(m, t) / 1e12:.3f} TFLOP"
'0.846 TFLOP'
"""

from __future__ import annotations

from .models import ModelSpec
from .specs import ClusterSpec
from .strategies import Strategy
from .training import TrainingSpec

# Adam update of one trainable parameter of the local optimizer shard, bytes through HBM:
# read fp32 master (4) + m (4) + v (4) + bf16 gradient (2) = 14; write master, m, v (12) and
# the new bf16 parameter (2) = 14. A fused multi-tensor Adam kernel touches each once.
ADAM_BYTES_PER_PARAM = 28


def layer_linear_flops_per_token(model: ModelSpec) -> float:
    """Forward matmul FLOPs of one decoder layer per token: 2·(4h² + 3·h·ffn)."""
    model.require_shape("compute cost")
    h = model.hidden
    return 2.0 * (4 * h * h + 3 * h * model.ffn_hidden)


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

    >>> from parosim.models import preset
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

    >>> from parosim.models import preset
    >>> from parosim.strategies import parse_strategy
    >>> t = optimizer_step_seconds(preset("llama-7b"), parse_strategy("NNN"),
    ...                            ClusterSpec(nodes=4), TrainingSpec())
    >>> f"{t * 1e3:.1f} ms"
    '94.3 ms'
    """
    shard = optimizer_shard_params(model, strategy, cluster, training)
    return ADAM_BYTES_PER_PARAM * shard / cluster.gpu.hbm_bandwidth_Bps


def step_flops(model: ModelSpec, training: TrainingSpec, tokens: float) -> float:
    """Model FLOPs for MFU: 6·Ψ·tokens + 12·L·h·seq·tokens (shared/HARDWARE.md).

    Recomputation is not counted (MFU counts the model's FLOPs, not the hardware's), nor is
    the cheaper backward of partly frozen models: MFU is defined on the full 6Ψ.

    >>> from parosim.models import preset
    >>> f"{step_flops(preset('llama-7b'), TrainingSpec(), 1) / 1e9:.2f} GFLOP per token"
    '41.24 GFLOP per token'
    """
    model.require_shape("the MFU FLOP count")
    return (6.0 * model.params * tokens
            + 12.0 * model.layers * model.hidden * training.seq_len * tokens)
