"""The folded cluster graph: a homogeneous cluster's graph built only where the network looks.

It must be the same graph as the whole one wherever it is looked at, prove the same symmetry
period, give the engine the same results, and never fold a heterogeneous cluster.
"""

from dataclasses import replace

import pytest

from parosim.collectives import Algo, Op, Scope, simulate_collective
from parosim.evaluate.replay import replay
from parosim.fabric.folded import FoldedGraph, foldable, network_graph
from parosim.fabric.graphlite import LiteDiGraph
from parosim.fabric.network import Network, symmetry_period
from parosim.fabric.symmetry import verified_period
from parosim.fabric.topology import cluster_graph
from parosim.io import load_cluster
from parosim.plan.dataparallel import build_plan
from parosim.spec.model import preset
from parosim.spec.system import (
    ClusterSpec,
    IntraFabric,
    NetworkFabric,
    NetworkSpec,
    NICSpec,
    Override,
)
from parosim.spec.training import TrainingSpec

SPECS = {
    "single-switch": ClusterSpec(nodes=8, gpus_per_node=4),
    "leaf-spine": ClusterSpec(nodes=8, gpus_per_node=2, group_nodes=2, network=NetworkSpec(
        NetworkFabric.LEAF_SPINE, nodes_per_leaf=2, oversubscription=2.0)),
    "leaf-spine-2-spines": ClusterSpec(nodes=8, gpus_per_node=2, network=NetworkSpec(
        NetworkFabric.LEAF_SPINE, nodes_per_leaf=2, spines=2)),
    "rail-4-nics": ClusterSpec(nodes=8, gpus_per_node=8, nic=NICSpec(per_node=4),
                               network=NetworkSpec(NetworkFabric.RAIL)),
    "pcie": ClusterSpec(nodes=4, gpus_per_node=4, intra_fabric=IntraFabric.PCIE_SWITCH),
}


def _as_lists(g):
    return (sorted((n, sorted(d.items())) for n, d in g.nodes(data=True)),
            sorted((u, v, sorted(d.items())) for u, v, d in g.edges(data=True)),
            sorted(g.graph.items()))


@pytest.mark.parametrize("name", SPECS)
def test_fully_built_equals_whole_graph(name):
    spec = SPECS[name]
    g = FoldedGraph(spec)
    g.build_all()
    assert _as_lists(g) == _as_lists(cluster_graph(spec, lite=True))
    # the per-class link counts it reports without building
    whole = cluster_graph(spec, lite=True)
    counts: dict[str, int] = {}
    for _, _, cls in whole.edges(data="link_class"):
        counts[cls] = counts.get(cls, 0) + 1
    assert FoldedGraph(spec).link_class_counts() == counts


@pytest.mark.parametrize("name", SPECS)
def test_lookups_build_on_demand(name):
    spec = SPECS[name]
    g, whole = FoldedGraph(spec), cluster_graph(spec, lite=True)
    last = f"n{spec.nodes - 1}/gpu0"
    assert g.built_nodes == 0
    assert g.nodes[last] == whole.nodes[last]
    assert g.built_nodes == 1
    assert sorted(g.successors(last)) == sorted(whole.successors(last))
    assert g.has_edge(last, f"n{spec.nodes - 1}/nic0") == whole.has_edge(
        last, f"n{spec.nodes - 1}/nic0")
    assert "n999/gpu0" not in g and "nonsense" not in g


@pytest.mark.parametrize("name", SPECS)
def test_same_period_as_the_whole_graph_check(name):
    spec = SPECS[name]
    t = symmetry_period(spec)
    assert t < spec.nodes and foldable(spec, t)
    g = FoldedGraph(spec)
    assert g.verified_period(t) == verified_period(
        cluster_graph(spec, lite=True), spec.nodes, spec.gpus_per_node, t) == t
    assert g.built_nodes <= 2 * t < spec.nodes


@pytest.mark.parametrize("name", SPECS)
def test_engine_results_identical(name):
    spec = SPECS[name]
    for op, algo in ((Op.ALL_REDUCE, Algo.RING), (Op.ALL_GATHER, Algo.HIERARCHICAL),
                     (Op.REDUCE_SCATTER, Algo.HO_RING)):
        a = simulate_collective(spec, op, Scope.GLOBAL, 2**28, algo)
        b = simulate_collective(spec, op, Scope.GLOBAL, 2**28, algo,
                                graph=cluster_graph(spec, lite=True))
        assert a.to_dict() == b.to_dict()
        assert a.symmetry_period_nodes == symmetry_period(spec) < spec.nodes


def test_step_identical_and_folded():
    spec = load_cluster("paper-a100-roce", nodes=16)
    plan = build_plan(preset("llama-7b"), "IIG", spec, TrainingSpec(accum_steps=2))
    a = replay(plan, spec, Algo.HO_RING)
    b = replay(plan, spec, Algo.HO_RING, graph=cluster_graph(spec, lite=True))
    assert (a.step_time_s, a.events, a.link_bytes, a.link_busy_s, a.gpu_egress, a.hot_links,
            a.symmetry_period_nodes) == (b.step_time_s, b.events, b.link_bytes,
                                         b.link_busy_s, b.gpu_egress, b.hot_links,
                                         b.symmetry_period_nodes)
    assert a.symmetry_period_nodes == 1


@pytest.mark.parametrize("nodes,expect", [((3,), 4), ((1, 3), 2)])
def test_heterogeneous_cluster_is_never_folded(nodes, expect):
    spec = ClusterSpec(nodes=4, gpus_per_node=2,
                       overrides=(Override(nodes=nodes, nic_bandwidth_Bps=3.125e9),))
    assert not foldable(spec, 1)
    g = network_graph(spec, 1)
    assert type(g) is LiteDiGraph and len(g) == len(cluster_graph(spec, lite=True))
    r = simulate_collective(spec, Op.ALL_GATHER, Scope.GLOBAL, 2**26, Algo.RING)
    assert r.symmetry_period_nodes == expect
    # and the slow NIC shows: slower than the homogeneous cluster
    fast = simulate_collective(replace(spec, overrides=()), Op.ALL_GATHER, Scope.GLOBAL,
                               2**26, Algo.RING)
    assert r.time_s > 1.5 * fast.time_s


def test_hashed_ecmp_is_not_folded():
    spec = replace(SPECS["leaf-spine-2-spines"], network=NetworkSpec(
        NetworkFabric.LEAF_SPINE, nodes_per_leaf=2, spines=2, ecmp="hash"))
    assert not foldable(spec, 2)
    assert type(network_graph(spec, 2)) is LiteDiGraph


def test_a_broken_fundamental_domain_is_caught():
    """The proof is real: a link of node 1 changed after building makes the fold fall back
    to the whole-graph check, which finds no period."""
    spec = ClusterSpec(nodes=4, gpus_per_node=2)
    g = FoldedGraph(spec)
    g.build(1)
    g.edges["n1/nic0", "switch"]["bandwidth_Bps"] = 1e9
    assert g.verified_period(1) == 4
    assert g.built_nodes == 4
    env_net = Network(__import__("simpy").Environment(), g, 4, 1, 2)
    assert env_net.period == 4


@pytest.mark.parametrize("name", SPECS)
def test_a_folded_run_builds_few_nodes(name, monkeypatch):
    """A folded engine run builds the fundamental domain, its image and the nodes its flows
    reach, not the cluster (explicit spines included: their paths are searched on the
    switches alone)."""
    from parosim.fabric import folded

    made = []
    monkeypatch.setattr(folded, "FoldedGraph",
                        type("Seen", (FoldedGraph,), {"__init__": lambda self, s: (
                            FoldedGraph.__init__(self, s), made.append(self))[0]}))
    spec = replace(SPECS[name], nodes=32)
    simulate_collective(spec, Op.ALL_REDUCE, Scope.GLOBAL, 2**26, Algo.HO_RING)
    assert len(made) == 1 and made[0].built_nodes <= 3 * symmetry_period(spec) < 32


def test_ring_invariance_arrays_agree_with_the_hop_sets():
    """``ringsets_invariant`` tests rings of equal length with numpy: the same answer as the
    hop-set test (a RingSet subclass without arrays) on invariant and broken ring sets."""
    from parosim.collectives.types import RingSet
    from parosim.fabric.symmetry import ringsets_invariant

    class Plain(RingSet):   # the same rings, tested hop by hop (hop_arrays is None)
        def hops(self):
            yield from RingSet.hops(self)

    nodes, gpn = 8, 4
    n = nodes * gpn
    cases = [
        tuple(tuple(range(g * gpn, (g + 1) * gpn)) for g in range(nodes)),        # intra
        tuple(tuple(g * gpn + j for g in range(nodes)) for j in range(gpn)),      # inter
        (tuple(range(n)),),                                                       # global
        (tuple(range(n - 1, -1, -1)),),                                           # reversed
        tuple(tuple(range(g * gpn, (g + 1) * gpn))[::-1] if g == 3 else           # broken
              tuple(range(g * gpn, (g + 1) * gpn)) for g in range(nodes)),
        ((0, 5), (1, 4), (2, 3)) + tuple((a, a + 1) for a in range(6, n, 2)),    # pairs
    ]
    seen = set()
    for rings in cases:
        for shift in (1, 2, 4):
            fast = ringsets_invariant([RingSet(rings, "t")], nodes, gpn, shift)
            slow = ringsets_invariant([Plain(rings, "t")], nodes, gpn, shift)
            assert RingSet(rings, "t").hop_arrays is not None
            assert Plain(rings, "t").hop_arrays is None
            assert fast == slow
            seen.add(fast)
    assert seen == {True, False}   # both answers occur
