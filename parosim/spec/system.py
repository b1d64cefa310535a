"""Frozen specifications, SI units in field names, validated on construction.

A :class:`ClusterSpec` describes hardware; models, strategies and training configuration have
their own modules. Specs are plain data: the engine never mutates them. Parsing from YAML (with
unit strings) lives in :mod:`parosim.io`; here every value is already a number in SI units.
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass, field, replace
from functools import lru_cache

from ..errors import InputError
from .compute import ComputeProfile


class IntraFabric(str, enum.Enum):
    """How GPUs of one node reach each other."""

    NVSWITCH = "nvswitch"        # every GPU has its own NVLink bandwidth to an NVSwitch (DGX)
    PCIE_SWITCH = "pcie-switch"  # GPUs share a PCIe switch (no NVLink): intra class is "pcie"


class NetworkFabric(str, enum.Enum):
    """How nodes reach each other."""

    SINGLE_SWITCH = "single-switch"  # all NICs on one non-blocking switch
    LEAF_SPINE = "leaf-spine"        # leaves of nodes_per_leaf nodes, uplinks / oversubscription
    RAIL = "rail"                    # NIC k of every node on rail switch k; rails joined by a spine


# The largest cluster the simulator accepts (docs/limits.md): 131,072 GPUs. Every mode's cost
# grows about linearly in the GPU count (the O(n) ring sets); an engine run on a homogeneous
# cluster builds only the folded part of its graph (parosim.fabric.folded), a heterogeneous
# one the whole graph (~1.1 million links at this size). The check runs when a spec is
# built, before any graph or ring is.
MAX_GPUS = 131072


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise InputError(msg)


def _pos(value: float, name: str, allow_zero: bool = False) -> None:
    ok = math.isfinite(value) and (value >= 0 if allow_zero else value > 0)
    _require(ok, f"{name} = {value!r} must be {'non-negative' if allow_zero else 'positive'}")


#: Compute jitter: lognormal factors of mean 1 and coefficient of variation cv in [0, 1].
#: Beyond 1 the median draw is under 0.71 x the mean and single ops of 10x the mean are
#: routine: that is not jitter but failures (``parosim run``). 1e10 would make almost every
#: op ~0 and a few overflow the clock, a step faster than without jitter.
MAX_JITTER_CV = 1.0
#: An override's GPU speed factor (compute time x 1/speed): 0.01 (a GPU 100x slower; slower
#: is a failure) to 2 (faster GPU types belong in ``gpu: {model: ...}``; beyond 1 / efficiency
#: the MFU would exceed 1).
SPEED_RANGE = (0.01, 2.0)


def check_jitter_cv(cv: float, name: str) -> None:
    """Refuse a jitter cv outside [0, :data:`MAX_JITTER_CV`] (also NaN), with one line."""
    if not (0 <= cv <= MAX_JITTER_CV):
        raise InputError(f"{name} = {cv!r} must be in [0, {MAX_JITTER_CV:g}] (the lognormal "
                         "coefficient of variation of compute jitter; larger is not jitter)")


@dataclass(frozen=True)
class GPUSpec:
    """One accelerator. ``peak_flops`` is dense bf16/fp16 FLOP/s from the datasheet.
    ``peak_fp8_flops``: dense FP8 tensor-core FLOP/s (datasheet, no sparsity); 0 = the GPU
    has no FP8 tensor cores (``TrainingSpec(precision="fp8")`` is then refused)."""

    model: str = "A100-SXM4-80GB"
    # A100-SXM4-80GB nvidia-smi total: 81920MiB (github.com/allenai/PeerRead/issues/40)
    memory_bytes: int = 81920 * 2**20
    peak_flops: float = 312e12
    hbm_bandwidth_Bps: float = 2.0e12
    peak_fp8_flops: float = 0.0

    def __post_init__(self) -> None:
        _pos(self.memory_bytes, "gpu.memory")
        _pos(self.peak_flops, "gpu.peak_tflops")
        _pos(self.hbm_bandwidth_Bps, "gpu.hbm_bandwidth")
        _pos(self.peak_fp8_flops, "gpu.peak_fp8_tflops", allow_zero=True)


@dataclass(frozen=True)
class LinkSpec:
    """A link class: per-direction bandwidth and one-way latency of the class's hop(s)."""

    bandwidth_Bps: float
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        _pos(self.bandwidth_Bps, "bandwidth")
        _pos(self.latency_s, "latency", allow_zero=True)


@dataclass(frozen=True)
class NICSpec:
    """NICs of one node; GPU j uses NIC ``j * per_node // gpus_per_node``.

    ``latency_s`` is the NIC-to-NIC one-way latency through one switch (half on each side).
    """

    per_node: int = 1
    bandwidth_Bps: float = 12.5e9
    latency_s: float = 5e-6

    def __post_init__(self) -> None:
        _require(isinstance(self.per_node, int) and self.per_node >= 0,
                 f"nic.per_node = {self.per_node!r} must be a non-negative integer")
        _pos(self.bandwidth_Bps, "nic.bandwidth")
        _pos(self.latency_s, "nic.latency", allow_zero=True)


@dataclass(frozen=True)
class NetworkSpec:
    """Inter-node fabric. ``oversubscription`` = downlink capacity / uplink capacity of a leaf
    (or of a rail switch towards the spine); 1 is non-blocking."""

    fabric: NetworkFabric = NetworkFabric.SINGLE_SWITCH
    nodes_per_leaf: int = 0          # leaf-spine only
    oversubscription: float = 1.0
    uplink_latency_s: float = 1e-6   # one switch-to-switch hop
    # leaf-spine only: 0 = one logical spine (a leaf's uplinks are one bundle, ideal
    # spreading); S >= 1 = S explicit spine switches, one uplink from each leaf to each, of
    # (downlink capacity) / oversubscription / S. ``ecmp`` picks how a flow crossing the
    # spine layer uses them: "ideal" splits it evenly over every shortest path (fluid),
    # "hash" puts it on one path drawn by a numpy Generator seeded with
    # (ecmp_seed, src rank, dst rank), so hash collisions show (docs/heterogeneity.md).
    spines: int = 0
    ecmp: str = "ideal"
    ecmp_seed: int = 0

    def __post_init__(self) -> None:
        _pos(self.oversubscription, "network.oversubscription")
        _pos(self.uplink_latency_s, "network.uplink_latency", allow_zero=True)
        _require(isinstance(self.spines, int) and not isinstance(self.spines, bool)
                 and self.spines >= 0,
                 f"network.spines = {self.spines!r} must be a non-negative integer")
        _require(self.ecmp in ("ideal", "hash"),
                 f"network.ecmp = {self.ecmp!r} is not known; expected ideal or hash")
        _require(isinstance(self.ecmp_seed, int) and not isinstance(self.ecmp_seed, bool)
                 and self.ecmp_seed >= 0,
                 f"network.ecmp_seed = {self.ecmp_seed!r} must be a non-negative integer")
        if self.spines or self.ecmp != "ideal":
            _require(self.fabric is NetworkFabric.LEAF_SPINE,
                     f"network.spines / network.ecmp apply to a leaf-spine fabric, not "
                     f"{self.fabric.value!r}; expected fabric: leaf-spine")
        if self.ecmp == "hash":
            _require(self.spines >= 1, "network.ecmp = 'hash' needs explicit spine "
                     "switches; expected network.spines >= 1")
        if self.fabric is NetworkFabric.LEAF_SPINE:
            _require(isinstance(self.nodes_per_leaf, int) and self.nodes_per_leaf > 0,
                     f"network.nodes_per_leaf = {self.nodes_per_leaf!r} must be a positive "
                     "integer for a leaf-spine fabric")


@dataclass(frozen=True)
class ProtocolCost:
    """Cost of one NCCL (algorithm, protocol) pair, as NCCL's own tuning model states it.

    ``bw_efficiency``: fraction of the link bandwidth that carries data (NCCL's busBw
    refinements: LL 1/4, LL128 0.92, Simple 1; tree x 0.92). ``base_latency_s``: fixed cost per
    call (NCCL ``baseLat``). ``nvlink_latency_s`` / ``pcie_latency_s`` / ``net_latency_s``: cost
    per ring step (tree level) over that link type (NCCL ``hwLat``), added to the wire latency of
    the hop. ``max_bw_per_channel_Bps``: bus-bandwidth cap per channel (``perChMax*Bws``);
    ``max_bw_Bps``: cap for the whole call (``llMaxBws``); ``inf`` = none. NCCL takes them
    from a row per node count (1, 2, more): the plain fields are the > 2-node row, the
    ``_1node`` / ``_2node`` fields the others (:meth:`caps`).
    Defaults and sources: :mod:`parosim.collectives.nccl` and docs/collectives.md.
    """

    bw_efficiency: float = 1.0
    base_latency_s: float = 0.0
    nvlink_latency_s: float = 0.0
    pcie_latency_s: float = 0.0
    net_latency_s: float = 0.0
    max_bw_per_channel_Bps: float = math.inf
    max_bw_Bps: float = math.inf
    max_bw_per_channel_1node_Bps: float = math.inf
    max_bw_per_channel_2node_Bps: float = math.inf
    max_bw_1node_Bps: float = math.inf
    max_bw_2node_Bps: float = math.inf

    def caps(self, nodes: int) -> tuple[float, float]:
        """(per-channel cap, whole-call cap) in B/s for a communicator over ``nodes`` nodes."""
        if nodes <= 1:
            return self.max_bw_per_channel_1node_Bps, self.max_bw_1node_Bps
        if nodes == 2:
            return self.max_bw_per_channel_2node_Bps, self.max_bw_2node_Bps
        return self.max_bw_per_channel_Bps, self.max_bw_Bps

    def __post_init__(self) -> None:
        _require(math.isfinite(self.bw_efficiency) and 0 < self.bw_efficiency <= 1,
                 f"protocol bw_efficiency = {self.bw_efficiency!r} must be in (0, 1]")
        for name in ("base_latency_s", "nvlink_latency_s", "pcie_latency_s", "net_latency_s"):
            _pos(getattr(self, name), f"protocol {name[:-2]}", allow_zero=True)
        for name in ("max_bw_per_channel_Bps", "max_bw_Bps", "max_bw_per_channel_1node_Bps",
                     "max_bw_per_channel_2node_Bps", "max_bw_1node_Bps", "max_bw_2node_Bps"):
            v = getattr(self, name)
            _require(v > 0 and not math.isnan(v),
                     f"protocol {name[:-4]} = {v!r} must be positive (or inf: no cap)")


# NCCL 2.20.3, src/graph/tuning.cc (commit b6475625fbcaa2c3c0e50eed2fa1255d7514d4a2):
# baseLat, hwLat (NVLink / PCI / NET), busBw refinements and per-channel caps, Ampere rows
# (1 node / 2 nodes / more) and the Intel-CPU llMaxBws rows for several nodes. Latencies in us
# there, seconds here; bandwidths GB/s -> B/s. Hopper and AMD rows: see topologies/.
_US, _GB = 1e-6, 1e9
_INF = math.inf
NCCL_RING_LL = ProtocolCost(0.25, 6.6 * _US, 0.6 * _US, 1.0 * _US, 2.7 * _US,
                            _INF, 20.4 * _GB, _INF, _INF, 87.7 * _GB, 39.0 * _GB)
NCCL_RING_LL128 = ProtocolCost(0.92, 14.0 * _US, 1.9 * _US, 2.5 * _US, 4.0 * _US,
                               20.0 * _GB, _INF, 20.0 * _GB, 20.0 * _GB)
NCCL_RING_SIMPLE = ProtocolCost(1.0, 8.4 * _US, 3.4 * _US, 5.7 * _US, 14.0 * _US)
NCCL_TREE_LL = ProtocolCost(0.92 / 3.8, 6.8 * _US, 0.6 * _US, 1.0 * _US, 5.0 * _US,
                            17.8 * _GB / 3.8, 20.4 * _GB, 24.0 * _GB / 3.8, 23.6 * _GB / 3.8,
                            87.7 * _GB, 39.0 * _GB)
NCCL_TREE_LL128 = ProtocolCost(0.92 * 120 / 128, 14.0 * _US, 1.25 * _US, 1.9 * _US, 8.5 * _US,
                               min(17.8 * 120 / 128, 20.0) * _GB, _INF,
                               min(24.0 * 7 / 9, 20.0) * _GB,
                               min(23.6 * 120 / 128, 20.0) * _GB)
NCCL_TREE_SIMPLE = ProtocolCost(0.92, 0.0, 28.0 * _US, 28.0 * _US, 28.0 * _US, 17.8 * _GB, _INF,
                                24.0 * _GB, 23.6 * _GB)
# NCCL 2.8.3-1, src/graph/tuning.cc (NVIDIA/nccl commit 920dbe5b359fe5817b8ba874476ca4ba2dc5f1ef,
# makefiles/version.mk 2.8.3): the same fields from that release's tables, Ampere rows and the
# Intel-CPU llMaxBws rows for several nodes. Differences from 2.20.3: baseLat (tree 4.4 / 4.4 /
# 0 us, ring 3.6 / 10 / 8.4 us), hwLat (NVLink LL 0.52 tree / 0.47 ring, network ring Simple
# 9.6 us), one LL128 cap per channel for every row (ll128MaxBwPerCh, all-reduce 16.9 GB/s),
# perChMaxTreeBws 24.0 / 22.5 / 16.0 GB/s, tree LL128 x 0.915 (so its per-channel cap is
# min(0.915 x perChMaxTree, 16.9)); no netOverhead (the LL intra-node hop latency x 1.8 on
# several nodes instead, collectives.nccl), the ring Simple plateau x 1.9 from
# nRanks / 16 x 64 KiB bytes on (collectives.nccl), the tree LL128 correction row of 2.8.3.
NCCL28_RING_LL = ProtocolCost(0.25, 3.6 * _US, 0.47 * _US, 1.0 * _US, 2.7 * _US,
                              _INF, 20.4 * _GB, _INF, _INF, 87.7 * _GB, 39.0 * _GB)
NCCL28_RING_LL128 = ProtocolCost(0.92, 10.0 * _US, 1.9 * _US, 2.5 * _US, 4.0 * _US,
                                 16.9 * _GB, _INF, 16.9 * _GB, 16.9 * _GB)
NCCL28_RING_SIMPLE = ProtocolCost(1.0, 8.4 * _US, 3.4 * _US, 5.7 * _US, 9.6 * _US)
NCCL28_TREE_LL = ProtocolCost(0.92 / 3.8, 4.4 * _US, 0.52 * _US, 1.0 * _US, 5.0 * _US,
                              16.0 * _GB / 3.8, 20.4 * _GB, 24.0 * _GB / 3.8, 22.5 * _GB / 3.8,
                              87.7 * _GB, 39.0 * _GB)
NCCL28_TREE_LL128 = ProtocolCost(0.92 * 0.915, 4.4 * _US, 1.25 * _US, 1.9 * _US, 8.5 * _US,
                                 min(16.0 * 0.915, 16.9) * _GB, _INF,
                                 min(24.0 * 7 / 9, 16.9) * _GB, min(22.5 * 0.915, 16.9) * _GB)
NCCL28_TREE_SIMPLE = ProtocolCost(0.92, 0.0, 28.0 * _US, 28.0 * _US, 28.0 * _US, 16.0 * _GB, _INF,
                                  24.0 * _GB, 22.5 * _GB)
PROTOCOLS = ("ll", "ll128", "simple")
COLLECTIVE_MODELS = ("ideal", "nccl")
#: NCCL tuner profiles: the release whose tuning tables (protocol costs, plateau rule, tree
#: correction factors) the ``nccl`` model applies; "2.20" is the default (2.20.3).
NCCL_VERSIONS = ("2.20", "2.8")
#: how the ``nccl`` algorithm picks its (algorithm, protocol): "fastest" in parosim's cost,
#: or "tuner": what NCCL's own estimate picks (collectives.nccl.tuner_time)
NCCL_CHOICES = ("fastest", "tuner")


def nccl_tables(version: str) -> dict[str, object]:
    """The default NCCL-model fields of a tuner profile (``collective.nccl_version``): the six
    :class:`ProtocolCost` tables and ``net_overhead_s`` (2.8 has no netOverhead: 0).

    >>> nccl_tables("2.8")["ring_simple"].net_latency_s
    9.6e-06
    """
    if version == "2.8":
        return {"ring_ll": NCCL28_RING_LL, "ring_ll128": NCCL28_RING_LL128,
                "ring_simple": NCCL28_RING_SIMPLE, "tree_ll": NCCL28_TREE_LL,
                "tree_ll128": NCCL28_TREE_LL128, "tree_simple": NCCL28_TREE_SIMPLE,
                "net_overhead_s": 0.0}
    return {"ring_ll": NCCL_RING_LL, "ring_ll128": NCCL_RING_LL128,
            "ring_simple": NCCL_RING_SIMPLE, "tree_ll": NCCL_TREE_LL,
            "tree_ll128": NCCL_TREE_LL128, "tree_simple": NCCL_TREE_SIMPLE,
            "net_overhead_s": 1e-6}


@dataclass(frozen=True)
class EPKernelCost:
    """Cost of one family of expert-parallel dispatch / combine kernels (DeepEP's normal or
    low-latency kernels, HybridEP's; :mod:`parosim.collectives.deepep`).

    ``nvlink_efficiency`` / ``rdma_efficiency``: the fraction of the GPU's NVLink and of its
    NIC's line rate the kernel's data moves at (its copy engines are SMs, a few of them, not
    NCCL's channels). ``latency_s``: fixed cost per kernel call (launch, the layout and
    notify exchange, the last chunk's round trip), paid once before the data moves.
    The defaults are the ideal wire (1, 1, 0), an uncalibrated choice; fitted values and their
    sources are in docs/calibration.md ("Expert all-to-all kernels").
    """

    nvlink_efficiency: float = 1.0
    rdma_efficiency: float = 1.0
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("nvlink_efficiency", "rdma_efficiency"):
            v = getattr(self, name)
            _require(isinstance(v, (int, float)) and math.isfinite(v) and 0 < v <= 1,
                     f"{name} = {v!r} must be in (0, 1]")
        _pos(self.latency_s, "latency", allow_zero=True)


#: the EP kernel families of ``collective`` (cluster YAML keys)
EP_KERNELS = ("ep_normal", "ep_ll", "ep_hybrid")


@dataclass(frozen=True)
class CollectiveTuning:
    """Software costs of the communication library, added to the wire model.

    ``step_latency_s``: fixed cost per ring step (kernel/protocol overhead), on top of the
    path's wire latency. ``call_overhead_s``: fixed cost per collective call (launch, setup).
    ``phase_overhead_s``: fixed cost per ring phase launched (a kernel launch per chunk in
    NCCL, an op set-up in gloo); it is what makes many small HO-Ring chunks expensive.
    All default to 0 (datasheet presets); :mod:`parosim.validate` fits them from measurements.

    ``chain_chunk_bytes``: bytes a pipelined chain (a broadcast) moves per step and channel;
    a chain's first chunk crosses its k - 1 hops before the last rank has any data, so a
    broadcast pays k - 1 hop times of one chunk on top of its ring cost (0 = off: a broadcast
    costs what the all-gather of its buffer costs; :func:`parosim.collectives.chain_fill_s`).

    ``serial_progress``: the latency and launch parts of concurrent phases cannot overlap on a
    rank, because one CPU thread drives all of them (gloo on CPU ranks: the emulated cluster).
    False for NCCL on GPUs, whose concurrent kernels progress independently.
    """

    step_latency_s: float = 0.0
    call_overhead_s: float = 0.0
    ho_ring_max_chunks: int = 64
    phase_overhead_s: float = 0.0
    serial_progress: bool = False
    chain_chunk_bytes: float = 0.0
    # NCCL model (docs/collectives.md). "ideal": wire alpha-beta only (the fields below unused);
    # "nccl": every phase pays a protocol's latency/bandwidth and the reduction's HBM traffic.
    model: str = "ideal"
    channels: int = 0                   # NCCL channels; 0 = auto (see collectives.nccl)
    protocols: tuple[str, ...] = PROTOCOLS  # NCCL_PROTO: the protocols the tuner may pick
    algorithms: tuple[str, ...] = ("ring", "tree")  # NCCL_ALGO for the `nccl` algorithm
    reduction_hbm_factor: float = 3.0   # HBM bytes moved per reduced byte (2 reads, 1 write)
    reduction_overlap: bool = True      # fused into the copy (max) / charged after it (sum)
    net_overhead_s: float = 1e-6        # NCCL netOverhead: floor of an inter-node ring's
                                        # intra steps (x 3 for Simple); tuning.cc, Intel x86
    ring_ll: ProtocolCost = NCCL_RING_LL
    ring_ll128: ProtocolCost = NCCL_RING_LL128
    ring_simple: ProtocolCost = NCCL_RING_SIMPLE
    tree_ll: ProtocolCost = NCCL_TREE_LL
    tree_ll128: ProtocolCost = NCCL_TREE_LL128
    tree_simple: ProtocolCost = NCCL_TREE_SIMPLE
    # expert-parallel dispatch / combine kernels (collectives.deepep): normal, low-latency
    ep_normal: EPKernelCost = EPKernelCost()
    ep_ll: EPKernelCost = EPKernelCost()
    ep_hybrid: EPKernelCost = EPKernelCost()   # HybridEP's kernels (the normal kernels' shape)
    # the tuner profile (NCCL release of the tables above: the cluster YAML fills them from
    # collective.nccl_version) and how the `nccl` algorithm chooses (docs/collectives.md)
    nccl_version: str = "2.20"
    choice: str = "fastest"
    # the link rates NCCL's tuner sees (its topology search): per GPU over the node's link,
    # per node over its NICs; 0 = the cluster's intra_node.bandwidth / nic.per_node x
    # nic.bandwidth (a fit pins them at its fitted links: calibrate.links.fit)
    tuner_intra_bandwidth_Bps: float = 0.0
    tuner_net_bandwidth_Bps: float = 0.0

    def protocol(self, algorithm: str, proto: str) -> ProtocolCost:
        """The :class:`ProtocolCost` of ("ring" | "tree", "ll" | "ll128" | "simple")."""
        return getattr(self, f"{algorithm}_{proto}")

    def __post_init__(self) -> None:
        _require(self.model in COLLECTIVE_MODELS,
                 f"collective.model = {self.model!r} is not known; expected one of "
                 f"{', '.join(COLLECTIVE_MODELS)}")
        _require(isinstance(self.channels, int) and not isinstance(self.channels, bool)
                 and 0 <= self.channels <= 64,
                 f"collective.channels = {self.channels!r} must be an integer in 0..64 "
                 "(0 = auto)")
        _require(bool(self.protocols) and all(p in PROTOCOLS for p in self.protocols),
                 f"collective.protocols = {list(self.protocols)!r}: expected a non-empty list "
                 f"of {', '.join(PROTOCOLS)}")
        _require(bool(self.algorithms) and all(a in ("ring", "tree") for a in self.algorithms),
                 f"collective.algorithms = {list(self.algorithms)!r}: expected a non-empty "
                 "list of ring, tree")
        _require(self.nccl_version in NCCL_VERSIONS,
                 f"collective.nccl_version = {self.nccl_version!r} is not a known tuner "
                 f"profile; expected one of {', '.join(NCCL_VERSIONS)}")
        _require(self.choice in NCCL_CHOICES,
                 f"collective.choice = {self.choice!r} is not known; expected one of "
                 f"{', '.join(NCCL_CHOICES)}")
        _pos(self.tuner_intra_bandwidth_Bps, "collective.tuner_intra_bandwidth",
             allow_zero=True)
        _pos(self.tuner_net_bandwidth_Bps, "collective.tuner_net_bandwidth", allow_zero=True)
        _pos(self.reduction_hbm_factor, "collective.reduction_hbm_factor", allow_zero=True)
        _pos(self.net_overhead_s, "collective.net_overhead", allow_zero=True)
        _pos(self.step_latency_s, "collective.step_latency", allow_zero=True)
        _pos(self.call_overhead_s, "collective.call_overhead", allow_zero=True)
        _pos(self.phase_overhead_s, "collective.phase_overhead", allow_zero=True)
        _pos(self.chain_chunk_bytes, "collective.chain_chunk", allow_zero=True)
        _require(isinstance(self.ho_ring_max_chunks, int)
                 and not isinstance(self.ho_ring_max_chunks, bool)
                 and 1 <= self.ho_ring_max_chunks <= 4096,
                 f"collective.ho_ring_max_chunks = {self.ho_ring_max_chunks!r} must be an "
                 "integer in [1, 4096]")


@dataclass(frozen=True)
class Override:
    """One entry of a cluster's ``overrides:`` list (applied in order after its own fields).

    Exactly one selection: ``nodes`` (node indices), ``gpus`` (names ``n{i}/gpu{j}``) or
    ``links`` (pairs of graph node names, both directions). Fields left ``None`` are kept.

    * nodes: ``nic_bandwidth_Bps``, ``nic_latency_s`` (the NIC-to-switch links of those
      nodes), ``intra_bandwidth_Bps``, ``intra_latency_s`` (their NVLink / PCIe-switch links),
      ``gpu`` (another GPU type for every GPU of the node), ``speed``, ``memory_bytes``;
    * gpus: ``gpu``, ``speed`` (compute-time factor 1/speed), ``memory_bytes``;
    * links: ``bandwidth_Bps``, ``latency_s`` (per direction, one-way), ``failed`` (removed).
    """

    nodes: tuple[int, ...] = ()
    gpus: tuple[str, ...] = ()
    links: tuple[tuple[str, str], ...] = ()
    nic_bandwidth_Bps: float | None = None
    nic_latency_s: float | None = None
    intra_bandwidth_Bps: float | None = None
    intra_latency_s: float | None = None
    gpu: GPUSpec | None = None
    speed: float | None = None
    memory_bytes: int | None = None
    bandwidth_Bps: float | None = None
    latency_s: float | None = None
    failed: bool = False

    def __post_init__(self) -> None:
        sel = [k for k in ("nodes", "gpus", "links") if getattr(self, k)]
        _require(len(sel) == 1, f"override selects {' and '.join(sel) or 'nothing'}; "
                 "expected exactly one of nodes, gpus or links")
        allowed = {"nodes": ("nic_bandwidth_Bps", "nic_latency_s", "intra_bandwidth_Bps",
                             "intra_latency_s", "gpu", "speed", "memory_bytes"),
                   "gpus": ("gpu", "speed", "memory_bytes"),
                   "links": ("bandwidth_Bps", "latency_s", "failed")}[sel[0]]
        for f in ("nic_bandwidth_Bps", "nic_latency_s", "intra_bandwidth_Bps",
                  "intra_latency_s", "gpu", "speed", "memory_bytes", "bandwidth_Bps",
                  "latency_s", "failed"):
            v = getattr(self, f)
            if v not in (None, False) and f not in allowed:
                raise InputError(f"override on {sel[0]} cannot set {f}; expected one of "
                                 f"{', '.join(allowed)}")
        for f in ("nic_bandwidth_Bps", "intra_bandwidth_Bps", "speed", "memory_bytes",
                  "bandwidth_Bps"):
            if getattr(self, f) is not None:
                _pos(getattr(self, f), f"override {f}")
        for f in ("nic_latency_s", "intra_latency_s", "latency_s"):
            if getattr(self, f) is not None:
                _pos(getattr(self, f), f"override {f}", allow_zero=True)
        lo, hi = SPEED_RANGE
        _require(self.speed is None or lo <= self.speed <= hi,
                 f"speed = {self.speed!r} must be in [{lo:g}, {hi:g}] (a compute-time factor "
                 "1/speed; another GPU type goes in gpu: {model: ...})")
        if self.failed:
            _require(self.bandwidth_Bps is None and self.latency_s is None,
                     "override of a failed link cannot also set its bandwidth or latency")

    @property
    def touches_network(self) -> bool:
        return any(getattr(self, f) is not None for f in (
            "nic_bandwidth_Bps", "nic_latency_s", "intra_bandwidth_Bps", "intra_latency_s",
            "bandwidth_Bps", "latency_s")) or self.failed

    @property
    def touches_compute(self) -> bool:
        return self.speed is not None or self.gpu is not None


@dataclass(frozen=True)
class ClusterSpec:
    """A homogeneous GPU cluster.

    ``group_nodes`` is the number of nodes in one PaRO group (default 1: a group is a node).

    >>> c = ClusterSpec(name="x", nodes=4, gpus_per_node=8)
    >>> c.gpus, c.group_size, c.groups
    (32, 8, 4)
    """

    name: str = "custom"
    nodes: int = 1
    gpus_per_node: int = 8
    gpu: GPUSpec = field(default_factory=GPUSpec)
    intra_fabric: IntraFabric = IntraFabric.NVSWITCH
    intra: LinkSpec = field(default_factory=lambda: LinkSpec(250e9, 2e-6))
    pcie: LinkSpec = field(default_factory=lambda: LinkSpec(32e9, 0.0))
    nic: NICSpec = field(default_factory=NICSpec)
    network: NetworkSpec = field(default_factory=NetworkSpec)
    collective: CollectiveTuning = field(default_factory=CollectiveTuning)
    group_nodes: int = 1
    notes: str = ""
    compute: ComputeProfile = field(default_factory=ComputeProfile)
    overlap_slowdown: float | None = None   # compute slowdown beside collectives; None = the
    #                                         runtime's default (parosim.spec.runtime)
    # heterogeneity (docs/heterogeneity.md): per node / GPU / link overrides, applied in
    # order by the topology builders; compute jitter: each compute op of each rank takes a
    # lognormal factor of mean 1 and coefficient of variation ``jitter_cv`` (0 = none)
    overrides: tuple[Override, ...] = ()
    jitter_cv: float = 0.0
    # the node counts of the runs a calibration fitted this cluster's costs on (parosim
    # calibrate writes them; empty: not calibrated across node counts); a run on more nodes
    # than the largest is an extrapolation of the scale-dependent costs, and says so
    calibrated_nodes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        o = self.overlap_slowdown
        if o is not None:
            _require(not isinstance(o, bool) and isinstance(o, (int, float))
                     and math.isfinite(o) and o >= 1,
                     f"compute.overlap_slowdown = {o!r} must be a factor >= 1")
        for name in ("nodes", "gpus_per_node", "group_nodes"):
            v = getattr(self, name)
            _require(isinstance(v, int) and not isinstance(v, bool) and v >= 1,
                     f"{name} = {v!r} must be a positive integer")
        for v in self.calibrated_nodes:
            _require(isinstance(v, int) and not isinstance(v, bool) and v >= 1,
                     f"calibrated_nodes: {v!r} must be a positive integer (a node count)")
        _require(self.nodes * self.gpus_per_node <= MAX_GPUS,
                 f"cluster {self.name!r} with {self.nodes} nodes x {self.gpus_per_node} GPUs "
                 f"has more than {MAX_GPUS} GPUs, the simulator's limit; expected at most "
                 f"{max(1, MAX_GPUS // self.gpus_per_node)} nodes")
        _require(self.nodes % self.group_nodes == 0,
                 f"group_nodes = {self.group_nodes} (nodes per PaRO group) does not divide the "
                 f"{self.nodes} nodes of cluster {self.name!r}; expected a divisor of "
                 f"{self.nodes}")
        if self.nodes > 1:
            _require(self.nic.per_node >= 1,
                     f"cluster {self.name!r} has {self.nodes} nodes but nic.per_node = 0: the "
                     "nodes would be disconnected; expected at least one NIC per node")
        _require(self.nic.per_node <= self.gpus_per_node,
                 f"nic.per_node = {self.nic.per_node} is more than gpus_per_node = "
                 f"{self.gpus_per_node}: a GPU uses one NIC, so the extra NICs would stay idle; "
                 f"expected at most {self.gpus_per_node}")
        if self.network.fabric is NetworkFabric.LEAF_SPINE:
            per_leaf = self.network.nodes_per_leaf
            _require(self.nodes <= per_leaf or self.nodes % per_leaf == 0,
                     f"network.nodes_per_leaf = {per_leaf} does not divide the {self.nodes} "
                     f"nodes of cluster {self.name!r} (a partly filled last leaf would give "
                     "its nodes more uplink per node than the others: not a homogeneous "
                     "cluster); "
                     f"expected a node count that is a multiple of {per_leaf} or at most "
                     f"{per_leaf}")
        if self.nic.per_node:
            _require(self.gpus_per_node % self.nic.per_node == 0
                     or self.nic.per_node % self.gpus_per_node == 0,
                     f"nic.per_node = {self.nic.per_node} and gpus_per_node = "
                     f"{self.gpus_per_node}: expected one to divide the other")
        check_jitter_cv(self.jitter_cv, "jitter.cv")
        for k, o in enumerate(self.overrides):
            _require(isinstance(o, Override), f"overrides[{k}] = {o!r} is not an Override")
            for i in o.nodes:
                _require(isinstance(i, int) and not isinstance(i, bool)
                         and 0 <= i < self.nodes,
                         f"overrides[{k}].nodes: node {i!r} is outside the cluster's "
                         f"{self.nodes} nodes; expected 0..{self.nodes - 1}")
            for name in o.gpus:
                _require(self.rank_of(name) is not None,
                         f"overrides[{k}].gpus: {name!r} is not a GPU of this cluster; "
                         f"expected n<node>/gpu<j> with node < {self.nodes} and j < "
                         f"{self.gpus_per_node}")

    def rank_of(self, gpu_name: str) -> int | None:
        """Global rank of ``n{i}/gpu{j}`` (None if it is not a GPU of this cluster)."""
        m = re.fullmatch(r"n(\d+)/gpu(\d+)", str(gpu_name))
        if not m:
            return None
        i, j = int(m.group(1)), int(m.group(2))
        return i * self.gpus_per_node + j if i < self.nodes and j < self.gpus_per_node \
            else None

    @property
    def network_heterogeneous(self) -> bool:
        """Some override changes a link: the closed forms, which assume every link of a
        class equal, do not apply."""
        return any(o.touches_network for o in self.overrides)

    @property
    def closed_form_exact(self) -> bool:
        """The alpha-beta closed forms (collectives/cost.py, the analytic mode) hold: every
        link of a class equal and ideal ECMP spreading. False with link overrides or ECMP
        hashing; callers then refuse the closed form or report it as None."""
        return not self.network_heterogeneous and self.network.ecmp != "hash"

    @property
    def compute_heterogeneous(self) -> bool:
        """Some GPU computes at another speed: ranks need their own timelines."""
        return any(o.touches_compute for o in self.overrides)

    def gpu_specs(self) -> list[tuple[GPUSpec, float, int]]:
        """Per rank: (GPU type, speed factor, memory bytes) after the overrides."""
        out = [(self.gpu, 1.0, self.gpu.memory_bytes)] * self.gpus
        gpn = self.gpus_per_node
        for o in self.overrides:
            ranks = [i * gpn + j for i in o.nodes for j in range(gpn)]
            ranks += [self.rank_of(n) for n in o.gpus]
            for r in ranks:
                g, sp, mem = out[r]
                if o.gpu is not None:
                    g, mem = o.gpu, o.gpu.memory_bytes
                if o.speed is not None:
                    sp = o.speed
                if o.memory_bytes is not None:
                    mem = o.memory_bytes
                out[r] = (g, sp, mem)
        return out

    @property
    def min_gpu_memory_bytes(self) -> int:
        """The smallest GPU memory after overrides (the one that decides whether a
        data-parallel configuration fits: every rank holds the same shard sizes)."""
        if not self.overrides:
            return self.gpu.memory_bytes
        return min(mem for _, _, mem in self.gpu_specs())

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def group_size(self) -> int:
        """m: GPUs per group."""
        return self.group_nodes * self.gpus_per_node

    @property
    def groups(self) -> int:
        """ng = n / m."""
        return self.nodes // self.group_nodes

    def __hash__(self) -> int:
        """Cached (specs key many caches; hashing the nested fields each time is slow)."""
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(tuple(getattr(self, f) for f in self.__dataclass_fields__))
            self.__dict__["_hash"] = h
        return h

    def with_nodes(self, nodes: int) -> ClusterSpec:
        """The same cluster with another node count (the CLI's ``--nodes``)."""
        return replace(self, nodes=nodes)

    def with_group_nodes(self, group_nodes: int) -> ClusterSpec:
        """The same cluster with groups of ``group_nodes`` nodes (``--group-nodes``); one
        object per (cluster, group size), so the caches keyed by it hit at once."""
        if type(group_nodes) is not int:   # validated (and refused) by the constructor
            return replace(self, group_nodes=group_nodes)
        return _with_group_nodes(self, group_nodes)

    def nic_of(self, local: int) -> int:
        """Index of the NIC used by GPU ``local`` of a node."""
        return local * self.nic.per_node // self.gpus_per_node


@lru_cache(maxsize=256)
def _with_group_nodes(spec: ClusterSpec, group_nodes: int) -> ClusterSpec:
    return replace(spec, group_nodes=group_nodes)
