"""Benchmark of ``parosim advise``: wall time, simpy events/s of the engine replays, peak RSS.

Target (issue 11): ``parosim advise --model llama-65b --cluster dgx-a100-ib --nodes 128
--global-batch 2048 --seq-len 2048``
under 60 s on 2 cores. Run: ``python experiments/bench_advise.py``.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import time

CMD = ["advise", "--model", "llama-65b", "--cluster", "dgx-a100-ib", "--nodes", "128",
       "--global-batch", "2048", "--seq-len", "2048"]


def main() -> int:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "parosim.cli", *CMD], capture_output=True,
                         text=True, check=False)
    wall = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(out.stdout.rstrip())
    if out.returncode:
        print(out.stderr, file=sys.stderr)
        return out.returncode
    print(f"\nparosim {' '.join(CMD)}\nwall {wall:.1f} s (target < 60 s), peak RSS "
          f"{rss:.0f} MiB")
    # the engine part alone: events per second of the best configuration's replay
    from parosim.io import load_cluster
    from parosim.spec.model import preset
    from parosim.studies.advise import advise

    t1 = time.perf_counter()
    res = advise(preset("llama-65b"), load_cluster("dgx-a100-ib", 128), 2048, engine_top=0)
    print(f"screening only (no engine): {time.perf_counter() - t1:.1f} s, "
          f"{res['screened']} screened, {res['fitting']} fit, {res['evaluated']} costed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
