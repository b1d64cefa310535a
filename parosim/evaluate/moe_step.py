"""A MoE training step (:mod:`parosim.plan.moe_step`) in closed form, and the routing draws
that put token imbalance into it (docs/moe.md, "A MoE training step").

Closed form. The compute stream waits for every all-to-all (dispatch, combine and their
gradients), so those are on its path; the parameter gathers and gradient reduce-scatters
(dense and expert) overlap it on their own streams; the boundary cannot overlap compute:

    T = a2a + overlapped(comp, max(0, comm - a2a), f) + t_sync_g + t_opt + t_sync_p

(``overlapped(c, m, f) = max(c, m)`` for f = 1, :func:`parosim.evaluate.analytic.
overlapped_time`), so with f = 1: ``max(comp + a2a, comm) + boundary``. Each collective's
time is its lowered program's :func:`~parosim.collectives.cost.program_time` (the all-to-alls
over the layout's EP groups, the expert collectives over its EDP groups). The engine also
contends: all-to-alls and sharding collectives share links; the two agree within 1 % where
one of the two paths dominates (tests/test_moe_step.py).

Token imbalance in the step (bulk-synchronous, per MoE layer): for each MoE-layer use of
each micro-step one routing matrix per EP group is drawn (:func:`parosim.evaluate.moe_layer.
route`, the same distributions and generator as ``parosim experts --routing``); the layer's
expert compute takes the busiest rank's rows, and its all-to-alls the busiest rank's bytes
(the most rows any rank sends or receives), over all EP groups: every rank of an EP group
waits for its slowest peer at the next all-to-all. Forced balance draws the balanced matrix,
which gives the deterministic step exactly. The per-rank, per-flow picture of one layer is
``parosim experts --routing`` (:mod:`parosim.evaluate.moe_layer`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..collectives.cost import program_time
from ..collectives.lowering import lower
from ..collectives.types import Algo
from ..plan.builder import ComputeOp
from ..plan.moe_step import A2AOp, MoEPlan, balanced_rows, moe_uses
from ..spec.model import ModelSpec
from ..spec.training import TrainingSpec
from .analytic import overlapped_time
from .moe_layer import BYTES_PER_ELEMENT, Routing, route

# program times by cluster and op key, shared by the evaluations of one process (a search
# costs thousands of plans over the same collectives)
_TIMES: dict = {}


@dataclass(frozen=True)
class MoEAnalytic:
    """Seconds per global step and its terms."""

    step_time_s: float
    t_comp_s: float
    t_a2a_s: float
    t_comm_s: float
    t_sync_g_s: float
    t_optimizer_s: float
    t_sync_p_s: float

    @property
    def exposed_comm_s(self) -> float:
        return self.step_time_s - self.t_comp_s - self.t_optimizer_s


def evaluate_moe(plan: MoEPlan, spec, algo: Algo, overlap_slowdown: float = 1.0,
                 repeat: int = 1) -> MoEAnalytic:
    """The closed form of the module docstring on the plan the engine replays; ``repeat``:
    count every micro-step op that many times (identical micro-steps: a plan of one
    micro-step stands for s of them, as the dense closed form does)."""
    cache = _TIMES.setdefault(spec, {}) if len(_TIMES) < 64 else {}
    comp = a2a = comm = sync_g = sync_p = opt = 0.0
    for op in plan.ops:
        if isinstance(op, ComputeOp):
            if op.micro_step is None:
                opt += op.duration_s
            else:
                comp += op.duration_s
            continue
        own = getattr(op, "lower", None)
        key = ((op.cache_key, getattr(op.scopes, "glob", None), getattr(op.scopes, "m", 0),
                algo) if own is not None else (op.op, op.scope, op.size_bytes, algo))
        t = cache.get(key)
        if t is None:
            prog = own(spec, algo) if own is not None else lower(spec, op.op, op.scope,
                                                                  op.size_bytes, algo)
            t = cache[key] = program_time(spec, prog)
        if isinstance(op, A2AOp):
            a2a += t
        elif op.purpose == "sync-grad":
            sync_g += t
        elif op.purpose == "sync-param":
            sync_p += t
        else:
            comm += t
    comp, a2a, comm = comp * repeat, a2a * repeat, comm * repeat
    step = (a2a + overlapped_time(comp, max(0.0, comm - a2a), overlap_slowdown)
            + sync_g + opt + sync_p)
    return MoEAnalytic(step, comp, a2a, comm, sync_g, opt, sync_p)


def draw_step_loads(model: ModelSpec, training: TrainingSpec, ep: int, groups: int,
                    routing: Routing, rng: np.random.Generator
                    ) -> tuple[list[float], list[float], list[float]]:
    """One step's routing: per MoE-layer use (micro-step-major, forward then backward of
    each layer in plan order) the busiest rank's rows, the all-to-all size in bytes per rank
    (the busiest rank's sent or received rows x h x 2 x EP, so that a balanced all-to-all of
    that size moves its bytes per peer), and the most loaded rank's rows over the mean."""
    rows = int(balanced_rows(model, training, ep))
    n_layers = model.layers - model.moe.dense_layers
    rows_out, sizes, ratios = [], [], []
    for _mb in range(training.accum_steps):
        per_layer = []
        for _layer in range(n_layers):
            mats = [route(routing, ep, model.moe.experts, rows, rng) for _ in range(groups)]
            load = max(float(m.sum(axis=0).max()) for m in mats)
            # the busiest rank's bytes to (or from) its peers, as a balanced all-to-all
            remote = max(max(float((m.sum(axis=0) - np.diag(m)).max()),
                             float((m.sum(axis=1) - np.diag(m)).max())) for m in mats)
            size = (float(rows) if ep == 1 or remote * ep == rows * (ep - 1)
                    else remote * ep / (ep - 1))
            per_layer.append((load, size * model.hidden * BYTES_PER_ELEMENT,
                              load / (rows * 1.0)))
        # forward uses in layer order, backward uses in reverse (the plan's order)
        for seq in (per_layer, per_layer[::-1]):
            for load, size, ratio in seq:
                rows_out.append(load)
                sizes.append(size)
                ratios.append(ratio)
    assert len(rows_out) == moe_uses(model, training)
    return rows_out, sizes, ratios

