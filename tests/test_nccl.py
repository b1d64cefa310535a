"""The NCCL collective model: channels over NICs, protocols, Tree, the `nccl` tuner."""

import math
import subprocess
import sys
from dataclasses import replace

import pytest
import yaml

from parosim.collectives import Algo, Op, Scope, lower, program_time, simulate_collective
from parosim.collectives.lowering import NCCL
from parosim.collectives.nccl import channel_rings, channels, log2i
from parosim.io.cluster import cluster_from_dict, cluster_to_yaml, load_cluster
from parosim.spec.collective import RING_OPS
from parosim.spec.system import NCCL_RING_SIMPLE, NCCL_TREE_LL

KiB, MiB, GiB = 2**10, 2**20, 2**30


def tuned(spec, **kw):
    return replace(spec, collective=replace(spec.collective, **kw))


@pytest.mark.parametrize("preset,nic_GBps", [("dgx-a100-ib", 25.0), ("dgx-h100-ib", 50.0)])
def test_flat_ring_uses_every_nic_of_a_node(preset, nic_GBps):
    """1 GiB all-reduce, flat ring, 2 nodes of 8 GPUs with 8 NICs each: busbw reaches the
    node's 8 NICs together (8 x 200 or 8 x 400 Gbps), not one NIC."""
    spec = load_cluster(preset, nodes=2)
    r = simulate_collective(spec, Op.ALL_REDUCE, Scope.GLOBAL, GiB, Algo.RING)
    all_nics = 8 * nic_GBps
    assert 0.9 * all_nics < r.busbw_GBps <= all_nics
    assert r.busbw_GBps > 7 * nic_GBps  # ~8x what one NIC could give
    # the same cluster with a single NIC per node is NIC-bound at one NIC
    one = replace(spec, nic=replace(spec.nic, per_node=1))
    r1 = simulate_collective(one, Op.ALL_REDUCE, Scope.GLOBAL, GiB, Algo.RING)
    assert r1.busbw_GBps <= nic_GBps


def test_channel_rings_stay_on_their_rail():
    spec = load_cluster("dgx-a100-ib", nodes=4)
    rings = channel_rings(spec, list(range(4)))
    assert len(rings) == 8
    gpn = 8
    for ring in rings:
        assert sorted(ring) == list(range(32))
        for a, b in zip(ring, ring[1:] + ring[:1], strict=True):
            if a // gpn != b // gpn:  # inter-node hop: same local GPU, same NIC / rail
                assert a % gpn == b % gpn
    # every NIC carries one ring out of every node
    outs = [(a // gpn, a % gpn) for ring in rings
            for a, b in zip(ring, ring[1:] + ring[:1], strict=True) if a // gpn != b // gpn]
    assert sorted(outs) == sorted((n, j) for n in range(4) for j in range(8))


@pytest.mark.parametrize("preset,nodes", [("dgx-h100-ib", 4), ("paper-a100-roce", 8),
                                          ("eth-2tier-a100", 16)])
@pytest.mark.parametrize("op", list(RING_OPS))
@pytest.mark.parametrize("size", [8, 64 * KiB, 4 * MiB, 256 * MiB, 2 * GiB])
def test_nccl_never_slower_than_any_algorithm_protocol_it_could_pick(preset, nodes, op, size):
    spec = load_cluster(preset, nodes=nodes)
    cands = NCCL().candidates(spec, op, Scope.GLOBAL, size)
    assert len(cands) == (6 if op is Op.ALL_REDUCE else 3)
    best = min(program_time(spec, p) for p in cands)
    chosen = lower(spec, op, Scope.GLOBAL, size, Algo.NCCL)
    assert program_time(spec, chosen) == pytest.approx(best, rel=1e-12)
    r = simulate_collective(spec, op, Scope.GLOBAL, size, Algo.NCCL)
    assert r.choice == chosen.choice
    assert r.time_s <= best * 1.01
    # and never slower than the plain ring with its own per-phase protocol choice
    ring = simulate_collective(spec, op, Scope.GLOBAL, size, Algo.RING)
    assert r.time_s <= ring.time_s * 1.01


def test_tuner_picks_like_nccl_small_latency_large_bandwidth():
    spec = load_cluster("dgx-a100-ib", nodes=8)
    small = lower(spec, Op.ALL_REDUCE, Scope.GLOBAL, 8, Algo.NCCL).choice
    large = lower(spec, Op.ALL_REDUCE, Scope.GLOBAL, 4 * GiB, Algo.NCCL).choice
    assert small.endswith("/ll")          # LL: lowest latency
    assert large == "ring/simple"        # Simple ring: full bandwidth
    ag = lower(spec, Op.ALL_GATHER, Scope.GLOBAL, 8, Algo.NCCL).choice
    assert ag == "ring/ll"               # no tree for all-gather


def test_ring_protocol_latency_is_nccl_formula():
    """One node, NVLink only, LL: base + steps x max(wire, hwLat); bandwidth x 1/4."""
    spec = tuned(load_cluster("dgx-a100-ib", nodes=1), protocols=("ll",),
                 reduction_hbm_factor=0.0)
    size = 8 * MiB
    t = program_time(spec, lower(spec, Op.ALL_GATHER, Scope.GLOBAL, size, Algo.RING))
    k = 8
    ll = spec.collective.ring_ll
    # llMaxBws rows: one node 87.7 GB/s (by GPU), 2 nodes 22.5, more 19.0 (the AMD CPU rows)
    assert ll.caps(1) == (math.inf, 87.7e9)
    assert ll.caps(2)[1] == 22.5e9 and ll.caps(3)[1] == ll.caps(64)[1] == 19e9
    hop = max(spec.intra.latency_s, ll.nvlink_latency_s)
    bw = min(0.25 * spec.intra.bandwidth_Bps, ll.max_bw_1node_Bps)
    expect = ll.base_latency_s + (k - 1) * hop + (k - 1) / k * size / bw
    assert t == pytest.approx(expect, rel=1e-9)


def test_simple_all_reduce_pays_plateau_and_reduction():
    spec = tuned(load_cluster("dgx-h100-ib", nodes=2), protocols=("simple",),
                 reduction_overlap=False)
    size = 64 * MiB
    p = lower(spec, Op.ALL_REDUCE, Scope.GLOBAL, size, Algo.RING)
    (ph,) = p.phases
    k = 16
    red = 3 * (k - 1) / k * size / spec.gpu.hbm_bandwidth_Bps
    assert ph.fixed_s > red  # base latency + hop latencies + reduction
    no_red = tuned(spec, reduction_hbm_factor=0.0)
    (ph0,) = lower(no_red, Op.ALL_REDUCE, Scope.GLOBAL, size, Algo.RING).phases
    assert ph.fixed_s - ph0.fixed_s == pytest.approx(red, rel=1e-9)
    assert ph0.fixed_s >= 1.4 * NCCL_RING_SIMPLE.base_latency_s  # plateau factor


def test_tree_latency_grows_with_log_nodes():
    def tree_ll(nodes):
        spec = tuned(load_cluster("paper-a100-roce", nodes=nodes), protocols=("ll",),
                     algorithms=("tree",))
        return lower(spec, Op.ALL_REDUCE, Scope.GLOBAL, 8, Algo.NCCL)

    p2, p16 = tree_ll(2), tree_ll(16)
    assert p2.choice == p16.choice == "tree/ll"
    d = p16.phases[0].fixed_s - p2.phases[0].fixed_s
    spec = load_cluster("paper-a100-roce")
    net_extra = NCCL_TREE_LL.net_latency_s - (2 * spec.pcie.latency_s + spec.nic.latency_s)
    assert d == pytest.approx(2 * (log2i(16) - log2i(2)) * max(0.0, net_extra), abs=1e-12)


def test_tree_bus_bytes_match_ring():
    """A double binary tree moves about the same bytes per node through the NICs as a ring
    (2 S out and in per node): its 1 GiB time is within 20% of the ring's (Simple both)."""
    spec = tuned(load_cluster("dgx-h100-ib", nodes=4), protocols=("simple",))
    ring, tree = (p for p in NCCL().candidates(spec, Op.ALL_REDUCE, Scope.GLOBAL, GiB))
    rt = simulate_collective(spec, Op.ALL_REDUCE, Scope.GLOBAL, GiB, Algo.RING).time_s
    from parosim.collectives import simulate_program

    tt = simulate_program(spec, tree).time_s
    assert tt == pytest.approx(program_time(spec, tree), rel=0.01)
    assert 0.8 < tt / rt < 1.25


def test_channels_auto_and_set():
    assert channels(load_cluster("dgx-h100-ib")) == 23  # ceil(450 / 20) NVLink channels
    assert channels(load_cluster("dgx-a100-ib")) == 16  # 2 per NIC
    assert channels(tuned(load_cluster("dgx-a100-ib"), channels=4)) == 4


def test_ideal_model_has_no_protocol_cost():
    spec = tuned(load_cluster("dgx-a100-ib", nodes=2), model="ideal")
    p = lower(spec, Op.ALL_REDUCE, Scope.GLOBAL, MiB, Algo.RING)
    assert all(ph.proto == "" and ph.fixed_s == 0 and ph.bw_eff == 1 for ph in p.phases)


def test_cluster_yaml_round_trip_and_fields():
    spec = load_cluster("dgx-h100-ib")
    assert spec.collective.ring_ll128.max_bw_per_channel_Bps == 36.7e9
    back = cluster_from_dict(yaml.safe_load(cluster_to_yaml(spec)))
    assert back == spec
    d = yaml.safe_load(cluster_to_yaml(spec))
    d["collective"] = {"model": "nccl", "channels": 8, "protocols": ["simple"],
                       "ring_simple": {"bw_efficiency": 0.9, "base_latency": "20us"}}
    c = cluster_from_dict(d)
    assert c.collective.channels == 8 and c.collective.protocols == ("simple",)
    assert c.collective.ring_simple.bw_efficiency == 0.9
    assert c.collective.ring_simple.base_latency_s == pytest.approx(20e-6)
    assert c.collective.ring_simple.net_latency_s == NCCL_RING_SIMPLE.net_latency_s
    assert math.isinf(c.collective.ring_simple.max_bw_Bps)


@pytest.mark.parametrize("field,value,needle", [
    ("model", "mpi", "collective.model"),
    ("protocols", ["ll", "fast"], "collective.protocols"),
    ("channels", -1, "collective.channels"),
    ("ring_ll", {"bw_efficiency": 1.5}, "bw_efficiency"),
    ("ring_ll", {"speed": 1}, "speed"),
])
def test_bad_collective_fields_one_line_exit_2(tmp_path, field, value, needle):
    d = yaml.safe_load(cluster_to_yaml(load_cluster("dgx-a100-ib")))
    d["collective"] = {field: value}
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(d))
    r = subprocess.run([sys.executable, "-m", "parosim.cli", "collective", "--cluster", str(f)],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and needle in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("scope", [Scope.GLOBAL, Scope.INTER, Scope.INTRA])
def test_tree_on_sub_communicators_engine_matches_closed_form(scope):
    """Global scope, inter scope (one GPU per node per instance) and intra scope of 2-node
    groups: Ring and Tree with every protocol are candidates, and each runs in the engine as
    costed."""
    from parosim.collectives import simulate_program

    spec = load_cluster("dgx-h100-ib", nodes=4, group_nodes=2)
    cands = NCCL().candidates(spec, Op.ALL_REDUCE, scope, 64 * MiB)
    assert sorted(p.choice for p in cands) == sorted(
        f"{a}/{p}" for a in ("ring", "tree") for p in ("ll", "ll128", "simple"))
    for p in cands:
        r = simulate_program(spec, p)
        assert r.time_s == pytest.approx(program_time(spec, p), rel=0.01), p.choice


def test_net_overhead_floors_intra_steps_of_inter_node_rings():
    base = load_cluster("dgx-h100-ib", nodes=2)
    base = replace(base, intra=replace(base.intra, latency_s=0.0))
    on, off = (tuned(base, protocols=("ll",), net_overhead_s=x) for x in (1e-6, 0.0))
    (p_on,) = lower(on, Op.ALL_GATHER, Scope.GLOBAL, MiB, Algo.RING).phases
    (p_off,) = lower(off, Op.ALL_GATHER, Scope.GLOBAL, MiB, Algo.RING).phases
    k, intra_frac = 16, 14 / 16  # each channel ring: 14 NVLink hops, 2 network hops
    assert p_on.fixed_s - p_off.fixed_s == pytest.approx(
        (k - 1) * intra_frac * (1e-6 - on.collective.ring_ll.nvlink_latency_s), rel=1e-9)
    one_node = tuned(load_cluster("dgx-h100-ib", nodes=1), protocols=("ll",))
    (p1,) = lower(one_node, Op.ALL_GATHER, Scope.GLOBAL, MiB, Algo.RING).phases
    (p0,) = lower(tuned(one_node, net_overhead_s=0.0), Op.ALL_GATHER, Scope.GLOBAL, MiB,
                  Algo.RING).phases
    assert p1.fixed_s == p0.fixed_s  # a one-node ring has no network steps to launch


def test_training_step_with_nccl_trees_runs_without_symmetry_reduction():
    """A plan whose all-reduces the tuner lowers to trees runs on the whole network (a tree
    is not translation-invariant), in the stream engine and in the per-rank engine alike."""
    from parosim.evaluate.ranks import replay_ranks
    from parosim.evaluate.replay import ProgramCache, plan_period, replay
    from parosim.plan.dataparallel import build_plan
    from parosim.spec.model import preset
    from parosim.spec.training import TrainingSpec

    spec = load_cluster("dgx-a100-ib", nodes=4)
    plan = build_plan(preset("llama-7b"), "NNN", spec, TrainingSpec(accum_steps=1))
    cache = ProgramCache(spec, Algo.NCCL)
    assert any(cache.get(op).tree for op in plan.ops if hasattr(op, "scope"))
    assert plan_period(plan, spec, cache) == 4
    assert plan_period(plan, spec, ProgramCache(spec, Algo.RING)) == 2
    a, b = replay(plan, spec, Algo.NCCL), replay_ranks(plan, spec, Algo.NCCL)
    assert a.step_time_s == b.step_time_s > 0
