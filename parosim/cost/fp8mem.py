"""Memory of FP8 (Transformer Engine + Megatron-Core) training, and the dropout-mask setting.

Only ``precision = "fp8"`` and an explicit ``TrainingSpec.hidden_dropout`` change anything
here; every bf16 number with ``hidden_dropout = None`` stays as Korthikanti et al. 2022
count it (:mod:`parosim.cost.memory`, :func:`parosim.plan.threed.layer_activation_bytes_3d`).
Sources (public code read for this module; docs/memory.md, "FP8"):

* **Layer structure.** Megatron-Core's Transformer Engine layer spec,
  ``get_gpt_layer_with_transformer_engine_spec`` (NVIDIA/Megatron-LM
  ``megatron/core/models/gpt/gpt_layer_specs.py`` @efbfb5f05eaa44f7f493e0b11b0db2ee1e7dae0a):
  ``linear_qkv`` and ``linear_fc1`` are ``TELayerNormColumnParallelLinear`` (the norm fused
  into the GEMM module), ``linear_proj`` and ``linear_fc2`` are ``TERowParallelLinear``,
  ``core_attention`` is ``TEDotProductAttention``, the activation runs between fc1 and fc2
  in Megatron's own code, and ``get_bias_dropout_add`` follows the o-projection and fc2.
* **What a Transformer Engine GEMM module keeps for backward under FP8.** ``_Linear.forward``
  (NVIDIA/TransformerEngine ``transformer_engine/pytorch/module/linear.py``
  @0004dbd0231cb02d7b47d45344900a494fa13f46, same logic @3ec878759cc601d088dfa5c0a4772acf4317b190)
  casts its input to fp8 and saves ``saved_inputmat`` (the fp8 input) *or*
  ``saved_inputmat_t`` (its fp8 transpose), one of the two: **1 byte per input element**; with
  sequence parallelism the local shard (column-parallel modules gather it again in backward).
  ``_LayerNormLinear.forward`` (``module/layernorm_linear.py`` @0004dbd0…) saves
  ``inputmat`` (the norm input, activation dtype: **2 bytes**), ``mu``, ``rsigma`` (fp32 per
  token, ignored here as Korthikanti ignores them) and ``ln_out`` (allocated as
  ``torch.uint8`` "if fp8": the fp8 GEMM input, **1 byte**, the local shard under SP).
* **The rest stays bf16**: q, k, v and the attention output O kept by the fused / flash
  attention kernel (O is the o-projection's input; under bf16 the same tensor, under FP8 the
  o-projection keeps its own fp8 copy besides), the activation's input (the fc1 output:
  ``ffn`` values for GELU / squared-ReLU, ``2·ffn`` for SwiGLU), and the fp32 log-sum-exp.
  With selective (core-attention) recomputation the attention keeps q, k, v only, so O is
  then kept only as the o-projection's fp8 copy.
* **Dropout masks** (1 byte per element, Korthikanti et al. count two per layer) exist only
  when ``hidden_dropout`` > 0 (``TrainingSpec.hidden_dropout``; None: counted, as
  Korthikanti count them). NeMo-Framework-Launcher configs: GPT-3 ``hidden_dropout: 0.1``
  (``launcher_scripts/conf/training/gpt3/175b.yaml`` @056a90edf9140a32bfd39652509244e7db055651);
  Llama 2 ``hidden_dropout: 0.0`` (``llama/llama2_70b.yaml``
  @0446d2c0603733cb7252ff36999b32b76e7cf1c4); Nemotron ``hidden_dropout: 0.0``
  (``nemotron/nemotron_8b.yaml`` @089b90e6849fa1edb438d3ee750cf229f44e7955); Llama 3 in
  Megatron-Bridge ``hidden_dropout: float = 0.0`` (NVIDIA-NeMo/Megatron-Bridge
  ``src/megatron/bridge/models/llama/llama_provider.py``
  @2afd2d34f7d7b2e84095af1a7fd7244902189ebc). Attention dropout inside a flash / fused
  kernel regenerates its mask from the RNG state and keeps none; under eager attention it
  stays in Korthikanti's ``5·a·s/h`` term.
* **The fp8 weight cache.** With ``is_first_microbatch`` set (Megatron-Core's TE wrappers
  pass it: ``_is_first_microbatch = None if self.disable_parameter_transpose_cache else
  self.is_first_microbatch``, NVIDIA/Megatron-LM
  ``megatron/core/extensions/transformer_engine.py`` @d086a2e3b020ff78db9d29915f7cfe886e085f13)
  Transformer Engine keeps persistent ``weight1_fp8`` and ``weight1_t_fp8`` per GEMM
  (``Linear.get_fp8_weights_scratchpad``, ``linear.py`` @0004dbd0…): **2 bytes per weight**
  besides the bf16 weight. With fp8 primary weights (``primary_weights_in_fp8``: TE
  ``fp8_model_init``, Megatron ``--fp8-param-gather``; ``TrainingSpec.fp8_params``) the weight
  itself is fp8 (1 byte, no bf16 copy) and backward keeps its transpose in a cache
  (``weight.transpose(cache=ctx.is_first_microbatch is not None, ...)``): **1 + 1 bytes**.
  The weight is sharded as parameters are (``2Ψ/d_p`` becomes 1 byte per GEMM weight); the
  transpose cache is whole (Megatron FSDP: ``keep_fp8_transpose_cache = True``, as
  Megatron-Bridge's Llama 3 8B FSDP run sets it). Megatron-Bridge's FP8-CS recipe
  ``bf16_with_fp8_current_scaling_mixed`` sets ``fp8_param_gather = True``
  (NVIDIA-NeMo/Megatron-Bridge ``src/megatron/bridge/training/mixed_precision.py``
  @05097809102de3cbe888267e7d701868165153d8).
* **Gradients.** Megatron-Core's ``DistributedDataParallel`` allocates its contiguous grad
  buffer as ``grad_dtype = torch.float if self.ddp_config.grad_reduce_in_fp32 else
  param.dtype`` (bf16; fp8 parameters report their "fake" bf16 dtype; the param buffer of
  fp8 parameters is ``torch.uint8``), over all the rank's parameters, not sharded, with or
  without the distributed optimizer (NVIDIA/Megatron-LM
  ``megatron/core/distributed/distributed_data_parallel.py``
  @001199898c4badd01eaf0785c212d8ed7ce83042). The distributed optimizer shards only the fp32
  main parameters and the Adam moments (Megatron-LM README, "Distributed Optimizer": bytes per
  parameter ``4 + 16/d`` for 16-bit parameters and 16-bit gradients, the 16/d being fp32 main
  parameter, its fp32 main gradient and the two moments; the fp32 main gradient is made from
  the bf16 buffer at the optimizer step, when no activations are alive). So parosim's
  ``2Ψ + 2Ψ' + 12Ψ'/d`` for NNG (``BYTES_PER_GRAD`` = 2) is the buffer as Megatron keeps it
  with ``grad_reduce_in_fp32 = False`` (the NeMo FP8 recipes' ``grad_sync_dtype=bf16`` /
  ``grad_reduce_in_fp32 = False``), unchanged by this module.
"""

from __future__ import annotations

from ..spec.model import ModelSpec
from ..spec.training import TrainingSpec

FP8_BYTES = 1            # an fp8 (E4M3 / E5M2) element
BF16_BYTES = 2
MASK_BYTES = 1           # a torch.bool dropout mask element
# fp8 primary weights: the fp8 weight (1 byte, counted with the parameters) + its cached fp8
# transpose (1 byte, the cache)
FP8_PARAMS_CACHE_BYTES_PER_PARAM = 1


def dropout_masks(training: TrainingSpec) -> int:
    """Dropout masks kept per layer: 2 (after the o-projection and after the MLP) unless
    ``hidden_dropout`` is 0; None counts them, as Korthikanti et al. 2022 do."""
    return 0 if training.hidden_dropout == 0 else 2


def itemised_layer_activation_bytes(model: ModelSpec, training: TrainingSpec, tp: int = 1,
                                    sp: bool = False, selective: bool = False,
                                    gemm_input_bytes: int = FP8_BYTES) -> float:
    """Bytes one decoder layer keeps for backward, per tensor (module docstring), for one
    micro-batch on one of ``tp`` tensor-parallel ranks (``sp``: sequence parallelism, the
    residual-stream tensors split by t too; ``selective``: core-attention recomputation).

    ``gemm_input_bytes`` 1 (FP8: Transformer Engine keeps each GEMM input in fp8) or 2 (bf16:
    then, for a GPT layer, this is exactly Korthikanti et al.'s ``34·s·b·h``).

    Per token, full (unsplit) widths: residual stream (split only with SP) ``2·2h`` norm
    inputs + ``g·h`` qkv input + ``g·h`` fc1 input + ``masks·h``; split by t: q, k, v
    ``2(h + 2·kv_dim)``, attention output O ``2h`` (flash without selective recompute, or bf16
    where it is the o-projection's input), the o-projection's fp8 input ``h`` (FP8 only), the
    activation input ``2·ffn`` (``4·ffn`` SwiGLU), fc2 input ``g·ffn``; plus the fp32
    log-sum-exp ``4·a`` (flash) or Korthikanti's ``5·a·s`` scores (eager), none under selective
    recomputation.

    >>> from parosim.spec.model import ModelSpec
    >>> gpt = ModelSpec("g", layers=2, hidden=1024, ffn_hidden=4096, heads=8, vocab=1000,
    ...                 mlp="gelu", norm="layernorm", bias=True)
    >>> tr = TrainingSpec(micro_batch=1, seq_len=128, attention="flash")
    >>> bf16 = itemised_layer_activation_bytes(gpt, tr, gemm_input_bytes=2)
    >>> bf16 == 128 * 1024 * 34 + 4 * 8 * 128
    True
    >>> itemised_layer_activation_bytes(gpt, tr) == 128 * 1024 * 29 + 4 * 8 * 128
    True
    """
    model.require_shape("activation memory")
    g = gemm_input_bytes
    s, b, h, a = training.seq_len, training.micro_batch, model.hidden, model.heads
    ffn = model.ffn_hidden
    flash = training.attention == "flash"
    residual = 2 * BF16_BYTES * h + 2 * g * h + MASK_BYTES * dropout_masks(training) * h
    o_kept = BF16_BYTES * h if (g == BF16_BYTES or (flash and not selective)) else 0
    proj_in = g * h if g != BF16_BYTES else 0      # bf16: it is O itself
    act_in = BF16_BYTES * ffn * (2 if model.mlp == "swiglu" else 1)
    split = BF16_BYTES * (h + 2 * model.kv_dim) + o_kept + proj_in + act_in + g * ffn
    per = s * b * (residual / (tp if sp else 1) + split / tp)
    if not selective:
        per += 4 * b * a * s / tp if flash else s * b * 5 * a * s / tp
    return per


def fp8_layer_activation_bytes(model: ModelSpec, training: TrainingSpec, tp: int = 1,
                               sp: bool = False, selective: bool = False) -> float:
    """:func:`itemised_layer_activation_bytes` with fp8 GEMM inputs (``precision = "fp8"``)."""
    return itemised_layer_activation_bytes(model, training, tp, sp, selective, FP8_BYTES)


def korthikanti_mask_bytes(model: ModelSpec, training: TrainingSpec, tp: int = 1,
                           sp: bool = False) -> float:
    """The two dropout masks Korthikanti et al.'s bf16 count holds per layer (``s·b·h`` each,
    replicated over TP without SP) when ``hidden_dropout`` = 0 says they are not there; 0.0
    otherwise (None or > 0: counted as published)."""
    if dropout_masks(training):
        return 0.0
    sbh = training.seq_len * training.micro_batch * model.hidden
    return 2 * MASK_BYTES * sbh / (tp if sp else 1)


def output_activation_bytes(model: ModelSpec, micro_batch: int, seq_len: int,
                            logit_bytes: int = 4) -> float:
    """Final norm + LM-head inputs and fp32 logits: 4·s·b·h + 4·s·b·vocab (Korthikanti 4.3)."""
    model.require_shape("activation memory")
    sb = seq_len * micro_batch
    return 4 * sb * model.hidden + logit_bytes * sb * model.vocab


def fp8_activation_bytes(model: ModelSpec, training: TrainingSpec, recompute: bool) -> float:
    """Korthikanti-model activations of a whole model on one GPU (no TP/PP) under
    ``precision = "fp8"``: :func:`fp8_layer_activation_bytes` per layer (with full
    recomputation each layer's bf16 input ``2·s·b·h`` plus one layer's working set), and the
    output side as for bf16 (final-norm and LM-head inputs ``4·s·b·h``: the LM head is
    Megatron's bf16 ``ColumnParallelLinear``, not a TE module; ``logit_bytes`` per logit)."""
    per_layer = fp8_layer_activation_bytes(model, training)
    out = output_activation_bytes(model, training.micro_batch, training.seq_len,
                                  training.logit_bytes or 4)
    kept = (BF16_BYTES * training.seq_len * training.micro_batch * model.hidden if recompute
            else per_layer)
    return model.layers * kept + (per_layer if recompute else 0.0) + out
