"""The simpy replay: lanes of ops over the flow-level network.

Both a lowered collective (:class:`~parosim.collectives.types.Program`, phases on lanes) and a
training step (a Plan, ops on streams) have the same semantics: a lane runs its items one at a
time in list order; an item starts when the previous item of its lane and all its deps have
finished. :func:`run_lanes` implements exactly that with one simpy process per lane, and
detects deadlock (items left, no event pending) naming the items that wait and on what.

Observation is injected: ``on_record(Record)`` receives one typed record per finished item
(default: nothing).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from heapq import heappop
from typing import TYPE_CHECKING

import simpy

from ..spec.system import CollectiveTuning
from .network import MAX_PS, PS, Network, horizon_error, to_ps

NO_OVERHEAD = CollectiveTuning()  # wire costs only

if TYPE_CHECKING:  # the collectives package imports this module
    from ..collectives.types import Phase, Program

# the largest Plan the engine replays (ops; docs/limits.md): past it a step is refused before
# it is built, with the knob that brings it back under
MAX_ENGINE_OPS = 500_000


class DeadlockError(RuntimeError):
    """Work left but no event pending: the message names the blocked items."""


class CountingEnvironment(simpy.Environment):
    """A simpy Environment that counts scheduled events (for benchmarks).

    simpy numbers every scheduled event from 0 (``_eid``, its queue's tie-breaker): the
    count is that counter's next value, read and put back, so scheduling costs no extra call
    (tests/test_engine.py checks it against a count of ``schedule`` calls)."""

    @property
    def events(self) -> int:
        n = next(self._eid)
        self._eid = itertools.count(n)   # put back: the next event still gets number n
        return n

    def run(self, until=None):
        """``simpy.Environment.run``; without ``until``, its loop of :meth:`step` inlined
        (the same events processed in the same order, one call less per event)."""
        if until is not None:
            return super().run(until)
        queue = self._queue
        while queue:
            self._now, _, _, event = heappop(queue)
            callbacks, event.callbacks = event.callbacks, None
            for callback in callbacks:
                callback(event)
            if not event._ok and not hasattr(event, "_defused"):
                exc = type(event._value)(*event._value.args)   # as Environment.step
                exc.__cause__ = event._value
                raise exc
        return None


@dataclass(frozen=True)
class Record:
    """One finished item: ``lane`` (stream), ``name``, start and end in seconds."""

    lane: str
    name: str
    start_s: float
    end_s: float
    kind: str = ""


class OverlapGate:
    """The overlap interference state of one compute stream: how many collectives are in
    flight (:meth:`flip` on each start and end) and the compute ops running now, which are
    woken to re-decide their rate when that count goes from 0 to 1 or back (docs/runtimes.md).
    """

    def __init__(self, env: simpy.Environment, slowdown: float):
        self.env, self.slowdown = env, slowdown
        self.in_flight = [0]
        self.wake: list = []

    def flip(self, delta: int) -> None:
        was = self.in_flight[0] > 0
        self.in_flight[0] += delta
        if self.slowdown != 1.0 and was != (self.in_flight[0] > 0):
            for ev in self.wake:
                if not ev.triggered:
                    ev.succeed()

    def compute(self, work: int):
        """``work`` ps of compute at full speed, slowed while a collective is in flight."""
        return fluid_compute(self.env, work, self.slowdown, self.in_flight, self.wake)


def fluid_compute(env: simpy.Environment, work: int, slowdown: float, in_flight: list,
                  wake: list):
    """Run ``work`` picoseconds of compute (at full speed) at 1/``slowdown`` of its speed while
    ``in_flight[0]`` is true (a collective overlaps it), re-deciding the rate whenever one of
    the events appended to ``wake`` fires (a collective started or ended). The overlap
    interference model of docs/runtimes.md, exact per overlapped interval."""
    left = float(work)
    while left > 0:
        f = slowdown if in_flight[0] else 1.0
        if not left * f <= MAX_PS:
            raise horizon_error(left * f / PS)
        dt = int(round(left * f))
        if dt <= 0:
            break
        change = env.event()
        wake.append(change)
        t0 = env.now
        timer = env.timeout(dt)
        yield timer | change
        wake.remove(change)
        if timer.processed or env.now - t0 >= dt:
            break
        left -= (env.now - t0) / f


def run_lanes(env: simpy.Environment, items: Sequence, lane_of: Callable[[int], str],
              deps_of: Callable[[int], Sequence[int]], name_of: Callable[[int], str],
              run_item: Callable[[int], object],
              on_record: Callable[[Record], None] | None = None,
              kind_of: Callable[[int], str] | None = None) -> list[simpy.Event]:
    """Start one process per lane; return the per-item done events.

    ``run_item(i)`` returns a generator (a simpy sub-process body) that performs item i.
    """
    done = [env.event() for _ in items]
    lanes: dict[str, list[int]] = {}
    for i in range(len(items)):
        lanes.setdefault(lane_of(i), []).append(i)

    def lane_proc(idx: list[int]):
        for i in idx:
            deps = [done[d] for d in deps_of(i)]
            if deps:
                yield env.all_of(deps)
            start = env.now
            yield from run_item(i)
            if on_record is not None:
                on_record(Record(lane_of(i), name_of(i), start / PS, env.now / PS,
                                 kind_of(i) if kind_of else ""))
            done[i].succeed()

    for idx in lanes.values():
        env.process(lane_proc(idx))
    return done


def check_finished(done: list[simpy.Event], name_of: Callable[[int], str],
                   deps_of: Callable[[int], Sequence[int]], lane_of: Callable[[int], str],
                   env: simpy.Environment) -> None:
    """Raise :class:`DeadlockError` if anything is left once no event is pending."""
    left = [i for i, ev in enumerate(done) if not ev.triggered]
    if not left:
        return
    first = left[0]
    waits = [name_of(d) for d in deps_of(first) if not done[d].triggered]
    why = f"waits for {', '.join(waits[:3])}" if waits else "its lane is blocked"
    raise DeadlockError(
        f"deadlock at t = {env.now / PS:.9f} s: {len(left)} item(s) never ran; first is "
        f"{name_of(first)!r} on lane {lane_of(first)!r}, which {why}")


def run_phase(env: simpy.Environment, net: Network, phase: Phase, tuning: CollectiveTuning,
              owner: int | None = None):
    """Body of one phase: bandwidth part on the network, then the ring's step latencies and
    the phase's launch overhead. ``owner``: the plan op it belongs to (link attribution).
    A phase's flow set, wire bytes, rate cap and latency are worked out once per network
    (``Network.phase_consts``: the same figures, as layers repeat their collectives)."""
    if phase.steps == 0:
        return
    key = (id(phase), id(tuning))
    c = net.phase_consts.get(key)
    if c is None:
        fs = net.flowset(phase.ringset)
        # a protocol moves bytes / bw_eff on the wire, its data rate capped at cap_Bps
        c = net.phase_consts[key] = [fs, phase.bytes_per_rank / phase.bw_eff,
                                     phase.cap_Bps / phase.bw_eff, None, phase, tuning]
    yield net.transfer(c[0], c[1], c[2], owner)
    latency = c[3]
    if latency is None:   # after the first transfer, where it was computed before
        latency = c[3] = to_ps(phase.steps * (c[0].alpha_s + tuning.step_latency_s)
                               + tuning.phase_overhead_s + phase.fixed_s)
    if tuning.serial_progress:  # one progress thread per rank: latency parts queue (FIFO)
        with net.progress.request() as req:
            yield req
            yield env.timeout(latency)
    else:
        yield env.timeout(latency)


def run_program(env: simpy.Environment, net: Network, program: Program,
                tuning: CollectiveTuning = NO_OVERHEAD,
                on_record: Callable[[Record], None] | None = None, prefix: str = "",
                owner: int | None = None):
    """A simpy process body running one lowered collective (call overhead first);
    ``owner``: the plan op it runs (its transfers carry it, :meth:`Network.hot_links`)."""
    if tuning.call_overhead_s:
        yield env.timeout(to_ps(tuning.call_overhead_s))
    ph = program.phases
    if on_record is None:
        done = _run_phases(env, net, program, tuning, owner)
    else:
        done = run_lanes(env, ph, lambda i: prefix + ph[i].lane, lambda i: ph[i].deps,
                         lambda i: prefix + ph[i].name,
                         lambda i: run_phase(env, net, ph[i], tuning, owner), on_record)
    if done:
        yield env.all_of(done)


def _run_phases(env: simpy.Environment, net: Network, program: Program,
                tuning: CollectiveTuning, owner: int | None) -> list[simpy.Event]:
    """:func:`run_lanes` of a program's phases without records: the same processes, started
    in the same order, waiting on the same events, with the lanes grouped once per program
    (``Network.program_lanes``) instead of once per call."""
    ph = program.phases
    lanes = net.program_lanes.get(id(program))
    if lanes is None or lanes[0] is not program:
        groups: dict[str, list[int]] = {}
        for i, p in enumerate(ph):
            groups.setdefault(p.lane, []).append(i)
        lanes = net.program_lanes[id(program)] = (program, list(groups.values()),
                                                  [tuple(p.deps) for p in ph])
    _, groups_, deps = lanes
    done = [simpy.Event(env) for _ in ph]

    def lane_proc(idx: list[int]):
        for i in idx:
            d = deps[i]
            if d:
                yield env.all_of([done[j] for j in d])
            yield from run_phase(env, net, ph[i], tuning, owner)
            done[i].succeed()

    for idx in groups_:
        env.process(lane_proc(idx))
    return done


def run_counted(env: simpy.Environment, net: Network, program: Program,
                tuning: CollectiveTuning, count: int = 1, owner: int | None = None):
    """One collective op of a Plan: its program once, or ``count`` times back to back
    (:func:`run_repeated`) for the coalesced TP collectives of 3D plans."""
    if count == 1:
        yield from run_program(env, net, program, tuning, owner=owner)
    else:
        yield from run_repeated(env, net, program, tuning, count, owner)


def run_repeated(env: simpy.Environment, net: Network, program: Program,
                 tuning: CollectiveTuning, count: int, owner: int | None = None):
    """``count`` identical collectives back to back (3D plans coalesce a chunk's TP
    collectives). A one-lane program moves count x each phase's bytes and pays count x its
    latency and overheads: in the fluid model the same time as running it count times (equal
    transfers back to back at one rate). Multi-lane programs (HO-Ring) run count times."""
    lanes = {ph.lane for ph in program.phases}
    if len(lanes) > 1:
        for _ in range(count):
            yield from run_program(env, net, program, tuning, owner=owner)
        return
    if tuning.call_overhead_s:
        yield env.timeout(to_ps(count * tuning.call_overhead_s))
    for phase in program.phases:
        if phase.steps == 0:
            continue
        fs = net.flowset(phase.ringset)
        yield net.transfer(fs, count * phase.bytes_per_rank / phase.bw_eff,
                           phase.cap_Bps / phase.bw_eff, owner)
        latency = to_ps(count * (phase.steps * (fs.alpha_s + tuning.step_latency_s)
                                 + tuning.phase_overhead_s + phase.fixed_s))
        if tuning.serial_progress:
            with net.progress.request() as req:
                yield req
                yield env.timeout(latency)
        else:
            yield env.timeout(latency)
