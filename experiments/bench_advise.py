"""Benchmark of ``parosim advise``: wall and CPU time, peak RSS, the search's counts.

Targets: ``parosim advise --model llama-65b --cluster dgx-a100-ib --nodes 128
--global-batch 2048 --seq-len 2048`` and ``parosim advise --model llama-3-70b --cluster
dgx-h100-ib --nodes 128 --global-batch 1024 --seq-len 4096`` (the default search: attention,
precision, runtime, TP / PP, strategy, group, micro-batch, recomputation, algorithm) each
under 60 s on one core. Run: ``python experiments/bench_advise.py``. On a shared machine
compare the CPU time (the wall clock grows with the other jobs' load).
"""

from __future__ import annotations

import resource
import subprocess
import sys
import time

CMD = ["advise", "--model", "llama-65b", "--cluster", "dgx-a100-ib", "--nodes", "128",
       "--global-batch", "2048", "--seq-len", "2048"]
CMD_H100 = ["advise", "--model", "llama-3-70b", "--cluster", "dgx-h100-ib", "--nodes", "128",
            "--global-batch", "1024", "--seq-len", "4096"]


def run(cmd: list[str]) -> int:
    """One advise in a child process: its text, wall clock, CPU time and peak RSS."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "parosim.cli", *cmd], capture_output=True,
                         text=True, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(out.stdout.rstrip())
    if out.returncode:
        print(out.stderr, file=sys.stderr)
        return out.returncode
    print(f"\nparosim {' '.join(cmd)}\nwall {wall:.1f} s, CPU {cpu:.1f} s (target < 60 s), "
          f"peak RSS {after.ru_maxrss / 1024:.0f} MiB\n")
    return 0


def main() -> int:
    for cmd in (CMD, CMD_H100):
        rc = run(cmd)
        if rc:
            return rc
    # the closed-form search alone (no engine replay)
    from parosim.io import load_cluster
    from parosim.spec.model import preset
    from parosim.studies.advise import advise

    t1 = time.perf_counter()
    res = advise(preset("llama-65b"), load_cluster("dgx-a100-ib", 128), 2048, engine_top=0)
    print(f"screening only (no engine): {time.perf_counter() - t1:.1f} s, "
          f"{res['screened']} configurations, {res['pruned']} pruned, {res['fitting']} fit, "
          f"{res['evaluated']} costed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
