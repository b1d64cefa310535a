"""Mixture-of-experts layers and attention beyond LLaMA's: their shapes and parameter counts.

A :class:`~parosim.spec.model.ModelSpec` with ``moe`` set is a mixture of experts (docs/moe.md):
its first ``dense_layers`` decoder layers have a dense MLP of ``ffn_hidden``, every later layer
a router (``h·E`` weights, ``E`` biases with ``router_bias``), ``experts`` routed experts of
``expert_ffn`` (each token goes to ``top_k`` of them) and ``shared_experts`` experts of
``shared_ffn`` that every token goes through. Experts are MLPs of the model's ``mlp`` kind
(SwiGLU: ``3·h·f`` weights), with biases when the model's ``bias`` is set.

``attention`` (:class:`Attention`) describes attention LLaMA's shape cannot: a ``head_dim``
other than ``hidden / heads`` (Qwen3, GPT-OSS), per-head q / k RMSNorm (Qwen3), attention
sinks (GPT-OSS), sliding-window layers (GPT-OSS), and multi-latent attention (MLA,
DeepSeek-V2/V3: low-rank q and compressed kv with a decoupled rotary key).

Only the counting lives here (no parosim import but errors: the model module builds on it).
What the simulator can do with such a model is in docs/moe.md; every path that cannot yet
honour it refuses it (:meth:`ModelSpec.require_shape`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from ..errors import InputError

ATTENTION_KINDS = ("gqa", "mla")
_MAX_DIM = 2**24


def _pos_int(v: Any, what: str, zero_ok: bool = False) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < (0 if zero_ok else 1) \
            or v > _MAX_DIM:
        kind = "a non-negative" if zero_ok else "a positive"
        raise InputError(f"{what} = {v!r} must be {kind} integer of at most {_MAX_DIM}")


def _flag(v: Any, what: str) -> None:
    if not isinstance(v, bool):
        raise InputError(f"{what} = {v!r} must be true or false")


@dataclass(frozen=True)
class Attention:
    """Attention shape beyond LLaMA's (all optional; the defaults are LLaMA's).

    ``kind = "gqa"``: q ``h x heads·head_dim``, k and v ``h x kv_heads·head_dim`` each, o
    ``heads·head_dim x h``. ``kind = "mla"`` (DeepSeek-V2/V3): q down ``h x q_lora_rank`` (0:
    no q compression, q ``h x heads·(nope + rope)``), its RMSNorm, q up ``q_lora_rank x
    heads·(nope + rope)``; kv down ``h x (kv_lora_rank + rope)``, its RMSNorm ``kv_lora_rank``,
    kv up ``kv_lora_rank x heads·(nope + v_head_dim)``; o ``heads·v_head_dim x h``.

    >>> Attention(head_dim=128, qk_norm=True).kind
    'gqa'
    """

    kind: str = "gqa"
    head_dim: int | None = None
    qk_norm: bool = False
    sinks: bool = False
    window: int = 0
    window_layers: int = 0
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_dim: int = 0
    qk_rope_dim: int = 0
    v_head_dim: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ATTENTION_KINDS:
            raise InputError(f"attention kind = {self.kind!r} is not known; expected one of "
                             f"{', '.join(ATTENTION_KINDS)}")
        if self.head_dim is not None:
            _pos_int(self.head_dim, "attention head_dim")
        for f in ("qk_norm", "sinks"):
            _flag(getattr(self, f), f"attention {f}")
        for f in ("window", "window_layers", "q_lora_rank", "kv_lora_rank", "qk_nope_dim",
                  "qk_rope_dim", "v_head_dim"):
            _pos_int(getattr(self, f), f"attention {f}", zero_ok=True)
        if bool(self.window) != bool(self.window_layers):
            raise InputError(f"attention window = {self.window} with window_layers = "
                             f"{self.window_layers}: give both (a sliding window of that many "
                             "tokens on that many layers) or neither")
        mla = ("kv_lora_rank", "qk_nope_dim", "qk_rope_dim", "v_head_dim")
        if self.kind == "mla":
            missing = [f for f in mla if not getattr(self, f)]
            if missing:
                raise InputError(f"attention kind = 'mla' needs {', '.join(missing)} "
                                 "(positive integers)")
            if self.head_dim is not None or self.qk_norm or self.sinks:
                raise InputError("attention kind = 'mla' takes q_lora_rank, kv_lora_rank, "
                                 "qk_nope_dim, qk_rope_dim, v_head_dim; head_dim, qk_norm and "
                                 "sinks are for kind = 'gqa'")
        elif any(getattr(self, f) for f in ("q_lora_rank", *mla)):
            given = ", ".join(f for f in ("q_lora_rank", *mla) if getattr(self, f))
            raise InputError(f"attention {given} describe multi-latent attention; expected "
                             "kind = 'mla'")

    def as_dict(self) -> dict[str, Any]:
        """The fields that differ from the defaults (for JSON and YAML)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) != f.default or f.name == "kind"}


@dataclass(frozen=True)
class MoE:
    """The mixture-of-experts part of a model.

    ``capacity_factor``: ``None`` is dropless (every routed token is computed, Megatron-Core's
    default and DeepSeek / Qwen3 training); a number c > 0 caps each expert at
    ``ceil(c · tokens · top_k / experts)`` tokens per micro-batch: tokens beyond are dropped
    and the buffers are padded to the cap (GShard / Switch).

    >>> MoE(experts=8, top_k=2, expert_ffn=14336).shared_experts
    0
    """

    experts: int
    top_k: int
    expert_ffn: int
    shared_experts: int = 0
    shared_ffn: int | None = None
    dense_layers: int = 0
    router_bias: bool = False
    capacity_factor: float | None = None

    def __post_init__(self) -> None:
        for f in ("experts", "top_k", "expert_ffn"):
            _pos_int(getattr(self, f), f"moe {f}")
        _pos_int(self.shared_experts, "moe shared_experts", zero_ok=True)
        _pos_int(self.dense_layers, "moe dense_layers", zero_ok=True)
        if self.shared_ffn is not None:
            _pos_int(self.shared_ffn, "moe shared_ffn")
        _flag(self.router_bias, "moe router_bias")
        if self.top_k > self.experts:
            raise InputError(f"moe top_k = {self.top_k} is more than experts = "
                             f"{self.experts}; expected 1 <= top_k <= experts")
        c = self.capacity_factor
        if c is not None and (isinstance(c, bool) or not isinstance(c, (int, float))
                              or not math.isfinite(c) or c <= 0):
            raise InputError(f"moe capacity_factor = {c!r} must be a positive number, or "
                             "null for dropless routing")

    @property
    def shared_width(self) -> int:
        """FFN size of one shared expert (``expert_ffn`` unless ``shared_ffn`` is given)."""
        return self.expert_ffn if self.shared_ffn is None else self.shared_ffn

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class ParamCounts:
    """Parameters of a model by part (whole model, every layer summed), and per token.

    ``active`` counts what one token touches: everything but the routed experts it is not
    sent to (its embedding row counted as the whole table, the convention of Mixtral's and
    Qwen3's published counts); ``active_no_embedding`` leaves the input embedding out (the
    convention of GPT-OSS's model card). ``active_matmul`` is the weights of the matmuls one
    token goes through (attention projections, router, its k routed and the shared experts,
    dense MLPs, LM head): 2 FLOPs each per token forward.
    """

    attention: int
    dense_mlp: int
    routed_experts: int
    shared_experts: int
    router: int
    norms: int
    embedding: int
    head: int
    total: int
    active: int
    active_no_embedding: int
    active_matmul: int
    expert_params: int   # the routed experts of one MoE layer: E x one expert
    moe_layers: int

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _mlp(model: Any, f: int) -> tuple[int, int]:
    """(weights, biases) of one MLP of inner size f."""
    h = model.hidden
    w = (3 if model.mlp == "swiglu" else 2) * h * f
    b = ((2 * f if model.mlp == "swiglu" else f) + h) if model.bias else 0
    return w, b


def _attention(model: Any) -> tuple[int, int, int]:
    """(matmul weights, biases + sinks, norm weights) of one layer's attention."""
    a = model.attention or Attention()
    h, heads = model.hidden, model.heads
    kv = model.kv_heads or heads
    if a.kind == "mla":
        qk = a.qk_nope_dim + a.qk_rope_dim
        w = (h * a.q_lora_rank + a.q_lora_rank * heads * qk if a.q_lora_rank
             else h * heads * qk)
        w += h * (a.kv_lora_rank + a.qk_rope_dim)
        w += a.kv_lora_rank * heads * (a.qk_nope_dim + a.v_head_dim)
        w += heads * a.v_head_dim * h
        norms = a.q_lora_rank + a.kv_lora_rank
        bias = (heads * qk + a.kv_lora_rank + a.qk_rope_dim
                + heads * (a.qk_nope_dim + a.v_head_dim) + h) if model.bias else 0
        return w, bias, norms
    hd = a.head_dim or h // heads
    w = 2 * h * heads * hd + 2 * h * kv * hd
    bias = (heads * hd + 2 * kv * hd + h) if model.bias else 0
    bias += heads if a.sinks else 0
    norms = 2 * hd if a.qk_norm else 0
    return w, bias, norms


def attention_score_dims(model: Any) -> tuple[int, int]:
    """(q·k width, a·v width) summed over heads: the per-token widths of QKᵀ and AV."""
    a = model.attention or Attention()
    if a.kind == "mla":
        return (model.heads * (a.qk_nope_dim + a.qk_rope_dim), model.heads * a.v_head_dim)
    hd = a.head_dim or model.hidden // model.heads
    return model.heads * hd, model.heads * hd


def count_params(model: Any) -> ParamCounts:
    """Parameter counts of a shaped model (dense or MoE, any attention) by part.

    The dense LLaMA case agrees with :class:`~parosim.spec.model.ModelSpec`'s own count.
    """
    h, layers = model.hidden, model.layers
    moe: MoE | None = model.moe
    aw, ab, an = _attention(model)
    norm = h * (2 if model.norm == "layernorm" else 1)
    dense_layers = layers if moe is None else moe.dense_layers
    moe_layers = layers - dense_layers
    dw, db = _mlp(model, model.ffn_hidden)
    attention = layers * (aw + ab)
    norms = layers * (2 * norm + an)
    dense_mlp = dense_layers * (dw + db)
    if moe is None:
        one_expert = routed = shared = router = 0
        k_routed = 0
    else:
        ew, eb = _mlp(model, moe.expert_ffn)
        sw, sb = _mlp(model, moe.shared_width)
        one_expert = ew + eb
        routed = moe_layers * moe.experts * one_expert
        shared = moe_layers * moe.shared_experts * (sw + sb)
        router = moe_layers * (h * moe.experts + (moe.experts if moe.router_bias else 0))
        k_routed = moe_layers * moe.top_k * one_expert
    embedding = (model.vocab + model.pos_embedding) * h
    head = norm + (0 if model.tied_embeddings else model.vocab * h)
    total = attention + norms + dense_mlp + routed + shared + router + embedding + head
    active = total - routed + k_routed
    matmul = layers * aw + dense_layers * dw + model.vocab * h
    if moe is not None:
        matmul += moe_layers * (moe.top_k * ew + moe.shared_experts * sw + h * moe.experts)
    return ParamCounts(attention=attention, dense_mlp=dense_mlp, routed_experts=routed,
                       shared_experts=shared, router=router, norms=norms,
                       embedding=embedding, head=head, total=total, active=active,
                       active_no_embedding=active - embedding, active_matmul=matmul,
                       expert_params=(moe.experts * one_expert if moe else 0),
                       moe_layers=moe_layers)


def flops_per_token(model: Any, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward = 3 x forward, no recomputation):
    ``6·N_active_matmul`` plus the attention scores ``3·2·s_eff·(qk + v widths)`` per layer,
    where ``s_eff`` is the sequence, or the window on sliding-window layers. For a dense
    LLaMA this is the ``6Ψ + 12·L·h·s`` of docs/model.md less ``6·(embedding + norms)``.
    """
    c = count_params(model)
    qk, v = attention_score_dims(model)
    a = model.attention or Attention()
    win = min(seq_len, a.window) if a.window else seq_len
    full = model.layers - a.window_layers
    scores = 2.0 * (qk + v) * (full * seq_len + a.window_layers * win)
    return 3.0 * (2.0 * c.active_matmul + scores)


# Presets: ModelSpec fields from each model's published HuggingFace config.json, and the
# published total / active parameter counts with their source and counting convention
# ("active": with the input embedding, "active_no_embedding": without). docs/moe.md lists
# them; tests/test_moe_models.py checks the counts.
MOE_PRESETS: dict[str, dict[str, Any]] = {
    "mixtral-8x7b": dict(
        shape=dict(layers=32, hidden=4096, ffn_hidden=14336, heads=32, kv_heads=8,
                   vocab=32000, moe=MoE(experts=8, top_k=2, expert_ffn=14336)),
        source="mistralai/Mixtral-8x7B-v0.1 config.json",
        published=(46.7e9, 12.9e9, "active"),
        published_source="Mistral AI, 'Mixtral of experts' (2023-12-11): 46.7B total "
                         "parameters, 12.9B used per token"),
    "mixtral-8x22b": dict(
        shape=dict(layers=56, hidden=6144, ffn_hidden=16384, heads=48, kv_heads=8,
                   vocab=32768, moe=MoE(experts=8, top_k=2, expert_ffn=16384)),
        source="mistralai/Mixtral-8x22B-v0.1 config.json",
        published=(141e9, 39e9, "active"),
        published_source="Mistral AI, 'Cheaper, Better, Faster, Stronger' (2024-04-17): 141B "
                         "parameters, 39B active"),
    "qwen3-30b-a3b": dict(
        shape=dict(layers=48, hidden=2048, ffn_hidden=6144, heads=32, kv_heads=4,
                   vocab=151936, attention=Attention(head_dim=128, qk_norm=True),
                   moe=MoE(experts=128, top_k=8, expert_ffn=768)),
        source="Qwen/Qwen3-30B-A3B config.json",
        published=(30.5e9, 3.3e9, "active"),
        published_source="Qwen/Qwen3-30B-A3B model card: 30.5B in total, 3.3B activated "
                         "(29.9B non-embedding)"),
    "qwen3-235b-a22b": dict(
        shape=dict(layers=94, hidden=4096, ffn_hidden=12288, heads=64, kv_heads=4,
                   vocab=151936, attention=Attention(head_dim=128, qk_norm=True),
                   moe=MoE(experts=128, top_k=8, expert_ffn=1536)),
        source="Qwen/Qwen3-235B-A22B config.json",
        published=(235e9, 22e9, "active"),
        published_source="Qwen/Qwen3-235B-A22B model card: 235B in total, 22B activated "
                         "(234B non-embedding)"),
    "deepseek-v3": dict(
        shape=dict(layers=61, hidden=7168, ffn_hidden=18432, heads=128, vocab=129280,
                   attention=Attention(kind="mla", q_lora_rank=1536, kv_lora_rank=512,
                                       qk_nope_dim=128, qk_rope_dim=64, v_head_dim=128),
                   moe=MoE(experts=256, top_k=8, expert_ffn=2048, shared_experts=1,
                           dense_layers=3, router_bias=True)),
        source="deepseek-ai/DeepSeek-V3 config.json (main model; the 14B multi-token-"
               "prediction module is not part of the 671B)",
        published=(671e9, 36.6e9, "active_no_embedding"),
        published_source="deepseek-ai/DeepSeek-V3 README_WEIGHTS.md: main model 671B total, "
                         "36.6B activation parameters (with the 0.9B output head; the "
                         "technical report, arXiv:2412.19437, rounds to 37B)"),
    "gpt-oss-120b": dict(
        shape=dict(layers=36, hidden=2880, ffn_hidden=2880, heads=64, kv_heads=8,
                   vocab=201088, bias=True,
                   attention=Attention(head_dim=64, sinks=True, window=128,
                                       window_layers=18),
                   moe=MoE(experts=128, top_k=4, expert_ffn=2880, router_bias=True)),
        source="openai/gpt-oss-120b config.json (layer_types: sliding and full attention "
               "alternate, window 128)",
        published=(116.83e9, 5.13e9, "active_no_embedding"),
        published_source="OpenAI, 'gpt-oss-120b & gpt-oss-20b Model Card' (2025-08-05), "
                         "table 1: 116.83B total, 5.13B active parameters per token"),
}


# ---------------------------------------------------------------------------------------------
# The inputs of a MoE step beside the model (``parosim simulate`` flags, sweep keys): checked
# here, the lowest floor, so that the command line, the layer / step models and the sweep
# parser share one rule and one line per bad value.
# ---------------------------------------------------------------------------------------------

#: token routings drawn per step (:class:`parosim.evaluate.moe_layer.Routing`)
ROUTINGS = ("balanced", "uniform", "skew", "zipf")


def check_routing(kind: Any, what: str = "--routing") -> str:
    """A routing name of :data:`ROUTINGS` (else one line naming ``what``)."""
    if kind not in ROUTINGS:
        raise InputError(f"{what} {kind!r} is not known; expected one of {', '.join(ROUTINGS)}")
    return kind


def check_max_over_mean(r: Any, what: str = "--max-over-mean") -> float:
    """Skew routing's hot-rank load over the mean: a finite number >= 1."""
    if isinstance(r, bool) or not (isinstance(r, (int, float)) and math.isfinite(r) and r >= 1):
        raise InputError(f"{what} {r!r} must be a number >= 1 (the hot rank's load over the "
                         "mean load)")
    return r


def check_zipf(z: Any, what: str = "--zipf") -> float:
    """Zipf routing's exponent: a finite number >= 0."""
    if isinstance(z, bool) or not (isinstance(z, (int, float)) and math.isfinite(z) and z >= 0):
        raise InputError(f"{what} {z!r} must be a non-negative exponent")
    return z
