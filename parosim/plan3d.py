"""3D parallelism (TP x PP x DP with PaRO on the DP group): the Plan, memory, analytic, step.

The layout (ranks, groups, their lowering) is :mod:`parosim.parallel`; this module builds one
global step of one job as a :class:`Plan3D` (a :class:`parosim.plan.Plan` whose ops carry
their group set), replayed by the same engine (:func:`parosim.replay.replay`), and costs it in
closed form. Formulas and sources: ``docs/parallelism.md``.

Per pipeline stage k (streams ``compute/s{k}``, ``comm-param/s{k}``, ``comm-grad/s{k}``,
``p2p-fwd/s{k}``, ``p2p-bwd/s{k}``):

* **Units.** The L layers are cut into p·v chunks of L/(p·v) layers (v = 1 for 1F1B); chunk
  c of stage k is virtual stage c·p + k. The token embedding sits on virtual stage 0 (stage 0),
  the final norm + LM head on the last (stage p-1) (Megatron-LM's placement). Every unit's
  weights are split by t (Megatron column/row split; the vocabulary-parallel embedding and
  head split the vocabulary); norm weights, replicated in Megatron, are counted split too
  (< 0.01 % of the parameters). A tied embedding with p > 1 is held twice, on the first and
  the last stage (Megatron's copy; the all-reduce of its gradient between the two stages,
  once per step, is not modelled).
* **Compute** per unit and micro-batch: the FLOPs of :mod:`parosim.compute` divided by t, at
  the same efficiency (flat model), or the kernels of :mod:`parosim.kernels` on the rank's
  shard (``--compute-model kernel``: :func:`unit_seconds`). Full recomputation adds one
  layer forward before each backward;
  selective recomputation (attention core only, Korthikanti et al. 2022 §5) adds the
  attention's QKᵀ/AV FLOPs (:func:`recompute_flops`; kernel model: the attention forward's
  kernels).
* **TP collectives** (full buffer 2·s·b·h bytes, bf16), on the compute stream (blocking, as in
  Megatron): per layer 2 all-reduces in forward and 2 in backward (f and g of Shoeybi et al.
  2019), again 2 in the recomputed forward; the embedding's forward output 1 all-reduce; the
  LM head's backward input gradient 1 all-reduce. With sequence parallelism each all-reduce
  becomes an all-gather + a reduce-scatter of the same buffer (Korthikanti §4.2.2).
* **Pipeline**: 1F1B (warm-up p-k-1 forwards on stage k, then one forward / one backward,
  then the cool-down) or Megatron's interleaved schedule (warm-up 2(p-k-1) + (v-1)p chunk
  forwards; needs m divisible by p). After a chunk's forward its output activation
  (2·s·b·h/t bytes per rank: Megatron's scatter/gather optimisation, or the
  sequence-parallel shard) goes point-to-point to the next stage on ``p2p-fwd/s{k}``; without
  sequence parallelism the receiving TP group all-gathers it (2·s·b·h). Gradients go back the
  same way on ``p2p-bwd/s{k}``. Those transfers are flows on the cluster graph: they contend.
* **DP with PaRO**: exactly :mod:`parosim.plan`'s rules applied to the stage's units and its
  DP groups (n -> d, m -> m_dp, sizes /t): parameter all-gathers before each use for p = I/G
  (prefetched one unit ahead), gradient reduce-scatters after each backward for g = I/G, and
  at the boundary the gradient sync, the optimizer step and the parameter sync, per stage.
  With ``dp_comm_overlap`` (Megatron-Core's DDP buckets, NNN / NNI / NNG) those syncs run per
  bucket beside the last micro-batch's backward and the first one's forward instead
  (:func:`dp_buckets`, docs/parallelism.md "DP communication overlap").

With p = N and g = N a chunk's forward (backward) is one compute op and one TP op per
collective kind with a ``count`` (the engine moves count x the bytes and pays count x the
latency): the same time as the per-layer ops when nothing else shares the links, and far fewer
ops. Otherwise ops are per unit, as in :mod:`parosim.plan`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from .collectives.types import Algo, Op, Scope
from .compute import (
    ADAM_BYTES_PER_PARAM,
    head_backward_flops,
    head_forward_flops,
    layer_backward_flops,
    layer_forward_flops,
    step_flops,
)
from .errors import InputError
from .memory3d import (  # noqa: F401  (re-exported: the 3D memory model and its helpers)
    UB_BUFFERS,
    UB_FP8_BUFFERS,
    UB_PIPELINE_SPLITS,
    StageMemory,
    _fp8,
    check_cp,
    cp_kv_bytes,
    cp_local,
    in_flight,
    layer_activation_bytes_3d,
    max_micro_batch_3d,
    memory_3d,
    resolve_recompute_3d,
    stage_fp8_params,
    stage_memory_3d,
    stage_params,
    userbuffer_bytes,
)
from .models import ModelSpec
from .parallel import (
    Layout,
    PairSet,
    ParallelSpec,
    layout_for,
    lower_group,
    lower_p2p,
)
from .planning import (
    LEVEL_SCOPE,
    SYNC_GRAD,
    SYNC_PARAM,
    Builder,
    ComputeOp,
    GroupOp,
    Plan,
    boundary,
    chunk_units,
    resolve_recompute,
)
from .specs import ClusterSpec
from .strategies import Level, Strategy, parse_strategy
from .training import (
    BYTES_PER_ACTIVATION,
    BYTES_PER_GRAD,
    BYTES_PER_PARAM,
    TrainingSpec,
)

# -- ops and plan ------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan3D(Plan):
    """A Plan of a TP x PP x DP job. ``group_size`` is m_dp (DP ranks per PaRO group);
    ``accum_steps`` is m, the micro-batches per step per DP replica."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    schedule: str = "1f1b"
    virtual: int = 1
    sequence_parallel: bool = False
    selective_recompute: bool = False
    tp_comm_overlap: bool = False
    cp: int = 1          # context parallelism (``dp`` then counts DP x CP ranks)
    hardware_flops_per_gpu: float = 0.0
    stage_params: tuple[float, ...] = field(default=())
    # DP communication overlap (:func:`_dp_chains`): per stage, the bucket chain of the last
    # backward; per virtual stage, the buckets of the first forward (op ids of the busy time,
    # op ids of the bucket's collectives)
    dp_grad_chains: tuple = field(default=())
    dp_param_chains: tuple = field(default=())

    @property
    def groups(self) -> int:
        return self.dp // self.group_size

    def layout(self, spec: ClusterSpec) -> Layout:
        """The :class:`~parosim.parallel.Layout` of this plan on ``spec``."""
        return layout_for(spec, self.tp, self.pp)

    def overlap_gates(self) -> tuple[tuple[int, ...], ...]:
        """Per op, the pipeline stages whose GPUs run it: the engine's overlap-interference
        gates (:func:`parosim.replay.replay`). A compute op on ``compute/s{k}`` runs on
        every GPU of stage k; a collective involves the stages of its participating ranks
        (a TP or DP collective: its own stage; a point-to-point transfer: both ends). Ranks
        are ``tp + t·(dp + d·stage)`` (:class:`parosim.parallel.Layout`), so a rank's stage
        is ``rank // (t·d)``. Compute slows only while a collective of its own stage is in
        flight: collectives of other stages run on other GPUs."""
        per = self.tp * self.dp
        out = []
        for op in self.ops:
            if isinstance(op, GroupOp):
                sc = op.scopes
                rings = sc.rings if isinstance(sc, PairSet) else sc.glob.rings
                out.append(tuple(sorted({r // per for ring in rings for r in ring})))
            else:
                out.append((int(op.stream.rsplit("/s", 1)[1]),))
        return tuple(out)


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
    model's :func:`parosim.kernels.gemm_seconds` on the shapes of
    :func:`parosim.kernels.layer_times` (column-parallel N/t, row-parallel K/t), or, flat,
    the GEMM's FLOPs / t at the efficiency (weight gradient: x the trainable ratio). FP8
    training: at the FP8 peak (kernel model: fp8 operands), as the layer's own times."""
    from .compute import compute_model, compute_seconds
    from .kernels import gemm_seconds, layer_gemm_shapes

    t, r = par.tp, training.trainable_ratio
    tokens = training.micro_batch * training.seq_len
    kernel = compute_model(cluster, training) == "kernel"
    gpu, prof = cluster.gpu, cluster.compute
    peak8 = 0.0
    if _fp8(training):
        # the FP8 model (refuses a GPU without FP8)
        from .compute import fp8_peak_flops

        peak8 = fp8_peak_flops(cluster, training)

    def g(m, n, k):
        if peak8:
            return gemm_seconds(m, n, k, peak8, gpu.hbm_bandwidth_Bps, prof, 1,
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
    a8 = 0.5 if _fp8(training) else 1.0   # TE's ring-exchange all-gathers carry fp8
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
    "recompute")``), the layer split by ``par.tp`` as :func:`parosim.kernels.layer_times`
    (column/row-parallel GEMMs, heads / t, memory-bound kernels on the local shard, or on
    tokens / t with sequence parallelism). Recomputation: full = the layer's forward;
    selective = its attention forward (Korthikanti et al. 2022 §5). ``None`` under the flat
    model (FLOPs / t at ``--efficiency``, as before), except with ``precision = "fp8"``:
    then the flat model's seconds with the weight-GEMM FLOPs at the FP8 peak
    (:func:`parosim.compute.flat_layer_seconds`). Under fp8 the kernel model runs the layer's
    weight GEMMs at the FP8 peak, with the casts (:func:`parosim.kernels.layer_times`)."""
    from .compute import (
        compute_model,
        compute_seconds,
        flat_layer_seconds,
        fp8_peak_flops,
    )
    from .kernels import embed_times, head_times, layer_times

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


# -- context parallelism -----------------------------------------------------------------
# Megatron-Core ``context_parallel_size`` with Transformer Engine's "p2p" CP
# (NVIDIA/Megatron-LM docs/source/api-guide/context_parallel.rst, commit
# 1df56dcbb858728d89292f0dae5ef4d035a95e97; NVIDIA/TransformerEngine
# transformer_engine/pytorch/attention.py, AttnFuncWithCP / FlashAttnUnpaddedFuncWithCP,
# commit 6792ecaa4131544b100ac4a552df3a85c560f085): the sequence is cut into 2·cp chunks,
# rank i holds chunks i and 2cp-1-i, so every rank runs s/cp tokens through every
# non-attention op; attention runs cp steps, each of local queries against one rank's K/V
# (causal, load balanced: every step the same work as causal attention on s/cp tokens), the
# K/V going round the CP ring. Docs: docs/parallelism.md, "Context parallelism".


def cp_attention_step(model: ModelSpec, cluster: ClusterSpec, local: TrainingSpec,
                      par: ParallelSpec, ks) -> tuple[float, float, float, float]:
    """(forward s, backward s, forward FLOPs, backward FLOPs) of one CP attention step on one
    rank: the attention core of s/cp local tokens (the layer model's attention of the
    local training; ``ks``: :func:`unit_seconds`, None for the flat model)."""
    from .compute import compute_seconds, layer_attention_flops_per_token

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
    its attention backward (:func:`build_plan_3d` splits it off)."""
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
    model's ``hbm_efficiency``, as :func:`parosim.compute.optimizer_step_seconds`).
    ``fp8_params``: the stage's fp8-GEMM weights on this rank (:func:`stage_fp8_params`),
    re-cast once per step under ``precision = "fp8"``
    (:func:`parosim.compute.fp8_weight_cast_seconds`)."""
    from .compute import compute_model, fp8_weight_cast_seconds

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
    from .compute import layer_attention_flops_per_token

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

    >>> from parosim.models import preset
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


def grad_chain_exposed(chain, f: float = 1.0) -> float:
    """Time the bucketed gradient reduction adds after the last backward.

    ``chain``: [(w_i, r_i)]: w_i seconds of busy time (the bucket's backward), then its
    reduction r_i on the gradient stream, which starts when w_i ends and r_{i-1} has ended.
    The busy time runs at 1/f while a reduction is in flight (the engine's overlap gate).
    Returns (end of the last reduction or busy time) - Σ w_i.

    >>> grad_chain_exposed([(1.0, 0.5), (1.0, 0.5)])    # hidden but the last bucket
    0.5
    >>> grad_chain_exposed([(1.0, 3.0), (1.0, 0.5)])    # ends at 1 + 3 + 0.5, busy 2
    2.5
    """
    t, end = _grad_chain(chain, f)
    return end - sum(w for w, _ in chain)


def grad_chain_slowed(chain, f: float = 1.0) -> float:
    """How much later the chain's busy time ends than Σ w_i (its slowdown beside the
    reductions; 0 with f = 1): on a later stage it delays the last backwards of the
    stages before it (:func:`evaluate_3d`).

    >>> grad_chain_slowed([(1.0, 0.5), (1.0, 0.5)], 2.0)   # w_2 half beside r_1
    0.25
    """
    if f == 1.0:
        return 0.0
    return _grad_chain(chain, f)[0] - sum(w for w, _ in chain)


def _grad_chain(chain, f: float) -> tuple[float, float]:
    """(end of the busy time, end of the last reduction or busy time) of a chain."""
    t = 0.0          # now
    comm_end = 0.0   # end of the last reduction issued
    for w, r in chain:
        # w of work from t; at rate 1/f while a reduction runs (until comm_end)
        if f != 1.0 and comm_end > t:
            slow = (comm_end - t) / f          # work done before the reduction ends
            t = t + w * f if w <= slow else comm_end + (w - slow)
        else:
            t += w
        if r > 0:
            comm_end = max(t, comm_end) + r
    return t, max(t, comm_end)


def schedule_order(stage: int, par: ParallelSpec, m: int) -> list[tuple[str, int, int]]:
    """(``"F"``/``"B"``, virtual stage, micro-batch) in the order stage ``stage`` runs them.

    >>> [f"{a}{i}" for a, _, i in schedule_order(0, ParallelSpec(pp=3), 4)]
    ['F0', 'F1', 'F2', 'B0', 'F3', 'B1', 'B2', 'B3']
    """
    p, v = par.pp, par.virtual
    total = m * v
    if v == 1:
        warm = min(p - stage - 1, m)
    else:
        if m % p:
            raise InputError(f"the interleaved schedule needs the micro-batches per step "
                             f"(--accum = {m}) to be a multiple of --pp {p}")
        warm = min((p - stage - 1) * 2 + (v - 1) * p, total)

    def unit(u: int, backward: bool) -> tuple[int, int]:
        c = (u // p) % v
        if backward:
            c = v - 1 - c
        return c * p + stage, (u // (p * v)) * p + u % p if v > 1 else u

    order = [("F", *unit(u, False)) for u in range(warm)]
    for j in range(total - warm):
        order.append(("F", *unit(warm + j, False)))
        order.append(("B", *unit(j, True)))
    order += [("B", *unit(u, True)) for u in range(total - warm, total)]
    return order


def build_plan_3d(model: ModelSpec, strategy: Strategy | str, cluster: ClusterSpec,
                  training: TrainingSpec, par: ParallelSpec, runtime=None) -> Plan3D:
    """The op list of one global step of a TP x PP x DP job (module docstring).

    ``training.micro_batch`` is per DP replica and ``training.accum_steps`` is m, the
    micro-batches each replica's pipeline runs per step. ``runtime``: a
    :class:`parosim.runtime.RuntimeSpec` (:func:`check_runtime_3d`): its boundary buckets and
    per-call algorithm; None = ideal.
    """
    from .compute import compute_seconds
    from .runtime import as_runtime

    rt = as_runtime(runtime)
    strategy = parse_strategy(strategy)
    check_runtime_3d(rt, strategy, par)
    check_cp(cluster, training, par)
    orig, training = training, cp_local(training, par)   # one CP rank: s/cp tokens
    lay = layout_for(cluster, par.tp, par.pp)
    p, t, v = par.pp, par.tp, par.virtual
    m = training.accum_steps
    r = training.trainable_ratio
    sp = par.sequence_parallel
    recompute = resolve_recompute(model, strategy, cluster, training, par=par)
    rc_flops = recompute_flops(model, training, recompute, par.selective_recompute)
    units = chunk_units(model, par)
    last_vs = len(units) - 1
    ks = unit_seconds(model, cluster, training, par, recompute)   # None: flat model
    b = Builder(runtime=rt)
    tp_size = tp_buffer_bytes(model, training)
    msg = tp_size / t                    # p2p bytes per rank (scatter/gather or SP shard)
    tp_algo = par.tp_algo if t > cluster.gpus_per_node else Algo.RING
    coalesce = strategy.p is Level.N and strategy.g is Level.N
    done: list[list[int]] = [[] for _ in range(p)]
    sent: dict[tuple[str, int, int], int] = {}
    ovl = par.tp_comm_overlap
    pairs = ({ph: tp_overlap_pairs(model, cluster, training, par, ph)
              for ph in ("fwd", "bwd", "recompute")} if ovl else {})
    check_dp_overlap(strategy, par)
    dpo = par.dp_comm_overlap
    buckets = dp_buckets(model, par, lay.d) if dpo else []
    psync = SYNC_PARAM.get((strategy.os, strategy.p), ()) if dpo else ()
    gsync = SYNC_GRAD[(strategy.g, strategy.os)] if dpo else ()
    # first-use order of a stage's buckets (forward: chunk by chunk, last bucket first)
    use_order = [[(vs, bi) for vs in range(k, len(units), p)
                  for bi in range(len(buckets[vs]) - 1, -1, -1)] if dpo else []
                 for k in range(p)]
    gathers: dict[tuple[int, int], int | None] = {}
    gchain: dict[tuple[int, int], tuple] = {}
    pchain: dict[tuple[int, int], tuple] = {}

    def secs(f: float, kinds=(), phase: str = "fwd") -> float:
        """Flat: FLOPs at the efficiency; kernel: the kernel times of these unit kinds."""
        if ks is None:
            return compute_seconds(f, cluster, training)
        return sum(ks[(kd, phase)] for kd in kinds)

    def tp_ops(k: int, kinds: list[str], phase: str, mb: int, label: str) -> None:
        counts: dict[Op, int] = {}
        for kind in kinds:
            if ovl and kind == "layer":   # overlapped: overlap_ops
                continue
            for op, c in tp_collectives(kind, phase, sp):
                counts[op] = counts.get(op, 0) + c
        for op, c in counts.items():
            b.collective(f"tp {op.value} {phase} {label} mb{mb}", op, Scope.GLOBAL, tp_size, "tp",
                   None, mb, f"compute/s{k}", [], stage=k, group="tp",
                   scopes=lay.tp_scopes(k), count=c, algo=tp_algo)

    cpp = {ph: cp_pairs(model, cluster, training, par, ks, ph)
           for ph in ("fwd", "bwd", "recompute")}
    cp_bwd = cp_attention_step(model, cluster, training, par, ks) if par.cp > 1 else None

    def rest(phase: str, n: int, f: float, sec: float) -> tuple[float, float]:
        """FLOPs and seconds of a compute op once its n layers' overlapped GEMMs are split
        off (TP communication overlap; unchanged without it), and with context parallelism
        the layers' attention backward (its cp steps are ops of their own: cp_ops)."""
        if cp_bwd is not None and phase == "bwd" and n:
            f, sec = f - n * cp_bwd[3], sec - n * cp_bwd[1]
        if not ovl or n == 0:
            return f, sec
        return (max(0.0, f - n * sum(pr.gemm_flops for pr in pairs[phase])),
                max(0.0, sec - n * sum(pr.gemm_s for pr in pairs[phase])))

    def cp_ops(k: int, phase: str, mb: int, label: str, n: int, kind: str) -> None:
        """Context parallelism: per ring step type of n layers, the attention steps on the
        compute stream beside the K/V (dK/dV) ring transfers on ``tp-ovl/s{k}`` (both start
        together, as the TP overlap pairs), then a zero-length wait for the transfers."""
        if par.cp == 1 or n == 0 or (phase == "recompute" and not rc_flops):
            return
        cs = f"compute/s{k}"
        for i, (sec, fl, size, c) in enumerate(cpp[phase]):
            pre = b.last[cs]
            gid = b.compute(f"{kind} cp-attn{i} {label} mb{mb}", kind, None, mb, n * c * fl,
                            n * c * sec, [], cs)
            cid = b.collective(f"cp ring{i} {phase} {label} mb{mb}", Op.ALL_GATHER, Scope.GLOBAL,
                         size, "cp-ring", None, mb, f"tp-ovl/s{k}", [pre], stage=k,
                         group="p2p", scopes=lay.cp_ring(k, par.cp), count=n * c, pair=gid)
            b.compute(f"cp wait{i} {label} mb{mb}", "cp-wait", None, mb, 0.0, 0.0, [cid], cs)

    def overlap_ops(k: int, phase: str, mb: int, label: str, n: int, kind: str) -> None:
        """TP communication overlap: per overlapped collective of n layers, its GEMM on the
        compute stream beside the collective on ``tp-ovl/s{k}`` (both start together; the
        engine's overlap gate slows the GEMM while it runs), then the exposed chunk on the
        compute stream after both (bulk: a zero-length wait for the collective)."""
        if not ovl or n == 0:
            return
        cs = f"compute/s{k}"
        for pr in pairs[phase]:
            pre = b.last[cs]
            gid = b.compute(f"{kind} {pr.name} {label} mb{mb}", kind, None, mb,
                            n * pr.gemm_flops, n * pr.gemm_s, [], cs)
            size = tp_size * pr.size_scale
            cid = b.collective(f"tp {pr.op.value} {pr.name} {label} mb{mb}", pr.op, Scope.GLOBAL,
                         size, "tp-overlap", None, mb, f"tp-ovl/s{k}", [pre], stage=k,
                         group="tp", scopes=lay.tp_scopes(k), count=n, algo=tp_algo, pair=gid)
            if pr.chunks:
                b.collective(f"tp {pr.op.value} chunk {pr.name} {label} mb{mb}", pr.op,
                       Scope.GLOBAL, size / pr.chunks, "tp-chunk", None, mb, cs, [cid],
                       stage=k, group="tp", scopes=lay.tp_scopes(k), count=n, algo=tp_algo)
            else:
                b.compute(f"tp-overlap wait {pr.name} {label} mb{mb}", "tp-wait", None, mb,
                          0.0, 0.0, [cid], cs)

    def gather(k: int, u, phase: str, mb: int) -> int | None:
        if strategy.p is Level.N:
            return None
        d = done[k]
        return b.collective(f"ag-param {phase} {u.label} mb{mb}", Op.ALL_GATHER,
                      LEVEL_SCOPE[strategy.p], BYTES_PER_PARAM * u.params / t,
                      "param-gather", None, mb, f"comm-param/s{k}",
                      [d[-2] if len(d) >= 2 else None], stage=k, group="dp",
                      scopes=lay.dp_scopes(k))

    def bucket_sync(k: int, key: tuple[int, int], table, purpose: str, stream: str,
                    deps) -> list[int]:
        """The DP collectives of one bucket (DP communication overlap), chained."""
        vs, bi = key
        trainable = sum(units[vs][i].params for i in buckets[vs][bi]) * r / t
        full = BYTES_PER_GRAD * trainable
        sizes = {"full": full, "shard": full / lay.m_dp}
        ids = []
        for op, scope, size in table:
            cid = b.collective(f"{purpose} {op.value} {scope.value} c{vs} b{bi}", op, scope,
                         sizes[size], purpose, None, None, f"{stream}/s{k}", deps, stage=k,
                         group="dp", scopes=lay.dp_scopes(k))
            if cid is not None:
                ids.append(cid)
                deps = [cid]
        return ids

    def window(k: int, n0: int) -> tuple[int, ...]:
        """Ids of stage k's busy ops (compute stream and TP overlap) emitted since n0."""
        return tuple(o.id for o in b.ops[n0:]
                     if o.stream in (f"compute/s{k}", f"tp-ovl/s{k}"))

    def forward_buckets(k: int, vs: int, mb: int, dep0) -> None:
        """First micro-batch with DP communication overlap: bucket by bucket, each waiting
        for its parameter all-gather; the stage's gathers all start at the step's start,
        back to back in the order of use (Megatron's aligned launch)."""
        cs = f"compute/s{k}"
        if not any(key in gathers for key in use_order[k]):
            for key in use_order[k]:
                gathers[key] = bucket_sync(k, key, psync, "param-bucket", "comm-param", [])
        for bi in range(len(buckets[vs]) - 1, -1, -1):
            us = [units[vs][i] for i in reversed(buckets[vs][bi])]
            first = dep0 if bi == len(buckets[vs]) - 1 else None
            g = gathers[(vs, bi)]
            n0 = len(b.ops)
            kinds = [u.kind for u in us]
            f = sum(unit_flops(model, training, u.kind, "fwd") for u in us) / t
            nl = kinds.count("layer")
            f_r, s_r = rest("fwd", nl, f, secs(f, kinds))
            b.compute(f"fwd c{vs} b{bi} mb{mb}", "fwd", None, mb, f_r, s_r,
                      [first, g[-1] if g else None], cs)
            overlap_ops(k, "fwd", mb, f"c{vs}b{bi}", nl, "fwd")
            cp_ops(k, "fwd", mb, f"c{vs}b{bi}", nl, "fwd")
            done[k].append(b.last[cs])
            tp_ops(k, kinds, "fwd", mb, f"c{vs}b{bi}")
            pchain[(vs, bi)] = (window(k, n0), tuple(g))

    def backward_buckets(k: int, vs: int, mb: int, dep0) -> None:
        """Last micro-batch with DP communication overlap: bucket by bucket, each bucket's
        gradient reduction issued on ``comm-grad/s{k}`` as soon as its backward ends."""
        cs = f"compute/s{k}"
        first = [dep0]
        for bi, bucket in enumerate(buckets[vs]):
            us = [units[vs][i] for i in bucket]
            kinds = [u.kind for u in us]
            layers = [kd for kd in kinds if kd == "layer"]
            nl = len(layers)
            n0 = len(b.ops)
            if rc_flops and nl:
                f = nl * rc_flops / t
                s_rc = secs(f, layers, "recompute")
                if recompute:
                    f, s_rc = rest("recompute", nl, f, s_rc)
                b.compute(f"recompute c{vs} b{bi} mb{mb}", "recompute", None, mb, f, s_rc,
                          first, cs)
                if recompute:
                    overlap_ops(k, "recompute", mb, f"c{vs}b{bi}", nl, "recompute")
                    tp_ops(k, kinds, "recompute", mb, f"c{vs}b{bi}")
                cp_ops(k, "recompute", mb, f"c{vs}b{bi}", nl, "recompute")
                first = []
            f = sum(unit_flops(model, training, u.kind, "bwd") for u in us) / t
            f_r, s_r = rest("bwd", nl, f, secs(f, kinds, "bwd"))
            b.compute(f"bwd c{vs} b{bi} mb{mb}", "bwd", None, mb, f_r, s_r, first, cs)
            first = []
            overlap_ops(k, "bwd", mb, f"c{vs}b{bi}", nl, "bwd")
            cp_ops(k, "bwd", mb, f"c{vs}b{bi}", nl, "bwd")
            done[k].append(b.last[cs])
            tp_ops(k, kinds, "bwd", mb, f"c{vs}b{bi}")
            ids = window(k, n0)
            gchain[(vs, bi)] = (ids, tuple(bucket_sync(k, (vs, bi), gsync, "grad-bucket",
                                                       "comm-grad", [b.last[cs]])))

    def forward(k: int, vs: int, mb: int) -> None:
        us = units[vs]
        dep0 = sent.get(("F", vs - 1, mb))
        cs = f"compute/s{k}"
        if dpo and psync and mb == 0:
            forward_buckets(k, vs, mb, dep0)
        elif coalesce:
            f = sum(unit_flops(model, training, u.kind, "fwd") for u in us) / t
            nl = sum(u.kind == "layer" for u in us)
            f_r, s_r = rest("fwd", nl, f, secs(f, [u.kind for u in us]))
            b.compute(f"fwd c{vs} mb{mb}", "fwd", None, mb, f_r, s_r, [dep0], cs)
            overlap_ops(k, "fwd", mb, f"c{vs}", nl, "fwd")
            cp_ops(k, "fwd", mb, f"c{vs}", nl, "fwd")
            done[k].append(b.last[cs])
            tp_ops(k, [u.kind for u in us], "fwd", mb, f"c{vs}")
        else:
            for j, u in enumerate(us):
                g = gather(k, u, "fwd", mb)
                f = unit_flops(model, training, u.kind, "fwd") / t
                kind = {"layer": "fwd", "head": "head-fwd", "embed": "embed-fwd"}[u.kind]
                nl = int(u.kind == "layer")
                f_r, s_r = rest("fwd", nl, f, secs(f, [u.kind]))
                b.compute(f"fwd {u.label} mb{mb}", kind, None, mb, f_r, s_r,
                          [g, dep0 if j == 0 else None], cs)
                overlap_ops(k, "fwd", mb, u.label, nl, kind)
                cp_ops(k, "fwd", mb, u.label, nl, kind)
                done[k].append(b.last[cs])
                tp_ops(k, [u.kind], "fwd", mb, u.label)
        if vs < last_vs:
            send(k, vs, vs + 1, mb, "F", "act", "fwd", b.last[cs])

    def send(k: int, vs: int, to_vs: int, mb: int, key: str, what: str, way: str,
             after) -> None:
        """Chunk ``vs``'s activation (forward) or gradient (backward) to the stage of chunk
        ``to_vs``: a pipeline send, then (TP without SP) the receivers' all-gather."""
        peer = to_vs % p
        sid = b.collective(f"send {what} c{vs} mb{mb}", Op.ALL_GATHER, Scope.GLOBAL, msg,
                     f"p2p-{what}", None, mb, f"p2p-{way}/s{k}", [after], stage=k,
                     group="p2p", scopes=lay.pairs(k, peer))
        if not sp and t > 1:
            sid = b.collective(f"tp all-gather {what} c{to_vs} mb{mb}", Op.ALL_GATHER,
                         Scope.GLOBAL, tp_size, "tp", None, mb, f"p2p-{way}/s{k}", [sid],
                         stage=peer, group="tp", scopes=lay.tp_scopes(peer), algo=tp_algo)
        sent[(key, vs, mb)] = sid if sid is not None else after

    def backward(k: int, vs: int, mb: int) -> None:
        us = units[vs]
        dep0 = sent.get(("B", vs + 1, mb))
        cs = f"compute/s{k}"
        if dpo and mb == m - 1:
            backward_buckets(k, vs, mb, dep0)
        elif coalesce:
            first = [dep0]
            nl = sum(u.kind == "layer" for u in us)
            if rc_flops:
                f = sum(rc_flops for u in us if u.kind == "layer") / t
                s_rc = secs(f, [u.kind for u in us if u.kind == "layer"], "recompute")
                if recompute:
                    f, s_rc = rest("recompute", nl, f, s_rc)
                b.compute(f"recompute c{vs} mb{mb}", "recompute", None, mb, f, s_rc, first,
                          cs)
                if recompute:
                    overlap_ops(k, "recompute", mb, f"c{vs}", nl, "recompute")
                    tp_ops(k, [u.kind for u in us], "recompute", mb, f"c{vs}")
                cp_ops(k, "recompute", mb, f"c{vs}", nl, "recompute")
                first = []
            f = sum(unit_flops(model, training, u.kind, "bwd") for u in us) / t
            f_r, s_r = rest("bwd", nl, f, secs(f, [u.kind for u in us], "bwd"))
            b.compute(f"bwd c{vs} mb{mb}", "bwd", None, mb, f_r, s_r, first, cs)
            overlap_ops(k, "bwd", mb, f"c{vs}", nl, "bwd")
            cp_ops(k, "bwd", mb, f"c{vs}", nl, "bwd")
            done[k].append(b.last[cs])
            tp_ops(k, [u.kind for u in us], "bwd", mb, f"c{vs}")
        else:
            for j, u in enumerate(reversed(us)):
                g = gather(k, u, "bwd", mb)
                first = [dep0] if j == 0 else []
                nl = int(u.kind == "layer")
                if rc_flops and u.kind == "layer":
                    f = rc_flops / t
                    s_rc = secs(f, ["layer"], "recompute")
                    if recompute:
                        f, s_rc = rest("recompute", nl, f, s_rc)
                    b.compute(f"recompute {u.label} mb{mb}", "recompute", None, mb, f, s_rc,
                              [g, *first], cs)
                    if recompute:
                        overlap_ops(k, "recompute", mb, u.label, nl, "recompute")
                        tp_ops(k, ["layer"], "recompute", mb, u.label)
                    cp_ops(k, "recompute", mb, u.label, nl, "recompute")
                    first = []
                f = unit_flops(model, training, u.kind, "bwd") / t
                kind = {"layer": "bwd", "head": "head-bwd", "embed": "embed-bwd"}[u.kind]
                f_r, s_r = rest("bwd", nl, f, secs(f, [u.kind], "bwd"))
                b.compute(f"bwd {u.label} mb{mb}", kind, None, mb, f_r, s_r, [g, *first], cs)
                overlap_ops(k, "bwd", mb, u.label, nl, kind)
                cp_ops(k, "bwd", mb, u.label, nl, kind)
                cid = b.last[cs]
                done[k].append(cid)
                tp_ops(k, [u.kind], "bwd", mb, u.label)
                if strategy.g is not Level.N:
                    b.collective(f"rs-grad {u.label} mb{mb}", Op.REDUCE_SCATTER,
                           LEVEL_SCOPE[strategy.g], BYTES_PER_GRAD * u.params * r / t,
                           "grad-reduce", None, mb, f"comm-grad/s{k}", [cid], stage=k,
                           group="dp", scopes=lay.dp_scopes(k))
        if vs > 0:
            send(k, vs, vs - 1, mb, "B", "grad", "bwd", b.last[cs])

    orders = [schedule_order(k, par, m) for k in range(p)]
    ptr = [0] * p
    while any(ptr[k] < len(orders[k]) for k in range(p)):
        progressed = False
        for k in range(p):
            while ptr[k] < len(orders[k]):
                what, vs, mb = orders[k][ptr[k]]
                if what == "F" and vs > 0 and ("F", vs - 1, mb) not in sent:
                    break
                if what == "B" and vs < last_vs and ("B", vs + 1, mb) not in sent:
                    break
                (forward if what == "F" else backward)(k, vs, mb)
                ptr[k] += 1
                progressed = True
        if not progressed:  # a schedule bug, not an input problem
            raise RuntimeError("pipeline schedule cannot progress: "
                               + ", ".join(f"s{k}: {orders[k][ptr[k]]}" for k in range(p)
                                           if ptr[k] < len(orders[k])))
    sparams = stage_params(model, par)
    fp8p = stage_fp8_params(model, par)
    for k in range(p):
        _boundary(b, k, strategy, lay, sparams[k] * r, cluster, training, fp8p[k], dpo, rt)
    gch, pch = _dp_chains(p, v, buckets, gchain, pchain) if dpo else ((), ())
    n = cluster.gpus
    tokens = training.micro_batch * training.seq_len * m * lay.d
    hw = sum(o.flops for o in b.ops if isinstance(o, ComputeOp)) / p
    training = orig   # MFU counts the model's FLOPs of the whole sequence
    return Plan3D(ops=tuple(b.ops), strategy=strategy, gpus=n, group_size=lay.m_dp,
                  model=model.name, micro_batch=training.micro_batch, accum_steps=m,
                  seq_len=training.seq_len, trainable_ratio=r, tokens_per_step=tokens,
                  model_flops_per_step=step_flops(model, training, tokens / n),
                  recompute=recompute, tp=t, pp=p, dp=lay.d, schedule=par.schedule,
                  virtual=v, sequence_parallel=sp, cp=par.cp,
                  selective_recompute=par.selective_recompute, tp_comm_overlap=ovl,
                  hardware_flops_per_gpu=hw, runtime=rt.name,
                  stage_params=tuple(sparams), dp_grad_chains=gch, dp_param_chains=pch)


def _dp_chains(p: int, v: int, buckets, gchain, pchain) -> tuple[tuple, tuple]:
    """Per stage, the gradient chain (chunks in the order of their last backward, the last
    virtual chunk first): entries (busy op ids, collective op ids, scale); with the
    interleaved schedule p - 1 other micro-batches of the next chunk run between two chunks'
    last backwards: an entry of that chunk's pass x (p - 1) with no collective. Per virtual
    stage, the parameter chain: (busy op ids, gather op ids) of its buckets in forward order
    (:func:`param_fill_exposed`; docs/parallelism.md)."""
    gch, pch = [], []
    for k in range(p):
        g = []
        for ci, c in enumerate(reversed(range(v))):
            vs = k + c * p
            ents = [gchain[(vs, bi)] for bi in range(len(buckets[vs]))]
            if ci > 0:
                g.append((tuple(i for e in ents for i in e[0]), (), p - 1))
            g += [(e[0], e[1], 1) for e in ents]
        gch.append(tuple(g))
    if pchain:
        for vs in range(len(buckets)):
            pch.append(tuple(pchain[(vs, bi)] for bi in range(len(buckets[vs]) - 1, -1, -1)))
    return tuple(gch), tuple(pch)


def param_fill_exposed(chains, p: int, v: int, f: float = 1.0) -> float:
    """Delay the bucketed parameter all-gathers add to the pipeline: the first micro-batch's
    forward through the virtual stages 0..p·v-1 (the path every stage's work waits on),
    with and without the gathers. ``chains[vs]``: [(gather s, busy s)] of virtual stage vs's
    buckets in forward order. Every stage starts its gathers at the step's start, back to
    back on one stream in the order of use (Megatron-LM's default aligned launch, "all PP
    stages will launch param all-gathers simultaneously"); a bucket's forward starts when the
    previous one has ended, its input has arrived and its gather has ended, at 1/f while the
    stage's gathers are in flight. With the interleaved schedule stage k runs p - 1 more
    forwards of chunk c (micro-batches 1..p-1) before chunk c + 1's first.

    >>> param_fill_exposed([[(0.5, 1.0), (0.5, 1.0)]], 1, 1)   # the first gather shows
    0.5
    >>> param_fill_exposed([[(1.5, 1.0)] * 3], 1, 1)           # gathers end at 1.5, 3, 4.5
    2.5
    >>> param_fill_exposed([[(0.5, 1.0)], [(0.5, 1.0)]], 2, 1)  # stage 1's hides in the fill
    0.5
    """
    def run(gathers: bool) -> float:
        ends: dict[tuple[int, int], float] = {}
        total = [0.0] * p
        for k in range(p):
            acc = 0.0
            for vs in range(k, len(chains), p):
                for i, (g, _) in enumerate(chains[vs]):
                    acc += g if gathers else 0.0
                    ends[(vs, i)] = acc
            total[k] = acc
        free = [0.0] * p       # when stage k's compute stream is free
        arr = 0.0
        for vs, chain in enumerate(chains):
            k = vs % p
            t = max(arr, free[k])
            for i, (_, w) in enumerate(chain):
                start = max(t, ends[(vs, i)])
                busy = total[k] - start         # the stage's gathers still in flight
                if f != 1.0 and busy > 0:
                    t = start + (busy + (w - busy / f) if w > busy / f else w * f)
                else:
                    t = start + w
            arr = t
            extra = (p - 1) * sum(w for _, w in chain) if v > 1 and vs < p * (v - 1) else 0.0
            free[k] = t + extra
        return arr

    return run(True) - run(False)


def dp_overlap_exposed(grad, f: float = 1.0) -> float:
    """Exposed gradient time of one stage from its chain of (busy seconds, collective
    seconds, has a collective) entries (:func:`_dp_chains`): an entry with no collective is
    busy time that joins the next bucket's backward; then :func:`grad_chain_exposed`."""
    return grad_chain_exposed(_grad_list(grad), f)


def dp_overlap_bound(grads, f: float = 1.0) -> list[float]:
    """Per stage, the gradient side of the boundary with DP communication overlap: its
    exposed reductions (:func:`dp_overlap_exposed`) plus, with f > 1, the slowdown of the
    last backwards of the later stages (:func:`grad_chain_slowed`): in the cool-down stage
    k's last backward waits for stage k + 1's, which ran at 1/f beside its own reductions.
    With f = 1 exactly the exposed reductions."""
    ex = [dp_overlap_exposed(g, f) for g in grads]
    if f == 1.0:
        return ex
    sl = [grad_chain_slowed(_grad_list(_last_chunk(g)), f) for g in grads]
    return [ex[k] + sum(sl[k + 1:]) for k in range(len(grads))]


def _last_chunk(grad):
    """The entries after the last one without a collective (the last chunk's buckets)."""
    i = max((j for j, e in enumerate(grad) if not e[2]), default=-1)
    return grad[i + 1:]


def _grad_list(grad) -> list[tuple[float, float]]:
    gl, pend = [], 0.0
    for w, c, has in grad:
        if not has:
            pend += w
            continue
        gl.append((pend + w, c))
        pend = 0.0
    if pend:
        gl.append((pend, 0.0))
    return gl


def _boundary(b: Builder, k: int, strategy: Strategy, lay: Layout, trainable: float,
              cluster: ClusterSpec, training: TrainingSpec, fp8_params: float = 0.0,
              dp_overlap: bool = False, runtime=None) -> None:
    """Per stage: t_sync_g, the optimizer step, t_sync_p (:func:`parosim.planning.boundary`).
    With DP communication overlap the syncs are the buckets' (in the last backward, the
    first forward): only the optimizer step stays here."""
    d_os = strategy.os.divisor(lay.d, lay.m_dp)
    opt_s = optimizer_seconds_3d(trainable, d_os, cluster, training, fp8_params)
    boundary(b, strategy, BYTES_PER_GRAD * trainable, lay.m_dp,
             [b.last.get(f"compute/s{k}"), b.last.get(f"comm-grad/s{k}")], opt_s, runtime,
             stage=k, scopes=lay.dp_scopes(k), syncs=not dp_overlap)


# -- memory ------------------------------------------------------------------------------


# -- analytic ----------------------------------------------------------------------------

_TIMES: dict = {}   # closed-form time per (cluster, algo, collective, group set)
_SUMMARY_TIMES: dict = {}


@dataclass(frozen=True)
class Analytic3D:
    """Closed-form step of a 3D plan (seconds)."""

    step_time_s: float
    pipeline_s: float
    bubble_s: float
    boundary_s: float
    compute_s: float          # compute ops of the busiest stage over the step (+ its optimizer)
    stage_time_s: tuple[float, ...]   # per micro-batch, per stage (compute + TP, or DP comm)

    @property
    def bubble_fraction(self) -> float:
        return self.bubble_s / self.pipeline_s if self.pipeline_s > 0 else 0.0

    @property
    def exposed_comm_s(self) -> float:
        return max(0.0, self.step_time_s - self.compute_s - self.bubble_s)


def evaluate_3d(plan: Plan3D, spec: ClusterSpec, algo: Algo, m: int | None = None,
                overlap_slowdown: float = 1.0) -> Analytic3D:
    """Closed form of a 3D Plan (docs/parallelism.md, "Analytic"):

    per stage and micro-batch T_k = max(compute + TP collectives, PaRO micro-step
    collectives); pipeline = m·max T_k + (p-1)·(mean T_k / v + one activation and one
    gradient transfer); step = pipeline + max over stages of (gradient sync + optimizer +
    parameter sync). ``m`` (default: the plan's) lets a plan built with fewer micro-batches
    stand for one with m (per-micro-batch costs are identical provided the small plan was
    built with the recomputation decision of the m-micro-batch step: auto recomputation
    depends on m through the activations in flight; :func:`simulate_3d` passes it).

    With p = 1 and no DP traffic this is m x (compute + TP) exactly. With
    ``overlap_slowdown`` f > 1 the micro-step collectives slow the stage's busy time
    (T_k = ``overlapped_time(busy, dp, f)``), and with DP communication overlap the later
    stages' slowed last backwards delay the cool-down (:func:`dp_overlap_bound`): the
    engine's per-stage gates (:meth:`Plan3D.overlap_gates`).

    TP communication overlap (ops on ``tp-ovl/s{k}``): a collective of x seconds beside its
    GEMM of g seconds adds ``overlapped_time(g, x, f) - g`` to its stage (``max(0, x - g)``
    with ``overlap_slowdown`` f = 1; :func:`parosim.analytic.overlapped_time`); its exposed
    chunk is a TP op on the compute stream.

    DP communication overlap (``plan.dp_grad_chains``): each stage's boundary holds its
    exposed bucket reductions (:func:`dp_overlap_exposed`) instead of the syncs, and the
    exposed parameter gathers of the pipeline fill (:func:`param_fill_exposed`) are added.
    """
    from .analytic import overlapped_time
    from .collectives.cost import program_time

    m_plan = plan.accum_steps
    m = m_plan if m is None else m
    p, v = plan.pp, plan.virtual

    def t_of(op) -> float:
        key = (spec, algo, op.group, op.op, op.scope, op.size_bytes, op.algo, op.scopes)
        t = _TIMES.get(key)
        if t is None:
            if len(_TIMES) > 100_000:
                _TIMES.clear()
            t = _TIMES[key] = program_time(spec, op.lower(spec, algo))
        return t * op.count

    busy = [0.0] * p
    comp = [0.0] * p
    dp = [0.0] * p
    p2p = [0.0] * p
    bound = [0.0] * p
    opt = [0.0] * p
    dpo = bool(plan.dp_grad_chains)
    own: dict[int, float] = {}    # DP communication overlap: each op's busy time / its time
    for op in plan.ops:
        k = int(op.stream.rsplit("/s", 1)[1])
        if isinstance(op, ComputeOp):
            if op.micro_step is None:
                bound[k] += op.duration_s
                opt[k] += op.duration_s
            else:
                busy[k] += op.duration_s
                comp[k] += op.duration_s
                if dpo:
                    own[op.id] = op.duration_s
            continue
        t = t_of(op)
        if dpo and op.purpose in ("grad-bucket", "param-bucket"):
            own[op.id] = t      # exposed through the chains below
        elif op.micro_step is None:
            bound[k] += t
        elif op.stream.startswith("tp-ovl/"):
            g = plan.ops[op.pair].duration_s
            busy[k] += overlapped_time(g, t, overlap_slowdown) - g
            if dpo:
                own[op.id] = overlapped_time(g, t, overlap_slowdown) - g
        elif op.stream.startswith("compute/"):
            busy[k] += t
            if dpo:
                own[op.id] = t
        elif op.stream.startswith("p2p-"):
            p2p[k] += t
        else:
            dp[k] += t
    if dpo:   # the buckets' exposed reduction and gather join the boundary
        def ent(chain):
            return [(sc * sum(own[i] for i in ids), sum(own[i] for i in cs), bool(cs))
                    for ids, cs, sc in chain]

        gb = dp_overlap_bound([ent(plan.dp_grad_chains[k]) for k in range(p)],
                              overlap_slowdown)
        for k in range(p):
            bound[k] += gb[k]
        pre = param_fill_exposed([[(sum(own[i] for i in cs), sum(own[i] for i in ids))
                                   for ids, cs in ch] for ch in plan.dp_param_chains],
                                 p, v, overlap_slowdown) if plan.dp_param_chains else 0.0
        return _combine(busy, comp, dp, p2p, bound, opt, m_plan, m, p, v, pre,
                        f=overlap_slowdown)
    # one activation + one gradient transfer per (virtual) boundary, per micro-batch
    return _combine(busy, comp, dp, p2p, bound, opt, m_plan, m, p, v,
                    f=overlap_slowdown)


def summary_3d(model: ModelSpec, strategy: Strategy, cluster: ClusterSpec,
               training: TrainingSpec, par: ParallelSpec, algo: Algo,
               recompute: bool, overlap_slowdown: float = 1.0) -> Analytic3D:
    """:func:`evaluate_3d` of :func:`build_plan_3d` without building the ops (the same sums
    per stage, term by term; tested equal): ``advise`` screens thousands of configurations
    with it."""
    from .analytic import overlapped_time
    from .collectives.cost import program_time
    from .compute import compute_seconds

    check_cp(cluster, training, par)
    training = cp_local(training, par)   # one CP rank: s/cp tokens
    lay = layout_for(cluster, par.tp, par.pp)
    p, t, v, sp = par.pp, par.tp, par.virtual, par.sequence_parallel
    r = training.trainable_ratio
    units = chunk_units(model, par)
    last_vs = len(units) - 1
    tp_size = tp_buffer_bytes(model, training)
    tp_algo = par.tp_algo if t > cluster.gpus_per_node else Algo.RING

    if len(_SUMMARY_TIMES) > 64:
        _SUMMARY_TIMES.clear()
    cache = _SUMMARY_TIMES.setdefault((cluster, algo), {})   # one hash of the cluster

    def coll(group, op, scope, size, gs, own=None) -> float:
        if group == "p2p":
            k = 2
        else:
            k = gs.size(scope)
        if k <= 1 or size <= 0:
            return 0.0
        key = (group, op, scope, float(size), own, gs)
        tt = cache.get(key)
        if tt is None:
            prog = (lower_p2p(gs, float(size)) if group == "p2p" else
                    lower_group(cluster, op, scope, float(size), own or algo, gs))
            tt = cache[key] = program_time(cluster, prog)
        return tt

    ovl = par.tp_comm_overlap
    pairs = ({ph: tp_overlap_pairs(model, cluster, training, par, ph)
              for ph in ("fwd", "bwd", "recompute")} if ovl else {})

    def tp_time(k: int, kind: str, phase: str) -> float:
        if ovl and kind == "layer":   # each overlapped collective beside its GEMM + a chunk
            gs = lay.tp_scopes(k)
            tot = 0.0
            for pr in pairs[phase]:
                size = tp_size * pr.size_scale
                x = coll("tp", pr.op, Scope.GLOBAL, size, gs, tp_algo)
                tot += overlapped_time(pr.gemm_s, x, overlap_slowdown) - pr.gemm_s
                if pr.chunks:
                    tot += coll("tp", pr.op, Scope.GLOBAL, size / pr.chunks, gs, tp_algo)
            return tot
        return sum(c * coll("tp", op, Scope.GLOBAL, tp_size, lay.tp_scopes(k), tp_algo)
                   for op, c in tp_collectives(kind, phase, sp))

    busy = [0.0] * p
    comp = [0.0] * p
    dp = [0.0] * p
    p2p = [0.0] * p
    bound = [0.0] * p
    opt = [0.0] * p
    msg = tp_size / t
    rcf = recompute_flops(model, training, recompute, par.selective_recompute)
    flops = {(kind, ph): unit_flops(model, training, kind, ph)
             for kind in ("embed", "layer", "head") for ph in ("fwd", "bwd")}
    ks = unit_seconds(model, cluster, training, par, recompute)   # None: flat model

    def cp_time(k: int, phase: str) -> tuple[float, float]:
        """Context parallelism, one layer pass: (compute added, busy time added): the
        attention steps beside their ring transfers (build_plan_3d's cp_ops), less the
        attention backward they replace in the layer's backward."""
        if par.cp == 1 or (phase == "recompute" and not rcf):
            return 0.0, 0.0
        c = x = 0.0
        for sec, _, size, cnt in cp_pairs(model, cluster, training, par, ks, phase):
            g = cnt * sec
            c += g
            x += overlapped_time(g, cnt * coll("p2p", Op.ALL_GATHER, Scope.GLOBAL, size,
                                               lay.cp_ring(k, par.cp)), overlap_slowdown)
        if phase == "bwd":
            a = cp_attention_step(model, cluster, training, par, ks)[1]
            c, x = c - a, x - a
        return c, x
    for vs, us in enumerate(units):
        k = vs % p
        gs = lay.dp_scopes(k)
        kinds: dict[tuple[str, int], int] = {}
        for u in us:   # the layers of a chunk are identical: cost each kind once
            kinds[(u.kind, u.params)] = kinds.get((u.kind, u.params), 0) + 1
        for (kind, params), n in kinds.items():
            if ks is not None:
                secs = ks[(kind, "fwd")] + ks[(kind, "bwd")]
                if kind == "layer" and rcf:
                    secs += ks[("layer", "recompute")]
            else:
                secs = (compute_seconds(flops[(kind, "fwd")] / t, cluster, training)
                        + compute_seconds(flops[(kind, "bwd")] / t, cluster, training))
                if kind == "layer" and rcf:
                    secs += compute_seconds(rcf / t, cluster, training)
            comp[k] += n * secs
            busy[k] += n * (secs + tp_time(k, kind, "fwd") + tp_time(k, kind, "bwd"))
            if recompute and kind == "layer":
                busy[k] += n * tp_time(k, kind, "recompute")
            if kind == "layer" and par.cp > 1:
                for ph in ("fwd", "bwd", "recompute"):
                    c, x = cp_time(k, ph)
                    comp[k] += n * c
                    busy[k] += n * x
            if strategy.p is not Level.N:
                dp[k] += n * 2 * coll("dp", Op.ALL_GATHER, LEVEL_SCOPE[strategy.p],
                                      BYTES_PER_PARAM * params / t, gs)
            if strategy.g is not Level.N:
                dp[k] += n * coll("dp", Op.REDUCE_SCATTER, LEVEL_SCOPE[strategy.g],
                                  BYTES_PER_GRAD * params * r / t, gs)
        if vs < last_vs:
            nxt = (vs + 1) % p
            p2p[k] += coll("p2p", Op.ALL_GATHER, Scope.GLOBAL, msg, lay.pairs(k, nxt))
            if not sp and t > 1:
                p2p[k] += coll("tp", Op.ALL_GATHER, Scope.GLOBAL, tp_size,
                               lay.tp_scopes(nxt), tp_algo)
        if vs > 0:
            prv = (vs - 1) % p
            p2p[k] += coll("p2p", Op.ALL_GATHER, Scope.GLOBAL, msg, lay.pairs(k, prv))
            if not sp and t > 1:
                p2p[k] += coll("tp", Op.ALL_GATHER, Scope.GLOBAL, tp_size,
                               lay.tp_scopes(prv), tp_algo)
    sparams = stage_params(model, par)
    fp8p = stage_fp8_params(model, par)
    dpo = par.dp_comm_overlap
    for k in range(p):
        gs = lay.dp_scopes(k)
        full = BYTES_PER_GRAD * sparams[k] * r
        sizes = {"full": full, "shard": full / lay.m_dp}
        for op, scope, size in () if dpo else SYNC_GRAD[(strategy.g, strategy.os)]:
            bound[k] += coll("dp", op, scope, sizes[size], gs)
        d_os = strategy.os.divisor(lay.d, lay.m_dp)
        opt[k] = optimizer_seconds_3d(sparams[k] * r, d_os, cluster, training, fp8p[k])
        bound[k] += opt[k]
        for op, scope, size in () if dpo else SYNC_PARAM.get((strategy.os, strategy.p), ()):
            bound[k] += coll("dp", op, scope, sizes[size], gs)
    if not dpo:
        return _combine(busy, comp, dp, p2p, bound, opt, 1, training.accum_steps, p, v,
                        f=overlap_slowdown)
    # DP communication overlap: the same bucket chains as build_plan_3d / evaluate_3d
    check_dp_overlap(strategy, par)
    buckets = dp_buckets(model, par, lay.d)

    def unit_busy(k: int, kind: str, phase: str) -> float:
        if ks is not None:
            sec = ks[(kind, phase)]
            if phase == "bwd" and kind == "layer" and rcf:
                sec += ks[("layer", "recompute")]
        else:
            sec = compute_seconds(flops[(kind, phase)] / t, cluster, training)
            if phase == "bwd" and kind == "layer" and rcf:
                sec += compute_seconds(rcf / t, cluster, training)
        sec += tp_time(k, kind, phase)
        if phase == "bwd" and recompute and kind == "layer":
            sec += tp_time(k, kind, "recompute")
        if kind == "layer" and par.cp > 1:
            sec += cp_time(k, phase)[1]
            if phase == "bwd":
                sec += cp_time(k, "recompute")[1]
        return sec

    def sync(k: int, us: list, table) -> float:
        full = BYTES_PER_GRAD * sum(u.params for u in us) * r / t
        sizes = {"full": full, "shard": full / lay.m_dp}
        return sum(coll("dp", op, scope, sizes[size], lay.dp_scopes(k))
                   for op, scope, size in table)

    gsync = SYNC_GRAD[(strategy.g, strategy.os)]
    psync = SYNC_PARAM.get((strategy.os, strategy.p), ())
    gb: dict[tuple[int, int], tuple[float, float]] = {}
    pchains = []
    for vs, us in enumerate(units):
        k = vs % p
        for bi, bucket in enumerate(buckets[vs]):
            bus = [us[i] for i in bucket]
            gb[(vs, bi)] = (sum(unit_busy(k, u.kind, "bwd") for u in bus), sync(k, bus, gsync))
        if psync:
            pchains.append([(sync(k, [us[i] for i in buckets[vs][bi]], psync),
                             sum(unit_busy(k, us[i].kind, "fwd") for i in buckets[vs][bi]))
                            for bi in range(len(buckets[vs]) - 1, -1, -1)])
    chains = []
    for k in range(p):
        chain = []
        for ci, c in enumerate(reversed(range(v))):
            vs = k + c * p
            ents = [gb[(vs, bi)] for bi in range(len(buckets[vs]))]
            if ci > 0:
                chain.append(((p - 1) * sum(w for w, _ in ents), 0.0, False))
            chain += [(w, x, True) for w, x in ents]
        chains.append(chain)
    for k, x in enumerate(dp_overlap_bound(chains, overlap_slowdown)):
        bound[k] += x
    pre = param_fill_exposed(pchains, p, v, overlap_slowdown) if pchains else 0.0
    return _combine(busy, comp, dp, p2p, bound, opt, 1, training.accum_steps, p, v, pre,
                    f=overlap_slowdown)


def _combine(busy, comp, dp, p2p, bound, opt, m_plan, m, p, v, pre=None,
             f: float = 1.0) -> Analytic3D:
    """The pipeline formula of :func:`evaluate_3d` on per-stage sums over m_plan
    micro-batches. ``compute_s`` is the busiest stage's compute ops over the step, its
    optimizer step included (as the engine's busiest compute stream and the
    data-parallel path count it)."""
    from .analytic import overlapped_time

    # PaRO micro-step collectives beside the stage's busy time, which runs at 1/f meanwhile
    per = [overlapped_time(busy[k], dp[k], f) / m_plan for k in range(p)]
    t_max, t_mean = max(per), sum(per) / p
    hop = sum(p2p) / m_plan / (p * v - 1) if p * v > 1 else 0.0
    bubble = (p - 1) * t_mean / v
    pipeline = m * t_max + bubble + (p - 1) * hop
    boundary = max(bound)
    if pre is not None:   # DP communication overlap: the first forwards' exposed gathers
        boundary += pre
    compute = max(m * comp[k] / m_plan + opt[k] for k in range(p))
    return Analytic3D(pipeline + boundary, pipeline, bubble, boundary, compute, tuple(per))


# -- one step ----------------------------------------------------------------------------

@dataclass(frozen=True)
class PipelinePhase:
    """What a replay of a 3D plan measured (seconds), as :class:`Analytic3D` states it in
    closed form (docs/parallelism.md, "Bubble and exposed communication").

    ``pipeline_s``: the pipeline phase, from the first micro-batch op to the last one over
    all stages (the accumulation boundary follows it). ``stage_busy_s``: per stage, the time
    its compute stream runs micro-batch work (compute ops and the TP / CP collectives on that
    stream). ``compute_s``: the busiest stage's compute ops over the step, its optimizer
    step included."""

    pipeline_s: float
    stage_busy_s: tuple[float, ...]
    compute_s: float
    pp: int
    virtual: int
    micro_batches: int

    @property
    def bubble_s(self) -> float:
        """The pipeline's fill and drain: (p - 1) / v x the mean over stages of one
        micro-batch's busy time (0 with p = 1). Idle time from stage imbalance or waiting
        for communication is not bubble: it is exposed communication or the busiest
        stage's own time."""
        if self.pp <= 1 or not self.stage_busy_s:
            return 0.0
        mean = sum(self.stage_busy_s) / len(self.stage_busy_s) / self.micro_batches
        return (self.pp - 1) * mean / self.virtual

    @property
    def bubble_fraction(self) -> float:
        """``bubble_s`` / ``pipeline_s``."""
        return self.bubble_s / self.pipeline_s if self.pipeline_s > 0 else 0.0

    def exposed_comm_s(self, step_s: float) -> float:
        """``step - compute_s - bubble_s`` (>= 0)."""
        return max(0.0, step_s - self.compute_s - self.bubble_s)


_BOUNDARY_KINDS = ("optimizer", "sync-grad", "sync-param")
_COMPUTE_KINDS = ("fwd", "bwd", "recompute", "head-fwd", "head-bwd", "embed-fwd", "embed-bwd",
                  "optimizer")


def pipeline_phase(plan: Plan3D, spans, stage_compute_s=None,
                   stage_busy_s=None) -> PipelinePhase:
    """The :class:`PipelinePhase` of a replay from its ``spans``: (stream, kind, start s,
    end s) of the ops (the engine's records). ``stage_compute_s`` / ``stage_busy_s``: per
    stage, measured otherwise (per-rank timelines: the mean over the stage's ranks)."""
    busy = [0.0] * plan.pp
    comp = [0.0] * plan.pp
    lo, hi = math.inf, 0.0
    for stream, kind, start, end in spans:
        if not stream.startswith("compute/"):
            continue
        k = int(stream.rsplit("/s", 1)[1])
        if kind in _COMPUTE_KINDS:
            comp[k] += end - start
        if kind not in _BOUNDARY_KINDS:
            busy[k] += end - start
            lo, hi = min(lo, start), max(hi, end)
    if stage_compute_s is not None:
        comp = list(stage_compute_s)
    if stage_busy_s is not None:
        busy = list(stage_busy_s)
    return PipelinePhase(hi - lo if hi > lo else 0.0, tuple(busy), max(comp, default=0.0),
                         plan.pp, plan.virtual, plan.accum_steps)


def check_runtime_3d(rt, strategy: Strategy, par: ParallelSpec) -> None:
    """Refuse, with one line, a runtime profile whose schedule has no meaning on the 3D
    planner. A framework profile (DeepSpeed, FSDP, PaRO's fork) shapes the per-micro-step
    parameter gathers and gradient reductions (prefetch, buckets, overlap, persistence): on
    TP / PP layouts parosim models only strategies that have none (parameters and gradients
    whole during the micro-steps: p = N, g = N, as DeepSpeed's pipeline engine requires,
    ZeRO-0 / ZeRO-1), with the profile's boundary buckets, per-call algorithm, compute
    slowdown, attention kernel and logit bytes (docs/parallelism.md, "Runtime profiles")."""
    if rt.is_ideal:
        return
    if strategy.p is not Level.N or strategy.g is not Level.N:
        fits = ", ".join(rt.label(s) for s, _ in rt.stages if s[:2] == "NN") or "NNN, NNI, NNG"
        raise InputError(f"--runtime {rt.name} with --tp / --pp / --cp models strategies "
                         "whose parameters and gradients stay whole during the micro-steps "
                         f"(p = N, g = N: {fits}); got --strategy {rt.label(strategy.short)}")
    if par.cp > 1:
        raise InputError(f"--runtime {rt.name}: context parallelism is Megatron-Core / "
                         "Transformer Engine's, not this framework's; --tp / --pp / --cp / "
                         "--sequence-parallel with a runtime profile expect --cp 1")
    if rt.grad_sync_every_micro_step:
        raise InputError(f"--runtime {rt.name} synchronises gradients every micro-step "
                         "(grad_sync_every_micro_step), which is not modelled with --tp / "
                         "--pp / --cp; expected another runtime or no --tp / --pp / --cp")
    if par.dp_comm_overlap:
        raise InputError(f"--dp-comm-overlap models Megatron-Core's DDP buckets, not "
                         f"--runtime {rt.name}'s; expected one of them")


def training_for_runtime_3d(training: TrainingSpec, rt) -> TrainingSpec:
    """A runtime profile's memory settings on the 3D planner: its attention kernel and logit
    bytes where ``training`` leaves them unset. Its ``memory_model`` is not taken: with TP /
    PP the layers are Megatron's, whose activations the Korthikanti et al. estimate counts
    (an explicit ``--memory-model runtime`` is refused). The ideal profile: unchanged."""
    if rt.is_ideal:
        return training
    return replace(training, attention=training.attention or rt.attention,
                   logit_bytes=(training.logit_bytes if training.logit_bytes is not None
                                else rt.logit_bytes))


def check_supported(cluster: ClusterSpec, training: TrainingSpec,
                    algo: Algo | None = None) -> None:
    """Refuse, with one line, what the TP/PP model does not honour (never a silent answer)."""
    flags = "--tp / --pp / --sequence-parallel / --recompute selective"
    if (training.memory_model or "korthikanti") != "korthikanti":
        raise InputError(f"{flags} use the Korthikanti et al. memory estimate; expected no "
                         "--memory-model runtime with them")
