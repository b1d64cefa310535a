"""A MoE training step (:mod:`parosim.plan.moe_step`) in closed form, and the routing draws
that put token imbalance into it (docs/moe.md, "A MoE training step").

Closed form: the plan's own schedule, costed op by op with each collective's lowered
program time (:func:`~parosim.collectives.cost.program_time`; the all-to-alls over the
layout's EP groups, the expert collectives over its EDP groups), bounded by the links the
streams share (docs/moe.md, "A MoE training step"). Five terms, each a mechanism of the
engine's schedule:

1. **The streams' schedule** ``R``: every op starts when its dependencies and the op before
   it on its stream (compute, comm-a2a, comm-param, comm-grad) have ended and runs for its
   uncontended time (a max-plus recursion over the plan, the engine without link sharing).
   It carries the compute path with its all-to-alls, the gathers' prefetch of two uses, the
   gathers the first compute waits for, and the gradient reduce-scatters that are issued
   only after their layer's backward (so they overlap the rest of the backward only, and
   the boundary waits for the last). Identical micro-steps (``repeat``) are unrolled with the
   builder's cross-micro-step prefetch (a gather waits for the compute that consumed the
   gather two before it) until the state repeats shifted by one period, then extrapolated
   exactly.
2. **Shared links** ``W_K + max(0, I_K - F_K - S_K) + G_K + boundary`` for each link class K
   (intra-node: NVLink; inter-node: the NICs; a phase with one node-crossing hop is on the
   NICs): every micro-step phase on K (gathers, reduce-scatters and all-to-alls) shares
   those links, so their transfer times (bytes over bandwidth) add up (the engine shares a
   link between concurrent flows). Their latency parts (steps x alpha, launch and protocol
   time) overlap the transfers of the other stream, except while the gathers run alone:
   ``I_K``, per micro-step, the gather-stream ops before its first gradient reduce-scatter
   (plan order: the forward and the first backward units) count their whole time except
   their transfers on K (K idles while the gather stream runs latency or phases on other
   links), less ``F_K``, the all-to-alls' transfers on K that fall into that idle time in
   ``R`` (the all-to-alls run on their own stream; each all-to-all's transfer spread over
   its time, each gather's idle share of its time, counted over the time the two overlap),
   and less ``S_K``, the same for the reduce-scatters that run into the gathers' idle time
   in ``R`` (a previous micro-step's). ``G_K``: the time K idles in ``R`` while the gather
   stream waits between those ops (its prefetch two uses ahead of the compute, e.g. over
   the head's compute) up to the first reduce-scatter, less the other ops' transfers on K
   in those gaps; a gap counts only after the reduce-scatters issued before it have ended
   in ``R`` plus the reduce-scatter stream's delay by term 4 (the engine runs them later),
   and not on a link class the all-to-alls move data on (term 3's contention moves the
   gathers' waits there).
3. **All-to-all contention** ``R + sum_K e_K sum_j min(c_jK a_K / P, m_jK)``: each collective
   stream j (the gathers, the reduce-scatters; c_jK seconds of transfer on K) runs spread over
   the compute path ``P = t_comp + t_a2a``; the share ``a_K / P`` of it falls into the
   all-to-alls' windows on the same links and delays the all-to-alls on the compute path by
   that much (the link moves both), but by at most ``m_jK``: the engine shares a link by
   weighted max-min fairness, a transfer counting once per flow it has there, so an all-to-all
   with ``w_a`` flows on a GPU's K link beside an op of stream j with ``w_j`` flows keeps
   ``w_a / (w_a + w_j)`` of it and each second of its own time on K grows by at most
   ``w_j / w_a``; ``m_jK`` sums that over the all-to-alls inside the stream's span in ``R``
   (its first op's start to its last op's end, per micro-step). ``c_jK`` counts the stream's
   transfers only: its latency parts move no bytes and take no share of K. The spread counts
   only on a link class where stream j keeps less than half of K beside an all-to-all, i.e.
   where the flows beside its own on a GPU's K link (the all-to-alls' ``w_a`` and the other
   collective stream's, where that one moves data on K too) outnumber its ``w_j``: only then
   is it stretched past the all-to-all and spread over the path. And each all-to-all grows
   only as far as its lanes let the growth of its phases on K through: each phase on K grows
   by the streams' density there (``sum_j c_jK / P`` per second of its transfer), and the
   all-to-all's lane recurrence (as in term 4) gives how much longer it runs; ``e_K``, that
   over the phases' own growth, scales the spread (1 for a one-lane program; less for a DeepEP
   kernel, whose NVLink lane waits for its RDMA lane and absorbs its growth in that slack).
   Or, if more, ``R + sum_K e_K sum_j O_jK``: the streams' transfers that run beside the
   all-to-alls' phases in ``R``. Each all-to-all runs its lowered phases by its lanes from its
   start (a hierarchical program's RDMA and NVLink stages, a DeepEP kernel's chunks); for each
   phase p on K, stream j's transfer on K over p's time (each op's transfer spread over its
   time), at most ``w_j / w_p`` x p's own transfer over the same overlap (p's flow share). The
   spread estimate fits the p2p all-to-all (8 flows on a NIC: a ring gather keeps 1/9 and runs
   on across several all-to-alls); a hierarchical or DeepEP all-to-all has one RDMA flow per
   NIC, keeps half of it beside a gather, and a gather issued with it (the expert compute's
   end starts both the combine and the gather two uses ahead) delays it by its whole transfer.
   With one such flow beside a lone reduce-scatter stream on the NICs (the expert
   reduce-scatters of NGG / IGG, one flow each) each keeps half, the reduce-scatter runs
   beside the all-to-all it meets in ``R`` and no further, and ``O_jK`` alone counts it;
   beside the gathers and the reduce-scatters together (x GGG) each keeps a third and the
   spread counts.
4. **A collective stream's own links** ``max_i (e_i + d_i + tail_i)``, for the gather stream
   (which the compute waits for) and the reduce-scatter stream (which the boundary waits
   for). Each is serial, so over its last busy period ``[b0, b1]`` of ``R`` (its ops back to
   back up to its last one) the other streams' transfers on a link class K in the period
   (``rho_K`` seconds per second of the period; each op's transfers by the share of its time
   inside) take K from it: every second one of its phases transfers on K meets ``rho_K``
   seconds of theirs and waits for them (the link moves both). Each of its ops runs
   longer by its phases so grown, through its own lanes (a pipelined program's lane with
   slack absorbs its share); op i of the last micro-step, ending at ``e_i`` in ``R``, ends
   ``d_i`` later (the growth of the stream's ops from ``b0`` to it), and the step ends no
   earlier than ``e_i + d_i + tail_i`` (``tail_i``: the longest chain of ops by dependency
   and stream order from op i's end to the step's end, at uncontended times).
5. **The all-to-alls' windows** ``R + sum_w max(g_w, N_w - L_w)``: a micro-step's forward
   all-to-alls (between the embedding and the head) and its backward ones each span a
   window w of ``R`` (the first one's start to the last one's end, ``L_w`` long) on the
   compute path. Each window grows by term 3 restricted to its all-to-alls (``g_w``: each
   stream's share ``c_jK a_wK / P``, at most its flow shares of the window's all-to-alls
   inside its span) or, if more, by the work ``N_w`` its link class K (the all-to-alls'
   links) must do in it beyond ``L_w``: every op's transfers on K by the share of its time
   inside, and the time K idles while the gathers that transfer on K run their other
   phases (latency parts, phases on other links), where K carries most of the gather
   stream's transfers and an all-to-all has more flows on a GPU's K link than a gather:
   by weighted max-min the gather then keeps the smaller share
   and ends a whole all-to-all transfer later for each it meets, the gather stream falls
   behind and runs back to back, the compute waits for it, and the all-to-alls, which
   wait for the compute, no longer fill the gathers' other phases as they do in ``R``.
   Not in a backward with reduce-scatters (they fill K there, as in term 2).

    T = max(R, max_K (W_K + max(0, I_K - F_K - S_K) + G_K) + t_sync_g + t_opt + t_sync_p,
            R + max(sum_K e_K sum_j min(c_jK a_K / P, m_jK), sum_K e_K sum_j O_jK,
                    sum_w max(g_w, N_w - L_w)),
            max_i (e_i + d_i + tail_i))

(``R`` ends with the boundary: gradient syncs, optimizer, parameter syncs.) With overlap
slowdown f > 1 the schedule does not slow compute beside collectives; the step is then the
larger of ``T`` and the fluid form ``t_a2a + overlapped(t_comp, max(0, t_comm - t_a2a), f)
+ boundary`` (:func:`parosim.evaluate.analytic.overlapped_time`). Engine and closed form
agree within 1 % for every fitting dense x expert pair at f = 1 in the settings of
docs/moe.md's first table (tests/test_moe_step.py); in the layouts of its second table and
the ones listed after it, only for some pairs (the counts and ranges measured there).

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

from collections import Counter
from dataclasses import dataclass

import numpy as np

from ..collectives.cost import lane_schedule, phase_time, program_time, ring_alpha_beta
from ..collectives.types import Algo
from ..plan.builder import COMM_GRAD, COMM_PARAM, ComputeOp
from ..plan.moe_step import (
    COMM_A2A,
    A2AOp,
    MoEPlan,
    balanced_rows,
    moe_uses,
    op_program,
    program_key,
)
from ..spec.model import ModelSpec
from ..spec.training import TrainingSpec
from .analytic import overlapped_time
from .moe_contention import a2a_met, a2a_share, a2a_windows
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


def _op_times(op, spec, algo: Algo, cache: dict) -> tuple:
    """(program time, seconds of its phases on intra-node links: transfer, latency; on the
    NICs: transfer, latency; its lanes: the program, per phase (time, transfer seconds,
    link class 0 intra / 1 NICs) and per phase the most flows from one GPU on its link of
    that class; the most flows from one GPU on a link of each class) of one collective op,
    cached by cluster and op key."""
    key = program_key(op, algo)
    got = cache.get(key)
    if got is None:
        prog = op_program(op, spec, algo)
        gpn = spec.gpus_per_node
        w = [0.0, 0.0, 0.0, 0.0]     # intra transfer, intra latency, inter ...
        flows = [0, 0]               # the most flows from one GPU on a link of class K
        rows, per = [], []
        for ph in prog.phases:
            t = phase_time(spec, ph)
            if ph.steps == 0:
                rows.append((t, 0.0, 0))
                per.append(0)
                continue
            _alpha, bw = ring_alpha_beta(spec, ph.ringset)
            xfer = min(t, ph.bytes_per_rank / min(bw * ph.bw_eff, ph.cap_Bps))
            hops = list(ph.ringset.hops())
            k = 2 if any(a // gpn != b // gpn for a, b in hops) else 0
            w[k] += xfer
            w[k + 1] += t - xfer
            rows.append((t, xfer, k // 2))
            # a GPU's own link of class K: its NIC (hops leaving its node) or its NVLink
            out = Counter(a for a, b in hops if (a // gpn != b // gpn) == (k == 2))
            per.append(max(out.values(), default=0))
            flows[k // 2] = max(flows[k // 2], per[-1])
        got = cache[key] = (program_time(spec, prog), *w, (prog, tuple(rows), tuple(per)),
                            tuple(flows))
    return got


def _grown(lanes: tuple, rho) -> float:
    """How much longer a collective runs (its lanes' recurrence) when each of its phases on
    link class K also yields the link to ``rho[K]`` seconds of other transfers per second of
    its own transfer. A pipelined program's lanes on the two classes run at once, so the
    lane with slack absorbs its share."""
    prog, rows = lanes[:2]
    base = lane_schedule(prog, [t for t, _, _ in rows])
    grown = lane_schedule(prog, [t + x * rho[k] for t, x, k in rows])
    return max(e for _, e in grown) - max(e for _, e in base)


def _schedule(plan: MoEPlan, dur: list[float], repeat: int) -> tuple[float, np.ndarray]:
    """Term 1 of the module docstring: the end of the streams' schedule with uncontended op
    times ``dur``, the plan's micro-step run ``repeat`` times; and the end of every micro-step
    op in each of the ``repeat`` runs (shape ``(repeat, micro-step ops)``; the runs after the
    state repeats are the last one unrolled shifted by its period)."""
    ops = plan.ops
    micro = [op for op in ops if op.micro_step is not None]
    m = len(micro)
    assert all(op.id == i for i, op in enumerate(micro)), "micro-step ops come first"
    # the gathers by group in plan order and the compute op that consumes each: from the
    # second micro-step on, a gather the builder left without a dependency waits for the
    # consumer of the gather two before it on its group (the prefetch depth of two uses)
    consumer: dict[int, int] = {}
    for op in micro:
        if isinstance(op, ComputeOp):
            for d in op.deps:
                consumer.setdefault(d, op.id)
    gathers = [op.id for op in micro if op.stream == COMM_PARAM and op.purpose ==
               "param-gather"]
    group = {g: getattr(ops[g], "group", None) for g in gathers}
    lane: dict[str, float] = {}
    last_cons: dict = {}     # per gather group: the last two consumers' end times
    end = [0.0] * m
    shift = 0.0
    prev_state = None
    runs: list[list[float]] = []
    delta = 0.0
    k = 0
    while k < repeat:
        new_cons: dict = {}
        for op in micro:
            i = op.id
            deps = op.deps
            if k and i in group and not deps:
                g = group[i]
                seq = last_cons.get(g, ())
                # the builder's done[-2]: the j-th gather of this micro-step (j < 2, the
                # ones without a dependency) waits for the previous micro-step's consumer
                # of its (j - 2)-th last gather
                j = len(new_cons.get(g, ()))
                before = seq[len(seq) + j - 2] if 0 <= len(seq) + j - 2 < len(seq) else 0.0
                new_cons.setdefault(g, []).append(consumer.get(i, i))
                st = max(lane.get(op.stream, 0.0), before)
            else:
                if i in group:
                    new_cons.setdefault(group[i], []).append(consumer.get(i, i))
                st = lane.get(op.stream, 0.0)
                for d in deps:
                    st = max(st, end[d])
            e = st + dur[i]
            end[i] = e
            lane[op.stream] = e
        runs.append(end[:])
        last_cons = {g: [end[c] for c in cs[-2:]] for g, cs in new_cons.items()}
        state = (sorted(lane.items()), sorted((str(g), tuple(v)) for g, v in last_cons.items()))
        k += 1
        if prev_state is not None:
            diffs = [b - a for (_, a), (_, b) in zip(prev_state[0], state[0], strict=True)]
            diffs += [b - a for (_, va), (_, vb) in zip(prev_state[1], state[1], strict=True)
                      for a, b in zip(va, vb, strict=True)]
            delta = diffs[0]
            tol = 1e-12 * max(1.0, max(v for _, v in state[0]))
            if all(abs(x - delta) <= tol for x in diffs) and k < repeat:
                # the micro-step's state repeats shifted by delta: every later micro-step
                # is this one shifted by delta (the schedule is shift-invariant)
                shift = (repeat - k) * delta
                break
        prev_state = state
    end = [e + shift for e in end]
    lane = {s_: e + shift for s_, e in lane.items()}
    full = end + [0.0] * (len(ops) - m)
    for op in ops[m:]:
        st = lane.get(op.stream, 0.0)
        for d in op.deps:
            st = max(st, full[d])
        full[op.id] = st + dur[op.id]
        lane[op.stream] = full[op.id]
    ends = np.array(runs, dtype=float).reshape(len(runs), m)
    if len(runs) < repeat:
        ahead = delta * np.arange(1, repeat - len(runs) + 1, dtype=float)
        ends = np.concatenate([ends, ends[-1] + ahead[:, None]])
    return max(full, default=0.0), ends


def _tails(plan: MoEPlan, dur: list[float]) -> list[float]:
    """``tail_i`` of term 4 (module docstring) for every op of the plan (of a folded plan:
    of its last micro-step): the longest chain of ops, each waiting for the one before by
    dependency or by stream order, from op i's end to the end of the step, at the
    uncontended times ``dur``. If op i ends ``x`` later and nothing else moves, the step
    ends at ``max(R, end_i + x + tail_i)``."""
    ops = plan.ops
    out = [0.0] * len(ops)
    nxt: dict[str, int] = {}        # the next op on each stream
    for op in reversed(ops):
        i = op.id
        best = 0.0
        j = nxt.get(op.stream)
        if j is not None:
            best = dur[j] + out[j]
        nxt[op.stream] = i
        out[i] = max(best, out[i])
        for d in op.deps:
            out[d] = max(out[d], dur[i] + out[i])
    return out


def _stream_delay(plan: MoEPlan, links: dict, lanes: dict, starts: np.ndarray,
                  ends: np.ndarray, stream: str) -> tuple[list[int], np.ndarray]:
    """Term 4 of the module docstring for one collective stream: its ops i of the last
    micro-step in its last busy period of ``R``, and ``e_i + d_i`` for each (the end of op i
    once the other streams' transfers in the period have taken their share of its links).
    ``starts`` / ``ends``: every micro-step op in each run (:func:`_schedule`); ``lanes``:
    each collective's lanes (:func:`_op_times`)."""
    ops = plan.ops
    m = ends.shape[1]
    own = [i for i in range(m) if ops[i].stream == stream]
    others = [i for i in links if ops[i].stream != stream]
    if not own or not others:
        return [], np.zeros(0)
    o_s, o_e = starts[:, own].ravel(), ends[:, own].ravel()
    b1 = float(o_e[-1])
    tol = 1e-12 * max(1.0, b1)
    # the stream's last busy period [b0, b1]: back from its last op while each op starts
    # when the one before it ends
    gaps = np.flatnonzero(o_s[1:] > o_e[:-1] + tol)
    first = int(gaps[-1]) + 1 if len(gaps) else 0
    b0 = float(o_s[first])
    if b1 - b0 <= tol:
        return [], np.zeros(0)
    runs = ends.shape[0]
    x_oth = np.tile(np.array([[links[i][k][0] for k in (0, 1)] for i in others]), (runs, 1))
    s_oth, e_oth = starts[:, others].ravel(), ends[:, others].ravel()
    # the other streams' transfers on K in the period (each op's by the share of its time
    # inside), per second of the period
    inside = np.clip(np.minimum(e_oth, b1) - np.maximum(s_oth, b0), 0.0, None) / np.where(
        e_oth > s_oth, e_oth - s_oth, 1.0)
    rho = (inside @ x_oth) / (b1 - b0)
    if not rho.any():
        return [], np.zeros(0)
    # each of the stream's ops runs longer by the other transfers its own transfers meet
    grown: dict = {}                         # by program: ops repeat a few programs
    for i in own:
        if id(lanes[i][0]) not in grown:
            grown[id(lanes[i][0])] = _grown(lanes[i], rho)
    more = np.array([grown[id(lanes[i][0])] for i in own])
    later = np.cumsum(np.tile(more, runs)[first:])
    last = ops[m - 1].micro_step
    pos = [(n, i) for n, i in enumerate(own) if ops[i].micro_step == last
           and (runs - 1) * len(own) + n >= first]
    if not pos:
        return [], np.zeros(0)
    n0 = (runs - 1) * len(own) - first
    return ([i for _, i in pos],
            ends[-1, [i for _, i in pos]] + later[[n0 + n for n, _ in pos]])


def _a2a_fill(plan: MoEPlan, links: dict, dur: list[float], starts: np.ndarray,
              ends: np.ndarray, g0: dict, stream: str = COMM_A2A) -> list[float]:
    """Per link class K, the transfers on K of ``stream``'s ops (default the all-to-alls:
    ``F_K``; the reduce-scatters: ``S_K``) that fall into the time K idles for the gathers
    alone (term 2 of the module docstring), by ``R``: such an op moves its transfer on K
    spread over its time, a gather leaves K idle for the share of its time that is not its
    own transfer on K, and each pair counts the product over the time the two overlap in
    ``R`` (every micro-step of every run)."""
    ops = plan.ops
    m = ends.shape[1]
    a2as = [i for i in range(m) if ops[i].stream == stream and i in links]
    alone = [i for i in range(m) if ops[i].stream == COMM_PARAM and i in links
             and (g0.get(ops[i].micro_step) is None or i < g0[ops[i].micro_step])]
    if not a2as or not alone:
        return [0.0, 0.0]
    # the gathers alone are ops of one serial stream: disjoint intervals, in time order
    g_s, g_e = starts[:, alone].ravel(), ends[:, alone].ravel()
    order = np.argsort(g_s, kind="stable")
    g_s, g_e = g_s[order], g_e[order]
    a_s, a_e = starts[:, a2as].ravel(), ends[:, a2as].ravel()
    d_a = np.tile(np.array([dur[i] for i in a2as]), ends.shape[0])
    d_g = np.tile(np.array([dur[i] for i in alone]), ends.shape[0])[order]
    knots = np.column_stack([g_s, g_e]).ravel()
    out = []
    for kk in (0, 1):
        rate = np.tile(np.array([links[i][kk][0] for i in a2as]), ends.shape[0]) / np.where(
            d_a > 0, d_a, 1.0)
        x_g = np.tile(np.array([links[i][kk][0] for i in alone]), ends.shape[0])[order]
        gap = np.clip(d_g - x_g, 0.0, None)
        if not rate.any() or not gap.any():
            out.append(0.0)
            continue
        # K's idle time for the gathers up to each knot: piecewise linear in time
        cum = np.column_stack([np.zeros_like(gap), gap]).ravel()
        cum = np.cumsum(cum)
        out.append(float(rate @ (np.interp(a_e, knots, cum) - np.interp(a_s, knots, cum))))
    return out


def _gather_gaps(plan: MoEPlan, links: dict, dur: list[float], starts: np.ndarray,
                 ends: np.ndarray, g0: dict, lag: float) -> list[float]:
    """Per link class K, ``G_K`` of term 2 (module docstring): the time K idles, by ``R``,
    while the gather stream waits between its ops alone (its prefetch two uses ahead of the
    compute) up to the micro-step's first gradient reduce-scatter, less the other ops'
    transfers on K in those gaps (each op's transfer spread over its time). Not counted on
    a link class the all-to-alls move data on: there term 3's contention moves the compute
    path and the gathers' waits away from ``R``'s."""
    ops = plan.ops
    m = ends.shape[1]
    alone = [i for i in range(m) if ops[i].stream == COMM_PARAM and i in links
             and (g0.get(ops[i].micro_step) is None or i < g0[ops[i].micro_step])]
    a2a_k = [any(links[i][kk][0] > 0 for i in links if isinstance(ops[i], A2AOp))
             for kk in (0, 1)]
    if not alone or all(a2a_k):
        return [0.0, 0.0]
    grads = [i for i in links if ops[i].stream == COMM_GRAD]
    r_s, r_e = starts[:, grads].ravel(), ends[:, grads].ravel()
    lo, hi = [], []                  # the gaps: every run, every micro-step
    for mb in sorted({ops[i].micro_step for i in alone}):
        ids = [i for i in alone if ops[i].micro_step == mb]
        g = g0.get(mb)
        if g is None:
            continue
        for r in range(ends.shape[0]):
            s_, e_ = np.sort(starts[r, ids]), np.sort(ends[r, ids])
            # the reduce-scatters issued up to the window's start (to rounding: the folded
            # runs are shifted copies) may still run in the engine: up to their end in R
            # plus the stream's delay by term 4
            before = r_e[r_s <= s_[0] + 1e-12 * max(1.0, float(s_[0]))]
            spill = float(before.max()) + lag if len(before) else 0.0
            lo.extend(np.maximum(e_, spill).tolist())
            hi.extend(s_[1:].tolist() + [starts[r, g]])
    if not lo:
        return [0.0, 0.0]
    lo_, hi_ = np.array(lo), np.array(hi)
    # the gaps of one serial stream: disjoint, in time order; the time in them up to each
    # knot is piecewise linear in time
    order = np.argsort(lo_, kind="stable")
    lo_, hi_ = lo_[order], hi_[order]
    hi_ = np.maximum(lo_, np.minimum(hi_, np.append(lo_[1:], hi_[-1])))
    knots = np.column_stack([lo_, hi_]).ravel()
    cum = np.cumsum(np.column_stack([np.zeros_like(lo_), hi_ - lo_]).ravel())
    total = float(cum[-1])
    others = [i for i in links if i not in set(alone)]
    o_s, o_e = starts[:, others].ravel(), ends[:, others].ravel()
    d_o = np.tile(np.array([dur[i] for i in others]), ends.shape[0])
    inside = np.interp(o_e, knots, cum) - np.interp(o_s, knots, cum)
    out = []
    for kk in (0, 1):
        x_o = np.tile(np.array([links[i][kk][0] for i in others]), ends.shape[0])
        moved = float((x_o / np.where(d_o > 0, d_o, 1.0)) @ inside)
        out.append(0.0 if a2a_k[kk] else max(0.0, total - moved))
    return out


def evaluate_moe(plan: MoEPlan, spec, algo: Algo, overlap_slowdown: float = 1.0,
                 repeat: int = 1) -> MoEAnalytic:
    """The closed form of the module docstring on the plan the engine replays; ``repeat``:
    count every micro-step op that many times (identical micro-steps: a plan of one
    micro-step stands for s of them, as the dense closed form does)."""
    cache = _TIMES.setdefault(spec, {}) if len(_TIMES) < 64 else {}
    comp = a2a = comm = sync_g = sync_p = opt = 0.0
    dur = [0.0] * len(plan.ops)
    links = {}                      # op id -> (intra, inter) seconds of a micro-step op
    lanes = {}                      # op id -> its lanes (_op_times) of a micro-step op
    flows = {}                      # op id -> (intra, inter) flows of a micro-step op
    for op in plan.ops:
        if isinstance(op, ComputeOp):
            dur[op.id] = op.duration_s
            if op.micro_step is None:
                opt += op.duration_s
            else:
                comp += op.duration_s
            continue
        t, x_intra, l_intra, x_inter, l_inter, lane, fl = _op_times(op, spec, algo, cache)
        dur[op.id] = t
        if op.micro_step is not None:
            links[op.id] = ((x_intra, l_intra), (x_inter, l_inter))
            lanes[op.id] = lane
            flows[op.id] = fl
        if isinstance(op, A2AOp):
            a2a += t
        elif op.purpose == "sync-grad":
            sync_g += t
        elif op.purpose == "sync-param":
            sync_p += t
        else:
            comm += t
    bound = sync_g + opt + sync_p
    # term 1: the streams' schedule
    sched, ends = _schedule(plan, dur, repeat)
    # term 2: shared links; term 3: all-to-all contention (module docstring)
    g0: dict = {}           # per micro-step: its first gradient reduce-scatter (plan order)
    for op in plan.ops:
        if op.stream == COMM_GRAD and op.micro_step is not None:
            g0.setdefault(op.micro_step, op.id)
    work = [0.0, 0.0]       # W_K: every micro-step phase on K
    idle = [0.0, 0.0]       # I_K
    c_k = {COMM_PARAM: [0.0, 0.0], COMM_GRAD: [0.0, 0.0]}   # each stream's seconds on K
    w_k = {COMM_PARAM: [0, 0], COMM_GRAD: [0, 0]}           # its most flows on a K link
    a_k = [0.0, 0.0]        # all-to-alls' seconds on K
    for i, w in links.items():
        op = plan.ops[i]
        g = g0.get(op.micro_step)
        alone = op.stream == COMM_PARAM and (g is None or i < g)
        for kk in (0, 1):
            xfer, lat = w[kk]
            work[kk] += xfer
            if isinstance(op, A2AOp):
                a_k[kk] += xfer + lat
            else:
                # the stream's transfers: its latency parts move no bytes and take nothing
                # from the all-to-alls
                c_k.setdefault(op.stream, [0.0, 0.0])[kk] += xfer
                w_k.setdefault(op.stream, [0, 0])[kk] = max(w_k[op.stream][kk], flows[i][kk])
            if alone:
                idle[kk] += max(0.0, dur[i] - xfer)
    idle = [x * repeat for x in idle]       # every micro-step's forward
    path = (comp + a2a) * repeat
    starts = ends - np.asarray(dur[:ends.shape[1]], dtype=float)
    # the all-to-alls run on their own stream: their transfers that meet the gathers alone
    # in R fill K while the gathers leave it idle
    fill = _a2a_fill(plan, links, dur, starts, ends, g0)
    # term 4: the gather and the reduce-scatter stream's own links
    tails = None
    lag = 0.0               # the reduce-scatter stream's delay (term 4)
    own_links = sched
    for stream in (COMM_PARAM, COMM_GRAD):
        ids, later = _stream_delay(plan, links, lanes, starts, ends, stream)
        if stream == COMM_GRAD and ids:
            lag = float((later - ends[-1, ids]).max())
        if ids:
            tails = tails if tails is not None else _tails(plan, dur)
            own_links = max(own_links, max(e + tails[i] for i, e in zip(ids, later.tolist(),
                                                                        strict=True)))
    gaps = _gather_gaps(plan, links, dur, starts, ends, g0, lag)
    # S_K: a previous micro-step's reduce-scatters fill K while the gathers leave it idle
    spill = _a2a_fill(plan, links, dur, starts, ends, g0, COMM_GRAD)
    links_t = max(w * repeat + max(0.0, x - f - sp) + gp
                  for w, x, f, sp, gp in zip(work, idle, fill, spill, gaps, strict=True)) + bound
    shared = met = 0.0
    # the all-to-alls' most flows from one GPU on a link of each class
    w_a = [max((flows[i][kk] for i in links if isinstance(plan.ops[i], A2AOp)), default=0)
           for kk in (0, 1)]
    # the share of the all-to-alls' growth on K that lengthens them: each of their phases
    # on K grows by the streams' spread density there (their transfers on K per second of
    # the path), through the all-to-all's lanes (a pipelined kernel's lane with slack
    # absorbs its share, as in term 4)
    rho = [sum(c[kk] for c in c_k.values()) * repeat / path if path > 0 else 0.0
           for kk in (0, 1)]
    eff = [1.0, 1.0]
    for kk in (0, 1):
        if rho[kk] <= 0:
            continue
        unit = [rho[kk] if j == kk else 0.0 for j in (0, 1)]
        got: dict = {}              # by program: the all-to-alls repeat a few programs
        naive = lengthen = 0.0
        for i in links:
            if isinstance(plan.ops[i], A2AOp):
                key = id(lanes[i][0])
                if key not in got:
                    got[key] = (_grown(lanes[i], unit) / rho[kk],
                                sum(x for _t, x, k in lanes[i][1] if k == kk))
                lengthen += got[key][0]
                naive += got[key][1]
        if naive > 0:
            eff[kk] = lengthen / naive
    for stream, cs in c_k.items():
        cap = a2a_share(plan, links, flows, starts, ends, stream, w_k[stream])
        # the spread estimate where the stream keeps less than half of K beside an
        # all-to-all: the flows beside its own on a GPU's K link (the all-to-alls' and the
        # other collective stream's there) outnumber them
        w_b = [wa + sum(w_k[o][kk] for o in w_k if o != stream and c_k[o][kk] > 0)
               for kk, wa in enumerate(w_a)]
        shared += sum(min(c * a * repeat * repeat / path, m) * e if path > 0 and wb > w
                      else 0.0 for c, a, m, wb, w, e in zip(cs, a_k, cap, w_b, w_k[stream],
                                                            eff, strict=True))
        # through the all-to-alls' lanes by the same share
        met += sum(o * e for o, e in zip(a2a_met(plan, links, lanes, flows, starts, ends,
                                                  stream), eff, strict=True))
    # term 5: the all-to-alls' windows, each grown by term 3 or by its link's work
    contention = sched + max(shared, met, a2a_windows(plan, links, flows, dur, starts, ends,
                                                       c_k, w_k, comp + a2a))
    step = max(sched, links_t, contention, own_links)
    comp, a2a, comm = comp * repeat, a2a * repeat, comm * repeat
    if overlap_slowdown != 1.0:
        step = max(step, a2a + overlapped_time(comp, max(0.0, comm - a2a), overlap_slowdown)
                   + bound)
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

