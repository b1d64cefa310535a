"""A MoE training step under TP x PP (with virtual-pipeline interleaving) x CP x EP x DP, in
closed form, with the kernel compute model (docs/moe.md, "MoE steps with TP / PP / VP").

This is the throughput model of Megatron-Core's MoE training (the layouts Megatron-Bridge
publishes): per micro-batch and pipeline stage the time of every kernel of the stage's layers
(forward and backward), the dispatch / combine all-to-alls over the layout's EP groups, the
tensor-parallel collectives, then the pipeline schedule. Formulas:

* **Layout.** n GPUs, TP t, PP p, VP v (virtual stages per rank; 1 = plain 1F1B), CP c;
  DP = n / (t·p·c); the routed experts over EP e x ETP 1 x EDP = t·c·DP / e inside each
  stage (Megatron-Core's expert-data-parallel group, :class:`~parosim.plan.experts.
  ExpertLayout`). Micro-batches per step m = GBS / (b·DP).
* **Tokens.** A micro-batch gives each rank T = b·s / c tokens; with sequence parallelism
  the GEMMs of a TP group see all T (weights split by t), the element-wise kernels T / t.
  Each rank dispatches T·k / t routed rows (top-k); under forced balance (the published
  runs) every expert of the EP group receives R = e·T·k / (t·E) rows: the grouped GEMM of
  a rank's E / e experts is E / e GEMMs of R rows.
* **GEMMs** (:func:`parosim.cost.kernels.gemm_seconds`: tile and wave quantization, depth
  K / (K + gemm_k_half), the operand traffic bound) at the FP8 peak for the linear layers
  under ``precision = "fp8"`` (Transformer Engine: attention projections, MLPs, shared and
  routed experts; FP8, MXFP8 and blockwise FP8 alike) and at the bf16 peak otherwise (router,
  LM head, and every GEMM in bf16 runs). The ceiling ``gemm_efficiency`` is per hardware
  (fitted); FP8 GEMMs reach ``fp8_gemm_efficiency`` of it against the FP8 peak (the kernel
  model's :data:`~parosim.spec.compute.FITTED_FP8_GEMM_EFFICIENCY` unless fitted).
  Backward: the data-gradient GEMM (M, K, N) and the weight-gradient GEMM
  (N, K, M) of each forward GEMM (M, N, K). Attention: GQA q/k/v and o; MLA
  (DeepSeek-V2/V3) q down / up, kv down / up and o (:class:`~parosim.spec.moe.Attention`).
* **Attention core** (FlashAttention): ``2·T·s_eff·(w_qk + w_v) / t`` FLOPs forward, halved
  by the causal mask on full-attention layers (s_eff = s), not halved on sliding-window
  layers (s_eff = window); backward 2.5 x forward; at ``attention_efficiency`` x the bf16
  peak (fitted per hardware). w_qk, w_v: :func:`~parosim.spec.moe.attention_score_dims`
  (MLA: heads·(d_nope + d_rope) and heads·d_v).
* **Memory-bound kernels**, bytes per token and layer forward (bf16, our itemisation; backward
  2 x): norms 8h, residual adds 12h, rotary / q-k norms 4·w_qk, router scores 8E,
  permute + unpermute 8·k·h, the activations 6·f per MLP width f under SwiGLU, 3·f under
  GeLU (k·f_e for the routed experts), FP8 quantisation 4 bytes per linear-layer input
  element (cast + transposed copy); the loss 20 bytes per logit
  (:data:`parosim.cost.kernels.LOSS_BYTES_FWD` + ``_BWD``), at the HBM bandwidth x
  ``hbm_efficiency``.
* **All-to-all**: 4 per MoE layer per micro-batch (dispatch and combine, forward and
  backward), each of ``T·k·h·2 / t`` bytes per rank over the EP groups of a stage, costed in
  closed form by the p2p algorithm on the cluster (:func:`parosim.collectives.alltoall.
  lower_alltoall`); ``a2a_exposed`` (fitted, 0..1) of it is on the critical path (Megatron
  overlaps the rest with the other micro-batch's compute).
* **TP** (t > 1, sequence parallel): per layer forward an all-gather and a reduce-scatter of
  the T·h·2-byte activation around attention, and around the dense MLP on dense layers;
  backward the same; ring cost on the NVLink bandwidth.
* **Pipeline**: the per-micro-batch work W of all layers, embedding and LM head is split
  evenly over the p stages (Megatron-Bridge balances its stages with uneven layer counts and
  pipeline layouts); Megatron's interleaved schedule takes ``(m + (p - 1) / v) · W / p``
  (1F1B with v = 1; the bubble is :class:`parosim.evaluate.threed.PipelinePhase`'s, the
  dense 3D plan's definition). Point-to-point sends cost ``2·(p - 1)`` activation transfers of
  T·h·2 / t bytes in the fill and drain (NVLink, or a NIC when a stage spans whole nodes).
* **Data parallel**: Megatron's distributed optimizer overlaps the gradient reduce-scatter
  and the parameter all-gather with compute (both on in the published configurations); the
  optimizer step is charged, ``28`` bytes per local parameter shard over HBM.

Not modelled (and refused): ETP > 1; the multi-token-prediction module; token dropping
(capacity factors) here; recomputation (its cost is inside the fitted efficiencies).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from ..collectives.alltoall import lower_alltoall
from ..collectives.cost import program_time
from ..collectives.types import Algo, Scope
from ..cost.compute import ADAM_BYTES_PER_PARAM
from ..cost.kernels import LOSS_BYTES_BWD, LOSS_BYTES_FWD, gemm_efficiency
from ..errors import InputError
from ..plan.experts import ExpertLayout
from ..spec.compute import (
    FITTED_FP8_GEMM_EFFICIENCY,
    FITTED_GEMM_K_HALF,
    FITTED_HBM_EFFICIENCY,
    ComputeProfile,
)
from ..spec.model import ModelSpec
from ..spec.moe import Attention, attention_score_dims, count_params
from ..spec.system import ClusterSpec
from .threed import PipelinePhase

PRECISIONS = ("bf16", "fp8")
ATTENTION_BWD_FACTOR = 2.5       # FlashAttention backward / forward (parosim.cost.kernels)
FP8_CAST_BYTES = 4               # per linear-layer input element: read 2, write 1 + 1 transposed


@dataclass(frozen=True)
class MoEParallel:
    """The parallel layout of a MoE step (Megatron-Core's names)."""

    tp: int = 1
    pp: int = 1
    vp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1

    def __post_init__(self) -> None:
        for f in ("tp", "pp", "vp", "cp", "ep", "etp"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InputError(f"{f} = {v!r} must be a positive integer")
        if self.etp != 1:
            raise InputError(f"etp = {self.etp}: expert tensor parallelism is not in the MoE "
                             "throughput model; expected etp = 1")


@dataclass(frozen=True)
class KernelEfficiency:
    """Per-hardware parameters of the MoE step's kernel model (fractions of the datasheet
    peak FLOP/s or HBM bandwidth; ``a2a_exposed`` the fraction of all-to-all time on the
    critical path). ``source`` says where the numbers come from."""

    gemm_efficiency: float = 0.7
    attention_efficiency: float = 0.4
    a2a_exposed: float = 1.0
    hbm_efficiency: float = FITTED_HBM_EFFICIENCY
    moe_layer_overhead_s: float = 0.0
    fp8_gemm_efficiency: float = FITTED_FP8_GEMM_EFFICIENCY
    source: str = "uncalibrated defaults"

    def __post_init__(self) -> None:
        for f in ("gemm_efficiency", "attention_efficiency", "hbm_efficiency",
                  "fp8_gemm_efficiency"):
            v = getattr(self, f)
            if not 0 < v <= 1:
                raise InputError(f"{f} = {v!r} must be in (0, 1]")
        if not 0 <= self.a2a_exposed <= 1:
            raise InputError(f"a2a_exposed = {self.a2a_exposed!r} must be in [0, 1]")
        if not 0 <= self.moe_layer_overhead_s < 1:
            raise InputError(f"moe_layer_overhead_s = {self.moe_layer_overhead_s!r} must be "
                             "in [0, 1) seconds")


@dataclass(frozen=True)
class MoEStepTime:
    """One step's time and its parts (seconds; the parts are per pipeline stage and
    micro-batch, forward + backward, except ``bubble_s``, ``p2p_s``, ``optimizer_s``)."""

    step_s: float
    tokens_per_s_per_gpu: float
    microbatches: int
    dp: int
    edp: int
    gemm_s: float
    grouped_gemm_s: float
    attention_s: float
    memory_s: float
    a2a_s: float
    tp_s: float
    host_s: float
    bubble_s: float
    p2p_s: float
    optimizer_s: float
    parts: dict = field(default_factory=dict, compare=False)


def _linear_gemms(model: ModelSpec, t: int) -> list[tuple[int, int]]:
    """(N_out, K_in) of the attention projections of one layer, split by TP t (column
    parallel: N / t; row parallel o: K / t)."""
    a = model.attention or Attention()
    h, heads = model.hidden, model.heads
    if a.kind == "mla":
        qk = a.qk_nope_dim + a.qk_rope_dim
        out = []
        if a.q_lora_rank:
            out += [(a.q_lora_rank, h), (heads * qk // t, a.q_lora_rank)]
        else:
            out += [(heads * qk // t, h)]
        out += [(a.kv_lora_rank + a.qk_rope_dim, h),
                (heads * (a.qk_nope_dim + a.v_head_dim) // t, a.kv_lora_rank),
                (h, heads * a.v_head_dim // t)]
        return out
    hd = a.head_dim or h // heads
    kv = model.kv_heads or heads
    return [((heads + 2 * kv) * hd // t, h), (h, heads * hd // t)]


def _mlp_gemms(model: ModelSpec, f: int) -> list[tuple[int, int]]:
    """(N_out, K_in) of one MLP of inner width f (SwiGLU: gate and up fused)."""
    up = 2 * f if model.mlp == "swiglu" else f
    return [(up, model.hidden), (model.hidden, f)]


@lru_cache(maxsize=4096)
def _a2a_seconds(cluster: ClusterSpec, experts: int, par: MoEParallel, size: float) -> float:
    """Closed-form time of one all-to-all of ``size`` bytes per rank over the EP groups of
    stage 0 (every stage's groups are translates of them)."""
    if par.ep == 1:
        return 0.0
    lay = ExpertLayout(cluster, experts, ep=par.ep, tp=par.tp, pp=par.pp, cp=par.cp)
    groups = [list(g) for g in lay.ep_groups(0)]
    return program_time(cluster, lower_alltoall(cluster, Scope.GLOBAL, size, Algo.P2P,
                                                groups=groups))


def _ring_seconds(k: int, size: float, bw: float, lat: float) -> float:
    """A ring all-gather or reduce-scatter of a ``size``-byte buffer over k ranks."""
    return 0.0 if k == 1 else (k - 1) / k * size / bw + (k - 1) * lat


@dataclass(frozen=True)
class StepParts:
    """The efficiency-free parts of a MoE step (:func:`moe_step_parts`): GEMMs as
    (compute seconds at ceiling 1, operand-traffic seconds) pairs, the attention core at
    efficiency 1, memory-bound kernels at the full HBM bandwidth, one all-to-all, and the
    layout's counts. :func:`step_from_parts` applies a :class:`KernelEfficiency`."""

    gemm: tuple          # ((compute_s, traffic_s), ...) of the dense GEMMs, all layers
    grouped: tuple       # the same for the routed experts' grouped GEMMs
    attention_s: float
    memory_s: float
    a2a_s: float         # all the all-to-alls of one micro-batch, fully exposed
    tp_s: float
    moe_layers: int
    pp: int
    vp: int
    microbatches: int
    dp: int
    edp: int
    p2p_s: float
    optimizer_bytes: float
    hbm_Bps: float
    kernel_overhead_s: float
    tokens_per_step: int
    gpus: int
    rows_per_expert: float


def moe_step_time(model: ModelSpec, cluster: ClusterSpec, par: MoEParallel, global_batch: int,
                  micro_batch: int, seq_len: int, precision: str = "bf16",
                  eff: KernelEfficiency | None = None) -> MoEStepTime:
    """The step time of a MoE model under ``par`` on ``cluster`` (module docstring)."""
    return step_from_parts(moe_step_parts(model, cluster, par, global_batch, micro_batch,
                                          seq_len, precision), eff or KernelEfficiency())


def step_from_parts(sp: StepParts, eff: KernelEfficiency) -> MoEStepTime:
    """A step's time from its parts under ``eff``."""
    f8 = eff.gemm_efficiency * eff.fp8_gemm_efficiency

    def gemms(pairs) -> float:
        return sum(max(c / (f8 if fp8 else eff.gemm_efficiency), m / eff.hbm_efficiency,
                       sp.kernel_overhead_s) for c, m, fp8 in pairs)
    p = sp.pp
    gemm_s, grouped_s = gemms(sp.gemm), gemms(sp.grouped)
    attention_s = sp.attention_s / eff.attention_efficiency
    memory_s = sp.memory_s / eff.hbm_efficiency
    a2a_s = sp.a2a_s * eff.a2a_exposed
    host_s = sp.moe_layers * eff.moe_layer_overhead_s
    work = gemm_s + grouped_s + attention_s + memory_s + a2a_s + sp.tp_s + host_s
    stage = work / p
    # the fill and drain as the dense 3D evaluation defines them: (p - 1) / v x one
    # micro-batch's stage time (every stage busy m x stage: balanced stages)
    bubble_s = PipelinePhase(pipeline_s=0.0, stage_busy_s=(sp.microbatches * stage,) * p,
                             compute_s=0.0, pp=p, virtual=sp.vp,
                             micro_batches=sp.microbatches).bubble_s
    optimizer_s = sp.optimizer_bytes / (sp.hbm_Bps * eff.hbm_efficiency)
    step = sp.microbatches * stage + bubble_s + sp.p2p_s + optimizer_s
    return MoEStepTime(
        step_s=step, tokens_per_s_per_gpu=sp.tokens_per_step / step / sp.gpus,
        microbatches=sp.microbatches, dp=sp.dp, edp=sp.edp, gemm_s=gemm_s / p,
        grouped_gemm_s=grouped_s / p, attention_s=attention_s / p, memory_s=memory_s / p,
        a2a_s=a2a_s / p, tp_s=sp.tp_s / p, host_s=host_s / p, bubble_s=bubble_s,
        p2p_s=sp.p2p_s, optimizer_s=optimizer_s,
        parts={"rows_per_expert": sp.rows_per_expert})


@lru_cache(maxsize=1024)
def moe_step_parts(model: ModelSpec, cluster: ClusterSpec, par: MoEParallel, global_batch: int,
                   micro_batch: int, seq_len: int, precision: str = "bf16") -> StepParts:
    """The efficiency-free parts of one step (module docstring; cached)."""
    moe = model.moe
    if moe is None:
        raise InputError(f"model {model.name!r} is dense; the MoE step model needs a mixture "
                         "of experts")
    if moe.capacity_factor is not None:
        raise InputError(f"model {model.name!r} has capacity_factor = {moe.capacity_factor}: "
                         "token dropping is not in the MoE throughput model; expected "
                         "dropless (capacity_factor null)")
    if precision not in PRECISIONS:
        raise InputError(f"precision = {precision!r}; expected one of {', '.join(PRECISIONS)}")
    n = cluster.gpus
    t, p, v, c, e = par.tp, par.pp, par.vp, par.cp, par.ep
    lay = ExpertLayout(cluster, moe.experts, ep=e, tp=t, pp=p, cp=c)   # checks the layout
    dp = lay.dp
    if seq_len % c or (v > 1 and p == 1):
        raise InputError(f"seq_len {seq_len} / cp {c}, vp {v} with pp {p}: expected CP to "
                         "divide the sequence and VP > 1 only with PP > 1")
    if global_batch % (micro_batch * dp):
        raise InputError(f"global batch {global_batch} is not a multiple of micro-batch "
                         f"{micro_batch} x DP {dp}")
    m = global_batch // (micro_batch * dp)
    gpu = cluster.gpu
    fp8 = precision == "fp8"
    if fp8 and not gpu.peak_fp8_flops:
        raise InputError(f"precision fp8 on {gpu.model}: the GPU has no FP8 peak")
    prof = ComputeProfile(model="kernel", gemm_ceiling=1.0, gemm_k_half=FITTED_GEMM_K_HALF,
                          sm_count=cluster.compute.sms(gpu.model))
    sms = prof.sms(gpu.model)
    hbm = gpu.hbm_bandwidth_Bps
    lin_peak, lin_bytes = ((gpu.peak_fp8_flops, 1) if fp8 else (gpu.peak_flops, 2))

    def gemm(mm: float, nn: int, kk: int, batch: int = 1, linear: bool = True) -> list:
        """Forward + backward (data and weight gradients) of one GEMM (M, N, K): three
        (compute s at ceiling 1, operand traffic s, at the FP8 peak) triples."""
        peak, ob = (lin_peak, lin_bytes) if linear else (gpu.peak_flops, 2)
        def g(a, b, k):  # noqa: E306
            flops = 2.0 * a * b * k * batch
            traffic = (ob * (a * k + k * b) + 2.0 * a * b) * batch / hbm
            return (flops / (peak * gemm_efficiency(a, b, k, prof, sms, batch)), traffic,
                    linear and fp8)
        return [g(mm, nn, kk), g(mm, kk, nn), g(nn, kk, mm)]

    h, k_top, E = model.hidden, moe.top_k, moe.experts
    T = micro_batch * seq_len // c
    dense_layers = moe.dense_layers
    moe_layers = model.layers - dense_layers
    attn = [x for nn, kk in _linear_gemms(model, t) for x in gemm(T, nn, kk)]
    dense_mlp = [x for i, (nn, kk) in enumerate(_mlp_gemms(model, model.ffn_hidden))
                 for x in gemm(T, nn // t if i == 0 else nn, kk if i == 0 else kk // t)]
    sw = moe.shared_experts * moe.shared_width
    shared = ([x for i, (nn, kk) in enumerate(_mlp_gemms(model, sw))
               for x in gemm(T, nn // t if i == 0 else nn, kk if i == 0 else kk // t)]
              if sw else [])
    router = gemm(T // t, E, h, linear=False)
    rows = e * T * k_top / (t * E)        # rows per expert under forced balance
    local = E // e
    experts = [x for nn, kk in _mlp_gemms(model, moe.expert_ffn)
               for x in gemm(rows, nn, kk, batch=local)]
    head = gemm(T, model.vocab // t, h, linear=False)
    # attention core
    qk, vw = attention_score_dims(model)
    a = model.attention or Attention()
    win = min(seq_len, a.window) if a.window else seq_len
    full_layers = model.layers - a.window_layers
    core_fwd = 2.0 * T * (qk + vw) / t * (0.5 * seq_len * full_layers + win * a.window_layers)
    attention_s = core_fwd * (1 + ATTENTION_BWD_FACTOR) / gpu.peak_flops
    # memory-bound kernels (bytes per token, forward)
    mlp_act = 6 * (2 if model.mlp == "swiglu" else 1) / 2
    common = 8 * h + 12 * h + 4 * qk
    cast = FP8_CAST_BYTES if fp8 else 0
    attn_in = sum(kk for _, kk in _linear_gemms(model, 1))
    dense_b = common + mlp_act * model.ffn_hidden + cast * (attn_in + h + model.ffn_hidden)
    moe_b = (common + 8 * E + 8 * k_top * h + mlp_act * (k_top * moe.expert_ffn + sw)
             + cast * (attn_in + k_top * (h + moe.expert_ffn) + (h + sw if sw else 0)))
    layer_bytes = (dense_layers * dense_b + moe_layers * moe_b) * 3.0      # fwd + 2 x bwd
    loss_bytes = (LOSS_BYTES_FWD + LOSS_BYTES_BWD) * model.vocab
    memory_s = (layer_bytes * T / t + loss_bytes * T / t) / hbm
    # collectives
    a2a_one = _a2a_seconds(cluster, E, par, T * k_top * h * 2.0 / t)
    tp_one = _ring_seconds(t, T * h * 2.0, cluster.intra.bandwidth_Bps, cluster.intra.latency_s)
    tp_s = 4 * tp_one * (2 * dense_layers + moe_layers)     # AG + RS, fwd + bwd, per block
    gemm_pairs = (dense_layers * (attn + dense_mlp) + moe_layers * (attn + shared + router)
                  + head)
    span = n // p
    link = cluster.intra if span < cluster.gpus_per_node else None
    p2p_bw = link.bandwidth_Bps if link else cluster.nic.bandwidth_Bps
    p2p_lat = link.latency_s if link else cluster.nic.latency_s
    p2p_s = 2 * (p - 1) * (T * h * 2.0 / t / p2p_bw + p2p_lat)
    counts = count_params(model)
    dense_params = counts.total - counts.routed_experts
    local_params = (dense_params / (t * p) / lay.dense_dp
                    + counts.routed_experts / (p * e) / lay.edp)
    return StepParts(
        gemm=tuple(gemm_pairs), grouped=tuple(moe_layers * experts), attention_s=attention_s,
        memory_s=memory_s, a2a_s=4 * moe_layers * a2a_one, tp_s=tp_s, moe_layers=moe_layers,
        pp=p, vp=v, microbatches=m, dp=dp, edp=lay.edp, p2p_s=p2p_s,
        optimizer_bytes=ADAM_BYTES_PER_PARAM * local_params, hbm_Bps=hbm,
        kernel_overhead_s=prof.kernel_overhead_s, tokens_per_step=global_batch * seq_len,
        gpus=n, rows_per_expert=rows)


# ---------------------------------------------------------------------------------------------
# The fitted parameters (parosim.calibrate.moe_throughput fits them; kept here, below the
# command line and the sweep that apply them).
# ---------------------------------------------------------------------------------------------

# the GPU model of a cluster preset -> the hardware of the fitted parameters
GPU_HARDWARE = {"H100-SXM5-80GB": "H100", "B200": "B200", "B300": "B300", "GB200": "GB200",
                "GB300": "GB300"}
_SOURCE = ("fitted on the even Megatron-Bridge rows, parameter set chosen by cross-validation "
           "inside them (docs/moe.md; experiments/17_moe_throughput/out/fit.json)")
# the chosen variant's fit (:func:`parosim.calibrate.moe_throughput.calibrate`), rounded to
# 6 decimals; tests/test_moe_bridge.py (slow) refits and checks these. The chosen variant has one
# throughput factor per NeMo release, the newest release's (26.08) fixed at 1: these constants
# predict that release.
FITTED = {
    hw: KernelEfficiency(gemm_efficiency=g, moe_layer_overhead_s=o, a2a_exposed=0.370948,
                         attention_efficiency=1.0, hbm_efficiency=1.0,
                         fp8_gemm_efficiency=1.0, source=_SOURCE)
    for hw, g, o in (("H100", 0.461507, 0.001367),
                     ("B200", 0.459622, 0.004303),
                     ("B300", 0.368913, 0.0),
                     ("GB200", 0.410811, 0.000584),
                     ("GB300", 0.625761, 0.002))
}
FITTED_RELEASE = "26.08"


def fitted_efficiency(gpu_model: str) -> tuple[str, KernelEfficiency]:
    """(hardware, fitted :class:`KernelEfficiency`) of a GPU model; a GPU the Megatron-Bridge
    rows do not cover is refused in one line."""
    hw = GPU_HARDWARE.get(gpu_model)
    if hw is None:
        raise InputError(f"GPU {gpu_model!r}: the MoE TP / PP closed form is calibrated for "
                         f"{', '.join(GPU_HARDWARE)} only (Megatron-Bridge rows); expected a "
                         "cluster of one of those GPUs (e.g. dgx-h100-ib, dgx-b200-ib, "
                         "dgx-b300-ib, gb200-nvl72, gb300-nvl72)")
    return hw, FITTED[hw]
