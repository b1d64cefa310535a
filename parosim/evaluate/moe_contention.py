"""Terms 3 and 5 of the MoE step's closed form (:mod:`parosim.evaluate.moe_step`, whose
module docstring defines them): how the all-to-alls and the collective streams delay each
other on the links they share: term 3's bound by flow share (``a2a_share``), the transfers
that meet an all-to-all's phases (``a2a_met``, ``O_jK``) and term 5's growth of the
all-to-alls' windows (``a2a_windows``)."""

from __future__ import annotations

import numpy as np

from ..collectives.cost import lane_schedule
from ..plan.builder import COMM_GRAD, COMM_PARAM, ComputeOp
from ..plan.moe_step import A2AOp, MoEPlan


def a2a_share(plan: MoEPlan, links: dict, flows: dict, starts: np.ndarray,
               ends: np.ndarray, stream: str, w_own: list[int]) -> list[float]:
    """The bound of term 3 (module docstring) for one collective stream, per link class K:
    the most its ops can delay the all-to-alls on K. The engine shares a link by weighted
    max-min fairness, a transfer counting once per flow it has there: an all-to-all with
    ``w_a`` flows on a GPU's K link beside an op of the stream with ``w`` flows keeps
    ``w_a / (w_a + w)`` of it, so each second of the all-to-all's own time on K grows by at
    most ``w / w_a`` (the stream is serial: one op, at most ``w_own[K]`` flows, at a time),
    and only while the stream has work: the all-to-alls inside one of its spans in ``R``
    (from its first op's start to its last op's end, of each micro-step of each run)."""
    ops = plan.ops
    m = ends.shape[1]
    own = [i for i in range(m) if ops[i].stream == stream]
    a2as = [i for i in range(m) if isinstance(ops[i], A2AOp)]
    cap = [0.0, 0.0]
    if not own or not a2as:
        return cap
    lo, hi = [], []
    for mb in sorted({ops[i].micro_step for i in own}):
        ids = [i for i in own if ops[i].micro_step == mb]
        lo.append(starts[:, ids].min(axis=1))
        hi.append(ends[:, ids].max(axis=1))
    lo_, hi_ = np.concatenate(lo), np.concatenate(hi)
    a_s, a_e = starts[:, a2as].ravel(), ends[:, a2as].ravel()
    meet = ((a_s[:, None] < hi_[None, :]) & (a_e[:, None] > lo_[None, :])).any(axis=1)
    for kk in (0, 1):
        if not w_own[kk]:
            continue
        per = np.array([sum(links[i][kk]) * w_own[kk] / flows[i][kk] if flows[i][kk]
                        else 0.0 for i in a2as])
        cap[kk] = float(np.tile(per, ends.shape[0]) @ meet)
    return cap


def a2a_met(plan: MoEPlan, links: dict, lanes: dict, flows: dict, starts: np.ndarray,
             ends: np.ndarray, stream: str) -> list[float]:
    """``O_jK`` of term 3 (module docstring) for one collective stream j, per link class K:
    the stream's transfers on K that run beside an all-to-all's phases on K in ``R``, each
    phase's share capped by the stream's flows there. Each all-to-all (every micro-step of
    every run) runs its lowered phases by its lanes from its start in ``R``
    (:func:`~parosim.collectives.cost.lane_schedule`: a hierarchical program's RDMA and
    NVLink stages, a DeepEP kernel's); for each of its phases p on K and the stream's ops o
    it overlaps in ``R``: o's transfer on K spread over its time, counted over the overlap,
    at most ``w_o / w_p`` x p's transfer over the same overlap (spread over p's time): the
    engine's weighted max-min leaves p ``w_p / (w_p + w_o)`` of the link, so each second of
    its transfer meets at most ``w_o / w_p`` seconds of o's (``w``: the most flows from one
    GPU on a link of class K, :func:`_op_times`). The stream is serial: its ops are disjoint,
    and its transfer and flow-weighted time up to any time are piecewise linear in it (per
    stream, not per op: a phase that overlaps two of its ops takes the smaller of the two
    sums)."""
    ops = plan.ops
    m = ends.shape[1]
    own = [i for i in range(m) if ops[i].stream == stream and i in links]
    a2as = [i for i in range(m) if isinstance(ops[i], A2AOp) and i in links]
    out = [0.0, 0.0]
    if not own or not a2as:
        return out
    runs = ends.shape[0]
    o_s, o_e = starts[:, own].ravel(), ends[:, own].ravel()
    order = np.argsort(o_s, kind="stable")
    o_s, o_e = o_s[order], o_e[order]
    o_e = np.maximum(o_s, np.minimum(o_e, np.append(o_s[1:], o_e[-1])))   # to rounding
    knots = np.column_stack([o_s, o_e]).ravel()
    # each all-to-all's phases: (offset of start, of end, transfer s, flows, link class)
    phases: dict = {}
    for i in a2as:
        prog, rows, per = lanes[i]
        if id(prog) not in phases:
            sched = lane_schedule(prog, [t for t, _, _ in rows])
            phases[id(prog)] = [(b, e, x, w, k) for (b, e), (_t, x, k), w
                                in zip(sched, rows, per, strict=True) if x > 0 and w]
    for kk in (0, 1):
        x_o = np.tile(np.array([links[i][kk][0] for i in own]), runs)[order]
        w_o = np.tile(np.array([flows[i][kk] for i in own], dtype=float), runs)[order]
        rows_k = [(i, b, e, x, w) for i in a2as for b, e, x, w, k in phases[id(lanes[i][0])]
                  if k == kk]
        if not x_o.any() or not rows_k:
            continue
        ids, off_b, off_e, x_p, w_p = (np.array(v) for v in zip(*rows_k, strict=True))
        p_s = (starts[:, ids] + off_b).ravel()
        p_e = (starts[:, ids] + off_e).ravel()
        rate = np.tile(x_p / (w_p * np.where(off_e > off_b, off_e - off_b, 1.0)), runs)
        # up to each knot: the stream's transfer on K, and its flows x seconds
        cx = np.cumsum(np.column_stack([np.zeros_like(x_o), x_o]).ravel())
        cw = np.cumsum(np.column_stack([np.zeros_like(w_o), w_o * (o_e - o_s)]).ravel())
        met = np.interp(p_e, knots, cx) - np.interp(p_s, knots, cx)
        cap = (np.interp(p_e, knots, cw) - np.interp(p_s, knots, cw)) * rate
        out[kk] = float(np.minimum(met, cap).sum())
    return out


def a2a_windows(plan: MoEPlan, links: dict, flows: dict, dur: list[float],
                 starts: np.ndarray, ends: np.ndarray, c_k: dict, w_k: dict,
                 path: float) -> float:
    """Term 5 of the module docstring: the growth of the all-to-alls' windows, summed over
    every window of every micro-step of every run. A window: one micro-step's all-to-alls
    between the embedding and the head (its forward, or its backward), from the first one's
    start to the last one's end in ``R``. Each grows by the larger of term 3 restricted to
    its all-to-alls (each collective stream's share ``c_jK a_wK / P``, at most the flow
    shares of the window's all-to-alls inside the stream's span of that micro-step) and
    the work its link class must do in it beyond its length: every op's transfers on K by
    the share of its time inside, and the time K idles while the gathers that transfer on
    K run their other phases, where the gathers fall behind the compute (``paced``; not in
    a backward with reduce-scatters, which fill it)."""
    ops = plan.ops
    m = ends.shape[1]
    windows: list[list[int]] = []
    cur: list[int] = []
    for op in ops[:m]:
        if isinstance(op, A2AOp):
            cur.append(op.id)
        elif isinstance(op, ComputeOp) and op.layer is None and cur:
            windows.append(cur)
            cur = []
    if cur:
        windows.append(cur)
    if not windows:
        return 0.0
    # a micro-step's first window is its forward, the next its backward
    seen: set = set()
    later = set()
    for w in windows:
        mb = ops[w[0]].micro_step
        if mb in seen:
            later.add(w[0])
        seen.add(mb)
    ids = list(links)
    x = np.array([links[i] for i in ids])[:, :, 0]          # transfers on K
    stream_of = [ops[i].stream for i in ids]
    gat = np.array([st == COMM_PARAM for st in stream_of])
    # the gathers that transfer on K: K idles while they run their other phases
    d_ids = np.array([dur[i] for i in ids])
    idle = np.where(gat[:, None] & (x > 0), np.clip(d_ids[:, None] - x, 0.0, None), 0.0)
    grads = COMM_GRAD in stream_of
    # the gathers fall behind the compute only on the link class that carries most of their
    # transfers, and only where an all-to-all has more flows on a GPU's link of that class
    # than a gather (weighted max-min: the gather keeps the smaller share)
    gx = x[gat].sum(axis=0)
    paced = [gx[kk] > 0 and gx[kk] >= gx[1 - kk] and max(flows[i][kk] for w in windows
                                                         for i in w) > w_k[COMM_PARAM][kk]
             for kk in (0, 1)]
    on_k = [any(links[i][kk][0] > 0 for w in windows for i in w) for kk in (0, 1)]
    # each collective stream's ops by micro-step (its span in R, per run)
    spans: dict = {stream: {} for stream in c_k}
    for op in ops[:m]:
        if op.stream in spans:
            spans[op.stream].setdefault(op.micro_step, []).append(op.id)
    spans = {st: {mb: np.array(v) for mb, v in by.items()} for st, by in spans.items()}
    # per window and link class: each all-to-all's seconds on K, and the most one stream's
    # op can delay it (term 3's flow share), fixed over the runs
    caps = []
    for w in windows:
        per = {}
        for kk in (0, 1):
            sec = np.array([sum(links[i][kk]) for i in w])
            fl = np.array([flows[i][kk] for i in w], dtype=float)
            share = np.divide(sec, fl, out=np.zeros_like(sec), where=fl > 0)
            per[kk] = (float(sec.sum()), share)
        caps.append(per)
    # every op of every run: a previous micro-step's ops may run into a window
    runs = ends.shape[0]
    s_, e_ = starts[:, ids].ravel(), ends[:, ids].ravel()
    d_ = np.where(e_ > s_, e_ - s_, 1.0)
    x, idle = np.tile(x, (runs, 1)), np.tile(idle, (runs, 1))
    total = 0.0
    arrays = [np.array(w) for w in windows]
    for r in range(runs):
        for w, wa, per in zip(windows, arrays, caps, strict=True):
            w_s, w_e = starts[r, wa], ends[r, wa]
            lo, hi = float(w_s.min()), float(w_e.max())
            inside = np.clip(np.minimum(e_, hi) - np.maximum(s_, lo), 0.0, None) / d_
            backward = w[0] in later
            g3 = 0.0
            for stream, cs in c_k.items():
                own = spans[stream].get(ops[w[0]].micro_step)
                if own is None or path <= 0:
                    continue
                meet = (w_s < ends[r, own].max()) & (w_e > starts[r, own].min())
                for kk in (0, 1):
                    if w_k[stream][kk]:
                        a_w, share = per[kk]
                        g3 += min(cs[kk] * a_w / path, w_k[stream][kk] * float(share @ meet))
            grow = g3
            for kk in (0, 1):
                if on_k[kk]:
                    work = float(inside @ x[:, kk])
                    if not (grads and backward) and paced[kk]:
                        work += float(inside @ idle[:, kk])
                    grow = max(grow, work - (hi - lo))
            total += grow
    return total
