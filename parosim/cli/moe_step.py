"""``parosim simulate`` with a mixture-of-experts model: one global step with expert
parallelism, the dispatch / combine all-to-alls, expert sharding levels and, on request,
token imbalance drawn per step (docs/moe.md, "A MoE training step").
"""

from __future__ import annotations

import argparse

from ..errors import InputError


def moe_settings(a: argparse.Namespace, cluster, training) -> dict:
    """The settings echo of a MoE command: recomputation is off in MoE steps (``auto``
    resolves to off; on is refused), and the expert flags."""
    from ..simulate.moe_flags import ep_of  # deferred: MoE commands only
    from .setup import settings_of  # deferred: start-up

    out = settings_of(a, cluster, training, None)
    if out.get("recompute") == "auto":
        out["recompute"] = "off"
    out["ep"] = ep_of(a)
    if out.get("fidelity") == "accurate":   # what applied, never what was asked
        out["fidelity"] = "paper"
        out["fidelity_note"] = ("MoE steps run the paper fidelity's models (flat compute, "
                                "eager attention unless --attention flash, the Korthikanti "
                                "memory estimate): the accurate models have no MoE form yet")
    return out


def cmd_memory_moe(a: argparse.Namespace, model, cluster, training) -> dict:
    """``parosim memory`` of a MoE model: one row per dense x expert strategy pair."""
    from ..plan.experts import ExpertLayout  # deferred: loaded when the command runs
    from ..plan.moe_memory import (  # deferred: loaded when the command runs
        max_micro_batch_moe,
        moe_activation_terms,
        moe_memory,
    )
    from ..plan.moe_step import check_moe_step  # deferred: loaded when the command runs
    from ..simulate.moe_flags import ep_of, refuse_layout_flags  # deferred: MoE commands only
    from ..simulate.step import memory_dict  # deferred: loaded when the command runs
    from ..spec.strategy import ALL_STRATEGIES, parse_strategy  # deferred: start-up

    refuse_layout_flags(a)
    check_moe_step(model, cluster, training, timing=False)
    lay = ExpertLayout(cluster, model.moe.experts, ep=ep_of(a))
    dense = (list(ALL_STRATEGIES) if a.strategy == "all" else [parse_strategy(a.strategy)])
    rows = []
    for s in dense:
        experts = (list(ALL_STRATEGIES) if a.expert_strategy == "all" else
                   [parse_strategy(a.expert_strategy or s.name)])
        for e in experts:
            d = memory_dict(s, cluster.gpus, moe_memory(model, s, e, cluster, training, lay))
            d["expert_strategy"] = e.name
            d["label"] = f"{s.short} x {e.short}"
            d["max_micro_batch"] = max_micro_batch_moe(model, s, e, cluster, training, lay)
            d.update(ep=lay.ep, edp=lay.edp)
            rows.append(d)
    res = dict(rows[0]) if len(rows) == 1 else {"results": rows}
    res.update(model=model.name, cluster=cluster.name,
               settings=moe_settings(a, cluster, training),
               activation_terms=moe_activation_terms(model, training))
    return res


def cmd_compare_moe(a: argparse.Namespace, model, cluster, training) -> dict:
    """``parosim compare`` of a MoE model: dense x expert strategy pairs, best first."""
    from ..simulate.moe import compare_moe  # deferred: loaded when the command runs
    from ..simulate.moe_flags import ep_of, refuse_layout_flags  # deferred: MoE commands only
    from ..spec.strategy import parse_strategy  # deferred: start-up
    from .setup import algos_of, check_workers, dp_keys  # deferred: start-up

    check_workers(a.workers)
    refuse_layout_flags(a)
    mode = a.mode or "analytic"
    text = a.expert_strategy or "all"
    experts = (None if text.strip().lower() == "all"
               else [parse_strategy(t.strip()) for t in text.split(",")])
    rows = [dp_keys(r.to_dict())
            for r in compare_moe(model, cluster, training, ep_of(a), algos_of(a.algo), mode,
                                 None, experts, a.a2a_algo or "p2p", a.workers)]
    return {"model": model.name, "cluster": cluster.name, "gpus": cluster.gpus,
            "mode": mode, "runtime": "ideal",
            "settings": moe_settings(a, cluster, training), "results": rows}


def cmd_simulate_moe(a: argparse.Namespace, model, cluster, training) -> dict:
    """``parosim simulate`` of a MoE model: the step of
    :mod:`parosim.simulate.moe_flags` (which a sweep point runs too), its settings echo,
    trace and step-time plot."""
    from ..simulate.moe_flags import (  # deferred: MoE steps only
        moe_parallel_step,
        moe_step,
        wants_moe_parallel,
    )
    from .setup import dp_keys  # deferred: start-up

    if wants_moe_parallel(a):
        return moe_parallel_step(a, model, cluster, training)
    r, routing = moe_step(a, model, cluster, training, trace=bool(a.trace))
    out = dp_keys(r.to_dict())
    out.update(model=model.name, cluster=cluster.name,
               settings=moe_settings(a, cluster, training))
    if a.trace and r.fits:
        from ..io.trace import write_chrome_trace  # deferred: loaded when the command runs

        out["trace"] = str(write_chrome_trace(a.trace, r.records,
                                              f"{r.strategy.name} {model.name}", None))
    if a.plot and r.fits and routing is not None:
        from ..plots.hetero import plot_step_distribution  # deferred: plotting only

        out["plot"] = str(plot_step_distribution(
            out["step_times_s"], a.plot,
            f"{model.name} {r.strategy.name} x experts {out['expert_strategy']} on "
            f"{cluster.name} ({cluster.gpus} GPUs), routing {routing.kind}"))
    elif a.plot:
        raise InputError("--plot of a MoE step needs --routing (the step-time distribution "
                         "over the drawn steps)")
    return out


def moe_text(r: dict) -> str:
    """The MoE line under the step's row."""
    s = (f"experts: EP {r['ep']} ({r['ep_nodes']} node(s) per EP group), EDP {r['edp']}, "
         f"expert strategy {r['expert_strategy']}; {r['a2a_per_step']} all-to-alls "
         f"({r['a2a_algo']}) of {r['a2a_size_bytes'] / 2**20:.1f} MiB per rank per step")
    if r.get("deepep"):
        x = r["deepep"]
        s += (f"\nDeepEP {x['kernel']} kernels: {x['tokens_per_rank']} tokens of "
              f"{x['token_bytes']:.0f} B per rank per call, each sent once per destination "
              f"rank (share {x['p_rank']:.4f}) and node (share {x['p_node']:.4f})")
    if r.get("routing"):
        s += (f"\nrouting {r['routing']} over {r['repeats']} step(s) (seed "
              f"{r['routing_seed']}): mean {r['step_time_s']:.4f} s, p50 "
              f"{r['step_time_p50_s']:.4f} s, p99 {r['step_time_p99_s']:.4f} s; forced "
              f"balance {r['balanced_step_s']:.4f} s; cost of imbalance "
              f"{100 * r['imbalance_cost']:.1f} %")
    return s
