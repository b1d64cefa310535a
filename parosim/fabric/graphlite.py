"""A minimal directed graph with the part of :class:`networkx.DiGraph`'s interface that the
topology builders and the flow-level network use.

``parosim collective`` builds its cluster graph with it so that the command does not pay for
importing networkx (about a third of its start-up); :meth:`LiteDiGraph.to_networkx` gives the
real thing. Node and edge attributes are plain dicts, as in networkx.

>>> g = LiteDiGraph(name="x")
>>> g.add_edge("a", "b", bandwidth_Bps=1.0)
>>> g.edges["a", "b"]["bandwidth_Bps"], list(g.successors("a")), g.has_edge("b", "a")
(1.0, ['b'], False)
>>> sorted(g.nodes), g.graph["name"]
(['a', 'b'], 'x')
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class _NodeView:
    def __init__(self, g: LiteDiGraph):
        self._g = g

    def __getitem__(self, n) -> dict:
        return self._g._node[n]

    def __iter__(self) -> Iterator:
        return iter(self._g._node)

    def __len__(self) -> int:
        return len(self._g._node)

    def __contains__(self, n) -> bool:
        return n in self._g._node

    def __call__(self, data: bool | str = False, default: Any = None):
        if data is False:
            return iter(self._g._node)
        if data is True:
            return iter(self._g._node.items())
        return ((n, d.get(data, default)) for n, d in self._g._node.items())


class _EdgeView:
    def __init__(self, g: LiteDiGraph):
        self._g = g

    def __getitem__(self, uv) -> dict:
        u, v = uv
        return self._g._succ[u][v]

    def __iter__(self) -> Iterator:
        return ((u, v) for u, nb in self._g._succ.items() for v in nb)

    def __len__(self) -> int:
        return sum(len(nb) for nb in self._g._succ.values())

    def __call__(self, data: bool | str = False, default: Any = None):
        succ = self._g._succ
        if data is False:
            return iter(self)
        if data is True:
            return ((u, v, d) for u, nb in succ.items() for v, d in nb.items())
        return ((u, v, d.get(data, default)) for u, nb in succ.items() for v, d in nb.items())


class LiteDiGraph:
    """Directed graph: ``add_node``, ``add_edge``, ``remove_edge``, ``update``, ``nodes``,
    ``edges``, ``successors``, ``predecessors``, ``has_edge``, ``graph`` (attributes)."""

    def __init__(self, **attr):
        self.graph: dict[str, Any] = dict(attr)
        self._node: dict[Any, dict] = {}
        self._succ: dict[Any, dict] = {}
        self._pred: dict[Any, dict] = {}

    def add_node(self, n, **attr) -> None:
        if n not in self._node:
            self._node[n] = {}
            self._succ[n] = {}
            self._pred[n] = {}
        self._node[n].update(attr)

    def add_edge(self, u, v, **attr) -> None:
        succ = self._succ
        if u not in succ:
            self.add_node(u)
        if v not in succ:
            self.add_node(v)
        d = succ[u].get(v)
        if d is None:
            succ[u][v] = self._pred[v][u] = attr  # a fresh dict from **attr
        else:
            d.update(attr)

    def remove_edge(self, u, v) -> None:
        try:
            del self._succ[u][v]
            del self._pred[v][u]
        except KeyError:
            raise KeyError(f"edge {u!r} -> {v!r} is not in the graph") from None

    def update(self, other: LiteDiGraph) -> None:
        """Add ``other``'s nodes and edges (attributes copied)."""
        for n, d in other._node.items():
            if n in self._node:
                self._node[n].update(d)
            else:
                self._node[n] = dict(d)
                self._succ[n] = {}
                self._pred[n] = {}
        succ, pred = self._succ, self._pred
        for u, nb in other._succ.items():
            su = succ[u]
            for v, d in nb.items():
                if v in su:
                    su[v].update(d)
                else:
                    su[v] = pred[v][u] = dict(d)

    @property
    def nodes(self) -> _NodeView:
        return _NodeView(self)

    @property
    def edges(self) -> _EdgeView:
        return _EdgeView(self)

    def successors(self, n) -> Iterator:
        return iter(self._succ[n])

    def predecessors(self, n) -> Iterator:
        return iter(self._pred[n])

    def has_edge(self, u, v) -> bool:
        return u in self._succ and v in self._succ[u]

    def __iter__(self) -> Iterator:
        return iter(self._node)

    def __contains__(self, n) -> bool:
        return n in self._node

    def __len__(self) -> int:
        return len(self._node)

    def number_of_nodes(self) -> int:
        return len(self._node)

    def number_of_edges(self) -> int:
        return len(self.edges)

    def is_strongly_connected(self) -> tuple[bool, Any, Any]:
        """(connected, a node the first node cannot reach or that cannot reach it, first)."""
        if not self._node:
            return True, None, None
        first = next(iter(self._node))
        for nbrs in (self._succ, self._pred):
            seen, stack = {first}, [first]
            while stack:
                for v in nbrs[stack.pop()]:
                    if v not in seen:
                        seen.add(v)
                        stack.append(v)
            if len(seen) != len(self._node):
                return False, next(n for n in self._node if n not in seen), first
        return True, None, None

    def to_networkx(self):
        import networkx as nx  # deferred: networkx loads only when this runs

        g = nx.DiGraph(**self.graph)
        g.add_nodes_from(self._node.items())
        g.add_edges_from((u, v, d) for u, nb in self._succ.items() for v, d in nb.items())
        return g
