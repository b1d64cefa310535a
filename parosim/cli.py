"""The ``parosim`` command line: parse, call io and the core, print. Nothing else.

Bad input gives one line on stderr and exit code 2 (never a traceback).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

from .errors import InputError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one clear line, exit 2
        self.exit(2, f"parosim: error: {message}\n")


def _common_cluster(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster", default="paper-a100-roce",
                   help="preset name or YAML path (default: paper-a100-roce)")
    p.add_argument("--nodes", type=int, default=None, help="override the node count")
    p.add_argument("--group-nodes", type=int, default=None,
                   help="nodes per PaRO group (default 1: a group is a node)")
    p.add_argument("--json", action="store_true", help="machine-readable result on stdout")


def _cmd_collective(a: argparse.Namespace) -> dict:
    from .collectives import Algo, Op, Scope, parse_enum, simulate_collective
    from .io import load_cluster
    from .units import parse_size

    spec = load_cluster(a.cluster, a.nodes, a.group_nodes)
    op = parse_enum(Op, a.op, "--op")
    scope = parse_enum(Scope, a.scope, "--scope")
    algos = list(Algo) if a.algo == "all" else [parse_enum(Algo, a.algo, "--algo")]
    size = parse_size(a.size, "--size")
    results = [simulate_collective(spec, op, scope, size, al).to_dict() for al in algos]
    for r in results:
        r["cluster"] = spec.name
    return results[0] if len(results) == 1 else {"results": results}


def _print_collective(res: dict) -> None:
    from .units import fmt_bytes, fmt_time

    rows = res.get("results", [res])
    r0 = rows[0]
    print(f"{r0['op']} of {fmt_bytes(r0['size_bytes'])} over scope {r0['scope']} "
          f"(k = {r0['ring_size']} ranks per ring) on {r0['cluster']}, {r0['gpus']} GPUs")
    print(f"{'algo':<14}{'time':>14}{'algbw GB/s':>12}{'busbw GB/s':>12}{'chunks':>8}   "
          "link class: bytes (busiest link busy)")
    for r in rows:
        links = ", ".join(f"{c}: {fmt_bytes(v['bytes'])} ({fmt_time(v['busy_s'])})"
                          for c, v in r["links"].items() if v["bytes"] > 0)
        print(f"{r['algo']:<14}{fmt_time(r['time_s']):>14}{r['algbw_GBps']:>12.2f}"
              f"{r['busbw_GBps']:>12.2f}{r['chunks']:>8}   {links}")


COMMANDS: dict[str, tuple[Callable, Callable | None]] = {
    "collective": (_cmd_collective, _print_collective),
}


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="parosim", description="Simulate data-parallel LLM training with PaRO "
                "strategies and Ring / hierarchical / HO-Ring collectives.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    c = sub.add_parser("collective", help="simulate one collective")
    c.add_argument("--op", default="all-gather", help="all-gather | reduce-scatter | all-reduce")
    c.add_argument("--size", default="1GiB",
                   help="full buffer as nccl-tests counts it (AG output, RS input, AR buffer)")
    c.add_argument("--scope", default="global", help="global | intra | inter")
    c.add_argument("--algo", default="ho-ring", help="ring | hierarchical | ho-ring | all")
    _common_cluster(c)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    a = parser.parse_args(argv)
    run, show = COMMANDS[a.command]
    try:
        res = run(a)
    except InputError as e:
        print(f"parosim: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("parosim: interrupted", file=sys.stderr)
        return 130
    if getattr(a, "json", False) or show is None:
        json.dump(res, sys.stdout, indent=2, sort_keys=False)
        sys.stdout.write("\n")
    else:
        show(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
