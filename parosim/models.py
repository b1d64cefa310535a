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

from .errors import InputError

_SHAPE_FIELDS = ("layers", "hidden", "ffn_hidden", "heads", "vocab")

# The paper's LLaMA shapes (shared/PARO.md; Touvron et al. 2023, table 2): layers, hidden,
# ffn_hidden, heads; vocabulary 32000 for all.
LLAMA_SHAPES: dict[str, tuple[int, int, int, int]] = {
    "llama-7b": (32, 4096, 11008, 32),
    "llama-13b": (40, 5120, 13824, 40),
    "llama-30b": (60, 6656, 17920, 52),
    "llama-65b": (80, 8192, 22016, 64),
}
LLAMA_VOCAB = 32000


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
        if given:
            if self.hidden % self.heads:
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

    # -- counts -------------------------------------------------------------------------
    def _count_from_shape(self) -> int:
        h, v = self.hidden, self.vocab
        return self.layers * _layer_count(h, self.ffn_hidden) + v * h + (v * h + h)

    @property
    def has_shape(self) -> bool:
        return self.layers is not None

    def require_shape(self, what: str) -> None:
        """Raise :class:`InputError` unless the model is shaped; ``what`` says who asked."""
        if not self.has_shape:
            raise InputError(
                f"model {self.name!r} is given by its parameter count only "
                f"(params = {self.params:.4g}); {what} needs its shape: "
                f"{', '.join(_SHAPE_FIELDS)} (e.g. use a preset like llama-7b or a YAML with "
                "the shape)")

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer: 4h² + 3·h·ffn + 2h."""
        self.require_shape("the per-layer parameter count")
        return _layer_count(self.hidden, self.ffn_hidden)

    @property
    def embedding_params(self) -> int:
        """Token embedding: vocab·h."""
        self.require_shape("the embedding parameter count")
        return self.vocab * self.hidden

    @property
    def head_params(self) -> int:
        """Final RMSNorm and untied LM head: h + vocab·h."""
        self.require_shape("the LM-head parameter count")
        return self.vocab * self.hidden + self.hidden

    @property
    def head_dim(self) -> int:
        self.require_shape("the head dimension")
        return self.hidden // self.heads

    def describe(self) -> str:
        """One line for humans: ``llama-7b: 6.74B params, 32 x 4096 (ffn 11008, 32 heads)``."""
        if not self.has_shape:
            return f"{self.name}: {self.params / 1e9:.2f}B params (no shape)"
        return (f"{self.name}: {self.params / 1e9:.2f}B params, {self.layers} x {self.hidden} "
                f"(ffn {self.ffn_hidden}, {self.heads} heads, vocab {self.vocab})")


def _layer_count(h: int, ffn: int) -> int:
    # attention q,k,v,o (no bias) + SwiGLU gate/up/down + 2 RMSNorm weights
    return 4 * h * h + 3 * h * ffn + 2 * h


def known_models() -> list[str]:
    """Preset names, e.g. ``['llama-13b', 'llama-30b', 'llama-65b', 'llama-7b']``."""
    return sorted(LLAMA_SHAPES)


def preset(name: str) -> ModelSpec:
    """A LLaMA preset by name: ``llama-7b``, ``7b``, ``LLaMA-7B`` (case-insensitive).

    >>> preset("LLaMA-65B").layers
    80
    """
    key = str(name).strip().lower().replace("_", "-")
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
