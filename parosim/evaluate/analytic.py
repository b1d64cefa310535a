"""The analytic (closed-form) evaluator of a Plan: the paper's guideline.

PaRO (arXiv 2310.06003, section 3.3) estimates a step as

    T ~ max(t_comm, t_comp),   t_comm = (t_param + t_gradient) * s + t_sync_g + t_sync_p

Evaluated on the *same Plan* the engine replays, with each collective's alpha-beta cost from
:func:`parosim.collectives.cost.program_time` (so the chosen algorithm counts):

* ``t_comp``: compute ops of the micro-steps; ``t_comm``: collectives of the micro-steps
  (parameter gathers and gradient reduce-scatters, summed: they share links in the paper's
  model);
* the accumulation boundary cannot overlap compute: T = max(t_comp, t_comm) + t_sync_g +
  t_optimizer + t_sync_p.

Two refinements (both vanish for the ideal runtime with no slowdown, which gives the formula
above exactly):

* *exposed* collectives, those a runtime puts between two consecutive compute ops (a
  gradient reduction that blocks the backward, ``overlap_comm: false``; a gather fetched on
  demand, prefetch 0; the last bucket a micro-step waits for), add their time in full:
  ``t_exposed``;
* overlap slowdown f (compute advances at 1/f while a collective runs, as in the engine):
  with c the overlappable communication and W the compute, the compute work done beside c
  is c/f, so ``max(c, W + c (1 - 1/f))`` replaces ``max(W, c)`` (exact for this fluid model
  when the communication runs during the compute).

How it differs from the engine (documented, tested): the engine also pays the pipeline fill
and drain of each step (the first parameter gather before any compute, the last gradient
reduce-scatter after the last backward), lets the two communication streams overlap when they
use different links (e.g. IGG: intra gathers beside global reduce-scatters), and models
contention when they share links. Where communication is fully hidden (t_comm << t_comp) or
fully exposed (t_comp << t_comm) on one stream the two agree within a few percent.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..collectives.cost import program_time
from ..collectives.lowering import lower, with_chain_fill
from ..collectives.types import Algo
from ..errors import InputError
from ..plan.dataparallel import ComputeOp, Plan
from ..spec.system import ClusterSpec


@dataclass(frozen=True)
class AnalyticResult:
    """Seconds per global step and its terms."""

    step_time_s: float
    t_comp_s: float          # micro-step compute (all s micro-steps)
    t_comm_s: float          # micro-step communication (all s micro-steps)
    t_sync_g_s: float
    t_optimizer_s: float
    t_sync_p_s: float
    t_exposed_s: float = 0.0     # micro-step collectives that block compute (all s)

    @property
    def exposed_comm_s(self) -> float:
        return (self.step_time_s - self.t_comp_s - self.t_optimizer_s
                if self.t_exposed_s else
                max(0.0, self.t_comm_s - self.t_comp_s) + self.t_sync_g_s + self.t_sync_p_s)


def _exposed_ids(plan: Plan) -> set[int]:
    """Micro-step collectives that block compute: one the next compute op of the compute
    stream waits for while it waits for the compute op before (a reduction on the compute
    stream, a gather fetched on demand), or one the accumulation boundary waits for right
    after the last backward (the last bucket of a micro-step: in a plan evaluated with one
    micro-step it stands for the end-of-backward synchronisation of each)."""
    prev: dict[int, int | None] = {}
    last = None
    for op in plan.ops:
        if isinstance(op, ComputeOp):
            prev[op.id] = last
            if op.micro_step is not None:
                last = op.id
    out = set()
    for op in plan.ops:
        waiter = op.micro_step is not None and isinstance(op, ComputeOp)
        boundary = op.micro_step is None
        if not (waiter or boundary):
            continue
        before = prev.get(op.id, last) if waiter else last
        for d in op.deps:
            c = plan.ops[d]
            if not isinstance(c, ComputeOp) and c.micro_step is not None and (
                    before in c.deps or _chain_from(plan, c, before)):
                out.add(d)
    return out


def _chain_from(plan: Plan, c, compute_id: int | None) -> bool:
    """``c`` reaches back to ``compute_id`` through collectives only (a chain of reductions
    issued after that compute op, e.g. reduce-scatter then inter all-reduce)."""
    seen = 0
    while c.deps and seen < 8:
        d = plan.ops[c.deps[0]]
        if isinstance(d, ComputeOp):
            return d.id == compute_id
        c, seen = d, seen + 1
    return False


def overlapped_time(comp: float, comm: float, f: float) -> float:
    """Wall time of ``comp`` seconds of compute beside ``comm`` seconds of communication when
    compute runs at 1/f of its speed while the communication is in flight (the engine's
    :class:`~parosim.fabric.engine.OverlapGate`, in closed form):
    ``max(comm, comp + comm (1 - 1/f))``.

    >>> overlapped_time(2.0, 1.0, 1.0), overlapped_time(2.0, 1.0, 2.0)
    (2.0, 2.5)
    >>> overlapped_time(1.0, 3.0, 2.0)   # the communication is longer: compute hides inside
    3.0
    """
    return max(comp, comm) if f == 1.0 else max(comm, comp + comm * (1.0 - 1.0 / f))


def evaluate(plan: Plan, spec: ClusterSpec, algo: Algo, repeat: int = 1,
             overlap_slowdown: float = 1.0) -> AnalyticResult:
    """Closed-form step time of ``plan`` (milliseconds of wall time, no simpy).

    ``repeat``: count every micro-step op that many times. Micro-steps are identical, so the
    plan of s = 1 evaluated with ``repeat=s`` equals the plan of s micro-steps (tested); the
    sweeps use that to stay within milliseconds per configuration.

    >>> from parosim.spec.model import preset
    >>> from parosim.plan import build_plan
    >>> from parosim.spec.training import TrainingSpec
    >>> c = ClusterSpec(nodes=4)
    >>> r = evaluate(build_plan(preset("llama-7b"), "NIG", c, TrainingSpec()), c, Algo.RING)
    >>> r.step_time_s > r.t_comp_s > 0
    True
    """
    if getattr(plan, "engine_only", ""):
        raise InputError(f"runtime {plan.runtime!r} with {plan.strategy.short}: "
                         f"{plan.engine_only}, which analytic mode cannot represent; expected "
                         "--mode engine")
    cache: dict[tuple, float] = {}
    comp = comm = sync_g = sync_p = opt = exposed = 0.0
    blocking = _exposed_ids(plan) if plan.runtime != "ideal" else set()
    for op in plan.ops:
        if isinstance(op, ComputeOp):
            if op.micro_step is None:
                opt += op.duration_s
            else:
                comp += op.duration_s
            continue
        a = op.algo or algo                 # a runtime may fix the algorithm per call
        key = (op.op, op.scope, op.size_bytes, a, op.chain)
        t = cache.get(key)
        if t is None:
            prog = lower(spec, op.op, op.scope, op.size_bytes, a)
            t = cache[key] = program_time(spec, with_chain_fill(spec, prog) if op.chain
                                          else prog)
        if op.id in blocking:
            exposed += t
        elif op.purpose == "sync-grad":
            sync_g += t
        elif op.purpose == "sync-param":
            sync_p += t
        else:
            comm += t
    comp, comm, exposed = comp * repeat, comm * repeat, exposed * repeat
    f = overlap_slowdown
    overlapped = overlapped_time(comp, comm, f)
    step = exposed + overlapped + sync_g + opt + sync_p
    return AnalyticResult(step, comp, comm + exposed, sync_g, opt, sync_p, exposed)
