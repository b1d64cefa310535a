"""A MoE step from ``parosim simulate``'s flags: the one place that reads them, refuses what a
MoE step cannot honour and runs it, for the command line and for a sweep point alike (a sweep
reads its point as these flags, :mod:`parosim.simulate.point`), so that both give the same
result and the same one-line refusals (docs/moe.md, "A MoE training step" and "From the
command line").

``a`` is an ``argparse.Namespace`` of ``parosim simulate`` (or any object with the same
attributes). Without ``--tp`` / ``--pp``: EP x DP, :func:`~parosim.simulate.moe.
simulate_moe_step` on the engine or in closed form; with them: the closed form of
:mod:`parosim.evaluate.moe_parallel` with the parameters fitted on Megatron-Bridge's
throughput, analytic only.
"""

from __future__ import annotations

from ..errors import InputError

#: the MoE flags (attribute, flag); a dense model refuses every one given
MOE_FLAGS = (("ep", "--ep"), ("expert_strategy", "--expert-strategy"),
             ("a2a_algo", "--a2a-algo"), ("routing", "--routing"),
             ("max_over_mean", "--max-over-mean"), ("zipf", "--zipf"))


def refuse_moe_flags(model, given) -> None:
    """``given``: the attributes of :data:`MOE_FLAGS` that were set; a dense model refuses
    the first in one line."""
    if model.is_moe:
        return
    for dest, flag in MOE_FLAGS:
        if dest in given:
            raise InputError(f"{flag} is for mixture-of-experts models; model {model.name!r} "
                             "is dense")


def ep_of(a) -> int:
    """``--ep``: 1 when unset; a value given is checked, never replaced (``--ep 0`` is
    refused, not read as unset)."""
    if a.ep is None:
        return 1
    if isinstance(a.ep, bool) or not isinstance(a.ep, int) or a.ep < 1:
        raise InputError(f"--ep = {a.ep} must be a positive integer")
    return a.ep


def parallel_of(a):
    """The :class:`~parosim.plan.layout.ParallelSpec` of the --tp / --pp / ... flags."""
    from ..plan.layout import ParallelSpec  # deferred: the command line's start-up

    return ParallelSpec(tp=a.tp, pp=a.pp, schedule=str(a.pp_schedule).strip().lower(),
                        virtual=a.virtual_stages, sequence_parallel=a.sequence_parallel,
                        selective_recompute=a.recompute == "selective", tp_algo=a.tp_algo,
                        tp_comm_overlap=bool(getattr(a, "tp_comm_overlap", False)),
                        dp_comm_overlap=bool(getattr(a, "dp_comm_overlap", False)),
                        cp=getattr(a, "cp", 1))


# ---------------------------------------------------------------------------------------------
# EP x DP (no --tp / --pp).
# ---------------------------------------------------------------------------------------------


def refuse_layout_flags(a) -> None:
    """The flags a MoE step without ``--tp`` / ``--pp`` cannot honour, each in one line."""
    for flag, value, default in (("--tp", a.tp, 1), ("--pp", a.pp, 1), ("--cp", a.cp, 1),
                                 ("--runtime", a.runtime, None),
                                 ("--deepspeed-config", getattr(a, "deepspeed_config", None),
                                  None),
                                 ("--jitter-cv", getattr(a, "jitter_cv", None), None),
                                 ("--link-timeline", getattr(a, "link_timeline", None),
                                  None)):
        if value != default:
            raise InputError(f"{flag} {value} is not modelled for MoE steps yet; expected it "
                             "unset (expert parallelism beside data parallelism, the ideal "
                             "runtime)")
    if hasattr(a, "pp_schedule"):   # the layout flags' own checks, as for a dense model:
        parallel_of(a)              # e.g. --sequence-parallel without --tp >= 2 is refused
    if getattr(a, "recompute", None) == "selective":
        raise InputError("--recompute selective is not modelled for MoE steps without --tp / "
                         "--pp; expected it off")
    if getattr(a, "tp_algo", None) is not None:
        raise InputError(f"--tp-algo {a.tp_algo} has no tensor-parallel collectives to apply "
                         "to in a MoE step without --tp; expected it unset")


def moe_step(a, model, cluster, training, trace: bool = False):
    """``parosim simulate`` of a MoE model without ``--tp`` / ``--pp``: (the
    :class:`~parosim.simulate.step.StepResult`, its routing or None). Refuses in one line
    every flag this step cannot honour."""
    from ..collectives.bench import parse_algos  # deferred: the command line's start-up
    from ..collectives.types import Algo  # deferred: the command line's start-up
    from ..evaluate.moe_layer import Routing  # deferred: loaded when a MoE step runs
    from .moe import simulate_moe_step  # deferred: loaded when a MoE step runs

    refuse_layout_flags(a)
    if getattr(a, "trace", None) and a.mode != "engine":
        raise InputError("--trace needs --mode engine (the analytic mode has no timeline)")
    algo = [Algo.HO_RING] if a.algo is None else parse_algos(a.algo)
    if len(algo) != 1:
        raise InputError(f"--algo {a.algo} names {len(algo)} algorithms; a list or 'all' is "
                         "for 'parosim compare'; expected one of ring, hierarchical, ho-ring, "
                         "nccl")
    strategy = a.strategy or "NIG"
    est = a.expert_strategy or strategy
    routing = None
    if a.routing is not None:
        routing = Routing(a.routing, a.max_over_mean, a.zipf, a.seed)
    elif a.repeats != 1:
        raise InputError(f"--repeats {a.repeats} draws steps of a --routing; without one the "
                         "MoE step is deterministic; expected --routing or --repeats 1")
    r = simulate_moe_step(model, cluster, strategy, est, training, ep_of(a), algo[0],
                          a.mode, a.a2a_algo or "p2p", routing, a.repeats, a.seed,
                          trace=trace)
    return r, routing


# ---------------------------------------------------------------------------------------------
# TP x PP (VP) x CP x EP: the closed form.
# ---------------------------------------------------------------------------------------------

# the flags this closed form cannot honour, with their "not given" values; any other value is
# refused in one line (the model is Megatron-Core's schedule with its distributed optimizer,
# the kernel compute model and the fitted parameters; nothing else applies)
UNSUPPORTED = (
    ("--strategy", "strategy", None, "Megatron-Core's distributed optimizer is modelled, not "
     "PaRO / ZeRO strategies"),
    ("--expert-strategy", "expert_strategy", None, "the experts' gradients and states follow "
     "the distributed optimizer over EDP"),
    ("--a2a-algo", "a2a_algo", None, "the all-to-alls are NCCL's point-to-point algorithm"),
    ("--algo", "algo", None, "TP rings and all-to-alls have a fixed algorithm here"),
    ("--tp-algo", "tp_algo", None, "TP collectives are rings on NVLink here"),
    ("--routing", "routing", None, "routing is forced balance, as in the calibration rows"),
    ("--max-over-mean", "max_over_mean", 1.5, "routing is forced balance"),
    ("--zipf", "zipf", 1.0, "routing is forced balance"),
    ("--repeats", "repeats", 1, "the closed form is deterministic"),
    ("--seed", "seed", 0, "the closed form draws nothing"),
    ("--jitter-cv", "jitter_cv", None, "the closed form has no jitter"),
    ("--trace", "trace", None, "the closed form has no timeline"),
    ("--plot", "plot", None, "the closed form has no step-time distribution"),
    ("--link-timeline", "link_timeline", None, "the closed form has no timeline"),
    ("--runtime", "runtime", None, "the schedule is Megatron-Core's"),
    ("--deepspeed-config", "deepspeed_config", None, "the schedule is Megatron-Core's"),
    ("--fidelity", "fidelity", "accurate", "the kernel compute model with fitted parameters "
     "applies"),
    ("--efficiency", "efficiency", None, "the GEMM ceiling is fitted per GPU"),
    ("--compute-model", "compute_model", None, "the kernel compute model applies"),
    ("--attention", "attention", None, "FlashAttention at the fitted efficiency applies"),
    ("--memory-model", "memory_model", None, "memory is not checked by the closed form"),
    ("--logit-bytes", "logit_bytes", None, "memory is not checked by the closed form"),
    ("--gpu-memory", "gpu_memory", None, "memory is not checked by the closed form"),
    ("--overlap-slowdown", "overlap_slowdown", None, "overlap is inside the fitted "
     "all-to-all exposure"),
    ("--trainable-ratio", "trainable_ratio", "full", "full training only"),
    ("--tp-comm-overlap", "tp_comm_overlap", False, "TP collectives are charged exposed"),
    ("--group-nodes", "group_nodes", None, "PaRO groups do not apply: the distributed "
     "optimizer shards over the data-parallel group"),
)
RECOMPUTE_OK = ("auto", "off", "none")
ENGINE_REFUSAL = ("--mode engine: the engine does not model MoE steps with --tp / --pp yet "
                  "(the pipeline schedule with expert all-to-alls, TP collectives inside MoE "
                  "layers); expected --mode analytic (the closed form, docs/moe.md)")


def wants_moe_parallel(a) -> bool:
    """A MoE step with tensor or pipeline parallelism: the closed form."""
    return (a.tp or 1) > 1 or (a.pp or 1) > 1


def moe_parallel_step(a, model, cluster, training) -> dict:
    """The closed-form step (docs/moe.md, "From the command line") as ``parosim simulate``'s
    JSON; every flag it cannot honour is refused in one line."""
    from ..evaluate.moe_parallel import (  # deferred: loaded when the closed form runs
        FITTED_RELEASE,
        MoEParallel,
        fitted_efficiency,
        moe_step_time,
    )

    if a.mode != "analytic":
        raise InputError(ENGINE_REFUSAL)
    layout = f"--tp {a.tp} / --pp {a.pp}"
    for flag, dest, default, why in UNSUPPORTED:
        value = getattr(a, dest, default)
        if value != default:
            given = flag if isinstance(value, bool) else f"{flag} {value}"
            raise InputError(f"{given} is not in the MoE closed form with {layout} ({why}); "
                             "expected it unset")
    if a.recompute not in RECOMPUTE_OK:
        raise InputError(f"--recompute {a.recompute} is not in the MoE closed form with "
                         f"{layout} (recomputation is inside the fitted parameters); expected "
                         "auto, off or none")
    if a.tp > 1 and not a.sequence_parallel:
        raise InputError(f"--tp {a.tp} on MoE model {model.name!r} without "
                         "--sequence-parallel: the closed form models sequence parallelism "
                         "(Megatron-Core requires it for MoE layers with TP > 1); expected "
                         "--sequence-parallel")
    ps = parallel_of(a)              # checks --pp-schedule / --virtual-stages
    par = MoEParallel(tp=a.tp, pp=a.pp, vp=ps.virtual if ps.schedule == "interleaved" else 1,
                      cp=a.cp, ep=ep_of(a))
    hardware, eff = fitted_efficiency(cluster.gpu.model)
    if cluster.gpus % (par.tp * par.pp * par.cp):
        raise InputError(f"{cluster.gpus} GPUs are not a multiple of --tp {par.tp} x --pp "
                         f"{par.pp} x --cp {par.cp}")
    dp = cluster.gpus // (par.tp * par.pp * par.cp)
    gbs = training.micro_batch * dp * training.accum_steps
    st = moe_step_time(model, cluster, par, gbs, training.micro_batch, training.seq_len,
                       a.precision, eff)
    stage = {k: getattr(st, k) for k in ("gemm_s", "grouped_gemm_s", "attention_s",
                                          "memory_s", "a2a_s", "tp_s", "host_s")}
    return {
        "model": model.name, "cluster": cluster.name, "gpus": cluster.gpus,
        "mode": "analytic", "method": "moe-closed-form",
        "tp": par.tp, "pp": par.pp, "virtual_stages": par.vp, "cp": par.cp, "ep": par.ep,
        "etp": par.etp, "dp": st.dp, "edp": st.edp,
        "micro_batch": training.micro_batch, "micro_batches": st.microbatches,
        "global_batch_seqs": gbs, "seq_len": training.seq_len, "precision": a.precision,
        "step_time_s": st.step_s, "tokens_per_s_per_gpu": st.tokens_per_s_per_gpu,
        "bubble_s": st.bubble_s, "bubble_fraction": st.bubble_s / st.step_s,
        "p2p_s": st.p2p_s, "optimizer_s": st.optimizer_s,
        "stage_microbatch_s": stage, "rows_per_expert": st.parts["rows_per_expert"],
        "memory_checked": False,
        "calibration": {
            "hardware": hardware,
            "release": f"NeMo {FITTED_RELEASE}",
            **{k: getattr(eff, k) for k in ("gemm_efficiency", "moe_layer_overhead_s",
                                            "a2a_exposed", "attention_efficiency",
                                            "hbm_efficiency", "fp8_gemm_efficiency")},
            "source": eff.source},
        "settings": {"micro_batch": training.micro_batch,
                     "accum_steps": training.accum_steps, "seq_len": training.seq_len,
                     "sequence_parallel": par.tp > 1, "dp_comm_overlap": True,
                     "distributed_optimizer": True, "routing": "forced balance",
                     "recompute": "inside the fitted parameters"},
    }
