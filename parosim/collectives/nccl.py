"""NCCL's collective model: channels, Ring and Tree, protocols LL / LL128 / Simple.

Everything here follows NCCL's own tuning model, NCCL 2.20.3, ``src/graph/tuning.cc``
(commit b6475625fbcaa2c3c0e50eed2fa1255d7514d4a2), with the link bandwidths taken from the
flow-level network instead of NCCL's topology search. docs/collectives.md has the formulas.

Channels and NICs
    NCCL runs a collective on C channels, each one ring (or tree) carrying 1/C of the data,
    and spreads the channels over the node's NICs. A flat ring over several nodes is therefore
    lowered to one ring per GPU of a node (:func:`channel_rings`): ring c enters a node at GPU
    c and leaves it at GPU c + gpn/2 (the roles swap on every other node, so each inter-node
    hop joins two GPUs of the same local index: the same NIC, the same rail). Each NIC then
    carries one ring out and one in per node, every NIC of the node is used, and a node's
    inter-node bandwidth is the sum of its NICs. With one NIC per node all rings share it,
    which is the same as NCCL's channels all crossing one NIC.
Protocols (per phase, i.e. per NCCL call)
    time = base_latency + steps x mean over hops of max(wire latency, protocol hop latency)
           + bytes / min(bw_efficiency x B_links, cap) + reduction
    (NCCL's ``hwLat`` is a measured per-hop latency that includes the wire, so the cluster's
    wire latency is a floor under it rather than an addition to it),
    with NCCL's ``baseLat``, ``hwLat`` (by link type: NVLink, PCI, NET), busBw refinements
    (LL 1/4, LL128 0.92 or 0.7 when one GPU per node, Simple 1, tree 0.92 and tree LL 1/3.8,
    tree LL128 x 120/128) and caps (``llMaxBws``, ``perChMaxRingLL128Bws``,
    ``perChMaxTreeBws``, ``perChMaxTreeLL128Bws``: per channel x C). They are the
    :class:`~parosim.spec.system.ProtocolCost` fields of ``collective.ring_*`` /
    ``collective.tree_*``
    in the cluster YAML. NCCL's ring Simple all-reduce "plateau" (latency x 1.4 on Ampere and
    newer when bytes / (C x nranks) >= 64) and the tree correction factors by size are applied
    as NCCL applies them (:data:`TREE_CORRECTION`).
Tree (all-reduce over several nodes)
    NCCL's double binary tree: per channel, the GPUs of a node form a chain, the nodes two
    binary trees (the second the mirror of the first, so a leaf of one is inner in the other);
    each tree carries half the data up (reduce) and down (broadcast) at once. Its latency is
    NCCL's ``2 ((ppn - 1) intraLat + log2(nNodes) interLat)``.
Reduction
    A reduce-scatter or all-reduce adds (k-1)/k of the buffer on every rank (a tree: the whole
    buffer); each reduced byte moves ``collective.reduction_hbm_factor`` bytes through HBM
    (default 3: two reads and a write) at ``gpu.hbm_bandwidth``. NCCL fuses the reduction
    into the copy (its ``recvReduceSend`` primitives), so by default
    (``collective.reduction_overlap: true``) the HBM time bounds the phase's transfer (a rate
    cap: the phase takes max(wire time, HBM time)); ``false`` charges it after the transfer,
    as ASTRA-sim does.

Tuner profiles and NCCL's choice
    ``collective.nccl_version`` selects the release whose tables and rules apply ("2.20", the
    default, or "2.8": NCCL 2.8.3 tuning.cc, :func:`~parosim.spec.system.nccl_tables`, the
    plateau and LL-latency rules in :func:`_plateau` / :func:`_hw_intra`, the tree correction
    rows in :func:`tree_correction`); ``collective.choice: tuner`` lets NCCL's own estimate
    (:func:`tuner_time`, the profile's constant tables and NCCL's bus bandwidth) pick the
    algorithm and protocol of the ``nccl`` algorithm instead of the fastest in this model.

Protocol costs are resolved when a collective is lowered (stored in each
:class:`~parosim.collectives.types.Phase`): lower again after changing ``collective.*``.
NCCL's ``netOverhead`` (``collective.net_overhead``, 1 us on Intel x86, x 3 for Simple) floors
the intra-node steps of a ring that spans several nodes. Left out: NVLS (NVLink SHARP), CollNet
/ SHARP in-network reduction, PAT, the thread-count and chunk-size heuristics.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from ..spec.system import ClusterSpec, IntraFabric, nccl_tables
from .cost import phase_time, ring_alpha_beta, ring_profile
from .types import HopSet, Op, Phase, RingSet, Scope

# NCCL 2.20.3 src/graph/tuning.cc, treeCorrectionFactor[protocol][log2(bytes / 64)]: "Trees are
# not perfectly sticking to the model for medium sizes" (LL, LL128, Simple; 64 B ... 256 MiB).
TREE_CORRECTION = {
    "ll": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0,
           1.0, 1.0, 1.0),
    "ll128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9,
              .9, .9, 1.0, 1.0),
    "simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7,
               .8, .9, .9),
}
# NCCL 2.8.3 (tuning.cc @920dbe5b): the LL128 row differs from 64 KiB on (the others are equal)
TREE_CORRECTION_28 = {
    **TREE_CORRECTION,
    "ll128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .5, .6, .6, .7, .7, .8,
              .9, .9, .92, .92),
}
RING_SIMPLE_PLATEAU = 1.4   # tuning.cc ncclTopoGetAlgoTime, minCompCap >= 80 (1.9 before)
RING_SIMPLE_PLATEAU_28 = 1.9  # 2.8.3: x 1.9 once bytes >= nRanks / 16 x 64 KiB
LL_INTRA_MULTINODE_28 = 1.8   # 2.8.3: LL intra-node hop latency x 1.8 on several nodes
SM80_MAX_BUS_BW_Bps = 235e9   # tuning.cc (2.8.3 and 2.20.3): busBw <= 235 GB/s on compCap 8.0
LL128_ONE_PPN = 0.7 / 0.92  # tuning.cc: LL128 busBw x 0.7 instead of 0.92 when ppn < 2
NVLINK_BW_PER_CHANNEL_Bps = 20e9  # NCCL src/graph/topo.h SM80_NVLINK_BW (GB/s per NVLink)
MAX_CHANNELS = 32           # NCCL MAXCHANNELS


def log2i(x: int) -> int:
    """floor(log2 x) for x >= 1, NCCL's ``log2i`` (0 for x < 1)."""
    return int(x).bit_length() - 1 if x >= 1 else 0


def channels(spec: ClusterSpec, intra_Bps: float | None = None) -> int:
    """NCCL channels C: ``collective.channels`` or, when 0, enough channels for every NIC twice
    and for the NVLink bandwidth (``intra_Bps``, default the cluster's) at NCCL's 20 GB/s per
    channel, in 2..32."""
    c = spec.collective.channels
    if c:
        return c
    intra = spec.intra.bandwidth_Bps if intra_Bps is None else intra_Bps
    want = max(2 * spec.nic.per_node, math.ceil(intra / NVLINK_BW_PER_CHANNEL_Bps))
    return max(2, min(MAX_CHANNELS, want))


# -- channel rings ------------------------------------------------------------------------

def _order(gpn: int, enter: int, leave: int) -> list[int]:
    mid = [(enter + j) % gpn for j in range(1, gpn)]
    return [enter] + [x for x in mid if x != leave] + [leave]


def channel_rings(spec: ClusterSpec, nodes: list[int]) -> tuple[tuple[int, ...], ...]:
    """The rings of one flat ring over all GPUs of ``nodes`` (in that order), one per channel
    pattern: a single rank-order ring when a node has one NIC (all channels share it) or one
    GPU; otherwise ``gpus_per_node`` rings, ring c entering even-position nodes at GPU c and
    leaving at GPU c + gpn/2, the other way round on odd positions (see module docstring).

    >>> from parosim.spec.system import ClusterSpec, NICSpec
    >>> c = ClusterSpec(nodes=2, gpus_per_node=2, nic=NICSpec(per_node=2))
    >>> channel_rings(c, [0, 1])
    ((0, 1, 3, 2), (1, 0, 2, 3))
    """
    gpn = spec.gpus_per_node
    if len(nodes) == 1 or gpn == 1 or spec.nic.per_node <= 1:
        return (tuple(n * gpn + j for n in nodes for j in range(gpn)),)
    half = gpn // 2
    rings = []
    for c in range(gpn):
        p, q = c, (c + half) % gpn
        ring: list[int] = []
        for pos, n in enumerate(nodes):
            enter, leave = (p, q) if pos % 2 == 0 else (q, p)
            ring += [n * gpn + j for j in _order(gpn, enter, leave)]
        rings.append(tuple(ring))
    return tuple(rings)


# -- trees --------------------------------------------------------------------------------

def _btree_parents(n: int, mirror: bool) -> list[int]:
    """Parent position of each of n positions in a heap-ordered binary tree (-1: root); the
    mirror tree numbers the positions from the other end, so inner nodes become leaves."""
    par = []
    for i in range(n):
        j = n - 1 - i if mirror else i
        pj = (j - 1) // 2 if j > 0 else -1
        par.append(-1 if pj < 0 else (n - 1 - pj if mirror else pj))
    return par


@lru_cache(maxsize=64)
def tree_hopset(spec: ClusterSpec, parts: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...],
                label: str) -> HopSet:
    """The hops of NCCL's double binary tree for every instance of a scope; an instance is
    (its nodes, its GPUs on each of them). Per tree channel a chain through the node's GPUs
    from a head GPU (one head per NIC), the heads of the nodes joined by two mirrored binary
    trees; every edge up and down. Each flow carries S / (2 Rt), Rt the tree channels, so one
    rank's NCCL bus bytes (2 S) are ``4 Rt`` flow buffers (``rings_per_rank``).
    """
    gpn = spec.gpus_per_node
    hops: list[tuple[int, int]] = []
    rt = 1
    for nodes, locals_ in parts:
        ppn = len(locals_)
        nics = sorted({spec.nic_of(j) for j in locals_})
        heads = [next(j for j in locals_ if spec.nic_of(j) == k) for k in nics]
        rt = len(heads)
        L = len(nodes)
        for h in heads:
            i0 = locals_.index(h)
            chain = [locals_[(i0 + j) % ppn] for j in range(ppn)]
            for mirror in (False, True):
                for n in nodes:  # the chain, up and down
                    for a, b in zip(chain, chain[1:], strict=False):
                        hops.append((n * gpn + b, n * gpn + a))
                        hops.append((n * gpn + a, n * gpn + b))
                for pos, par in enumerate(_btree_parents(L, mirror)):
                    if par >= 0:
                        child, parent = nodes[pos] * gpn + h, nodes[par] * gpn + h
                        hops.append((child, parent))
                        hops.append((parent, child))
    nodes0, locals0 = parts[0]
    return HopSet(tuple(hops), label, len(locals0) * len(nodes0), 4 * rt)


def tree_parts(spec: ClusterSpec, scope) -> tuple | None:
    """The instances of a scope as (nodes, local GPUs) pairs, when an instance spans several
    nodes; None otherwise (NCCL's intra-node tree is a chain: not a candidate)."""
    gpn, gn, m = spec.gpus_per_node, spec.group_nodes, spec.group_size
    allg = tuple(range(gpn))
    if scope is Scope.GLOBAL and spec.nodes > 1:
        return ((tuple(range(spec.nodes)), allg),)
    if scope is Scope.INTRA and gn > 1:
        return tuple((tuple(range(g * gn, (g + 1) * gn)), allg) for g in range(spec.groups))
    if scope is Scope.INTER and spec.groups > 1:
        return tuple((tuple(g * gn + j // gpn for g in range(spec.groups)), (j % gpn,))
                     for j in range(m))
    return None


def tree_phase(spec: ClusterSpec, scope_label: str, size: float, proto: str | None,
               parts: tuple, lane: str = "main") -> Phase:
    """An all-reduce of ``size`` bytes as one NCCL tree phase (protocol chosen if None)."""
    hs = tree_hopset(spec, parts, scope_label)
    rt = hs.rings_per_rank // 4
    n_nodes, ppn = len(parts[0][0]), len(parts[0][1])
    steps = 2 * ((ppn - 1) + log2i(n_nodes))
    return make_phase(spec, f"all-reduce {scope_label} tree", Op.ALL_REDUCE, hs,
                      size / (2 * rt), lane, (), proto, tree_steps=max(1, steps),
                      total_bytes=size, nodes=n_nodes, ppn=ppn)


# -- protocol costs -----------------------------------------------------------------------

def instance_shape(spec: ClusterSpec, rs: RingSet) -> tuple[int, int]:
    """(nodes, ranks per node) of one instance of a ring set."""
    gpn = spec.gpus_per_node
    if not rs.rings:
        return 1, 1
    nodes = len({r // gpn for r in rs.rings[0]})
    return nodes, max(1, len(rs.rings[0]) // nodes)


def make_phase(spec: ClusterSpec, name: str, op: Op, ringset, total_bytes_or_buffer: float,
               lane: str, deps: tuple[int, ...] = (), proto: str | None = None,
               tree_steps: int = 0, total_bytes: float | None = None, nodes: int = 0,
               ppn: int = 0) -> Phase:
    """A phase with its protocol costs resolved.

    For a ring set, ``total_bytes_or_buffer`` is the whole buffer of one instance (split over
    the ring set's channel rings); for a tree it is one flow's buffer (``total_bytes`` is the
    collective's size). ``proto`` None lets the tuner pick, per phase, the protocol of
    ``collective.protocols`` with the smallest time (ties: the first). With
    ``collective.model: ideal`` the phase has no protocol cost.
    """
    tree = tree_steps > 0
    buffer = total_bytes_or_buffer if tree else total_bytes_or_buffer / max(
        1, ringset.rings_per_rank)
    base = Phase(name, op, ringset, buffer, lane, deps, tree_steps=tree_steps)
    tun = spec.collective
    if tun.model == "ideal" or base.steps == 0:
        return base
    if not tree:
        nodes, ppn = instance_shape(spec, ringset)
        total_bytes = total_bytes_or_buffer
    protos = [proto] if proto else list(tun.protocols)
    best, best_t = base, math.inf
    for p in protos:
        ph = _costed(spec, base, "tree" if tree else "ring", p, float(total_bytes), nodes, ppn)
        t = phase_time(spec, ph)
        if t < best_t * (1 - 1e-12):
            best, best_t = ph, t
    return best


def _hw_intra(spec: ClusterSpec, pc, proto: str, nodes: int) -> float:
    """NCCL's ``hwLat`` of the node's link type for one protocol (2.8: LL x 1.8 when the
    communicator spans several nodes)."""
    hw = pc.nvlink_latency_s if spec.intra_fabric is IntraFabric.NVSWITCH else pc.pcie_latency_s
    if spec.collective.nccl_version == "2.8" and nodes > 1 and proto == "ll":
        hw *= LL_INTRA_MULTINODE_28
    return hw


def _plateau(spec: ClusterSpec, total, C: int, K: int):
    """Whether NCCL's ring Simple all-reduce "plateau" applies at ``total`` bytes (an array
    or a number) on K ranks and C channels, and its latency factor, by tuner profile."""
    if spec.collective.nccl_version == "2.8":
        return total >= K / 16.0 * 65536, RING_SIMPLE_PLATEAU_28
    return total / (C * K) >= 64, RING_SIMPLE_PLATEAU


def tree_correction(spec: ClusterSpec, proto: str, total: float) -> float:
    """NCCL's tree correction factor of ``proto`` at ``total`` bytes (1 beyond the table)."""
    rows = TREE_CORRECTION_28 if spec.collective.nccl_version == "2.8" else TREE_CORRECTION
    ls = log2i(int(total) >> 6)
    return rows[proto][ls] if ls < len(rows[proto]) else 1.0


def _costed(spec: ClusterSpec, ph: Phase, algorithm: str, proto: str, total: float,
            nodes: int, ppn: int) -> Phase:
    tun = spec.collective
    pc = tun.protocol(algorithm, proto)
    C = channels(spec)
    _, _, frac = ring_profile(spec, ph.ringset)
    # NCCL's hwLat is a measured per-hop latency, wire included: a hop costs
    # max(wire, hwLat), i.e. the wire (paid in steps x alpha) plus what hwLat exceeds it by
    intra = max(0.0, _hw_intra(spec, pc, proto, nodes) - spec.intra.latency_s)
    net = max(0.0, pc.net_latency_s - (2 * spec.pcie.latency_s + spec.nic.latency_s))
    eff = pc.bw_efficiency
    if algorithm == "ring":
        if nodes > 1 and tun.nccl_version == "2.20":
            # NCCL: "inter-node rings still have to launch nsteps * net overhead"
            floor = tun.net_overhead_s * (3 if proto == "simple" else 1)
            intra = max(intra, floor - spec.intra.latency_s)
        if proto == "ll128" and ppn < 2:
            eff *= LL128_ONE_PPN
        lat = pc.base_latency_s + ph.steps * ((1 - frac) * intra + frac * net)
        if proto == "simple" and nodes > 1 and ph.op is Op.ALL_REDUCE:
            hit, factor = _plateau(spec, total, C, ph.ringset.size)
            if hit:
                lat *= factor
        reduced = (ph.ringset.size - 1) / ph.ringset.size * total
    else:
        eff *= tree_correction(spec, proto, total)
        lat = pc.base_latency_s + 2 * ((ppn - 1) * intra + log2i(nodes) * net)
        reduced = total
    per_channel, whole = pc.caps(nodes)
    cap_bus = min(whole, C * per_channel)
    cap = cap_bus / max(1, ph.ringset.rings_per_rank)
    red = 0.0
    if ph.op in (Op.REDUCE_SCATTER, Op.ALL_REDUCE) and tun.reduction_hbm_factor:
        hbm_s = tun.reduction_hbm_factor * reduced / spec.gpu.hbm_bandwidth_Bps
        if tun.reduction_overlap and hbm_s > 0:  # fused into the copy: no faster than HBM
            cap = min(cap, ph.bytes_per_rank / hbm_s)
        else:                      # charged after the transfer (ASTRA-sim)
            red = hbm_s
    return Phase(ph.name, ph.op, ph.ringset, ph.buffer_bytes, ph.lane, ph.deps, proto,
                 eff, cap, lat + red, ph.tree_steps)


# -- NCCL's own choice ---------------------------------------------------------------------

def tuner_rates(spec: ClusterSpec) -> tuple[float, float]:
    """(per GPU over the node's link, per node over its NICs) in B/s as NCCL's tuner sees
    them: ``collective.tuner_intra_bandwidth`` / ``tuner_net_bandwidth``, else the cluster's
    links."""
    tun = spec.collective
    return (tun.tuner_intra_bandwidth_Bps or spec.intra.bandwidth_Bps,
            tun.tuner_net_bandwidth_Bps or spec.nic.per_node * spec.nic.bandwidth_Bps)


def tuner_bus_Bps(spec: ClusterSpec, nodes: int, ppn: int) -> float:
    """The bus bandwidth NCCL's tuner assumes (``nChannels x speed``): the node's link when the
    communicator spans at most 2 nodes (tuning.cc, 2.8.3 and 2.20.3: ``nNodes <= 2 ?
    speedIntra : speedInter``), else the lesser of it and the NICs its ranks use
    (:func:`tuner_rates`); at most 235 GB/s on an A100 / A800 (compute capability 8.0)."""
    bus, net = tuner_rates(spec)
    if nodes > 2:
        share = max(1.0 / max(1, spec.nic.per_node), ppn / spec.gpus_per_node)
        bus = min(bus, net * share)
    if spec.gpu.model.upper().startswith(("A100", "A800")):
        bus = min(bus, SM80_MAX_BUS_BW_Bps)
    return bus


def tuner_time(spec: ClusterSpec, algorithm: str, proto: str, op: Op, size: float,
               nranks: int, nodes: int) -> float:
    """NCCL's estimate of a collective (``ncclTopoGetAlgoTime``: latency + bytes / algBw)
    with the constant tables of the cluster's tuner profile (``collective.nccl_version``:
    :func:`~parosim.spec.system.nccl_tables`, never the cluster's possibly fitted protocol
    fields: NCCL chooses with its own constants) and :func:`tuner_bus_Bps`. What
    ``collective.choice: tuner`` minimises; parosim then costs the chosen one as usual."""
    tun = spec.collective
    tables = nccl_tables(tun.nccl_version)
    pc = tables[f"{algorithm}_{proto}"]
    C = channels(spec, tuner_rates(spec)[0])
    ppn = max(1, nranks // max(1, nodes))
    eff = pc.bw_efficiency
    if algorithm == "ring" and proto == "ll128" and ppn < 2:
        eff *= LL128_ONE_PPN
    per_channel, whole = pc.caps(nodes)
    bus = min(tuner_bus_Bps(spec, nodes, ppn) * eff, C * per_channel, whole)
    intra = _hw_intra(spec, pc, proto, nodes)
    net = pc.net_latency_s
    if algorithm == "tree":
        algbw = bus * 0.5 * tree_correction(spec, proto, size)
        lat = pc.base_latency_s + 2 * ((ppn - 1) * intra + log2i(nodes) * net)
        return lat + size / algbw
    nsteps, inter = op.ring_factor * (nranks - 1), op.ring_factor * (nodes - 1)
    if nodes > 1 and tun.nccl_version == "2.20":
        intra = max(intra, float(tables["net_overhead_s"]) * (3 if proto == "simple" else 1))
    lat = pc.base_latency_s + ((nsteps - inter) * intra + inter * net if nodes > 1
                               else nsteps * intra)
    if proto == "simple" and nodes > 1 and op is Op.ALL_REDUCE:
        hit, f = _plateau(spec, size, C, nranks)
        if hit:
            lat *= f
    return lat + size / (bus * nranks / max(1, nsteps))


def ring_phase_costs(spec: ClusterSpec, op: Op, ringset: RingSet, totals: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
    """(:func:`~parosim.collectives.cost.phase_time`, :func:`~parosim.collectives.cost.
    latency_part`) of ``make_phase(spec, "", op, ringset, total, lane)`` for every total in
    ``totals`` at once: the protocol chosen per total as :func:`make_phase` chooses it (ties:
    the first), each figure computed by the same operations in the same order as
    :func:`_costed` and ``phase_time`` (IEEE arithmetic elementwise: the same doubles).
    What :func:`parosim.collectives.lowering.best_chunks` evaluates for 64 chunk counts."""
    tun = spec.collective
    totals = np.asarray(totals, dtype=float)
    rpr = max(1, ringset.rings_per_rank)
    K = ringset.size
    steps = op.ring_factor * (K - 1) if K > 1 else 0
    if steps == 0:
        zero = np.zeros(len(totals))
        return zero, zero.copy()
    buffer = totals / rpr
    bpr = op.ring_factor * (K - 1) / K * buffer          # Phase.bytes_per_rank
    alpha, bw = ring_alpha_beta(spec, ringset)
    over = tun.phase_overhead_s
    if tun.model == "ideal":                             # Phase defaults: no protocol
        t = steps * alpha + bpr / min(bw * 1.0, math.inf) + over + 0.0
        return t, np.full(len(totals), steps * alpha + over + 0.0)
    nodes, ppn = instance_shape(spec, ringset)
    C = channels(spec)
    _, _, frac = ring_profile(spec, ringset)
    best_t = np.full(len(totals), math.inf)
    best_l = np.zeros(len(totals))
    for proto in tun.protocols:
        pc = tun.protocol("ring", proto)
        intra = max(0.0, _hw_intra(spec, pc, proto, nodes) - spec.intra.latency_s)
        net = max(0.0, pc.net_latency_s - (2 * spec.pcie.latency_s + spec.nic.latency_s))
        eff = pc.bw_efficiency
        if nodes > 1 and tun.nccl_version == "2.20":
            floor = tun.net_overhead_s * (3 if proto == "simple" else 1)
            intra = max(intra, floor - spec.intra.latency_s)
        if proto == "ll128" and ppn < 2:
            eff *= LL128_ONE_PPN
        lat0 = pc.base_latency_s + steps * ((1 - frac) * intra + frac * net)
        lat = np.full(len(totals), lat0)
        if proto == "simple" and nodes > 1 and op is Op.ALL_REDUCE:
            hit, factor = _plateau(spec, totals, C, K)
            lat = np.where(hit, lat0 * factor, lat)
        reduced = (K - 1) / K * totals
        per_channel, whole = pc.caps(nodes)
        cap = np.full(len(totals), min(whole, C * per_channel) / rpr)
        red = np.zeros(len(totals))
        if op in (Op.REDUCE_SCATTER, Op.ALL_REDUCE) and tun.reduction_hbm_factor:
            hbm_s = tun.reduction_hbm_factor * reduced / spec.gpu.hbm_bandwidth_Bps
            pos = hbm_s > 0
            if tun.reduction_overlap:
                with np.errstate(divide="ignore", invalid="ignore"):
                    cap = np.where(pos, np.minimum(cap, bpr / hbm_s), cap)
                red = np.where(pos, red, hbm_s)
            else:
                red = hbm_s
        fixed = lat + red
        t = steps * alpha + bpr / np.minimum(bw * eff, cap) + over + fixed
        take = t < best_t * (1 - 1e-12)
        best_t = np.where(take, t, best_t)
        best_l = np.where(take, steps * alpha + over + fixed, best_l)
    return best_t, best_l
