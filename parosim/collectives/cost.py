"""Closed-form alpha-beta cost of a lowered collective, from the cluster *spec* alone.

A phase (a ring collective on a set of rings) costs

    T = steps * alpha + bytes_per_rank / B + phase_overhead   (Thakur, Rabenseifner & Gropp
                                                               2005, plus a launch cost)

with steps = (k-1) for AG/RS and 2(k-1) for AR, bytes_per_rank = steps/k * buffer,
alpha = the slowest hop's one-way latency + ``collective.step_latency_s``, and B the bandwidth
of the most loaded link class along the rings (a pipelined ring moves at its slowest hop):

* intra-node hop: the GPU's NVLink (or PCIe-switch) bandwidth ``intra.bandwidth_Bps``;
* inter-node hop: PCIe to the NIC, the NIC shared by the hops that leave (or enter) the node
  through it, and for leaf-spine / rail fabrics the switch uplink shared by the hops that cross
  it. Capacities come from the spec; the sharing counts from the ring structure.

This is computed independently of the graph and the simpy engine, which tests compare to it.
Phases on lanes combine by the lane recurrence of :func:`program_time`; the collective adds
``collective.call_overhead_s`` once.
"""

from __future__ import annotations

from collections import Counter
from functools import lru_cache

import numpy as np

from ..spec.system import ClusterSpec, NetworkFabric
from .types import Phase, Program, RingSet


@lru_cache(maxsize=512)
def ring_alpha_beta(spec: ClusterSpec, ringset: RingSet) -> tuple[float, float]:
    """(alpha_s, B_Bps) of a ring set on this cluster, from the spec.

    alpha is the per-step latency: the largest, over the rings, of a ring's mean hop latency
    (a chunk travels every hop of the ring once per pass, so k-1 steps cost (k-1)/k of the
    ring's summed hop latencies, as NCCL's tuning model sums intra and inter steps), plus
    ``collective.step_latency_s``. B is the per-flow bandwidth of the most loaded link.

    >>> from parosim.spec.system import ClusterSpec
    >>> from parosim.collectives.lowering import scope_rings
    >>> from parosim.collectives.types import Scope
    >>> c = ClusterSpec(nodes=2)  # 1 NIC/node shared by the 8 inter rings
    >>> a, b = ring_alpha_beta(c, scope_rings(c, Scope.INTER))
    >>> b == c.nic.bandwidth_Bps / 8
    True
    """
    alpha, bw, _ = ring_profile(spec, ringset)
    return alpha, bw


@lru_cache(maxsize=512)
def ring_profile(spec: ClusterSpec, ringset: RingSet) -> tuple[float, float, float]:
    """(alpha_s, B_Bps, inter_fraction): :func:`ring_alpha_beta` plus the fraction of the
    hops that leave a node (for the per-link-type protocol latencies of NCCL's model)."""
    arrays = getattr(ringset, "hop_arrays", None)
    if arrays is not None:  # rings of equal length: the same sums, in numpy
        return _profile_arrays(spec, *arrays)
    gpn = spec.gpus_per_node
    net = spec.network
    nic_out: Counter = Counter()
    nic_in: Counter = Counter()
    up_out: Counter = Counter()
    up_in: Counter = Counter()
    alpha, bw = 0.0, float("inf")
    inter_lat = 2 * spec.pcie.latency_s + spec.nic.latency_s
    intra_lat = spec.intra.latency_s
    n_hops = n_inter = 0
    for hops in ringset.ring_hops():
        total = 0.0
        for a, b in hops:
            na, nb = a // gpn, b // gpn
            if na == nb:
                total += intra_lat
                continue
            n_inter += 1
            ka, kb = spec.nic_of(a % gpn), spec.nic_of(b % gpn)
            nic_out[na, ka] += 1
            nic_in[nb, kb] += 1
            lat = inter_lat
            if net.fabric is NetworkFabric.LEAF_SPINE:
                la, lb = na // net.nodes_per_leaf, nb // net.nodes_per_leaf
                if la != lb:
                    up_out[la] += 1
                    up_in[lb] += 1
                    lat += 2 * net.uplink_latency_s
            elif net.fabric is NetworkFabric.RAIL and ka != kb:
                up_out[ka] += 1
                up_in[kb] += 1
                lat += 2 * net.uplink_latency_s
            total += lat
        n_hops += len(hops)
        alpha = max(alpha, total / len(hops))
    if n_hops > n_inter:
        bw = min(bw, spec.intra.bandwidth_Bps / _intra_flows(spec, ringset))
    if n_inter:
        bw = min(bw, spec.pcie.bandwidth_Bps / _pcie_flows(spec, ringset))
    worst_nic = max([*nic_out.values(), *nic_in.values()], default=0)
    if worst_nic:
        bw = min(bw, spec.nic.bandwidth_Bps / worst_nic)
    worst_up = max([*up_out.values(), *up_in.values()], default=0)
    return _profile_end(spec, net, alpha, bw, worst_up, n_hops, n_inter)


def _most(keys: np.ndarray) -> int:
    """The largest number of times one value occurs in ``keys`` (0 if empty)."""
    if not len(keys):
        return 0
    return int(np.bincount(keys).max())  # keys are ranks, nodes, NICs, leaves: >= 0


def _profile_arrays(spec: ClusterSpec, src: np.ndarray, dst: np.ndarray
                    ) -> tuple[float, float, float]:
    """:func:`ring_profile` of rings of equal length given as (rings, k) arrays of hops:
    the same per-hop latencies summed in ring order (``cumsum`` adds left to right, as the
    loop does, so the result is the same to the bit) and the same sharing counts."""
    gpn = spec.gpus_per_node
    net = spec.network
    inter_lat = 2 * spec.pcie.latency_s + spec.nic.latency_s
    intra_lat = spec.intra.latency_s
    cross_lat = inter_lat + 2 * net.uplink_latency_s
    na, nb = src // gpn, dst // gpn
    inter = na != nb
    per = spec.nic.per_node
    ka, kb = (src % gpn) * per // gpn, (dst % gpn) * per // gpn
    if net.fabric is NetworkFabric.LEAF_SPINE:
        ua, ub = na // net.nodes_per_leaf, nb // net.nodes_per_leaf
    elif net.fabric is NetworkFabric.RAIL:
        ua, ub = ka, kb
    else:
        ua = ub = None
    cross = inter & (ua != ub) if ua is not None else np.zeros_like(inter)
    lat = np.where(cross, cross_lat, np.where(inter, inter_lat, intra_lat))
    k = src.shape[1]
    alpha = max(0.0, float((np.cumsum(lat, axis=1)[:, -1] / k).max()))
    n_hops, n_inter = int(src.size), int(inter.sum())
    bw = float("inf")
    if n_hops > n_inter:
        intra = ~inter
        flows = max(_most(src[intra]), _most(dst[intra]))
        bw = min(bw, spec.intra.bandwidth_Bps / flows)
    if n_inter:
        flows = max(_most(src[inter]), _most(dst[inter]))
        bw = min(bw, spec.pcie.bandwidth_Bps / flows)
        worst_nic = max(_most(na[inter] * per + ka[inter]), _most(nb[inter] * per + kb[inter]))
        bw = min(bw, spec.nic.bandwidth_Bps / worst_nic)
    worst_up = max(_most(ua[cross]), _most(ub[cross])) if ua is not None else 0
    return _profile_end(spec, net, alpha, bw, worst_up, n_hops, n_inter)


def _intra_flows(spec: ClusterSpec, ringset: RingSet) -> int:
    """Most flows on one GPU's intra-node link (either direction): each GPU's own NVLink (or
    PCIe-switch port) carries every intra hop it sends and every one it receives."""
    gpn = spec.gpus_per_node
    out: Counter = Counter()
    inn: Counter = Counter()
    for a, b in ringset.hops():
        if a // gpn == b // gpn:
            out[a] += 1
            inn[b] += 1
    return max([*out.values(), *inn.values()], default=1)


def _pcie_flows(spec: ClusterSpec, ringset: RingSet) -> int:
    """Most flows on one GPU's PCIe link to its NIC (either direction)."""
    gpn = spec.gpus_per_node
    out: Counter = Counter()
    inn: Counter = Counter()
    for a, b in ringset.hops():
        if a // gpn != b // gpn:
            out[a] += 1
            inn[b] += 1
    return max([*out.values(), *inn.values()], default=1)


def phase_time(spec: ClusterSpec, phase: Phase) -> float:
    """Uncontended time of one phase: steps * alpha + bytes_per_rank / min(eff * B, cap)
    + phase overhead + the phase's fixed protocol and reduction time."""
    if phase.steps == 0:
        return 0.0
    alpha, bw = ring_alpha_beta(spec, phase.ringset)
    return (phase.steps * alpha + phase.bytes_per_rank / min(bw * phase.bw_eff, phase.cap_Bps)
            + spec.collective.phase_overhead_s + phase.fixed_s)


def lane_schedule(program: Program, durations: list[float]) -> list[tuple[float, float]]:
    """(start, end) of every phase under the lane semantics: a phase starts when the previous
    phase of its lane and all its deps have ended."""
    lane_free: dict[str, float] = {}
    times: list[tuple[float, float]] = []
    for i, ph in enumerate(program.phases):
        start = max([lane_free.get(ph.lane, 0.0)] + [times[d][1] for d in ph.deps])
        end = start + durations[i]
        times.append((start, end))
        lane_free[ph.lane] = end
    return times


def latency_part(spec: ClusterSpec, phase: Phase) -> float:
    """The part of :func:`phase_time` that is not bandwidth: steps x alpha + launch + the
    fixed protocol/reduction time."""
    if phase.steps == 0:
        return 0.0
    alpha, _ = ring_alpha_beta(spec, phase.ringset)
    return phase.steps * alpha + spec.collective.phase_overhead_s + phase.fixed_s


def program_time(spec: ClusterSpec, program: Program) -> float:
    """Closed-form time of a lowered collective (lane recurrence + call overhead).

    With ``collective.serial_progress`` the latency parts of all phases share one progress
    thread, so the time is also at least (the smallest bandwidth part, which comes first) +
    (the sum of latency parts). For one lane (ring, hierarchical) the recurrence already
    exceeds that bound and stays exact; for HO-Ring the max of the two is an estimate (the
    engine is the reference).
    """
    durations = _per_phase(spec, program.phases, phase_time)
    ends = [e for _, e in lane_schedule(program, durations)]
    t = max(ends, default=0.0)
    if spec.collective.serial_progress and program.phases:
        lat = _per_phase(spec, program.phases, latency_part)
        t = max(t, sum(lat) + min(d - a for d, a in zip(durations, lat, strict=True)))
    return t + spec.collective.call_overhead_s


def _per_phase(spec: ClusterSpec, phases, fn) -> list[float]:
    """``[fn(spec, ph) for ph in phases]``, computed once per distinct phase: an HO-Ring
    program repeats one costed phase per chunk under other names (the figures depend only
    on the fields in the key)."""
    memo: dict[tuple, float] = {}
    out = []
    for ph in phases:
        key = (id(ph.ringset), ph.op, ph.buffer_bytes, ph.bw_eff, ph.cap_Bps, ph.fixed_s,
               ph.tree_steps)
        v = memo.get(key)
        if v is None:
            v = memo[key] = fn(spec, ph)
        out.append(v)
    return out


def _profile_end(spec: ClusterSpec, net, alpha: float, bw: float, worst_up: int, n_hops: int,
                 n_inter: int) -> tuple[float, float, float]:
    """The end of a ring profile (both paths): the uplink bound (the switch tier's capacity
    over its oversubscription, shared by the most flows on one uplink), then (alpha, bw,
    inter-node fraction of the hops)."""
    if worst_up:
        if net.fabric is NetworkFabric.LEAF_SPINE:
            cap = net.nodes_per_leaf * spec.nic.per_node * spec.nic.bandwidth_Bps
        else:
            cap = spec.nodes * spec.nic.bandwidth_Bps
        bw = min(bw, cap / net.oversubscription / worst_up)
    frac = n_inter / n_hops if n_hops else 0.0
    return alpha + spec.collective.step_latency_s, bw, frac
