"""A homogeneous cluster's graph, built only where the flow-level network looks.

With a symmetry period of T nodes (:func:`parosim.fabric.network.symmetry_period`) the
network routes only the flows that leave the first T nodes and stands each link for its orbit
(:class:`parosim.fabric.network.Network`), so the other nodes' vertices and links are never
read; at 16,384 nodes building and checking them was most of a step's wall time.
:class:`FoldedGraph` holds the switches and the links between them, and builds a node (its
GPUs, hub, NICs and their links to the switches, by the same code as
:func:`parosim.fabric.topology.cluster_graph`) the first time one of its vertices is looked up.

When it is used (:func:`foldable`): a reduction was asked for (T < nodes), the spec has no
overrides (no per-node, per-link or per-GPU change), ECMP is not hashed per flow and every node
has a NIC. Anything else gets the whole graph and the edge-by-edge check of
:func:`parosim.fabric.symmetry.verified_period`, as before; so does a user-supplied graph.

Why the symmetry still holds (:meth:`FoldedGraph.verified_period`): the graph is the switch
part S (switches and switch-to-switch links) plus, for every node i, the part A(i) that
:func:`~parosim.fabric.topology.node_graph` and the fabric's attach step build, both depending
on i only through vertex names and the leaf ``i // nodes_per_leaf``. Translation by T maps the
whole graph onto itself when it maps S onto S and A(i) onto A(i + T). That is checked here
edge by edge (kinds, ranks, bandwidth, latency, link class) on the switch part and on every
node of the fundamental domain against its image, built for the purpose; for the other nodes
it follows because A(i) is built by the same code with only the index changed, and a spec
without overrides gives that code no per-node input. If the check fails, every node is built
and the whole graph is checked as for any other cluster.

>>> from parosim.spec.system import ClusterSpec
>>> g = FoldedGraph(ClusterSpec(nodes=1024, gpus_per_node=8))
>>> g.verified_period(1), g.built_nodes
(1, 2)
>>> g.nodes["n700/gpu3"]["rank"], g.built_nodes
(5603, 3)
"""

from __future__ import annotations

from collections import Counter

from ..spec.system import ClusterSpec
from .graphlite import LiteDiGraph
from .symmetry import is_invariant, verified_period
from .topology import FABRIC_PARTS, check_graph, cluster_graph, gpu_name, node_graph


def foldable(spec: ClusterSpec, period: int) -> bool:
    """True when the network of ``spec`` may be built only where it is looked at (see the
    module's docstring): a reduction asked for, no overrides, no per-flow ECMP hashing,
    NICs on every node."""
    return (0 < period < spec.nodes and spec.nodes % period == 0 and not spec.overrides
            and spec.network.ecmp != "hash" and spec.nic.per_node >= 1
            and spec.gpus_per_node >= 1)


def network_graph(spec: ClusterSpec, period: int):
    """The graph the flow-level network of ``spec`` needs for a symmetry period of ``period``
    nodes: a :class:`FoldedGraph` where :func:`foldable`, else the whole cluster graph
    (a :class:`~parosim.fabric.graphlite.LiteDiGraph`)."""
    if foldable(spec, period):
        return FoldedGraph(spec)
    return cluster_graph(spec, lite=True)


class _Lazy(dict):
    """A vertex-keyed table of a :class:`FoldedGraph`: a missing node's vertex is built on
    first lookup."""

    __slots__ = ("_g",)

    def __missing__(self, n):
        if self._g.build_for(n):
            return dict.__getitem__(self, n)
        raise KeyError(n)


class _Kinds(dict):
    """vertex -> kind for :class:`parosim.fabric.network.Router`, filled on lookup."""

    __slots__ = ("_g",)

    def __missing__(self, n):
        k = self[n] = self._g.nodes[n].get("kind")
        return k

    def get(self, n, default=None):
        try:
            return self[n]
        except KeyError:
            return default


class _RankNames:
    """rank -> GPU vertex name, as the builders name them (node-major ranks)."""

    def __init__(self, g: FoldedGraph):
        self._g = g

    def __getitem__(self, rank: int) -> str:
        spec = self._g.spec
        if not 0 <= rank < spec.gpus:
            raise KeyError(rank)
        name = gpu_name(rank // spec.gpus_per_node, rank % spec.gpus_per_node)
        assert self._g.nodes[name]["rank"] == rank  # the builders' numbering
        return name


class FoldedGraph(LiteDiGraph):
    """The cluster graph of a homogeneous ``spec``: switches at once, nodes on first lookup.

    Lookups (``nodes[v]``, ``edges[u, v]``, ``successors``, ``predecessors``, ``has_edge``,
    ``in``) see the whole graph; iterating (``nodes()``, ``edges()``, ``len``) sees only the
    nodes built so far, which is why only :class:`parosim.fabric.network.Network` (which
    never iterates it) is given one.
    """

    def __init__(self, spec: ClusterSpec):
        super().__init__(name=spec.name, parosim_builder=True)
        for attr in ("_node", "_succ", "_pred"):
            table = _Lazy()
            table._g = self
            setattr(self, attr, table)
        self.spec = spec
        self._built: set[int] = set()
        switches, self._attach = FABRIC_PARTS[spec.network.fabric]
        switches(self, spec)
        self._switches = list(dict.keys(self._node))

    # -- building -------------------------------------------------------------------------
    @property
    def built_nodes(self) -> int:
        return len(self._built)

    def node_of(self, n) -> int | None:
        """The node index a vertex name ``n{i}/...`` belongs to (None: not a node's)."""
        if not isinstance(n, str) or not n.startswith("n"):
            return None
        head, sep, _ = n.partition("/")
        if not sep or not head[1:].isdigit():
            return None
        i = int(head[1:])
        return i if i < self.spec.nodes else None

    def build(self, i: int) -> None:
        """Add node ``i``: its own graph and its links to the switches."""
        if i in self._built:
            return
        self._built.add(i)
        self.update(node_graph(self.spec, i, lite=True))
        self._attach(self, self.spec, i)

    def build_for(self, n) -> bool:
        """Build the node vertex ``n`` belongs to; True if ``n`` now exists."""
        i = self.node_of(n)
        if i is None or i in self._built:
            return False
        self.build(i)
        return dict.__contains__(self._node, n)

    def build_all(self) -> None:
        for i in range(self.spec.nodes):
            self.build(i)

    def __contains__(self, n) -> bool:
        return dict.__contains__(self._node, n) or self.build_for(n)

    def has_edge(self, u, v) -> bool:
        return u in self and v in self and dict.__contains__(self._succ[u], v)

    def to_networkx(self):
        self.build_all()  # a search on the networkx copy needs every vertex
        return super().to_networkx()

    # -- what parosim.fabric.network.Network asks of a graph ------------------------------
    def switch_graph(self):
        """The switches and the links between them as a :class:`networkx.DiGraph`, in the
        whole graph's order (what :class:`parosim.fabric.network.Router` searches between
        the switches of two NICs; every NIC of a builder-made graph is on one switch)."""
        import networkx as nx  # deferred: networkx loads only when this runs

        g = nx.DiGraph()
        g.add_nodes_from((n, dict.__getitem__(self._node, n)) for n in self._switches)
        sw = set(self._switches)
        g.add_edges_from((u, v, d) for u in self._switches
                         for v, d in dict.items(self._succ[u]) if v in sw)
        return g


    def kinds(self) -> _Kinds:
        k = _Kinds()
        k._g = self
        return k

    def rank_names(self) -> _RankNames:
        return _RankNames(self)

    def link_class_counts(self) -> dict[str, int]:
        """Directed links per class in the whole graph: node 0's links (its own and those to
        the switches) times the node count, plus the links between switches."""
        self.build(0)
        mine = {v for v in dict.keys(self._node) if self.node_of(v) == 0}
        per_node, switch = Counter(), Counter()
        for u in list(dict.keys(self._node)):
            for v, d in dict.items(self._succ[u]):
                if u in mine or v in mine:
                    per_node[d["link_class"]] += 1
                elif self.node_of(u) is None and self.node_of(v) is None:
                    switch[d["link_class"]] += 1
        out: dict[str, int] = {}
        for cls in sorted(set(per_node) | set(switch)):
            out[cls] = per_node[cls] * self.spec.nodes + switch[cls]
        return out

    def verified_period(self, candidate: int) -> int:
        """The period the network may fold on (``spec.nodes``: none), proved as the module's
        docstring says: the switch part and the first ``candidate`` nodes against their
        image; on failure the whole graph is built and checked."""
        nodes, gpn = self.spec.nodes, self.spec.gpus_per_node
        if candidate <= 0 or candidate >= nodes or nodes % candidate:
            return nodes
        for i in range(min(2 * candidate, nodes)):
            self.build(i)
        check_graph(self)  # schema and connectivity of what is built
        domain = [v for v in dict.keys(self._node)
                  if (self.node_of(v) or 0) < candidate]  # first T nodes and the switches
        inside = set(domain)
        edges = [(u, v, d) for u in list(dict.keys(self._node))
                 for v, d in dict.items(self._succ[u])
                 if (u in inside and self.node_of(u) is not None)
                 or (v in inside and self.node_of(v) is not None)
                 or (self.node_of(u) is None and self.node_of(v) is None)]
        if is_invariant(self, nodes, gpn, candidate, vertices=domain, edges=edges):
            return candidate
        self.build_all()
        return verified_period(self, nodes, gpn, candidate)
