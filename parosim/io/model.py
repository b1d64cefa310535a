"""Model specs from a preset name or a YAML file.

The YAML is either a shape (the parameter count is derived)::

    name: llama-7b
    layers: 32
    hidden: 4096
    ffn_hidden: 11008
    heads: 32
    vocab: 32000

Optional architecture keys (defaults: LLaMA's): ``kv_heads`` (grouped-query attention),
``mlp`` (swiglu | gelu), ``norm`` (rmsnorm | layernorm), ``bias`` (true: biased linears),
``tied_embeddings`` (true: the LM head reuses the embedding), ``pos_embedding`` (rows of a
learned position embedding)::

    name: llama-3-8b
    layers: 32
    hidden: 4096
    ffn_hidden: 14336
    heads: 32
    kv_heads: 8
    vocab: 128256

or a bare parameter count (only memory questions work for such a model)::

    name: my-7.5b
    params: 7.5e9

Keys are checked strictly: an unknown key is an error naming the allowed ones.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..spec.model import ModelSpec, is_preset, known_models, preset
from .yamlspec import check_keys, number, positive_int, read_yaml

_SHAPE = ("layers", "hidden", "ffn_hidden", "heads", "vocab")
_ARCH = ("kv_heads", "mlp", "norm", "bias", "tied_embeddings", "pos_embedding")
_KEYS = {"name", "params", "sources", "notes", *_SHAPE, *_ARCH}


def model_from_dict(data: dict[str, Any], where: str = "model") -> ModelSpec:
    """Build a :class:`ModelSpec` from a parsed YAML mapping.

    >>> model_from_dict({"name": "m", "params": 7.5e9}).params
    7500000000
    """
    check_keys(data, _KEYS, where)
    if "name" not in data:
        raise InputError(f"{where}: missing required key 'name'")
    name = str(data["name"])
    shape = {k: data[k] for k in _SHAPE if k in data}
    if shape:
        if len(shape) != len(_SHAPE):
            missing = [k for k in _SHAPE if k not in shape]
            raise InputError(f"{where}: shape is incomplete, missing {', '.join(missing)}; "
                             f"expected all of {', '.join(_SHAPE)} or only 'params'")
        dims = {k: positive_int(v, f"{where}: {k}") for k, v in shape.items()}
        params = None
        if "params" in data:
            params = _count(data["params"], where)
        arch = {k: data[k] for k in _ARCH if k in data}
        for k in ("kv_heads",):
            if k in arch:
                arch[k] = positive_int(arch[k], f"{where}: {k}")
        if "pos_embedding" in arch:
            v = arch["pos_embedding"]
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise InputError(f"{where}: pos_embedding = {v!r} must be a non-negative "
                                 "integer (rows of a learned position embedding)")
        for k in ("mlp", "norm"):
            if k in arch:
                arch[k] = str(arch[k]).strip().lower()
        return ModelSpec(name, params=params, **dims, **arch)
    extra = [k for k in _ARCH if k in data]
    if extra:
        raise InputError(f"{where}: {', '.join(extra)} describe a shape; give the shape "
                         f"({', '.join(_SHAPE)}) too, or only 'params'")
    if "params" not in data:
        raise InputError(f"{where}: needs either the shape ({', '.join(_SHAPE)}) or 'params'")
    return ModelSpec(name, params=_count(data["params"], where))


MAX_PARAMS = 1e15  # 1,000 x the largest published dense models; docs/limits.md

_SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def _count(value: Any, where: str) -> int:
    """A parameter count: a number, or a string like ``7.5e9`` or ``7.5B`` (PyYAML reads
    ``7.5e9`` without a sign in the exponent as a string)."""
    if isinstance(value, str):
        text = value.strip().lower()
        scale = _SUFFIX.get(text[-1:], 1.0)
        try:
            value = float(text[:-1] if scale != 1.0 else text) * scale
        except ValueError:
            raise InputError(f"{where}: params = {value!r} must be a number of parameters "
                             "(e.g. 7.5e9 or 7.5B)") from None
    v = number(value, f"{where}: params")
    if not math.isfinite(v):
        raise InputError(f"{where}: params = {value!r} must be finite")
    if v > MAX_PARAMS:
        raise InputError(f"{where}: params = {value!r} is more than {MAX_PARAMS:.0e}, the "
                         "simulator's limit; expected a parameter count such as 7.5e9")
    if not (v >= 1 and v == int(v)):
        raise InputError(f"{where}: params = {value!r} must be a positive whole number "
                         "(e.g. 7.5e9)")
    return int(v)


def load_model(name_or_path: str | Path) -> ModelSpec:
    """A preset (``llama-7b``, ``7b``, ``LLaMA-65B``) or a YAML path.

    >>> load_model("llama-13b").params
    13015864320
    """
    text = str(name_or_path)
    path = Path(text)
    if text.endswith((".yaml", ".yml")) or path.is_file():
        return model_from_dict(read_yaml(path, "model"), where=f"model {str(path)!r}")
    if is_preset(text):
        return preset(text)
    raise InputError(f"unknown model {text!r}; expected a YAML path or one of "
                     f"{', '.join(known_models())}")
