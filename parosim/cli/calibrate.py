"""``parosim calibrate``: fit a cluster to measurements and write a cluster YAML.

Modes (one per run, a mutually exclusive group; add a mode by adding a flag to the group and
a branch in :func:`run`):

* ``--steps CSV``: measured step times; fits the kernel compute model's efficiency
  (:mod:`parosim.calibrate.steps`, columns documented there and in docs/compute.md).
* ``--nccl-tests LOG [LOG...]``: nccl-tests logs (all_reduce_perf, all_gather_perf,
  reduce_scatter_perf); fits link and protocol parameters of ``--cluster`` with
  :func:`parosim.calibrate.fit`.

JSON (``--json``): ``{"mode", "output", "cluster", "algo", "holdout", "params": {name: value},
"identified": {name: bool}, "fit": {...}, "held_out": {...}, "warnings": [...], "rows":
[...]}``; ``warnings``: the checks of the log against the base and of the fitted values
(:mod:`parosim.calibrate.checks`), each ``{"kind", "message", "meaning"}``; ``fit`` and
``held_out`` hold ``n``, ``median_abs_error_pct``, ``max_abs_error_pct`` over all sizes and
the same under ``large`` for sizes >= 64 KiB; rows have ``what`` (fit | held-out), ``log``,
``op``, ``size_bytes``, ``measured_s``, ``simulated_s``, ``error_pct``; ``dof`` (fitted sizes -
parameters) and ``standard_errors`` ({name: {value, low, high, factor}}: one standard error,
:func:`parosim.calibrate.scale.standard_errors`). ``--steps`` adds ``dof`` and
``standard_errors`` too (:func:`parosim.calibrate.steps.run_steps`).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from ..errors import InputError

#: sizes one ``calibrate --nccl-tests`` fits at most: each is simulated at every iteration of
#: the least-squares fit (~0.13 s per size on 16 ranks, and tens of iterations), so 128 sizes
#: bound a fit to minutes; nccl-tests' ``-b 8 -e 16G -f 2`` gives 32 sizes per log.
MAX_FIT_SIZES = 128


def add_arguments(p: argparse.ArgumentParser) -> None:
    mode = p.add_mutually_exclusive_group(required=True)
    from ..calibrate.steps import (  # deferred: loaded when the command runs (start-up)
        add_steps_argument,  # deferred: loaded when the command runs (start-up)
    )

    add_steps_argument(mode)
    mode.add_argument("--nccl-tests", "--compare", dest="nccl_tests", nargs="+", default=None,
                      metavar="LOG", help="nccl-tests output files to fit (all_reduce_perf, "
                      "all_gather_perf, reduce_scatter_perf; --compare: the same, as "
                      "collective spells it)")
    p.add_argument("--cluster", required=True,
                   help="the base cluster (preset name or YAML path): its topology is kept, "
                   "the fitted parameters replace its values")
    p.add_argument("--set", action="append", default=None, metavar="KEY=VALUE",
                   help="change one key of the base cluster first (e.g. "
                   "collective.model=ideal); repeatable")
    p.add_argument("-o", "--output", required=True, help="the calibrated cluster YAML to write")
    p.add_argument("--nodes", type=int, default=None,
                   help="node count of the logs' runs when a log does not say it")
    p.add_argument("--algo", default=None,
                   help="algorithm the fit simulates (default: nccl where available, else ring)")
    p.add_argument("--params", default=None,
                   help="comma list of YAML parameters to fit, e.g. nic.bandwidth,nic.latency "
                   "(default: what the logs can identify)")
    p.add_argument("--holdout", default="none",
                   help="keep data out of the fit and report the error on it: none | "
                   "every-other | op:NAME | sizes:LO-HI | log:TEXT | scale:N (fit at up to N "
                   "nodes, report the error above N)")
    p.add_argument("--min-size", default="1",
                   help="ignore measurements smaller than this (default 1 byte)")
    p.add_argument("--name", default=None, help="name of the calibrated cluster")
    p.add_argument("--mode", default="analytic", choices=["analytic", "engine"],
                   help="with --steps: how each measured step is simulated (default analytic)")
    p.add_argument("--json", action="store_true", help="the result as JSON")


def run(a: argparse.Namespace) -> dict:
    if getattr(a, "steps", None):
        from ..calibrate.steps import run_steps  # deferred: loaded when the command runs (start-up)

        return run_steps(a)
    if a.nccl_tests:
        if a.mode != "analytic":
            raise InputError(f"--mode {a.mode} is how --steps simulates each measured step; "
                             "a --nccl-tests fit simulates collectives in closed form; "
                             "expected it unset with --nccl-tests")
        return _run_nccl_tests(a)
    raise InputError("calibrate needs a mode; expected --nccl-tests LOG... or --steps CSV")


def _stats(rows: list[dict]) -> dict:
    from ..calibrate.links import Fit  # deferred: loaded when the command runs (start-up)
    from ..collectives.bench import SMALL_BYTES  # deferred: loaded when the command runs (start-up)

    d = Fit._stats(rows)
    d["large"] = Fit._stats(rows, SMALL_BYTES)
    return d


def _run_nccl_tests(a: argparse.Namespace) -> dict:
    from ..calibrate.checks import (  # deferred: loaded when the command runs (start-up)
        check_fit,
        format_warnings,
    )
    from ..calibrate.links import (  # deferred: loaded when the command runs (start-up)
        fit,
        measurements_from_log,
        split_holdout,
    )
    from ..collectives.bench import (  # deferred: loaded when the command runs (start-up)
        default_compare_algo,
        parse_algos,
    )
    from ..io import load_cluster  # deferred: loaded when the command runs (start-up)
    from ..io.nccltests import read_nccl_tests  # deferred: loaded when the command runs (start-up)
    from ..units import parse_size  # deferred: loaded when the command runs (start-up)

    base = load_cluster(a.cluster, sets=a.set or ())
    algos = parse_algos(a.algo) if a.algo else [default_compare_algo()]
    if len(algos) != 1:
        raise InputError(f"--algo {a.algo!r}: calibration fits one algorithm; expected one")
    min_size = parse_size(a.min_size, "--min-size")
    logs = [read_nccl_tests(p) for p in a.nccl_tests]
    meas = []
    for lg in logs:
        meas += measurements_from_log(base, lg, a.nodes, min_size=min_size)
    if not meas:
        raise InputError(f"--min-size {a.min_size}: no measurement of the logs is that large")
    if len(meas) > MAX_FIT_SIZES:   # every size is simulated at every iteration of the fit
        raise InputError(f"--nccl-tests: the logs hold {len(meas)} sizes (>= --min-size), more "
                         f"than the {MAX_FIT_SIZES} a fit takes in bounded time; expected "
                         "fewer sizes (an -f 2 sweep has 32) or a larger --min-size")
    fitted, held = split_holdout(meas, a.holdout)
    params = [p.strip() for p in a.params.split(",") if p.strip()] if a.params else None
    f = fit(base, fitted, algos[0], params, held, a.holdout)
    name = a.name or f"{base.name}-calibrated"

    # the node counts the fit saw: a run on more nodes extrapolates its scale-out costs
    spec = replace(f.spec, name=name,
                   calibrated_nodes=tuple(sorted({m.spec.nodes for m in fitted})))
    fit_s, held_s = _stats(f.fit_rows), _stats(f.held_rows)
    warnings = check_fit(base, logs, f, fit_s, held_s, a.nodes) + one_node_warning(fitted)
    text = calibrated_yaml(spec, f, logs, fit_s, held_s, format_warnings(warnings))
    out = Path(a.output)
    try:
        if out.parent and not out.parent.exists():
            out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    except OSError as e:
        raise InputError(f"-o {a.output!r} cannot be written: {e.strerror}") from None
    return {"mode": "nccl-tests", "output": str(out), "cluster": name, "base": base.name,
            "algo": f.algo, "holdout": a.holdout, "logs": [lg.path for lg in logs],
            "params": f.values, "identified": f.identified, "fit": fit_s, "held_out": held_s,
            "warnings": [w.to_dict() for w in warnings], "rows": f.fit_rows + f.held_rows,
            "dof": f.dof, "standard_errors": f.standard_errors}


def one_node_warning(fitted: list) -> list:
    """A warning when every fitted measurement ran on one node: such a fit identifies only
    intra-node parameters, and every scale-out cost keeps its base (datasheet) value."""
    from ..calibrate.checks import Warning  # deferred: loaded when the command runs (start-up)

    if not fitted or {m.spec.nodes for m in fitted} != {1}:
        return []
    return [Warning("one_node", "every fitted measurement ran on one node",
                    "the fit says nothing about more nodes: NIC, switch and every scale-out "
                    "cost keep the base's values; fit a log of 2 or more nodes to predict "
                    "them")]


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def calibrated_yaml(spec, f, logs, fit_s: dict, held_s: dict,
                    warnings: list[str] | None = None) -> str:
    """The cluster YAML of ``spec`` with a comment on every fitted value (from which logs,
    with what error), a header naming the sources and the fit's warnings
    (:mod:`parosim.calibrate.checks`)."""
    from ..io import cluster_to_yaml  # deferred: loaded when the command runs (start-up)

    srcs = "; ".join(f"{lg.path} ({lg.source})" for lg in logs)
    err = (f"fit |error| median {_fmt(fit_s['median_abs_error_pct'])} %, worst "
           f"{_fmt(fit_s['max_abs_error_pct'])} % over {fit_s['n']} sizes")
    if held_s["n"]:
        err += (f"; held-out ({f.holdout}) median {_fmt(held_s['median_abs_error_pct'])} %, "
                f"worst {_fmt(held_s['max_abs_error_pct'])} % over {held_s['n']} sizes")
    names = ", ".join(Path(lg.path).name for lg in logs)
    short = (f"fit |error| median {_fmt(fit_s['median_abs_error_pct'])} %, worst "
             f"{_fmt(fit_s['max_abs_error_pct'])} %")
    comments = {}
    for name in f.params:
        how = "fitted from" if f.identified.get(name) else "not identified by"
        comments[tuple(name.split("."))] = f"{how} {names} ({f.algo}); {short}"
    head = [f"# {spec.name}: calibrated by 'parosim calibrate --nccl-tests' (algorithm "
            f"{f.algo}, scipy.optimize.least_squares on ln(simulated / measured))",
            f"# fitted parameters: {', '.join(f.params)}",
            f"# {err}",
            "# measurements (file: source):"]
    head += [f"#   {lg.path}: {lg.source}" for lg in logs]
    head += [f"# {w}" for w in warnings or []]

    spec = replace(spec, notes=f"calibrated from {srcs}. Base cluster: {spec.notes}")
    body = annotate_yaml(cluster_to_yaml(spec), comments)
    return "\n".join(head) + "\n" + body


def annotate_yaml(text: str, comments: dict[tuple[str, ...], str]) -> str:
    """Append ``# comment`` to the block-style YAML lines whose key path is in ``comments``
    (``("nic", "bandwidth")``)."""
    out, stack = [], []  # stack of (indent, key)
    for line in text.splitlines():
        stripped = line.lstrip()
        if stripped and not stripped.startswith("#") and ":" in stripped:
            indent = len(line) - len(stripped)
            key = stripped.split(":", 1)[0].strip().strip("'\"")
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, key))
            path = tuple(k for _, k in stack)
            c = comments.get(path)
            if c is None and path and path[0] == "intra_node":
                c = comments.get(("intra_node",) + path[1:])
            if c is not None:
                line = f"{line}  # {c}"
        out.append(line)
    return "\n".join(out) + "\n"


def param_text(key: str, value: float) -> str:
    """A fitted parameter with its unit (the JSON keeps SI numbers): bandwidths in Gbps,
    latencies and overheads in us, factors bare.

    >>> param_text("nic.bandwidth", 12.5e9), param_text("nic.latency", 2.5e-5)
    ('100 Gbps', '25 us')
    >>> param_text("collective.ring_ll.bw_efficiency", 0.0165331)
    '0.01653'
    """
    leaf = key.rsplit(".", 1)[-1]
    if leaf.endswith("bandwidth"):
        return f"{value * 8 / 1e9:.4g} Gbps"
    if leaf.endswith(("latency", "overhead")):
        return f"{value * 1e6:.4g} us"
    return f"{value:.4g}"


def print_result(res: dict) -> None:
    if res.get("mode") == "steps":
        from ..calibrate.steps import (
            print_steps,  # deferred: loaded when the command runs (start-up)
        )

        print_steps(res)
        return
    print(f"calibrated {res['cluster']} (base {res['base']}, algorithm {res['algo']}) -> "
          f"{res['output']}")
    print(f"{'parameter':<40}{'value':>16}  identified")
    for k, v in res["params"].items():
        print(f"{k:<40}{param_text(k, v):>16}  {'yes' if res['identified'][k] else 'no'}")
    for what, s in (("fit", res["fit"]), (f"held-out ({res['holdout']})", res["held_out"])):
        if not s["n"]:
            continue
        lg = s["large"]
        print(f"{what:<24} |error| all sizes: median {_fmt(s['median_abs_error_pct'])} %, "
              f"worst {_fmt(s['max_abs_error_pct'])} % (n = {s['n']}); sizes >= 64 KiB: median "
              f"{_fmt(lg['median_abs_error_pct'])} %, worst {_fmt(lg['max_abs_error_pct'])} % "
              f"(n = {lg['n']})")
    from ..calibrate.checks import (  # deferred: loaded when the command runs (start-up)
        Warning,
        format_warnings,
    )

    ws = res.get("warnings", [])
    for line in format_warnings([Warning(**w) for w in ws if isinstance(w, dict)]):
        print(line)
    for w in ws:   # calibrate --steps: one line each (parosim.calibrate.scale.fit_warnings)
        if isinstance(w, str):
            print(f"warning: {w}")


def cmd_calibrate(a: argparse.Namespace) -> dict:
    """The ``calibrate`` command of the registry."""
    return run(a)


def show_calibrate(res: dict) -> None:
    print_result(res)
