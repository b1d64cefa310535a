"""Topology invariants checked by formula."""

import networkx as nx
import pytest

from parosim.errors import InputError
from parosim.fabric.network import Router
from parosim.fabric.topology import LINK_CLASSES, check_graph, cluster_graph
from parosim.io import available_presets, load_cluster
from parosim.spec.system import ClusterSpec, NetworkFabric, NetworkSpec, NICSpec


def kinds(g):
    out = {}
    for _, k in g.nodes(data="kind"):
        out[k] = out.get(k, 0) + 1
    return out


@pytest.mark.parametrize("nodes,gpn,nics", [(1, 8, 1), (4, 8, 1), (3, 4, 4), (16, 8, 2)])
def test_single_switch_counts(nodes, gpn, nics):
    spec = ClusterSpec(nodes=nodes, gpus_per_node=gpn, nic=NICSpec(per_node=nics))
    g = cluster_graph(spec)
    k = kinds(g)
    assert k["gpu"] == nodes * gpn
    assert k["nvswitch"] == nodes
    assert k["nic"] == nodes * nics
    assert k["switch"] == 1
    # links: GPU<->NVSwitch, GPU<->NIC (PCIe), NIC<->switch; two directed edges each
    assert g.number_of_edges() == 2 * (nodes * gpn * 2 + nodes * nics)
    for _, _, d in g.edges(data=True):
        assert d["bandwidth_Bps"] > 0 and d["latency_s"] >= 0
        assert d["link_class"] in LINK_CLASSES
    ranks = sorted(d["rank"] for _, d in g.nodes(data=True) if d["kind"] == "gpu")
    assert ranks == list(range(nodes * gpn))


def test_leaf_spine_counts_and_oversubscription():
    spec = ClusterSpec(nodes=12, gpus_per_node=8, nic=NICSpec(per_node=2, bandwidth_Bps=1e10),
                       network=NetworkSpec(NetworkFabric.LEAF_SPINE, nodes_per_leaf=4,
                                           oversubscription=4.0))
    g = cluster_graph(spec)
    leaves = [n for n in g if n.startswith("leaf")]
    assert len(leaves) == 3  # 12 / 4 (a partly filled leaf is refused: not homogeneous)
    up = g.edges["leaf0", "spine"]
    assert up["link_class"] == "uplink"
    assert up["bandwidth_Bps"] == pytest.approx(4 * 2 * 1e10 / 4.0)


def test_rail_each_nic_on_its_rail():
    spec = load_cluster("dgx-a100-ib", nodes=3)
    g = cluster_graph(spec)
    for i in range(3):
        for k in range(8):
            assert g.has_edge(f"n{i}/nic{k}", f"rail{k}")
    # same rail: no spine; different rails: through the spine
    r = Router(g)
    assert "spine" not in r.path("n0/gpu3", "n2/gpu3")
    assert "spine" in r.path("n0/gpu3", "n2/gpu4")


def test_routes_never_transit_a_gpu():
    g = cluster_graph(load_cluster("dgx-h100-ib", nodes=2))
    r = Router(g)
    for a in range(8):
        for b in range(8):
            p = r.path(f"n0/gpu{a}", f"n1/gpu{b}")
            assert all(g.nodes[x]["kind"] != "gpu" for x in p[1:-1])


def test_presets_load_and_connect():
    names = available_presets()
    for needed in ("paper-a100-roce", "dgx-a100-ib", "dgx-h100-ib", "eth-2tier-a100"):
        assert needed in names
    for n in names:
        g = cluster_graph(load_cluster(n))
        assert nx.is_strongly_connected(g)


def test_disconnected_graph_is_rejected():
    g = cluster_graph(ClusterSpec(nodes=2, gpus_per_node=2))
    g.remove_edge("n1/nic0", "switch")
    g.remove_edge("switch", "n1/nic0")
    with pytest.raises(InputError, match="disconnected"):
        check_graph(g)


def test_zero_nics_with_several_nodes_is_rejected():
    with pytest.raises(InputError, match="disconnected"):
        ClusterSpec(nodes=2, nic=NICSpec(per_node=0))


def test_group_must_divide_nodes():
    with pytest.raises(InputError, match="does not divide"):
        ClusterSpec(nodes=6, group_nodes=4)
