"""Memory of a TP x PP x DP job per GPU (docs/parallelism.md, "Memory"), and the layout
helpers it shares with the 3D planner (:mod:`parosim.plan.threed`): the units of each stage,
Transformer Engine's userbuffers and the context-parallel split.

A memory model: it imports no planner (the planners import it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from ..cost.compute import fp8_peak_flops, layer_fp8_params
from ..cost.decompose import chunk_units
from ..cost.fp8mem import fp8_layer_activation_bytes, korthikanti_mask_bytes
from ..cost.memory import (
    MemoryBreakdown,
    fp8_weight_cache_bytes,
    korthikanti_margin,
    margin_bytes,
)
from ..errors import InputError
from ..spec.model import ModelSpec
from ..spec.strategy import Level, Strategy, model_states_bytes, parse_strategy
from ..spec.system import ClusterSpec
from ..spec.training import (
    BYTES_PER_ACTIVATION,
    BYTES_PER_GRAD,
    BYTES_PER_PARAM,
    TrainingSpec,
)
from .layout import Layout, ParallelSpec, layout_for


def stage_params(model: ModelSpec, par: ParallelSpec) -> list[float]:
    """Parameters each GPU of stage k holds before DP sharding: Σ its units / t."""
    units = chunk_units(model, par)
    out = [0.0] * par.pp
    for vs, us in enumerate(units):
        out[vs % par.pp] += sum(u.params for u in us) / par.tp
    return out


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


def is_fp8(training: TrainingSpec) -> bool:
    """FP8 training (``TrainingSpec.precision``, where the FP8 model is present)."""
    return getattr(training, "precision", "bf16") == "fp8"


def userbuffer_bytes(training: TrainingSpec, hidden: int) -> float:
    """Bytes per GPU of Transformer Engine's userbuffers (TP communication overlap)."""
    tokens = training.seq_len * training.micro_batch
    if is_fp8(training):
        return (UB_FP8_BUFFERS + BYTES_PER_ACTIVATION * (UB_BUFFERS - UB_FP8_BUFFERS)) \
            * tokens * hidden
    return UB_BUFFERS * BYTES_PER_ACTIVATION * tokens * hidden


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


def stage_fp8_params(model: ModelSpec, par: ParallelSpec) -> list[float]:
    """Per pipeline stage, the decoder-layer GEMM weights one rank holds (split by t): the
    weights that run in FP8 and are cached in fp8 under ``precision = "fp8"``."""
    return list(_stage_fp8(model, par))


@lru_cache(maxsize=1024)
def _stage_fp8(model: ModelSpec, par: ParallelSpec) -> tuple[float, ...]:
    per = layer_fp8_params(model) / par.tp
    out = [0.0] * par.pp
    for vs, us in enumerate(chunk_units(model, par)):
        out[vs % par.pp] += per * sum(1 for u in us if u.kind == "layer")
    return tuple(out)


def resolve_recompute_3d(model: ModelSpec, strategy: Strategy, cluster: ClusterSpec,
                         training: TrainingSpec, par: ParallelSpec) -> bool:
    """Full recomputation: as set, or auto (None): on iff it does not fit without."""
    if training.recompute is not None:
        return training.recompute
    return not _memory(model, strategy, cluster, training, par, False).fits


@lru_cache(maxsize=4096)   # advise asks for the same (training, layout) for every strategy
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

        return fp8_layer_activation_bytes(model, training, tp, sp, selective)
    if training.hidden_dropout is not None:   # bf16, explicit dropout: masks only if > 0

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
                  lay: Layout, only_peak: bool = False) -> list[MemoryBreakdown]:
    """Every stage's breakdown (stage 0 first); ``only_peak``: only the first stage of the
    largest total (what :func:`memory_3d` reports; the others are not built)."""
    t, sp = par.tp, par.sequence_parallel
    r = training.trainable_ratio
    per_chunk = model.layers // par.chunks
    s, b, h = training.seq_len, training.micro_batch, model.hidden
    full_layer = layer_activation_bytes_3d(model, training, t, sp, par.selective_recompute)
    no_rc_layer = layer_activation_bytes_3d(model, training, t, sp, False)
    kept = BYTES_PER_ACTIVATION * s * b * h / (t if sp else 1) if recompute else full_layer
    figures = []
    frac = korthikanti_margin(training)
    cap = float(cluster.gpu.memory_bytes)
    fp8p = stage_fp8_params(model, par)
    sums, biggests = _stage_sums(model, par)
    d_p, d_g, d_os = strategy.divisors(lay.d, lay.m_dp)   # the same for every stage
    for k in (_peak_candidates(par.pp, sums, biggests, fp8p) if only_peak else range(par.pp)):
        psi = sums[k] / t
        states = model_states_bytes(strategy, psi, psi * r, lay.d, lay.m_dp,
                                    training.optim_state_bytes)
        cache = fp8_weight_cache_bytes(model, training, fp8p[k], d_p,
                                       layer_fp8_params(model) / t)
        states += cache
        fp8_w = fp8p[k] / d_p if training.fp8_params else 0.0   # 1 byte, not 2 (fp8mem)
        states -= fp8_w
        chunks = in_flight(k, par, training.accum_steps)
        acts = chunks * per_chunk * kept + (no_rc_layer if recompute else 0.0)
        if k == par.pp - 1:   # final norm + LM-head input and fp32 logits (vocab split by t)
            logit = training.logit_bytes or 4          # fp32 logits unless told otherwise
            acts += 4 * s * b * h / (t if sp else 1) + logit * s * b * model.vocab / t
        biggest = biggests[k] / t
        bufs = 0.0
        if strategy.p is not Level.N:
            bufs += 2 * BYTES_PER_PARAM * biggest
        if strategy.g is not Level.N:
            bufs += 2 * BYTES_PER_GRAD * biggest * r
        if par.tp_comm_overlap:   # TE's userbuffers (docs/parallelism.md)
            bufs += userbuffer_bytes(training, h)
        if par.cp > 1:   # TE's CP backward: two [K/V, dK/dV] receive buffers (4 messages)
            bufs += 4 * cp_kv_bytes(model, training, par)
        margin = margin_bytes(frac, states + acts + bufs)
        total = states + acts + bufs + margin
        figures.append((states, acts, bufs, margin, total, psi, fp8_w, cache))
    if only_peak:   # max() keeps the first of equal totals, as max over the breakdowns
        figures = [max(figures, key=lambda f: f[4])]
    return [MemoryBreakdown(
        model_states_bytes=states, activations_bytes=acts, buffers_bytes=bufs,
        margin_bytes=margin, total_bytes=total, capacity_bytes=cap, fits=total <= cap,
        shortfall_bytes=max(0.0, total - cap),
        params_bytes=BYTES_PER_PARAM * psi / d_p - fp8_w,
        grads_bytes=BYTES_PER_GRAD * psi * r / d_g,
        optimizer_bytes=training.optim_state_bytes * psi * r / d_os, recompute=recompute,
        memory_model="korthikanti",   # the only estimate of this path (memory_3d refuses others)
        attention="flash" if training.attention == "flash" else "eager",
        logit_bytes=training.logit_bytes or 4, fp8_weight_cache_bytes=cache)
        for states, acts, bufs, margin, total, psi, fp8_w, cache in figures]


def _peak_candidates(p: int, sums, biggests, fp8p) -> range | tuple[int, ...]:
    """The stages that can hold the first largest total: 0, 1 and p - 1 when the middle
    stages 1..p-2 hold the same parameters (then their totals differ only by the
    activations in flight, which do not grow with the stage index (:func:`in_flight`), and
    IEEE rounding is monotone: stage 1's total is the first largest of them); else every
    stage."""
    if p <= 3 or not (sums[1:-1].count(sums[1]) == biggests[1:-1].count(biggests[1])
                      == fp8p[1:-1].count(fp8p[1]) == p - 2):
        return range(p)
    return (0, 1, p - 1)


@lru_cache(maxsize=1024)
def _stage_sums(model: ModelSpec, par: ParallelSpec) -> tuple[tuple, tuple]:
    """Per pipeline stage: the parameters of its units (summed in unit order, as the memory
    estimate sums them) and its largest unit's; cached (``advise`` asks for the same
    pipeline layout thousands of times)."""
    units, pp = chunk_units(model, par), par.pp
    sums, biggests = [], []
    for k in range(pp):
        mine = [us for vs, us in enumerate(units) if vs % pp == k]
        sums.append(sum(u.params for us in mine for u in us))
        biggests.append(max(u.params for us in mine for u in us))
    return tuple(sums), tuple(biggests)


def _memory(model, strategy, cluster, training, par, recompute) -> MemoryBreakdown:
    lay = layout_for(cluster, par.tp, par.pp)
    return _stage_memory(model, strategy, cluster, training, par, recompute, lay,
                         only_peak=True)[0]


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
