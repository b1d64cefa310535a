"""3D parallelism (TP x PP x DP with PaRO on the DP group): the Plan, memory, analytic, step.

The layout (ranks, groups, their lowering) is :mod:`parosim.plan.layout`; this module builds one
global step of one job as a :class:`Plan3D` (a :class:`parosim.plan.Plan` whose ops carry
their group set), replayed by the same engine (:func:`parosim.evaluate.replay.replay`), and costs it in
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
* **Compute** per unit and micro-batch: the FLOPs of :mod:`parosim.cost.compute` divided by t, at
  the same efficiency (flat model), or the kernels of :mod:`parosim.cost.kernels` on the rank's
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
from functools import lru_cache

from ..collectives.types import Algo, Op, Scope, parse_enum
from ..cost.compute import (
    ADAM_BYTES_PER_PARAM,
    head_backward_flops,
    head_forward_flops,
    layer_backward_flops,
    layer_forward_flops,
    step_flops,
)
from ..cost.memory import (
    MARGIN_FRACTION,
    RUNTIME_RESERVE_BYTES,
    MemoryBreakdown,
    fp8_weight_cache_bytes,
)
from ..errors import InputError
from ..spec.model import ModelSpec
from ..spec.strategy import Level, Strategy, model_states_bytes, parse_strategy
from ..spec.system import ClusterSpec
from ..spec.training import (
    BYTES_PER_ACTIVATION,
    BYTES_PER_GRAD,
    BYTES_PER_OPTIM_STATE,
    BYTES_PER_PARAM,
    TrainingSpec,
)
from .dataparallel import SYNC_GRAD, SYNC_PARAM, CollectiveOp, ComputeOp, Plan
from .layout import (
    GroupScopes,
    Layout,
    PairSet,
    ParallelSpec,
    layout_for,
    lower_group,
    lower_p2p,
)

_LEVEL_SCOPE = {Level.I: Scope.INTRA, Level.G: Scope.GLOBAL}


# -- ops and plan ------------------------------------------------------------------------

@dataclass(frozen=True)
class GroupOp(CollectiveOp):
    """A collective (or point-to-point transfer) over a set of groups of one stage.

    ``group``: ``"tp"``, ``"dp"`` or ``"p2p"``; ``count``: identical collectives back to back
    (the engine moves count x the bytes and pays count x the latency and overheads);
    ``scopes``: the :class:`~parosim.plan.layout.GroupScopes` (or the
    :class:`~parosim.plan.layout.PairSet`); the inherited ``algo``, when set, overrides the
    step's algorithm (TP groups inside a node: ring); ``pair``: with TP communication
    overlap, the id of the GEMM compute op this collective runs beside (stream
    ``tp-ovl/s{k}``), else -1.
    """

    stage: int = 0
    group: str = "dp"
    count: int = 1
    scopes: GroupScopes | PairSet | None = None
    pair: int = -1       # TP communication overlap: the id of the GEMM this op runs beside

    def lower(self, spec: ClusterSpec, algo: Algo):
        """The lowered :class:`~parosim.collectives.types.Program` (one collective)."""
        if self.group == "p2p":
            return lower_p2p(self.scopes, self.size_bytes)
        return lower_group(spec, self.op, self.scope, self.size_bytes, self.algo or algo,
                           self.scopes)

    @property
    def cache_key(self) -> tuple:
        return (self.group, self.stage, self.op, self.scope, self.size_bytes, self.algo,
                self.scopes.label if isinstance(self.scopes, PairSet) else None)


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

    def overlap_gates(self) -> tuple[tuple[int, ...], ...]:
        """Per op, the pipeline stages whose GPUs run it: the engine's overlap-interference
        gates (:func:`parosim.evaluate.replay.replay`). A compute op on ``compute/s{k}`` runs on
        every GPU of stage k; a collective involves the stages of its participating ranks
        (a TP or DP collective: its own stage; a point-to-point transfer: both ends). Ranks
        are ``tp + t·(dp + d·stage)`` (:class:`parosim.plan.layout.Layout`), so a rank's stage
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


@dataclass(frozen=True)
class _Unit:
    label: str
    kind: str            # "embed", "layer", "head"
    params: int          # whole-model parameters of the unit (split by t per GPU)


def chunk_units(model: ModelSpec, par: ParallelSpec) -> list[list[_Unit]]:
    """Units of every virtual stage (chunk c of stage k is index c·p + k)."""
    return _chunk_units(model, par.pp, par.virtual)


@lru_cache(maxsize=512)
def _chunk_units(model: ModelSpec, pp: int, virtual: int) -> list[list[_Unit]]:
    model.require_shape("a pipeline plan")
    par = ParallelSpec(pp=pp, schedule="interleaved" if virtual > 1 else "1f1b",
                       virtual=virtual)
    chunks = par.chunks
    if model.layers % chunks:
        raise InputError(f"model {model.name!r} has {model.layers} layers, not divisible "
                         f"into --pp {par.pp} x {par.virtual} virtual stage(s) = {chunks} "
                         "equal chunks; expected a pipeline degree (x chunks) that divides "
                         "the layer count")
    per = model.layers // chunks
    out = []
    for vs in range(chunks):
        units = [_Unit(f"L{i}", "layer", model.layer_params)
                 for i in range(vs * per, (vs + 1) * per)]
        if vs == 0:
            units.insert(0, _Unit("embed", "embed", model.embedding_params))
        if vs == chunks - 1:
            head = model.head_params
            if getattr(model, "tied_embeddings", False) and pp > 1:
                head += model.vocab * model.hidden   # Megatron's copy on the last stage
            units.append(_Unit("head", "head", head))
        out.append(units)
    return out


def stage_params(model: ModelSpec, par: ParallelSpec) -> list[float]:
    """Parameters each GPU of stage k holds before DP sharding: Σ its units / t."""
    units = chunk_units(model, par)
    out = [0.0] * par.pp
    for vs, us in enumerate(units):
        out[vs % par.pp] += sum(u.params for u in us) / par.tp
    return out


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


# Transformer Engine userbuffers defaults (``initialize_ub`` in
# transformer_engine/pytorch/module/base.py, TE commit 0004dbd0231cb02d7b47d45344900a494fa13f46):
# ring-exchange for qkv_fprop, fc1_fprop, proj_dgrad, fc2_dgrad (one chunk per TP rank);
# "pipeline" with num_splits = 4 for proj_fprop, fc2_fprop; "bulk" (no split) for the
# qkv / fc1 dgrad and wgrad overlaps.
UB_PIPELINE_SPLITS = 4
# initialize_ub registers one userbuffer per name above (4 ring-exchange + 2 pipeline + 4 bulk),
# each of the sample shape Megatron passes, (s·b, h), in bf16: 10 x 2·s·b·h bytes per GPU.
# With FP8 training the buffers of qkv_fprop, qkv_dgrad, proj_dgrad, fc1_fprop, fc1_dgrad and
# fc2_dgrad (its ``fp8_buf`` list) hold fp8 (1 byte): the ring-exchange all-gathers move fp8.
UB_BUFFERS = 10
UB_FP8_BUFFERS = 6


def _fp8(training: TrainingSpec) -> bool:
    """FP8 training (``TrainingSpec.precision``, where the FP8 model is present)."""
    return getattr(training, "precision", "bf16") == "fp8"


def userbuffer_bytes(training: TrainingSpec, hidden: int) -> float:
    """Bytes per GPU of Transformer Engine's userbuffers (TP communication overlap)."""
    tokens = training.seq_len * training.micro_batch
    if _fp8(training):
        return (UB_FP8_BUFFERS + BYTES_PER_ACTIVATION * (UB_BUFFERS - UB_FP8_BUFFERS)) \
            * tokens * hidden
    return UB_BUFFERS * BYTES_PER_ACTIVATION * tokens * hidden


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
    from ..cost.compute import compute_model, compute_seconds
    from ..cost.kernels import gemm_seconds, layer_gemm_shapes

    t, r = par.tp, training.trainable_ratio
    tokens = training.micro_batch * training.seq_len
    kernel = compute_model(cluster, training) == "kernel"
    gpu, prof = cluster.gpu, cluster.compute
    peak8 = 0.0
    if _fp8(training):
        # the FP8 model (refuses a GPU without FP8)
        from ..cost.compute import fp8_peak_flops

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
    "recompute")``), the layer split by ``par.tp`` as :func:`parosim.cost.kernels.layer_times`
    (column/row-parallel GEMMs, heads / t, memory-bound kernels on the local shard, or on
    tokens / t with sequence parallelism). Recomputation: full = the layer's forward;
    selective = its attention forward (Korthikanti et al. 2022 §5). ``None`` under the flat
    model (FLOPs / t at ``--efficiency``, as before), except with ``precision = "fp8"``:
    then the flat model's seconds with the weight-GEMM FLOPs at the FP8 peak
    (:func:`parosim.cost.compute.flat_layer_seconds`). Under fp8 the kernel model runs the layer's
    weight GEMMs at the FP8 peak, with the casts (:func:`parosim.cost.kernels.layer_times`)."""
    from ..cost.compute import (
        compute_model,
        compute_seconds,
        flat_layer_seconds,
        fp8_peak_flops,
    )
    from ..cost.kernels import embed_times, head_times, layer_times

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


def check_cp(cluster: ClusterSpec, training: TrainingSpec, par: ParallelSpec) -> None:
    """Refuse, with one line, a CP degree the model cannot honour."""
    cp = par.cp
    if cp == 1:
        return
    n, t, p = cluster.gpus, par.tp, par.pp
    if n % (t * cp * p):
        raise InputError(f"--tp {t} x --cp {cp} x --pp {p} = {t * cp * p} does not divide the "
                         f"{n} GPUs of cluster {cluster.name!r}; expected a divisor of {n}")
    if training.attention == "eager":
        raise InputError(f"--cp {cp} needs --attention flash (Transformer Engine runs context "
                         "parallelism only with its flash / fused attention); got --attention "
                         "eager")
    s = training.seq_len
    if s % (2 * cp):
        raise InputError(f"--cp {cp} needs --seq-len divisible by 2 x cp = {2 * cp} (the "
                         f"load-balanced split into 2·cp chunks); got --seq-len {s}")


def cp_local(training: TrainingSpec, par: ParallelSpec) -> TrainingSpec:
    """The training one CP rank runs: s/cp tokens per sequence, flash attention (cp = 1:
    unchanged)."""
    if par.cp == 1:
        return training
    if training.seq_len % (2 * par.cp):
        raise InputError(f"--cp {par.cp} needs --seq-len divisible by 2 x cp = {2 * par.cp}; "
                         f"got --seq-len {training.seq_len}")
    # TE's CP runs only with flash / fused attention (no s x s scores kept): an unset
    # attention is flash here (an explicit eager is refused by check_cp)
    return replace(training, seq_len=training.seq_len // par.cp,
                   attention=training.attention or "flash")


def cp_kv_bytes(model: ModelSpec, local: TrainingSpec, par: ParallelSpec) -> float:
    """Bytes of one K/V ring message per rank: K and V of the local s/cp tokens on this TP
    rank, bf16: ``2 · b · (s/cp) · kv_dim/t · 2`` (kv_dim = kv_heads·head_dim; a TP degree
    above kv_heads keeps one replicated K/V head per rank, as Megatron)."""
    kv = model.kv_dim / par.tp if model.kv_dim >= par.tp * model.head_dim else model.head_dim
    return 2.0 * local.micro_batch * local.seq_len * kv * BYTES_PER_ACTIVATION


def cp_attention_step(model: ModelSpec, cluster: ClusterSpec, local: TrainingSpec,
                      par: ParallelSpec, ks) -> tuple[float, float, float, float]:
    """(forward s, backward s, forward FLOPs, backward FLOPs) of one CP attention step on one
    rank: the attention core of s/cp local tokens (the layer model's attention of the
    local training; ``ks``: :func:`unit_seconds`, None for the flat model)."""
    from ..cost.compute import compute_seconds, layer_attention_flops_per_token

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
    model's ``hbm_efficiency``, as :func:`parosim.cost.compute.optimizer_step_seconds`).
    ``fp8_params``: the stage's fp8-GEMM weights on this rank (:func:`stage_fp8_params`),
    re-cast once per step under ``precision = "fp8"``
    (:func:`parosim.cost.compute.fp8_weight_cast_seconds`)."""
    from ..cost.compute import compute_model, fp8_weight_cast_seconds

    bw = cluster.gpu.hbm_bandwidth_Bps
    if compute_model(cluster, training) == "kernel":
        bw *= cluster.compute.hbm_efficiency
    adam = ADAM_BYTES_PER_PARAM * trainable_params / d_os / bw
    if training.precision != "fp8":
        return adam
    return adam + fp8_weight_cast_seconds(fp8_params, training.trainable_ratio, cluster,
                                          training)


def stage_fp8_params(model: ModelSpec, par: ParallelSpec) -> list[float]:
    """Per pipeline stage, the decoder-layer GEMM weights one rank holds (split by t): the
    weights that run in FP8 and are cached in fp8 under ``precision = "fp8"``."""
    from ..cost.compute import layer_fp8_params

    per = layer_fp8_params(model) / par.tp
    out = [0.0] * par.pp
    for vs, us in enumerate(chunk_units(model, par)):
        out[vs % par.pp] += per * sum(1 for u in us if u.kind == "layer")
    return out


def recompute_flops(model: ModelSpec, training: TrainingSpec, full: bool,
                    selective: bool) -> float:
    """FLOPs recomputed before one layer's backward (whole layer, before the TP split)."""
    from ..cost.compute import layer_attention_flops_per_token

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


class _Builder:
    def __init__(self) -> None:
        self.ops: list = []
        self.last: dict[str, int] = {}

    def _add(self, op) -> int:
        self.ops.append(op)
        self.last[op.stream] = op.id
        return op.id

    def compute(self, name, kind, layer, mb, flops, seconds, stream, deps) -> int:
        return self._add(ComputeOp(len(self.ops), name, kind, layer, mb, flops, seconds,
                                   stream, _deps(deps)))

    def coll(self, name, op, scope, size, purpose, layer, mb, stream, deps, *, stage, group,
             scopes, count=1, algo=None, pair=-1) -> int | None:
        k = 2 if group == "p2p" else scopes.size(scope)
        if k <= 1 or size <= 0 or count < 1:
            return None
        return self._add(GroupOp(len(self.ops), name, op, scope, float(size), purpose, layer,
                                 mb, stream, _deps(deps), algo=algo, stage=stage, group=group,
                                 count=count, scopes=scopes, pair=pair))


def _deps(deps) -> tuple[int, ...]:
    return tuple(sorted({d for d in deps if d is not None}))


def resolve_recompute_3d(model: ModelSpec, strategy: Strategy, cluster: ClusterSpec,
                         training: TrainingSpec, par: ParallelSpec) -> bool:
    """Full recomputation: as set, or auto (None): on iff it does not fit without."""
    if training.recompute is not None:
        return training.recompute
    return not _memory(model, strategy, cluster, training, par, False).fits


def build_plan_3d(model: ModelSpec, strategy: Strategy | str, cluster: ClusterSpec,
                  training: TrainingSpec, par: ParallelSpec) -> Plan3D:
    """The op list of one global step of a TP x PP x DP job (module docstring).

    ``training.micro_batch`` is per DP replica and ``training.accum_steps`` is m, the
    micro-batches each replica's pipeline runs per step.
    """
    from ..cost.compute import compute_seconds

    strategy = parse_strategy(strategy)
    check_cp(cluster, training, par)
    orig, training = training, cp_local(training, par)   # one CP rank: s/cp tokens
    lay = layout_for(cluster, par.tp, par.pp)
    p, t, v = par.pp, par.tp, par.virtual
    m = training.accum_steps
    r = training.trainable_ratio
    sp = par.sequence_parallel
    recompute = resolve_recompute_3d(model, strategy, cluster, training, par)
    rc_flops = recompute_flops(model, training, recompute, par.selective_recompute)
    units = chunk_units(model, par)
    last_vs = len(units) - 1
    ks = unit_seconds(model, cluster, training, par, recompute)   # None: flat model
    b = _Builder()
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
            b.coll(f"tp {op.value} {phase} {label} mb{mb}", op, Scope.GLOBAL, tp_size, "tp",
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
                            n * c * sec, cs, [])
            cid = b.coll(f"cp ring{i} {phase} {label} mb{mb}", Op.ALL_GATHER, Scope.GLOBAL,
                         size, "cp-ring", None, mb, f"tp-ovl/s{k}", [pre], stage=k,
                         group="p2p", scopes=lay.cp_ring(k, par.cp), count=n * c, pair=gid)
            b.compute(f"cp wait{i} {label} mb{mb}", "cp-wait", None, mb, 0.0, 0.0, cs, [cid])

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
                            n * pr.gemm_flops, n * pr.gemm_s, cs, [])
            size = tp_size * pr.size_scale
            cid = b.coll(f"tp {pr.op.value} {pr.name} {label} mb{mb}", pr.op, Scope.GLOBAL,
                         size, "tp-overlap", None, mb, f"tp-ovl/s{k}", [pre], stage=k,
                         group="tp", scopes=lay.tp_scopes(k), count=n, algo=tp_algo, pair=gid)
            if pr.chunks:
                b.coll(f"tp {pr.op.value} chunk {pr.name} {label} mb{mb}", pr.op,
                       Scope.GLOBAL, size / pr.chunks, "tp-chunk", None, mb, cs, [cid],
                       stage=k, group="tp", scopes=lay.tp_scopes(k), count=n, algo=tp_algo)
            else:
                b.compute(f"tp-overlap wait {pr.name} {label} mb{mb}", "tp-wait", None, mb,
                          0.0, 0.0, cs, [cid])

    def gather(k: int, u: _Unit, phase: str, mb: int) -> int | None:
        if strategy.p is Level.N:
            return None
        d = done[k]
        return b.coll(f"ag-param {phase} {u.label} mb{mb}", Op.ALL_GATHER,
                      _LEVEL_SCOPE[strategy.p], BYTES_PER_PARAM * u.params / t,
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
            cid = b.coll(f"{purpose} {op.value} {scope.value} c{vs} b{bi}", op, scope,
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
            b.compute(f"fwd c{vs} b{bi} mb{mb}", "fwd", None, mb, f_r, s_r, cs,
                      [first, g[-1] if g else None])
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
                          cs, first)
                if recompute:
                    overlap_ops(k, "recompute", mb, f"c{vs}b{bi}", nl, "recompute")
                    tp_ops(k, kinds, "recompute", mb, f"c{vs}b{bi}")
                cp_ops(k, "recompute", mb, f"c{vs}b{bi}", nl, "recompute")
                first = []
            f = sum(unit_flops(model, training, u.kind, "bwd") for u in us) / t
            f_r, s_r = rest("bwd", nl, f, secs(f, kinds, "bwd"))
            b.compute(f"bwd c{vs} b{bi} mb{mb}", "bwd", None, mb, f_r, s_r, cs, first)
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
            b.compute(f"fwd c{vs} mb{mb}", "fwd", None, mb, f_r, s_r, cs, [dep0])
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
                b.compute(f"fwd {u.label} mb{mb}", kind, None, mb, f_r, s_r, cs,
                          [g, dep0 if j == 0 else None])
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
        sid = b.coll(f"send {what} c{vs} mb{mb}", Op.ALL_GATHER, Scope.GLOBAL, msg,
                     f"p2p-{what}", None, mb, f"p2p-{way}/s{k}", [after], stage=k,
                     group="p2p", scopes=lay.pairs(k, peer))
        if not sp and t > 1:
            sid = b.coll(f"tp all-gather {what} c{to_vs} mb{mb}", Op.ALL_GATHER,
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
                b.compute(f"recompute c{vs} mb{mb}", "recompute", None, mb, f, s_rc, cs,
                          first)
                if recompute:
                    overlap_ops(k, "recompute", mb, f"c{vs}", nl, "recompute")
                    tp_ops(k, [u.kind for u in us], "recompute", mb, f"c{vs}")
                cp_ops(k, "recompute", mb, f"c{vs}", nl, "recompute")
                first = []
            f = sum(unit_flops(model, training, u.kind, "bwd") for u in us) / t
            f_r, s_r = rest("bwd", nl, f, secs(f, [u.kind for u in us], "bwd"))
            b.compute(f"bwd c{vs} mb{mb}", "bwd", None, mb, f_r, s_r, cs, first)
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
                              cs, [g, *first])
                    if recompute:
                        overlap_ops(k, "recompute", mb, u.label, nl, "recompute")
                        tp_ops(k, ["layer"], "recompute", mb, u.label)
                    cp_ops(k, "recompute", mb, u.label, nl, "recompute")
                    first = []
                f = unit_flops(model, training, u.kind, "bwd") / t
                kind = {"layer": "bwd", "head": "head-bwd", "embed": "embed-bwd"}[u.kind]
                f_r, s_r = rest("bwd", nl, f, secs(f, [u.kind], "bwd"))
                b.compute(f"bwd {u.label} mb{mb}", kind, None, mb, f_r, s_r, cs, [g, *first])
                overlap_ops(k, "bwd", mb, u.label, nl, kind)
                cp_ops(k, "bwd", mb, u.label, nl, kind)
                cid = b.last[cs]
                done[k].append(cid)
                tp_ops(k, [u.kind], "bwd", mb, u.label)
                if strategy.g is not Level.N:
                    b.coll(f"rs-grad {u.label} mb{mb}", Op.REDUCE_SCATTER,
                           _LEVEL_SCOPE[strategy.g], BYTES_PER_GRAD * u.params * r / t,
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
        _boundary(b, k, strategy, lay, sparams[k] * r, cluster, training, fp8p[k], dpo)
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
                  hardware_flops_per_gpu=hw,
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


def _boundary(b: _Builder, k: int, strategy: Strategy, lay: Layout, trainable: float,
              cluster: ClusterSpec, training: TrainingSpec, fp8_params: float = 0.0,
              dp_overlap: bool = False) -> None:
    """Per stage: t_sync_g, the optimizer step, t_sync_p (:mod:`parosim.plan` tables). With
    DP communication overlap the syncs are the buckets' (in the last backward, the first
    forward): only the optimizer step stays here."""
    full = BYTES_PER_GRAD * trainable
    sizes = {"full": full, "shard": full / lay.m_dp}
    gs = lay.dp_scopes(k)
    deps = [b.last.get(f"compute/s{k}"), b.last.get(f"comm-grad/s{k}")]
    for op, scope, size in () if dp_overlap else SYNC_GRAD[(strategy.g, strategy.os)]:
        cid = b.coll(f"sync-grad {op.value} {scope.value} s{k}", op, scope, sizes[size],
                     "sync-grad", None, None, f"comm-grad/s{k}", deps, stage=k, group="dp",
                     scopes=gs)
        deps = [cid] if cid is not None else deps
    d_os = strategy.os.divisor(lay.d, lay.m_dp)
    opt_s = optimizer_seconds_3d(trainable, d_os, cluster, training, fp8_params)
    deps = [b.compute(f"optimizer step s{k}", "optimizer", None, None, 0.0, opt_s,
                      f"compute/s{k}", deps)]
    for op, scope, size in () if dp_overlap else SYNC_PARAM.get((strategy.os, strategy.p),
                                                                 ()):
        cid = b.coll(f"sync-param {op.value} {scope.value} s{k}", op, scope, sizes[size],
                     "sync-param", None, None, f"comm-param/s{k}", deps, stage=k,
                     group="dp", scopes=gs)
        deps = [cid] if cid is not None else deps


# -- memory ------------------------------------------------------------------------------

def layer_activation_bytes_3d(model: ModelSpec, training: TrainingSpec, tp: int, sp: bool,
                              selective: bool) -> float:
    """Activation bytes of one layer for one micro-batch (Korthikanti et al. 2022, Table 2):

    no recompute: ``sbh(10 + 24/t + 5as/(ht))``; with SP ``sbh/t (34 + 5as/h)``;
    selective: ``sbh(10 + 24/t)``; with SP ``34 sbh/t``.

    >>> from parosim.spec.model import preset
    >>> m, tr = preset("llama-7b"), TrainingSpec(micro_batch=1, seq_len=2048)
    >>> from parosim.cost.memory import layer_activation_bytes
    >>> layer_activation_bytes_3d(m, tr, 1, False, False) == layer_activation_bytes(m, 1, 2048)
    True
    """
    if training.precision == "fp8":   # Transformer Engine keeps fp8 GEMM inputs
        from ..cost.fp8mem import fp8_layer_activation_bytes

        return fp8_layer_activation_bytes(model, training, tp, sp, selective)
    if training.hidden_dropout is not None:   # bf16, explicit dropout: masks only if > 0
        from ..cost.fp8mem import korthikanti_mask_bytes

        return (layer_activation_bytes_3d(model, replace(training, hidden_dropout=None), tp,
                                          sp, selective)
                - korthikanti_mask_bytes(model, training, tp, sp))
    s, b, h, a = training.seq_len, training.micro_batch, model.hidden, model.heads
    # selective recomputation and FlashAttention both keep no s x s attention matrices;
    # FlashAttention keeps its fp32 log-sum-exp, 4·b·a·s (split over the heads of the group)
    attn = 0.0 if selective or training.attention == "flash" else 5 * a * s / h
    lse = 4 * b * a * s / tp if training.attention == "flash" and not selective else 0.0
    if sp:
        return s * b * h * (34 + attn) / tp + lse
    return s * b * h * (10 + 24 / tp + attn / tp) + lse


def in_flight(stage: int, par: ParallelSpec, m: int) -> int:
    """Chunk forwards whose activations stage ``stage`` holds at its peak (warm-up + 1)."""
    p, v = par.pp, par.virtual
    if v == 1:
        return min(p - stage, m)
    return min((p - stage - 1) * 2 + (v - 1) * p + 1, m * v)


@dataclass(frozen=True)
class StageMemory:
    stage: int
    breakdown: MemoryBreakdown


def _stage_memory(model: ModelSpec, strategy: Strategy, cluster: ClusterSpec,
                  training: TrainingSpec, par: ParallelSpec, recompute: bool,
                  lay: Layout) -> list[MemoryBreakdown]:
    t, sp = par.tp, par.sequence_parallel
    r = training.trainable_ratio
    units = chunk_units(model, par)
    per_chunk = model.layers // par.chunks
    s, b, h = training.seq_len, training.micro_batch, model.hidden
    full_layer = layer_activation_bytes_3d(model, training, t, sp, par.selective_recompute)
    no_rc_layer = layer_activation_bytes_3d(model, training, t, sp, False)
    kept = BYTES_PER_ACTIVATION * s * b * h / (t if sp else 1) if recompute else full_layer
    out = []
    cap = float(cluster.gpu.memory_bytes)
    fp8p = stage_fp8_params(model, par)
    for k in range(par.pp):
        mine = [us for vs, us in enumerate(units) if vs % par.pp == k]
        psi = sum(u.params for us in mine for u in us) / t
        states = model_states_bytes(strategy, psi, psi * r, lay.d, lay.m_dp)
        cache = fp8_weight_cache_bytes(model, training, fp8p[k])
        states += cache
        d_p, d_g, d_os = strategy.divisors(lay.d, lay.m_dp)
        fp8_w = fp8p[k] / d_p if training.fp8_params else 0.0   # 1 byte, not 2 (fp8mem)
        states -= fp8_w
        chunks = in_flight(k, par, training.accum_steps)
        acts = chunks * per_chunk * kept + (no_rc_layer if recompute else 0.0)
        if k == par.pp - 1:   # final norm + LM-head input and fp32 logits (vocab split by t)
            logit = training.logit_bytes or 4          # fp32 logits unless told otherwise
            acts += 4 * s * b * h / (t if sp else 1) + logit * s * b * model.vocab / t
        biggest = max(u.params for us in mine for u in us) / t
        bufs = 0.0
        if strategy.p is not Level.N:
            bufs += 2 * BYTES_PER_PARAM * biggest
        if strategy.g is not Level.N:
            bufs += 2 * BYTES_PER_GRAD * biggest * r
        if par.tp_comm_overlap:   # TE's userbuffers (docs/parallelism.md)
            bufs += userbuffer_bytes(training, h)
        if par.cp > 1:   # TE's CP backward: two [K/V, dK/dV] receive buffers (4 messages)
            bufs += 4 * cp_kv_bytes(model, training, par)
        margin = MARGIN_FRACTION * (states + acts + bufs) + RUNTIME_RESERVE_BYTES
        total = states + acts + bufs + margin
        out.append(MemoryBreakdown(
            model_states_bytes=states, activations_bytes=acts, buffers_bytes=bufs,
            margin_bytes=margin, total_bytes=total, capacity_bytes=cap, fits=total <= cap,
            shortfall_bytes=max(0.0, total - cap),
            params_bytes=BYTES_PER_PARAM * psi / d_p - fp8_w,
            grads_bytes=BYTES_PER_GRAD * psi * r / d_g,
            optimizer_bytes=BYTES_PER_OPTIM_STATE * psi * r / d_os, recompute=recompute,
            fp8_weight_cache_bytes=cache))
    return out


def _memory(model, strategy, cluster, training, par, recompute) -> MemoryBreakdown:
    lay = layout_for(cluster, par.tp, par.pp)
    stages = _stage_memory(model, strategy, cluster, training, par, recompute, lay)
    return max(stages, key=lambda mb: mb.total_bytes)


def memory_3d(model: ModelSpec, strategy: Strategy | str, cluster: ClusterSpec,
              training: TrainingSpec, par: ParallelSpec) -> MemoryBreakdown:
    """Bytes per GPU of the most loaded pipeline stage (docs/parallelism.md, "Memory")."""
    model.require_shape("memory with tensor or pipeline parallelism")
    if (training.memory_model or "korthikanti") != "korthikanti":
        raise InputError("--tp / --pp / --sequence-parallel / --recompute selective use the "
                         "Korthikanti et al. memory estimate; expected no --memory-model "
                         "runtime with them")
    strategy = parse_strategy(strategy)
    if training.precision == "fp8":   # refuses a GPU without FP8 (one line)
        from ..cost.compute import fp8_peak_flops

        fp8_peak_flops(cluster, training)
    check_cp(cluster, training, par)
    training = cp_local(training, par)   # one CP rank: s/cp tokens (Korthikanti, s -> s/cp)
    rc = resolve_recompute_3d(model, strategy, cluster, training, par)
    return _memory(model, strategy, cluster, training, par, rc)


def stage_memory_3d(model, strategy, cluster, training, par) -> list[MemoryBreakdown]:
    """Per-stage breakdowns (stage 0 first)."""
    strategy = parse_strategy(strategy)
    check_cp(cluster, training, par)
    training = cp_local(training, par)
    rc = resolve_recompute_3d(model, strategy, cluster, training, par)
    return _stage_memory(model, strategy, cluster, training, par, rc,
                         layout_for(cluster, par.tp, par.pp))


def max_micro_batch_3d(model, strategy, cluster, training, par, limit: int = 4096) -> int:
    """The largest micro-batch that fits (0 if 1 does not); memory grows with b."""
    def fits(b: int) -> bool:
        return memory_3d(model, strategy, cluster, training.with_micro_batch(b), par).fits

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


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
    with ``overlap_slowdown`` f = 1; :func:`parosim.evaluate.analytic.overlapped_time`); its exposed
    chunk is a TP op on the compute stream.

    DP communication overlap (``plan.dp_grad_chains``): each stage's boundary holds its
    exposed bucket reductions (:func:`dp_overlap_exposed`) instead of the syncs, and the
    exposed parameter gathers of the pipeline fill (:func:`param_fill_exposed`) are added.
    """
    from ..collectives.cost import program_time
    from ..evaluate.analytic import overlapped_time

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
    from ..collectives.cost import program_time
    from ..cost.compute import compute_seconds
    from ..evaluate.analytic import overlapped_time

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
                dp[k] += n * 2 * coll("dp", Op.ALL_GATHER, _LEVEL_SCOPE[strategy.p],
                                      BYTES_PER_PARAM * params / t, gs)
            if strategy.g is not Level.N:
                dp[k] += n * coll("dp", Op.REDUCE_SCATTER, _LEVEL_SCOPE[strategy.g],
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
    from ..evaluate.analytic import overlapped_time

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

def replay_3d(plan: Plan3D, spec: ClusterSpec, algo: Algo, overlap_slowdown: float = 1.0,
              trace: bool = False):
    """Engine replay of a 3D plan; returns (ReplayResult, bubble_fraction, records)."""
    from ..evaluate.replay import replay

    lay_period = layout_for(spec, plan.tp, plan.pp).symmetric_period(plan.cp)
    rep = replay(plan, spec, algo, overlap_slowdown, trace=True, period_nodes=lay_period)
    lanes: dict[str, float] = {}
    lo, hi = math.inf, 0.0
    for rec in rep.records:
        if rec.lane.startswith("compute/") and rec.kind not in ("optimizer", "sync-grad",
                                                                 "sync-param"):
            lanes[rec.lane] = lanes.get(rec.lane, 0.0) + rec.end_s - rec.start_s
            lo, hi = min(lo, rec.start_s), max(hi, rec.end_s)
    window = hi - lo if hi > lo else 0.0
    mean_busy = sum(lanes.values()) / plan.pp if lanes else 0.0
    bubble = 1.0 - mean_busy / window if window > 0 and plan.pp > 1 else 0.0
    comp = {}
    for rec in rep.records:
        if rec.lane.startswith("compute/") and rec.kind in ("fwd", "bwd", "recompute",
                                                            "head-fwd", "head-bwd",
                                                            "embed-fwd", "embed-bwd",
                                                            "optimizer"):
            comp[rec.lane] = comp.get(rec.lane, 0.0) + rec.end_s - rec.start_s
    busiest = max(comp.values(), default=0.0)
    records = rep.records if trace else []
    return rep, max(0.0, bubble), busiest, window, records


def check_supported(cluster: ClusterSpec, training: TrainingSpec, algo: Algo | None = None,
                    mode: str = "analytic") -> None:
    """Refuse, with one line, what the TP/PP model does not honour (never a silent answer)."""
    flags = "--tp / --pp / --sequence-parallel / --recompute selective"
    if (training.memory_model or "korthikanti") != "korthikanti":
        raise InputError(f"{flags} use the Korthikanti et al. memory estimate; expected no "
                         "--memory-model runtime with them")
    if cluster.compute_heterogeneous or cluster.jitter_cv > 0 or not cluster.closed_form_exact:
        raise InputError(f"{flags} assume identical GPUs and links; cluster "
                         f"{cluster.name!r} has overrides, jitter or ECMP hashing")
    if algo is not None and algo not in (Algo.RING, Algo.HIERARCHICAL, Algo.HO_RING):
        raise InputError(f"--algo {algo.value} is not modelled with {flags}; expected ring, "
                         "hierarchical or ho-ring")


def simulate_3d(model: ModelSpec, cluster: ClusterSpec, strategy: Strategy | str,
                training: TrainingSpec, par: ParallelSpec, algo: Algo | str = Algo.HO_RING,
                mode: str = "engine", trace: bool = False):
    """One global step of a TP x PP x DP job: a :class:`parosim.simulate.StepResult` with
    ``tp``, ``pp``, ``dp`` and ``bubble_fraction`` added (docs/parallelism.md)."""
    from ..simulate.step import MODES, StepResult

    strategy = parse_strategy(strategy)
    algo = algo if isinstance(algo, Algo) else parse_enum(Algo, algo, "--algo")
    if mode not in MODES:
        raise InputError(f"mode {mode!r} is not known; expected one of {', '.join(MODES)}")
    model.require_shape("a step simulation with tensor or pipeline parallelism")
    check_supported(cluster, training, algo, mode)
    check_cp(cluster, training, par)
    lay = layout_for(cluster, par.tp, par.pp)
    chunk_units(model, par)
    if par.schedule == "interleaved" and training.accum_steps % par.pp:
        raise InputError(f"the interleaved schedule needs the micro-batches per step "
                         f"(--accum = {training.accum_steps}) to be a multiple of --pp "
                         f"{par.pp}")
    mem = memory_3d(model, strategy, cluster, training, par)
    res = StepResult(strategy, algo, mode, cluster.gpus, mem)
    extra = {"tp": par.tp, "pp": par.pp, "dp": lay.d // par.cp, "bubble_fraction": None,
             "pp_schedule": par.schedule, "virtual_stages": par.virtual,
             "sequence_parallel": par.sequence_parallel,
             "tp_comm_overlap": par.tp_comm_overlap,
             "dp_comm_overlap": par.dp_comm_overlap,
             "recompute_mode": ("full" if mem.recompute else
                                "selective" if par.selective_recompute else "none"),
             "micro_batches": training.accum_steps}
    if par.cp > 1:   # the key appears only with context parallelism (cp = 1: as before)
        extra["cp"] = par.cp
    res.parallel = extra
    if not mem.fits:
        return res
    m = training.accum_steps
    from ..spec.runtime import effective_overlap_slowdown

    slow = effective_overlap_slowdown(training.overlap_slowdown,
                                      getattr(cluster, "overlap_slowdown", None), None)
    if mode == "analytic":
        m_small = par.pp if par.virtual > 1 else 1
        # the small plan stands for m micro-batches, so it must recompute as the m-micro-batch
        # step does: auto recomputation resolved on m_small would see fewer activations in
        # flight (1F1B holds min(p - k, m)) and could drop recomputation the step needs
        plan = build_plan_3d(model, strategy, cluster,
                             replace(training, accum_steps=m_small, recompute=mem.recompute),
                             par)
        an = evaluate_3d(plan, cluster, algo, m=m, overlap_slowdown=slow)
        step, exposed, compute = an.step_time_s, an.exposed_comm_s, an.compute_s
        extra["bubble_fraction"] = an.bubble_fraction
        scale = m / m_small
        hw = plan.hardware_flops_per_gpu  # boundary (optimizer) FLOPs are 0
        hw *= scale
        b_intra, b_inter = _bytes(plan, cluster, algo, scale)
        tokens = plan.tokens_per_step * scale
        model_flops = plan.model_flops_per_step * scale
    else:
        plan = build_plan_3d(model, strategy, cluster, training, par)
        rep, bubble, busiest, _, recs = replay_3d(plan, cluster, algo, slow, trace)
        step = rep.step_time_s
        compute = busiest
        extra["bubble_fraction"] = bubble
        exposed = max(0.0, step - busiest - bubble * step)
        n = cluster.gpus
        b_intra = rep.gpu_egress.get("intra", 0.0) / n
        b_inter = rep.gpu_egress.get("inter", 0.0) / n
        if plan.tp_comm_overlap:   # the exposed chunks stand for time, not extra bytes
            c_intra, c_inter = _bytes(plan, cluster, algo, 1.0, chunks=True)
            b_intra, b_inter = b_intra - c_intra, b_inter - c_inter
        res.events, res.records = rep.events, recs
        hw, tokens, model_flops = (plan.hardware_flops_per_gpu, plan.tokens_per_step,
                                   plan.model_flops_per_step)
    res.step_time_s = step
    res.exposed_comm_s = exposed
    res.compute_s = compute
    res.tokens_per_s = tokens / step
    res.tokens_per_s_per_gpu = res.tokens_per_s / cluster.gpus
    res.samples_per_s = res.tokens_per_s / training.seq_len
    res.tflops_per_gpu = hw / step / 1e12
    res.mfu = model_flops / (step * cluster.gpu.peak_flops)
    res.bytes_intra, res.bytes_inter = float(b_intra), float(b_inter)
    return res


def _bytes(plan: Plan3D, spec: ClusterSpec, algo: Algo, scale: float,
           chunks: bool = False) -> tuple[float, float]:
    """Bytes one GPU sends per step over intra-node and inter-node hops (average over GPUs),
    from the lowered programs (micro-step ops x ``scale``). The exposed chunks of TP
    communication overlap (purpose ``tp-chunk``) are left out: they model the time of the
    pipeline's first / last chunk, whose bytes the overlapped collective already moves;
    ``chunks``: count only them, as the engine's links carry them (bytes / the protocol's
    wire efficiency): the engine subtracts them from its link bytes."""
    from ..simulate.step import cross_node_fraction

    intra = inter = 0.0
    gpn, n = spec.gpus_per_node, spec.gpus
    progs: dict = {}
    for op in plan.ops:
        if not isinstance(op, GroupOp) or (op.purpose == "tp-chunk") != chunks:
            continue
        prog = progs.get(op.cache_key)
        if prog is None:
            prog = progs[op.cache_key] = op.lower(spec, algo)
        times = op.count * (1 if op.micro_step is None else scale)
        for ph in prog.phases:
            rings = ph.ringset.rings
            senders = (len(rings) if isinstance(ph.ringset, PairSet)
                       else sum(len(r) for r in rings))
            share = senders / n  # the ranks that send, averaged over all GPUs
            f = cross_node_fraction(ph.ringset, gpn)
            sent = ph.bytes_per_rank / ph.bw_eff if chunks else ph.bytes_per_rank  # on the wire
            inter += times * sent * f * share
            intra += times * sent * (1 - f) * share
    return intra, inter
