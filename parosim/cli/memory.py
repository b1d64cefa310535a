"""``parosim memory``: the memory breakdown per GPU.
"""

from __future__ import annotations

import argparse

from ..errors import InputError
from ..simulate.plausible import plausibility_notes
from .setup import parallel_of, runtime_of, settings_of, settings_text, specs_of
from .tables import label_width, strategy_label


def cmd_memory(a: argparse.Namespace) -> dict:
    from ..cost.memory import (  # deferred: loaded when the command runs (start-up)
        max_micro_batch,
        memory_breakdown,
    )
    from ..simulate.step import memory_dict  # deferred: loaded when the command runs (start-up)
    from ..spec.strategy import (  # deferred: loaded when the command runs (start-up)
        ALL_STRATEGIES,
        parse_strategy,
    )

    model, cluster, training = specs_of(a)
    if model.is_moe:
        from .moe_step import cmd_memory_moe  # deferred: MoE models only

        return cmd_memory_moe(a, model, cluster, training)
    rt, training, ds_strategy, info = runtime_of(a, cluster, training)
    if ds_strategy and a.strategy not in ("all", None) and \
            parse_strategy(a.strategy).short != ds_strategy:
        raise InputError(f"--strategy {a.strategy} disagrees with the DeepSpeed config's "
                         f"stage ({ds_strategy}); expected one of them")
    if ds_strategy:
        strategies = [parse_strategy(ds_strategy)]
    elif a.strategy == "all":
        strategies = [s for s in ALL_STRATEGIES if rt.supports(s.short)]
    else:
        strategies = [parse_strategy(a.strategy)]
    rows = []
    par = parallel_of(a)
    if not par.trivial and (a.runtime or getattr(a, "deepspeed_config", None)):
        raise InputError("--tp / --pp / --cp / --sequence-parallel / --recompute selective "
                         "model the ideal runtime; expected no --runtime or --deepspeed-config")
    for s in strategies:
        if not par.trivial:
            from ..plan.layout import (
                layout_for,  # deferred: loaded when the command runs (start-up)
            )
            from ..plan.threed import (  # deferred: loaded when the command runs (start-up)
                max_micro_batch_3d,
                memory_3d,
            )

            d = memory_dict(s, cluster.gpus, memory_3d(model, s, cluster, training, par))
            d["max_micro_batch"] = max_micro_batch_3d(model, s, cluster, training, par)
            d.update(tp=par.tp, pp=par.pp,
                     dp=layout_for(cluster, par.tp, par.pp).d // par.cp)
            if par.cp > 1:
                d["cp"] = par.cp
            rows.append(d)
            continue
        rt.require(s.short)
        d = memory_dict(s, cluster.gpus, memory_breakdown(model, s, cluster, training, rt))
        d["max_micro_batch"] = max_micro_batch(model, s, cluster, training, runtime=rt)
        d["runtime"], d["framework_stage"] = rt.name, rt.stage(s.short)
        rows.append(d)
    res = dict(rows[0]) if len(rows) == 1 else {"results": rows}
    settings = settings_of(a, cluster, training, rt)
    for k in ("compute_model", "compute_efficiency", "overlap_slowdown"):   # no step timed
        settings.pop(k, None)
    res.update(model=model.name, cluster=cluster.name, settings=settings)
    notes = plausibility_notes(res["settings"], cluster.gpu.model, compute=False)
    if notes:
        res["warnings"] = notes
    return res


def show_memory(res: dict) -> None:
    from ..units import fmt_bytes  # deferred: loaded when the command runs (start-up)

    rows = res.get("results", [res])
    if "model" in res:
        print(f"{res['model']} on {res['cluster']} ({rows[0]['gpus']} GPUs), memory per GPU")
    if "settings" in res:
        print(settings_text(res["settings"]))
    moe = "expert_strategy" in rows[0]
    w = max(len("strategy"), *(len(r["label"]) for r in rows)) + 2 if moe else label_width(rows)
    print(f"{'strategy':<{w}}{'states':>11}{'activ.':>11}{'buffers':>11}{'margin':>11}"
          f"{'total':>11}{'capacity':>11}  fits  recomp  max micro-batch")
    for r in rows:
        lab = r["label"] if moe else strategy_label(r)
        print(f"{lab:<{w}}{fmt_bytes(r['model_states_bytes']):>11}"
              f"{fmt_bytes(r['activations_bytes']):>11}{fmt_bytes(r['buffers_bytes']):>11}"
              f"{fmt_bytes(r['margin_bytes']):>11}{fmt_bytes(r['total_bytes']):>11}"
              f"{fmt_bytes(r['capacity_bytes']):>11}  {'yes ' if r['fits'] else 'NO  '}"
              f"  {'yes' if r.get('recompute') else 'no':<6}  {r['max_micro_batch']}"
              + ("" if r["fits"] else f"   (lacks {fmt_bytes(r['shortfall_bytes'])})"))
    if moe:
        print(f"MoE: EP {rows[0]['ep']}, EDP {rows[0]['edp']}; rows: dense x expert strategy; "
              "activations with top-k routing (docs/moe.md)")
    for note in res.get("warnings") or []:
        print(f"caution: {note}")
