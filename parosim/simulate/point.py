"""A sweep point (a dict of the sweep keys, docs/sweeps.md) -> one flat row of
``results.csv``: the pure function a step sweep maps over its grid.

The keys are ``parosim simulate``'s options: a dense model runs
:func:`~parosim.simulate.step.simulate_step` as ``simulate`` does; a mixture-of-experts model
runs the command line's own MoE step (:mod:`parosim.simulate.moe_flags`: EP x DP on the engine
or in closed form, or the TP / PP closed form), the point read as ``simulate``'s flags, so
that a row holds the numbers ``parosim simulate ... --json`` prints for the same inputs and
a point the command line refuses records the same line as its ``reason``.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from ..collectives.types import Algo, parse_enum
from ..errors import InputError
from ..io import load_cluster, load_model
from ..io.cluster_base import split_sets
from ..plan.layout import ParallelSpec
from ..spec.strategy import parse_strategy
from ..spec.training import (
    ACCURATE_ALGO,
    DEFAULT_FIDELITY,
    TrainingSpec,
    accum_for_global_batch,
    check_fidelity,
    for_fidelity,
    parse_trainable_ratio,
    training_from_flags,
)
from ..units import parse_bandwidth, parse_size
from .moe_flags import (
    MOE_FLAGS,
    moe_parallel_step,
    moe_step,
    refuse_moe_flags,
    wants_moe_parallel,
)
from .plausible import plausibility_notes, scale_note
from .step import (
    MODES,
    cluster_from_flags,
    dp_keys,
    resolve_runtime,
    seeded,
    simulate_step,
    with_overrides,
)

POINT_DEFAULTS = {"kind": "step", "model": "llama-7b", "cluster": "paper-a100-roce",
                  "nodes": None, "group_nodes": None, "strategy": "NIG", "algo": "ho-ring",
                  "trainable_ratio": "full", "micro_batch": 4, "accum": 10, "seq_len": 512,
                  "mode": "engine", "nic_bandwidth": None, "intra_bandwidth": None,
                  "gpu_memory": None, "recompute": None, "runtime": "ideal",
                  "overlap_slowdown": None, "precision": "bf16"}

RESULT_COLUMNS = ("status", "reason", "warnings", "gpus", "step_time_s", "tokens_per_s",
                  "tokens_per_s_per_gpu", "samples_per_s", "tflops_per_gpu", "mfu",
                  "exposed_comm_s", "bytes_intra", "bytes_inter", "model_states_bytes",
                  "activations_bytes", "buffers_bytes", "total_bytes", "capacity_bytes",
                  "shortfall_bytes", "fits")

#: the result columns of a mixture-of-experts point (docs/sweeps.md; a sweep with a MoE model
#: has them, empty on its dense rows); the MoE inputs ``ep``, ``expert_strategy`` and
#: ``a2a_algo`` are filled with the values that applied
MOE_RESULT_COLUMNS = ("edp", "ep_nodes", "a2a_size_bytes", "a2a_per_step",
                      "expert_states_bytes", "dense_states_bytes", "balanced_step_s",
                      "step_time_p50_s", "step_time_p99_s", "step_time_max_s",
                      "imbalance_cost", "micro_batches", "bubble_fraction", "a2a_exposed_s")
#: the MoE input keys (= ``parosim simulate``'s MoE flags)
MOE_KEYS = tuple(dest for dest, _ in MOE_FLAGS)
#: the MoE inputs a MoE row holds as they applied (given or not)
APPLIED = ("ep", "expert_strategy", "a2a_algo")


def check_point_keys(point: dict) -> None:
    """A misspelled key is an error, not a silently ignored value (``mode`` defaults to
    ``engine``, as on the command line)."""
    if not isinstance(point, dict):
        raise InputError(f"a point must be a dict of inputs, got {type(point).__name__}")
    import difflib  # deferred: only to suggest a key on a typo

    from ..io.sweep import INPUT_KEYS  # deferred: sweep-point checks only
    allowed = set(POINT_DEFAULTS) | set(INPUT_KEYS["step"]) | set(RESULT_COLUMNS) | set(
        MOE_RESULT_COLUMNS) | {"point_id"}
    unknown = sorted(str(k) for k in point if k not in allowed)
    if unknown:
        near = difflib.get_close_matches(unknown[0], sorted(allowed), n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise InputError(f"point key {unknown[0]!r} is not known{hint}; expected some of "
                         f"{', '.join(sorted(set(POINT_DEFAULTS) | set(INPUT_KEYS['step'])))}")


def point_setup(point: dict):
    """(model, cluster, training, strategy, algo, mode, runtime) from a sweep point (raises
    :class:`InputError` on a bad value): the keys as ``parosim simulate`` reads its flags
    (docs/sweeps.md, "Keys")."""

    check_point_keys(point)
    p = {**POINT_DEFAULTS, **point}
    cluster = load_cluster(p["cluster"], p["nodes"], p["group_nodes"],
                           split_sets(p.get("cluster_set")))
    cluster = with_overrides(
        cluster,
        parse_bandwidth(p["nic_bandwidth"], "nic_bandwidth") if p["nic_bandwidth"] else None,
        parse_bandwidth(p["intra_bandwidth"], "intra_bandwidth")
        if p["intra_bandwidth"] else None,
        parse_size(p["gpu_memory"], "gpu_memory") if p["gpu_memory"] else None)
    if point.get("seed") is not None and cluster.network.ecmp == "hash":   # as --seed
        cluster = replace(cluster, network=replace(cluster.network, ecmp_seed=point["seed"]))
    rc = p["recompute"]
    rc = {"auto": None, "on": True, "off": False, "full": True, "none": False,
          "selective": False}.get(rc, rc) if isinstance(rc, str) else rc
    strategy, micro, accum = p["strategy"], p["micro_batch"], p["accum"]
    rt = resolve_runtime(p["runtime"])
    if p.get("deepspeed_config"):
        from ..io.runtime import deepspeed_config_runtime  # deferred: DeepSpeed points only

        if p["runtime"] not in (None, "ideal", "deepspeed"):
            raise InputError(f"deepspeed_config is read into runtime deepspeed; got runtime "
                             f"{p['runtime']!r}; expected no runtime or deepspeed")
        rt, ds_strategy, tr, _ = deepspeed_config_runtime(p["deepspeed_config"],
                                                          resolve_runtime("deepspeed"),
                                                          cluster.gpus)
        for key, have in (("strategy", ds_strategy), ("micro_batch", tr.get("micro_batch")),
                          ("accum", tr.get("accum"))):
            if key in point and have is not None and point[key] != have and not (
                    key == "strategy" and parse_strategy(point[key]).short == have):
                raise InputError(f"{key} = {point[key]!r} disagrees with deepspeed_config "
                                 f"{p['deepspeed_config']} (gives {have}); expected one of "
                                 "them")
        strategy = ds_strategy
        micro, accum = tr.get("micro_batch", micro), tr.get("accum", accum)
    if p.get("global_batch") is not None:
        dp = cluster.gpus // ((p.get("tp") or 1) * (p.get("pp") or 1) * (p.get("cp") or 1))
        gb_accum = accum_for_global_batch(p["global_batch"], micro, max(dp, 1), p["seq_len"])
        if "accum" in point and point["accum"] != gb_accum:
            raise InputError(f"accum = {point['accum']} disagrees with global_batch "
                             f"{p['global_batch']!r} (which gives accum {gb_accum}); expected "
                             "one of them")
        accum = gb_accum
    extra = {k: p[k] for k in ("compute_model", "attention", "memory_model", "logit_bytes")
             if p.get(k) is not None}
    if p.get("efficiency") is not None:
        extra["compute_efficiency"] = float(p["efficiency"])
    training = TrainingSpec(micro_batch=micro, accum_steps=accum, seq_len=p["seq_len"],
                            trainable_ratio=parse_trainable_ratio(p["trainable_ratio"]),
                            recompute=rc, overlap_slowdown=p["overlap_slowdown"],
                            precision=p["precision"] or "bf16", **extra)
    if p["mode"] not in MODES:
        raise InputError(f"mode {p['mode']!r} is not known; expected one of "
                         f"{', '.join(MODES)}")
    fidelity = check_fidelity(point.get("fidelity") or DEFAULT_FIDELITY, "fidelity")
    algo = p["algo"]
    if fidelity == "accurate":   # the command line's defaults (docs/accuracy.md)
        training = for_fidelity(training, fidelity, rt,
                                layered=not point_parallel(point).trivial, cluster=cluster)
        if "algo" not in point:
            algo = ACCURATE_ALGO
    return (load_model(p["model"]), cluster, training, parse_strategy(strategy),
            parse_enum(Algo, algo, "algo"), p["mode"], rt)


def point_parallel(point: dict):
    """The :class:`~parosim.plan.layout.ParallelSpec` of a sweep point's optional ``tp``,
    ``pp``, ``cp``, ``pp_schedule``, ``virtual_stages``, ``sequence_parallel``, ``tp_algo``,
    ``tp_comm_overlap``, ``dp_comm_overlap`` keys and ``recompute: selective`` (absent:
    plain data parallelism)."""
    tp_algo = point.get("tp_algo")
    return ParallelSpec(tp=point.get("tp") or 1, pp=point.get("pp") or 1,
                        schedule=str(point.get("pp_schedule") or "1f1b").strip().lower(),
                        virtual=point.get("virtual_stages"),
                        sequence_parallel=bool(point.get("sequence_parallel")),
                        selective_recompute=point.get("recompute") == "selective",
                        tp_algo=None if tp_algo is None
                        else parse_enum(Algo, tp_algo, "tp_algo"),
                        tp_comm_overlap=bool(point.get("tp_comm_overlap")),
                        dp_comm_overlap=bool(point.get("dp_comm_overlap")),
                        cp=point.get("cp") or 1)


# ``parosim simulate``'s defaults (argparse ``dest`` -> default); a sweep point read as flags
# starts from them (tests/test_sweep_moe.py compares them with the parser's)
SIMULATE_DEFAULTS = {
    "strategy": None, "algo": None, "mode": "engine", "trace": None, "seed": 0, "repeats": 1,
    "jitter_cv": None, "plot": None, "link_timeline": None, "jobs": None, "ep": None,
    "expert_strategy": None, "a2a_algo": None, "routing": None, "max_over_mean": 1.5,
    "zipf": 1.0, "model": "llama-7b", "micro_batch": 4, "accum": 10, "global_batch": None,
    "seq_len": 512, "trainable_ratio": "full", "recompute": "auto", "fidelity": "accurate",
    "efficiency": None, "overlap_slowdown": None, "runtime": None, "deepspeed_config": None,
    "compute_model": None, "attention": None, "memory_model": None, "precision": "bf16",
    "logit_bytes": None, "gpu_memory": None, "nic_bandwidth": None, "intra_bandwidth": None,
    "tp": 1, "pp": 1, "cp": 1, "pp_schedule": "1f1b", "virtual_stages": None,
    "sequence_parallel": False, "tp_algo": None, "tp_comm_overlap": False,
    "dp_comm_overlap": False, "cluster": "paper-a100-roce", "set": None, "nodes": None,
    "group_nodes": None, "json": False}


def point_flags(point: dict) -> argparse.Namespace:
    """A sweep point as ``parosim simulate``'s parsed flags: the keys are the flags' names
    (``cluster_set`` is ``--set``, its items split), ``recompute: true / false`` is ``on /
    off``; a key not given takes the flag's default."""
    a = argparse.Namespace(command="simulate", **SIMULATE_DEFAULTS)
    for k, v in point.items():
        if k in SIMULATE_DEFAULTS and v is not None:
            setattr(a, k, v)
    if point.get("cluster_set") is not None:
        a.set = split_sets(point["cluster_set"])
    if isinstance(a.recompute, bool):
        a.recompute = "on" if a.recompute else "off"
    a._given_accum = point.get("accum") is not None
    return a


def _routing_keys(point: dict) -> None:
    """``max_over_mean`` / ``zipf`` shape one routing each: given without it they would be
    ignored (the command line cannot tell a default from a given value; a sweep can)."""
    for key, kind in (("max_over_mean", "skew"), ("zipf", "zipf")):
        if point.get(key) is not None and point.get("routing") != kind:
            raise InputError(f"{key} = {point[key]!r} shapes routing {kind} only; got routing "
                             f"{point.get('routing')!r}; expected routing {kind} or no {key}")


def _moe_model(point: dict):
    """The point's model when it is a mixture of experts (None: dense, or a model that does
    not load: the dense path reports it as it always has)."""
    try:
        model = load_model(point.get("model", POINT_DEFAULTS["model"]))
    except InputError:
        return None
    refuse_moe_flags(model, [k for k in MOE_KEYS if point.get(k) is not None])
    return model if model.is_moe else None


def run_moe_point(point: dict, model=None) -> dict:
    """The row of a mixture-of-experts point: ``parosim simulate``'s MoE step of the point
    read as flags (:func:`point_flags`), its JSON flattened into :data:`RESULT_COLUMNS` and
    :data:`MOE_RESULT_COLUMNS`; a refusal is ``status: error`` with the command line's line."""
    row = {**{k: None for k in APPLIED}, **point,
           **{c: None for c in RESULT_COLUMNS + MOE_RESULT_COLUMNS}}
    try:
        check_point_keys(point)
        model = model or load_model(point.get("model", POINT_DEFAULTS["model"]))
        refuse_moe_flags(model, [k for k in MOE_KEYS if point.get(k) is not None])
        if not model.is_moe:
            raise InputError(f"model {model.name!r} is dense; expected a mixture of experts")
        _routing_keys(point)
        a = point_flags(point)
        # as ``parosim simulate`` reads its flags (cli.setup.specs_of, then --seed)
        cluster = cluster_from_flags(a)
        training = training_from_flags(a, cluster.gpus)
        cluster = seeded(cluster, a.seed)
        if wants_moe_parallel(a):
            d = moe_parallel_step(a, model, cluster, training)
            mem = {}
            d["a2a_exposed_s"] = d["stage_microbatch_s"]["a2a_s"]
        else:
            r, _ = moe_step(a, model, cluster, training)
            d = dp_keys(r.to_dict())
            mem = d.pop("memory")
    except InputError as e:
        row.update(status="error", reason=str(e))
        return row
    for c in (*RESULT_COLUMNS, *MOE_RESULT_COLUMNS, *APPLIED):
        if c in d:
            row[c] = d[c]
        elif c in mem:
            row[c] = mem[c]
    if point.get("global_batch") is not None:   # the accumulation it gave
        row["accum"] = training.accum_steps
    if not mem:   # the closed form: memory is not checked
        row.update(status="ok", reason="", fits=None)
    else:
        row["status"] = "ok" if d["fits"] else "does-not-fit"
        row["reason"] = ("" if d["fits"] else
                         f"lacks {mem['shortfall_bytes']:.0f} bytes of memory")
    row["warnings"] = point_warnings(cluster, training, d.get("mfu")
                                     if row["status"] == "ok" else None)
    return row


def run_point(point: dict) -> dict:
    """A sweep point -> one flat result row (a pure function of the point).

    Problems of the point itself (invalid strategy, group size that does not divide, ...)
    become ``status: "error"`` with the reason; a configuration that does not fit becomes
    ``status: "does-not-fit"`` with its memory columns. Columns are listed in
    :data:`RESULT_COLUMNS` (units in their names; bytes and seconds).

    >>> row = run_point({"strategy": "IIG", "mode": "analytic"})
    >>> row["status"], row["gpus"], row["step_time_s"] > 0
    ('ok', 32, True)
    """
    row = {**point, **{c: None for c in RESULT_COLUMNS}}
    try:
        check_point_keys(point)
        moe = _moe_model(point)
        if moe is not None:   # the command line's MoE step
            return run_moe_point(point, moe)
        model, cluster, training, strategy, algo, mode, rt = point_setup(point)
        r = simulate_step(model, cluster, strategy, training, algo, mode, runtime=rt,
                          repeats=point.get("repeats") or 1, seed=point.get("seed") or 0,
                          jitter_cv=point.get("jitter_cv"), parallel=point_parallel(point))
    except InputError as e:
        row.update(status="error", reason=str(e))
        return row
    d = r.to_dict()
    mem = d.pop("memory")
    for c in RESULT_COLUMNS:
        if c in d:
            row[c] = d[c]
        elif c in mem:
            row[c] = mem[c]
    if point.get("global_batch") is not None or point.get("deepspeed_config"):
        # the accumulation (micro-batch) they gave, in the accum (micro_batch) column
        row["accum"], row["micro_batch"] = training.accum_steps, training.micro_batch
    row["status"] = "ok" if r.fits else "does-not-fit"
    row["reason"] = "" if r.fits else f"lacks {mem['shortfall_bytes']:.0f} bytes of memory"
    row["warnings"] = point_warnings(cluster, training, r.mfu if r.fits else None)
    return row


def point_warnings(cluster, training, mfu: float | None) -> str:
    """The cautions ``parosim simulate`` prints for this point (simulate.plausible: outside
    the calibrated region, or beyond the cluster's calibrated node counts), joined by
    `` | ``; empty when none."""
    notes = plausibility_notes({"precision": training.precision,
                                "micro_batch": training.micro_batch,
                                "seq_len": training.seq_len}, cluster.gpu.model,
                               [{"mfu": mfu}] if mfu is not None else [])
    return " | ".join(notes + scale_note(cluster))
