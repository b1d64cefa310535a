"""Cluster graphs: small pure builders returning a :class:`networkx.DiGraph`.

Schema (written once, here):

Nodes
    ``kind``: one of ``"gpu"``, ``"nvswitch"``, ``"pcie_switch"``, ``"nic"``, ``"switch"``.
    GPUs also carry ``rank`` (global rank, node-major), ``node`` and ``local``; NICs and node
    switches carry ``node`` (and NICs ``local``, their index in the node).
Edges (directed; every physical link is two edges, one per direction)
    ``bandwidth_Bps``: per-direction capacity in bytes/s;
    ``latency_s``: one-way latency of the hop in seconds;
    ``link_class``: ``"nvlink"`` (GPU <-> NVSwitch), ``"pcie"`` (GPU <-> NIC, or GPU <->
    PCIe switch for a node without NVLink), ``"nic"`` (NIC <-> first switch), ``"uplink"``
    (switch <-> switch).

Node names: ``n{i}/gpu{j}``, ``n{i}/nvswitch``, ``n{i}/nic{k}``, ``switch``, ``leaf{l}``,
``rail{k}``, ``spine`` (or ``spine{s}`` for explicit spines). Builders compose like networkx
generators:

>>> g = node_graph(ClusterSpec(nodes=1, gpus_per_node=2), 0)
>>> sorted(g.nodes)
['n0/gpu0', 'n0/gpu1', 'n0/nic0', 'n0/nvswitch']
>>> g = cluster_graph(ClusterSpec(nodes=2, gpus_per_node=8))
>>> sum(1 for _, k in g.nodes(data="kind") if k == "gpu")
16
"""

from __future__ import annotations

from ..errors import InputError
from ..spec.system import ClusterSpec, IntraFabric, NetworkFabric
from .graphlite import LiteDiGraph


class _LazyNetworkx:
    """``nx``, imported on first use (``parosim collective`` builds a LiteDiGraph instead)."""

    def __getattr__(self, name: str):
        import networkx  # deferred: networkx loads only when this runs

        return getattr(networkx, name)


nx = _LazyNetworkx()

LINK_CLASSES = ("nvlink", "pcie", "nic", "uplink")


def gpu_name(node: int, local: int) -> str:
    return f"n{node}/gpu{local}"


def nic_name(node: int, k: int) -> str:
    return f"n{node}/nic{k}"


def _link(g: nx.DiGraph, a: str, b: str, bw: float, lat: float, cls: str) -> None:
    """Add a full-duplex link: two directed edges with the same attributes."""
    for u, v in ((a, b), (b, a)):
        g.add_edge(u, v, bandwidth_Bps=bw, latency_s=lat, link_class=cls)


def node_graph(spec: ClusterSpec, i: int, lite: bool = False) -> nx.DiGraph:
    """One node: its GPUs on an NVSwitch (or PCIe switch) and its NICs on PCIe.

    The intra-node latency ``spec.intra.latency_s`` is GPU-to-GPU: half on each hop.
    """
    g = LiteDiGraph() if lite else nx.DiGraph()
    m = spec.gpus_per_node
    nvlink = spec.intra_fabric is IntraFabric.NVSWITCH
    hub = f"n{i}/nvswitch" if nvlink else f"n{i}/pcie_switch"
    g.add_node(hub, kind="nvswitch" if nvlink else "pcie_switch", node=i)
    for j in range(m):
        g.add_node(gpu_name(i, j), kind="gpu", rank=i * m + j, node=i, local=j)
        _link(g, gpu_name(i, j), hub, spec.intra.bandwidth_Bps, spec.intra.latency_s / 2,
              "nvlink" if nvlink else "pcie")
    for k in range(spec.nic.per_node):
        g.add_node(nic_name(i, k), kind="nic", node=i, local=k)
    for j in range(m if spec.nic.per_node else 0):
        _link(g, gpu_name(i, j), nic_name(i, spec.nic_of(j)), spec.pcie.bandwidth_Bps,
              spec.pcie.latency_s, "pcie")
    return g


def _nics(spec: ClusterSpec, i: int) -> list[str]:
    return [nic_name(i, k) for k in range(spec.nic.per_node)]


def single_switch(g: nx.DiGraph, spec: ClusterSpec) -> nx.DiGraph:
    """Every NIC on one non-blocking switch."""
    g.add_node("switch", kind="switch")
    for i in range(spec.nodes):
        _attach_single(g, spec, i)
    return g


def _attach_single(g: nx.DiGraph, spec: ClusterSpec, i: int) -> None:
    """Node ``i``'s NICs on the switch."""
    half = spec.nic.latency_s / 2
    for nic in _nics(spec, i):
        _link(g, nic, "switch", spec.nic.bandwidth_Bps, half, "nic")


def leaf_spine(g: nx.DiGraph, spec: ClusterSpec) -> nx.DiGraph:
    """Leaves of ``nodes_per_leaf`` nodes under one logical spine (``network.spines = 0``)
    or under ``spines`` explicit spine switches ``spine0 .. spine{S-1}``.

    Each leaf's uplink capacity is (downlink capacity) / oversubscription. With one logical
    spine it is one bundle: ideal ECMP spreading (a fluid model), which also makes the route
    between two GPUs unique and so deterministic. With S explicit spines each leaf has one
    uplink of 1/S of that to each spine; how flows use them is ``network.ecmp`` (the graph
    attribute ``ecmp``, read by :class:`parosim.fabric.routing.Router`).
    """
    _leaf_spine_switches(g, spec)
    for i in range(spec.nodes):
        _attach_leaf(g, spec, i)
    return g


def _leaf_spine_switches(g: nx.DiGraph, spec: ClusterSpec) -> None:
    """The spines, the leaves and the uplinks between them."""
    net = spec.network
    per_leaf = net.nodes_per_leaf
    leaves = -(-spec.nodes // per_leaf)
    down = per_leaf * spec.nic.per_node * spec.nic.bandwidth_Bps
    spines = [f"spine{s}" for s in range(net.spines)] if net.spines else ["spine"]
    if net.spines:
        g.graph.update(ecmp=net.ecmp, ecmp_seed=net.ecmp_seed)
    for sp in spines:
        g.add_node(sp, kind="switch")
    for leaf in range(leaves):
        g.add_node(f"leaf{leaf}", kind="switch")
        for sp in spines:
            _link(g, f"leaf{leaf}", sp, down / net.oversubscription / len(spines),
                  net.uplink_latency_s, "uplink")


def _attach_leaf(g: nx.DiGraph, spec: ClusterSpec, i: int) -> None:
    """Node ``i``'s NICs on its leaf, ``leaf{i // nodes_per_leaf}``."""
    half = spec.nic.latency_s / 2
    leaf = f"leaf{i // spec.network.nodes_per_leaf}"
    for nic in _nics(spec, i):
        _link(g, nic, leaf, spec.nic.bandwidth_Bps, half, "nic")


def rail(g: nx.DiGraph, spec: ClusterSpec) -> nx.DiGraph:
    """Rail-optimized: NIC k of every node on rail switch k; rails joined by a spine whose
    links carry (rail downlink capacity) / oversubscription."""
    _rail_switches(g, spec)
    for i in range(spec.nodes):
        _attach_rail(g, spec, i)
    return g


def _rail_switches(g: nx.DiGraph, spec: ClusterSpec) -> None:
    """The spine, the rails and the uplinks between them."""
    net = spec.network
    g.add_node("spine", kind="switch")
    down = spec.nodes * spec.nic.bandwidth_Bps
    for k in range(spec.nic.per_node):
        g.add_node(f"rail{k}", kind="switch")
        _link(g, f"rail{k}", "spine", down / net.oversubscription, net.uplink_latency_s,
              "uplink")


def _attach_rail(g: nx.DiGraph, spec: ClusterSpec, i: int) -> None:
    """Node ``i``'s NIC k on rail k."""
    half = spec.nic.latency_s / 2
    for k in range(spec.nic.per_node):
        _link(g, nic_name(i, k), f"rail{k}", spec.nic.bandwidth_Bps, half, "nic")


_FABRICS = {NetworkFabric.SINGLE_SWITCH: single_switch, NetworkFabric.LEAF_SPINE: leaf_spine,
            NetworkFabric.RAIL: rail}
# per fabric: (its switches and the links between them, node i's links to them); the
# builders above are these two in turn, and parosim.fabric.folded builds nodes one by one
FABRIC_PARTS = {
    NetworkFabric.SINGLE_SWITCH: (lambda g, spec: g.add_node("switch", kind="switch"),
                                  _attach_single),
    NetworkFabric.LEAF_SPINE: (_leaf_spine_switches, _attach_leaf),
    NetworkFabric.RAIL: (_rail_switches, _attach_rail),
}


def cluster_graph(spec: ClusterSpec, lite: bool = False) -> nx.DiGraph:
    """The whole cluster: ``spec.nodes`` node graphs joined by the spec's network fabric.

    ``lite``: a :class:`~parosim.fabric.graphlite.LiteDiGraph` (same nodes, edges and attributes;
    no networkx import), which is what the flow-level network needs.
    Raises :class:`InputError` if the result is not strongly connected.
    """
    cls = LiteDiGraph if lite else nx.DiGraph
    g = cls(name=spec.name, parosim_builder=True)  # routing.Router's fast paths
    for i in range(spec.nodes):
        g.update(node_graph(spec, i, lite))
    if spec.nic.per_node:
        _FABRICS[spec.network.fabric](g, spec)
    apply_overrides(g, spec)
    check_graph(g)
    return g


def _set(g: nx.DiGraph, a: str, b: str, bw: float | None, lat: float | None) -> None:
    for u, v in ((a, b), (b, a)):
        d = g.edges[u, v]
        if bw is not None:
            d["bandwidth_Bps"] = bw
        if lat is not None:
            d["latency_s"] = lat


def apply_overrides(g: nx.DiGraph, spec: ClusterSpec) -> nx.DiGraph:
    """Apply ``spec.overrides`` in order (docs/heterogeneity.md).

    Node overrides set the links of that node's NICs to their first switch (``nic``; the
    latency is NIC-to-NIC through one switch, half on this side as the builders put it) and
    of its GPUs to the NVSwitch / PCIe switch (``intra_node``; GPU-to-GPU latency, half per
    hop). Link overrides change or remove (``failed``) both directions of a physical link.
    GPU types and speeds become GPU node attributes ``gpu_model``, ``speed``; the compute
    side reads them from the spec (:meth:`ClusterSpec.gpu_specs`).

    >>> from parosim.spec.system import Override
    >>> c = ClusterSpec(nodes=2, gpus_per_node=2,
    ...                 overrides=(Override(nodes=(1,), nic_bandwidth_Bps=1e9),))
    >>> g = cluster_graph(c)
    >>> g.edges["n1/nic0", "switch"]["bandwidth_Bps"], g.edges["n0/nic0", "switch"]["bandwidth_Bps"]
    (1000000000.0, 12500000000.0)
    """
    gpn = spec.gpus_per_node
    for k, o in enumerate(spec.overrides):
        if (o.nic_bandwidth_Bps is not None or o.nic_latency_s is not None) \
                and not spec.nic.per_node:
            raise InputError(f"overrides[{k}] sets nic on cluster {spec.name!r}, which has no "
                             "NICs (nic.per_node = 0); expected nic.per_node >= 1")
        for i in o.nodes:
            if o.nic_bandwidth_Bps is not None or o.nic_latency_s is not None:
                lat = None if o.nic_latency_s is None else o.nic_latency_s / 2
                for nic in _nics(spec, i):
                    for sw in [v for v in g.successors(nic)
                               if g.nodes[v]["kind"] == "switch"]:
                        _set(g, nic, sw, o.nic_bandwidth_Bps, lat)
            if o.intra_bandwidth_Bps is not None or o.intra_latency_s is not None:
                lat = None if o.intra_latency_s is None else o.intra_latency_s / 2
                hub = next(v for v in g.successors(gpu_name(i, 0))
                           if g.nodes[v]["kind"] in ("nvswitch", "pcie_switch"))
                for j in range(gpn):
                    _set(g, gpu_name(i, j), hub, o.intra_bandwidth_Bps, lat)
        names = [gpu_name(i, j) for i in o.nodes for j in range(gpn)] + list(o.gpus)
        for name in names:
            if o.gpu is not None:
                g.nodes[name]["gpu_model"] = o.gpu.model
            if o.speed is not None:
                g.nodes[name]["speed"] = o.speed
        for a, b in o.links:
            if not (g.has_edge(a, b) and g.has_edge(b, a)):
                raise InputError(f"overrides[{k}].links: no link between {a!r} and {b!r} in "
                                 f"cluster {spec.name!r}; expected two adjacent graph nodes "
                                 "(e.g. [n1/nic0, switch]; 'parosim cluster show' lists "
                                 "them)")
            if o.failed:
                g.remove_edge(a, b)
                g.remove_edge(b, a)
            else:
                _set(g, a, b, o.bandwidth_Bps, o.latency_s)
    return g


def check_graph(g: nx.DiGraph) -> None:
    """Check the schema and connectivity of a cluster graph (also user-built ones)."""
    for n, kind in g.nodes(data="kind"):
        if kind not in ("gpu", "nvswitch", "pcie_switch", "nic", "switch"):
            raise InputError(f"graph node {n!r} has kind {kind!r}; expected gpu, nvswitch, "
                             "pcie_switch, nic or switch")
    for u, v, d in g.edges(data=True):
        bw = d.get("bandwidth_Bps")
        if not isinstance(bw, (int, float)) or not bw > 0:
            raise InputError(f"link {u} -> {v} has bandwidth_Bps {bw!r}; expected > 0")
        if d.get("link_class") not in LINK_CLASSES:
            raise InputError(f"link {u} -> {v} has link_class {d.get('link_class')!r}; "
                             f"expected one of {', '.join(LINK_CLASSES)}")
    if isinstance(g, LiteDiGraph):
        ok, stray, first = g.is_strongly_connected()
        if not ok:
            raise InputError(f"topology {g.graph.get('name', '')!r} is disconnected: "
                             f"{stray!r} and {first!r} do not reach each other; expected "
                             "every GPU to reach every other")
        return
    if g.number_of_nodes() and not nx.is_strongly_connected(g):
        comps = sorted(nx.strongly_connected_components(g), key=lambda c: (-len(c), min(c)))
        stray = sorted(comps[1])[0]
        raise InputError(f"topology {g.graph.get('name', '')!r} is disconnected: {stray!r} "
                         f"cannot reach {sorted(comps[0])[0]!r} ({len(comps)} components); "
                         "expected every GPU to reach every other")


def cluster_inventory(spec: ClusterSpec) -> dict:
    """What ``parosim cluster show`` lists: every graph node (name, kind, node, GPU rank and,
    after the overrides, GPU model and speed) and every physical link (the pair of names the
    ``links:`` overrides take, its class, per-direction bandwidth and one-way latency), a
    failed link with ``failed: true`` and the values it had. Names are those of the graph the
    simulator routes on (``n{i}/gpu{j}``, ``n{i}/nvswitch``, ``n{i}/nic{k}``, ``switch``,
    ``rail{k}``, ``leaf{l}``, ``spine``, ``spine{s}``).

    >>> inv = cluster_inventory(ClusterSpec(nodes=2, gpus_per_node=2))
    >>> [(x["a"], x["b"], x["link_class"]) for x in inv["links"]][:2]
    [('n0/gpu0', 'n0/nvswitch', 'nvlink'), ('n0/gpu1', 'n0/nvswitch', 'nvlink')]
    """
    from dataclasses import replace  # deferred: only the inventory rebuilds a spec

    failed = [p for o in spec.overrides if o.failed for p in o.links]
    g = cluster_graph(spec)
    alive = g if not failed else cluster_graph(replace(spec, overrides=tuple(
        o for o in spec.overrides if not o.failed)))
    specs = spec.gpu_specs()
    nodes = []
    for n, d in g.nodes(data=True):
        row = {"name": n, "kind": d["kind"], "node": d.get("node")}
        if d["kind"] == "gpu":
            gpu, speed, mem = specs[d["rank"]]
            row.update(rank=d["rank"], local=d["local"], gpu_model=gpu.model, speed=speed,
                       memory_bytes=mem)
        elif d["kind"] == "nic":
            row["local"] = d["local"]
        nodes.append(row)
    down = {frozenset(p) for p in failed}
    links, seen = [], set()
    order = {"gpu": 0, "nic": 1, "nvswitch": 2, "pcie_switch": 2, "switch": 3}
    kinds = dict(alive.nodes(data="kind"))
    for u, v in list(alive.edges()):
        pair = frozenset((u, v))
        if pair in seen:
            continue
        seen.add(pair)
        # the endpoint nearer a GPU first (GPU, NIC, hub, leaf / rail, spine), as YAML pairs
        if (order[kinds[v]], "spine" in v) < (order[kinds[u]], "spine" in u):
            u, v = v, u
        d, back = alive.edges[u, v], alive.edges[v, u]
        row = {"a": u, "b": v, "link_class": d["link_class"],
               "bandwidth_GBps": d["bandwidth_Bps"] / 1e9,
               "bandwidth_Gbps": d["bandwidth_Bps"] * 8 / 1e9, "latency_s": d["latency_s"],
               "failed": pair in down}
        if back["bandwidth_Bps"] != d["bandwidth_Bps"] or back["latency_s"] != d["latency_s"]:
            row.update(back_bandwidth_GBps=back["bandwidth_Bps"] / 1e9,
                       back_latency_s=back["latency_s"])
        links.append(row)
    counts: dict[str, int] = {}
    for x in links:
        if not x["failed"]:
            counts[x["link_class"]] = counts.get(x["link_class"], 0) + 1
    return {"cluster": spec.name, "nodes": spec.nodes, "gpus_per_node": spec.gpus_per_node,
            "gpus": spec.gpus, "nic_per_node": spec.nic.per_node,
            "intra_fabric": spec.intra_fabric.value, "network_fabric": spec.network.fabric.value,
            "graph_nodes": nodes, "links": links, "links_per_class": counts,
            "failed_links": sum(1 for x in links if x["failed"])}
