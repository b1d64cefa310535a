"""From parsed flags to the simulator's inputs: model, cluster, training, runtime and
layout specs, the ``settings`` echoed in every result.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace

from ..errors import InputError


def specs_of(a: argparse.Namespace):
    """model, cluster, training from the common flags (io + specs only)."""
    from ..io.model import load_model  # deferred: loaded when the command runs (start-up)
    from ..simulate.moe_flags import refuse_moe_flags  # deferred: loaded when the command runs
    from ..simulate.step import cluster_from_flags  # deferred: loaded when the command runs
    from ..spec.training import (  # deferred: loaded when the command runs (start-up)
        training_from_flags,
    )

    model = load_model(a.model)
    if model.is_extended and not (model.is_moe and a.command in ("simulate", "memory", "compare")
                                  and not getattr(a, "jobs", None)):
        raise InputError(model.refusal(f"parosim {a.command}"))
    # the MoE flags without a default value: a dense model refuses those given
    refuse_moe_flags(model, [k for k in ("ep", "expert_strategy", "a2a_algo", "routing")
                             if getattr(a, k, None) is not None]
                     + [k for k in ("max_over_mean", "zipf") if getattr(a, f"_given_{k}", False)])
    refuse_unused_routing(a)
    cluster = cluster_from_flags(a)
    if not model.is_moe:  # a MoE step refuses --tp-algo itself (simulate.moe_flags)
        refuse_unused_tp_algo(a, cluster)
    training = training_from_flags(a, cluster.gpus)
    return model, cluster, training


# the parameters of one routing kind: (attribute, flag, the --routing they shape)
ROUTING_PARAMS = (("max_over_mean", "--max-over-mean", "skew"), ("zipf", "--zipf", "zipf"))


def refuse_unused_routing(a: argparse.Namespace) -> None:
    """``--max-over-mean`` shapes skew routing and ``--zipf`` zipf routing only: given with
    another (or no) ``--routing`` they would change nothing, so they are refused."""
    routing = getattr(a, "routing", None)
    kind = None if routing is None else str(routing).strip().lower()
    for dest, flag, wants in ROUTING_PARAMS:
        if getattr(a, f"_given_{dest}", False) and kind != wants:
            raise InputError(f"{flag} {getattr(a, dest)} shapes --routing {wants} only; got "
                             f"{'no --routing' if routing is None else '--routing ' + routing}"
                             f"; expected it unset or --routing {wants}")


def refuse_unused_tp_algo(a: argparse.Namespace, cluster) -> None:
    """``--tp-algo`` is the algorithm of tensor-parallel groups that cross nodes; a group
    within a node (``--tp`` <= GPUs per node) runs rings on NVLink, so it is refused there."""
    algo = getattr(a, "tp_algo", None)
    tp = getattr(a, "tp", None) or 1
    if algo is not None and tp <= cluster.gpus_per_node:
        raise InputError(f"--tp-algo {algo} is the algorithm of tensor-parallel groups that "
                         f"cross nodes; --tp {tp} fits in a node of {cluster.gpus_per_node} "
                         f"GPUs, whose TP collectives are rings on NVLink; expected it unset "
                         f"or --tp above {cluster.gpus_per_node}")


def refuse_deterministic_draws(a: argparse.Namespace, cluster, seed: bool = True) -> None:
    """``--repeats`` draws steps with compute jitter: without any (no ``--jitter-cv``, none in
    the cluster) every step is the same, so ``--repeats`` above 1 is refused; ``seed``:
    ``--seed`` (other than 0) is refused too when there is neither jitter nor ECMP hashing
    for it to seed (``simulate``; ``run``'s seed also draws the failures)."""
    cv = a.jitter_cv if a.jitter_cv is not None else cluster.jitter_cv
    if cv > 0:
        return
    if a.repeats > 1:
        raise InputError(f"--repeats {a.repeats} draws steps with compute jitter; cluster "
                         f"{cluster.name!r} has none and --jitter-cv is not above 0, so every "
                         "step is the same; expected --jitter-cv (or a cluster jitter.cv) or "
                         "--repeats 1")
    if seed and a.seed != 0 and cluster.network.ecmp != "hash":
        raise InputError(f"--seed {a.seed} seeds the compute-jitter draws and ECMP hashing; "
                         f"cluster {cluster.name!r} has neither (no jitter, network.ecmp: "
                         f"{cluster.network.ecmp}); expected it unset, a --jitter-cv or a "
                         "fabric with ecmp: hash")


def runtime_of(a: argparse.Namespace, cluster, training):
    """(runtime, training, strategy from the DeepSpeed config or None, config info)."""
    from ..io.runtime import (  # deferred: loaded when the command runs (start-up)
        deepspeed_config_runtime,
        load_runtime,
    )

    info = None
    name = a.runtime
    ds = getattr(a, "deepspeed_config", None)
    if ds and name not in (None, "deepspeed"):
        raise InputError(f"--deepspeed-config is read into --runtime deepspeed; got --runtime "
                         f"{name!r}; expected no --runtime or --runtime deepspeed")
    rt = load_runtime(name or ("deepspeed" if ds else "ideal"))
    strategy = None
    if ds:
        said: dict = {}
        rt, strategy, tr, no_effect = deepspeed_config_runtime(ds, rt, cluster.gpus, said)
        keys = said.get("keys", "")
        gb = getattr(a, "global_batch", None)
        for key, flag, what in (("micro_batch", "--micro-batch", "micro-batch"),
                                ("accum", "--accum", "accumulation")):
            given = getattr(a, key)
            explicit = getattr(a, f"_given_{key}", False) and not (key == "accum" and gb)
            if key in tr and explicit and given != tr[key]:
                raise InputError(f"{flag} {given} disagrees with --deepspeed-config {ds}: "
                                 f"{keys} (gives {what} {tr[key]}); expected one of them")
        training = replace(training, micro_batch=tr.get("micro_batch", training.micro_batch),
                           accum_steps=tr.get("accum", training.accum_steps))
        if gb is not None and keys:
            from ..spec.training import accum_for_global_batch  # deferred: start-up

            seqs = training.micro_batch * training.accum_steps * cluster.gpus
            try:
                ok = accum_for_global_batch(gb, training.micro_batch, cluster.gpus,
                                            training.seq_len) == training.accum_steps
            except InputError:
                ok = False
            if not ok:
                raise InputError(f"--global-batch {gb} disagrees with --deepspeed-config "
                                 f"{ds}: {keys} (gives {seqs} sequences on {cluster.gpus} "
                                 "GPUs); expected one of them")
        if no_effect:
            print("parosim: note: DeepSpeed config keys without effect on the simulated step "
                  f"(not used): {', '.join(no_effect)}", file=sys.stderr)
        info = {"path": str(ds), "strategy": strategy, "no_effect_keys": no_effect}
    if rt.collective_algo is not None and getattr(a, "algo", None) not in (None,):
        raise InputError(f"--algo {a.algo} cannot apply: --runtime {rt.name} fixes each "
                         f"collective's algorithm ({rt.collective_algo}); expected no --algo, "
                         "or --runtime ideal")
    from ..spec.training import for_fidelity  # deferred: loaded when the command runs (start-up)

    training = for_fidelity(training, fidelity_of(a), rt, layered=layered(a), cluster=cluster)
    return rt, training, strategy, info


def fidelity_of(a: argparse.Namespace) -> str:
    """``--fidelity`` (accurate unless the command has no such flag: then paper)."""
    return getattr(a, "fidelity", "paper")


def layered(a: argparse.Namespace) -> bool:
    """True when the flags ask for the TP / PP / CP planner (its own memory estimate)."""
    return ((getattr(a, "tp", 1) or 1) > 1 or (getattr(a, "pp", 1) or 1) > 1
            or (getattr(a, "cp", 1) or 1) > 1 or bool(getattr(a, "sequence_parallel", False))
            or getattr(a, "recompute", None) == "selective")


def parallel_of(a: argparse.Namespace):
    """The ParallelSpec of the --tp / --pp / ... flags."""
    from ..simulate.moe_flags import parallel_of as of_flags  # deferred: start-up

    return of_flags(a)


def dp_keys(d: dict) -> dict:
    """Plain data parallelism in the 3D vocabulary: tp = pp = 1, dp = GPUs, no bubble."""
    from ..simulate.step import dp_keys as keys  # deferred: start-up

    return keys(d)


def algos_of(text: str | None, fidelity: str = "paper"):
    """``--algo``: one algorithm, ``all``, or a comma list (``ring,ho-ring``); unset, NCCL's
    tuner (``fidelity`` accurate) or HO-Ring (paper)."""
    from ..collectives import Algo  # deferred: loaded when the command runs (start-up)
    from ..collectives.bench import parse_algos  # deferred: loaded when the command runs (start-up)

    if text is None:
        return [Algo.NCCL if fidelity == "accurate" else Algo.HO_RING]
    return parse_algos(text)


def seeded(spec, seed: int):
    """The cluster with ``--seed`` as its ECMP hashing seed."""
    from ..simulate.step import seeded as with_seed  # deferred: start-up

    return with_seed(spec, seed)


def settings_of(a: argparse.Namespace, cluster, training, rt=None) -> dict:
    """Every input that shaped the result (echoed in the JSON and the text header)."""
    dp = (cluster.gpus // (getattr(a, "tp", None) or 1) // (getattr(a, "pp", None) or 1)
          // (getattr(a, "cp", None) or 1))
    out = {"nodes": cluster.nodes, "gpus_per_node": cluster.gpus_per_node,
           "group_nodes": cluster.group_nodes, "micro_batch": training.micro_batch,
           "accum_steps": training.accum_steps, "seq_len": training.seq_len,
           "data_parallel": dp,
           "global_batch_seqs": training.micro_batch * training.accum_steps * dp,
           "global_batch_tokens": (training.micro_batch * training.accum_steps * dp
                                   * training.seq_len),
           "trainable_ratio": training.trainable_ratio,
           "recompute": getattr(a, "recompute", "auto"),
           "nic_bandwidth_Bps": cluster.nic.bandwidth_Bps,
           "intra_bandwidth_Bps": cluster.intra.bandwidth_Bps,
           "gpu_memory_bytes": cluster.gpu.memory_bytes,
           "overrides": {k: v for k, v in (("nic_bandwidth", a.nic_bandwidth),
                                           ("intra_bandwidth", a.intra_bandwidth),
                                           ("gpu_memory", a.gpu_memory)) if v is not None}}
    if getattr(a, "set", None):   # --set KEY=VALUE items, as given (only when some are)
        out["cluster_set"] = list(a.set)
    out.update(models_of(a, cluster, training, rt))
    if hasattr(a, "tp_comm_overlap"):
        out["tp_comm_overlap"] = bool(a.tp_comm_overlap)
    if hasattr(a, "dp_comm_overlap"):
        out["dp_comm_overlap"] = bool(a.dp_comm_overlap)
    if (getattr(a, "cp", None) or 1) > 1:   # the key appears only with context parallelism
        out["context_parallel"] = a.cp
    if rt is not None:
        out["runtime"] = rt.name
    return out


def models_of(a: argparse.Namespace, cluster, training, rt=None) -> dict:
    """The models that produced the result, resolved (never None): fidelity, compute model
    (with its efficiency only where it applies: the flat model), attention kernel, memory
    model, bytes per logit at the loss, overlap slowdown, precision."""
    from ..cost.memory import LOGIT_BYTES  # deferred: loaded when the command runs (start-up)
    from ..spec.runtime import (  # deferred: loaded when the command runs (start-up)
        effective_overlap_slowdown,
    )

    own = rt is not None and rt.name != "ideal"
    cm = training.compute_model or cluster.compute.model
    out = {"fidelity": fidelity_of(a), "compute_model": cm}
    if cm == "flat":
        out["compute_efficiency"] = training.compute_efficiency
    lay = layered(a)
    cp_flash = (getattr(a, "cp", 1) or 1) > 1
    out["attention"] = (training.attention or (rt.attention if own else None)
                        or ("flash" if cp_flash else "eager"))
    mm = "korthikanti" if lay else (training.memory_model or (rt.memory_model if own else None)
                                    or "korthikanti")
    out["memory_model"] = mm
    lb = training.logit_bytes
    if lb is None and own:
        lb = rt.logit_bytes
    if lb is None:
        lb = LOGIT_BYTES if mm == "runtime" else 4
    out["logit_bytes"] = lb
    out["overlap_slowdown"] = effective_overlap_slowdown(
        training.overlap_slowdown, cluster.overlap_slowdown, rt)
    out["precision"] = training.precision
    return out


def settings_text(s: dict) -> str:
    ratio = s["trainable_ratio"]
    names = {1.0: "full", 1 / 16: "partial", 3 / 1000: "peft"}
    parts = [f"micro-batch {s['micro_batch']}", f"accum {s['accum_steps']}",
             f"seq-len {s['seq_len']}",
             f"global batch {s['global_batch_seqs']} seqs = {s['global_batch_tokens']} tokens",
             f"trainable ratio {ratio:g}" + (f" ({names[ratio]})" if ratio in names else ""),
             f"recompute {s['recompute']}"]
    if s.get("fidelity"):
        eff = (f" at efficiency {s['compute_efficiency']:g}" if "compute_efficiency" in s
               else "")
        cm = f"compute model {s['compute_model']}{eff}, " if "compute_model" in s else ""
        parts.append(f"fidelity {s['fidelity']}: {cm}"
                     f"attention {s['attention']}, memory model {s['memory_model']} (logits "
                     f"{s['logit_bytes']} B each)")
    elif "compute_efficiency" in s:
        parts.append(f"efficiency {s['compute_efficiency']:g}")
    if s.get("overlap_slowdown") is not None:
        parts.append(f"overlap slowdown {s['overlap_slowdown']:g}")
    if s.get("tp_comm_overlap"):
        parts.append("TP comm overlap on")
    if s.get("dp_comm_overlap"):
        parts.append("DP comm overlap on")
    if s.get("context_parallel", 1) > 1:
        parts.append(f"context parallel {s['context_parallel']} (ring attention)")
    if s.get("precision", "bf16") != "bf16":
        parts.append(f"precision {s['precision']}")
    if s["overrides"]:
        parts.append("overrides: " + ", ".join(f"{k.replace('_', '-')} {v}"
                                                for k, v in s["overrides"].items()))
    return "settings: " + ", ".join(parts)


MAX_WORKERS = 256  # local processes (docs/limits.md); a larger pool is a cluster: --scheduler


def check_workers(n: int) -> None:
    if n < 1:
        raise InputError(f"--workers = {n} must be a positive integer")
    if n > MAX_WORKERS:
        raise InputError(f"--workers = {n} is more than {MAX_WORKERS} local processes; expected "
                         f"at most {MAX_WORKERS} (this machine has {os.cpu_count()} CPUs)")


def strategy_of(a: argparse.Namespace, ds_strategy: str | None) -> str:
    """The strategy of ``--strategy`` (default NIG) or of the DeepSpeed config's stage; both
    given and different: refused with one line."""
    if ds_strategy and a.strategy is not None:
        from ..spec.strategy import parse_strategy  # deferred: start-up

        if parse_strategy(a.strategy).short != ds_strategy:
            raise InputError(f"--strategy {a.strategy} disagrees with the DeepSpeed config's "
                             f"stage ({ds_strategy}); expected one of them")
    return ds_strategy or ("NIG" if a.strategy is None else a.strategy)
