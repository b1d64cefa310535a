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

A HuggingFace ``config.json`` of a dense LLaMA / Mistral / Qwen2-style model is read too
(:func:`model_from_hf_config`): a ``.json`` path whose mapping has ``model_type``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..spec.model import ModelSpec, is_preset, known_models, preset
from ..spec.moe import Attention, MoE
from .yamlspec import MAX_YAML_BYTES, check_keys, name_value, number, positive_int, read_yaml

_SHAPE = ("layers", "hidden", "ffn_hidden", "heads", "vocab")
_ARCH = ("kv_heads", "mlp", "norm", "bias", "tied_embeddings", "pos_embedding")
_KEYS = {"name", "params", "sources", "notes", "attention", "moe", *_SHAPE, *_ARCH}
_ATTENTION_KEYS = {f for f in Attention.__dataclass_fields__}
_MOE_KEYS = {f for f in MoE.__dataclass_fields__}


def _sub(data: dict[str, Any], key: str, kind: type, keys: set[str], where: str) -> Any:
    """The ``attention`` / ``moe`` mapping of a model YAML as its spec, or None."""
    if key not in data or data[key] is None:
        return None
    v = data[key]
    if not isinstance(v, dict):
        raise InputError(f"{where}: {key} must be a mapping of {', '.join(sorted(keys))}; got "
                         f"{v!r}")
    check_keys(v, keys, f"{where}: {key}")
    vals = dict(v)
    if key == "moe":
        missing = [k for k in ("experts", "top_k", "expert_ffn") if k not in vals]
        if missing:
            raise InputError(f"{where}: moe: missing required key {missing[0]!r}; a moe "
                             "mapping needs experts, top_k, expert_ffn")
    if key == "attention" and "kind" in vals:
        vals["kind"] = str(vals["kind"]).strip().lower()
    try:
        return kind(**vals)
    except InputError as e:
        raise InputError(f"{where}: {e}") from None


def model_from_dict(data: dict[str, Any], where: str = "model") -> ModelSpec:
    """Build a :class:`ModelSpec` from a parsed YAML mapping.

    >>> model_from_dict({"name": "m", "params": 7.5e9}).params
    7500000000
    """
    check_keys(data, _KEYS, where)
    if "name" not in data:
        raise InputError(f"{where}: missing required key 'name'")
    name = name_value(data["name"], where)
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
        arch["attention"] = _sub(data, "attention", Attention, _ATTENTION_KEYS, where)
        arch["moe"] = _sub(data, "moe", MoE, _MOE_KEYS, where)
        return ModelSpec(name, params=params, **dims, **arch)
    extra = [k for k in (*_ARCH, "attention", "moe") if k in data]
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


# --- HuggingFace config.json --------------------------------------------------------------
# model_type -> (architecture accepted, default of tie_word_embeddings in its config class).
# Each is a decoder of the LLaMA layout: RMSNorm, rotary positions (no position-embedding
# weights), a gated SiLU MLP (SwiGLU: gate, up, down), optional grouped-query attention.
HF_MODEL_TYPES: dict[str, tuple[str, bool]] = {
    "llama": ("LlamaForCausalLM", False),
    "mistral": ("MistralForCausalLM", False),
    "qwen2": ("Qwen2ForCausalLM", False),
    "mixtral": ("MixtralForCausalLM", False),
    "qwen3_moe": ("Qwen3MoeForCausalLM", False),
}
# mixture-of-experts model types -> their keys: (read into the MoE spec, read and ignored)
HF_MOE_TYPES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # Mixtral: every layer a MoE of num_local_experts experts of intermediate_size
    "mixtral": (("num_local_experts", "num_experts_per_tok", "router_jitter_noise"),
                ("router_aux_loss_coef", "output_router_logits")),
    # Qwen3-MoE: experts of moe_intermediate_size; q / k RMSNorm per head; head_dim free
    "qwen3_moe": (("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                   "decoder_sparse_step", "mlp_only_layers"),
                  ("router_aux_loss_coef", "output_router_logits", "norm_topk_prob")),
}
# types parosim knows to be MoE or MLA models whose configs it does not read yet: the preset
HF_PRESET_ONLY = {"deepseek_v3": "deepseek-v3", "gpt_oss": "gpt-oss-120b"}
# config.json key -> ModelSpec field (required: without them the shape is unknown)
HF_REQUIRED: dict[str, str] = {
    "hidden_size": "hidden", "num_hidden_layers": "layers", "num_attention_heads": "heads",
    "intermediate_size": "ffn_hidden", "vocab_size": "vocab",
}
# keys read and checked against what the model can honour
HF_CHECKED = ("model_type", "architectures", "num_key_value_heads", "tie_word_embeddings",
              "hidden_act", "head_dim", "attention_bias", "mlp_bias", "sliding_window",
              "use_sliding_window", "max_window_layers", "max_position_embeddings",
              "quantization_config")
# keys that change neither the parameter count, the memory nor the compute parosim models:
# token ids, initialisation, numerics of the norm / rotary embedding, inference caching,
# the checkpoint's storage dtype (training precision is --precision), dropout rates
HF_IGNORED = ("_name_or_path", "bos_token_id", "eos_token_id", "pad_token_id",
              "initializer_range", "rms_norm_eps", "rope_theta", "rope_scaling",
              "pretraining_tp", "torch_dtype", "transformers_version", "use_cache",
              "attention_dropout", "output_attentions", "output_hidden_states",
              "return_dict", "is_decoder")
# keys of mixture-of-experts configs (Mixtral, Qwen2-MoE, DeepSeek, ...): refused
HF_MOE = ("num_local_experts", "num_experts", "num_experts_per_tok", "n_routed_experts",
          "n_shared_experts", "moe_intermediate_size", "shared_expert_intermediate_size",
          "router_aux_loss_coef", "output_router_logits", "decoder_sparse_step",
          "moe_layer_freq", "first_k_dense_replace", "num_experts_per_token")


def model_from_hf_config(data: dict[str, Any], where: str = "config.json",
                         name: str | None = None) -> ModelSpec:
    """A :class:`ModelSpec` from a HuggingFace ``config.json`` mapping of a dense LLaMA,
    Mistral or Qwen2 model; anything the model cannot represent is an :class:`InputError`.

    Mapped: ``hidden_size`` -> hidden, ``num_hidden_layers`` -> layers,
    ``num_attention_heads`` -> heads, ``num_key_value_heads`` -> kv_heads (grouped-query
    attention), ``intermediate_size`` -> ffn_hidden (of the gated SiLU MLP), ``vocab_size`` ->
    vocab, ``tie_word_embeddings`` -> tied_embeddings. Refused: mixture-of-experts keys, an
    architecture other than those of :data:`HF_MODEL_TYPES`, an activation other than SiLU,
    a ``head_dim`` other than hidden / heads, sliding-window attention, biases on only part of
    the linears, quantized checkpoints, and any key parosim does not know. Qwen2's q / k / v
    biases (``2·kv_dim + hidden`` per layer, 0.002 % of Qwen2-7B) have no field in the model
    and are not counted (docs/model-yaml.md).

    >>> m = model_from_hf_config({"model_type": "llama", "hidden_size": 4096,
    ...     "num_hidden_layers": 32, "num_attention_heads": 32, "intermediate_size": 11008,
    ...     "vocab_size": 32000}, name="llama-2-7b")
    >>> m.params
    6738415616
    """
    if not isinstance(data, dict):
        raise InputError(f"{where}: must hold a JSON object of config keys, got "
                         f"{type(data).__name__}")
    mtype = data.get("model_type")
    if mtype in HF_PRESET_ONLY:
        raise InputError(f"{where}: model_type = {mtype!r} config.json files are not read yet; "
                         f"use the preset --model {HF_PRESET_ONLY[mtype]} (docs/moe.md)")
    moe_keys, moe_ignored = HF_MOE_TYPES.get(mtype, ((), ()))
    moe = [k for k in HF_MOE if k in data and k not in (*moe_keys, *moe_ignored)]
    if moe:
        raise InputError(f"{where}: {moe[0]!r} describes a mixture-of-experts model of "
                         "another kind; parosim reads dense LLaMA / Mistral / Qwen2 configs "
                         f"and the MoE types {', '.join(HF_MOE_TYPES)}")
    unknown = sorted(set(map(str, data)) - {*HF_REQUIRED, *HF_CHECKED, *HF_IGNORED,
                                            *moe_keys, *moe_ignored})
    if unknown:
        raise InputError(f"{where}: key {unknown[0]!r} is not one parosim knows how to honour "
                         f"for a {data.get('model_type', 'HuggingFace')} config; remove it if "
                         "it changes neither the weights nor the compute (docs/model-yaml.md)")
    if mtype not in HF_MODEL_TYPES:
        raise InputError(f"{where}: model_type = {mtype!r} is not supported; expected one of "
                         f"{', '.join(HF_MODEL_TYPES)} (dense decoders of the LLaMA layout)")
    arch_name, tied_default = HF_MODEL_TYPES[mtype]
    archs = data.get("architectures", [arch_name])
    if archs != [arch_name]:
        raise InputError(f"{where}: architectures = {archs!r} does not match model_type "
                         f"{mtype!r}; expected [{arch_name!r}]")
    missing = [k for k in HF_REQUIRED if k not in data]
    if missing:
        raise InputError(f"{where}: missing required key {missing[0]!r}; a config needs "
                         f"{', '.join(HF_REQUIRED)}")
    dims = {f: positive_int(data[k], f"{where}: {k}") for k, f in HF_REQUIRED.items()}
    act = data.get("hidden_act", "silu")
    if act != "silu":
        raise InputError(f"{where}: hidden_act = {act!r} is not modelled; the gated MLP of a "
                         f"{mtype} model is modelled with SiLU (SwiGLU) only")
    heads, hidden = dims["heads"], dims["hidden"]
    head_dim = data.get("head_dim")
    if mtype == "qwen3_moe":
        head_dim = positive_int(head_dim if head_dim is not None else hidden // heads,
                                f"{where}: head_dim")
    elif head_dim is not None and (hidden % heads or head_dim != hidden // heads):
        raise InputError(f"{where}: head_dim = {head_dim!r} differs from hidden_size / "
                         f"num_attention_heads = {hidden / heads:g}; parosim's attention has "
                         "head_dim = hidden / heads")
    kv = data.get("num_key_value_heads")
    kv = None if kv is None else positive_int(kv, f"{where}: num_key_value_heads")
    attn_bias = data.get("attention_bias", False)
    mlp_bias = data.get("mlp_bias", False)
    for k, v in (("attention_bias", attn_bias), ("mlp_bias", mlp_bias)):
        if not isinstance(v, bool):
            raise InputError(f"{where}: {k} = {v!r} must be true or false")
    if mtype == "qwen3_moe" and attn_bias:
        raise InputError(f"{where}: attention_bias = true is not modelled for qwen3_moe (biases "
                         "on the attention linears only); expected false")
    if attn_bias != mlp_bias:
        raise InputError(f"{where}: attention_bias = {str(attn_bias).lower()} with mlp_bias = "
                         f"{str(mlp_bias).lower()} is not modelled; biases are on every "
                         "linear layer or on none")
    window = data.get("sliding_window")
    if data.get("use_sliding_window", mtype != "qwen2") and window is not None:
        raise InputError(f"{where}: sliding_window = {window!r} is not modelled (attention "
                         "covers the whole sequence); set it to null to simulate full "
                         "attention")
    if data.get("quantization_config") is not None:
        raise InputError(f"{where}: quantization_config describes a quantized checkpoint; "
                         "parosim trains bf16 / fp8 weights (--precision)")
    tied = data.get("tie_word_embeddings", tied_default)
    if not isinstance(tied, bool):
        raise InputError(f"{where}: tie_word_embeddings = {tied!r} must be true or false")
    pos = data.get("max_position_embeddings")
    if pos is not None:
        positive_int(pos, f"{where}: max_position_embeddings")  # rotary: no weights
    if name is None:
        name = str(data.get("_name_or_path") or f"hf-{mtype}")
    extra = _hf_moe(data, mtype, where, dims["ffn_hidden"], head_dim)
    return ModelSpec(name, **dims, kv_heads=None if kv in (None, heads) else kv,
                     bias=attn_bias, tied_embeddings=tied, **extra)


def _hf_moe(data: dict[str, Any], mtype: str, where: str, ffn: int,
            head_dim: int | None) -> dict[str, Any]:
    """The ``moe`` and ``attention`` fields of a Mixtral or Qwen3-MoE config (docs/moe.md)."""
    if mtype not in HF_MOE_TYPES:
        return {}
    if mtype == "mixtral":
        jitter = data.get("router_jitter_noise", 0.0)
        if jitter not in (0, 0.0) or isinstance(jitter, bool):
            raise InputError(f"{where}: router_jitter_noise = {jitter!r} is not modelled "
                             "(routing is drawn by parosim's own seeded distributions); "
                             "expected 0")
        return {"moe": MoE(experts=positive_int(data.get("num_local_experts", 8),
                                                f"{where}: num_local_experts"),
                           top_k=positive_int(data.get("num_experts_per_tok", 2),
                                              f"{where}: num_experts_per_tok"),
                           expert_ffn=ffn)}
    step = data.get("decoder_sparse_step", 1)
    if step != 1:
        raise InputError(f"{where}: decoder_sparse_step = {step!r} is not modelled (dense "
                         "layers interleaved with MoE layers); expected 1")
    only = data.get("mlp_only_layers", [])
    if only not in ([], None):
        raise InputError(f"{where}: mlp_only_layers = {only!r} is not modelled (dense layers "
                         "between MoE layers); expected []")
    for k in ("num_experts", "num_experts_per_tok", "moe_intermediate_size"):
        if k not in data:
            raise InputError(f"{where}: missing required key {k!r} of a qwen3_moe config")
    return {"moe": MoE(experts=positive_int(data["num_experts"], f"{where}: num_experts"),
                       top_k=positive_int(data["num_experts_per_tok"],
                                          f"{where}: num_experts_per_tok"),
                       expert_ffn=positive_int(data["moe_intermediate_size"],
                                               f"{where}: moe_intermediate_size")),
            "attention": Attention(head_dim=head_dim, qk_norm=True)}


def read_hf_config(path: str | Path) -> ModelSpec:
    """A ModelSpec from a HuggingFace ``config.json`` file (:func:`model_from_hf_config`);
    the model is named after the file's folder for ``config.json``, else after the file."""
    p = Path(path)
    where = f"model {str(p)!r}"
    try:
        if p.stat().st_size > MAX_YAML_BYTES:
            raise InputError(f"{where} is larger than 16 MiB; expected a config.json")
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{where} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{where} cannot be read: {e}") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{where} is malformed JSON at line {e.lineno}: {e.msg}") from None
    if not isinstance(data, dict):
        raise InputError(f"{where} must hold a JSON object, got {type(data).__name__}")
    if "model_type" not in data:  # parosim's own keys, written as JSON
        return model_from_dict(data, where=where)
    name = p.resolve().parent.name if p.name == "config.json" else p.stem
    return model_from_hf_config(data, where=where, name=name or None)


def model_file(name_or_path: str | Path) -> Path | None:
    """The file :func:`load_model` reads for ``name_or_path`` (a ``.json`` / ``.yaml`` name or
    an existing file), or None for a preset name (presets are code: the parosim version keys
    them). Sweeps key their points on the file's contents (:mod:`parosim.io.sweep`)."""
    text = str(name_or_path)
    path = Path(text)
    if text.endswith((".json", ".yaml", ".yml")) or path.is_file():
        return path
    return None


def load_model(name_or_path: str | Path) -> ModelSpec:
    """A preset (``llama-7b``, ``7b``, ``LLaMA-65B``), a YAML path or a HuggingFace
    ``config.json`` path.

    >>> load_model("llama-13b").params
    13015864320
    """
    text = str(name_or_path)
    path = Path(text)
    if model_file(text) is not None and text.endswith(".json"):
        return read_hf_config(path)
    if model_file(text) is not None:
        return model_from_dict(read_yaml(path, "model"), where=f"model {str(path)!r}")
    if is_preset(text):
        return preset(text)
    raise InputError(f"unknown model {text!r}; expected a YAML or config.json path or one of "
                     f"{', '.join(known_models())}")
