"""``parosim sweep``: a grid of configurations, parallel and resumable.
"""

from __future__ import annotations

import argparse

from .setup import check_workers


def cmd_sweep(a: argparse.Namespace) -> dict:
    from ..sweep.runner import run_sweep_cli  # deferred: loaded when the command runs (start-up)

    check_workers(a.workers)
    return run_sweep_cli(a.spec, a.out, a.workers, a.scheduler, progress=not a.no_progress)


def show_sweep(res: dict) -> None:
    print(f"{res['name']}: {res['points']} points ({res['skipped']} resumed, {res['done']} run, "
          f"{res['failed']} not ok) in {res['wall_s']:.1f} s -> {res['results']}")
    for f in res.get("figures", []):
        print(f"  figure: {f}")
