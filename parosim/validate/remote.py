"""Validation on a real cluster with ``torchrun``: prepare configs here, run the ranks there.

Three steps around two ``torchrun`` launches (NCCL on GPUs, chosen by ``backend: auto``)::

    python -m parosim.validate.remote prepare --cluster dgx-a100-ib --nodes 2 --out runs/v1
    torchrun ... -m parosim.validate.worker --config runs/v1/calibrate.json \\
             --out runs/v1/calibrate.out.json
    python -m parosim.validate.remote fit runs/v1          # -> calibrated.yaml, compare.json
    torchrun ... -m parosim.validate.worker --config runs/v1/compare.json \\
             --out runs/v1/compare.out.json
    python -m parosim.validate.remote report runs/v1 [--json]   # table, result.json, plot

``report`` gives the same keys as ``parosim validate --emulate``: per row
``simulated_nominal_s``, ``error_nominal_pct`` (the base spec, uncalibrated) and
``seen_in_calibration``; ``held_out`` (rows whose program the fit never ran) and
``uncalibrated`` (the same rows on the base spec) summaries.

``prepare`` stores the cluster spec (``base.yaml``) and the choices (``meta.json``); the
programs are lowered on the base spec for calibration and on the fitted spec for the
comparison, exactly as :func:`parosim.validate.cli.run_validate` does on an emulated cluster.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..collectives import Algo, Op, Scope, lower, parse_enum, program_time, simulate_program
from ..errors import InputError
from ..io.cluster import cluster_to_yaml, load_cluster
from ..units import parse_size
from .calibrate import fit, microbenchmarks
from .cli import format_table, write_outputs
from .executor import auto_iters, collective_task, summarise, worker_config
from .report import row, summary


def prepare(cluster: str, nodes: int | None, out: Path, sizes: str, algos: str, ops: str,
            mode: str = "explicit") -> Path:
    spec = load_cluster(cluster, nodes=nodes)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"sizes": [parse_size(s, "--sizes") for s in sizes.split(",")],
            "algos": [parse_enum(Algo, a, "--algos").value for a in algos.split(",")],
            "ops": [parse_enum(Op, o, "--ops").value for o in ops.split(",")], "mode": mode}
    (out / "base.yaml").write_text(cluster_to_yaml(spec))
    (out / "meta.json").write_text(json.dumps(meta))
    progs = microbenchmarks(spec)
    tasks = [collective_task(i, p, "explicit", 1, auto_iters(program_time(spec, p)))
             for i, p in progs]
    path = out / "calibrate.json"
    path.write_text(json.dumps(worker_config(tasks, spec.gpus)))
    return path


def _results(path: Path, tasks: list[dict]):
    if not path.exists():
        raise InputError(f"{str(path)!r} does not exist; run the torchrun step first")
    return summarise(json.loads(path.read_text()), tasks)


def _compare_items(spec, meta):
    return [(f"{op}/{algo}/{size}", lower(spec, Op(op), Scope.GLOBAL, size, Algo(algo)))
            for op in meta["ops"] for algo in meta["algos"] for size in meta["sizes"]]


def fit_stage(out: Path) -> Path:
    base = load_cluster(out / "base.yaml")
    meta = json.loads((out / "meta.json").read_text())
    progs = microbenchmarks(base)
    cfg = json.loads((out / "calibrate.json").read_text())
    res = _results(out / "calibrate.out.json", cfg["tasks"])
    cal = fit(base, progs, {i: res[i].median_s for i, _ in progs})
    (out / "calibrated.yaml").write_text(cluster_to_yaml(cal.spec))
    (out / "calibration.json").write_text(json.dumps({"params": cal.theta, "rows": cal.rows}))
    tasks = [collective_task(i, p, meta["mode"], 1, auto_iters(program_time(cal.spec, p)))
             for i, p in _compare_items(cal.spec, meta)]
    path = out / "compare.json"
    path.write_text(json.dumps(worker_config(tasks, cal.spec.gpus)))
    return path


def report_stage(out: Path) -> dict:
    spec = load_cluster(out / "calibrated.yaml")
    nominal = load_cluster(out / "base.yaml")  # the uncalibrated description
    meta = json.loads((out / "meta.json").read_text())
    cfg = json.loads((out / "compare.json").read_text())
    res = _results(out / "compare.out.json", cfg["tasks"])
    cal_path = out / "calibration.json"
    cal_rows = json.loads(cal_path.read_text())["rows"] if cal_path.exists() else []
    seen = {(c["op"], c["algo"], c["scope"], int(c["size_bytes"])) for c in cal_rows}
    rows = []
    for tid, prog in _compare_items(spec, meta):
        r = res[tid]
        nom = simulate_program(nominal, prog).time_s
        key = (prog.op.value, prog.algo.value, prog.scope.value, int(prog.size_bytes))
        rows.append(row("collective", simulate_program(spec, prog).time_s, r.median_s,
                        op=prog.op.value, algo=prog.algo.value, size_bytes=prog.size_bytes,
                        chunks=prog.chunks, backend=r.backend, times_s=r.times_s,
                        measured_by="explicit-ring" if meta["mode"] == "explicit"
                        else "backend-native", simulated_nominal_s=nom,
                        error_nominal_pct=100.0 * (nom - r.median_s) / r.median_s,
                        seen_in_calibration=key in seen))
    held = [r for r in rows if not r["seen_in_calibration"]]
    # as run_validate: held_out = rows whose program the fit never ran (measured in a torchrun
    # separate from the calibration's); uncalibrated = the same rows on the nominal spec
    result = {"rows": rows, **summary(rows), "held_out": summary(held),
              "held_out_collectives": summary(held),
              "uncalibrated": summary([{"error_pct": r["error_nominal_pct"]} for r in rows]),
              "measured_by": [rows[0]["measured_by"]],
              "ordering_mismatches": [], "cluster": spec.name,
              "cluster_yaml": cluster_to_yaml(spec)}
    write_outputs(result, out)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m parosim.validate.remote")
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("prepare")
    a.add_argument("--cluster", required=True)
    a.add_argument("--nodes", type=int)
    a.add_argument("--out", required=True)
    a.add_argument("--sizes", default="64MiB,256MiB,1GiB")
    a.add_argument("--algos", default="ring,hierarchical,ho-ring")
    a.add_argument("--ops", default="all-gather,reduce-scatter,all-reduce")
    a.add_argument("--mode", default="explicit", choices=("explicit", "native"))
    for name in ("fit", "report"):
        b = sub.add_parser(name)
        b.add_argument("dir")
        b.add_argument("--json", action="store_true")
    ns = p.parse_args(argv)
    try:
        if ns.cmd == "prepare":
            print(prepare(ns.cluster, ns.nodes, Path(ns.out), ns.sizes, ns.algos, ns.ops,
                          ns.mode))
        elif ns.cmd == "fit":
            print(fit_stage(Path(ns.dir)))
        else:
            res = report_stage(Path(ns.dir))
            print(json.dumps(res, default=str) if ns.json else format_table(res))
    except InputError as e:
        print(f"parosim validate: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
