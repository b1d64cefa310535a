"""``parosim collective``: one collective (the nccl-tests form is :mod:`.nccl`).
"""

from __future__ import annotations

import argparse

from ..errors import InputError
from .setup import seeded


def cmd_collective(a: argparse.Namespace) -> dict:
    from ..collectives import (  # deferred: loaded when the command runs (start-up)
        Op,
        Scope,
        parse_enum,
        simulate_collective,
    )
    from ..collectives.bench import parse_algos  # deferred: loaded when the command runs (start-up)
    from ..io import load_cluster  # deferred: loaded when the command runs (start-up)
    from ..units import parse_size  # deferred: loaded when the command runs (start-up)
    from .nccl import run as run_bench  # deferred: loaded when the command runs (start-up)
    from .nccl import wants_bench  # deferred: loaded when the command runs (start-up)

    if wants_bench(a):  # nccl-tests form: -b/-e/-f sweep or --compare LOG...
        if a.seed is not None:
            raise InputError("--seed goes with one collective, not with -b/-e/-f or "
                             "--compare; expected it without them")
        return run_bench(a)
    if a.plot or a.in_place:
        raise InputError("--plot and --in-place go with -b/-e/-f or --compare")
    spec = load_cluster(a.cluster, a.nodes, a.group_nodes, a.set or ())
    if a.seed is not None:  # the ECMP hash seed (a leaf-spine fabric with ecmp: hash)
        if spec.network.ecmp != "hash":
            raise InputError(f"--seed {a.seed} is the ECMP hash seed; cluster {spec.name!r} "
                             f"does not hash flows (network.ecmp: {spec.network.ecmp}); "
                             "expected it unset or a fabric with ecmp: hash")
        spec = seeded(spec, a.seed)
    op = parse_enum(Op, "all-gather" if a.op is None else a.op, "--op")
    scope = parse_enum(Scope, a.scope, "--scope")
    default = "p2p" if op is Op.ALL_TO_ALL else default_algo(a)
    algos = parse_algos(default if a.algo is None else a.algo, op)
    size = parse_size(a.size if a.size is not None else "1GiB", "--size")
    results = [simulate_collective(spec, op, scope, size, al).to_dict() for al in algos]
    settings = {"nodes": spec.nodes, "gpus_per_node": spec.gpus_per_node,
                "group_nodes": spec.group_nodes, "size": a.size if a.size is not None
                else "1GiB", "nic_bandwidth_Bps": spec.nic.bandwidth_Bps,
                "intra_bandwidth_Bps": spec.intra.bandwidth_Bps}
    if a.algo is None:   # the fidelity chose the algorithm (echoed only then)
        settings["fidelity"] = a.fidelity
    for r in results:
        r["cluster"] = spec.name
        r["settings"] = settings
    return results[0] if len(results) == 1 else {"results": results}


def show_collective(res: dict) -> None:
    from ..units import (  # deferred: loaded when the command runs (start-up)
        fmt_bytes,
        fmt_size,
        fmt_time,
    )

    if "rows" in res:  # nccl-tests form (sweep or --compare)
        from .nccl import print_result  # deferred: loaded when the command runs (start-up)

        return print_result(res)
    rows = res.get("results", [res])
    r0 = rows[0]
    print(f"{r0['op']} of {fmt_size(r0['size_bytes'])} over scope {r0['scope']} "
          f"(k = {r0['ring_size']} ranks per collective instance, the n of the busbw factor) "
          f"on {r0['cluster']}, {r0['gpus']} GPUs")
    print(f"{'algo':<14}{'time':>14}{'algbw GB/s':>12}{'busbw GB/s':>12}{'chunks':>8}   "
          "link class: bytes (busiest link busy)")
    for r in rows:
        links = ", ".join(f"{c}: {fmt_bytes(v['bytes'])} ({fmt_time(v['busy_s'])})"
                          for c, v in r["links"].items() if v["bytes"] > 0)
        print(f"{r['algo']:<14}{fmt_time(r['time_s']):>14}{r['algbw_GBps']:>12.2f}"
              f"{r['busbw_GBps']:>12.2f}{r['chunks']:>8}   {links}")


def default_algo(a) -> str:
    """The algorithm of an unset ``--algo``: NCCL's tuner (``--fidelity accurate``, the
    default) or HO-Ring (``--fidelity paper``)."""
    return "nccl" if a.fidelity == "accurate" else "ho-ring"

