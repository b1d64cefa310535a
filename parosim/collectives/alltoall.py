"""All-to-all: NCCL's point-to-point algorithm and the hierarchical NVLink + RDMA variant.

Size S follows nccl-tests' ``alltoall_perf``: each rank's send buffer, of which S/k goes to
every rank of its group of k (itself included; that block is a local copy and costs nothing
here). algbw = S / time, busbw = algbw x (k-1)/k. docs/collectives.md, "All-to-all".

* :data:`~parosim.spec.collective.Algo.P2P` (also what ``nccl`` runs for an all-to-all): NCCL
  implements ``alltoall`` as one group of ``ncclSend`` / ``ncclRecv`` to every peer, all in
  flight at once. One phase: k(k-1) flows per group of S/k bytes each, from every rank to
  every other. Every flow moves at the rate of the most loaded link it shares (they start
  together and are equal, so the slowest ends at max over links of load / capacity, the
  bound max-min sharing reaches); the latency is one step of the slowest pair's path.
  Protocol (``collective.model: nccl``): a peer message of at most
  :data:`P2P_LL_THRESHOLD` bytes goes with LL, a larger one with Simple (NCCL's
  ``NCCL_P2P_LL_THRESHOLD``), at that protocol's bandwidth efficiency and base latency of
  the ring tuning plus one hop's hardware latency.
* :data:`~parosim.spec.collective.Algo.HIERARCHICAL_A2A` (DeepEP's normal kernels, HybridEP):
  for the global scope over several groups of m GPUs (ng = n / m groups). Stage 1, RDMA: rank
  (g, j) sends to rank (h, j) of every other group everything meant for group h, m·S/n bytes
  per flow, rail-matched (no cross-rail traffic). Stage 2, NVLink: rank (g, j) forwards to
  every other rank (g, l) of its group what arrived for l plus its own block for l,
  ng·S/n bytes per flow. The stages are pipelined in K chunks (stage 2 of chunk c after
  stage 1 of chunk c, two lanes, as HO-Ring), K in 1..``collective.ho_ring_max_chunks``
  minimising the closed form. Inside one group, or for the intra / inter scopes, it is
  the p2p algorithm.

The closed form (:func:`~parosim.collectives.cost.program_time`) and the engine run the same
program: the closed form takes the link loads from the spec, the engine routes every flow
on the cluster graph, where it shares links with whatever else runs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import InputError
from ..spec.system import ClusterSpec, IntraFabric
from .cost import program_time, ring_profile
from .types import Algo, HopSet, Op, Phase, Program, Scope

#: NCCL's NCCL_P2P_LL_THRESHOLD default: peer messages up to this many bytes use LL
P2P_LL_THRESHOLD = 16384
#: most point-to-point flows of one all-to-all: every flow is routed and costed on its own
#: (512 ranks in one group: 261,632 flows, about 40 s on one core); docs/limits.md
MAX_A2A_FLOWS = 2**18


@dataclass(frozen=True)
class PairSet(HopSet):
    """Point-to-point flows (src, dst) that start together and move equal bytes: a
    :class:`~parosim.collectives.types.HopSet` whose every flow is its own "ring" of one hop,
    so the phase's step latency is the slowest flow's path latency. ``size`` is k, the ranks
    of one all-to-all group."""

    def __hash__(self) -> int:
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.hop_list, self.label, "pairs"))
            self.__dict__["_hash"] = h
        return h

    def ring_hops(self):
        for hop in self.hop_list:
            yield [hop]


def groups_of(spec: ClusterSpec, scope: Scope) -> list[list[int]]:
    """The rank groups of a scope: all ranks; each group of m; the ranks of one local index
    across groups (node-major ranks)."""
    m, ng = spec.group_size, spec.groups
    if scope is Scope.GLOBAL:
        return [list(range(spec.gpus))]
    if scope is Scope.INTRA:
        return [list(range(g * m, (g + 1) * m)) for g in range(ng)]
    return [[g * m + j for g in range(ng)] for j in range(m)]


def _costed(spec: ClusterSpec, ph: Phase) -> Phase:
    """The p2p protocol cost of a phase under ``collective.model: nccl`` (module docstring)."""
    tun = spec.collective
    if tun.model == "ideal":
        return ph
    proto = "ll" if ph.buffer_bytes <= P2P_LL_THRESHOLD else "simple"
    if proto not in tun.protocols:
        proto = "simple" if "simple" in tun.protocols else tun.protocols[0]
    pc = tun.protocol("ring", proto)
    _, _, frac = ring_profile(spec, ph.ringset)
    hw_intra = pc.nvlink_latency_s if spec.intra_fabric is IntraFabric.NVSWITCH else (
        pc.pcie_latency_s)
    intra = max(0.0, hw_intra - spec.intra.latency_s)
    net = max(0.0, pc.net_latency_s - (2 * spec.pcie.latency_s + spec.nic.latency_s))
    hop = net if frac > 0 else intra
    return replace(ph, proto=proto, bw_eff=pc.bw_efficiency, fixed_s=pc.base_latency_s + hop)


def _phase(spec: ClusterSpec, name: str, hops: list[tuple[int, int]], label: str, k: int,
           per_flow: float, lane: str, deps: tuple[int, ...] = ()) -> Phase:
    ph = Phase(name, Op.ALL_TO_ALL, PairSet(tuple(hops), label, k), per_flow, lane, deps,
               tree_steps=1 if hops else 0)
    return _costed(spec, ph) if hops else ph


def lower_p2p(spec: ClusterSpec, scope: Scope, size: float, algo: Algo = Algo.P2P,
              groups: list[list[int]] | None = None) -> Program:
    """NCCL's all-to-all: every rank sends S/k to every other rank of its group at once.
    ``groups``: explicit rank groups of equal size (an EP layout's), else the scope's."""
    groups = groups_of(spec, scope) if groups is None else groups
    k = len(groups[0])
    check_flows(sum(len(g) * (len(g) - 1) for g in groups))
    hops = [(a, b) for grp in groups for a in grp for b in grp if a != b]
    ph = _phase(spec, f"all-to-all {scope.value}", hops, scope.value, k, size / k, "main")
    return Program(Op.ALL_TO_ALL, scope, algo, size, k, (ph,),
                   choice="p2p" if algo is Algo.NCCL else "")


def check_flows(flows: int) -> None:
    if flows > MAX_A2A_FLOWS:
        raise InputError(f"an all-to-all of {flows:,} point-to-point flows is more than "
                         f"{MAX_A2A_FLOWS:,}, the simulator's limit (each flow is routed on "
                         "its own; 512 ranks in one group fit); expected fewer ranks per "
                         "all-to-all group (--nodes, --scope, --ep)")


def _split(spec: ClusterSpec, groups: list[list[int]]) -> list[list[list[int]]] | None:
    """Each group cut into its node-groups' members, in rank order: [group][node part][j];
    None when a group lies in one PaRO group or its parts differ in size (no hierarchy)."""
    per = spec.gpus_per_node * spec.group_nodes
    out = []
    for grp in groups:
        parts: dict[int, list[int]] = {}
        for r in grp:
            parts.setdefault(r // per, []).append(r)
        sizes = {len(p) for p in parts.values()}
        if len(parts) < 2 or len(sizes) != 1 or sizes == {1}:
            return None
        out.append([parts[key] for key in sorted(parts)])
    return out


def _hierarchical(spec: ClusterSpec, size: float, chunks: int, parts: list[list[list[int]]],
                  scope: Scope) -> Program:
    ng, m = len(parts[0]), len(parts[0][0])
    n = ng * m
    check_flows(len(parts) * n * (ng - 1 + m - 1))
    inter = [(p[g][j], p[h][j]) for p in parts for g in range(ng) for h in range(ng) if g != h
             for j in range(m)]
    intra = [(p[g][j], p[g][q]) for p in parts for g in range(ng) for j in range(m)
             for q in range(m) if j != q]
    lane_a, lane_b = ("inter", "intra") if chunks > 1 else ("main", "main")
    pa = _phase(spec, "", inter, "inter", n, m * size / n / chunks, lane_a)
    pb = _phase(spec, "", intra, "intra", n, ng * size / n / chunks, lane_b)
    ph: list[Phase] = []
    for c in range(chunks):
        ph.append(replace(pa, name=f"rdma a2a c{c}"))
        ph.append(replace(pb, name=f"nvlink a2a c{c}", deps=(len(ph) - 1,)))
    return Program(Op.ALL_TO_ALL, scope, Algo.HIERARCHICAL_A2A, size, n, tuple(ph), chunks)


def lower_hierarchical(spec: ClusterSpec, scope: Scope, size: float,
                       chunks: int | None = None,
                       groups: list[list[int]] | None = None) -> Program:
    """The two-stage RDMA + NVLink all-to-all (module docstring); p2p without a hierarchy
    (a group inside one PaRO group of nodes, or spread unevenly over them)."""
    groups = groups_of(spec, scope) if groups is None else groups
    parts = _split(spec, groups)
    if parts is None:
        return replace(lower_p2p(spec, scope, size, groups=groups),
                       algo=Algo.HIERARCHICAL_A2A)
    if chunks is not None:
        return _hierarchical(spec, size, chunks, parts, scope)
    best, best_t = None, float("inf")
    for k in range(1, spec.collective.ho_ring_max_chunks + 1):
        prog = _hierarchical(spec, size, k, parts, scope)
        t = program_time(spec, prog)
        if t < best_t * (1 - 1e-12):
            best, best_t = prog, t
    return best


def lower_alltoall(spec: ClusterSpec, scope: Scope, size: float, algo: Algo,
                   groups: list[list[int]] | None = None) -> Program:
    """Lower an all-to-all with ``algo``: p2p (``nccl`` runs the same), hierarchical-a2a;
    over the scope's groups, or over explicit ``groups`` (an EP layout's)."""
    if algo is Algo.HIERARCHICAL_A2A:
        return lower_hierarchical(spec, scope, size, groups=groups)
    return lower_p2p(spec, scope, size, algo, groups=groups)
