"""Model specifications: the LLaMA shapes of the PaRO paper and parameter counting.

A :class:`ModelSpec` is either *shaped* (layers, hidden, ffn_hidden, heads, vocab given; the
parameter count follows from the shape) or *params-only* (``name`` + ``params``): a
params-only model answers memory questions (model states; activations from a nominal shape,
see :func:`nominal_shape`) but compute and plan functions need the shape and raise
:class:`~parosim.errors.InputError` for it (:meth:`ModelSpec.require_shape`).

Parameter count of the LLaMA architecture (Touvron et al. 2023, "LLaMA: Open and Efficient
Foundation Language Models"; the HuggingFace ``LlamaForCausalLM`` layout):

* per decoder layer: attention q, k, v, o projections without bias ``4·h²``; SwiGLU MLP gate,
  up and down projections ``3·h·ffn``; two RMSNorm weight vectors ``2·h``;
* token embedding ``vocab·h``; a separate (untied) LM head ``vocab·h``; a final RMSNorm ``h``.

Beyond LLaMA, a shape can say (all optional, LLaMA's choice is the default):

* ``kv_heads``: grouped-query attention (Ainslie et al. 2023): k and v projections have
  ``kv_heads·head_dim`` outputs each, so attention weights are ``2h² + 2·h·kv_heads·head_dim``;
* ``mlp``: ``"swiglu"`` (gate, up, down: ``3·h·ffn``) or ``"gelu"`` (up, down: ``2·h·ffn``,
  GPT-2/3, MPT);
* ``norm``: ``"rmsnorm"`` (a weight, ``h``) or ``"layernorm"`` (weight and bias, ``2h``);
* ``bias``: linear layers carry biases (GPT-2/3, the llm-foundry benchmark MPTs);
* ``tied_embeddings``: the LM head reuses the token embedding (no second ``vocab·h``);
* ``pos_embedding``: rows of a learned position embedding (GPT-2/3: the context length).

LLaMA-7B comes to 6,738,415,616 parameters, the published count:

>>> m = preset("llama-7b")
>>> m.params
6738415616
>>> m.layer_params, m.embedding_params, m.head_params
(202383360, 131072000, 131076096)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property

from ..errors import InputError
from .moe import MOE_PRESETS, Attention, MoE, ParamCounts, count_params

_SHAPE_FIELDS = ("layers", "hidden", "ffn_hidden", "heads", "vocab")

# The paper's LLaMA shapes (docs/model.md; Touvron et al. 2023, table 2): layers, hidden,
# ffn_hidden, heads; vocabulary 32000 for all.
LLAMA_SHAPES: dict[str, tuple[int, int, int, int]] = {
    "llama-7b": (32, 4096, 11008, 32),
    "llama-13b": (40, 5120, 13824, 40),
    "llama-30b": (60, 6656, 17920, 52),
    "llama-65b": (80, 8192, 22016, 64),
}
LLAMA_VOCAB = 32000

MLPS = ("swiglu", "gelu")
NORMS = ("rmsnorm", "layernorm")
_ARCH_FIELDS = ("kv_heads", "mlp", "norm", "bias", "tied_embeddings", "pos_embedding")

# Further presets: shape and architecture, each from its published config. Parameter counts
# are tested against the published numbers (tests/test_models.py).
# (layers, hidden, ffn_hidden, heads, vocab, extra architecture fields, source)
_LLAMA3 = dict(kv_heads=8)
EXTRA_PRESETS: dict[str, tuple] = {
    # HuggingFace meta-llama/Llama-2-*-hf config.json; Touvron et al. 2023b ("Llama 2"),
    # table 1: GQA for 70B only.
    "llama-2-7b": (32, 4096, 11008, 32, 32000, {}, "meta-llama/Llama-2-7b-hf config.json"),
    "llama-2-13b": (40, 5120, 13824, 40, 32000, {}, "meta-llama/Llama-2-13b-hf config.json"),
    "llama-2-70b": (80, 8192, 28672, 64, 32000, {"kv_heads": 8},
                    "meta-llama/Llama-2-70b-hf config.json (num_key_value_heads 8)"),
    # HuggingFace meta-llama/Meta-Llama-3-*B config.json; vocabulary 128256, GQA 8 kv heads.
    "llama-3-8b": (32, 4096, 14336, 32, 128256, _LLAMA3,
                   "meta-llama/Meta-Llama-3-8B config.json"),
    "llama-3-70b": (80, 8192, 28672, 64, 128256, _LLAMA3,
                    "meta-llama/Meta-Llama-3-70B config.json"),
    # Brown et al. 2020 ("Language Models are Few-Shot Learners"), table 2.1: 96 layers,
    # d_model 12288, 96 heads, d_ff = 4 d_model, context 2048; GPT-2 architecture (learned
    # positions, LayerNorm, biases, tied embedding), BPE vocabulary 50257 (Radford et al. 2019).
    "gpt3-175b": (96, 12288, 49152, 96, 50257,
                  dict(mlp="gelu", norm="layernorm", bias=True, tied_embeddings=True,
                       pos_embedding=2048), "Brown et al. 2020, table 2.1"),
}
# MosaicML MPT as llm-foundry benchmarks it (scripts/train/yamls/pretrain/mpt-*.yaml and
# scripts/train/benchmarking/README.md @8c8dd48f: GELU MLP of 4·d_model, LayerNorm with bias,
# biased linears, tied embedding, learned positions of max_seq_len rows, vocabulary 50368).
# The preset is the seq-2048 benchmark model; the counts match that table's 'params' column.
MPT_SHAPES: dict[str, tuple[int, int, int]] = {   # layers, d_model, heads
    "mpt-125m": (12, 768, 12), "mpt-350m": (24, 1024, 16), "mpt-760m": (24, 1536, 12),
    "mpt-1b": (24, 2048, 16), "mpt-3b": (32, 2560, 20), "mpt-7b": (32, 4096, 32),
    "mpt-13b": (40, 5120, 40), "mpt-30b": (48, 7168, 56), "mpt-70b": (80, 8192, 64),
}
MPT_VOCAB = 50368
for _name, (_l, _h, _a) in MPT_SHAPES.items():
    EXTRA_PRESETS[_name] = (_l, _h, 4 * _h, _a, MPT_VOCAB,
                            dict(mlp="gelu", norm="layernorm", bias=True,
                                 tied_embeddings=True, pos_embedding=2048),
                            "llm-foundry benchmarking README @8c8dd48f (seq 2048 rows)")


def mpt(name: str, seq_len: int = 2048) -> ModelSpec:
    """An llm-foundry benchmark MPT whose learned position embedding has ``seq_len`` rows.

    >>> mpt("mpt-7b", 1024).params      # llm-foundry benchmark table, seq 1024 row
    6654664704
    """
    return replace(preset(name), name=f"{name} (seq {seq_len})", pos_embedding=seq_len,
                   params=None)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


MAX_LAYERS = 10_000   # docs/limits.md: the plan has O(layers) operations per micro-step
MAX_DIM = 2**24       # hidden, ffn_hidden, heads, vocab


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer of the LLaMA architecture, or a bare parameter count.

    ``params`` is the total parameter count Ψ. For a shaped model leave it ``None`` (it is
    derived) or give the derived value; for a params-only model give only ``name`` and
    ``params``.

    >>> ModelSpec("tiny", layers=2, hidden=64, ffn_hidden=172, heads=4, vocab=100).params
    111936
    >>> ModelSpec("my-7.5b", params=7_500_000_000).has_shape
    False
    """

    name: str
    layers: int | None = None
    hidden: int | None = None
    ffn_hidden: int | None = None
    heads: int | None = None
    vocab: int | None = None
    params: int | None = None
    kv_heads: int | None = None
    mlp: str = "swiglu"
    norm: str = "rmsnorm"
    bias: bool = False
    tied_embeddings: bool = False
    pos_embedding: int = 0
    attention: Attention | None = None
    moe: MoE | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise InputError(f"model name {self.name!r} must be a non-empty string")
        given = [f for f in _SHAPE_FIELDS if getattr(self, f) is not None]
        if given and len(given) != len(_SHAPE_FIELDS):
            missing = [f for f in _SHAPE_FIELDS if getattr(self, f) is None]
            raise InputError(f"model {self.name!r}: shape is incomplete, missing "
                             f"{', '.join(missing)}; expected all of "
                             f"{', '.join(_SHAPE_FIELDS)} or only 'params'")
        for f in given:
            v = getattr(self, f)
            if not _is_int(v) or v < 1:
                raise InputError(f"model {self.name!r}: {f} = {v!r} must be a positive integer")
            hi = MAX_LAYERS if f == "layers" else MAX_DIM
            if v > hi:
                raise InputError(f"model {self.name!r}: {f} = {v!r} is more than {hi}, the "
                                 f"simulator's limit; expected at most {hi}")
        if self.mlp not in MLPS:
            raise InputError(f"model {self.name!r}: mlp = {self.mlp!r} is not known; expected "
                             f"one of {', '.join(MLPS)}")
        if self.norm not in NORMS:
            raise InputError(f"model {self.name!r}: norm = {self.norm!r} is not known; "
                             f"expected one of {', '.join(NORMS)}")
        for f in ("bias", "tied_embeddings"):
            if not isinstance(getattr(self, f), bool):
                raise InputError(f"model {self.name!r}: {f} = {getattr(self, f)!r} must be "
                                 "true or false")
        if not _is_int(self.pos_embedding) or self.pos_embedding < 0:
            raise InputError(f"model {self.name!r}: pos_embedding = {self.pos_embedding!r} "
                             "must be a non-negative integer (rows of a learned position "
                             "embedding)")
        for f, kind in (("attention", Attention), ("moe", MoE)):
            v = getattr(self, f)
            if v is not None and not isinstance(v, kind):
                raise InputError(f"model {self.name!r}: {f} = {v!r} must be a "
                                 f"{kind.__name__} or None")
        if not given:
            arch = [f for f in _ARCH_FIELDS
                    if getattr(self, f) != getattr(_ARCH_DEFAULTS, f, None)]
            if arch:
                raise InputError(f"model {self.name!r}: {', '.join(arch)} describe a shape; "
                                 f"give the shape ({', '.join(_SHAPE_FIELDS)}) too")
        if given:
            if self.kv_heads is not None and (not _is_int(self.kv_heads) or self.kv_heads < 1
                                              or self.heads % self.kv_heads):
                raise InputError(f"model {self.name!r}: kv_heads = {self.kv_heads!r} must be a "
                                 f"positive divisor of heads = {self.heads}")
            self._check_extensions()
            if self.hidden % self.heads and (self.attention is None
                                             or self.attention.kind != "gqa"
                                             or self.attention.head_dim is None):
                raise InputError(f"model {self.name!r}: hidden = {self.hidden} is not divisible "
                                 f"by heads = {self.heads}; expected hidden = heads x head_dim")
            derived = self._count_from_shape()
            if self.params is not None and self.params != derived:
                raise InputError(f"model {self.name!r}: params = {self.params!r} disagrees with "
                                 f"the {derived} parameters of its shape; give the shape or "
                                 "the count, not both")
            object.__setattr__(self, "params", derived)
            return
        p = self.params
        if isinstance(p, float) and math.isfinite(p) and p == int(p):
            object.__setattr__(self, "params", int(p))
            p = self.params
        if p is None or not _is_int(p) or p < 1:
            raise InputError(f"model {self.name!r}: params = {p!r} must be a positive whole "
                             "number of parameters (e.g. 7.5e9), or give the shape "
                             f"({', '.join(_SHAPE_FIELDS)})")

    def _check_extensions(self) -> None:
        a, moe = self.attention, self.moe
        if a is not None and a.window_layers > self.layers:
            raise InputError(f"model {self.name!r}: attention window_layers = "
                             f"{a.window_layers} is more than layers = {self.layers}")
        if a is not None and a.kind == "mla" and self.kv_heads is not None:
            raise InputError(f"model {self.name!r}: kv_heads = {self.kv_heads} does not apply "
                             "to multi-latent attention (its k and v come from the latent)")
        if moe is not None and moe.dense_layers >= self.layers:
            raise InputError(f"model {self.name!r}: moe dense_layers = {moe.dense_layers} "
                             f"leaves no MoE layer of layers = {self.layers}; expected fewer "
                             "dense layers than layers")

    # -- counts -------------------------------------------------------------------------
    def _count_from_shape(self) -> int:
        if self.is_extended:
            return count_params(self).total
        return self.layers * self._layer() + self._embedding() + self._head()

    @property
    def is_moe(self) -> bool:
        """A mixture of experts (``moe`` set)."""
        return self.moe is not None

    @property
    def is_extended(self) -> bool:
        """Experts or an attention shape beyond LLaMA's: only the paths of docs/moe.md
        honour such a model; the others refuse it (:meth:`require_shape`)."""
        return self.moe is not None or self.attention is not None

    @property
    def param_counts(self) -> ParamCounts:
        """Parameters by part, total and active per token (:func:`~.moe.count_params`)."""
        self.require_shape("the parameter breakdown", extended_ok=True)
        return count_params(self)

    @property
    def active_params(self) -> int:
        """Parameters one token touches (= ``params`` for a dense model)."""
        return self.param_counts.active if self.is_extended else self.params

    def refusal(self, what: str) -> str:
        """The one line that says ``what`` cannot honour this MoE / extended model."""
        if self.moe is not None:
            m = self.moe
            shared = f" + {m.shared_experts} shared" if m.shared_experts else ""
            return (f"model {self.name!r} is a mixture of experts ({m.experts} routed experts"
                    f"{shared}, top-{m.top_k}); {what} models dense models only: expert "
                    "parallelism, the dispatch / combine all-to-alls and expert sharding are "
                    "not in it yet (docs/moe.md says what handles MoE models)")
        a = self.attention
        return (f"model {self.name!r} has {a.kind} attention beyond LLaMA's "
                f"({', '.join(f'{k} {v}' for k, v in a.as_dict().items() if k != 'kind')}); "
                f"{what} models LLaMA attention only (docs/moe.md)")

    def _norm_params(self) -> int:
        return self.hidden * (2 if self.norm == "layernorm" else 1)

    @cached_property   # (costed hundreds of thousands of times by advise: computed once)
    def kv_dim(self) -> int:
        """Outputs of the k (and of the v) projection: kv_heads x head_dim (= h without GQA)."""
        self.require_shape("the key/value width")
        return (self.kv_heads or self.heads) * (self.hidden // self.heads)

    @cached_property
    def attention_matmul_params(self) -> int:
        """Weights of q, k, v, o: 2h² + 2·h·kv_dim (4h² without GQA)."""
        h = self.hidden
        return 2 * h * h + 2 * h * self.kv_dim

    @property
    def mlp_matmul_params(self) -> int:
        """Weights of the MLP: 3·h·ffn (SwiGLU) or 2·h·ffn (GELU)."""
        return (3 if self.mlp == "swiglu" else 2) * self.hidden * self.ffn_hidden

    def _layer(self) -> int:
        h, f = self.hidden, self.ffn_hidden
        n = self.attention_matmul_params + self.mlp_matmul_params + 2 * self._norm_params()
        if self.bias:  # q, k, v, o and the MLP's output-side biases
            n += 2 * h + 2 * self.kv_dim + (2 * f if self.mlp == "swiglu" else f) + h
        return n

    def _embedding(self) -> int:
        return (self.vocab + self.pos_embedding) * self.hidden

    def _head(self) -> int:
        return self._norm_params() + (0 if self.tied_embeddings else self.vocab * self.hidden)

    @property
    def has_shape(self) -> bool:
        return self.layers is not None

    def require_shape(self, what: str, extended_ok: bool = False) -> None:
        """Raise :class:`InputError` unless the model is shaped; ``what`` says who asked.

        A mixture of experts (or attention beyond LLaMA's) is refused too unless
        ``extended_ok``: the dense paths that ask for the shape cannot honour it."""
        if self.has_shape and self.is_extended and not extended_ok:
            raise InputError(self.refusal(what))
        if not self.has_shape:
            raise InputError(
                f"model {self.name!r} is given by its parameter count only "
                f"(params = {self.params:.4g}); {what} needs its shape: "
                f"{', '.join(_SHAPE_FIELDS)} (e.g. use a preset like llama-7b or a YAML with "
                "the shape)")

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer: 4h² + 3·h·ffn + 2h for LLaMA."""
        self.require_shape("the per-layer parameter count")
        return self._layer()

    @property
    def embedding_params(self) -> int:
        """Token embedding vocab·h, plus learned positions pos_embedding·h."""
        self.require_shape("the embedding parameter count")
        return self._embedding()

    @property
    def head_params(self) -> int:
        """Final norm and untied LM head: h + vocab·h for LLaMA; only the norm when tied."""
        self.require_shape("the LM-head parameter count")
        return self._head()

    @property
    def head_dim(self) -> int:
        self.require_shape("the head dimension")
        return self.hidden // self.heads

    def describe(self) -> str:
        """One line for humans: ``llama-7b: 6.74B params, 32 x 4096 (ffn 11008, 32 heads)``."""
        if not self.has_shape:
            return f"{self.name}: {self.params / 1e9:.2f}B params (no shape)"
        if self.is_moe:
            m, c = self.moe, count_params(self)
            shared = f" + {m.shared_experts} shared" if m.shared_experts else ""
            return (f"{self.name}: {self.params / 1e9:.2f}B params ({c.active / 1e9:.2f}B "
                    f"active), {self.layers} x {self.hidden}, {m.experts} experts{shared} "
                    f"top-{m.top_k} (expert ffn {m.expert_ffn}), {self.heads} heads, "
                    f"vocab {self.vocab}")
        kv = f", {self.kv_heads} kv heads" if self.kv_heads else ""
        mlp = "" if self.mlp == "swiglu" else f", {self.mlp}"
        return (f"{self.name}: {self.params / 1e9:.2f}B params, {self.layers} x {self.hidden} "
                f"(ffn {self.ffn_hidden}{mlp}, {self.heads} heads{kv}, vocab {self.vocab})")


_ARCH_DEFAULTS = ModelSpec.__dataclass_fields__
_ARCH_DEFAULTS = type("_D", (), {f: _ARCH_DEFAULTS[f].default for f in _ARCH_FIELDS})


def known_models() -> list[str]:
    """Preset names, e.g. ``llama-13b``, ``llama-2-70b``, ``mpt-7b``, ``gpt3-175b``."""
    return sorted([*LLAMA_SHAPES, *EXTRA_PRESETS, *MOE_PRESETS])


def preset_source(name: str) -> str:
    """Where a preset's shape comes from.

    >>> preset_source("llama-3-8b")
    'meta-llama/Meta-Llama-3-8B config.json'
    """
    key = preset(name).name
    if key in EXTRA_PRESETS:
        return EXTRA_PRESETS[key][-1]
    if key in MOE_PRESETS:
        return MOE_PRESETS[key]["source"]
    return "Touvron et al. 2023 (LLaMA), table 2; HuggingFace LlamaForCausalLM layout"


def preset(name: str) -> ModelSpec:
    """A LLaMA preset by name: ``llama-7b``, ``7b``, ``LLaMA-7B`` (case-insensitive).

    >>> preset("LLaMA-65B").layers
    80
    """
    key = str(name).strip().lower().replace("_", "-")
    if key in MOE_PRESETS:
        return ModelSpec(key, **MOE_PRESETS[key]["shape"])
    for k in (key, key.replace("llama", "llama-").replace("--", "-"), f"llama-{key}"):
        if k in EXTRA_PRESETS:
            layers, hidden, ffn, heads, vocab, arch, _src = EXTRA_PRESETS[k]
            return ModelSpec(k, layers=layers, hidden=hidden, ffn_hidden=ffn, heads=heads,
                             vocab=vocab, **arch)
    if not key.startswith("llama"):
        key = f"llama-{key}"
    key = key.replace("llama-", "llama").replace("llama", "llama-")
    if key not in LLAMA_SHAPES:
        raise InputError(f"unknown model {name!r}; expected a YAML path or one of "
                         f"{', '.join(known_models())} (also '7b', 'LLaMA-7B')")
    layers, hidden, ffn, heads = LLAMA_SHAPES[key]
    return ModelSpec(key, layers=layers, hidden=hidden, ffn_hidden=ffn, heads=heads,
                     vocab=LLAMA_VOCAB)


def is_preset(name: str) -> bool:
    try:
        preset(name)
    except InputError:
        return False
    return True


def nominal_shape(model: ModelSpec) -> ModelSpec:
    """A LLaMA-proportioned shape with about ``model.params`` parameters.

    Used only to *estimate* activation memory of a params-only model. LLaMA keeps
    layers ≈ hidden / 128 (7B: 32 x 4096, 13B: 40 x 5120) and ffn ≈ 8h/3 rounded up to 256,
    so Ψ - 2·vocab·h ≈ 12·L·h² = 12·h³/128, solved for h by fixed-point iteration and
    rounded to a multiple of 128.
    A shaped model is returned unchanged.

    >>> s = nominal_shape(ModelSpec("x", params=6_738_415_616))
    >>> s.layers, s.hidden
    (32, 4096)
    """
    if model.has_shape:
        return model
    h = (128 * model.params / 12) ** (1 / 3)
    for _ in range(8):  # take the embedding and head (2·vocab·h) out of the budget
        h = (128 * max(model.params - 2 * LLAMA_VOCAB * h, 1.0) / 12) ** (1 / 3)
    h = max(128, 128 * round(h / 128))
    ffn = 256 * math.ceil(8 * h / 3 / 256)
    return ModelSpec(f"{model.name} (nominal shape)", layers=max(1, h // 128), hidden=h,
                     ffn_hidden=ffn, heads=h // 128, vocab=LLAMA_VOCAB)


def with_name(model: ModelSpec, name: str) -> ModelSpec:
    """The same model under another name."""
    return replace(model, name=name)
