"""GPU memory of a MoE training step (docs/moe.md, "Memory of a MoE step"): model states
(dense + expert), activations with top-k routing, gathered-parameter buffers, margin.

Layout: EP beside DP (TP = PP = CP = ETP = 1, :mod:`parosim.plan.moe_step`); one micro-batch
in flight (gradient accumulation runs micro-batches one after another); no recomputation.

Activations, bytes per GPU for a micro-batch of T = b·s tokens, bf16 unless stated, each
tensor a layer keeps for its backward (itemised as the runtime memory model of
docs/memory.md, extended to MoE blocks):

* attention, per token: the two norm inputs ``4h``, the projection input ``2h``, q, k, v
  ``2·(w_q + w_k + w_v)``, the attention output ``2·w_v`` (also the o-projection input), the
  MLP / router input ``2h``; MLA adds its latents ``2·(r_q + r_kv + d_rope)``; the scores:
  FlashAttention keeps an fp32 log-sum-exp ``4·a``, eager attention the bf16
  probabilities ``2·a·s``;
* a dense MLP (the first ``dense_layers`` layers; shared experts per token): ``8·f`` for
  SwiGLU (gate and up outputs, the SiLU output, their product), ``4·f`` for GELU;
* the router, per token: fp32 logits and probabilities ``8·E``, the top-k choice
  ``k·(8 + 4)`` (int64 expert index, fp32 weight);
* the routed experts, per dispatched row (rows = T·k; with a capacity factor c the buffer
  padded to ``E·ceil(c·T·k/E)`` rows): the dispatched tokens (the experts' input after the
  all-to-all) ``2h``, the expert MLP ``8·f_e`` (SwiGLU) or ``4·f_e``, the expert output
  before the combine ``2h`` (the unpermute's backward needs it with the weights), and the
  permutation maps of the dispatch and the combine ``2 x 4`` (int32 row ids);
* output side: the final-norm and LM-head inputs ``4h`` and ``logit_bytes`` per logit
  (``training.logit_bytes``, else 4: fp32 logits, as the Korthikanti estimate).

With forced balance every rank receives T·k rows; dropless routing lets a hot rank receive
more (the token-imbalance draws of a step), which this estimate does not reserve for.

Buffers: as the dense memory model, two gathered units of bf16 parameters for p = I / G and
two of bf16 gradients for g = I / G, dense and expert units apart (none for a level whose
scope is one rank: I with one EDP rank per PaRO group shards, gathers and buffers nothing).
Margin: the dense model's fraction of everything else (``training.korthikanti_margin``,
``MARGIN_FRACTION`` = 10 % when unset, as MoE commands run the paper fidelity's models; or
``FRAGMENTATION_FRACTION`` under the runtime memory model) plus the 1 GiB runtime reserve.
"""

from __future__ import annotations

import math
from dataclasses import replace

from ..cost.memory import (
    FRAGMENTATION_FRACTION,
    MemoryBreakdown,
    korthikanti_margin,
    margin_bytes,
)
from ..io.runtime import training_for_runtime
from ..spec.model import ModelSpec
from ..spec.moe import Attention, attention_score_dims
from ..spec.strategy import Strategy
from ..spec.system import ClusterSpec
from ..spec.training import (
    BYTES_PER_GRAD,
    BYTES_PER_PARAM,
    TrainingSpec,
)
from .experts import (
    ExpertLayout,
    dense_params_per_gpu,
    dense_states_bytes,
    expert_params_per_gpu,
    expert_states_bytes,
)
from .moe_step import unit_params


def dispatched_rows(model: ModelSpec, tokens: int) -> int:
    """Rows of one MoE layer's dispatch on a rank: T·k, or E·ceil(c·T·k/E) with a capacity
    factor c (padded)."""
    moe = model.moe
    if moe.capacity_factor is None:
        return tokens * moe.top_k
    return moe.experts * math.ceil(moe.capacity_factor * tokens * moe.top_k / moe.experts)


def moe_activation_terms(model: ModelSpec, training: TrainingSpec) -> dict:
    """Activation bytes of one micro-batch by part (module docstring): ``attention``,
    ``dense_mlp``, ``shared_experts``, ``router``, ``experts`` (summed over the layers),
    ``output``, and ``total``."""
    t = training_for_runtime(training, None)
    attention = t.attention or "flash"
    h, moe = model.hidden, model.moe
    T = training.micro_batch * training.seq_len
    a = model.attention or Attention()
    heads = model.heads
    kv = model.kv_heads or heads
    qk, v = attention_score_dims(model)
    if a.kind == "mla":
        w_q, w_k, w_v = qk, qk, v
        latent = (a.q_lora_rank or 0) + a.kv_lora_rank + a.qk_rope_dim
    else:
        w_q, w_k, w_v = qk, qk * kv // heads, v * kv // heads
        latent = 0
    per_tok = 4 * h + 2 * h + 2 * (w_q + w_k + w_v) + 2 * v + 2 * h + 2 * latent
    scores = 4 * heads if attention == "flash" else 2 * heads * training.seq_len
    mlp_k = 8 if model.mlp == "swiglu" else 4
    L, dl = model.layers, moe.dense_layers
    ml = L - dl
    rows = dispatched_rows(model, T)
    out = {
        "attention": float(L * T * (per_tok + scores)),
        "dense_mlp": float(dl * T * mlp_k * model.ffn_hidden),
        "shared_experts": float(ml * T * mlp_k * moe.shared_width * moe.shared_experts),
        "router": float(ml * T * (8 * moe.experts + 12 * moe.top_k)),
        "experts": float(ml * rows * (2 * h + mlp_k * moe.expert_ffn + 2 * h + 8)),
        "output": float(T * (4 * h + (t.logit_bytes or 4) * model.vocab)),
    }
    out["total"] = sum(out.values())
    return out


def moe_memory(model: ModelSpec, strategy: Strategy, expert_strategy: Strategy,
               cluster: ClusterSpec, training: TrainingSpec, lay: ExpertLayout
               ) -> MemoryBreakdown:
    """Bytes per GPU of a MoE step (module docstring)."""
    t = training_for_runtime(training, None)
    r = training.trainable_ratio
    ob = training.optim_state_bytes
    states = (dense_states_bytes(model, strategy, lay, r, ob)
              + expert_states_bytes(model, expert_strategy, lay, r, ob))
    acts = moe_activation_terms(model, training)["total"]
    up = unit_params(model)
    biggest = max(up["embed"], up["head"], up["dense_layer"], up["moe_layer"])
    e_unit = up["experts"] / lay.ep
    bufs = 0.0
    # a level whose scope is one rank (I with one rank per group) moves and buffers nothing
    for s, unit, k, m in ((strategy, biggest, lay.dense_dp, lay.m_dp),
                          (expert_strategy, e_unit, lay.edp, lay.m_edp)):
        if s.p.divisor(k, m) > 1:
            bufs += 2 * BYTES_PER_PARAM * unit
        if s.g.divisor(k, m) > 1:
            bufs += 2 * BYTES_PER_GRAD * unit * r
    frac = FRAGMENTATION_FRACTION if t.memory_model == "runtime" else korthikanti_margin(t)
    margin = margin_bytes(frac, states + acts + bufs)
    total = states + acts + bufs + margin
    cap = float(cluster.min_gpu_memory_bytes)
    pd, pe = dense_params_per_gpu(model, lay), expert_params_per_gpu(model, lay)
    dp_, dg, dos = strategy.divisors(lay.dense_dp, lay.m_dp)
    ep_, eg, eos = expert_strategy.divisors(lay.edp, lay.m_edp)
    return MemoryBreakdown(
        model_states_bytes=states, activations_bytes=acts, buffers_bytes=bufs,
        margin_bytes=margin, total_bytes=total, capacity_bytes=cap, fits=total <= cap,
        shortfall_bytes=max(0.0, total - cap),
        params_bytes=BYTES_PER_PARAM * (pd / dp_ + pe / ep_),
        grads_bytes=BYTES_PER_GRAD * r * (pd / dg + pe / eg),
        optimizer_bytes=ob * r * (pd / dos + pe / eos), recompute=False,
        memory_model=t.memory_model, attention=t.attention or "flash",
        logit_bytes=t.logit_bytes or 4)


def max_micro_batch_moe(model: ModelSpec, strategy: Strategy, expert_strategy: Strategy,
                        cluster: ClusterSpec, training: TrainingSpec, lay: ExpertLayout,
                        limit: int = 4096) -> int:
    """The largest micro-batch (1..limit) whose step fits; 0 if none (memory grows with b)."""
    def fits(b: int) -> bool:
        return moe_memory(model, strategy, expert_strategy, cluster,
                          replace(training, micro_batch=b), lay).fits

    if not fits(1):
        return 0
    lo, hi = 1, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo
