"""Flow-level network on a cluster graph, driven by simpy.

Model
-----
* A *transfer* moves ``nbytes`` along every hop of a :class:`~parosim.collectives.types.RingSet`
  (one flow per hop) at one common rate: a pipelined ring advances at its slowest hop, and a
  collective phase ends with its slowest ring, so the flows of a phase are coupled.
* Each flow follows a path on the graph (:class:`~parosim.fabric.routing.Router`, networkx
  shortest path in hops; a GPU is never a transit node, except that a GPU whose NIC is down
  sends and receives through a peer GPU of its node over NVLink, as NCCL's PXN does; with the
  builders of :mod:`parosim.fabric.topology` the path between two GPUs is unique, so the
  choice is deterministic).
* Concurrent transfers share each directed link by weighted max-min fairness (progressive
  filling): a transfer with c flows on a link of capacity C counts c times there.
  Rates are recomputed when a transfer starts or ends (once per simulated instant, however
  many start or end at it).
* Time is an integer number of picoseconds (``PS``), so equal times compare exactly and event
  order is deterministic; completions are rounded up to the next picosecond.

Symmetry (why 4,096 GPUs cost no more than 8)
---------------------------------------------
Scopes (global ring, intra rings, inter rings) are invariant under translating every rank by
``period_nodes`` nodes, and so is a homogeneous cluster graph. With ``period_nodes`` = T < nodes,
only the flows whose source lies in the first T nodes are routed; each link is replaced by the
representative of its orbit under translation, and the per-link load on an orbit of size |o| is
(nodes/T) x (fundamental count) / |o|. Max-min rates on the reduced problem equal those on the
full one because every transfer and the graph share the symmetry. Transfers that are not
invariant (user scenarios) need ``period_nodes = nodes`` (no reduction, the default).
The graph's invariance is not assumed:
:func:`parosim.fabric.symmetry.verified_period` checks it edge
by edge and falls back to the smallest multiple of the asked period under which it holds (the
node count: no reduction), so an override (a slow NIC on node 3) is never folded away.
A homogeneous cluster's graph may be a :class:`parosim.fabric.folded.FoldedGraph` (built where
it is looked up, its symmetry proved on what is built); the network then looks vertices up
and never iterates the graph.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from heapq import heappush
from typing import TYPE_CHECKING

import numpy as np
import simpy

from ..errors import InputError
from ..spec.system import NetworkFabric
from .routing import Router
from .symmetry import verified_period

if TYPE_CHECKING:  # the collectives package imports this module
    import networkx as nx

    from ..collectives.types import RingSet

PS = 10**12  # simulated time unit: picoseconds per second


# The simulated clock is an int64-safe count of picoseconds: 1e6 s (11.6 days) at most, per
# step or collective (docs/limits.md). Inputs that would need more are refused with one line.
MAX_SIM_SECONDS = 1e6
MAX_PS = int(MAX_SIM_SECONDS * PS)


def horizon_error(seconds: float) -> InputError:
    return InputError(f"a simulated duration of {seconds:.3g} s exceeds the simulator's range "
                      f"of {MAX_SIM_SECONDS:.0e} s per step or collective; expected inputs "
                      "giving a shorter run (check the sizes, bandwidths, --efficiency, "
                      "--overlap-slowdown, --accum)")


def to_ps(seconds: float) -> int:
    if not (seconds <= MAX_SIM_SECONDS):  # also NaN
        raise horizon_error(seconds)
    return int(math.ceil(seconds * PS - 1e-6))


@dataclass
class FlowSet:
    """The links a ring set loads: link indices, flows per link, and the per-step latency."""

    links: np.ndarray      # int indices into Network link arrays
    counts: np.ndarray     # flows per link (already scaled for symmetry)
    alpha_s: float         # slowest hop's path latency (seconds)
    flows: int             # flows in the whole ring set
    id: int = 0            # position in the network's flow-set table (cache keys)


@dataclass
class _Transfer:
    seq: int
    fs: FlowSet
    total: float
    remaining: float
    event: simpy.Event
    rate: float = 0.0      # bytes per picosecond per flow
    cap: float = math.inf  # most bytes per picosecond per flow
    owner: int | None = None  # the plan op it belongs to (critical-path attribution)
    key: tuple = ()        # (fs.id, cap): its part of the rate cache's key


_NO_LINKS = np.zeros(0, dtype=np.int64)


class _Late(simpy.Event):
    """An event processed after all normal events of its instant (simpy priority 2).

    ``simpy.Event.__init__`` and ``Environment.schedule`` inlined (the engine makes one per
    rate change): the same attributes, and the same queue entry (time, priority, event
    number, event)."""

    gen = 0   # the network's rate generation when a completion timer was set

    def __init__(self, env: simpy.Environment, delay: int, callback):
        self.env = env
        self.callbacks = [callback]
        self._ok = True
        self._value = None
        heappush(env._queue, (env._now + delay, 2, next(env._eid), self))


@dataclass
class LinkStats:
    """Per link class: bytes carried (each hop counted), busy time of the busiest link."""

    bytes: dict[str, float] = field(default_factory=dict)
    busy_s: dict[str, float] = field(default_factory=dict)
    links: dict[str, int] = field(default_factory=dict)
    # bytes GPUs sent: "inter" on links to a NIC, "intra" on links into the node's fabric
    gpu_egress: dict[str, float] = field(default_factory=dict)


class Network:
    """The simpy flow-level network. ``transfer(flowset, nbytes)`` returns an event that fires
    when every flow of the set has moved ``nbytes`` (latency is the caller's)."""

    def __init__(self, env: simpy.Environment, graph: nx.DiGraph, nodes: int = 0,
                 period_nodes: int | None = None, gpus_per_node: int = 0):
        self.env = env
        self.graph = graph
        self.router = Router(graph)
        self.nodes = nodes or 1
        self.gpn = gpus_per_node
        # the reduction asked for, then the one the graph allows (parosim.fabric.symmetry)
        self.requested_period = period_nodes or self.nodes
        self.period = self.requested_period
        if self.period < self.nodes:
            prove = getattr(graph, "verified_period", None)  # a FoldedGraph proves its own
            self.period = (prove(self.period) if prove else
                           verified_period(graph, self.nodes, self.gpn, self.period))
        self.scale = self.nodes // self.period
        if hasattr(graph, "rank_names"):  # a FoldedGraph: vertices named as looked up
            self._rank_name = graph.rank_names()
            self._rep = _Reps(self)
        else:
            self._rank_name = {d["rank"]: n for n, d in graph.nodes(data=True)
                               if d.get("kind") == "gpu"}
            self._rep = self._representatives()
        self._link_idx: dict[tuple[str, str], int] = {}
        self._cap: list[float] = []
        self._cap_arr = np.zeros(0)  # self._cap as an array (rebuilt when a link is added)
        self._class: list[str] = []
        self._orbit: list[int] = []
        self._egress: list[str] = []  # "intra" / "inter" for links leaving a GPU, else ""
        self._flowsets: dict[RingSet, FlowSet] = {}
        # per phase and tuning, and per program (parosim.fabric.engine.run_phase /
        # run_program): figures worked out once; keyed by id, each entry holds its objects
        self.phase_consts: dict[tuple[int, int], list] = {}
        self.program_lanes: dict[int, tuple] = {}
        # max-min rates depend only on which flow sets are active: cache them by that multiset
        self._fill_cache: dict[tuple, tuple[list[float], np.ndarray, list[np.ndarray]]] = {}
        self._key: tuple[int, ...] = ()
        self._key_time: dict[tuple[int, ...], list] = {}  # key -> [load vector, time]
        self._active: list[_Transfer] = []
        self._pending: list[_Transfer] = []
        self._seq = 0
        self._last = 0
        self._gen = 0
        self._update_scheduled = False
        self._bytes = np.zeros(0)
        self._busy = np.zeros(0)
        self._load = np.zeros(0)
        self.updates = 0
        self._progress: simpy.Resource | None = None
        # per-link utilisation over time (record_links = True): (start ps, load vector)
        self.record_links = False
        self._segments: list[tuple[int, np.ndarray]] = []
        # from each rate change on: (start ps, owners of the active transfers, each one's
        # bottleneck links): which links set the pace of which op (:meth:`critical_link_s`)
        self._paces: list[tuple[int, tuple, list[np.ndarray]]] = []

    def reset(self, env: simpy.Environment) -> None:
        """Start again on a new environment (another repeat of a step), keeping the routes,
        flow sets and cached max-min rates, which depend only on the graph."""
        self.env = env
        self._key = ()
        self._key_time = {}
        self._active, self._pending = [], []
        self._seq = self._last = self._gen = 0
        self._update_scheduled = False
        k = len(self._cap)
        self._bytes, self._busy, self._load = np.zeros(k), np.zeros(k), np.zeros(k)
        self.updates = 0
        self._progress = None
        self._segments = []
        self._paces = []

    @property
    def progress(self) -> simpy.Resource:
        """Every rank's progress thread (``collective.serial_progress``); all ranks take part
        in every phase, so one capacity-1 resource stands for each rank's own."""
        if self._progress is None:
            self._progress = simpy.Resource(self.env, capacity=1)
        return self._progress

    # -- symmetry -------------------------------------------------------------------------
    def _leaves(self) -> tuple[set[str], int]:
        leaves = {n for n in self.graph if n.startswith("leaf")}
        return leaves, (max(1, self.nodes // len(leaves)) if leaves else 0)

    def _rep_of(self, n: str, d: dict, leaves: set[str], per_leaf: int) -> tuple[str, bool]:
        """(orbit representative, moves under translation) of vertex ``n``."""
        T = self.period
        if "node" in d:
            return (f"n{d['node'] % T}/{n.split('/', 1)[1]}", self.scale > 1)
        if n in leaves and self.scale > 1:
            return (f"leaf{int(n[4:]) % max(1, T // per_leaf)}", True)
        return (n, False)

    def _representatives(self) -> dict[str, tuple[str, bool]]:
        """node name -> (orbit representative, moves under translation)."""
        leaves, per_leaf = self._leaves()
        return {n: self._rep_of(n, d, leaves, per_leaf)
                for n, d in self.graph.nodes(data=True)}

    def _link(self, u: str, v: str) -> int:
        (ru, mu), (rv, mv) = self._rep[u], self._rep[v]
        key = (ru, rv)
        idx = self._link_idx.get(key)
        if idx is None:
            idx = len(self._cap)
            self._link_idx[key] = idx
            d = self.graph.edges[ru, rv]
            self._cap.append(d["bandwidth_Bps"] / PS)
            self._class.append(d["link_class"])
            self._orbit.append(self.scale if (mu or mv) else 1)
            kinds = self.graph.nodes[ru]["kind"], self.graph.nodes[rv]["kind"]
            self._egress.append("" if kinds[0] != "gpu" else
                                "inter" if kinds[1] == "nic" else "intra")
            grow = np.zeros(1)
            self._bytes = np.concatenate([self._bytes, grow])
            self._busy = np.concatenate([self._busy, grow])
            self._load = np.concatenate([self._load, grow])
            self._fill_cache.clear()  # cached load vectors have the old length
        return idx

    def flowset(self, ringset: RingSet) -> FlowSet:
        """Route a ring set (cached): the links its flows load and its step latency."""
        fs = self._flowsets.get(ringset)
        if fs is not None:
            return fs
        arrays = getattr(ringset, "hop_arrays", None) if self.scale > 1 else None
        if arrays is not None:
            return self._flowset_folded(ringset, *arrays)
        hops = list(ringset.hops())
        if self.scale > 1:
            shift = self.period * self.gpn
            n = self.nodes * self.gpn
            hopset = set(hops)
            if any(((a + shift) % n, (b + shift) % n) not in hopset for a, b in hops):
                raise RuntimeError(f"ring set {ringset.label!r} is not invariant under the "
                                   f"network's symmetry period of {self.period} nodes")
            limit = self.period * self.gpn
            hops = [(a, b) for a, b in hops if a < limit]
        counts, lat_of = self._route(hops)
        # per-step latency: the largest mean hop latency of a ring (over its routed hops)
        alpha = 0.0
        for ring in ringset.ring_hops():
            lats = [lat_of[h] for h in ring if h in lat_of]
            if lats:
                alpha = max(alpha, sum(lats) / len(lats))
        return self._store(ringset, counts, alpha, sum(1 for _ in ringset.hops()))

    def _route(self, hops) -> tuple[Counter, dict[tuple[int, int], float]]:
        """Flows per link of ``hops`` and each hop's path latency (slowest ECMP path)."""
        counts: Counter = Counter()
        lat_of: dict[tuple[int, int], float] = {}
        edges = self.graph.edges
        for a, b in hops:
            lat = 0.0
            for path, w in self.router.paths(self._rank_name[a], self._rank_name[b]):
                p_lat = 0.0
                for u, v in zip(path, path[1:], strict=False):
                    counts[self._link(u, v)] += w
                    p_lat += edges[u, v]["latency_s"]
                lat = max(lat, p_lat)  # ECMP alternatives: the slowest path's latency
            lat_of[a, b] = lat
        return counts, lat_of

    def _store(self, ringset, counts: Counter, alpha: float, flows: int) -> FlowSet:
        idx = np.array(sorted(counts), dtype=np.int64)
        cnt = np.array([counts[i] for i in idx], dtype=float)
        if self.scale > 1:
            cnt *= self.scale / np.array([self._orbit[i] for i in idx], dtype=float)
        fs = FlowSet(idx, cnt, alpha, flows, len(self._flowsets))
        self._flowsets[ringset] = fs
        return fs

    def _flowset_folded(self, ringset: RingSet, src: np.ndarray, dst: np.ndarray) -> FlowSet:
        """:meth:`flowset` with a symmetry reduction for rings of equal length given as
        (rings, k) arrays: the invariance check and the choice of the routed hops (those
        leaving the first ``period`` nodes) in numpy; the same hops, in the same order, are
        routed and summed as by the loop."""
        n, shift = self.nodes * self.gpn, self.period * self.gpn
        s, d = src.ravel(), dst.ravel()
        moved = ((s + shift) % n) * n + (d + shift) % n
        have = np.sort(s * n + d)
        at = np.minimum(np.searchsorted(have, moved), len(have) - 1)
        if not (have[at] == moved).all():
            raise RuntimeError(f"ring set {ringset.label!r} is not invariant under the "
                               f"network's symmetry period of {self.period} nodes")
        mine = src < shift
        flat = mine.ravel()
        counts, lat_of = self._route(zip(s[flat].tolist(), d[flat].tolist(), strict=True))
        # per-step latency: the largest mean hop latency of a ring (over its routed hops)
        alpha = 0.0
        for r in np.flatnonzero(mine.any(axis=1)).tolist():
            m = mine[r]
            lats = [lat_of[h] for h in zip(src[r][m].tolist(), dst[r][m].tolist(),
                                           strict=True)]
            alpha = max(alpha, sum(lats) / len(lats))
        return self._store(ringset, counts, alpha, int(s.size))

    # -- fluid engine ---------------------------------------------------------------------
    def transfer(self, fs: FlowSet, nbytes: float, max_rate_Bps: float = math.inf,
                 owner: int | None = None) -> simpy.Event:
        """Move ``nbytes`` on every flow of ``fs``; the event fires when all are done.
        ``max_rate_Bps`` caps each flow's rate (a protocol's throughput limit); ``owner``
        (the plan op it belongs to) attributes its bottleneck time (:meth:`hot_links`)."""
        ev = self.env.event()
        if nbytes <= 0 or len(fs.links) == 0:
            ev.succeed()
            return ev
        self._seq += 1
        cap = max_rate_Bps / PS
        self._pending.append(_Transfer(self._seq, fs, nbytes, nbytes, ev, 0.0, cap, owner,
                                       (fs.id, cap)))
        if not self._update_scheduled:   # _schedule_update(0), inlined
            self._update_scheduled = True
            _Late(self.env, 0, self._update)
        return ev

    def _schedule_update(self, delay: int) -> None:
        if delay == 0:
            if self._update_scheduled:
                return
            self._update_scheduled = True
            _Late(self.env, 0, self._update)
        else:
            if self.env.now + delay > MAX_PS:
                raise horizon_error((self.env.now + delay) / PS)
            _Late(self.env, delay, self._wake).gen = self._gen

    def _wake(self, ev: _Late) -> None:
        """A completion timer: recompute unless rates changed since it was set (``gen``)."""
        if ev.gen == self._gen and not self._update_scheduled:
            self._update(None)

    def _advance(self) -> None:
        now = self.env.now
        dt = now - self._last
        if dt > 0:
            for t in self._active:
                t.remaining -= t.rate * dt
            if self._active:  # link statistics are summed per active multiset at the end
                entry = self._key_time.get(self._key)
                if entry is None:
                    entry = self._key_time[self._key] = [self._load, 0]
                entry[1] += dt
        self._last = now

    def _update(self, _ev) -> None:
        self._update_scheduled = False
        self.updates += 1
        self._advance()
        still = []
        for t in self._active:
            if t.remaining <= t.rate * 0.5 or t.remaining <= t.total * 1e-12:
                t.event.succeed()
            else:
                still.append(t)
        active = self._active = still + self._pending
        self._pending = []
        self._gen += 1
        self._waterfill()
        if active:
            ceil = math.ceil
            nxt = min([ceil(t.remaining / t.rate) for t in active])
            self._schedule_update(max(1, nxt))

    def _waterfill(self) -> None:
        """Weighted max-min fair rates by progressive filling (cached per active multiset;
        the active list is in start order, and equal flow sets get equal rates)."""
        active = self._active
        key = tuple([t.key for t in active])
        hit = self._fill_cache.get(key)
        if hit is None:
            hit = self._fill_cache[key] = self._progressive_filling(
                [t.fs for t in active], [t.cap for t in active])
        rates, self._load, bottlenecks = hit
        self._key = key
        now = self.env._now
        if self.record_links:
            self._segments.append((now, self._load))
        self._paces.append((now, tuple([t.owner for t in active]), bottlenecks))
        for t, r in zip(active, rates, strict=True):
            t.rate = r

    def _progressive_filling(self, sets: list[FlowSet], caps: list[float] | None = None
                             ) -> tuple[list[float], np.ndarray, list[np.ndarray]]:
        """Rates, link loads and, per transfer, its bottleneck links: the saturated links
        that froze its rate (none when its own cap did)."""
        if len(self._cap_arr) != len(self._cap):  # links are only ever appended
            self._cap_arr = np.array(self._cap)
        cap = self._cap_arr.copy()
        load = np.zeros(len(cap))
        rates = [0.0] * len(sets)
        bottlenecks = [_NO_LINKS] * len(sets)
        caps = caps or [math.inf] * len(sets)
        todo = list(range(len(sets)))
        while todo:
            denom = np.zeros(len(cap))
            for i in todo:
                denom[sets[i].links] += sets[i].counts
            used = denom > 0
            share = np.full(len(cap), np.inf)
            share[used] = np.maximum(cap[used], 0.0) / denom[used]
            level = min(float(share.min()), min(caps[i] for i in todo))
            if not level > 0:
                names = [k for k, j in self._link_idx.items() if used[j] and share[j] <= 0]
                raise RuntimeError(f"no capacity left on link {names[0]} for active transfers")
            bott = share <= level * (1 + 1e-9)
            rest = []
            for i in todo:
                fs = sets[i]
                hit = bott[fs.links]
                if caps[i] <= level * (1 + 1e-9) or hit.any():
                    rates[i] = level
                    bottlenecks[i] = fs.links[hit]
                    cap[fs.links] -= fs.counts * level
                    load[fs.links] += fs.counts * level
                else:
                    rest.append(i)
            todo = rest
        return rates, load, bottlenecks

    @property
    def busy(self) -> bool:
        return bool(self._active or self._pending)

    def _fold_key_time(self) -> None:
        """Add the time spent under each active multiset to the per-link statistics."""
        for load, dt in self._key_time.values():
            n = len(load)
            self._bytes[:n] += load * dt
            self._busy[:n] += (load > 0) * dt
        self._key_time = {}

    def link_stats(self) -> LinkStats:
        """Bytes (summed over every link of a class, each hop counted) and busy seconds of the
        busiest link of each class, since the start."""
        self._advance()
        self._fold_key_time()
        st = LinkStats()
        orbit = np.array(self._orbit, dtype=float)
        for i, cls in enumerate(self._class):
            st.bytes[cls] = st.bytes.get(cls, 0.0) + self._bytes[i] * orbit[i]
            st.busy_s[cls] = max(st.busy_s.get(cls, 0.0), self._busy[i] / PS)
            if self._egress[i]:
                e = self._egress[i]
                st.gpu_egress[e] = st.gpu_egress.get(e, 0.0) + self._bytes[i] * orbit[i]
        counts = getattr(self.graph, "link_class_counts", None)  # a FoldedGraph counts
        if counts:
            st.links.update(counts())
        else:
            for _, _, cls in self.graph.edges(data="link_class"):
                st.links[cls] = st.links.get(cls, 0) + 1
        return st


    def link_names(self) -> list[str]:
        """``"u->v"`` of every registered link (orbit representatives when reduced)."""
        names = [""] * len(self._cap)
        for (u, v), i in self._link_idx.items():
            names[i] = f"{u}->{v}"
        return names

    def critical_link_s(self, critical: list[tuple[int, int, int]] | None = None
                        ) -> np.ndarray:
        """Per link: the seconds it was the bottleneck (a saturated link that set the rate)
        of a transfer on the critical path. ``critical``: (op, start ps, end ps) of the
        collectives on the step's critical path; a transfer counts while its op is inside its
        interval. None: every transfer counts all the time (one collective, several jobs). A
        link counts once per instant however many critical transfers it holds back."""
        out = np.zeros(len(self._cap))
        paces = self._paces
        if not paces:
            return out
        ends = [t for t, _, _ in paces[1:]] + [max(self.env.now, paces[-1][0])]
        spans: dict[int, list[tuple[int, int]]] = {}
        for op, a, b in critical or ():
            spans.setdefault(op, []).append((a, b))
        if critical is None:
            todo: Iterable[int] = range(len(paces))
        else:  # only the paces that overlap a critical interval can give credit (t0 < b, a < t1)
            starts = [t for t, _, _ in paces]
            hit: set[int] = set()
            for a, b in (ab for sp in spans.values() for ab in sp):
                hit.update(range(bisect.bisect_right(ends, a), bisect.bisect_left(starts, b)))
            todo = sorted(hit)
        # (pace, links, seconds) of every transfer credited; a link counts once per pace, at
        # the largest credit of that pace
        ks: list[int] = []
        ls: list[np.ndarray] = []
        ds: list[int] = []
        held = 0
        for k in todo:
            (t0, owners, bns), t1 = paces[k], ends[k]
            if t1 <= t0:
                continue
            if held > _CREDIT_BATCH:   # a batch of whole paces at a time: bounded memory
                _add_credit(out, ks, ls, ds)
                ks, ls, ds, held = [], [], [], 0
            for owner, links in zip(owners, bns, strict=True):
                if not len(links):
                    continue
                if critical is None:
                    dt = t1 - t0
                else:
                    sp = spans.get(owner)
                    if sp is None:  # not on the critical path: no credit
                        continue
                    dt = max((min(t1, b) - max(t0, a) for a, b in sp), default=0)
                if dt > 0:
                    ks.append(k)
                    ls.append(links)
                    ds.append(dt)
                    held += len(links)
        _add_credit(out, ks, ls, ds)
        return out / PS

    def hot_links(self, span_s: float, top: int = 5,
                  critical: list[tuple[int, int, int]] | None = None) -> list[dict]:
        """The ``top`` links that set the step time: by ``critical_s`` (seconds the link was
        the bottleneck of a transfer on the critical path, :meth:`critical_link_s`), then by
        utilisation. Each: ``link`` ("u->v"; with a symmetry reduction the representative of
        an orbit of ``orbit`` equal links), ``link_class``, ``capacity_GBps``, ``bytes``,
        ``busy_s`` (time with any traffic), ``critical_s`` and ``utilization`` (bytes /
        (capacity x ``span_s``), in [0, 1])."""
        self._advance()
        self._fold_key_time()
        names = self.link_names()
        crit = self.critical_link_s(critical)
        util = [self._bytes[i] / self._cap[i] for i in range(len(names))]
        order = sorted(range(len(names)), key=lambda i: (-crit[i], -util[i], names[i]))[:top]
        out = []
        for i in order:
            if self._bytes[i] <= 0:
                break
            cap = self._cap[i] * PS
            out.append({"link": names[i], "link_class": self._class[i],
                        "orbit": self._orbit[i], "capacity_GBps": cap / 1e9,
                        "bytes": float(self._bytes[i]), "busy_s": float(self._busy[i] / PS),
                        "critical_s": float(crit[i]),
                        "utilization": float(self._bytes[i] / (cap * span_s))
                        if span_s > 0 else 0.0})
        return out

    def link_timeline(self, links: list[str] | None = None) -> list[tuple[float, dict]]:
        """With ``record_links``: (time in s, {link: utilisation in [0, 1]}) at every rate
        change, for ``links`` (default every link); utilisation = carried rate / capacity."""
        names = self.link_names()
        want = [i for i, n in enumerate(names) if links is None or n in links]
        cap = np.array(self._cap)
        out = []
        for t, load in self._segments:
            u = {names[i]: float(load[i] / cap[i]) if i < len(load) else 0.0 for i in want}
            out.append((t / PS, u))
        if self._segments:
            out.append((self.env.now / PS, {names[i]: 0.0 for i in want}))
        return out


_CREDIT_BATCH = 1 << 20   # link entries held before they are added (critical_link_s)


def _add_credit(out: np.ndarray, ks: list[int], ls: list[np.ndarray], ds: list[int]) -> None:
    """Add to ``out`` (per link, ps) each pace's credit: transfer i, in pace ``ks[i]``,
    credits ``ds[i]`` ps to its links ``ls[i]``; a link counts once per pace, with the largest
    credit of that pace. Per link the additions come in pace order (the keys are sorted by
    pace): each figure the float sum of the same terms in the same order as a loop over
    paces."""
    if not ks:
        return
    n = len(out)
    size = np.array([len(x) for x in ls])
    key = np.repeat(np.array(ks, dtype=np.int64), size) * n + np.concatenate(ls).astype(np.int64)
    dt_ps = np.repeat(np.array(ds, dtype=np.int64), size)
    order = np.lexsort((-dt_ps, key))          # per (pace, link): the largest credit first
    key, dt_ps = key[order], dt_ps[order]
    first = np.ones(len(key), dtype=bool)
    first[1:] = key[1:] != key[:-1]
    np.add.at(out, key[first] % n, dt_ps[first].astype(float))


class _Reps(dict):
    """:meth:`Network._representatives` of a FoldedGraph, computed on first lookup (its
    leaves, all built with the switches, are known at once)."""

    def __init__(self, net: Network):
        super().__init__()
        self._net = net
        self._leaves = net._leaves()

    def __missing__(self, n):
        r = self[n] = self._net._rep_of(n, self._net.graph.nodes[n], *self._leaves)
        return r


def symmetry_period(spec) -> int:
    """The smallest translation (in nodes) that maps the cluster graph and every scope onto
    itself: lcm(group_nodes, nodes_per_leaf for leaf-spine, 2 with several NICs per node);
    ``spec.nodes`` when it does not divide the node count (no reduction)."""
    t = spec.group_nodes
    if spec.network.fabric is NetworkFabric.LEAF_SPINE:
        t = math.lcm(t, spec.network.nodes_per_leaf)
    if spec.nic.per_node > 1 and spec.gpus_per_node > 1:
        t = math.lcm(t, 2)  # multi-NIC channel rings alternate entry/exit GPUs by node parity
    return t if spec.nodes % t == 0 else spec.nodes
