"""One global training step of a mixture-of-experts model, end to end: the MoE plan
(:mod:`parosim.plan.moe_step`) on the engine or in closed form (:mod:`parosim.evaluate.
moe_step`), with token imbalance drawn per step, and the metrics of a dense step
(docs/moe.md, "A MoE training step").

Memory: :func:`parosim.plan.moe_memory.moe_memory` (states, activations with top-k routing,
buffers, margin); a step that does not fit is reported with ``fits`` false, not simulated.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..collectives.alltoall import lower_p2p
from ..collectives.deepep import EPDispatcher, bf16_token_bytes, deepep_routing
from ..collectives.types import Algo, Scope, parse_enum
from ..errors import InputError
from ..evaluate.moe_layer import Routing
from ..evaluate.moe_step import draw_step_loads, evaluate_moe
from ..evaluate.replay import replay
from ..fabric.network import MAX_SIM_SECONDS, horizon_error
from ..plan.builder import CollectiveOp
from ..plan.experts import ExpertLayout, dense_states_bytes, expert_states_bytes
from ..plan.moe_memory import moe_memory
from ..plan.moe_step import (
    A2AOp,
    build_moe_plan,
    check_moe_step,
    op_program,
    parse_a2a_algo,
    program_key,
)
from ..spec.model import ModelSpec
from ..spec.runtime import effective_overlap_slowdown
from ..spec.strategy import parse_strategy
from ..spec.system import ClusterSpec
from ..spec.training import TrainingSpec
from .step import MODES, StepResult, cross_node_fraction, hardware_flops, step_metrics


def moe_analytic_bytes(plan, spec: ClusterSpec, algo: Algo, repeat: int = 1
                       ) -> tuple[float, float]:
    """Bytes one GPU sends per step over intra-node and inter-node hops (average) in the
    closed form: each collective's lowered phases split by their share of node-crossing
    hops, as a dense step's; an all-to-all counted as the p2p algorithm sends it, (k-1)/k of
    its size per rank, split by the share of its flows that leave the node. ``repeat``:
    micro-step ops counted that many times."""
    intra = inter = 0.0
    if len(_MOE_TERMS) > 64:
        _MOE_TERMS.clear()
    progs = _MOE_TERMS.setdefault(spec, {})   # per cluster, across plans (advise costs many)
    if len(progs) > 100_000:
        progs.clear()
    gpn = spec.gpus_per_node
    for op in plan.ops:
        if not isinstance(op, CollectiveOp):
            continue
        if isinstance(op, A2AOp) and not op.ep_call:
            k = len(op.scopes[0])
            f = progs.get(op.scopes)
            if f is None:
                pairs = lower_p2p(spec, Scope.GLOBAL, op.size_bytes,
                                  groups=[list(g) for g in op.scopes]).phases[0].ringset
                f = progs[op.scopes] = cross_node_fraction(pairs, gpn)
            sent = op.size_bytes * (k - 1) / k * (1 if op.micro_step is None else repeat)
            inter += sent * f
            intra += sent * (1 - f)
            continue
        key = program_key(op, algo)
        terms = progs.get(key)
        if terms is None:   # (bytes per rank, cross-node fraction) per phase, once per program
            prog = op_program(op, spec, algo)
            # a group collective's ranks are every GPU (EDP groups cover the cluster; so do
            # the EP groups); a DeepEP phase's flows are not one per rank: its bytes per rank
            # are its flows x bytes per flow / GPUs
            terms = progs[key] = [
                (ph.bytes_per_rank * len(ph.ringset.hop_list) / spec.gpus
                 if isinstance(op, A2AOp) else ph.bytes_per_rank,
                 cross_node_fraction(ph.ringset, gpn)) for ph in prog.phases]
        times = 1 if op.micro_step is None else repeat
        for b, f in terms:
            inter += times * b * f
            intra += times * b * (1 - f)
    return intra, inter


#: per cluster: each collective's byte terms (an all-to-all's cross-node fraction, a
#: group collective's (bytes per rank, cross-node fraction) per phase), as
#: :func:`moe_analytic_bytes` derives them, once per program across plans
_MOE_TERMS: dict = {}


def simulate_moe_step(model: ModelSpec, cluster: ClusterSpec, strategy, expert_strategy,
                      training: TrainingSpec, ep: int, algo: Algo | str = Algo.HO_RING,
                      mode: str = "engine", a2a_algo: Algo | str = Algo.P2P,
                      routing: Routing | None = None, repeats: int = 1, seed: int = 0,
                      trace: bool = False) -> StepResult:
    """One global MoE step (module docstring). ``routing`` None: the deterministic step
    (every expert gets its mean load); else ``repeats`` steps drawn from ``routing`` with one
    generator seeded ``routing.seed``: ``step_time_s`` is their mean and ``extra`` holds the
    distribution, the forced-balance step and the cost of imbalance."""
    strategy, est = parse_strategy(strategy), parse_strategy(expert_strategy)
    algo = algo if isinstance(algo, Algo) else parse_enum(Algo, algo, "--algo")
    a2a_algo = parse_a2a_algo(a2a_algo)
    if mode not in MODES:
        raise InputError(f"mode {mode!r} is not known; expected one of {', '.join(MODES)}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise InputError(f"--repeats = {repeats!r} must be a positive integer")
    check_moe_step(model, cluster, training)
    if cluster.compute_heterogeneous or cluster.jitter_cv > 0 or (
            mode == "analytic" and not cluster.closed_form_exact):
        raise InputError(f"cluster {cluster.name!r} has GPU overrides, jitter or link "
                         "overrides / ECMP hashing, which MoE steps do not model; expected a "
                         "homogeneous cluster")
    lay = ExpertLayout(cluster, model.moe.experts, ep=ep)
    slow = effective_overlap_slowdown(training.overlap_slowdown,
                                      getattr(cluster, "overlap_slowdown", None), None)
    mem = moe_memory(model, strategy, est, cluster, training, lay)
    res = StepResult(strategy, algo, mode, cluster.gpus, mem, overlap_slowdown=slow)
    res.extra = {"ep": ep, "edp": lay.edp, "m_edp": lay.m_edp, "ep_nodes": lay.ep_nodes,
                 "expert_strategy": est.name, "a2a_algo": a2a_algo.value}
    if not mem.fits:
        return res

    # the closed form of the deterministic step: one micro-step counted s times (identical
    # micro-steps); with a routing every micro-step has its own draws
    fold = mode == "analytic" and routing is None
    rep_n = training.accum_steps if fold else 1

    def run(rows=None, sizes=None):
        plan = build_moe_plan(model, strategy, est, cluster,
                              replace(training, accum_steps=1) if fold else training, ep,
                              a2a_algo, rows, sizes)
        if mode == "engine":
            rep = replay(plan, cluster, algo, slow, trace=trace, period_nodes=cluster.nodes)
            b_intra = rep.gpu_egress.get("intra", 0.0) / cluster.gpus
            b_inter = rep.gpu_egress.get("inter", 0.0) / cluster.gpus
            return (plan, rep.step_time_s, rep.exposed_comm_s, rep.compute_busy_s, b_intra,
                    b_inter, rep.events, rep.records)
        an = evaluate_moe(plan, cluster, algo, slow, rep_n)
        if not an.step_time_s <= MAX_SIM_SECONDS:
            raise horizon_error(an.step_time_s)
        comp = an.t_comp_s + an.t_optimizer_s
        b_intra, b_inter = moe_analytic_bytes(plan, cluster, algo, rep_n)
        return (plan, an.step_time_s, an.exposed_comm_s, comp, b_intra, b_inter, 0, [])

    plan, step, exposed, compute, b_intra, b_inter, events, records = run()
    extra = {**res.extra, "a2a_size_bytes": plan.a2a_size_bytes,
             "a2a_per_step": rep_n * sum(1 for o in plan.ops if o.stream == "comm-a2a"),
             "expert_states_bytes": expert_states_bytes(model, est, lay,
                                                        training.trainable_ratio,
                                                        training.optim_state_bytes),
             "dense_states_bytes": dense_states_bytes(model, strategy, lay,
                                                      training.trainable_ratio,
                                                      training.optim_state_bytes),
             "repeats": repeats, "seed": seed}
    if isinstance(a2a_algo, EPDispatcher) and ep > 1:
        r = deepep_routing(ep, cluster.gpus_per_node, model.moe.experts, model.moe.top_k,
                           grouped=False)
        extra["deepep"] = {"kernel": a2a_algo.kernel,
                           "tokens_per_rank": int(training.micro_batch * training.seq_len),
                           "token_bytes": bf16_token_bytes(model.hidden),
                           "p_rank": r.p_rank, "p_node": r.p_node}
    if routing is not None:
        rng = np.random.default_rng(routing.seed)
        deterministic = step
        times, ratios = [], []
        for _ in range(repeats):
            rows, sizes, rat = draw_step_loads(model, training, ep, lay.edp, routing, rng)
            t = run(rows, sizes)
            times.append(t[1])
            ratios.append(max(rat))
        ts = np.array(times)
        step = float(ts.mean())
        extra.update({"routing": routing.kind, "max_over_mean_param": routing.max_over_mean,
                      "zipf": routing.zipf, "routing_seed": routing.seed,
                      "step_times_s": times, "load_max_over_mean": ratios,
                      "balanced_step_s": deterministic,
                      "step_time_p50_s": float(np.percentile(ts, 50)),
                      "step_time_p99_s": float(np.percentile(ts, 99)),
                      "step_time_max_s": float(ts.max()),
                      "imbalance_cost": step / deterministic - 1.0})
    res.events, res.records, res.extra = events, records, extra
    return step_metrics(res, cluster, training, step, exposed, compute, b_intra, b_inter,
                        plan.tokens_per_step * rep_n, hardware_flops(plan, rep_n),
                        plan.model_flops_per_step * rep_n)


def moe_rank_key(r: StepResult) -> tuple:
    """Fitting pairs first, fastest first; then the others by smallest shortfall; ties by
    the dense, then the expert strategy's name."""
    e = r.extra.get("expert_strategy", "")
    if r.fits:
        return (0, r.step_time_s, r.strategy.short, e, r.algo.value)
    return (1, r.memory.shortfall_bytes, r.strategy.short, e, r.algo.value)


def _one_moe(args: tuple) -> StepResult:
    return simulate_moe_step(*args)


def compare_moe(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, ep: int,
                algos: list[Algo] | None = None, mode: str = "analytic",
                strategies=None, expert_strategies=None, a2a_algo: Algo | str = Algo.P2P,
                workers: int = 1) -> list[StepResult]:
    """Every dense x expert strategy pair (x every algorithm in ``algos``) of a MoE step,
    ranked best first (default: the 14 x 14 pairs). ``workers > 1``: engine runs in that
    many processes (each a pure function of its inputs: the same result)."""
    from ..spec.strategy import ALL_STRATEGIES  # deferred: the pair list alone needs it

    algos = algos or [Algo.HO_RING]
    dense = [parse_strategy(s) for s in (strategies or ALL_STRATEGIES)]
    experts = [parse_strategy(s) for s in (expert_strategies or ALL_STRATEGIES)]
    jobs = [(model, cluster, s, e, training, ep, a, mode, a2a_algo)
            for s in dense for e in experts for a in algos]
    if workers > 1 and mode == "engine" and len(jobs) > 2:
        import multiprocessing as mp  # deferred: pools cost start-up
        from concurrent.futures import ProcessPoolExecutor  # deferred: as above
        with ProcessPoolExecutor(workers, mp_context=mp.get_context("fork")) as ex:
            out = list(ex.map(_one_moe, jobs))
    else:
        out = [_one_moe(j) for j in jobs]
    return sorted(out, key=moe_rank_key)
