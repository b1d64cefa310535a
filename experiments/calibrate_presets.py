"""Build the calibrated cluster presets from published nccl-tests logs and print their errors.

    PYTHONPATH=. python experiments/calibrate_presets.py            # all presets (minutes)
    PYTHONPATH=. python experiments/calibrate_presets.py aws-p4de   # one

For each preset: start from the nominal (datasheet) description in
``experiments/calibrate_presets/<name>-nominal.yaml``, fit the parameters
:func:`parosim.calibrate.default_params` chooses (links, per-call cost, NCCL protocol base
latencies and LL/LL128 efficiencies) to the preset's calibration logs with
:func:`parosim.calibrate.fit` (scipy bounded least squares on ln(simulated / measured), the
``nccl`` algorithm), write ``topologies/<name>.yaml`` (every fitted value commented with its
logs and fit error, every log with its source), then report per log, for sizes >= 64 KiB and
below:

* ``uncalibrated``: the nominal description, simulated with the engine (``--compare``);
* ``calibrated``: the written preset, simulated with the engine (``--compare``): in-sample;
* ``held-out``: a second fit without every other size of every log, evaluated on the sizes it
  did not see (closed form, which the engine matches within 1%).

The logs are the nccl-tests outputs in ``tests/data/nccl-tests`` (each with its source; see
SOURCES.md there). ``eval`` logs are never fitted: they check the preset independently.
Results: ``experiments/calibrate_presets/results.json`` and ``results.md``.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from parosim.calibrate import fit, measurements_from_log, split_holdout  # noqa: E402
from parosim.cli_calibrate import _stats, calibrated_yaml  # noqa: E402
from parosim.collectives import Algo  # noqa: E402
from parosim.io import load_cluster  # noqa: E402
from parosim.io.nccltests import read_nccl_tests  # noqa: E402
from parosim.ncclbench import SMALL_BYTES, cluster_for_log, compare_log, error_summary  # noqa: E402

LOGS = ROOT / "tests" / "data" / "nccl-tests"
HERE = ROOT / "experiments" / "calibrate_presets"
PRESETS = {
    "aws-p4de": {"fit": ["aws-p4de-2node-all_reduce.txt"], "eval": []},
    "aws-p5": {"fit": ["aws-p5-2node-all_reduce.txt", "aws-p5-batch-all_reduce.txt"],
               "eval": ["aws-p5-eks-excerpt-all_reduce.txt"]},
    # the msccl tables (labelled NDmv4) run above an A100's NVLink line rate: H100 (NDv5)
    # numbers by all signs, so they are reported, not fitted (see their caution line)
    "azure-ndmv4": {"fit": ["azure-ndmv4-superbench-all_reduce.txt"],
                    "eval": ["azure-ndv4-superbench-all_reduce.txt",
                             "azure-ndmv4-msccl-all_reduce.txt",
                             "azure-ndmv4-msccl-all_gather.txt"]},
}
STARTS = (0.0, -1.0, 1.0)  # deterministic starts: nominal values, all / e, all x e
MAX_NFEV = 200


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


def build(name: str) -> list[dict]:
    cfg = PRESETS[name]
    nominal = load_cluster(HERE / f"{name}-nominal.yaml")
    logs = [read_nccl_tests(LOGS / f) for f in cfg["fit"]]
    logs = [replace(lg, path=_rel(Path(lg.path))) for lg in logs]
    meas = [m for lg in logs for m in measurements_from_log(nominal, lg)]
    t0 = time.perf_counter()
    full = fit(nominal, meas, Algo.NCCL, starts=STARTS, max_nfev=MAX_NFEV)
    t_fit = time.perf_counter() - t0
    spec = replace(full.spec, name=name)
    text = calibrated_yaml(spec, full, logs, _stats(full.fit_rows), _stats([]))
    out = ROOT / "topologies" / f"{name}.yaml"
    out.write_text(text)
    fitted, held = split_holdout(meas, "every-other")
    ho = fit(nominal, fitted, Algo.NCCL, held=held, holdout="every-other", starts=STARTS,
             max_nfev=MAX_NFEV)
    preset = load_cluster(out)  # what users get: the YAML as written
    rows = []
    for f in cfg["fit"] + cfg["eval"]:
        lg = read_nccl_tests(LOGS / f)
        cal = compare_log(cluster_for_log(preset, lg), lg, Algo.NCCL)
        unc = compare_log(cluster_for_log(nominal, lg), lg, Algo.NCCL)
        key = _rel(LOGS / f)
        held_rows = [r for r in ho.held_rows if r["log"] == key]
        rows.append({
            "preset": name, "log": f, "role": "fit" if f in cfg["fit"] else "eval only",
            "op": lg.op, "nranks": lg.nranks, "source": lg.source,
            "calibrated": error_summary(cal), "uncalibrated": error_summary(unc),
            "held_out": error_summary(held_rows) if held_rows else None,
            "rows": [dict(r, log=key) for r in cal],
        })
    print(f"{name}: fitted {len(full.params)} parameters to {len(meas)} sizes in "
          f"{t_fit:.0f} s -> {_rel(out)}", flush=True)
    return rows


def _f(d: dict | None, key: str) -> str:
    if d is None or d.get(key) is None:
        return "-"
    return f"{d[key]:.1f}"


def table(results: list[dict]) -> str:
    head = ("| preset | log | role | n >= 64 KiB | uncalibrated median / worst % | calibrated "
            "median / worst % | held-out median / worst % | < 64 KiB calibrated median / "
            "worst % |\n|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in results:
        c, u, h = r["calibrated"], r["uncalibrated"], r["held_out"]
        lines.append(
            f"| {r['preset']} | {r['log']} | {r['role']} | {c['large_n']} | "
            f"{_f(u, 'large_median_abs_error_pct')} / {_f(u, 'large_max_abs_error_pct')} | "
            f"{_f(c, 'large_median_abs_error_pct')} / {_f(c, 'large_max_abs_error_pct')} | "
            f"{_f(h, 'large_median_abs_error_pct')} / {_f(h, 'large_max_abs_error_pct')} | "
            f"{_f(c, 'small_median_abs_error_pct')} / {_f(c, 'small_max_abs_error_pct')} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    names = argv or list(PRESETS)
    bad = [n for n in names if n not in PRESETS]
    if bad:
        print(f"unknown preset {bad[0]!r}; expected one of {', '.join(PRESETS)}",
              file=sys.stderr)
        return 2
    res_path = HERE / "results.json"
    old = json.loads(res_path.read_text()) if res_path.exists() else []
    results = [r for r in old if r["preset"] not in names]
    for n in names:
        results += build(n)
    results.sort(key=lambda r: (list(PRESETS).index(r["preset"]), r["role"], r["log"]))
    res_path.write_text(json.dumps(results, indent=1) + "\n")
    md = table(results)
    (HERE / "results.md").write_text(
        "# Calibrated presets: error per log (generated by experiments/calibrate_presets.py)\n\n"
        f"Errors are |simulated - measured| / measured of nccl-tests times, algorithm `nccl`; "
        f"sizes >= {SMALL_BYTES // 1024} KiB unless the column says otherwise. `held-out`: "
        "fit without every other size, error on those sizes.\n\n" + md + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
