"""Identical micro-steps replayed once: the engine's exact shortcut for gradient accumulation.

A data-parallel step repeats s micro-steps of the same ops. Once the replay reaches a steady
state, micro-step m + 1 runs exactly as micro-step m, shifted by a period of Δ picoseconds
and P ops. :func:`parosim.evaluate.replay.replay` then replays a plan with the middle
micro-steps 2 .. s - 2 cut out (three micro-steps and the accumulation boundary) and
inserts the cut periods into what that replay recorded. Nothing is approximated: the
shortcut is taken only when it is proved, and the replay runs in full otherwise.

The proof. The replay is deterministic and invariant under a shift of time (every rate,
completion and latency depends on time differences only; times are integers). Let T_m be
the instant at which micro-step m's first op starts, and take the state of the simulation at
the end of that instant (every event of the instant processed): the simpy queue (each
pending timer's time, priority and tie-break order, and what it resumes), every live process
(where its generator stands, at which op or phase, since when), the order of the waiters on
every pending completion, and the network's transfers (flow set, bytes, rate, cap, op) and
clock. :func:`fingerprint` writes that state with op indices relative to the micro-step's
first op and times relative to T_m; an object it does not know makes the shortcut refuse.
If the fingerprints at T_1 and T_2 are equal, and the ops the replay looked at between them
are the same (:func:`canon`: stream, duration or lowered program, deps relative) in every
later period and at the same place of the full plan, then by induction the full replay
between T_m and T_m+1 is the one between T_1 and T_2 shifted by (m - 1)(Δ, P), and from
T_s-1 on it is the shortened replay's rest shifted by (s - 3)(Δ, P). Integer sums (busy time,
link busy time per rate regime, the event count) scale exactly; per-link bytes and the
critical-path credit are summed by the same code over the same reconstructed terms in the
same order, so every output is bit-identical to the full replay (tests/test_periodic.py
compares them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from heapq import heappop
from typing import Any

import simpy

from ..fabric.engine import CountingEnvironment
from ..fabric.network import Network
from ..plan.builder import ComputeOp


class Unproved(Exception):
    """The shortcut cannot show that it is exact here: replay in full."""


def micro_layout(ops: Sequence) -> tuple[list[int], int] | None:
    """(first op index of each micro-step, ops per micro-step P) when micro-steps 0 .. s - 1
    are contiguous blocks, those from 1 on of equal length P, and s >= 4; else None."""
    first: list[int] = []
    for i, op in enumerate(ops):
        m = op.micro_step
        if m is None:
            continue
        if m == len(first):
            first.append(i)
        elif m != len(first) - 1:
            return None
    s = len(first)
    if s < 4:
        return None
    ends = first[1:] + [max(i for i, op in enumerate(ops) if op.micro_step == s - 1) + 1]
    for m in range(s):
        if any(ops[i].micro_step != m for i in range(first[m], ends[m])):
            return None
    p = first[2] - first[1]
    if any(ends[m] - first[m] != p for m in range(1, s)):
        return None
    return first, p


def shortened(ops: Sequence, first: list[int], p: int, keep: int) -> list:
    """The plan's ops with micro-steps ``keep`` .. s - 2 cut out (J = s - 1 - keep
    periods): ops before micro-step ``keep`` as they are, the rest renumbered down by J·P
    with their deps."""
    cut = first[keep]
    jp = (len(first) - 1 - keep) * p
    out = list(ops[:cut])
    for op in ops[cut + jp:]:
        deps = tuple(d - jp for d in op.deps)
        if any(d < 0 for d in deps):
            raise Unproved("a dep reaches before the plan")
        out.append(dataclasses.replace(op, id=op.id - jp, deps=deps))
    return out


def canon(op, shift: int, program) -> tuple:
    """What the replay reads of an op, deps relative to ``shift``."""
    deps = tuple(d - shift for d in op.deps)
    if isinstance(op, ComputeOp):
        return ("compute", op.stream, op.duration_s, deps)
    return ("collective", op.stream, id(program), getattr(op, "count", 1), deps)


class ProbedEnvironment(CountingEnvironment):
    """The counting environment that keeps every process it starts (``probe``) and can stop
    at the end of chosen instants (:meth:`run_cuts`)."""

    def __init__(self) -> None:
        super().__init__()
        self.probe = Probe()

    def process(self, generator) -> simpy.Process:  # what simpy's BoundClass does, kept
        proc = simpy.Process(self, generator)
        self.probe.procs.append(proc)
        return proc

    def run_cuts(self, pending: list, at_cut) -> None:
        """:meth:`run`, calling ``at_cut()`` at the end of each instant (all its events
        processed) during which something was appended to ``pending``."""
        queue = self._queue
        while queue:
            if pending and queue[0][0] > self._now:
                at_cut()
                continue
            self._now, _, _, event = heappop(queue)
            callbacks, event.callbacks = event.callbacks, None
            for callback in callbacks:
                callback(event)
            if not event._ok and not hasattr(event, "_defused"):
                exc = type(event._value)(*event._value.args)   # as Environment.step
                exc.__cause__ = event._value
                raise exc
        while pending:
            at_cut()


class Probe:
    """What :func:`fingerprint` needs to see: every process the replay starts, the plan's
    per-op done events and the lanes' op lists (set by the replay)."""

    def __init__(self) -> None:
        self.procs: list[simpy.Process] = []
        self.done: list[simpy.Event] = []
        self.ops: list = []
        self.tail = 0    # the first accumulation-boundary op (after the last micro-step)


PLAN_LANE = "run_lanes.<locals>.lane_proc"
_BODY = "_simulate.<locals>.body"
_COMPUTE = "_simulate.<locals>.compute"
_COUNTED = "run_counted"
_PROGRAM = "run_program"
_PHASE_LANE = "_run_phases.<locals>.lane_proc"
_PHASE = "run_phase"


def frames_of(proc: simpy.Process):
    gen = proc._generator
    while gen is not None:
        fr = gen.gi_frame
        if fr is None:
            return
        yield fr
        gen = gen.gi_yieldfrom


def fingerprint(env, net: Network, probe: Probe, base: int, hi: int) -> tuple:
    """The simulation's state at the end of the current instant, op indices relative to
    ``base`` and times to now (module docstring). Raises :class:`Unproved` on anything it
    does not know.

    A lane parked before an accumulation-boundary op (its deps not all done) is written
    relative to the boundary (``probe.tail``), and so are the pending ops only it waits
    for, which must lie at or past ``hi`` (the ops reached so far): in every period such
    a lane waits on the same op and nothing it waits for happens."""
    now = env._now
    if net._pending or net._update_scheduled:
        raise Unproved("network update pending")
    tail = probe.tail
    parked: set[int] = set()

    def rel(i):
        return None if i is None else i - base

    alive = [p for p in probe.procs if p.is_alive]
    descs = []
    for p in alive:
        d: list[Any] = []
        for fr in frames_of(p):
            name, loc = fr.f_code.co_qualname, fr.f_locals
            if name == PLAN_LANE:
                i = loc["i"]
                if i >= tail and "start" not in loc:
                    parked.add(id(p))
                    d.append((name, fr.f_lasti, probe.ops[loc["idx"][0]].stream,
                              "parked", i - tail))
                else:
                    d.append((name, fr.f_lasti, probe.ops[loc["idx"][0]].stream, rel(i),
                              loc["start"] - now if "start" in loc else None))
            elif name == _BODY:
                d.append((name, fr.f_lasti, rel(loc["i"])))
            elif name == _COMPUTE:
                d.append((name, fr.f_lasti, loc["work"], loc["start"] - now))
            elif name in (_COUNTED, _PROGRAM):
                d.append((name, fr.f_lasti, rel(loc["owner"]), id(loc["program"])))
            elif name == _PHASE_LANE:
                d.append((name, fr.f_lasti, rel(loc["owner"]), loc["i"]))
            elif name == _PHASE:
                d.append((name, fr.f_lasti, rel(loc["owner"]), id(loc["phase"])))
            else:
                raise Unproved(f"unknown frame {name}")
        descs.append(tuple(d))
    order = sorted(range(len(alive)), key=lambda k: repr(descs[k]))
    if len({repr(descs[k]) for k in order}) != len(order):
        raise Unproved("two processes look alike")
    rank = {id(alive[k]): n for n, k in enumerate(order)}

    def waiter(cb) -> Any:
        """Who a callback resumes: a process (its rank) or a condition's waiter."""
        owner = getattr(cb, "__self__", None)
        if isinstance(owner, simpy.Process) and id(owner) in rank:
            return ("p", rank[id(owner)])
        if isinstance(owner, simpy.events.Condition):
            return ("c", getattr(cb, "__name__", ""), owner._count, len(owner._events),
                    tuple(("own", c.__name__) if getattr(c, "__self__", None) is owner
                          else waiter(c) for c in (owner.callbacks or ())))
        raise Unproved("unknown callback")

    queue = []
    for t, prio, _eid, ev in sorted(env._queue):
        cbs = ev.callbacks or ()
        if len(cbs) == 1 and getattr(cbs[0], "__func__", None) is Network._wake \
                and getattr(cbs[0], "__self__", None) is net:
            if ev.gen != net._gen:
                continue   # a superseded rate timer: it changes nothing when it fires
            queue.append((t - now, prio, "rate"))
        elif isinstance(ev, simpy.events.Timeout):
            queue.append((t - now, prio, tuple(waiter(c) for c in ev.callbacks)))
        else:
            raise Unproved("unknown event in the queue")
    transfers = tuple((t.key, t.total, t.remaining, t.rate, rel(t.owner),
                       tuple(waiter(c) for c in t.event.callbacks)) for t in net._active)
    # waiters on pending plan ops (their order decides who resumes first)
    parked_ranks = {rank[k] for k in parked}

    def only_parked(w) -> bool:
        return w[0] == "c" and all(x[0] == "own" or (x[0] == "p" and x[1] in parked_ranks)
                                   for x in w[4])

    waits = []
    for i, ev in enumerate(probe.done):
        if not ev.triggered and ev.callbacks:
            ws = tuple(waiter(c) for c in ev.callbacks)
            if ws and all(only_parked(w) for w in ws):
                if i < hi:
                    raise Unproved("a parked lane waits for an op the period reaches")
                waits.append(("parked", i - tail, ws))
            else:
                waits.append((i - base, ws))
    # every process's target: what it waits on, and that target's other waiters
    targets = []
    for k in order:
        tgt = alive[k]._target
        targets.append(tuple(waiter(c) for c in (tgt.callbacks or ())) if tgt is not None
                       else None)
    phase_waits = []
    for k in order:
        for fr in frames_of(alive[k]):
            if fr.f_code.co_qualname == _PROGRAM and "done" in fr.f_locals:
                phase_waits.append((k, tuple(
                    (ev.triggered, tuple(waiter(c) for c in (ev.callbacks or ())))
                    for ev in fr.f_locals["done"])))
    # the network's clock matters only while something moves (an idle network's last
    # update time is never read)
    return (tuple(descs[k] for k in order), tuple(queue), transfers,
            now - net._last if net._active else None, tuple(waits), tuple(targets),
            tuple(phase_waits))
