"""``parosim cluster show``: a cluster's nodes and links by the names overrides take.
"""

from __future__ import annotations

import argparse

EXAMPLES = ("examples:\n  parosim cluster show dgx-h100-ib\n"
            "  parosim cluster show dgx-a100-ib --nodes 16 --json\n"
            "  parosim cluster show my-whatif.yaml --set nic.bandwidth=100Gbps")


def add_parser(sub, parser_class) -> None:
    """The ``cluster`` command group and its ``show`` command."""
    c = sub.add_parser("cluster", help="list a cluster's nodes and links (the names "
                       "overrides and failed links take)", epilog=EXAMPLES)
    acts = c.add_subparsers(dest="action", required=True, parser_class=parser_class)
    s = acts.add_parser("show", epilog=EXAMPLES,
                        help="nodes, GPUs, NICs, switches and every link with its class, "
                        "bandwidth and latency")
    s.add_argument("cluster", help="preset name or cluster YAML path")
    s.add_argument("--set", action="append", default=None, metavar="KEY=VALUE",
                   help="change one key of the cluster YAML first (e.g. "
                   "nic.bandwidth=100Gbps); repeatable")
    s.add_argument("--nodes", type=int, default=None, help="override the node count")
    s.add_argument("--group-nodes", type=int, default=None,
                   help="nodes per PaRO group (default 1: a group is a node)")
    s.add_argument("--json", action="store_true", help="machine-readable result on stdout")


def cmd_cluster(a: argparse.Namespace) -> dict:
    from ..fabric.topology import cluster_inventory  # deferred: builds the graph (networkx)
    from ..io import load_cluster  # deferred: loaded when the command runs (start-up)

    spec = load_cluster(a.cluster, a.nodes, a.group_nodes, a.set or ())
    out = cluster_inventory(spec)
    if a.set:
        out["cluster_set"] = list(a.set)
    return out


def _bw(gbps: float) -> str:
    """Per-direction bandwidth as a YAML value would give it (GB/s and Gbit/s)."""
    return f"{gbps:g}GB/s ({gbps * 8:g}Gbps)"


def _span(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]}" if names else "-"


def show_cluster(r: dict) -> None:
    from ..units import fmt_bytes  # deferred: loaded when the command runs (start-up)

    print(f"cluster {r['cluster']}: {r['nodes']} nodes x {r['gpus_per_node']} GPUs = "
          f"{r['gpus']} GPUs, {r['intra_fabric']} in a node, {r['nic_per_node']} NIC(s) per "
          f"node, {r['network_fabric']} network")
    by_node: dict[int, list[dict]] = {}
    switches = []
    for x in r["graph_nodes"]:
        if x["node"] is None:
            switches.append(x["name"])
        else:
            by_node.setdefault(x["node"], []).append(x)
    print("selectors: overrides take nodes: [i] (0-based), gpus: [n<i>/gpu<j>], links: "
          "[[a, b]] with a and b the names below")
    print(f"{'node':>4}  {'GPUs':<24}{'GPU model':<18}{'memory':>10}{'speed':>7}  "
          f"{'hub':<16}NICs")
    for i in sorted(by_node):
        xs = by_node[i]
        gpus = [x for x in xs if x["kind"] == "gpu"]
        models = sorted({x["gpu_model"] for x in gpus})
        speeds = sorted({x["speed"] for x in gpus})
        mems = sorted({x["memory_bytes"] for x in gpus})
        hub = next((x["name"] for x in xs if x["kind"] in ("nvswitch", "pcie_switch")), "-")
        nics = [x["name"] for x in xs if x["kind"] == "nic"]
        print(f"{i:>4}  {_span([x['name'] for x in gpus]):<24}{'/'.join(models):<18}"
              f"{'/'.join(fmt_bytes(m) for m in mems):>10}"
              f"{'/'.join(f'{s:g}' for s in speeds):>7}  {hub:<16}{_span(nics)}")
    print(f"switches: {', '.join(switches) or '-'}")
    counts = ", ".join(f"{n} {c}" for c, n in r["links_per_class"].items())
    failed = f", {r['failed_links']} failed" if r["failed_links"] else ""
    print(f"links ({counts}{failed}; bandwidth per direction, latency one way):")
    wa = max((len(x["a"]) for x in r["links"]), default=4)
    wb = max((len(x["b"]) for x in r["links"]), default=4)
    for x in r["links"]:
        extra = " FAILED" if x["failed"] else ""
        if "back_bandwidth_GBps" in x:
            extra += f" (back: {_bw(x['back_bandwidth_GBps'])}, {x['back_latency_s'] * 1e6:g}us)"
        print(f"  [{x['a']:<{wa}}, {x['b']:<{wb}}]  {x['link_class']:<7}"
              f"{_bw(x['bandwidth_GBps']):<26}{x['latency_s'] * 1e6:g}us{extra}")
