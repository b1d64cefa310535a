"""Proving the translation symmetry that :class:`parosim.fabric.network.Network` folds on.

The engine may route only the flows of the first T nodes and stand each link for its orbit
under "translate every rank by T nodes" (see :mod:`parosim.fabric.network`). That is exact only if
the translation maps the cluster graph onto itself, edge attributes included, and maps every
transfer onto a transfer of the same set. Scopes are invariant by construction (T is a
multiple of the PaRO group and of the leaf size); the graph is checked here, edge by edge,
because overrides (a slow NIC, a failed link) break it. When the graph is not invariant under
T, the next multiple of T that divides the node count is tried (the largest true reduction);
the node count itself means no reduction. Routing by ECMP hash is not translation-invariant,
so a graph with ``ecmp = "hash"`` is never reduced.

>>> from parosim.spec.system import ClusterSpec, Override
>>> from parosim.fabric.topology import cluster_graph
>>> c = ClusterSpec(nodes=4, gpus_per_node=2)
>>> verified_period(cluster_graph(c), 4, 2, 1)
1
>>> slow = ClusterSpec(nodes=4, gpus_per_node=2,
...                    overrides=(Override(nodes=(3,), nic_bandwidth_Bps=3.125e9),))
>>> verified_period(cluster_graph(slow), 4, 2, 1)
4
>>> two = ClusterSpec(nodes=4, gpus_per_node=2,
...                   overrides=(Override(nodes=(1, 3), nic_bandwidth_Bps=3.125e9),))
>>> verified_period(cluster_graph(two), 4, 2, 1)
2
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: `parosim collective` does not import networkx
    import networkx as nx

_EDGE_KEYS = ("bandwidth_Bps", "latency_s", "link_class")


def translation(graph: nx.DiGraph, nodes: int, shift: int) -> dict[str, str] | None:
    """The vertex map of "every node index + shift (mod nodes)": node-owned vertices
    ``n{i}/x`` move to ``n{i+shift}/x``, leaf switches by shift / nodes_per_leaf leaves, other
    switches stay. None if the names do not allow the map (then nothing is reduced)."""
    leaves = sorted((n for n in graph if str(n).startswith("leaf")
                     and "node" not in graph.nodes[n]), key=lambda n: int(n[4:]))
    leaf_shift = 0
    if leaves:
        if nodes % len(leaves):
            return None
        per_leaf = nodes // len(leaves)
        if shift % per_leaf:
            return None
        leaf_shift = shift // per_leaf
    out: dict[str, str] = {}
    for n, d in graph.nodes(data=True):
        if "node" in d:
            i = d["node"]
            head, sep, rest = str(n).partition("/")
            if head != f"n{i}" or not sep:
                return None
            out[n] = f"n{(i + shift) % nodes}/{rest}"
        elif n in leaves and leaf_shift:
            out[n] = f"leaf{(int(n[4:]) + leaf_shift) % len(leaves)}"
        else:
            out[n] = n
    return out


def is_invariant(graph: nx.DiGraph, nodes: int, gpus_per_node: int, shift: int,
                 vertices=None, edges=None) -> bool:
    """True when translating by ``shift`` nodes maps the graph onto itself: vertex kinds,
    GPU ranks (+ shift x gpus_per_node) and every edge with its bandwidth, latency, class.
    ``vertices`` / ``edges`` ((u, v, data) triples): check only these (default: all;
    :class:`parosim.fabric.folded.FoldedGraph` checks its fundamental domain)."""
    if graph.graph.get("ecmp") == "hash":
        return False
    sigma = translation(graph, nodes, shift)
    if sigma is None:
        return False
    n_gpus = nodes * gpus_per_node
    for v in (graph.nodes if vertices is None else vertices):
        d, w = graph.nodes[v], sigma[v]
        if w not in graph:
            return False
        e = graph.nodes[w]
        if e.get("kind") != d.get("kind"):
            return False
        if d.get("kind") == "gpu" and e.get("rank") != (d["rank"] + shift * gpus_per_node) \
                % n_gpus:
            return False
    for u, v, d in (graph.edges(data=True) if edges is None else edges):
        su, sv = sigma[u], sigma[v]
        if not graph.has_edge(su, sv):
            return False
        e = graph.edges[su, sv]
        if any(e.get(k) != d.get(k) for k in _EDGE_KEYS):
            return False
    return True


def verified_period(graph: nx.DiGraph, nodes: int, gpus_per_node: int, candidate: int) -> int:
    """The smallest multiple of ``candidate`` dividing ``nodes`` under which the graph is
    invariant (``nodes`` itself: no reduction)."""
    if candidate <= 0 or candidate >= nodes or nodes % candidate:
        return nodes
    for t in range(candidate, nodes, candidate):
        if nodes % t == 0 and is_invariant(graph, nodes, gpus_per_node, t):
            return t
    return nodes


def ringsets_invariant(ringsets, nodes: int, gpus_per_node: int, shift: int) -> bool:
    """True when translating every rank by ``shift`` nodes maps each ring set's hops onto
    themselves (the transfers' half of the symmetry)."""
    n, d = nodes * gpus_per_node, shift * gpus_per_node
    for rs in ringsets:
        arrays = getattr(rs, "hop_arrays", None)  # rings of equal length, as arrays
        if arrays is not None:
            # the same test in numpy: every moved hop is a hop (sorted keys, binary search)
            s, t = (x.ravel() for x in arrays)
            have = s * n + t
            have.sort()
            moved = ((s + d) % n) * n + (t + d) % n
            at = have.searchsorted(moved).clip(max=len(have) - 1)
            if not (have[at] == moved).all():
                return False
            continue
        hops = set(rs.hops())
        if any(((a + d) % n, (b + d) % n) not in hops for a, b in hops):
            return False
    return True


def transfer_period(ringsets, nodes: int, gpus_per_node: int, candidate: int) -> int:
    """The smallest multiple of ``candidate`` dividing ``nodes`` under which every ring set
    is invariant (``nodes``: no reduction).

    >>> from parosim.collectives.types import RingSet
    >>> transfer_period([RingSet(((0, 1, 2, 3),), "g")], 4, 1, 1)
    1
    >>> transfer_period([RingSet(((0, 1),), "pair")], 4, 1, 1)
    4
    """
    ringsets = list(ringsets)
    if candidate <= 0 or candidate >= nodes or nodes % candidate:
        return nodes
    for t in range(candidate, nodes, candidate):
        if nodes % t == 0 and ringsets_invariant(ringsets, nodes, gpus_per_node, t):
            return t
    return nodes
