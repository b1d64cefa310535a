"""``parosim simulate`` and ``parosim compare``: one step, all strategies, several jobs.
"""

from __future__ import annotations

import argparse

from ..errors import InputError
from ..simulate.plausible import plausibility_notes, scale_note
from .moe_step import moe_text
from .parser import build_parser
from .setup import (
    algos_of,
    check_workers,
    dp_keys,
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
from .tables import FOOTER, label_width, table_header, table_row

# with --jobs only these simulate flags apply; every other one given is refused (a jobs file
# sets the per-job and cluster fields; per-step features like --repeats are not modelled)
JOBS_OWN_FLAGS = ("command", "jobs", "json", "trace", "seed")


def cmd_jobs(a: argparse.Namespace) -> dict:
    from ..io.jobs import JOB_KEYS, TOP_KEYS  # deferred: loaded when the command runs (start-up)
    from ..io.trace import write_chrome_trace  # deferred: loaded when the command runs (start-up)
    from ..studies.jobs import (  # deferred: loaded when the command runs (start-up)
        load_jobs,
        run_jobs,
    )

    defaults = vars(build_parser("simulate").parse_args(["simulate"]))
    for f, default in defaults.items():
        if f in JOBS_OWN_FLAGS or getattr(a, f) == default:
            continue
        where = ("expected it in the jobs file (per job, or at its top level)"
                 if f in JOB_KEYS | TOP_KEYS else "it is not modelled for several jobs")
        raise InputError(f"--{f.replace('_', '-')} cannot be combined with --jobs; {where}")
    cluster, jobs, steps = load_jobs(a.jobs)
    r = run_jobs(seeded(cluster, a.seed), jobs, steps, trace=bool(a.trace))
    out = r.to_dict()
    if a.trace:
        out["trace"] = str(write_chrome_trace(a.trace, r.records, f"{len(jobs)} jobs"))
    return out


_TEXT_NAMES = {"accum_steps": "accum", "compute_efficiency": "efficiency"}


def show_jobs(r: dict) -> None:
    from ..units import fmt_bytes  # deferred: loaded when the command runs (start-up)

    print(f"{len(r['jobs'])} jobs on {r['cluster']} ({r['gpus']} GPUs), step times over "
          f"{r['steps_measured']} steps, all starting together")
    print(f"{'job':<10}{'model':<12}{'strategy':<10}{'algo':<14}{'GPUs':>6}{'alone s':>11}"
          f"{'shared s':>11}{'slowdown':>10}")
    for j in r["jobs"]:
        print(f"{j['name']:<10}{j['model']:<12}{j['strategy']:<10}{j['algo']:<14}"
              f"{j['gpus']:>6}{j['step_time_alone_s']:>11.3f}{j['step_time_shared_s']:>11.3f}"
              f"{j['slowdown']:>10.3f}")
    for j in r["jobs"]:
        st = j.get("settings") or {}
        # the text names settings as simulate's header and flags do (JSON keys unchanged)
        st = {_TEXT_NAMES.get(k, k): v for k, v in st.items()}
        if st:
            print(f"settings of {j['name']}: " + ", ".join(
                f"{k.replace('_', '-')} {v:g}" if isinstance(v, float) else
                f"{k.replace('_', '-')} {v}" for k, v in st.items()))
    print("busiest links (shared run):")
    for ln in r["busiest_links"]:
        print(f"  {ln['link']:<26}{ln['link_class']:<8}{ln['utilization']:>7.1%} busy, "
              f"{fmt_bytes(ln['bytes'])}, jobs {', '.join(ln['jobs']) or '-'}")
    if r.get("trace"):
        print(f"trace written to {r['trace']} (open in https://ui.perfetto.dev)")


def cmd_simulate(a: argparse.Namespace) -> dict:
    from ..io.trace import (  # deferred: loaded when the command runs (start-up)
        write_chrome_trace,
        write_link_timeline,
    )
    from ..simulate.step import simulate_step  # deferred: loaded when the command runs (start-up)

    if getattr(a, "jobs", None):
        return cmd_jobs(a)
    model, cluster, training = specs_of(a)
    cluster = seeded(cluster, a.seed)
    if model.is_moe:
        from .moe_step import cmd_simulate_moe  # deferred: MoE steps only

        return cmd_simulate_moe(a, model, cluster, training)
    if a.jitter_cv is not None:
        from ..spec.system import check_jitter_cv  # deferred: start-up

        check_jitter_cv(a.jitter_cv, "--jitter-cv")
    if a.repeats < 1:
        raise InputError(f"--repeats = {a.repeats} must be a positive integer")
    refuse_deterministic_draws(a, cluster)
    rt, training, ds_strategy, info = runtime_of(a, cluster, training)
    strategy = strategy_of(a, ds_strategy)
    algo = algos_of(a.algo, fidelity_of(a))
    if len(algo) != 1:
        raise InputError(f"--algo {a.algo} names {len(algo)} algorithms; a list or 'all' is "
                         "for 'parosim compare'; expected one of ring, hierarchical, ho-ring, "
                         "nccl")
    if a.trace and a.mode != "engine":
        raise InputError("--trace needs --mode engine (the analytic mode has no timeline)")
    per_rank = (cluster.compute_heterogeneous
                or (a.jitter_cv if a.jitter_cv is not None else cluster.jitter_cv) > 0)
    links = bool(a.link_timeline or (a.trace and per_rank))
    if a.link_timeline and a.mode != "engine":
        raise InputError("--link-timeline needs --mode engine (the analytic mode has no "
                         "timeline)")
    par = parallel_of(a)
    r = simulate_step(model, cluster, strategy, training, algo[0], a.mode,
                      trace=bool(a.trace), runtime=rt,
                      repeats=a.repeats, seed=a.seed, jitter_cv=a.jitter_cv,
                      record_links=links, parallel=par)
    out = dp_keys(r.to_dict())
    out.update(model=model.name, cluster=cluster.name,
               settings=settings_of(a, cluster, training, rt))
    warnings = percentile_warnings(out) + (plausibility_notes(
        out["settings"], cluster.gpu.model, [out]) if r.fits else []) + scale_note(cluster)
    if warnings:
        out["warnings"] = warnings
    if info:
        out["deepspeed_config"] = info
    timeline = [(d["time_s"], d["utilization"]) for d in out.pop("link_timeline", [])]
    if a.trace and r.fits:
        out["trace"] = str(write_chrome_trace(a.trace, r.records,
                                              f"{r.strategy.name} {model.name}",
                                              timeline or None))
    if a.link_timeline and r.fits:
        out["link_timeline"] = str(write_link_timeline(a.link_timeline, timeline))
    if a.plot and r.fits:
        from ..plots.hetero import (
            plot_step_distribution,  # deferred: loaded when the command runs (start-up)
        )

        out["plot"] = str(plot_step_distribution(
            out.get("step_times_s", [r.step_time_s]), a.plot,
            f"{model.name} {r.strategy.name} on {cluster.name} ({cluster.gpus} GPUs)"))
    return out


P99_MIN_SAMPLES = 100


def percentile_warnings(r: dict) -> list[str]:
    """Cautions on the printed percentiles: a p99 from fewer than 100 steps is the sample
    maximum region, not a tail estimate.

    >>> percentile_warnings({"repeats": 20, "step_time_p99_s": 1.0})
    ['p99 from 20 steps: an estimate near the sample maximum; use --repeats >= 100']
    >>> percentile_warnings({"repeats": 200, "step_time_p99_s": 1.0})
    []
    """
    n = r.get("repeats")
    if r.get("step_time_p99_s") is None or not isinstance(n, int) or n >= P99_MIN_SAMPLES \
            or n <= 1:
        return []
    return [f"p99 from {n} steps: an estimate near the sample maximum; use --repeats >= "
            f"{P99_MIN_SAMPLES}"]


def show_simulate(r: dict) -> None:
    """One row; a configuration that does not fit shows its shortfall (and exits 2)."""
    if "jobs" in r:
        return show_jobs(r)
    if r.get("method") == "moe-closed-form":   # a MoE step with TP / PP
        from .moe_parallel import show_moe_parallel  # deferred: MoE steps with TP / PP only

        return show_moe_parallel(r)
    print(f"{r['model']} on {r['cluster']} ({r['gpus']} GPUs), mode {r['mode']}, runtime "
          f"{r.get('runtime', 'ideal')}")
    if "settings" in r:
        print(settings_text(r["settings"]))
    w = label_width([r])
    print(table_header(w))
    print(table_row(r, w))
    print(FOOTER)
    if r.get("pp_schedule") and r.get("fits"):   # tensor / pipeline parallelism
        print(f"TP {r['tp']} x PP {r['pp']} ({r['pp_schedule']}, {r['virtual_stages']} "
              f"chunk(s) per stage) x DP {r['dp']}"
              f"{' x CP ' + str(r['cp']) if r.get('cp') else ''}, {r['micro_batches']} "
              "micro-batches, "
              f"bubble {100 * (r['bubble_fraction'] or 0):.1f} %, recompute "
              f"{r['recompute_mode']}{', sequence parallel' if r['sequence_parallel'] else ''}"
              f"{', TP comm overlap' if r.get('tp_comm_overlap') else ''}"
              f"{', DP comm overlap' if r.get('dp_comm_overlap') else ''}")
    if r.get("expert_strategy") and r.get("fits"):   # a MoE step
        print(moe_text(r))
    if r.get("critical_rank") is not None:
        print(f"over {r['repeats']} step(s) (seed {r['seed']}, jitter cv {r['jitter_cv']}): "
              f"mean {r['step_time_s']:.4f} s, p50 {r['step_time_p50_s']:.4f} s, "
              f"p90 {r['step_time_p90_s']:.4f} s, p99 {r['step_time_p99_s']:.4f} s; "
              f"critical rank {r['critical_rank']} ({r['critical_rank_share']:.0%} of steps)")
    for w in r.get("warnings") or []:
        print(f"caution: {w}")
    hot = r.get("hot_links") or []
    if hot:   # engine runs: the links that set the step time
        print("hottest links (s as the bottleneck of a collective on the critical path, "
              "utilisation): " + ", ".join(
                  f"{h['link']} {h.get('critical_s', 0.0):.3g} s {h['utilization']:.0%}"
                  for h in hot[:3]))
    if r.get("plot"):
        print(f"step-time distribution plotted to {r['plot']}")
    if r.get("trace"):
        print(f"trace written to {r['trace']} (open in https://ui.perfetto.dev)")


def cmd_compare(a: argparse.Namespace) -> dict:
    from ..simulate.step import compare  # deferred: loaded when the command runs (start-up)

    check_workers(a.workers)
    model, cluster, training = specs_of(a)
    if model.is_moe:
        from .moe_step import cmd_compare_moe  # deferred: MoE models only

        return cmd_compare_moe(a, model, cluster, training)
    a.mode = a.mode or "engine"
    rt, training, _, info = runtime_of(a, cluster, training)
    par = parallel_of(a)
    rows = [dp_keys(r.to_dict())
            for r in compare(model, cluster, training, algos_of(a.algo, fidelity_of(a)), a.mode,
                             workers=a.workers, runtime=rt, parallel=par)]
    out = {"model": model.name, "cluster": cluster.name, "gpus": cluster.gpus,
           "mode": a.mode, "runtime": rt.name,
           "settings": settings_of(a, cluster, training, rt), "results": rows}
    notes = plausibility_notes(out["settings"], cluster.gpu.model,
                               [r for r in rows if r.get("fits")]) + scale_note(cluster)
    if notes:
        out["warnings"] = notes
    if info:
        out["deepspeed_config"] = info
    return out


def show_compare(res: dict) -> None:
    print(f"{res['model']} on {res['cluster']} ({res['gpus']} GPUs), mode {res['mode']}, "
          f"runtime {res.get('runtime', 'ideal')}, best first")
    if "settings" in res:
        print(settings_text(res["settings"]))
    w = label_width(res["results"])
    print(f"{'#':>3}  " + table_header(w))
    for i, r in enumerate(res["results"], 1):
        print(f"{i:>3}  " + table_row(r, w))
    print(FOOTER)
    for note in res.get("warnings") or []:
        print(f"caution: {note}")
