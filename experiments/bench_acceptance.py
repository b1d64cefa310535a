"""Benchmark: the interactive-use targets, whole process, two checkouts in alternated runs.

Each case runs as ``python -m parosim.cli ...`` (the bare interpreter as ``python -c pass``)
with ``PYTHONPATH`` set to one checkout, then to the other, ``--repeat`` times in turn; the
median wall time, the median CPU time (user + system: less sensitive to other processes on
a shared machine) and the largest peak RSS of each are printed with the target and whether the
JSON outputs of the two checkouts are identical (``wall_s`` left out). Bytecode is compiled
first (``python -m compileall``) in both checkouts, as an installed package has it.

    python experiments/bench_acceptance.py BEFORE_DIR AFTER_DIR [--repeat 5] [--only NAME ...]

Targets: ``--version`` <= 0.1 s over a bare interpreter; a 1 GiB hierarchical all-reduce over
1,024 GPUs <= 0.35 s; a 16,384-GPU LLaMA-65B engine step <= 1.0 s; 131,072 GPUs <= 3 s and
< 300 MiB; ``advise`` for LLaMA-3-70B on 128 DGX H100 nodes <= 15 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CASES = {
    "python -c pass": (None, None),
    "--version": (["--version"], None),
    "all-reduce 1GiB 128 nodes hierarchical": (
        ["collective", "--op", "all-reduce", "--size", "1GiB", "--nodes", "128", "--algo",
         "hierarchical", "--json"], 0.35),
    "step LLaMA-65B IIG 16,384 GPUs": (
        ["simulate", "--model", "llama-65b", "--nodes", "2048", "--strategy", "IIG",
         "--mode", "engine", "--json"], 1.0),
    "step LLaMA-65B IIG 131,072 GPUs": (
        ["simulate", "--model", "llama-65b", "--nodes", "16384", "--strategy", "IIG",
         "--mode", "engine", "--json"], 3.0),
    "advise LLaMA-3-70B dgx-h100-ib 128 nodes": (
        ["advise", "--model", "llama-3-70b", "--cluster", "dgx-h100-ib", "--nodes", "128",
         "--global-batch", "1024", "--seq-len", "4096", "--json"], 15.0),
}


def _strip(x):
    if isinstance(x, dict):
        return {k: _strip(v) for k, v in x.items() if k not in ("wall_s", "elapsed_s")}
    if isinstance(x, list):
        return [_strip(v) for v in x]
    return x


def run(checkout: str, argv: list[str] | None) -> tuple[float, float, int, str, float]:
    """(wall s, peak RSS MiB, exit code, stdout, CPU s) of one process."""
    env = {**os.environ, "PYTHONPATH": os.path.abspath(checkout),
           "PYTHONWARNINGS": "ignore::DeprecationWarning"}
    cmd = [sys.executable, "-c", "pass"] if argv is None else [
        sys.executable, "-m", "parosim.cli", *argv]
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=err, cwd=checkout)
        out = p.stdout.read().decode()
        _, status, ru = os.wait4(p.pid, 0)  # this child's own peak RSS
        dt = time.perf_counter() - t0
        p.stdout.close()
        p.returncode = os.waitstatus_to_exitcode(status)
    return dt, ru.ru_maxrss / 1024, p.returncode, out, ru.ru_utime + ru.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--only", nargs="*", default=None, help="case names containing these")
    a = ap.parse_args()
    for d in (a.before, a.after):
        subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(d, "parosim")],
                       check=True)
    print(f"{'case':<42}{'before s':>9}{'after s':>9}{'CPU b':>8}{'CPU a':>8}{'MiB b':>7}"
          f"{'MiB a':>7}{'target':>8}  same JSON", flush=True)
    bare = {}
    for name, (argv, target) in CASES.items():
        if a.only and argv is not None and not any(s in name for s in a.only):
            continue
        times = {"before": [], "after": []}
        cpu = {"before": [], "after": []}
        rss = {"before": 0.0, "after": 0.0}
        outs, codes = {}, {}
        for _ in range(a.repeat):
            for which in ("before", "after"):
                dt, mib, rc, out, c = run(getattr(a, which), argv)
                times[which].append(dt)
                cpu[which].append(c)
                rss[which] = max(rss[which], mib)
                outs[which], codes[which] = out, rc
        med = {k: statistics.median(v) for k, v in times.items()}
        mcpu = {k: statistics.median(v) for k, v in cpu.items()}
        if argv is None:
            bare = med
        if argv is None or argv == ["--version"]:
            same = "-"
        elif codes["before"] or codes["after"]:
            same = f"exit {codes['before']} / {codes['after']}"
        else:
            same = ("yes" if _strip(json.loads(outs["before"])) == _strip(
                json.loads(outs["after"])) else "NO")
        tgt = "" if target is None else f"{target:.2f}"
        if argv == ["--version"] and bare:
            tgt = "+0.10"
            same = (f"over bare: {med['before'] - bare['before']:.3f} / "
                    f"{med['after'] - bare['after']:.3f} s")
        print(f"{name:<42}{med['before']:>9.3f}{med['after']:>9.3f}{mcpu['before']:>8.3f}"
              f"{mcpu['after']:>8.3f}{rss['before']:>7.0f}{rss['after']:>7.0f}{tgt:>8}  {same}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
