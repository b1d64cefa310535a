"""Routes on a cluster graph: the path (or, with explicit spines, the ECMP paths) a flow
between two GPUs takes. Used by :class:`parosim.fabric.network.Network`.

A GPU is never a transit node, except for a peer whose NIC is down: its traffic is relayed
through a GPU of its node over NVLink (NCCL's PXN; docs/heterogeneity.md, "One NIC down").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..errors import InputError

if TYPE_CHECKING:
    import networkx as nx


class Router:
    """Shortest paths (hop count) on the cluster graph, cached per (src, dst).

    >>> from parosim.spec.system import ClusterSpec
    >>> from parosim.fabric.topology import cluster_graph
    >>> r = Router(cluster_graph(ClusterSpec(nodes=2, gpus_per_node=2)))
    >>> r.path("n0/gpu1", "n1/gpu0")
    ['n0/gpu1', 'n0/nic0', 'switch', 'n1/nic0', 'n1/gpu0']
    """

    def __init__(self, graph: nx.DiGraph):
        self.graph = graph
        kinds = getattr(graph, "kinds", None)  # a FoldedGraph: looked up as needed
        self._kind = kinds() if kinds else dict(graph.nodes(data="kind"))
        self._cache: dict[tuple, list] = {}
        self._exits: dict[str, tuple[str, str] | None] = {}
        self._switches = None  # switch-only subgraph (False: fast path not applicable)

    def _exit(self, gpu: str) -> tuple[str, str] | None:
        """(its NIC, the NIC's switch) when a GPU can leave its node only through one NIC
        (its other neighbours are hubs that lead only to GPUs); else None."""
        hit = self._exits.get(gpu)
        if hit is not None or gpu in self._exits:
            return hit
        g, kind = self.graph, self._kind
        out = None
        nics = [v for v in g.successors(gpu) if kind[v] == "nic"]
        hubs_ok = all(kind[v] == "gpu" for h in g.successors(gpu) if kind[h] != "nic"
                      for v in g.successors(h)) and all(
            kind[h] in ("nvswitch", "pcie_switch") for h in g.successors(gpu)
            if kind[h] != "nic")
        if len(nics) == 1 and hubs_ok and g.has_edge(nics[0], gpu):
            sws = [v for v in g.successors(nics[0]) if kind[v] == "switch"]
            if len(sws) == 1 and g.has_edge(sws[0], nics[0]):
                out = (nics[0], sws[0])
        self._exits[gpu] = out
        return out

    def _fast_path(self, src: str, dst: str) -> list[str] | None:
        """Between GPUs of different nodes of a builder-shaped graph (every NIC on at most
        one switch): GPU, NIC, the shortest switch-only path, NIC, GPU. The same path as the
        search on the whole graph where the path is unique, without scanning the thousands
        of NICs on a switch."""
        import networkx as nx  # deferred: networkx loads only when this runs

        switch_graph = getattr(self.graph, "switch_graph", None)
        if self._switches is None and switch_graph is not None:
            self._switches = switch_graph()   # a FoldedGraph: not every node built
        if self._switches is None:
            g, kind = self.graph, self._kind
            if not isinstance(g, nx.DiGraph):  # a LiteDiGraph: work on its networkx copy
                g = self.__dict__.get("_nxg") or self.__dict__.setdefault("_nxg",
                                                                         g.to_networkx())
            single = all(sum(1 for v in g.successors(n) if kind[v] == "switch") <= 1
                         for n in g if kind[n] == "nic")
            self._switches = g.subgraph([n for n in g if kind[n] == "switch"]) if single \
                else False
        if self._switches is False:
            return None
        nodes = self.graph.nodes
        if nodes[src].get("node") == nodes[dst].get("node"):
            return None
        a, b = self._exit(src), self._exit(dst)
        if a is None or b is None:
            return None
        key = ("sw", a[1], b[1])
        sp = self._cache.get(key)
        if sp is None:
            try:
                sp = nx.bidirectional_shortest_path(self._switches, a[1], b[1])
            except nx.NetworkXNoPath:
                return None
            self._cache[key] = sp
        return [src, a[0], *sp, b[0], dst]

    def _fast(self, src: str, dst: str) -> list[str] | None:
        """The unique shortest path on a graph built by
        :func:`parosim.fabric.topology.cluster_graph`
        (GPU - hub - GPU, or GPU - NIC - switch(es) - NIC - GPU), without a search; None when
        the graph is not one of those (then the search runs)."""
        if not self.graph.graph.get("parosim_builder"):
            return None
        g, kind = self.graph, self._kind
        if g.nodes[src].get("node") == g.nodes[dst].get("node"):
            hubs = [h for h in g.successors(src) if kind[h] != "nic" and g.has_edge(h, dst)]
            return [src, hubs[0], dst] if hubs else None
        na = [v for v in g.successors(src) if kind[v] == "nic"]
        nb = [v for v in g.predecessors(dst) if kind[v] == "nic"]
        if len(na) != 1 or len(nb) != 1:
            return None
        sa = [v for v in g.successors(na[0]) if kind[v] == "switch"]
        sb = [v for v in g.predecessors(nb[0]) if kind[v] == "switch"]
        if len(sa) != 1 or len(sb) != 1:
            return None
        if sa[0] == sb[0]:
            return [src, na[0], sa[0], nb[0], dst]
        mid = [v for v in g.successors(sa[0]) if kind[v] == "switch" and g.has_edge(v, sb[0])]
        return [src, na[0], sa[0], mid[0], sb[0], nb[0], dst] if len(mid) == 1 else None

    def path(self, src: str, dst: str) -> list[str]:
        key = (src, dst)
        p = self._cache.get(key)
        if p is None:  # builder-shaped graphs: no search, no networkx import
            p = self._fast(src, dst)
            if p is not None:
                self._cache[key] = p
                return p
        if p is None and self._kind.get(src) == "gpu" and self._kind.get(dst) == "gpu":
            p = self._fast_path(src, dst)
            if p is not None:
                self._cache[key] = p
        if p is None:
            kind = self._kind

            def weight(u, v, d):  # no transit through a GPU other than the source
                return None if (kind[u] == "gpu" and u != src) else 1

            import networkx as nx  # deferred: networkx loads only when this runs

            g = self.graph
            if not isinstance(g, nx.DiGraph):  # a LiteDiGraph: search its networkx copy
                g = self.__dict__.get("_nxg") or self.__dict__.setdefault("_nxg",
                                                                         g.to_networkx())
            try:
                _, p = nx.bidirectional_dijkstra(g, src, dst, weight=weight)
            except nx.NetworkXNoPath:
                p = self._relay_path(src, dst)
                if p is None:
                    raise InputError(f"no path from {src!r} to {dst!r} in the cluster graph "
                                     "(a GPU relays only for a peer of its node whose NIC "
                                     "is down); expected a connected topology") from None
            self._cache[key] = p
        return p

    def _gates(self, gpu: str) -> list[tuple[list[str], str, str]]:
        """How a GPU of a builder-shaped graph reaches the network: (GPU-side hops, NIC, the
        NIC's switch). Its own NIC when both links work; else (its NIC or the NIC's link
        failed) through each peer GPU of its node over the NVSwitch / PCIe switch to the
        peer's NIC, as NCCL's PXN relays, peers in local order from the next one
        (j + 1, j + 2, ... cyclically). Every link used both ways (failures remove both)."""
        g, kind = self.graph, self._kind

        def own(x: str) -> tuple[str, str] | None:
            for nic in (v for v in g.successors(x) if kind[v] == "nic" and g.has_edge(v, x)):
                for sw in (v for v in g.successors(nic)
                           if kind[v] == "switch" and g.has_edge(v, nic)):
                    return nic, sw
            return None

        hit = own(gpu)
        if hit is not None:
            return [([gpu], *hit)]
        out = []
        m = self._gpn_of(gpu)
        j = g.nodes[gpu]["local"]
        for hub in (h for h in g.successors(gpu)
                    if kind[h] in ("nvswitch", "pcie_switch") and g.has_edge(h, gpu)):
            peers = sorted((p for p in g.successors(hub) if kind[p] == "gpu" and p != gpu
                            and g.has_edge(p, hub)),
                           key=lambda p: (g.nodes[p]["local"] - j) % m)
            for p in peers:
                hit = own(p)
                if hit is not None:
                    out.append(([gpu, hub, p], *hit))
        return out

    def _gpn_of(self, gpu: str) -> int:
        node = self.graph.nodes[gpu]["node"]
        return sum(1 for n, d in self.graph.nodes(data=True)
                   if d.get("kind") == "gpu" and d.get("node") == node) or 1

    def _relay_path(self, src: str, dst: str) -> list[str] | None:
        """A path between GPUs of different nodes when one of them has no working NIC: the
        traffic is relayed through a peer GPU of its node over NVLink (NCCL's PXN). Of the
        ways out of ``src`` and into ``dst`` (:meth:`_gates`): the fewest relays, then the
        fewest switch hops, then the nearest peer in local order. None when the graph is not
        builder-shaped or no way exists."""
        g, kind = self.graph, self._kind
        if not (g.graph.get("parosim_builder") and kind.get(src) == "gpu"
                and kind.get(dst) == "gpu") or g.nodes[src]["node"] == g.nodes[dst]["node"]:
            return None
        self._fast_path(src, dst)    # builds the switch-only graph when it applies
        if not self._switches:
            return None
        import networkx as nx  # deferred: networkx loads only when this runs

        best = None
        for ia, (pa, na, sa) in enumerate(self._gates(src)):
            for ib, (pb, nb, sb) in enumerate(self._gates(dst)):
                try:
                    sp = nx.bidirectional_shortest_path(self._switches, sa, sb)
                except nx.NetworkXNoPath:
                    continue
                key = (len(pa) + len(pb), len(sp), ia, ib)
                if best is None or key < best[0]:
                    best = (key, [*pa, na, *sp, nb, *reversed(pb)])
        return None if best is None else best[1]

    def paths(self, src: str, dst: str) -> list[tuple[list[str], float]]:
        """The paths a flow from ``src`` to ``dst`` uses, with the share of its bytes on
        each. One path (weight 1) unless the graph has explicit parallel spines
        (``graph.graph["ecmp"]``): then every equal-cost path through the parallel switches
        between two switches of the shortest path, split evenly (``"ideal"``) or one of them
        drawn by a numpy Generator seeded with (``ecmp_seed``, src rank, dst rank)
        (``"hash"``: per-flow ECMP, so two flows can collide on one uplink).

        >>> from parosim.spec.system import ClusterSpec, NetworkFabric, NetworkSpec
        >>> from parosim.fabric.topology import cluster_graph
        >>> net = NetworkSpec(NetworkFabric.LEAF_SPINE, nodes_per_leaf=1, spines=2)
        >>> r = Router(cluster_graph(ClusterSpec(nodes=2, gpus_per_node=1, network=net)))
        >>> [(p[3], w) for p, w in r.paths("n0/gpu0", "n1/gpu0")]
        [('spine0', 0.5), ('spine1', 0.5)]
        """
        p = self.path(src, dst)
        mode = self.graph.graph.get("ecmp")
        if mode is None:
            return [(p, 1.0)]
        key = ("ecmp", src, dst)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        g, kind = self.graph, self._kind
        options: list[list[str]] = [[p[0]]]
        for i in range(1, len(p) - 1):
            a, v, b = p[i - 1], p[i], p[i + 1]
            if kind[v] == "switch" and kind[a] == "switch" and kind[b] == "switch":
                alts = sorted(x for x in g.successors(a) if kind[x] == "switch"
                              and "node" not in g.nodes[x] and g.has_edge(x, b))
            else:
                alts = [v]
            options = [o + [x] for o in options for x in alts]
        options = [o + [p[-1]] for o in options]
        if mode == "hash" and len(options) > 1:
            ranks = [int(g.nodes[x].get("rank", 0)) for x in (src, dst)]
            rng = np.random.default_rng([int(g.graph.get("ecmp_seed", 0)), *ranks])
            out = [(options[int(rng.integers(len(options)))], 1.0)]
        else:
            out = [(o, 1.0 / len(options)) for o in options]
        self._cache[key] = out
        return out
