"""Benchmark: two checkouts of parosim on the same commands, whole process, alternated runs.

Each command runs as ``python -m parosim.cli ...`` with ``PYTHONPATH`` set to one checkout,
then to the other, ``--repeat`` times in turn (alternation spreads the machine's load over
both); the median wall time of each is printed with the ratio after / before, and whether
the two JSON outputs are identical (``wall_s``, the tool's own run time, left out).

    python experiments/bench_versions.py BEFORE_DIR AFTER_DIR [--repeat 3] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "--version": ["--version"],
    "compare (14 strategies, engine, 32 GPUs)": ["compare", "--json", "--workers", "1"],
    "step 16,384 GPUs (LLaMA-65B, IIG, engine)": [
        "simulate", "--model", "llama-65b", "--nodes", "2048", "--strategy", "IIG", "--json"],
    "all-reduce 1 GiB, 1,024 GPUs (ring)": [
        "collective", "--op", "all-reduce", "--size", "1GiB", "--nodes", "128", "--algo",
        "ring", "--json"],
    "advise (LLaMA-13B, 16 nodes)": [
        "advise", "--model", "llama-13b", "--nodes", "16", "--global-batch", "1024", "--json"],
}
QUICK = ("--version", "all-reduce 1 GiB, 1,024 GPUs (ring)")


def _strip(x):
    if isinstance(x, dict):
        return {k: _strip(v) for k, v in x.items() if k != "wall_s"}
    if isinstance(x, list):
        return [_strip(v) for v in x]
    return x


def run(checkout: str, argv: list[str]) -> tuple[float, str]:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(checkout),
           "PYTHONWARNINGS": "ignore::DeprecationWarning"}
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "parosim.cli", *argv], env=env,
                       capture_output=True, text=True, cwd=checkout)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{checkout}: parosim {' '.join(argv)} exited {p.returncode}: "
                         f"{p.stderr.strip()[-300:]}")
    return dt, p.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="only --version and the collective")
    a = ap.parse_args()
    print(f"{'command':<44}{'before s':>10}{'after s':>10}{'ratio':>8}  same JSON")
    for name, argv in COMMANDS.items():
        if a.quick and name not in QUICK:
            continue
        times = {"before": [], "after": []}
        outs = {}
        for _ in range(a.repeat):
            for which in ("before", "after"):
                dt, out = run(getattr(a, which), argv)
                times[which].append(dt)
                outs[which] = out
        b, f = statistics.median(times["before"]), statistics.median(times["after"])
        same = ("-" if argv == ["--version"] else
                "yes" if _strip(json.loads(outs["before"])) == _strip(json.loads(outs["after"]))
                else "NO")
        print(f"{name:<44}{b:>10.3f}{f:>10.3f}{f / b:>8.2f}  {same}", flush=True)


if __name__ == "__main__":
    main()
