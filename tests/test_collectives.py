"""Collectives: the engine against the closed form, contention, the paper's table."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parosim.collectives import (
    Algo,
    Op,
    Scope,
    closed_form_time,
    lower,
    scope_rings,
    simulate_collective,
    simulate_concurrent,
    simulate_program,
)
from parosim.collectives.cost import lane_schedule, phase_time, ring_alpha_beta
from parosim.io import load_cluster
from parosim.spec.collective import RING_ALGOS, RING_OPS
from parosim.spec.system import ClusterSpec, LinkSpec, NetworkFabric, NetworkSpec, NICSpec

KiB, MiB, GiB = 2**10, 2**20, 2**30


def flat(n_gpus: int) -> ClusterSpec:
    """Single switch, one NIC per GPU: every link carries at most one flow of a ring."""
    gpn = min(8, n_gpus)
    return ClusterSpec(name=f"flat{n_gpus}", nodes=n_gpus // gpn, gpus_per_node=gpn,
                       intra=LinkSpec(250e9, 2e-6), pcie=LinkSpec(32e9, 5e-7),
                       nic=NICSpec(per_node=gpn, bandwidth_Bps=25e9, latency_s=5e-6))


CASES = [(n, s) for n in (2, 4, 16, 128, 1024) for s in (KiB, MiB, GiB, 4 * GiB)]
CASES += [(4096, s) for s in (KiB, 4 * GiB)]


@pytest.mark.parametrize("algo", list(RING_ALGOS))
@pytest.mark.parametrize("op", list(RING_OPS))
@pytest.mark.parametrize("n,size", CASES)
def test_uncontended_engine_matches_closed_form(n, size, op, algo):
    if n == 4096 and algo is Algo.NCCL and op is Op.ALL_REDUCE:
        pytest.skip("a 512-node tree has no symmetry to exploit (5 s); 1,024 GPUs covers it")
    spec = flat(n)
    r = simulate_collective(spec, op, Scope.GLOBAL, size, algo)
    assert r.time_s == pytest.approx(r.closed_form_s, rel=0.01)
    assert r.closed_form_s == closed_form_time(spec, op, Scope.GLOBAL, size, algo)


@pytest.mark.parametrize("op", list(RING_OPS))
@pytest.mark.parametrize("n", [2, 16, 1024])
def test_flat_ring_is_textbook_alpha_beta(op, n):
    """Ring = (k-1)a + (k-1)/k S/B for AG/RS, twice for AR (Thakur et al. 2005), per channel
    ring: with one NIC per GPU a flat ring is 8 channel rings of S/8 (one per NIC), a is a
    ring's mean hop latency and B the NIC (one flow per NIC and direction)."""
    spec, size = flat(n), 256 * MiB
    f = 2 if op is Op.ALL_REDUCE else 1
    if n <= 8:  # one node: NVLink only, one ring
        alpha, bw, rings = spec.intra.latency_s, spec.intra.bandwidth_Bps, 1
    else:  # 8 channel rings, each crossing every node boundary once
        nodes = n // 8
        a_out = 2 * spec.pcie.latency_s + spec.nic.latency_s
        alpha = (nodes * a_out + (n - nodes) * spec.intra.latency_s) / n
        bw = min(spec.pcie.bandwidth_Bps, spec.nic.bandwidth_Bps,
                 spec.intra.bandwidth_Bps / 7)  # a GPU sends intra hops in 7 of 8 rings
        rings = 8
    expect = f * (n - 1) * alpha + f * (n - 1) / n * size / rings / bw
    assert closed_form_time(spec, op, Scope.GLOBAL, size, Algo.RING) == pytest.approx(expect)


def test_hierarchical_is_sum_of_inner_and_outer_rings():
    spec, S = _tuned(load_cluster("paper-a100-roce", nodes=4), model="ideal"), GiB
    m, ng = 8, 4
    a_in, b_in = spec.intra.latency_s, spec.intra.bandwidth_Bps
    a_out = 2 * spec.pcie.latency_s + spec.nic.latency_s
    b_out = spec.nic.bandwidth_Bps / m  # the node's one NIC carries the m inter rings
    ag_inter = (ng - 1) * a_out + (ng - 1) / ng * (S / m) / b_out
    ag_intra = (m - 1) * a_in + (m - 1) / m * S / b_in
    t = closed_form_time(spec, Op.ALL_GATHER, Scope.GLOBAL, S, Algo.HIERARCHICAL)
    assert t == pytest.approx(ag_inter + ag_intra)


@pytest.mark.parametrize("op", [Op.ALL_GATHER, Op.REDUCE_SCATTER])
def test_ho_ring_is_two_stage_pipeline(op):
    spec = load_cluster("paper-a100-roce", nodes=8)
    prog = lower(spec, op, Scope.GLOBAL, GiB, Algo.HO_RING)
    K = prog.chunks
    assert K > 1
    a = phase_time(spec, next(p for p in prog.phases if p.lane == "intra"))
    b = phase_time(spec, next(p for p in prog.phases if p.lane == "inter"))
    assert closed_form_time(spec, op, Scope.GLOBAL, GiB, Algo.HO_RING) == pytest.approx(
        a + b + (K - 1) * max(a, b))


def test_ho_ring_all_reduce_lanes_respect_dependencies():
    spec = load_cluster("paper-a100-roce", nodes=4)
    prog = lower(spec, Op.ALL_REDUCE, Scope.GLOBAL, GiB, Algo.HO_RING)
    times = lane_schedule(prog, [phase_time(spec, p) for p in prog.phases])
    for i, p in enumerate(prog.phases):
        for d in p.deps:
            assert times[d][1] <= times[i][0]
    # the intra lane never runs two phases at once
    intra = sorted(times[i] for i, p in enumerate(prog.phases) if p.lane == "intra")
    assert all(e <= s2 for (_, e), (s2, _) in zip(intra, intra[1:], strict=False))


@pytest.mark.parametrize("preset,nodes", [("paper-a100-roce", 4), ("dgx-a100-ib", 4),
                                          ("eth-2tier-a100", 16)])
@pytest.mark.parametrize("algo", list(RING_ALGOS))
def test_symmetry_reduction_is_exact(preset, nodes, algo):
    spec = load_cluster(preset, nodes=nodes)
    prog = lower(spec, Op.ALL_REDUCE, Scope.GLOBAL, 64 * MiB, algo)
    full = simulate_program(spec, prog, symmetric=False)
    red = simulate_program(spec, prog, symmetric=True)
    assert red.time_s == pytest.approx(full.time_s, rel=1e-9)
    for cls, b in full.link_bytes.items():
        assert red.link_bytes[cls] == pytest.approx(b, rel=1e-9)


def test_two_collectives_sharing_a_nic_take_twice_as_long():
    spec = load_cluster("paper-a100-roce", nodes=2)
    p = lower(spec, Op.ALL_GATHER, Scope.GLOBAL, GiB, Algo.RING)
    alone = simulate_program(spec, p).time_s
    t1, t2 = simulate_concurrent(spec, [p, p])
    assert t1 == pytest.approx(2 * alone, rel=0.02)
    assert t2 == pytest.approx(2 * alone, rel=0.02)


def test_collectives_on_disjoint_links_do_not_slow_each_other():
    spec = load_cluster("paper-a100-roce", nodes=2)
    intra = lower(spec, Op.ALL_GATHER, Scope.INTRA, GiB, Algo.RING)
    inter = lower(spec, Op.ALL_GATHER, Scope.INTER, GiB / 8, Algo.RING)
    t_intra, t_inter = simulate_concurrent(spec, [intra, inter])
    assert t_intra == pytest.approx(simulate_program(spec, intra).time_s, rel=1e-9)
    assert t_inter == pytest.approx(simulate_program(spec, inter).time_s, rel=1e-9)


@pytest.mark.parametrize("ratio", [2.0, 4.0])
def test_oversubscribed_leaf_spine_slows_cross_leaf_traffic_by_its_ratio(ratio):
    def spec(over):
        return ClusterSpec(nodes=4, gpus_per_node=8, group_nodes=2,
                           nic=NICSpec(per_node=8, bandwidth_Bps=25e9, latency_s=0.0),
                           pcie=LinkSpec(64e9, 0.0), intra=LinkSpec(250e9, 0.0),
                           network=NetworkSpec(NetworkFabric.LEAF_SPINE, nodes_per_leaf=2,
                                               oversubscription=over, uplink_latency_s=0.0))
    # group = a leaf, so every inter-scope hop crosses the spine, all GPUs at once
    base = simulate_collective(spec(1.0), Op.ALL_GATHER, Scope.INTER, GiB, Algo.RING)
    over = simulate_collective(spec(ratio), Op.ALL_GATHER, Scope.INTER, GiB, Algo.RING)
    assert over.time_s / base.time_s == pytest.approx(ratio, rel=0.01)


PAPER_NODES = [2, 4, 8, 16]


@pytest.mark.parametrize("nodes", PAPER_NODES)
def test_paper_all_gather_1GB_ordering(nodes):
    spec = load_cluster("paper-a100-roce", nodes=nodes)
    t = {a: simulate_collective(spec, Op.ALL_GATHER, Scope.GLOBAL, 1e9, a).time_s
         for a in RING_ALGOS}
    assert t[Algo.HIERARCHICAL] < t[Algo.RING]
    assert t[Algo.HO_RING] < t[Algo.RING]
    assert t[Algo.HO_RING] <= t[Algo.HIERARCHICAL]


def test_same_inputs_same_outputs_bit_for_bit():
    spec = load_cluster("eth-2tier-a100")
    a = simulate_collective(spec, Op.ALL_REDUCE, Scope.GLOBAL, GiB, Algo.HO_RING).to_dict()
    b = simulate_collective(spec, Op.ALL_REDUCE, Scope.GLOBAL, GiB, Algo.HO_RING).to_dict()
    assert a == b


def test_bus_bandwidth_follows_nccl_tests():
    spec = flat(16)
    r = simulate_collective(spec, Op.ALL_REDUCE, Scope.GLOBAL, GiB, Algo.RING)
    assert r.algbw_GBps == pytest.approx(GiB / r.time_s / 1e9)
    assert r.busbw_GBps == pytest.approx(r.algbw_GBps * 2 * 15 / 16)
    # busbw approaches the node's 8 NICs (8 x 25 GB/s: one channel ring per NIC)
    assert 0.95 * 200 < r.busbw_GBps <= 200


def test_scopes_have_expected_rings():
    spec = ClusterSpec(nodes=4, gpus_per_node=2, group_nodes=2)
    assert scope_rings(spec, Scope.INTRA).rings == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert scope_rings(spec, Scope.INTER).rings == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert scope_rings(spec, Scope.GLOBAL).size == 8


def test_nic_sharing_in_closed_form():
    spec = load_cluster("eth-2tier-a100", nodes=8)  # 2 NICs per node: 4 GPUs share one
    _, bw = ring_alpha_beta(spec, scope_rings(spec, Scope.INTER))
    assert bw == pytest.approx(spec.nic.bandwidth_Bps / 4)


@settings(max_examples=25, deadline=None)
@given(size=st.integers(min_value=1, max_value=2**33), nodes=st.sampled_from([1, 2, 4, 8]),
       algo=st.sampled_from(list(RING_ALGOS)), op=st.sampled_from(list(RING_OPS)))
def test_never_faster_than_the_bandwidth_bound_and_monotone(size, nodes, algo, op):
    spec = load_cluster("paper-a100-roce", nodes=nodes)
    n = spec.gpus
    t = simulate_collective(spec, op, Scope.GLOBAL, size, algo).time_s
    f = 2 if op is Op.ALL_REDUCE else 1
    fastest = max(spec.intra.bandwidth_Bps, spec.nic.bandwidth_Bps)
    assert t >= f * (n - 1) / n * size / fastest * (1 - 1e-9)
    t2 = simulate_collective(spec, op, Scope.GLOBAL, size * 2, algo).time_s
    assert t2 >= t
    assert math.isfinite(t)


def test_phase_overhead_is_paid_per_phase_and_limits_ho_ring_chunks():
    from dataclasses import replace

    from parosim.spec.system import CollectiveTuning

    base = _tuned(load_cluster("paper-a100-roce", nodes=4), model="ideal")
    slow = replace(base, collective=CollectiveTuning(phase_overhead_s=2e-3))
    for algo in RING_ALGOS:
        p0 = lower(base, Op.ALL_REDUCE, Scope.GLOBAL, 64 * MiB, algo)
        p1 = lower(slow, Op.ALL_REDUCE, Scope.GLOBAL, 64 * MiB, algo)
        if algo is not Algo.HO_RING:  # same phases: the overhead is added once per phase
            assert closed_form_time(slow, Op.ALL_REDUCE, Scope.GLOBAL, 64 * MiB, algo) == (
                pytest.approx(closed_form_time(base, Op.ALL_REDUCE, Scope.GLOBAL, 64 * MiB,
                                               algo) + 2e-3 * len(p0.phases)))
        else:  # launch costs make fewer, larger chunks the better choice
            assert p1.chunks < p0.chunks
        r = simulate_program(slow, p1)
        assert r.time_s == pytest.approx(r.closed_form_s, rel=0.01)


def _tuned(spec, **kw):
    from dataclasses import replace

    return replace(spec, collective=replace(spec.collective, **kw))


@pytest.mark.parametrize("serial", [False, True])
@pytest.mark.parametrize("op", list(RING_OPS))
def test_chosen_chunk_count_minimises_the_closed_form(op, serial):
    from parosim.collectives.cost import program_time
    from parosim.collectives.lowering import _hierarchical, best_chunks

    spec = _tuned(load_cluster("paper-a100-roce", nodes=4), step_latency_s=50e-6,
                  phase_overhead_s=100e-6, serial_progress=serial)
    times = [program_time(spec, _hierarchical(spec, op, 8 * MiB, k, Algo.HO_RING))
             for k in range(1, 65)]
    k = best_chunks(spec, op, 8 * MiB)
    assert times[k - 1] == pytest.approx(min(times), rel=1e-9)


@pytest.mark.parametrize("op", list(RING_OPS))
def test_serial_progress_engine(op):
    """One progress thread per rank: single-lane programs are unchanged (closed form exact);
    HO-Ring's overlapped latency parts queue, so it gets slower, never faster."""
    base = _tuned(load_cluster("paper-a100-roce", nodes=4), step_latency_s=20e-6,
                  phase_overhead_s=30e-6, model="ideal")  # gloo on CPU ranks: no NCCL
    serial = _tuned(base, serial_progress=True)
    for algo in (Algo.RING, Algo.HIERARCHICAL):
        r = simulate_collective(serial, op, Scope.GLOBAL, 64 * MiB, algo)
        assert r.time_s == pytest.approx(r.closed_form_s, rel=0.01)
        assert r.time_s == pytest.approx(
            simulate_collective(base, op, Scope.GLOBAL, 64 * MiB, algo).time_s, rel=1e-9)
    from parosim.collectives.lowering import HORing

    # 8 chunks of a small buffer: latency-bound lanes, whose latency parts now queue
    prog = HORing().lower(base, op, Scope.GLOBAL, 4 * MiB, chunks=8)
    free = simulate_program(base, prog).time_s
    queued = simulate_program(serial, prog)
    assert queued.time_s > 1.1 * free
    assert queued.time_s >= queued.closed_form_s * (1 - 1e-9)  # the bound holds
    big = lower(base, op, Scope.GLOBAL, 64 * MiB, Algo.HO_RING)  # bandwidth-bound: no loss
    assert big.chunks > 1
    assert simulate_program(serial, big).time_s >= simulate_program(base, big).time_s


# -- NCCL model: every algorithm and protocol, engine against closed form ----------------------

PROTO_CASES = [("dgx-h100-ib", 2), ("dgx-a100-ib", 4), ("paper-a100-roce", 4),
               ("eth-2tier-a100", 16)]


@pytest.mark.parametrize("proto", ["ll", "ll128", "simple"])
@pytest.mark.parametrize("algo", list(RING_ALGOS))
@pytest.mark.parametrize("preset,nodes", PROTO_CASES)
def test_engine_matches_closed_form_every_protocol(preset, nodes, algo, proto):
    spec = _tuned(load_cluster(preset, nodes=nodes), protocols=(proto,))
    assert spec.collective.model == "nccl"
    for op in RING_OPS:
        for size in (4 * KiB, 256 * MiB):
            r = simulate_collective(spec, op, Scope.GLOBAL, size, algo)
            assert r.time_s == pytest.approx(r.closed_form_s, rel=0.01), (op, size)
            assert r.protocol == proto
