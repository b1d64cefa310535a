"""``parosim run`` (a whole run with failures) and ``parosim advise`` (the fastest
configurations).
"""

from __future__ import annotations

import argparse

from ..errors import InputError
from ..simulate.plausible import plausibility_notes, scale_note
from .setup import (
    algos_of,
    fidelity_of,
    parallel_of,
    refuse_deterministic_draws,
    runtime_of,
    seeded,
    settings_of,
    settings_text,
    specs_of,
    strategy_of,
)


def cmd_run(a: argparse.Namespace) -> dict:
    from ..simulate.step import simulate_step  # deferred: loaded when the command runs (start-up)
    from ..studies.run import (  # deferred: loaded when the command runs (start-up)
        LLAMA3_GPU_MTBF_S,
        LLAMA3_NODE_MTBF_S,
        best_interval,
        parse_count,
        run_from_step,
        run_report,
        simulate_run,
    )
    from ..units import (  # deferred: loaded when the command runs (start-up)
        fmt_bytes,
        parse_time,
    )

    if a.replications < 1:
        raise InputError(f"--replications = {a.replications} must be a positive integer")
    if a.search_points > 10_000:
        raise InputError(f"--search-points = {a.search_points} is more than 10000; expected "
                         "a few tens")
    if a.repeats > 10_000:
        raise InputError(f"--repeats = {a.repeats} is more than 10000 steps; expected fewer")
    if a.seed < 0:
        raise InputError(f"--seed = {a.seed} must be a non-negative integer")
    if a.gpu_hour_price is not None and not (a.gpu_hour_price >= 0
                                             and a.gpu_hour_price != float("inf")):
        raise InputError(f"--gpu-hour-price = {a.gpu_hour_price} must be a non-negative "
                         "number (currency per GPU-hour)")
    tokens = parse_count(a.tokens, "--tokens")
    mtbf = {}
    for flag, val, default in (("--gpu-mtbf", a.gpu_mtbf, LLAMA3_GPU_MTBF_S),
                               ("--node-mtbf", a.node_mtbf, LLAMA3_NODE_MTBF_S)):
        if val is None:
            mtbf[flag] = default
        elif str(val).strip().lower() in ("none", "inf", "never"):
            mtbf[flag] = None
        else:
            mtbf[flag] = parse_time(val, flag, allow_zero=False, example="50000h")
    if mtbf["--gpu-mtbf"] is None and mtbf["--node-mtbf"] is None:
        raise InputError("--gpu-mtbf and --node-mtbf are both 'none'; expected at least one "
                         "failure rate (e.g. --gpu-mtbf 50000h)")
    ckpt = parse_time(a.checkpoint_time, "--checkpoint-time", example="60s")
    restart = parse_time(a.restart_time, "--restart-time", example="10min")
    if a.repeats < 1:
        raise InputError(f"--repeats = {a.repeats} must be a positive integer")
    if a.jitter_cv is not None:
        from ..spec.system import check_jitter_cv  # deferred: start-up

        check_jitter_cv(a.jitter_cv, "--jitter-cv")
    model, cluster, training = specs_of(a)
    cluster = seeded(cluster, a.seed)
    refuse_deterministic_draws(a, cluster, seed=False)
    rt, training, ds_strategy, _ = runtime_of(a, cluster, training)
    strategy = strategy_of(a, ds_strategy)
    algo = algos_of(a.algo, fidelity_of(a))
    if len(algo) != 1:
        raise InputError(f"--algo {a.algo} names {len(algo)} algorithms; a list or 'all' is "
                         "for 'parosim compare'; expected one of ring, hierarchical, ho-ring, "
                         "nccl")
    r = simulate_step(model, cluster, strategy, training, algo[0], a.mode, runtime=rt,
                      repeats=a.repeats, seed=a.seed, jitter_cv=a.jitter_cv,
                      parallel=parallel_of(a))
    if not r.fits:
        raise InputError(f"{r.strategy.name} does not fit in GPU memory (short by "
                         f"{fmt_bytes(r.memory.shortfall_bytes)} per GPU); expected a "
                         "configuration that fits, see 'parosim memory'")
    tps = training.tokens_per_gpu_step * cluster.gpus
    samples = tuple((getattr(r, "extra", None) or {}).get("step_times_s") or ())
    spec = run_from_step(r.step_time_s, tps, tokens, cluster.gpus, cluster.nodes, ckpt,
                         restart, mtbf["--gpu-mtbf"], mtbf["--node-mtbf"], samples)
    tau = None
    if a.checkpoint_interval is not None:
        tau = parse_time(a.checkpoint_interval, "--checkpoint-interval", allow_zero=False,
                         example="3h")
        if tau < spec.step_time_s:
            raise InputError(f"--checkpoint-interval {a.checkpoint_interval} is shorter than "
                             f"one step ({spec.step_time_s:.4g} s); expected at least one step "
                             "(a checkpoint is written between steps)")
        if tau > spec.useful_s:
            raise InputError(f"--checkpoint-interval {a.checkpoint_interval} is longer than "
                             f"the whole run's compute ({spec.useful_s:.6g} s = {spec.steps} "
                             f"steps); expected at most {spec.useful_s:.6g} s")
    search = best_interval(spec, a.replications, a.seed, a.search_points)
    fixed = None
    if tau is not None:
        k = max(1, min(spec.steps, round(tau / spec.step_time_s)))
        fixed = simulate_run(spec, k, a.replications, a.seed)
    out = run_report(search, tokens, tps, fixed)
    # GPU-hours: every GPU of the job is held for the whole wall clock (failures, restarts
    # and checkpoint writes included); failure-free: the steps alone
    out["gpu_hours"] = out["wall_clock_s"] * cluster.gpus / 3600
    out["gpu_hours_failure_free"] = out["useful_s"] * cluster.gpus / 3600
    if a.gpu_hour_price is not None:
        out["gpu_hour_price"] = a.gpu_hour_price
        out["cost"] = out["gpu_hours"] * a.gpu_hour_price
    out.update(model=model.name, cluster=cluster.name, strategy=r.strategy.name,
               algo=r.algo.value, mode=a.mode, seed=a.seed, runtime=rt.name,
               settings=settings_of(a, cluster, training, rt))
    notes = plausibility_notes(out["settings"], cluster.gpu.model, [r.to_dict()]) + \
        scale_note(cluster)
    if notes:
        out["warnings"] = notes
    return out


def show_run(r: dict) -> None:
    from ..units import fmt_count  # deferred: loaded when the command runs (start-up)

    def dur(s: float) -> str:
        return f"{s / 86400:.2f} days" if s >= 86400 else f"{s / 3600:.2f} h"

    print(f"{r['model']} {r['strategy']} ({r['algo']}) on {r['cluster']}, {r['gpus']} GPUs: "
          f"{fmt_count(r['tokens'])} tokens in {r['steps']:,} steps of "
          f"{r['step_time_s']:.3f} s")
    print(f"job MTBF {r['job_mtbf_s'] / 3600:.2f} h, checkpoint {r['checkpoint_s']:g} s, "
          f"restart {r['restart_s']:g} s, {r['replications']} replications, seed {r['seed']}")
    if "settings" in r:
        print(settings_text(r["settings"]))
    print(f"best checkpoint interval  {r['best_checkpoint_interval_s']:.0f} s "
          f"(Young {r['young_interval_s']:.0f} s, Daly {r['daly_interval_s']:.0f} s)")
    ks = [s["interval_steps"] for s in r["searched"]]
    print(f"searched                  {len(ks)} distinct whole-step intervals, {min(ks)} to "
          f"{max(ks)} steps" + (" (the longer candidates are the whole run)"
                                if max(ks) == r["steps"] else ""))
    print(f"goodput                   {r['goodput']:.4f} (Daly {r['daly_goodput']:.4f})")
    print(f"wall clock                {dur(r['wall_clock_s'])} (p90 "
          f"{dur(r['wall_clock_p90_s'])}; without failures {dur(r['useful_s'])})")
    print(f"failures                  {r['failures']:.1f} ({r['failures_gpu']:.1f} GPU, "
          f"{r['failures_node']:.1f} node)")
    print(f"lost work                 {dur(r['lost_work_s'])}; restarts "
          f"{dur(r['restart_s_total'])}; checkpoint writes {dur(r['checkpoint_s_total'])}")
    cost = (f"; cost {r['cost']:,.0f} at {r['gpu_hour_price']:g} per GPU-hour"
            if "cost" in r else "")
    print(f"GPU-hours                 {r['gpu_hours']:,.0f} (without failures "
          f"{r['gpu_hours_failure_free']:,.0f}){cost}")
    if r["failures_simulated"] < 200:
        print(f"note: only {r['failures_simulated']:.0f} failures were simulated in all; the "
              "best interval is uncertain (raise --replications)")
    if "at_interval" in r:
        f = r["at_interval"]
        print(f"at interval {f['interval_s']:.0f} s: goodput {f['goodput']:.4f}, wall clock "
              f"{dur(f['wall_clock_s'])}")
    for note in r.get("warnings") or []:
        print(f"caution: {note}")


def cmd_advise(a: argparse.Namespace) -> dict:
    from ..io import load_cluster  # deferred: loaded when the command runs (start-up)
    from ..io.model import load_model  # deferred: loaded when the command runs (start-up)
    from ..simulate.step import with_overrides  # deferred: loaded when the command runs (start-up)
    from ..studies.advise import (  # deferred: loaded when the command runs (start-up)
        advise,
        parse_global_batch,
    )
    from ..studies.advise_space import (  # deferred: loaded when the command runs (start-up)
        SearchSpace,
        split_ints,
        split_list,
    )
    from ..studies.run import parse_count  # deferred: loaded when the command runs (start-up)
    from ..units import parse_size  # deferred: loaded when the command runs (start-up)

    model = load_model(a.model)
    if model.is_moe:
        return _advise_moe(a, model)
    if model.is_extended:
        raise InputError(model.refusal("parosim advise"))
    if a.ep is not None or a.expert_strategies != "all":
        raise InputError(f"--ep / --expert-strategies are for mixture-of-experts models; "
                         f"model {model.name!r} is dense")
    cluster = load_cluster(a.cluster, a.nodes, None, a.set or ())
    if a.gpu_memory is not None:   # '' is refused by parse_size, never read as not given
        cluster = with_overrides(cluster, gpu_memory_bytes=parse_size(a.gpu_memory,
                                                                      "--gpu-memory"))
    if a.seq_len < 1:
        raise InputError(f"--seq-len = {a.seq_len} must be a positive integer")
    batch = parse_global_batch(a.global_batch, a.seq_len)
    if a.efficiency is not None and not 0 < a.efficiency <= 1:
        raise InputError(f"--efficiency = {a.efficiency} must be a fraction in (0, 1]")
    space = SearchSpace(
        attention=split_list(a.attention), precision=split_list(a.precision),
        runtime=split_list(a.runtime), recompute=split_list(a.recompute),
        tp=split_ints(a.tp, "--tp"), pp=split_ints(a.pp, "--pp"), cp=split_ints(a.cp, "--cp"),
        strategy=split_list(a.strategies), group_nodes=split_ints(a.group_nodes,
                                                                  "--group-nodes"),
        micro_batch=split_ints(a.micro_batch, "--micro-batch"), algo=split_list(a.algo))
    if space.strategy is None and a.strategies.strip().lower() != "all":
        raise InputError(f"--strategies {a.strategies!r} names no strategy; expected a comma "
                         "list such as NIG,GGG, or all")
    tokens = None if a.tokens is None else parse_count(a.tokens, "--tokens")
    if a.plot:
        from ..plots.advise import plot_path  # deferred: loaded when the command runs (start-up)

        plot_path(a.plot)
    res = advise(model, cluster, batch, a.seq_len, a.top, a.engine_top, a.max_micro_batch,
                 None, a.efficiency, tp_comm_overlap=a.tp_comm_overlap,
                 dp_comm_overlap=a.dp_comm_overlap, space=space,
                 compute_model=a.compute_model, tokens=tokens,
                 gpu_hour_price=a.gpu_hour_price)
    if a.plot:
        from ..plots.advise import save_pareto  # deferred: loaded when the command runs (start-up)

        res["plot"] = save_pareto(res, a.plot)
    res["settings"] = {
        "global_batch": a.global_batch, "seq_len": a.seq_len, "top": a.top,
        "engine_top": "until the top are engine results" if a.engine_top is None
        else a.engine_top, "max_micro_batch": a.max_micro_batch,
        "strategies": a.strategies,
        "fixed": {k: list(v) for k, v in space.fixed().items()},
        "compute_model": res["compute_model"],
        "tp_comm_overlap": a.tp_comm_overlap,
        "dp_comm_overlap": a.dp_comm_overlap,
        "tokens": res["tokens"],
        "gpu_memory_bytes": cluster.gpu.memory_bytes,
        "overrides": {"gpu_memory": a.gpu_memory} if a.gpu_memory else {}}
    if res["compute_model"] == "flat":   # an efficiency applies to the flat model only
        from ..spec.training import DEFAULT_COMPUTE_EFFICIENCY  # deferred: start-up
        res["settings"]["compute_efficiency"] = (a.efficiency if a.efficiency is not None
                                                 else DEFAULT_COMPUTE_EFFICIENCY)
    if a.gpu_hour_price is not None:
        res["settings"]["gpu_hour_price"] = a.gpu_hour_price
    notes: list[str] = []   # plausibility, per configuration shown (as simulate's)
    for i, c in enumerate(res["candidates"] + res.get("closed_form_candidates", []), 1):
        for n in plausibility_notes({"precision": c["precision"], "micro_batch": c["micro_batch"],
                                     "seq_len": a.seq_len}, cluster.gpu.model,
                                    [{"mfu": c["mfu"], "label": f"#{i}"}]):
            if n not in notes:
                notes.append(n)
    notes += scale_note(cluster)
    if notes:
        res["warnings"] = notes
    if a.json:
        res = {k: v for k, v in res.items()
               if k not in ("points", "top_labels", "closed_form_labels")}
    return res


def _advise_moe(a: argparse.Namespace, model) -> dict:
    """``parosim advise`` of a MoE model (docs/moe.md, "Advice for a MoE model")."""
    from ..io import load_cluster  # deferred: loaded when the command runs (start-up)
    from ..simulate.step import with_overrides  # deferred: loaded when the command runs
    from ..studies.advise import parse_global_batch  # deferred: loaded when the command runs
    from ..studies.advise_space import split_ints, split_list  # deferred: as above
    from ..studies.moe_advise import (  # deferred: loaded when the command runs (start-up)
        MoESpace,
        advise_moe,
        parse_strategies,
    )
    from ..units import parse_size  # deferred: loaded when the command runs (start-up)

    for flag, value in (("--precision", a.precision), ("--runtime", a.runtime),
                        ("--recompute", a.recompute), ("--tp", a.tp), ("--pp", a.pp),
                        ("--cp", a.cp), ("--group-nodes", a.group_nodes), ("--algo", a.algo),
                        ("--tokens", a.tokens),
                        ("--gpu-hour-price", a.gpu_hour_price), ("--plot", a.plot)):
        if value is not None:
            raise InputError(f"{flag} {value} is not searched for MoE models yet; expected it "
                             "unset (EP beside DP, bf16, the ideal runtime; docs/moe.md)")
    if a.tp_comm_overlap or a.dp_comm_overlap:
        raise InputError("--tp-comm-overlap / --dp-comm-overlap are not modelled for MoE "
                         "models; expected them unset")
    cluster = load_cluster(a.cluster, a.nodes, None, a.set or ())
    if a.gpu_memory is not None:
        cluster = with_overrides(cluster, gpu_memory_bytes=parse_size(a.gpu_memory,
                                                                      "--gpu-memory"))
    if a.seq_len < 1:
        raise InputError(f"--seq-len = {a.seq_len} must be a positive integer")
    if a.efficiency is not None and not 0 < a.efficiency <= 1:
        raise InputError(f"--efficiency = {a.efficiency} must be a fraction in (0, 1]")
    if a.top < 1:
        raise InputError(f"--top = {a.top} must be a positive integer")
    batch = parse_global_batch(a.global_batch, a.seq_len)
    att = split_list(a.attention)
    for x in att or ():
        if x not in ("flash", "eager"):
            raise InputError(f"--attention {x!r} is not known; expected flash or eager")
    space = MoESpace(ep=split_ints(a.ep, "--ep"),
                     micro_batch=split_ints(a.micro_batch, "--micro-batch"), attention=att,
                     strategies=parse_strategies(a.strategies, "--strategies"),
                     expert_strategies=parse_strategies(a.expert_strategies,
                                                        "--expert-strategies"))
    res = advise_moe(model, cluster, batch, a.seq_len, a.top,
                     3 if a.engine_top is None else a.engine_top, a.max_micro_batch,
                     a.efficiency, space, a.compute_model)
    res["settings"] = {"global_batch": a.global_batch, "seq_len": a.seq_len, "top": a.top,
                       "engine_top": res["engine_top"], "max_micro_batch": a.max_micro_batch,
                       "gpu_memory_bytes": cluster.gpu.memory_bytes}
    return res


def show_advise(res: dict) -> None:
    from ..studies.advise import format_advice  # deferred: loaded when the command runs (start-up)

    if res.get("moe"):
        from ..studies.moe_advise import format_moe_advice  # deferred: MoE models only

        print(format_moe_advice(res))
        return

    print(format_advice(res))
    for note in res.get("warnings") or []:
        print(f"caution: {note}")
    s = res.get("settings")
    if s:
        fixed = ", ".join(f"--{k.replace('_', '-')} {','.join(map(str, v))}"
                          for k, v in s.get("fixed", {}).items()) or "none (all searched)"
        print("settings: " + ", ".join(f"{k.replace('_', '-')} {fixed if k == 'fixed' else v}"
                                       for k, v in s.items() if k != "overrides")
              + ("" if not s["overrides"] else
                 ", overrides: " + ", ".join(f"{k.replace('_', '-')} {v}"
                                             for k, v in s["overrides"].items())))
