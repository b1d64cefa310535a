"""The parts of a TP x PP x CP step that the 3D planner puts together: TP collectives per
layer, TP communication-overlap pairs, unit compute, context-parallel ring pairs, optimizer
time, recomputation FLOPs, and Megatron-Core's DP buckets (docs/tensor-pipeline.md,
docs/comm-overlap.md, docs/context-parallelism.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..collectives.types import Op
from ..cost.compute import (
    ADAM_BYTES_PER_PARAM,
    compute_model,
    compute_seconds,
    flat_layer_seconds,
    fp8_peak_flops,
    fp8_weight_cast_seconds,
    head_backward_flops,
    head_forward_flops,
    layer_attention_flops_per_token,
    layer_backward_flops,
    layer_forward_flops,
)
from ..cost.kernels import embed_times, gemm_seconds, head_times, layer_gemm_shapes, layer_times
from ..errors import InputError
from ..spec.model import ModelSpec
from ..spec.strategy import Level, Strategy
from ..spec.system import ClusterSpec
from ..spec.training import (
    BYTES_PER_ACTIVATION,
    TrainingSpec,
)
from .builder import (
    chunk_units,
)
from .layout import (
    ParallelSpec,
)
from .memory3d import (
    UB_PIPELINE_SPLITS,
    cp_kv_bytes,
    is_fp8,
)


def tp_collectives(kind: str, phase: str, sp: bool) -> list[tuple[Op, int]]:
    """TP collectives of one unit in one pass: [(op, count)] (module docstring).

    >>> tp_collectives("layer", "fwd", False), tp_collectives("layer", "bwd", True)
    ([(<Op.ALL_REDUCE: 'all-reduce'>, 2)], [(<Op.ALL_GATHER: 'all-gather'>, 2), \
(<Op.REDUCE_SCATTER: 'reduce-scatter'>, 2)])
    """
    n = {("layer", "fwd"): 2, ("layer", "bwd"): 2, ("layer", "recompute"): 2,
         ("embed", "fwd"): 1, ("head", "bwd"): 1}.get((kind, phase), 0)
    if sp:
        if kind == "embed":
            return [(Op.REDUCE_SCATTER, 1)] if phase == "fwd" else []
        if kind == "head":
            return ([(Op.ALL_GATHER, 1)] if phase == "fwd" else
                    [(Op.REDUCE_SCATTER, 1)] if phase == "bwd" else [])
        return [(Op.ALL_GATHER, n), (Op.REDUCE_SCATTER, n)] if n else []
    return [(Op.ALL_REDUCE, n)] if n else []


def tp_buffer_bytes(model: ModelSpec, training: TrainingSpec) -> float:
    """Full buffer of one TP collective: the layer activation, 2·s·b·h bytes (bf16)."""
    return BYTES_PER_ACTIVATION * training.seq_len * training.micro_batch * model.hidden


@dataclass(frozen=True)
class TPOverlapPair:
    """One TP collective that Megatron-Core overlaps with one GEMM (one layer, one
    micro-batch, one rank). ``chunks``: the comm's split (its first / last chunk stays
    exposed); 0 for TE's bulk overlap (no split, nothing exposed beyond the excess)."""

    name: str            # TE's userbuffers name (qkv_fprop, proj_fprop, ..., qkv_wgrad)
    op: Op
    gemm_s: float
    gemm_flops: float
    chunks: int
    size_scale: float = 1.0   # x the 2·s·b·h buffer: 0.5 for an fp8 all-gather (FP8 runs)


def layer_gemms(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                par: ParallelSpec) -> list[tuple[float, float, float, float]]:
    """(forward s, data-gradient s, weight-gradient s, forward FLOPs) of the qkv, proj,
    MLP-up and MLP-down GEMMs of one layer on one rank for one micro-batch: the kernel
    model's :func:`parosim.cost.kernels.gemm_seconds` on the shapes of
    :func:`parosim.cost.kernels.layer_times` (column-parallel N/t, row-parallel K/t), or, flat,
    the GEMM's FLOPs / t at the efficiency (weight gradient: x the trainable ratio). FP8
    training: at the FP8 peak (kernel model: fp8 operands), as the layer's own times."""

    t, r = par.tp, training.trainable_ratio
    tokens = training.micro_batch * training.seq_len
    kernel = compute_model(cluster, training) == "kernel"
    gpu, prof = cluster.gpu, cluster.compute
    peak8 = 0.0
    if is_fp8(training):
        # the FP8 model (refuses a GPU without FP8)
        from ..cost.compute import fp8_peak_flops

        peak8 = fp8_peak_flops(cluster, training)

    def g(m, n, k):
        if peak8:
            return gemm_seconds(m, n, k, peak8 * prof.fp8_gemm_efficiency,
                                gpu.hbm_bandwidth_Bps, prof, 1,
                                prof.sms(gpu.model), None, 1)
        return gemm_seconds(m, n, k, gpu.peak_flops, gpu.hbm_bandwidth_Bps, prof, 1,
                            prof.sms(gpu.model))

    def flat(f):
        if peak8:
            return f / (peak8 * training.compute_efficiency)
        return compute_seconds(f, cluster, training)

    out = []
    for i, (n_out, k_in) in enumerate(layer_gemm_shapes(model)):
        flops = 2.0 * tokens * n_out * k_in / t
        if kernel:
            if t > 1:
                n_out, k_in = (n_out / t, k_in) if i % 2 == 0 else (n_out, k_in / t)
            out.append((g(tokens, n_out, k_in), g(tokens, k_in, n_out),
                        r * g(n_out, k_in, tokens), flops))
        else:
            fs = flat(flops)
            out.append((fs, fs, flat(r * flops), flops))
    return out


def tp_overlap_pairs(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                     par: ParallelSpec, phase: str) -> list[TPOverlapPair]:
    """The TP collectives of one layer pass (``fwd``, ``bwd``; ``recompute`` = ``fwd``) that
    Megatron-Core overlaps with ``tp_comm_overlap``, each with its GEMM (docs/parallelism.md,
    "TP communication overlap"). Forward: the all-gather before the qkv and MLP-up GEMMs
    (ring-exchange, t chunks), the reduce-scatter after the proj and MLP-down GEMMs
    (pipeline, 4 chunks). Backward: the all-gather of the output gradient before the MLP-down
    and proj data-gradient GEMMs (ring-exchange), the reduce-scatter of the MLP-up and qkv
    input gradients beside their weight-gradient GEMMs (bulk). They replace exactly the
    layer's 2 + 2 sequence-parallel collectives of :func:`tp_collectives`."""
    (qf, qd, qw, qfl), (pf, pd, _, pfl), (uf, _, uw, ufl), (df, dd, _, dfl) = \
        layer_gemms(model, cluster, training, par)
    t, r = par.tp, training.trainable_ratio
    ag, rs, pipe = Op.ALL_GATHER, Op.REDUCE_SCATTER, UB_PIPELINE_SPLITS
    a8 = 0.5 if is_fp8(training) else 1.0   # TE's ring-exchange all-gathers carry fp8
    if phase in ("fwd", "recompute"):
        return [TPOverlapPair("qkv_fprop", ag, qf, qfl, t, a8),
                TPOverlapPair("proj_fprop", rs, pf, pfl, pipe),
                TPOverlapPair("fc1_fprop", ag, uf, ufl, t, a8),
                TPOverlapPair("fc2_fprop", rs, df, dfl, pipe)]
    return [TPOverlapPair("fc2_dgrad", ag, dd, dfl, t, a8),
            TPOverlapPair("fc1_wgrad", rs, uw, r * ufl, 0),
            TPOverlapPair("proj_dgrad", ag, pd, pfl, t, a8),
            TPOverlapPair("qkv_wgrad", rs, qw, r * qfl, 0)]


def unit_flops(model: ModelSpec, training: TrainingSpec, kind: str, phase: str) -> float:
    """FLOPs of one whole unit (before the TP split) for one micro-batch."""
    if kind == "layer":
        return (layer_backward_flops(model, training) if phase == "bwd"
                else layer_forward_flops(model, training))
    if kind == "head":
        return (head_backward_flops(model, training) if phase == "bwd"
                else head_forward_flops(model, training))
    return 0.0


def unit_seconds(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                 par: ParallelSpec, full: bool) -> dict[tuple[str, str], float] | None:
    """Kernel compute model: seconds of one unit on one rank for one micro-batch, keys
    ``(kind, phase)`` (kind embed / layer / head; phase fwd / bwd, and ``("layer",
    "recompute")``), the layer split by ``par.tp`` as :func:`parosim.cost.kernels.layer_times`
    (column/row-parallel GEMMs, heads / t, memory-bound kernels on the local shard, or on
    tokens / t with sequence parallelism). Recomputation: full = the layer's forward;
    selective = its attention forward (Korthikanti et al. 2022 §5). ``None`` under the flat
    model (FLOPs / t at ``--efficiency``, as before), except with ``precision = "fp8"``:
    then the flat model's seconds with the weight-GEMM FLOPs at the FP8 peak
    (:func:`parosim.cost.compute.flat_layer_seconds`). Under fp8 the kernel model runs the layer's
    weight GEMMs at the FP8 peak, with the casts (:func:`parosim.cost.kernels.layer_times`)."""

    peak8 = fp8_peak_flops(cluster, training)     # 0.0 for bf16; refuses fp8 without FP8
    if compute_model(cluster, training) != "kernel":
        if not peak8:
            return None
        t = par.tp
        ls = flat_layer_seconds(model, cluster, training, t)
        rc = (ls["fwd"] if full else ls["attention_fwd"] if par.selective_recompute else 0.0)
        return {("layer", "fwd"): ls["fwd"], ("layer", "bwd"): ls["bwd"],
                ("attn", "fwd"): ls["attention_fwd"], ("attn", "bwd"): 2 * ls["attention_fwd"],
                ("head", "fwd"): compute_seconds(head_forward_flops(model, training) / t,
                                                 cluster, training),
                ("head", "bwd"): compute_seconds(head_backward_flops(model, training) / t,
                                                 cluster, training),
                ("embed", "fwd"): 0.0, ("embed", "bwd"): 0.0, ("layer", "recompute"): rc}
    t, sp = par.tp, par.sequence_parallel
    if model.heads % t:
        raise InputError(f"--tp {t} does not divide the {model.heads} attention heads of "
                         f"model {model.name!r}; expected a TP degree that divides the heads "
                         "(the kernel compute model splits heads across TP ranks)")
    gpu, p = cluster.gpu, cluster.compute
    sms = p.sms(gpu.model)
    b, s, r = training.micro_batch, training.seq_len, training.trainable_ratio
    lt = layer_times(model, b, s, r, training.with_defaults().attention, gpu.peak_flops,
                     gpu.hbm_bandwidth_Bps, p, sms, t, sp, peak8)
    hf, hb = head_times(model, b, s, r, gpu.peak_flops, gpu.hbm_bandwidth_Bps, p, sms, t, sp)
    ef, eb = embed_times(model, b, s, r, gpu.hbm_bandwidth_Bps, p, t)
    rc = (lt.forward_s if full else lt.attention_fwd_s if par.selective_recompute else 0.0)
    return {("layer", "fwd"): lt.forward_s, ("layer", "bwd"): lt.backward_s,
            ("head", "fwd"): hf, ("head", "bwd"): hb, ("embed", "fwd"): ef,
            ("embed", "bwd"): eb, ("layer", "recompute"): rc,
            ("attn", "fwd"): lt.attention_fwd_s, ("attn", "bwd"): lt.attention_bwd_s}


def cp_attention_step(model: ModelSpec, cluster: ClusterSpec, local: TrainingSpec,
                      par: ParallelSpec, ks) -> tuple[float, float, float, float]:
    """(forward s, backward s, forward FLOPs, backward FLOPs) of one CP attention step on one
    rank: the attention core of s/cp local tokens (the layer model's attention of the
    local training; ``ks``: :func:`unit_seconds`, None for the flat model)."""

    ff = local.tokens_per_micro_step * layer_attention_flops_per_token(
        model, local.seq_len) / par.tp
    if ks is None:
        return (compute_seconds(ff, cluster, local), compute_seconds(2 * ff, cluster, local),
                ff, 2 * ff)
    return ks[("attn", "fwd")], ks[("attn", "bwd")], ff, 2 * ff


def cp_pairs(model: ModelSpec, cluster: ClusterSpec, local: TrainingSpec, par: ParallelSpec,
             ks, phase: str) -> list[tuple[float, float, float, int]]:
    """The ring steps of one layer pass as (compute s, compute FLOPs, message bytes, count):
    each step's message overlaps that step's attention compute.

    Forward (and a recomputed forward): steps 0..cp-2 each send the held K/V (B bytes) beside
    that step's attention; the last step's attention is alone (it is the layer's own
    attention, kept in the layer op), so the extra work is (cp-1) steps. Backward (TE sends a
    [kv, dkv] buffer): step 0 sends K/V (B), steps 1..cp-2 K/V and the accumulated dK/dV (2B),
    step cp-1 dK/dV (B), each beside one attention-backward step; the layer op keeps none of
    its attention backward (:func:`parosim.plan.threed.build_plan_3d` splits it off)."""
    cp = par.cp
    if cp == 1:
        return []
    af, ab, ff, fb = cp_attention_step(model, cluster, local, par, ks)
    kvb = cp_kv_bytes(model, local, par)
    if phase in ("fwd", "recompute"):
        return [(af, ff, kvb, cp - 1)]
    out = [(ab, fb, kvb, 2)]
    if cp > 2:
        out.append((ab, fb, 2 * kvb, cp - 2))
    return out


def optimizer_seconds_3d(trainable_params: float, d_os: int, cluster: ClusterSpec,
                         training: TrainingSpec, fp8_params: float = 0.0) -> float:
    """Adam on the local shard: 28 bytes per parameter at HBM bandwidth (x the kernel
    model's ``hbm_efficiency``, as :func:`parosim.cost.compute.optimizer_step_seconds`).
    ``fp8_params``: the stage's fp8-GEMM weights on this rank (:func:`stage_fp8_params`),
    re-cast once per step under ``precision = "fp8"``
    (:func:`parosim.cost.compute.fp8_weight_cast_seconds`)."""

    bw = cluster.gpu.hbm_bandwidth_Bps
    if compute_model(cluster, training) == "kernel":
        bw *= cluster.compute.hbm_efficiency
    adam = ADAM_BYTES_PER_PARAM * trainable_params / d_os / bw
    if training.precision != "fp8":
        return adam
    return adam + fp8_weight_cast_seconds(fp8_params, training.trainable_ratio, cluster,
                                          training)


def recompute_flops(model: ModelSpec, training: TrainingSpec, full: bool,
                    selective: bool) -> float:
    """FLOPs recomputed before one layer's backward (whole layer, before the TP split)."""
    if full:
        return layer_forward_flops(model, training)
    if selective:
        return (training.tokens_per_micro_step
                * layer_attention_flops_per_token(model, training.seq_len))
    return 0.0


# Megatron-Core's default DDP bucket: max(40e6, 1e6 x dp) parameters
# (``DistributedDataParallelConfig.bucket_size``,
# megatron/core/distributed/distributed_data_parallel_config.py, Megatron-LM commit
# 001199898c4badd01eaf0785c212d8ed7ce83042); model chunks after a stage's first one hold one
# bucket (``disable_bucketing=(model_chunk_idx > 0)`` in megatron/training/training.py).
DP_BUCKET_PARAMS = 40_000_000


DP_BUCKET_PARAMS_PER_RANK = 1_000_000


def dp_bucket_params(dp: int) -> int:
    """Megatron-Core's default bucket size (parameters per rank) for a DP group of ``dp``.

    >>> dp_bucket_params(8), dp_bucket_params(64)
    (40000000, 64000000)
    """
    return max(DP_BUCKET_PARAMS, DP_BUCKET_PARAMS_PER_RANK * dp)


def dp_buckets(model: ModelSpec, par: ParallelSpec, dp: int) -> list[list[list[int]]]:
    """Per virtual stage, its DDP buckets in the order their gradients become final (the
    backward order): lists of unit indices of :func:`chunk_units`, each in backward order.
    Megatron fills a bucket with parameters in reverse order and closes it once it holds at
    least :func:`dp_bucket_params` (here whole units: a layer is never split); chunks after a
    stage's first hold one bucket.

    >>> from parosim.spec.model import preset
    >>> b = dp_buckets(preset("llama-7b"), ParallelSpec(tp=8, pp=2), 8)
    >>> [len(x) for x in b], b[0][0], b[1][-1]     # 25.3M parameters per layer per rank
    ([9, 9], [16, 15], [0])
    """
    out = []
    size = dp_bucket_params(dp)
    for vs, us in enumerate(chunk_units(model, par)):
        idx = list(range(len(us) - 1, -1, -1))
        if vs >= par.pp:            # not the stage's first model chunk: one bucket
            out.append([idx])
            continue
        buckets, cur, acc = [], [], 0.0
        for i in idx:
            cur.append(i)
            acc += us[i].params / par.tp
            if acc >= size:
                buckets.append(cur)
                cur, acc = [], 0.0
        if cur:
            buckets.append(cur)
        out.append(buckets)
    return out


def check_dp_overlap(strategy: Strategy, par: ParallelSpec) -> None:
    """Refuse ``dp_comm_overlap`` where Megatron-Core's DDP buckets do not apply."""
    if par.dp_comm_overlap and (strategy.p is not Level.N or strategy.g is not Level.N):
        raise InputError(f"--dp-comm-overlap models Megatron-Core's DDP buckets (PaRO NNN, "
                         f"NNI, NNG: parameters and gradients whole during the micro-steps); "
                         f"strategy {strategy.short} gathers or reduces them per micro-step; "
                         "expected one of NNN, NNI, NNG")
