"""The unit decomposition every planner shares (a leaf module: models only).

The model is cut into *units*: ``embed`` (token embedding, vocab·h), decoder layers
``L0 .. L{L-1}``, and ``head`` (final norm + untied LM head, vocab·h + h), so that per-unit
traffic sums to the whole model (:mod:`parosim.plan`). With pipeline parallelism the layers
are cut into p·v chunks (:func:`chunk_units`, :mod:`parosim.plan.threed`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..errors import InputError
from ..spec.model import ModelSpec


@dataclass(frozen=True)
class Unit:
    label: str           # "embed", "L3", "head"
    layer: int | None
    params: int          # whole-model parameters of the unit (split by t per GPU with TP)
    kind: str            # "embed", "layer", "head"


def model_units(model: ModelSpec) -> list[Unit]:
    """embed, L0 .. L{L-1}, head."""
    layers = [Unit(f"L{i}", i, model.layer_params, "layer") for i in range(model.layers)]
    return ([Unit("embed", None, model.embedding_params, "embed")] + layers
            + [Unit("head", None, model.head_params, "head")])


def chunk_units(model: ModelSpec, par) -> list[list[Unit]]:
    """Units of every virtual stage of a :class:`~parosim.plan.layout.ParallelSpec` (chunk c
    of stage k is index c·p + k)."""
    return _chunk_units(model, par.pp, par.virtual)


@lru_cache(maxsize=512)
def _chunk_units(model: ModelSpec, pp: int, virtual: int) -> list[list[Unit]]:
    model.require_shape("a pipeline plan")
    chunks = pp * virtual
    if model.layers % chunks:
        raise InputError(f"model {model.name!r} has {model.layers} layers, not divisible "
                         f"into --pp {pp} x {virtual} virtual stage(s) = {chunks} "
                         "equal chunks; expected a pipeline degree (x chunks) that divides "
                         "the layer count")
    per = model.layers // chunks
    out = []
    for vs in range(chunks):
        units = [Unit(f"L{i}", i, model.layer_params, "layer")
                 for i in range(vs * per, (vs + 1) * per)]
        if vs == 0:
            units.insert(0, Unit("embed", None, model.embedding_params, "embed"))
        if vs == chunks - 1:
            head = model.head_params
            if getattr(model, "tied_embeddings", False) and pp > 1:
                head += model.vocab * model.hidden   # Megatron's copy on the last stage
            units.append(Unit("head", None, head, "head"))
        out.append(units)
    return out
