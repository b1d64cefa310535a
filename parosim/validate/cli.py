"""``parosim validate``: run collectives (and Plans) on real ranks and compare with the simulator.

:func:`add_arguments` declares the flags on an argparse parser; :func:`run_validate` takes the
parsed namespace (or a dict with the same keys) and returns the JSON-ready result::

    {"rows": [{"what", "op", "algo", "strategy", "size_bytes", "simulated_s", "measured_s",
               "error_pct", "measured_by", "simulated_nominal_s", "error_nominal_pct",
               "seen_in_calibration", ...}, ...],
     "median_error_pct", "max_error_pct", "held_out", "held_out_collectives", "uncalibrated",
     "ordering_mismatches", "calibration", "cluster", ...}

``held_out`` summarises the rows whose program the calibration never ran (other sizes, the
reduce-scatter op, HO-Ring, whole-step Plans), measured in a run of ranks separate from the
calibration run; ``uncalibrated`` the same rows predicted with the nominal spec (the shaped
rates), ``error_nominal_pct`` per row. Every measurement is reported: nothing is re-taken.

Flow: create the emulated cluster (``--emulate``; else every rank on this host's loopback),
calibrate α, β and overheads on it, lower every collective with the calibrated spec, run it on
the ranks (explicit ring steps, or the backend's collectives with ``--mode native``), simulate
it, and report. ``--strategies`` adds whole-step Plans. Bad input raises
:class:`~parosim.errors.InputError`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Mapping
from pathlib import Path

from ..collectives import Algo, Op, parse_enum
from ..errors import InputError
from ..units import fmt_bytes, fmt_time, parse_bandwidth, parse_size, parse_time
from .emulate import EmulatedCluster, Shaping, check_capability

DEFAULTS = {
    "emulate": False, "nodes": 2, "ranks_per_node": 2, "nic_bandwidth": "300Mbps",
    "nic_delay": "0s", "intra_ratio": 8.0, "sizes": "1MiB,4MiB,16MiB",
    "algos": "ring,hierarchical,ho-ring", "ops": "all-gather,reduce-scatter,all-reduce",
    "strategies": "", "parallel": "", "step_algo": "ring", "accum_steps": 4, "mode": "explicit",
    "backend": "gloo", "iters": 0, "warmup": 1, "calibrate": True, "calibration": None,
    "max_chunks": 2, "timeout": 600.0, "out": None, "json": False,
}
MAX_RANKS = 64


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Declare ``parosim validate``'s flags on ``p``."""
    d = DEFAULTS
    p.add_argument("--emulate", action="store_true",
                   help="emulate the nodes with network namespaces, a bridge and tc (root)")
    p.add_argument("--nodes", type=int, default=d["nodes"], help="nodes (namespaces)")
    p.add_argument("--ranks-per-node", type=int, default=d["ranks_per_node"],
                   help="ranks (GPUs) per node")
    p.add_argument("--nic-bandwidth", default=d["nic_bandwidth"],
                   help="emulated NIC rate per direction, e.g. 300Mbps")
    p.add_argument("--nic-delay", default=d["nic_delay"],
                   help="added one-way NIC delay (needs tc netem), e.g. 1ms")
    p.add_argument("--intra-ratio", type=float, default=d["intra_ratio"],
                   help="a node's loopback rate / NIC rate (shared by the node's ranks)")
    p.add_argument("--sizes", default=d["sizes"], help="collective sizes, comma-separated")
    p.add_argument("--algos", default=d["algos"], help="ring,hierarchical,ho-ring")
    p.add_argument("--ops", default=d["ops"], help="all-gather,reduce-scatter,all-reduce")
    p.add_argument("--strategies", default=d["strategies"],
                   help="also run whole-step Plans of these strategies, e.g. GGG,IIG,NIG")
    p.add_argument("--parallel", default=d["parallel"],
                   help="also run TP x PP x DP Plans, e.g. 2x1,1x2 or 2x1:IIG (TPxPP[:PaRO "
                   "strategy on the DP group, default NNN]; docs/parallelism.md)")
    p.add_argument("--step-algo", default=d["step_algo"], help="algorithm for the Plans")
    p.add_argument("--accum", "--accum-steps", dest="accum_steps", type=int,
                   default=d["accum_steps"],
                   help="micro-steps per step in the Plans")
    p.add_argument("--mode", default=d["mode"], choices=("explicit", "native", "both"),
                   help="explicit ring steps, the backend's own collectives, or both")
    p.add_argument("--backend", default=d["backend"], choices=("auto", "gloo", "nccl"))
    p.add_argument("--iters", type=int, default=d["iters"],
                   help="timed iterations per item (0: by predicted time, 3..9)")
    p.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                   help="predict with the nominal emulated spec instead of a fitted one")
    p.add_argument("--calibration", default=None,
                   help="cluster YAML from an earlier calibration (skips calibrating)")
    p.add_argument("--max-chunks", type=int, default=d["max_chunks"],
                   help="cap on HO-Ring chunks in the calibrated spec (default 2: on CPU "
                   "ranks many concurrent chunk phases add scheduling noise that the "
                   "model does not capture; see parosim/validate/README.md)")
    p.add_argument("--timeout", type=float, default=d["timeout"],
                   help="seconds before a run's ranks are killed")
    p.add_argument("--out", default=None, help="directory for rows.csv, result.json, "
                   "calibrated.yaml and validate.png")


class _Opts:
    """Parsed and checked options (attribute access over DEFAULTS)."""

    def __init__(self, args) -> None:
        src = dict(args) if isinstance(args, Mapping) else vars(args)
        self.raw = {k: src.get(k, v) if src.get(k) is not None else v
                    for k, v in DEFAULTS.items()}
        self.raw["calibration"] = src.get("calibration")
        self.raw["out"] = src.get("out")
        r = self.raw
        for name in ("nodes", "ranks_per_node", "accum_steps", "warmup", "max_chunks"):
            v = r[name]
            if isinstance(v, bool) or not isinstance(v, int) or v < (0 if name == "warmup"
                                                                    else 1):
                raise InputError(f"--{name.replace('_', '-')} = {v!r} must be a positive "
                                 "integer")
        if r["nodes"] * r["ranks_per_node"] > MAX_RANKS:
            raise InputError(f"{r['nodes']} nodes x {r['ranks_per_node']} ranks is more than "
                             f"{MAX_RANKS} ranks; expected fewer (each rank is a process)")
        if r["nodes"] * r["ranks_per_node"] < 2:
            raise InputError("validation needs at least 2 ranks (--nodes x --ranks-per-node)")
        self.nic_Bps = parse_bandwidth(r["nic_bandwidth"], "--nic-bandwidth")
        self.nic_delay_s = parse_time(r["nic_delay"], "--nic-delay")
        if not (isinstance(r["intra_ratio"], (int, float)) and r["intra_ratio"] > 0):
            raise InputError(f"--intra-ratio = {r['intra_ratio']!r} must be a positive number")
        self.sizes = [parse_size(s, "--sizes") for s in _split(r["sizes"], "--sizes")]
        self.algos = [parse_enum(Algo, a, "--algos") for a in _split(r["algos"], "--algos")]
        self.ops = [parse_enum(Op, o, "--ops") for o in _split(r["ops"], "--ops")]
        self.step_algo = parse_enum(Algo, r["step_algo"], "--step-algo")
        self.strategies = _split(r["strategies"], "--strategies", allow_empty=True)
        # deferred: the harness (torch) and figures (matplotlib) load only when validating
        from .harness import parse_parallel

        self.parallel = parse_parallel(r.get("parallel") or "")
        for tp, pp, _ in self.parallel:
            if tp * pp > 0 and (self.nodes * self.ranks_per_node) % (tp * pp):
                raise InputError(f"--parallel {tp}x{pp}: {tp * pp} does not divide the "
                                 f"{self.nodes * self.ranks_per_node} ranks")
        if self.strategies:
            from ..spec.strategy import parse_strategy  # deferred: loaded when validating

            self.strategies = [parse_strategy(s).name.replace("PaRO-", "")
                               for s in self.strategies]
        if r["mode"] not in ("explicit", "native", "both"):
            raise InputError(f"--mode {r['mode']!r} is not known; expected explicit, native "
                             "or both")
        if r["iters"] < 0:
            raise InputError(f"--iters = {r['iters']!r} must be >= 0 (0 = automatic)")
        if not r["timeout"] > 0:
            raise InputError(f"--timeout = {r['timeout']!r} must be positive")

    def __getattr__(self, name):
        try:
            return self.__dict__["raw"][name]
        except KeyError:
            raise AttributeError(name) from None


def _split(text, what: str, allow_empty: bool = False) -> list[str]:
    items = [t.strip() for t in (text if isinstance(text, (list, tuple))
                                 else str(text or "").split(",")) if str(t).strip()]
    if not items and not allow_empty:
        raise InputError(f"{what} is empty; expected a comma-separated list")
    return items


def run_validate(args) -> dict:
    """Run ``parosim validate`` with parsed ``args``; return the JSON-ready result.

    >>> run_validate({"emulate": True, "nodes": 2, "ranks_per_node": 2})  # doctest: +SKIP
    """
    # deferred: the harness (torch) and figures (matplotlib) load only when validating
    from .calibrate import calibrate, emulated_spec
    from .executor import Launch
    from .harness import validate_collectives, validate_steps
    from .report import ordering_mismatches, summary

    o = _Opts(args)
    if o.emulate:
        check_capability()
        shaping = Shaping(nic_rate_Bps=o.nic_Bps, nic_latency_s=o.nic_delay_s,
                          intra_rate_Bps=o.nic_Bps * o.intra_ratio)
    else:  # loopback: rates unknown, calibration measures them; this is only the start point
        shaping = Shaping(nic_rate_Bps=1e9, intra_rate_Bps=1e9 * o.ranks_per_node)
    base = emulated_spec(o.nodes, o.ranks_per_node, shaping,
                         name="emulated" if o.emulate else "loopback")
    cm = EmulatedCluster(o.nodes, shaping) if o.emulate else contextlib.nullcontext(None)
    cal = None
    with cm as emu:
        launch = Launch(o.nodes, o.ranks_per_node, emu, o.backend, o.timeout)
        if o.calibration:
            from ..io.cluster import load_cluster  # deferred: loaded when validating

            spec = load_cluster(o.calibration)
            if (spec.nodes, spec.gpus_per_node) != (o.nodes, o.ranks_per_node):
                raise InputError(f"--calibration {o.calibration!r} describes {spec.nodes} x "
                                 f"{spec.gpus_per_node}, not {o.nodes} x {o.ranks_per_node}")
            if spec.overrides or spec.jitter_cv:  # the emulated cluster is homogeneous
                raise InputError(f"--calibration {o.calibration!r} has overrides or jitter; "
                                 "expected a homogeneous cluster like the one validated")
        elif o.calibrate:
            cal = calibrate(launch, base, max_chunks=o.max_chunks)
            spec = cal.spec
        else:
            spec = base
        modes = ["explicit", "native"] if o.mode == "both" else [o.mode]
        rows = []
        # evaluation: a separate run of ranks from the calibration's, on collectives and
        # Plans; each row is also simulated with the nominal (uncalibrated) spec
        seen = cal.seen if cal else None
        for mode in modes:
            rows += validate_collectives(launch, spec, o.ops, o.algos, o.sizes, mode=mode,
                                         warmup=o.warmup, iters=o.iters or None,
                                         nominal=base, seen=seen)
        if o.strategies:
            from .harness import small_training  # deferred: loaded when validating

            rows += validate_steps(launch, spec, o.strategies, o.step_algo,
                                   training=small_training(o.accum_steps), warmup=o.warmup,
                                   iters=o.iters or 3, nominal=base)
        if o.parallel:
            # deferred: loaded when validating
            from .harness import small_training, validate_steps_3d

            rows += validate_steps_3d(launch, spec, o.parallel, o.step_algo,
                                      training=small_training(o.accum_steps),
                                      warmup=o.warmup, iters=o.iters or 3)
    # deferred: the harness (torch) and figures (matplotlib) load only when validating
    from ..io.cluster import cluster_to_yaml

    held = [r for r in rows if not r.get("seen_in_calibration")]
    result = {
        "rows": rows, **summary(rows),
        "collectives": summary([r for r in rows if r["what"] == "collective"]),
        # the numbers to judge the model by: rows whose program the fit never saw
        "held_out": summary(held),
        "held_out_collectives": summary([r for r in held if r["what"] == "collective"]),
        # the same rows predicted with the nominal spec (no calibration)
        "uncalibrated": summary([{"error_pct": r["error_nominal_pct"]} for r in rows
                                 if "error_nominal_pct" in r]),
        "steps": summary([r for r in rows if r["what"] == "step"]),
        "ordering_mismatches": (
            ordering_mismatches([r for r in rows if r["what"] == "collective"],
                                key=("what", "op", "size_bytes", "measured_by"))
            + ordering_mismatches([r for r in rows if r["what"] == "step"],
                                  key=("what", "algo", "measured_by"), by="strategy",
                                  margin=0.0)),
        "measured_by": sorted({r["measured_by"] for r in rows}),
        "cluster": spec.name,
        "emulated": bool(o.emulate), "nodes": o.nodes, "ranks_per_node": o.ranks_per_node,
        "nic_bandwidth_Bps": o.nic_Bps if o.emulate else None,
        "calibration": ({"params": cal.theta, "fit_max_error_pct": cal.fit_error_pct,
                         "rows": cal.rows} if cal else None),
        "cluster_yaml": cluster_to_yaml(spec),
    }
    if o.out:
        write_outputs(result, Path(o.out))
    return result


def write_outputs(result: dict, out: Path) -> list[Path]:
    """rows.csv, result.json, calibrated.yaml and validate.png under ``out``."""
    # deferred: the harness (torch) and figures (matplotlib) load only when validating
    from .report import plot, to_frame

    out.mkdir(parents=True, exist_ok=True)
    df = to_frame(result["rows"])
    paths = [out / "rows.csv", out / "result.json", out / "calibrated.yaml",
             out / "validate.png"]
    df.drop(columns=[c for c in ("times_s", "problems") if c in df]).to_csv(paths[0],
                                                                          index=False)
    paths[1].write_text(json.dumps(result, indent=1, default=str))
    paths[2].write_text(result["cluster_yaml"])
    # deferred: the harness (torch) and figures (matplotlib) load only when validating
    from ..plots.figures import save_as

    what = " and ".join(sorted({str(w) for w in df.get("what", [])})) or "rows"
    shape = (f"{result['nodes']} nodes x {result['ranks_per_node']} ranks, "
             if result.get("nodes") else "")
    links = "emulated links" if result.get("emulated") else "real links"
    save_as(plot(df, f"simulated vs measured time (s), {what}:\n{result.get('cluster', '?')} "
                     f"({shape}{links})"), paths[3])
    return paths


def format_table(result: dict) -> str:
    """Human-readable table of a :func:`run_validate` result."""
    lines = [f"{'what':10s} {'op/strategy':16s} {'algo':13s} {'size':>10s} "
             f"{'simulated':>11s} {'measured':>11s} {'error':>7s} {'nominal':>8s}  fit saw it"]
    for r in result["rows"]:
        name = r.get("op") or r.get("strategy") or ""
        size = fmt_bytes(r["size_bytes"]) if r.get("size_bytes") else ""
        nom = f"{r['error_nominal_pct']:+7.1f}%" if "error_nominal_pct" in r else f"{'-':>8s}"
        lines.append(f"{r['what']:10s} {name:16s} {r.get('algo') or '':13s} {size:>10s} "
                     f"{fmt_time(r['simulated_s']):>11s} {fmt_time(r['measured_s']):>11s} "
                     f"{r['error_pct']:+6.1f}% {nom}  "
                     f"{'yes' if r.get('seen_in_calibration') else 'no'}")
    lines.append(f"median |error| {result['median_error_pct']:.1f}%, max "
                 f"{result['max_error_pct']:.1f}% over {len(result['rows'])}"
                 f" rows; measured by {', '.join(result['measured_by'])}")
    h, u = result.get("held_out"), result.get("uncalibrated")
    if h:
        lines.append(f"held out (programs the calibration never ran): median |error| "
                     f"{h['median_error_pct']:.1f}%, max {h['max_error_pct']:.1f}% over "
                     f"{h['n_rows']} rows")
    if u and u["n_rows"]:
        lines.append(f"uncalibrated (nominal spec) on the same rows: median |error| "
                     f"{u['median_error_pct']:.1f}%, max {u['max_error_pct']:.1f}% over "
                     f"{u['n_rows']} rows")
    for m in result["ordering_mismatches"]:
        lines.append(f"ordering differs: {m}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m parosim.validate.cli`` (the same flags as ``parosim validate``)."""
    # deferred: the harness (torch) and figures (matplotlib) load only when validating
    import sys

    p = argparse.ArgumentParser(prog="parosim validate", description=__doc__.splitlines()[0])
    add_arguments(p)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    a = p.parse_args(argv)
    try:
        res = run_validate(a)
    except InputError as e:
        print(f"parosim validate: {e}", file=sys.stderr)
        return 2
    print(json.dumps(res, default=str) if a.json else format_table(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
