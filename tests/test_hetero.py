"""Heterogeneous clusters: the symmetry check, overrides, stragglers, jitter, ECMP hashing."""

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest

from parosim.cli.commands import main
from parosim.collectives import Algo, Op, Scope, lower, simulate_collective, simulate_program
from parosim.errors import InputError
from parosim.evaluate.ranks import replay_ranks, step_distribution
from parosim.evaluate.replay import replay
from parosim.fabric.network import Router
from parosim.fabric.topology import cluster_graph
from parosim.io import load_cluster
from parosim.io.cluster import cluster_from_dict
from parosim.plan.dataparallel import CollectiveOp, ComputeOp, Plan, build_plan
from parosim.simulate.step import simulate_step
from parosim.spec.model import preset
from parosim.spec.strategy import parse_strategy
from parosim.spec.system import (
    ClusterSpec,
    CollectiveTuning,
    GPUSpec,
    NetworkFabric,
    NetworkSpec,
    NICSpec,
    Override,
)
from parosim.spec.training import TrainingSpec

GiB = 2**30
SLOW_NIC = 25e9 / 8  # 25 Gbps in bytes/s


def paper(**kw):
    return replace(load_cluster("paper-a100-roce"), **kw)


def wire(**kw):
    """paper-a100-roce with the ideal wire model of collectives (no NCCL protocol costs),
    for hand formulas."""
    return paper(collective=CollectiveTuning(), **kw)


def slow_nic(*nodes):
    return (Override(nodes=tuple(nodes), nic_bandwidth_Bps=SLOW_NIC),)


# -- the symmetry reduction must see the slow NIC (the silent wrong answer) ----------------

@pytest.mark.parametrize("node", [0, 3])
def test_node3_slow_nic_ring_all_gather_333ms(node):
    c = wire(overrides=slow_nic(node))
    r = simulate_collective(c, Op.ALL_GATHER, Scope.GLOBAL, GiB, Algo.RING)
    # a pipelined ring moves at its slowest hop: 31/32 of 1 GiB through 25 Gbps, plus
    # 31 steps of the ring's mean hop latency: 4 inter-node hops of 6 us (2 x 0.5 us PCIe +
    # 5 us NIC-switch-NIC) and 28 NVSwitch hops of 2 us
    hand = 31 / 32 * GiB / SLOW_NIC + 31 * (4 * 6e-6 + 28 * 2e-6) / 32
    assert r.time_s == pytest.approx(hand, rel=1e-6)
    assert 0.332 < r.time_s < 0.334
    assert r.symmetry_period_nodes == 4  # proved not invariant: no reduction
    assert r.closed_form_s is None       # the closed form assumes equal links
    assert r.hot_links[0]["link"] in (f"n{node}/nic0->switch", f"switch->n{node}/nic0")
    full = simulate_program(c, lower(c, Op.ALL_GATHER, Scope.GLOBAL, GiB, Algo.RING),
                            symmetric=False)
    assert r.time_s == full.time_s
    # the preset's own (NCCL) collective model: the same bandwidth term, its own latencies
    nccl = simulate_collective(paper(overrides=slow_nic(node)), Op.ALL_GATHER, Scope.GLOBAL,
                               GiB, Algo.RING)
    assert nccl.symmetry_period_nodes == 4
    assert 31 / 32 * GiB / SLOW_NIC < nccl.time_s < 31 / 32 * GiB / SLOW_NIC + 1e-3


@pytest.mark.parametrize("strategy,algo,accum", [("IIG", "ho-ring", 10), ("GGG", "ring", 2)])
def test_node3_slow_nic_whole_step_equals_all_nics_slow(strategy, algo, accum):
    # IIG: intra gathers and reductions never touch a NIC; the inter all-reduce's 8 rings
    # all pass through every node's NIC. GGG with flat rings: every global ring crosses
    # every NIC once each way. So one slow NIC gates them exactly as if every NIC were slow
    # (a ring moves at its slowest hop).
    m, t = preset("llama-7b"), TrainingSpec(accum_steps=accum)
    one = simulate_step(m, paper(overrides=slow_nic(3)), strategy, t, algo)
    every = simulate_step(m, paper(nic=NICSpec(1, SLOW_NIC, 5e-6)), strategy, t, algo)
    base = simulate_step(m, paper(), strategy, t, algo)
    assert one.step_time_s == pytest.approx(every.step_time_s, rel=1e-9)
    assert one.step_time_s > 1.5 * base.step_time_s
    assert one.extra["symmetry_period_nodes"] == 4
    assert every.extra["symmetry_period_nodes"] == 1


def test_largest_true_period_is_used_and_exact():
    # 16 nodes, slow NICs on nodes 1, 5, 9, 13: invariant under translation by 4 nodes
    c = ClusterSpec(nodes=16, gpus_per_node=2, overrides=slow_nic(1, 5, 9, 13))
    p = lower(c, Op.ALL_REDUCE, Scope.INTER, 2**26, Algo.RING)
    red = simulate_program(c, p)
    full = simulate_program(c, p, symmetric=False)
    assert red.symmetry_period_nodes == 4
    assert red.time_s == pytest.approx(full.time_s, rel=1e-12)


def test_homogeneous_results_unchanged():
    # values printed by main without this change (commit ad9d50f), pinned bit for bit; the
    # same 68 step and collective results on four presets were compared with main when merging
    m, t = preset("llama-7b"), TrainingSpec()
    assert simulate_step(m, load_cluster("paper-a100-roce"), "IIG", t,
                         "ho-ring").step_time_s == 6.977437252762
    assert simulate_step(m, load_cluster("paper-a100-roce", 128), "IIG", t,
                         "ho-ring").step_time_s == 7.500280532946
    r = simulate_collective(load_cluster("paper-a100-roce"), Op.ALL_GATHER, Scope.GLOBAL, GiB,
                            Algo.RING)
    assert r.time_s == 0.08336986636 and r.symmetry_period_nodes == 1


@pytest.mark.parametrize("strategy,algo", [("IIG", Algo.HO_RING), ("NIG", Algo.RING),
                                           ("GGG", Algo.HIERARCHICAL)])
def test_per_rank_engine_equals_default_replay_bit_for_bit(strategy, algo):
    c = paper()
    plan = build_plan(preset("llama-7b"), strategy, c, TrainingSpec(accum_steps=2))
    a, b = replay(plan, c, algo), replay_ranks(plan, c, algo)
    assert a.step_time_s == b.step_time_s
    assert a.exposed_comm_s == b.exposed_comm_s


@pytest.mark.parametrize("strategy", ["IIG", "GGG"])
def test_per_rank_classes_equal_default_replay_with_overlap_slowdown(strategy):
    # the fluid slowdown beside collectives (the runtimes' 1.189) on per-rank class lanes
    c = paper()
    plan = build_plan(preset("llama-7b"), strategy, c, TrainingSpec(accum_steps=2))
    a = replay(plan, c, Algo.HO_RING, 1.189)
    b = replay_ranks(plan, c, Algo.HO_RING, overlap_slowdown=1.189)
    assert a.step_time_s == b.step_time_s
    assert a.compute_busy_s == b.compute_busy_s.max()
    slow = paper(overrides=(Override(gpus=("n2/gpu5",), speed=0.8),))
    s = replay_ranks(build_plan(preset("llama-7b"), strategy, slow, TrainingSpec(
        accum_steps=2)), slow, Algo.HO_RING, overlap_slowdown=1.189)
    assert s.step_time_s > a.step_time_s and s.critical_rank == 21


# -- stragglers: the critical-path argument ---------------------------------------------------

def _hand_plan(c, compute_s, size):
    """compute -> global all-reduce -> compute -> global all-reduce (each waits for the last)."""
    ops = [ComputeOp(0, "c0", "fwd", 0, 0, 1.0, compute_s),
           CollectiveOp(1, "ar0", Op.ALL_REDUCE, Scope.GLOBAL, size, "sync-grad", 0, 0,
                        "comm-grad", (0,)),
           ComputeOp(2, "c1", "fwd", 0, 0, 1.0, compute_s, deps=(1,)),
           CollectiveOp(3, "ar1", Op.ALL_REDUCE, Scope.GLOBAL, size, "sync-grad", 0, 0,
                        "comm-grad", (2,))]
    return Plan(tuple(ops), parse_strategy("NNN"), c.gpus, c.group_size, "hand", 1, 1, 1, 1.0,
                1, 1.0)


def test_one_rank_at_0p8_slows_a_synchronous_step_as_the_critical_path_predicts():
    c = ClusterSpec(nodes=2, gpus_per_node=4,
                    overrides=(Override(gpus=("n1/gpu2",), speed=0.8),))
    plan = _hand_plan(c, 0.010, 2**24)
    ar = simulate_collective(ClusterSpec(nodes=2, gpus_per_node=4), Op.ALL_REDUCE,
                             Scope.GLOBAL, 2**24, Algo.RING).time_s
    r = replay_ranks(plan, c, Algo.RING)
    # every collective waits for rank 6, which computes 0.010 / 0.8 = 12.5 ms each time
    assert r.step_time_s == pytest.approx(2 * 0.0125 + 2 * ar, rel=1e-9)
    assert r.critical_rank == 6
    assert r.critical_path_compute_s == pytest.approx(0.025, rel=1e-9)
    assert r.compute_busy_s.min() == pytest.approx(0.020, rel=1e-9)
    homog = replay_ranks(plan, ClusterSpec(nodes=2, gpus_per_node=4), Algo.RING)
    assert r.step_time_s - homog.step_time_s == pytest.approx(2 * 0.0025, rel=1e-6)


def test_one_slow_gpu_equals_every_gpu_slow_in_a_llama_step():
    # synchronous data parallelism: every collective waits for the slowest rank, so one GPU
    # at 0.8x gives the step of a cluster whose every GPU is at 0.8x
    m, t = preset("llama-7b"), TrainingSpec(accum_steps=2)
    one = simulate_step(m, paper(overrides=(Override(gpus=("n2/gpu5",), speed=0.8),)), "IIG",
                        t)
    g = GPUSpec(peak_flops=312e12 * 0.8, hbm_bandwidth_Bps=2.0e12 * 0.8)
    every = simulate_step(m, paper(gpu=g), "IIG", t)
    assert one.step_time_s == pytest.approx(every.step_time_s, rel=1e-9)
    assert one.extra["critical_rank"] == 21 and one.extra["critical_rank_share"] == 1.0


def test_mixed_node_types_step_is_gated_by_the_slower_type():
    h100 = GPUSpec("H100-SXM5-80GB", 80 * 10**9, 989e12, 3.35e12)
    m, t = preset("llama-7b"), TrainingSpec(accum_steps=2)
    mixed = simulate_step(m, paper(overrides=(Override(nodes=(2, 3), gpu=h100),)), "IIG", t)
    a100 = simulate_step(m, paper(), "IIG", t)
    assert mixed.step_time_s == pytest.approx(a100.step_time_s, rel=1e-9)
    assert mixed.extra["critical_rank"] < 16  # an A100 rank


# -- jitter ---------------------------------------------------------------------------------

def test_jitter_distribution_collapses_to_the_deterministic_step():
    c = paper()
    plan = build_plan(preset("llama-7b"), "IIG", c, TrainingSpec(accum_steps=2))
    det = replay(plan, c, Algo.HO_RING).step_time_s
    zero = step_distribution(plan, c, Algo.HO_RING, 3, 0, 0.0)
    assert zero.step_times_s.tolist() == [det] * 3
    tiny = step_distribution(plan, c, Algo.HO_RING, 3, 0, 1e-9).summary()
    assert tiny["step_time_s"] == pytest.approx(det, rel=1e-7)
    wide = step_distribution(plan, c, Algo.HO_RING, 20, 0, 0.1).summary()
    assert wide["step_time_s"] > det  # the max of jittered ranks is late on average
    assert wide["step_time_p50_s"] <= wide["step_time_p90_s"] <= wide["step_time_p99_s"]
    again = step_distribution(plan, c, Algo.HO_RING, 20, 0, 0.1).summary()
    other = step_distribution(plan, c, Algo.HO_RING, 20, 1, 0.1).summary()
    assert again == wide and other != wide


# -- ECMP hashing on an explicit 2-spine fabric ----------------------------------------------

def _ecmp_cluster(mode, seed=0):
    # 2 nodes = 2 leaves, 8 GPUs and 8 NICs of 100 Gbps each; each leaf has one 400 Gbps
    # uplink to each of 2 spines (800 Gbps down, non-blocking): ideal spreading puts 4 of the
    # 8 same-direction inter flows on each uplink, exactly filling it
    net = NetworkSpec(NetworkFabric.LEAF_SPINE, nodes_per_leaf=1, spines=2, ecmp=mode,
                      ecmp_seed=seed)
    return ClusterSpec(nodes=2, gpus_per_node=8, nic=NICSpec(8, 12.5e9, 5e-6), network=net)


def _worst_uplink(c):
    """Most flows of one direction hashed onto one spine (from the router's choices)."""
    r = Router(cluster_graph(c))
    worst = 0
    for src, dst in ((0, 1), (1, 0)):
        cnt = {"spine0": 0, "spine1": 0}
        for j in range(8):
            (path, _), = r.paths(f"n{src}/gpu{j}", f"n{dst}/gpu{j}")
            cnt[path[3]] += 1
        worst = max(worst, *cnt.values())
    return worst


def _bin_max_pmf():
    """P(max(X, 8 - X) = k), X ~ Binomial(8, 1/2)."""
    pmf = {}
    for x in range(9):
        k = max(x, 8 - x)
        pmf[k] = pmf.get(k, 0) + math.comb(8, x) / 256
    return pmf


def test_ecmp_hash_collisions_against_ideal_spreading():
    size = 2**27
    ideal = simulate_collective(_ecmp_cluster("ideal"), Op.ALL_REDUCE, Scope.INTER, size,
                                Algo.RING).time_s
    wire = size / 12.5e9          # ring of 2: each rank sends the whole buffer once
    lat = ideal - wire            # 2 steps of the path latency
    times, worst = [], []
    for seed in range(48):
        c = _ecmp_cluster("hash", seed)
        t = simulate_collective(c, Op.ALL_REDUCE, Scope.INTER, size, Algo.RING).time_s
        w = _worst_uplink(c)
        # the coupled transfer runs at the slowest link: an uplink of 50 GB/s shared by w
        # flows (w > 4 is a collision), or the 12.5 GB/s NIC
        assert t == pytest.approx(lat + size / min(12.5e9, 50e9 / w), rel=1e-6)
        times.append(t)
        worst.append(w)
    # hand expectation: the worse of two independent directions, each Binomial(8, 1/2)
    pmf = _bin_max_pmf()
    exp = sum(pmf[a] * pmf[b] * max(a, b) / 4 for a, b in itertools.product(pmf, pmf))
    var = sum(pmf[a] * pmf[b] * (max(a, b) / 4) ** 2
              for a, b in itertools.product(pmf, pmf)) - exp**2
    ratio = (np.array(times) - lat) / wire
    assert abs(ratio.mean() - exp) < 3 * math.sqrt(var / len(ratio))
    assert exp > 1.3  # collisions cost about a third on average
    assert ratio.max() == pytest.approx(max(worst) / 4, rel=1e-6)
    assert ratio.min() >= 1 - 1e-9


def test_failed_uplink_reroutes_over_the_other_spine():
    c = replace(_ecmp_cluster("ideal"),
                overrides=(Override(links=(("leaf0", "spine1"),), failed=True),))
    size = 2**27
    t = simulate_collective(c, Op.ALL_REDUCE, Scope.INTER, size, Algo.RING).time_s
    ideal = simulate_collective(_ecmp_cluster("ideal"), Op.ALL_REDUCE, Scope.INTER, size,
                                Algo.RING).time_s
    lat = ideal - size / 12.5e9
    # 8 flows each way on leaf0 <-> spine0 (50 GB/s): 6.25 GB/s per flow
    assert t == pytest.approx(lat + size / 6.25e9, rel=1e-6)


# -- YAML and errors --------------------------------------------------------------------------

def _yaml(**extra):
    d = {"name": "h", "gpus_per_node": 8, "nodes": 4, "intra_node": {"bandwidth": "2000Gbps"},
         "gpu": {"model": "A100-SXM4-80GB"}, "nic": {"bandwidth": "100Gbps"}}
    d.update(extra)
    return d


def test_yaml_overrides_of_the_issue_parse():
    c = cluster_from_dict(_yaml(overrides=[
        {"nodes": [3], "nic": {"bandwidth": "25Gbps"}},
        {"gpus": ["n2/gpu5"], "speed": 0.8},
        {"links": [["n1/nic0", "switch"]], "bandwidth": "50Gbps", "latency": "3us"},
        {"nodes": [0], "memory": "40GB"}], jitter={"cv": 0.05}))
    assert c.overrides[0].nic_bandwidth_Bps == SLOW_NIC and c.overrides[1].speed == 0.8
    assert c.jitter_cv == 0.05 and c.min_gpu_memory_bytes == 40 * 10**9
    g = cluster_graph(c)
    assert g.edges["switch", "n1/nic0"]["bandwidth_Bps"] == 6.25e9
    assert g.edges["n3/nic0", "switch"]["bandwidth_Bps"] == SLOW_NIC


@pytest.mark.parametrize("bad,msg", [
    ({"nodes": [3], "nic": {"speed": 1}}, "unknown key 'speed'"),
    ({"nodes": [3], "colour": "red"}, "unknown key 'colour'"),
    ({"gpus": ["n2/gpu5"], "failed": True}, "unknown key 'failed'"),
    ({"nodes": [9], "speed": 0.5}, "outside the cluster's 4 nodes"),
    ({"gpus": ["n2/gpu9"], "speed": 0.5}, "not a GPU of this cluster"),
    ({"speed": 0.5}, "expected exactly one of nodes, gpus or links"),
    ({"gpus": ["n0/gpu0"], "speed": -1}, "must be positive"),
])
def test_bad_overrides_are_refused_with_one_line(bad, msg):
    with pytest.raises(InputError, match=msg):
        cluster_from_dict(_yaml(overrides=[bad]))


def test_bad_link_and_disconnecting_failure_refused():
    with pytest.raises(InputError, match="no link between 'n1/gpu0' and 'switch'"):
        cluster_graph(cluster_from_dict(_yaml(overrides=[
            {"links": [["n1/gpu0", "switch"]], "failed": True}])))
    with pytest.raises(InputError, match="disconnected"):
        cluster_graph(cluster_from_dict(_yaml(overrides=[
            {"links": [["n1/nic0", "switch"]], "failed": True}])))


def test_cli_heterogeneous_simulate_and_analytic_refusal(tmp_path, capsys):
    import json

    import yaml

    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(_yaml(overrides=[{"gpus": ["n0/gpu1"], "speed": 0.5}])))
    trace = tmp_path / "t.json"
    assert main(["simulate", "--cluster", str(p), "--accum", "1", "--strategy", "IIG",
                 "--repeats", "3", "--jitter-cv", "0.02", "--trace", str(trace),
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["critical_rank"] == 1 and out["repeats"] == 3
    assert out["step_time_p50_s"] <= out["step_time_p99_s"]
    assert out["step_time_s"] == pytest.approx(np.mean(out["step_times_s"]))
    ev = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("ph") == "C" for e in ev)  # link utilisation counters
    assert main(["simulate", "--cluster", str(p), "--mode", "analytic"]) == 2
    assert "expected --mode engine" in capsys.readouterr().err
    assert main(["simulate", "--repeats", "0"]) == 2
    assert main(["simulate", "--jitter-cv", "-1"]) == 2


def test_per_rank_trace_link_timeline_and_hot_links(tmp_path, capsys):
    import csv
    import json

    import yaml

    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(_yaml(overrides=[{"nodes": [3], "nic": {"bandwidth": "25Gbps"}},
                                                 {"gpus": ["n2/gpu5"], "speed": 0.8}])))
    trace, links = tmp_path / "t.json", tmp_path / "l.csv"
    assert main(["simulate", "--cluster", str(p), "--accum", "1", "--strategy", "IIG",
                 "--trace", str(trace), "--link-timeline", str(links), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["critical_rank"] == 21 and out["symmetry_period_nodes"] == 4
    assert out["hot_links"][0]["link"] in ("n3/nic0->switch", "switch->n3/nic0")
    assert 0 < out["hot_links"][0]["utilization"] <= 1
    ev = json.loads(trace.read_text())["traceEvents"]
    lanes = {e["args"]["name"] for e in ev if e.get("name") == "thread_name"}
    assert {"rank 0 compute", "rank 21 compute", "comm-grad"} <= lanes
    rows = list(csv.DictReader(links.open()))
    n3 = [float(r["utilization"]) for r in rows if r["link"] == "n3/nic0->switch"]
    assert max(n3) == pytest.approx(1.0) and min(n3) == 0.0  # saturated while it carries
    times = [float(r["time_s"]) for r in rows]
    assert times == sorted(times) and times[-1] == pytest.approx(out["step_time_s"])


def test_collective_seed_changes_only_hashed_fabrics(capsys):
    import json

    res = []
    for seed in ("0", "1"):
        assert main(["collective", "--cluster", "eth-2spine-a100", "--op", "all-reduce",
                     "--algo", "ring", "--scope", "inter", "--size", "64MiB", "--seed", seed,
                     "--json"]) == 0
        res.append(json.loads(capsys.readouterr().out))
    assert res[0]["time_s"] != res[1]["time_s"]
    assert res[0]["closed_form_s"] is None and res[0]["symmetry_period_nodes"] == 16


def test_a_hand_made_program_that_is_not_invariant_is_not_folded():
    from parosim.collectives.types import Phase, Program, RingSet

    c = ClusterSpec(nodes=4, gpus_per_node=2)
    ring = RingSet(((0, 2),), "pair")  # one ring between nodes 0 and 1 only
    p = Program(Op.ALL_GATHER, Scope.GLOBAL, Algo.RING, 2**24, 2,
                (Phase("ag", Op.ALL_GATHER, ring, 2**24, "main"),))
    r = simulate_program(c, p)
    assert r.symmetry_period_nodes == 4
    assert r.time_s == simulate_program(c, p, symmetric=False).time_s
