"""``parosim collective`` in nccl-tests form: ``-b/-e/-f`` size sweeps and ``--compare LOG``.

Called by :mod:`parosim.cli`; reads logs through :mod:`parosim.io.nccltests`, plots through
matplotlib (imported only for ``--plot``). JSON keys (units in names):

* sweep: ``{"op", "scope", "cluster", "gpus", "algos", "rows": [collective objects]}``, each
  row with the ``parosim collective`` keys (``op``, ``algo``, ``scope``, ``gpus``,
  ``size_bytes``, ``time_s``, ``algbw_GBps``, ``busbw_GBps``, ...);
* compare: ``{"algo", "cluster", "logs": [{"log", "op", "nranks", "nodes", "source",
  "summary"}], "rows": [{"log", "op", "algo", "cluster", "gpus", "size_bytes", "measured_s",
  "simulated_s", "error_pct", "measured_busbw_GBps", "simulated_busbw_GBps"}]}``;
  ``summary`` has ``large_*`` (sizes >= 64 KiB) and ``small_*`` median / max |error| in %.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import InputError


def add_arguments(c: argparse.ArgumentParser) -> None:
    """The nccl-tests flags of ``parosim collective``."""
    c.add_argument("-b", "--minbytes", default=None,
                   help="nccl-tests sweep: smallest size, e.g. 8 (with -e, -f)")
    c.add_argument("-e", "--maxbytes", default=None, help="nccl-tests sweep: largest size, e.g. 8G")
    c.add_argument("-f", "--stepfactor", default=None, help="nccl-tests sweep: size factor (2)")
    c.add_argument("--compare", "--nccl-tests", dest="compare", nargs="+", default=None,
                   metavar="LOG", help="nccl-tests output files (all_reduce_perf, "
                   "all_gather_perf, reduce_scatter_perf): simulated vs measured per size "
                   "(--nccl-tests: the same, as calibrate spells it)")
    c.add_argument("--plot", default=None, metavar="FILE",
                   help="with -b/-e or --compare: draw time vs size (log-log) to FILE")
    c.add_argument("--in-place", action="store_true",
                   help="with --compare: compare with the in-place times of the logs")


def wants_bench(a: argparse.Namespace) -> bool:
    return bool(a.compare) or a.minbytes is not None or a.maxbytes is not None \
        or a.stepfactor is not None


def _nccl_size(text: str, what: str) -> int:
    """nccl-tests sizes: ``8``, ``64K``, ``8G`` (binary, like nccl-tests) or parosim units."""
    from ..units import parse_size  # deferred: loaded when the command runs (start-up)

    t = str(text).strip()
    if t and t[-1] in "KMGT" and t[:-1].replace(".", "", 1).isdigit():
        t = t + "iB"
    return parse_size(t, what)


def run(a: argparse.Namespace) -> dict:
    from ..collectives.bench import (  # deferred: loaded when the command runs (start-up)
        default_compare_algo,
        parse_algos,
    )

    if a.compare and (a.minbytes or a.maxbytes or a.stepfactor):
        raise InputError("--compare takes its sizes from the logs; expected no -b/-e/-f with it")
    if a.size is not None:
        raise InputError("--size is for one collective; expected either --size or -b/-e/-f "
                         "or --compare")
    if a.compare:
        algos = parse_algos(a.algo) if a.algo else [default_compare_algo()]
        return _compare(a, algos)
    from ..collectives import Op, parse_enum  # deferred: loaded when the command runs (start-up)

    op = parse_enum(Op, a.op or "all-gather", "--op")
    algos = parse_algos(a.algo or ("p2p" if op is Op.ALL_TO_ALL else "nccl"
                                   if a.fidelity == "accurate" else "ho-ring"), op)
    return _sweep(a, algos)


def _sweep(a: argparse.Namespace, algos) -> dict:
    from ..collectives import (  # deferred: loaded when the command runs (start-up)
        Op,
        Scope,
        parse_enum,
    )
    from ..collectives.bench import (  # deferred: loaded when the command runs (start-up)
        size_range,
        sweep,
    )
    from ..io import load_cluster  # deferred: loaded when the command runs (start-up)

    if a.plot is not None and not str(a.plot).strip():
        raise InputError("--plot '' is empty; expected a file name like sweep.png")
    spec = load_cluster(a.cluster, a.nodes, a.group_nodes, a.set or ())
    op = parse_enum(Op, a.op or "all-gather", "--op")
    scope = parse_enum(Scope, a.scope, "--scope")
    b = _nccl_size(a.minbytes or a.maxbytes or "32M", "-b")
    e = _nccl_size(a.maxbytes or a.minbytes or "32M", "-e")
    try:
        f = float(a.stepfactor) if a.stepfactor is not None else 2.0
    except ValueError:
        raise InputError(f"-f {a.stepfactor!r} is not a number; expected e.g. 2") from None
    rows = sweep(spec, op, size_range(b, e, f), algos, scope)
    res = {"op": op.value, "scope": scope.value, "cluster": spec.name, "gpus": spec.gpus,
           "algos": [al.value for al in algos], "rows": rows}
    if a.plot:
        res["plot"] = _plot_sweep(res, a.plot)
    return res


def _compare(a: argparse.Namespace, algos) -> dict:
    from ..collectives import Op, parse_enum  # deferred: loaded when the command runs (start-up)
    from ..collectives.bench import (  # deferred: loaded when the command runs (start-up)
        cluster_for_log,
        compare_log,
        error_summary,
    )
    from ..io import load_cluster  # deferred: loaded when the command runs (start-up)
    from ..io.nccltests import read_nccl_tests  # deferred: loaded when the command runs (start-up)

    if a.plot is not None and not str(a.plot).strip():
        raise InputError("--plot '' is empty; expected a file name like compare.png")
    from ..collectives import Scope  # deferred: loaded when the command runs (start-up)

    scope = parse_enum(Scope, a.scope, "--scope")
    if scope is not Scope.GLOBAL:
        raise InputError(f"--scope {scope.value} cannot apply with --compare: an nccl-tests "
                         "log times the collective over all its ranks (scope global); "
                         "expected no --scope with --compare")
    base = load_cluster(a.cluster, None, a.group_nodes, a.set or ())
    want_op = parse_enum(Op, a.op, "--op").value if a.op else None
    logs, rows = [], []
    for path in a.compare:
        log = read_nccl_tests(path)
        if want_op and log.op != want_op:
            raise InputError(f"--op {want_op} but nccl-tests log {path!r} is {log.op}")
        spec = cluster_for_log(base, log, a.nodes)
        for al in algos:
            r = compare_log(spec, log, al, engine=True, in_place=a.in_place)
            rows.extend(r)
            logs.append({"log": path, "op": log.op, "algo": al.value, "nranks": log.nranks,
                         "nodes": spec.nodes, "source": log.source,
                         "summary": error_summary(r)})
    res = {"cluster": base.name, "algos": [al.value for al in algos], "logs": logs,
           "rows": rows}
    if a.plot:
        res["plot"] = _plot_compare(res, a.plot)
    return res


def print_result(res: dict) -> None:
    if "logs" in res:
        _print_compare(res)
    else:
        _print_sweep(res)


def _print_sweep(res: dict) -> None:
    from ..io.nccltests import format_table  # deferred: loaded when the command runs (start-up)

    algos = res["algos"]
    by_size: dict[int, dict] = {}
    for r in res["rows"]:
        d = by_size.setdefault(r["size_bytes"], {"size_bytes": int(r["size_bytes"]),
                                                 "time_s": {}, "algbw_GBps": {},
                                                 "busbw_GBps": {}})
        for k in ("time_s", "algbw_GBps", "busbw_GBps"):
            d[k][r["algo"]] = r[k]
    print(f"# parosim collective: {res['op']} over scope {res['scope']} on {res['cluster']}, "
          f"{res['gpus']} GPUs (simulated; times in us, bandwidths in GB/s)")
    print(format_table(res["op"], list(by_size.values()), algos))
    if res.get("plot"):
        print(f"# plot written to {res['plot']}")


def _print_compare(res: dict) -> None:
    from ..units import fmt_bytes  # deferred: loaded when the command runs (start-up)

    for lg in res["logs"]:
        rows = [r for r in res["rows"] if r["log"] == lg["log"] and r["algo"] == lg["algo"]]
        print(f"{lg['log']}: {lg['op']}, {lg['nranks']} ranks on {lg['nodes']} nodes of "
              f"{res['cluster']}, algo {lg['algo']}")
        print(f"  source: {lg['source']}")
        print(f"  {'size':>10}{'measured us':>14}{'simulated us':>14}{'error %':>9}"
              f"{'meas busbw':>12}{'sim busbw':>11}")
        for r in rows:
            print(f"  {fmt_bytes(r['size_bytes']):>10}{r['measured_s'] * 1e6:>14.1f}"
                  f"{r['simulated_s'] * 1e6:>14.1f}{r['error_pct']:>+9.1f}"
                  f"{r['measured_busbw_GBps']:>12.2f}{r['simulated_busbw_GBps']:>11.2f}")
        s = lg["summary"]

        def f(v):
            return "-" if v is None else f"{v:.1f}"

        print(f"  |error| sizes >= 64 KiB ({s['large_n']}): median "
              f"{f(s['large_median_abs_error_pct'])}"
              f" %, worst {f(s['large_max_abs_error_pct'])} %; below 64 KiB ({s['small_n']}): "
              f"median {f(s['small_median_abs_error_pct'])} %, worst "
              f"{f(s['small_max_abs_error_pct'])} %")
    if res.get("plot"):
        print(f"plot written to {res['plot']}")


def _savefig(fig, path: str) -> str:
    from ..plots.figures import save_as  # deferred: loaded when the command runs (start-up)

    p = Path(path)
    try:
        if p.parent and not p.parent.exists():
            p.parent.mkdir(parents=True, exist_ok=True)
        save_as(fig, p)
    except (OSError, ValueError) as e:
        raise InputError(f"--plot {path!r} cannot be written: {e}") from None
    return str(p)


SIZE_LABEL = "message size (bytes, the full buffer as nccl-tests counts it)"


def sweep_figure(res: dict):
    """Simulated time vs message size, one line per algorithm (``collective -b/-e --plot``)."""
    from matplotlib.figure import Figure  # deferred: matplotlib loads only when this runs

    from ..plots.figures import bytes_x  # deferred: loaded when the command runs (start-up)

    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.add_subplot()
    for al in res["algos"]:
        rr = [r for r in res["rows"] if r["algo"] == al]
        ax.plot([r["size_bytes"] for r in rr], [r["time_s"] * 1e6 for r in rr], "o-",
                ms=3, label=al)
    ax.set_yscale("log")
    bytes_x(ax)
    ax.set_xlabel(SIZE_LABEL)
    ax.set_ylabel("time (us)")
    fig.suptitle(f"simulated {res['op']} time (us) vs message size:\nscope {res['scope']} on "
                 f"{res['cluster']} ({res['gpus']} GPUs)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(title="algorithm", fontsize=8)
    return fig


def _plot_sweep(res: dict, path: str) -> str:
    return _savefig(sweep_figure(res), path)


def compare_figure(res: dict):
    """Measured (points) and simulated (lines) time vs message size, one colour per log and
    algorithm (``collective --compare LOG --plot``)."""
    from matplotlib.figure import Figure  # deferred: matplotlib loads only when this runs

    from ..plots.figures import COLORS, bytes_x  # deferred: loaded when the command runs (start-up)

    fig = Figure(figsize=(7.5, 4.8), layout="constrained")
    ax = fig.add_subplot()
    for i, lg in enumerate(res["logs"]):
        rr = [r for r in res["rows"] if r["log"] == lg["log"] and r["algo"] == lg["algo"]]
        name = lg["log"].rsplit("/", 1)[-1]
        c = COLORS[i % len(COLORS)]
        x = [r["size_bytes"] for r in rr]
        ax.plot(x, [r["measured_s"] * 1e6 for r in rr], "o", color=c, ms=4,
                label=f"measured: {name}")
        ax.plot(x, [r["simulated_s"] * 1e6 for r in rr], "-", color=c,
                label=f"simulated ({lg['algo']}): {name}")
    ax.set_yscale("log")
    bytes_x(ax)
    ops = sorted({lg["op"] for lg in res["logs"]})
    gpus = sorted({lg["nranks"] for lg in res["logs"]})
    ax.set_xlabel(SIZE_LABEL)
    ax.set_ylabel("time (us)")
    fig.suptitle(f"{', '.join(ops)} time (us) vs message size: simulated vs measured "
                 f"(nccl-tests)\non {res['cluster']} ({', '.join(map(str, gpus))} GPUs)",
                 fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return fig


def _plot_compare(res: dict, path: str) -> str:
    return _savefig(compare_figure(res), path)
