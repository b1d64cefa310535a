"""``parosim advise`` for a mixture-of-experts model (docs/moe.md, "Advice for a MoE
model"): the fastest MoE steps (:mod:`parosim.simulate.moe`) for a global batch, searched
over expert parallelism, the micro-batch, the dense strategy and the expert strategy.

Search: every EP that divides the GPUs and the routed experts (and whose EDP groups split
evenly over the PaRO groups), every power-of-2 micro-batch up to ``max_micro_batch`` that
divides the global batch over the GPUs (accum = global batch / (b x GPUs)), FlashAttention
and eager attention (or the one given), every dense x expert strategy pair. Each point's
memory is screened first (:func:`parosim.plan.moe_memory.moe_memory`); the fitting ones are
costed in closed form and ranked by step time (the same tokens per step everywhere: the
fastest is the highest throughput); the best ``engine_top`` are replayed on the engine.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..errors import InputError
from ..plan.experts import ExpertLayout
from ..plan.moe_memory import moe_memory
from ..plan.moe_step import check_moe_step
from ..simulate.moe import simulate_moe_step
from ..spec.model import ModelSpec
from ..spec.strategy import ALL_STRATEGIES, Strategy, parse_strategy
from ..spec.system import ClusterSpec
from ..spec.training import DEFAULT_COMPUTE_EFFICIENCY, TrainingSpec

MAX_ENGINE_TOP = 20


@dataclass(frozen=True)
class MoESpace:
    """The searched dimensions (None: all of it)."""

    ep: tuple[int, ...] | None = None
    micro_batch: tuple[int, ...] | None = None
    attention: tuple[str, ...] | None = None
    strategies: tuple[Strategy, ...] | None = None
    expert_strategies: tuple[Strategy, ...] | None = None


def _ep_choices(model: ModelSpec, cluster: ClusterSpec, wanted) -> list[int]:
    n, e = cluster.gpus, model.moe.experts
    pool = [k for k in range(1, min(n, e) + 1) if n % k == 0 and e % k == 0]
    if wanted is None:
        return pool
    for k in wanted:
        if k not in pool:
            raise InputError(f"--ep {k} does not divide both the {n} GPUs and the model's "
                             f"{e} routed experts; expected one of {pool}")
    return list(wanted)


def advise_moe(model: ModelSpec, cluster: ClusterSpec, global_batch: int, seq_len: int,
               top: int = 5, engine_top: int = 3, max_micro_batch: int = 16,
               efficiency: float | None = None, space: MoESpace = MoESpace(),
               compute_model: str | None = None) -> dict:
    """The search of the module docstring; a dict (docs/moe.md lists its keys).
    ``compute_model``: the training setting (None: the cluster's; MoE steps refuse the
    kernel model)."""
    t0 = time.perf_counter()
    check_moe_step(model, cluster, TrainingSpec(compute_model=compute_model, recompute=False))
    if not (isinstance(engine_top, int) and 0 <= engine_top <= MAX_ENGINE_TOP):
        raise InputError(f"--engine-top {engine_top!r} must be an integer in "
                         f"0..{MAX_ENGINE_TOP} for a MoE model")
    n = cluster.gpus
    eps = _ep_choices(model, cluster, space.ep)
    bs = list(space.micro_batch) if space.micro_batch else [
        b for b in (2 ** i for i in range(13)) if b <= max_micro_batch]
    bs = [b for b in bs if global_batch % (b * n) == 0]
    if not bs:
        raise InputError(f"--global-batch {global_batch} sequences is not a multiple of "
                         f"micro-batch x {n} GPUs for any micro-batch tried; expected a "
                         f"multiple of {n}")
    atts = list(space.attention or ("flash", "eager"))
    dense = list(space.strategies or ALL_STRATEGIES)
    experts = list(space.expert_strategies or ALL_STRATEGIES)
    eff = DEFAULT_COMPUTE_EFFICIENCY if efficiency is None else efficiency
    skipped: dict[str, str] = {}
    points = fitting = 0
    rows = []
    for ep in eps:
        try:
            lay = ExpertLayout(cluster, model.moe.experts, ep=ep)
        except InputError as exc:
            skipped[f"ep {ep}"] = str(exc)
            continue
        for att in atts:
            for b in bs:
                tr = TrainingSpec(micro_batch=b, accum_steps=global_batch // (b * n),
                                  seq_len=seq_len, compute_efficiency=eff, attention=att,
                                  recompute=False, compute_model=compute_model)
                for s in dense:
                    for e in experts:
                        points += 1
                        if not moe_memory(model, s, e, cluster, tr, lay).fits:
                            continue
                        fitting += 1
                        r = simulate_moe_step(model, cluster, s, e, tr, ep, mode="analytic")
                        rows.append((r.step_time_s, s.short, e.short, ep, b, att, tr, r))
    rows.sort(key=lambda x: x[:6])
    best = []
    for i, (step, s, e, ep, b, att, tr, r) in enumerate(rows[:max(top, engine_top)]):
        d = {"strategy": r.strategy.name, "expert_strategy": r.extra["expert_strategy"],
             "label": f"{s} x {e}", "ep": ep, "edp": r.extra["edp"],
             "ep_nodes": r.extra["ep_nodes"], "micro_batch": b,
             "accum_steps": tr.accum_steps, "attention": att,
             "closed_form_step_s": step, "tokens_per_s": r.tokens_per_s, "mfu": r.mfu,
             "memory_bytes": r.memory.total_bytes}
        if i < engine_top:
            eng = simulate_moe_step(model, cluster, s, e, tr, ep, mode="engine")
            d.update(engine_step_s=eng.step_time_s, engine_tokens_per_s=eng.tokens_per_s,
                     engine_mfu=eng.mfu)
        best.append(d)
    # like with like: the replayed ones ranked by the engine's step time among themselves
    # (they are the closed form's best), the others by the closed form's below them
    best[:engine_top] = sorted(best[:engine_top], key=lambda d: d["engine_step_s"])
    return {"model": model.name, "cluster": cluster.name, "gpus": n, "moe": True,
            "global_batch": global_batch, "seq_len": seq_len,
            "searched": {"ep": eps, "micro_batch": bs, "attention": atts,
                         "strategies": [s.short for s in dense],
                         "expert_strategies": [s.short for s in experts]},
            "skipped": skipped, "points": points, "fitting": fitting,
            "engine_top": engine_top, "best": best[:max(top, engine_top)],
            "ranked_by": "the engine's step time for the replayed, then the closed form's",
            "elapsed_s": time.perf_counter() - t0}


def format_moe_advice(res: dict) -> str:
    """The text of :func:`advise_moe`'s result."""
    lines = [f"{res['model']} on {res['cluster']} ({res['gpus']} GPUs), global batch "
             f"{res['global_batch']} x {res['seq_len']} tokens: {res['points']} MoE "
             f"configurations searched, {res['fitting']} fit (EP "
             f"{','.join(map(str, res['searched']['ep']))}; micro-batch "
             f"{','.join(map(str, res['searched']['micro_batch']))}; attention "
             f"{','.join(res['searched']['attention'])}; dense x expert strategies)"]
    if not res["best"]:
        lines.append("no configuration fits")
        return "\n".join(lines)
    lines.append(f"{'#':>3}  {'dense x expert':<14}{'EP':>4}{'EDP':>5}{'mb':>4}{'accum':>6}  "
                 f"{'attn':<6}{'step s (cf)':>12}{'step s (engine)':>16}{'tokens/s':>11}"
                 f"{'MFU':>7}{'memory GiB':>12}")
    for i, d in enumerate(res["best"], 1):
        replayed = "engine_step_s" in d
        eng = f"{d['engine_step_s']:.3f}" if replayed else "-"
        tps = d["engine_tokens_per_s"] if replayed else d["tokens_per_s"]
        mfu = d["engine_mfu"] if replayed else d["mfu"]
        lines.append(f"{i:>3}  {d['label']:<14}{d['ep']:>4}{d['edp']:>5}{d['micro_batch']:>4}"
                     f"{d['accum_steps']:>6}  {d['attention']:<6}"
                     f"{d['closed_form_step_s']:>12.3f}{eng:>16}{tps:>11.0f}"
                     f"{mfu:>7.3f}{d['memory_bytes'] / 2**30:>12.1f}")
    for k, why in res["skipped"].items():
        lines.append(f"skipped {k}: {why}")
    lines.append(f"searched in {res['elapsed_s']:.1f} s (closed form; the first "
                 f"{res['engine_top']} replayed on the engine and ranked by its step time, "
                 "the others by the closed form's below them; tokens/s and MFU: the engine's "
                 "where replayed, else the closed form's)")
    return "\n".join(lines)


def parse_strategies(text: str | None, flag: str) -> tuple[Strategy, ...] | None:
    """``all`` / None -> None (all 14); else a comma list of strategies."""
    if text is None or text.strip().lower() == "all":
        return None
    out = tuple(parse_strategy(t.strip()) for t in text.split(",") if t.strip())
    if not out:
        raise InputError(f"{flag} {text!r} names no strategy; expected a comma list such as "
                         "NIG,GGG, or all")
    return out
