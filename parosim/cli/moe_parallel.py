"""``parosim simulate`` of a mixture-of-experts model with ``--tp`` or ``--pp`` > 1: the
closed-form MoE step under TP x PP (VP) x CP x EP (:mod:`parosim.evaluate.moe_parallel`)
with the parameters fitted on Megatron-Bridge's published throughput (docs/moe.md, "From the
command line"). Analytic mode only: the engine does not replay these steps yet.
"""

from __future__ import annotations

import argparse

from ..errors import InputError

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
)
RECOMPUTE_OK = ("auto", "off", "none")
ENGINE_REFUSAL = ("--mode engine: the engine does not model MoE steps with --tp / --pp yet "
                  "(the pipeline schedule with expert all-to-alls, TP collectives inside MoE "
                  "layers); expected --mode analytic (the closed form, docs/moe.md)")


def wants_moe_parallel(a: argparse.Namespace) -> bool:
    """A MoE step with tensor or pipeline parallelism: this module's closed form."""
    return (a.tp or 1) > 1 or (a.pp or 1) > 1


def cmd_simulate_moe_parallel(a: argparse.Namespace, model, cluster, training) -> dict:
    """The closed-form step (docs/moe.md, "From the command line"); every flag it cannot
    honour is refused in one line."""
    from ..calibrate.moe_throughput import (  # deferred: loaded when the command runs
        FITTED_RELEASE,
        fitted_efficiency,
    )
    from ..evaluate.moe_parallel import (  # deferred: loaded when the command runs
        MoEParallel,
        moe_step_time,
    )
    from .setup import ep_of, parallel_of  # deferred: start-up

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


def show_moe_parallel(r: dict) -> None:
    """The text form of :func:`cmd_simulate_moe_parallel`'s result."""
    s, c = r["stage_microbatch_s"], r["calibration"]
    print(f"{r['model']} on {r['cluster']} ({r['gpus']} GPUs), mode analytic: MoE closed "
          "form (TP x PP x VP x CP x EP, docs/moe.md)")
    print(f"TP {r['tp']} x PP {r['pp']} ({r['virtual_stages']} chunk(s) per stage) x CP "
          f"{r['cp']} x DP {r['dp']}; EP {r['ep']}, EDP {r['edp']}; {r['micro_batches']} "
          f"micro-batches of {r['micro_batch']} x {r['seq_len']} tokens "
          f"(global batch {r['global_batch_seqs']} seqs), {r['precision']}"
          f"{', sequence parallel' if r['tp'] > 1 else ''}")
    print(f"step {r['step_time_s']:.4f} s, {r['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU, "
          f"bubble {r['bubble_s']:.4f} s ({100 * r['bubble_fraction']:.1f} %)")
    print("per stage and micro-batch, forward + backward (ms): " + ", ".join(
        f"{name} {1e3 * s[k]:.2f}" for name, k in (
            ("GEMMs", "gemm_s"), ("expert GEMMs", "grouped_gemm_s"),
            ("attention", "attention_s"), ("memory-bound", "memory_s"),
            ("all-to-all (exposed)", "a2a_s"), ("TP", "tp_s"), ("host", "host_s")))
          + f"; per step: p2p {r['p2p_s']:.4f} s, optimizer {r['optimizer_s']:.4f} s")
    print(f"parameters fitted on Megatron-Bridge rows for {c['hardware']} ({c['release']}): "
          f"GEMM ceiling {c['gemm_efficiency']:.3f}, a2a exposed {c['a2a_exposed']:.3f}, "
          f"host {1e3 * c['moe_layer_overhead_s']:.2f} ms per MoE layer; memory not checked")
