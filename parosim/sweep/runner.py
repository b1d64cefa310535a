"""Parallel, resumable sweeps: map a pure ``point -> row`` function over a grid.

``parosim sweep SPEC.yaml --out DIR`` (or ``python -m parosim.sweep``) reads a sweep spec
(:mod:`parosim.io.sweep`), skips the points already in ``DIR/results.csv``, evaluates the rest
in parallel — local processes by default, or an existing dask.distributed cluster with
``--scheduler ADDRESS`` — appends each row as soon as its point finishes (flush + fsync), and
at the end rewrites ``results.csv`` in grid order, writes ``columns.md`` and the figures the
spec asks for. Because each point is a pure function of its dict and rows are keyed by a
stable hash of it, a sweep killed at any moment and started again ends with the same file,
row for row, as one that was never interrupted.

Per-point problems (does not fit, bad combination) are rows with ``status`` and ``reason``;
only a bad spec stops the sweep, before any work starts.

>>> from parosim.io.sweep import SweepSpec
>>> spec = SweepSpec("demo", "collective", "analytic", {"nodes": (2, 4)},
...                  {"cluster": "paper-a100-roce", "op": "all-gather", "size": "1GB",
...                   "algo": "ring"})
>>> rows = [evaluate(p) for p in spec.points()]
>>> [r["status"] for r in rows], [r["gpus"] for r in rows]
(['ok', 'ok'], [16, 32])
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

from ..collectives import Algo, Op, Scope, lower, parse_enum, program_time, simulate_collective
from ..errors import InputError
from ..io import load_cluster
from ..io.cluster_base import split_sets
from ..io.sweep import (
    INPUTS_FILE,
    VERSION_LABEL,
    ResultsLog,
    SweepSpec,
    check_out_dir,
    columns_markdown,
    load_sweep_spec,
    point_id,
    point_inputs,
    read_inputs_manifest,
    sweep_columns,
    write_inputs_manifest,
)
from ..plots.figures import save_figure, sweep_figures
from ..simulate.step import with_overrides
from ..units import parse_bandwidth, parse_size

# ---------------------------------------------------------------------------------------------
# Points: pure functions of a dict.
# ---------------------------------------------------------------------------------------------


def apply_bandwidth_overrides(spec, point: dict[str, Any]):
    """The cluster with ``nic_bandwidth`` / ``intra_bandwidth`` of the point, if given."""

    def bw(key: str) -> float | None:
        v = point.get(key)
        return None if v in (None, "") else parse_bandwidth(v, key)

    return with_overrides(spec, bw("nic_bandwidth"), bw("intra_bandwidth"))


def run_collective_point(point: dict[str, Any]) -> dict[str, Any]:
    """One collective (keys: cluster, nodes, group_nodes, op, scope, size, algo, mode).

    Engine mode runs the simpy flow-level network; analytic mode the closed form of the same
    lowering. Returns the point plus the ``collective`` columns of :data:`COLUMNS`.
    """

    spec = load_cluster(point.get("cluster", "paper-a100-roce"), point.get("nodes"),
                        point.get("group_nodes"), split_sets(point.get("cluster_set")))
    spec = apply_bandwidth_overrides(spec, point)
    op = parse_enum(Op, point.get("op", "all-gather"), "op")
    scope = parse_enum(Scope, point.get("scope", "global"), "scope")
    algo = parse_enum(Algo, point.get("algo", "ring"), "algo")
    size = parse_size(point.get("size", "1GB"), "size")
    row: dict[str, Any] = {**point, "status": "ok", "reason": "", "gpus": spec.gpus}
    if point.get("mode", "engine") == "analytic":
        prog = lower(spec, op, scope, size, algo)
        t = program_time(spec, prog)
        busbw = size / t / 1e9 * op.busbw_factor(prog.gpus) if t > 0 else 0.0
        row.update(ring_size=prog.gpus, size_bytes=size, time_s=t, closed_form_s=t,
                   algbw_GBps=size / t / 1e9 if t > 0 else 0.0, busbw_GBps=busbw,
                   chunks=prog.chunks, events=0)
        return row
    res = simulate_collective(spec, op, scope, size, algo).to_dict()
    links = res.pop("links")
    for k in ("ring_size", "size_bytes", "time_s", "closed_form_s", "algbw_GBps", "busbw_GBps",
              "chunks", "events"):
        row[k] = res[k]
    for cls, v in links.items():
        row[f"bytes_{cls}"] = float(v["bytes"])
        row[f"busy_s_{cls}"] = float(v["busy_s"])
    return row


def evaluate(point: dict[str, Any]) -> dict[str, Any]:
    """The row of one point; never raises for a per-point problem (it becomes the row).

    A bad combination (``InputError`` / ``ValueError``) gives ``status: error`` and the message
    as ``reason``; any other exception the same, with its type in the reason.
    """
    try:
        if point.get("kind", "step") == "collective":
            return run_collective_point(point)
        from ..simulate.point import run_point  # deferred: a worker process imports the simulator

        return run_point(point)
    except (KeyboardInterrupt, SystemExit):
        raise
    except ValueError as e:  # InputError is a ValueError
        return {**point, "status": "error", "reason": str(e)}
    except Exception as e:  # noqa: BLE001 - a crashing point must not stop the sweep
        return {**point, "status": "error", "reason": f"{type(e).__name__}: {e}"}


# ---------------------------------------------------------------------------------------------
# Executors: each yields (index, row) as points finish.
# ---------------------------------------------------------------------------------------------


def _ignore_sigint(parent_pid: int | None = None) -> None:
    """Worker initializer: Ctrl-C is the parent's to handle (it stops the pool). A worker
    also ends when the sweep process is gone, even after a SIGKILL that let it clean nothing
    up: the kernel kills it with its parent (Linux ``PR_SET_PDEATHSIG``; the fork server,
    the workers' parent, exits with the sweep), and a watchdog thread checks the sweep's pid
    every 0.5 s (other systems)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if parent_pid is None:
        return
    if sys.platform.startswith("linux"):
        try:
            import ctypes  # deferred: only to restore a signal mask

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass

    def watch() -> None:
        while True:
            try:
                os.kill(parent_pid, 0)
            except ProcessLookupError:
                os._exit(1)
            except PermissionError:
                pass
            time.sleep(0.5)

    threading.Thread(target=watch, name="parosim-parent-watch", daemon=True).start()


def _serial(points: list[dict]) -> Iterator[tuple[int, dict]]:
    for i, p in enumerate(points):
        yield i, evaluate(p)


def _local_pool(points: list[dict], workers: int) -> Iterator[tuple[int, dict]]:
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        # Import the simulator once in the fork server; each worker then starts warm.
        # (not parosim.sweep itself: it may be __main__, which workers re-run under runpy)
        # (the packages load their names on first use: preload the modules themselves)
        ctx.set_forkserver_preload(["parosim.collectives.simulate", "parosim.io.cluster",
                                    "parosim.io.model", "parosim.simulate.point"])
    else:
        ctx = multiprocessing.get_context("spawn")

    ex = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_ignore_sigint,
                             initargs=(os.getpid(),))
    procs = []
    ok = False
    try:
        # Keep about 2 tasks per worker in flight: an interrupt then loses little queued work,
        # and large grids are not pickled to the pool all at once.
        todo = iter(enumerate(points))
        pending: dict[Future, int] = {}

        def fill() -> None:
            while len(pending) < 2 * workers:
                nxt = next(todo, None)
                if nxt is None:
                    return
                pending[ex.submit(evaluate, nxt[1])] = nxt[0]

        fill()
        procs = list((getattr(ex, "_processes", None) or {}).values())
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in sorted(done, key=pending.__getitem__):
                i = pending.pop(fut)
                try:
                    row = fut.result()
                except Exception as e:  # noqa: BLE001 - a worker died: the point's row says so
                    row = {**points[i], "status": "error",
                           "reason": f"worker failed: {type(e).__name__}: {e}"}
                yield i, row
            fill()
        ok = True
    finally:
        ex.shutdown(wait=ok, cancel_futures=True)
        if not ok:  # interrupted: do not wait for running points, stop the workers now
            for proc in procs:
                proc.terminate()


def _connect(address: str, timeout_s: float):
    """A dask.distributed Client of the scheduler at ``address`` (InputError if unreachable)."""
    from distributed import Client  # deferred: distributed loads only when this runs

    if not isinstance(address, str) or not address.strip():
        raise InputError("--scheduler is empty; expected the address of a running dask "
                         "scheduler, e.g. tcp://127.0.0.1:8786")
    try:
        return Client(address, timeout=f"{timeout_s}s")
    except (OSError, TimeoutError) as e:
        raise InputError(f"cannot reach the dask scheduler at {address!r}: {e}") from None
    except (ValueError, TypeError) as e:  # e.g. no port: not an address at all
        raise InputError(f"--scheduler {address!r} is not a scheduler address ({e}); expected "
                         "e.g. tcp://127.0.0.1:8786") from None


def _dask(client, points: list[dict], ids: list[str]) -> Iterator[tuple[int, dict]]:
    from distributed import as_completed  # deferred: distributed loads only when this runs

    futures = client.map(evaluate, points, key=[f"parosim-point-{i}" for i in ids], pure=False)
    index = {f.key: i for i, f in enumerate(futures)}
    try:
        for fut in as_completed(futures):
            i = index[fut.key]
            try:
                row = fut.result()
            except Exception as e:  # noqa: BLE001 - e.g. KilledWorker
                row = {**points[i], "status": "error",
                       "reason": f"dask task failed: {type(e).__name__}: {e}"}
            yield i, row
    finally:
        client.cancel(futures)


# ---------------------------------------------------------------------------------------------
# The sweep.
# ---------------------------------------------------------------------------------------------


def _progress(total: int, initial: int, name: str, enabled: bool):
    from tqdm import tqdm  # deferred: tqdm loads only when this runs

    return tqdm(total=total, initial=initial, desc=name, unit="pt", disable=not enabled,
                file=sys.stderr, dynamic_ncols=True, smoothing=0.1)


def run_sweep(spec: SweepSpec, out_dir: str | Path, workers: int = 2,
              scheduler: str | None = None, progress: bool = True,
              figures: bool = True, scheduler_timeout_s: float = 10.0,
              fresh: bool = False) -> dict[str, Any]:
    """Run (or resume) ``spec`` into ``out_dir``; return a summary dict.

    ``workers``: local processes (1 = in this process). ``scheduler``: address of a running
    dask.distributed scheduler (e.g. ``tcp://127.0.0.1:8786``); then ``workers`` is ignored.
    ``fresh``: compute every point, whatever ``results.csv`` holds (it is overwritten).

    A point resumes only if ``results.csv`` holds a row of the same id, which covers the
    point's values, the contents of every input file it references and the parosim version
    (:func:`~parosim.io.sweep.point_id`): an edited cluster / model / runtime file re-runs
    its points. ``inputs.json`` records those files' sha256 so the next run can say which
    changed.

    Summary keys: ``name``, ``kind``, ``mode``, ``points``, ``done`` (evaluated now),
    ``skipped`` (already in results.csv), ``ok``, ``failed`` (rows not ok: ``does_not_fit`` +
    ``errors``), ``stale``, ``dropped_lines``, ``inputs_changed`` (labels of the inputs whose
    contents differ from the last run's, e.g. ``cluster 'my.yaml'``, or ``parosim version``),
    ``rerun_changed`` (points run now that read a changed input), ``fresh``, ``wall_s``,
    ``results``, ``columns``, ``figures``.
    """
    from .. import __version__  # local: the package's version, read at call time

    t0 = time.perf_counter()
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise InputError(f"--workers {workers!r} must be a positive integer")
    out = check_out_dir(out_dir)
    points, ids, labels, seen = [], [], [], set()
    cache: dict = {}
    inputs_now: dict[str, str] = {}
    for p in spec.points():
        inputs = point_inputs(p, cache)
        pid = point_id(p, inputs)
        if pid not in seen:  # a set: linear in the grid size
            seen.add(pid)
            points.append(p)
            ids.append(pid)
            labels.append(tuple(label for label, _ in inputs.values()))
    for entry in cache.values():
        if entry is not None:
            inputs_now[entry[0]] = entry[1]
    before = read_inputs_manifest(out)
    changed = sorted(k for k, sha in inputs_now.items() if k in before and before[k] != sha)
    if VERSION_LABEL in before and before[VERSION_LABEL] != __version__:
        changed.append(VERSION_LABEL)
    moe = spec.has_moe()   # a mixture-of-experts model: the MoE columns too
    columns = list(sweep_columns(spec.kind, spec.input_keys(), moe))
    client = _connect(scheduler, scheduler_timeout_s) if scheduler is not None else None
    try:
        log = ResultsLog(out / "results.csv", columns, fresh=fresh)
        if fresh:  # the rows an earlier run left over are not this run's
            (out / "results.stale.csv").unlink(missing_ok=True)
    except BaseException:
        if client is not None:
            client.close()
        raise
    try:
        (out / "columns.md").write_text(columns_markdown(spec.kind, spec.input_keys(), moe))
    except OSError as e:
        log.release()
        if client is not None:
            client.close()
        raise InputError(f"{str(out / 'columns.md')!r} cannot be written: "
                         f"{e.strerror or e}") from None
    todo = [(p, i) for p, i in zip(points, ids, strict=False) if i not in log.rows]
    skipped = len(points) - len(todo)
    changed_set = set(changed)
    rerun_changed = 0 if fresh else sum(
        VERSION_LABEL in changed_set or not changed_set.isdisjoint(ls)
        for ls, i in zip(labels, ids, strict=True) if i not in log.rows)
    counts = {"ok": 0, "does-not-fit": 0, "error": 0}
    bar = _progress(len(points), skipped, spec.name, progress)
    stream: Iterator[tuple[int, dict]] = iter(())
    try:
        todo_points = [p for p, _ in todo]
        if todo and client is not None:
            stream = _dask(client, todo_points, [i for _, i in todo])
        elif todo and (workers == 1 or len(todo) == 1):
            stream = _serial(todo_points)
        elif todo:
            stream = _local_pool(todo_points, min(workers, len(todo)))
        for k, row in stream:
            row = {**row, "point_id": todo[k][1]}
            log.append(row)
            st = row.get("status", "error")
            counts[st if st in counts else "error"] += 1
            bar.set_postfix(ok=counts["ok"], failed=counts["does-not-fit"] + counts["error"],
                            refresh=False)
            bar.update(1)
    finally:
        close = getattr(stream, "close", None)
        if close is not None:  # stops a pool / cancels dask futures on interrupt
            close()
        bar.close()
        log.close()
        if sys.exc_info()[0] is not None:
            log.release()
        if client is not None:
            client.close()
    try:
        stale = log.finalize(ids)
        write_inputs_manifest(out, inputs_now, __version__)
    except OSError as e:
        raise InputError(f"{str(out / INPUTS_FILE)!r} cannot be written: "
                         f"{e.strerror or e}") from None
    finally:
        log.release()
    final = [log.rows[i] for i in ids]
    status_col = columns.index("status")
    n_nofit = sum(r[status_col] == "does-not-fit" for r in final)
    n_err = sum(r[status_col] not in ("ok", "does-not-fit") for r in final)
    fig_paths = make_figures(spec, out) if figures and spec.figures else []
    return {"name": spec.name, "kind": spec.kind, "mode": spec.mode, "points": len(points),
            "done": len(todo), "skipped": skipped, "ok": len(final) - n_nofit - n_err,
            "failed": n_nofit + n_err, "does_not_fit": n_nofit, "errors": n_err,
            "stale": stale, "dropped_lines": log.dropped, "inputs_changed": changed,
            "rerun_changed": rerun_changed, "fresh": fresh,
            "wall_s": round(time.perf_counter() - t0, 3),
            "results": str(out / "results.csv"), "columns": str(out / "columns.md"),
            "figures": fig_paths}


def read_results(path: str | Path):
    """``results.csv`` as a pandas DataFrame (booleans parsed, empty cells NaN)."""
    import pandas as pd  # deferred: pandas loads only when this runs

    df = pd.read_csv(path, keep_default_na=True)
    if "fits" in df.columns:
        df["fits"] = df["fits"].map({True: True, False: False, "True": True, "False": False})
    return df


def make_figures(spec: SweepSpec, out: Path) -> list[str]:
    """Draw the spec's figures from ``out/results.csv`` into ``out/figures`` (PNG + SVG)."""
    df = read_results(out / "results.csv")
    paths = []
    for stem, draw in sweep_figures(df, spec.figures):
        try:
            paths += save_figure(draw(), out / "figures" / stem)
        except Exception as e:  # noqa: BLE001 - the results are safe; say which plot failed
            print(f"parosim: warning: figure {stem!r} of {spec.name!r} failed: "
                  f"{type(e).__name__}: {e}", file=sys.stderr)
    return paths


def run_sweep_cli(spec_path: str | Path, out_dir: str | Path, workers: int = 2,
                  scheduler: str | None = None, progress: bool = True,
                  fresh: bool = False) -> dict[str, Any]:
    """What ``parosim sweep SPEC.yaml --out DIR [--fresh]`` calls: load, validate, run; a
    summary."""
    spec = load_sweep_spec(spec_path)
    return run_sweep(spec, out_dir, workers=workers, scheduler=scheduler, progress=progress,
                     fresh=fresh)
