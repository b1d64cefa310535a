"""``parosim sweep``: a grid of configurations, parallel and resumable.
"""

from __future__ import annotations

import argparse

from .setup import check_workers


def cmd_sweep(a: argparse.Namespace) -> dict:
    from ..sweep.runner import run_sweep_cli  # deferred: loaded when the command runs (start-up)

    check_workers(a.workers)
    return run_sweep_cli(a.spec, a.out, a.workers, a.scheduler, progress=not a.no_progress,
                         fresh=a.fresh)


def show_sweep(res: dict) -> None:
    print(f"{res['name']}: {res['points']} points ({res['skipped']} resumed, {res['done']} run, "
          f"{res['failed']} not ok) in {res['wall_s']:.1f} s -> {res['results']}")
    changed = res.get("inputs_changed") or []
    if changed:
        print(f"  {len(changed)} input{'s' if len(changed) != 1 else ''} changed since the "
              f"last run ({', '.join(changed)}): re-ran {res.get('rerun_changed', 0)} points")
    if res.get("fresh"):
        print(f"  --fresh: all {res['points']} points run, earlier results overwritten")
    elif res.get("stale"):
        print(f"  {res['stale']} rows of an earlier run match no point now (other values, "
              "input contents or parosim version): moved to results.stale.csv")
    for f in res.get("figures", []):
        print(f"  figure: {f}")
