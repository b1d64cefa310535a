"""Runtime profiles from ``runtimes/*.yaml`` and DeepSpeed JSON configs.

A profile YAML (every number with its source in a comment; see ``runtimes/``)::

    name: deepspeed
    framework: DeepSpeed 0.10.0
    stages: {NNN: ZeRO-0, NNG: ZeRO-1, NGG: ZeRO-2, GGG: ZeRO-3}   # empty/absent = all 14
    collective_algo: ring          # ring | paro-cc | null (the run's --algo)
    paro_cc_min_elements: 0
    grad_bucket_elements: 500000000        # null = one bucket per unit
    allgather_bucket_elements: 500000000   # null = one boundary all-gather
    overlap_comm: null             # true | false | null (DeepSpeed: true only for ZeRO-3)
    sync_grads_end_of_backward: true
    prefetch_forward: 1            # units ahead
    prefetch_backward: 1
    persistence_threshold: 100000  # elements
    max_reuse_distance: 1000000000 # elements, 0 = off
    max_live_parameters: 1000000000
    grad_sync_every_micro_step: false
    forward_only_gather: []        # strategies gathered once per micro-step in forward
    overlap_slowdown: 1.189
    memory_model: runtime          # korthikanti | runtime (parosim.cost.memory)
    attention: eager               # eager | flash (the era's model code)
    logit_bytes: 10                # bytes per logit at the loss; null = the memory model's
    sources: free text

:func:`deepspeed_config_runtime` reads a user's DeepSpeed JSON config into the ``deepspeed``
profile (stage -> strategy, buckets, overlap_comm, prefetch, persistence) and the training
settings (micro-batch, accumulation, global batch); every key it cannot honour is refused
with its name, and keys that do not change a step's time or memory are listed back.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..spec.runtime import IDEAL, RuntimeSpec
from ..spec.strategy import parse_strategy
from .yamlspec import check_keys, name_value, read_yaml

_KEYS = {"name", "framework", "stages", "collective_algo", "paro_cc_min_elements",
         "grad_bucket_elements", "allgather_bucket_elements", "overlap_comm",
         "sync_grads_end_of_backward", "prefetch_forward", "prefetch_backward",
         "persistence_threshold", "max_reuse_distance", "max_live_parameters",
         "grad_sync_every_micro_step", "forward_only_gather", "overlap_slowdown", "sources",
         "notes", "reduce_scatter", "memory_model", "attention", "logit_bytes",
         "grad_sync_all_reduce", "grad_sync_last_backward", "param_sync_per_owner",
         "param_sync_overlap_forward", "grad_reduce_per_owner"}


def runtimes_dir() -> Path:
    """Where profiles live: ``$PAROSIM_RUNTIMES`` or the repository's ``runtimes/`` (beside
    ``topologies/``)."""
    env = os.environ.get("PAROSIM_RUNTIMES")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "runtimes"


def available_runtimes() -> list[str]:
    d = runtimes_dir()
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


def _int_or_none(v: Any, name: str, where: str) -> int | None:
    if v is None:
        return None
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise InputError(f"{where}: {name} = {v!r} must be a whole number of elements")
    return v


def _bool(v: Any, name: str, where: str, allow_none: bool = False) -> bool | None:
    if v is None and allow_none:
        return None
    if not isinstance(v, bool):
        raise InputError(f"{where}: {name} = {v!r} must be true or false"
                         + (" or null" if allow_none else ""))
    return v


def runtime_from_dict(data: dict[str, Any], where: str = "runtime") -> RuntimeSpec:
    """Build a :class:`RuntimeSpec` from a parsed YAML mapping (strict keys).

    >>> runtime_from_dict({"name": "x", "stages": {"NGG": "ZeRO-2"}}).label("NGG")
    'NGG (ZeRO-2)'
    """
    check_keys(data, _KEYS, where)
    if "name" not in data:
        raise InputError(f"{where}: missing required key 'name'")
    stages_raw = data.get("stages") or {}
    if not isinstance(stages_raw, dict):
        raise InputError(f"{where}: stages must map PaRO strategies to framework names, got "
                         f"{stages_raw!r}")
    stages = tuple((parse_strategy(str(k)).short, str(v)) for k, v in stages_raw.items())
    fog = data.get("forward_only_gather") or []
    if not isinstance(fog, list):
        raise InputError(f"{where}: forward_only_gather must be a list of strategies")
    d = RuntimeSpec()
    kw: dict[str, Any] = {
        "name": name_value(data["name"], where),
        "framework": str(data.get("framework", d.framework)),
        "stages": stages,
        "collective_algo": data.get("collective_algo"),
        "forward_only_gather": tuple(parse_strategy(str(s)).short for s in fog),
        "overlap_comm": _bool(data.get("overlap_comm", d.overlap_comm), "overlap_comm", where,
                              True),
        "sources": str(data.get("sources", data.get("notes", ""))),
    }
    for k in ("sync_grads_end_of_backward", "grad_sync_every_micro_step", "reduce_scatter",
              "grad_sync_all_reduce", "grad_sync_last_backward", "param_sync_per_owner",
              "param_sync_overlap_forward", "grad_reduce_per_owner"):
        kw[k] = _bool(data.get(k, getattr(d, k)), k, where)
    for k in ("paro_cc_min_elements", "prefetch_forward", "prefetch_backward",
              "persistence_threshold", "max_reuse_distance", "max_live_parameters"):
        kw[k] = _int_or_none(data.get(k, getattr(d, k)), k, where)
        if kw[k] is None:
            raise InputError(f"{where}: {k} must be a number, not null")
    for k in ("grad_bucket_elements", "allgather_bucket_elements"):
        kw[k] = _int_or_none(data.get(k, getattr(d, k)), k, where)
    o = data.get("overlap_slowdown", d.overlap_slowdown)
    if isinstance(o, bool) or not isinstance(o, (int, float)):
        raise InputError(f"{where}: overlap_slowdown = {o!r} must be a number >= 1")
    kw["overlap_slowdown"] = float(o)
    for k in ("memory_model", "attention"):
        v = data.get(k, getattr(d, k))
        if not isinstance(v, str):
            raise InputError(f"{where}: {k} = {v!r} must be a name")
        kw[k] = v
    kw["logit_bytes"] = data.get("logit_bytes")    # checked by RuntimeSpec
    try:
        return RuntimeSpec(**kw)
    except InputError as e:
        raise InputError(f"{where}: {e}") from None


def runtime_file(name_or_path: str | Path) -> Path:
    """The file :func:`load_runtime` reads for ``name_or_path``: the path itself (a ``.yaml``
    name or an existing file), else the profile ``runtimes_dir() / NAME.yaml`` (which may not
    exist). Sweeps key their points on its contents (:mod:`parosim.io.sweep`)."""
    text = str(name_or_path)
    path = Path(text)
    if not (text.endswith((".yaml", ".yml")) or path.exists()):
        path = runtimes_dir() / f"{text.strip().lower()}.yaml"
    return path


def load_runtime(name_or_path: str | Path) -> RuntimeSpec:
    """A profile name (``ideal``, ``deepspeed``, ``fsdp``, ``paro``) or a YAML path.

    >>> load_runtime("deepspeed").label("NGG")
    'NGG (ZeRO-2)'
    """
    text = str(name_or_path)
    path = runtime_file(text)
    if not (text.endswith((".yaml", ".yml")) or Path(text).exists()):
        if not path.exists():
            raise InputError(f"--runtime {text!r} is not known; expected a YAML path or one "
                             f"of {', '.join(available_runtimes()) or '(none found)'}")
    return runtime_from_dict(read_yaml(path, "runtime"), where=f"runtime {str(path)!r}")


# --- DeepSpeed JSON configs ----------------------------------------------------------------

# ZeRO stage -> PaRO strategy (docs/runtimes.md): stage 0 data parallel, 1 optimizer states,
# 2 + gradients, 3 + parameters, each over all GPUs.
DS_STAGES = {0: "NNN", 1: "NNG", 2: "NGG", 3: "GGG"}
# Keys that do not change a step's time or memory in parosim's model: listed back, not used.
_DS_NO_EFFECT = {"optimizer", "scheduler", "gradient_clipping", "steps_per_print",
                 "wall_clock_breakdown", "dump_state", "prescale_gradients",
                 "gradient_predivide_factor", "fp16", "bf16", "amp", "tensorboard",
                 "wandb", "csv_monitor", "comms_logger", "flops_profiler", "checkpoint",
                 "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer",
                 "memory_breakdown", "seed", "data_types"}
_DS_TOP = {"train_batch_size", "train_micro_batch_size_per_gpu",
           "gradient_accumulation_steps", "zero_optimization"}
_ZERO_USED = {"stage", "reduce_bucket_size", "reduce_scatter", "allgather_bucket_size",
              "overlap_comm",
              "stage3_prefetch_bucket_size", "prefetch_bucket_size",
              "stage3_param_persistence_threshold", "param_persistence_threshold",
              "stage3_max_live_parameters", "max_live_parameters",
              "stage3_max_reuse_distance", "max_reuse_distance"}
# Accepted only at the value parosim models (DeepSpeed's default).
_ZERO_FIXED = {"contiguous_gradients": True,
               "allgather_partitions": True, "zero_hpz_partition_size": 1,
               "zero_quantized_weights": False, "zero_quantized_gradients": False,
               "zero_quantized_nontrainable_weights": False, "offload_param": None,
               "offload_optimizer": None, "cpu_offload": False, "cpu_offload_param": False,
               "round_robin_gradients": False, "mics_shard_size": -1}
_ZERO_NO_EFFECT = {"load_from_fp32_weights", "elastic_checkpoint", "sub_group_size",
                   "ignore_unused_parameters", "legacy_stage1",
                   "stage3_gather_16bit_weights_on_model_save",
                   "gather_16bit_weights_on_model_save",
                   "stage3_gather_fp16_weights_on_model_save",
                   "use_multi_rank_bucket_allreduce", "memory_efficient_linear",
                   "stage3_model_persistence_threshold", "model_persistence_threshold"}


def _ds_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are unique (DeepSpeed refuses duplicate keys too)."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise InputError(f"duplicate key {k!r}; expected each key once (DeepSpeed refuses "
                             "duplicates too)")
        out[k] = v
    return out


def _ds_constant(name: str) -> Any:
    raise InputError(f"{name} is not a JSON number; expected a finite number")


def _ds_number(v: Any, name: str, low: int = 0) -> int:
    if isinstance(v, str) and v.strip().lower() == "auto":
        raise InputError(f"--deepspeed-config: {name} = 'auto' is filled in by the HF "
                         "Trainer at launch; expected the number it resolves to")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < low or v != int(v):
        raise InputError(f"--deepspeed-config: {name} = {v!r} must be a "
                         + ("non-negative" if low == 0 else f">= {low}") + " whole number")
    return int(v)


def deepspeed_config_runtime(path: str | Path, base: RuntimeSpec, gpus: int,
                             keys_out: dict | None = None
                             ) -> tuple[RuntimeSpec, str, dict[str, int], list[str]]:
    """(runtime, strategy short name, training settings, keys without effect) from a
    DeepSpeed JSON config; ``base`` is the ``deepspeed`` profile whose defaults fill in
    what the config leaves out. Training settings: ``micro_batch`` and ``accum`` (from
    ``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps`` and
    ``train_batch_size`` = micro x accum x GPUs, checked when all three are given).
    """
    p = Path(path)
    try:
        data = json.loads(p.read_text(), object_pairs_hook=_ds_pairs,
                          parse_constant=_ds_constant)
    except FileNotFoundError:
        raise InputError(f"--deepspeed-config file {str(p)!r} does not exist") from None
    except InputError as e:
        raise InputError(f"--deepspeed-config file {str(p)!r}: {e}") from None
    except (OSError, ValueError) as e:
        raise InputError(f"--deepspeed-config file {str(p)!r} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise InputError(f"--deepspeed-config file {str(p)!r} must hold a JSON object")
    unknown = sorted(set(data) - _DS_TOP - _DS_NO_EFFECT)
    if unknown:
        raise InputError(f"--deepspeed-config: key(s) {', '.join(unknown)} are not modelled by "
                         "parosim; expected only " + ", ".join(sorted(_DS_TOP))
                         + " (and keys without effect on step time: "
                         + ", ".join(sorted(_DS_NO_EFFECT)) + ")")
    no_effect = sorted(k for k in data if k in _DS_NO_EFFECT)
    z = data.get("zero_optimization", {})
    if isinstance(z, bool):
        z = {"stage": 1 if z else 0}
    if not isinstance(z, dict):
        raise InputError("--deepspeed-config: zero_optimization must be an object")
    bad = sorted(set(z) - _ZERO_USED - set(_ZERO_FIXED) - _ZERO_NO_EFFECT)
    if bad:
        raise InputError(f"--deepspeed-config: zero_optimization key(s) {', '.join(bad)} are "
                         "not modelled by parosim; expected "
                         + ", ".join(sorted(_ZERO_USED | set(_ZERO_FIXED))))
    for k, want in _ZERO_FIXED.items():
        off = (want is None and isinstance(z.get(k), dict)   # DeepSpeed's "no offload"
               and str(z[k].get("device", "none")).lower() == "none")
        if k in z and z[k] != want and not (want is None and not z[k]) and not off:
            raise InputError(f"--deepspeed-config: zero_optimization.{k} = {z[k]!r} is not "
                             f"modelled by parosim; expected {json.dumps(want)} (DeepSpeed's "
                             "default)")
    no_effect += sorted(f"zero_optimization.{k}" for k in z if k in _ZERO_NO_EFFECT)
    stage = _ds_number(z.get("stage", 0), "zero_optimization.stage")
    if stage not in DS_STAGES:
        raise InputError(f"--deepspeed-config: zero_optimization.stage = {stage} is not a "
                         "ZeRO stage; expected 0, 1, 2 or 3")

    def get(*names: str, default: Any = None) -> Any:
        for n in names:
            if n in z:
                return z[n]
        return default

    kw: dict[str, Any] = {"name": f"deepspeed ({p.name})"}
    if "reduce_bucket_size" in z:
        kw["grad_bucket_elements"] = _ds_number(z["reduce_bucket_size"],
                                                "reduce_bucket_size", low=1)
    if "allgather_bucket_size" in z:
        kw["allgather_bucket_elements"] = _ds_number(z["allgather_bucket_size"],
                                                     "allgather_bucket_size", low=1)
    if "overlap_comm" in z:
        if not isinstance(z["overlap_comm"], bool):
            raise InputError(f"--deepspeed-config: overlap_comm = {z['overlap_comm']!r} must "
                             "be true or false")
        kw["overlap_comm"] = z["overlap_comm"]
    if "reduce_scatter" in z:
        if not isinstance(z["reduce_scatter"], bool):
            raise InputError(f"--deepspeed-config: reduce_scatter = {z['reduce_scatter']!r} "
                             "must be true or false")
        kw["reduce_scatter"] = z["reduce_scatter"]
    pf = get("stage3_prefetch_bucket_size", "prefetch_bucket_size")
    if pf is not None:
        depth = 1 if _ds_number(pf, "stage3_prefetch_bucket_size") > 0 else 0
        kw["prefetch_forward"] = kw["prefetch_backward"] = depth
    for ds, field in (("param_persistence_threshold", "persistence_threshold"),
                      ("max_live_parameters", "max_live_parameters"),
                      ("max_reuse_distance", "max_reuse_distance")):
        v = get(f"stage3_{ds}", ds)
        if v is not None:
            kw[field] = _ds_number(v, f"stage3_{ds}")
    rt = replace(base, **kw)
    training: dict[str, int] = {}
    mb = data.get("train_micro_batch_size_per_gpu")
    acc = data.get("gradient_accumulation_steps")
    tb = data.get("train_batch_size")
    mb = None if mb is None else _ds_number(mb, "train_micro_batch_size_per_gpu", low=1)
    acc = None if acc is None else _ds_number(acc, "gradient_accumulation_steps", low=1)
    tb = None if tb is None else _ds_number(tb, "train_batch_size", low=1)
    given = {"train_micro_batch_size_per_gpu": mb, "gradient_accumulation_steps": acc,
             "train_batch_size": tb}
    said = ", ".join(f"{k} = {v}" for k, v in given.items() if v is not None)
    if tb is not None:   # DeepSpeed: train_batch_size = micro x accumulation x GPUs
        if mb is not None and acc is not None and tb != mb * acc * gpus:
            raise InputError(f"--deepspeed-config: train_batch_size = {tb} but "
                             f"micro-batch {mb} x accumulation {acc} x {gpus} GPUs = "
                             f"{mb * acc * gpus}; expected them to agree")
        if mb is not None and acc is None:
            acc, rem = divmod(tb, mb * gpus)
            if rem or acc < 1:
                raise InputError(f"--deepspeed-config: train_batch_size = {tb} is not a "
                                 f"multiple of micro-batch {mb} x {gpus} GPUs")
        elif mb is None and acc is None:   # DeepSpeed: accumulation 1, micro = batch / GPUs
            mb, rem = divmod(tb, gpus)
            acc = 1
            if rem or mb < 1:
                raise InputError(f"--deepspeed-config: train_batch_size = {tb} is not a "
                                 f"multiple of the {gpus} GPUs")
        elif acc is not None and mb is None:
            mb, rem = divmod(tb, acc * gpus)
            if rem or mb < 1:
                raise InputError(f"--deepspeed-config: train_batch_size = {tb} is not a "
                                 f"multiple of accumulation {acc} x {gpus} GPUs")
    if mb is not None:
        training["micro_batch"] = mb
    if acc is not None:
        training["accum"] = acc
    if keys_out is not None:   # the keys the settings come from, for messages naming them
        keys_out["keys"] = said
    return rt, DS_STAGES[stage], training, no_effect


def as_runtime(runtime) -> RuntimeSpec:
    """A :class:`RuntimeSpec` from None (ideal), a profile name / YAML path, or a spec."""
    if runtime is None:
        return IDEAL
    if isinstance(runtime, RuntimeSpec):
        return runtime
    return load_runtime(runtime)


def training_for_runtime(training, runtime=None):
    """``training`` with the memory settings it leaves unset (None: ``attention``,
    ``memory_model``, ``logit_bytes``) taken from the runtime profile; explicit ones win.

    >>> from parosim.spec.training import TrainingSpec
    >>> from parosim.spec.runtime import RuntimeSpec
    >>> fsdp = RuntimeSpec(name="f", memory_model="runtime", attention="flash", logit_bytes=6)
    >>> t = training_for_runtime(TrainingSpec(), fsdp)
    >>> t.memory_model, t.attention, t.logit_bytes
    ('runtime', 'flash', 6)
    >>> training_for_runtime(TrainingSpec(attention="eager"), fsdp).attention
    'eager'
    >>> training_for_runtime(TrainingSpec(), None).memory_model
    'korthikanti'
    """
    rt = as_runtime(runtime)
    return training.with_defaults(rt.attention, rt.memory_model, rt.logit_bytes)
