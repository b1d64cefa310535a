"""Run collectives and Plans on real torch.distributed ranks and gather their timings.

The parent side of a validation run: turns lowered :class:`~parosim.collectives.types.Program` s
(and Plans) into a JSON config, starts one :mod:`parosim.validate.worker` process per rank -
inside the node's namespace of an :class:`~parosim.validate.emulate.EmulatedCluster`, or all on
this host's loopback - waits for them with a deadline, and summarises rank 0's gathered records.

Two ways of running a phase (``mode``): ``"explicit"`` runs each ring collective as explicit
point-to-point ring steps (:mod:`parosim.validate.ring`): exactly the algorithm the simulator
models. ``"native"`` calls the backend's own collective on the ring's process group (what a
framework would do; gloo's reduce-scatter, for one, is not a ring).

>>> tasks = [collective_task("ag", program)]                           # doctest: +SKIP
>>> res = run_tasks(Launch(nodes=1, ranks_per_node=4), tasks)          # doctest: +SKIP
>>> res["ag"].median_s                                                 # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InputError
from .emulate import EmulatedCluster

MODES = ("explicit", "native")
BACKENDS = ("auto", "gloo", "nccl")
_REPO = Path(__file__).resolve().parents[2]


@dataclass
class Launch:
    """Where the ranks run: ``nodes`` x ``ranks_per_node``, in ``emulated`` namespaces or not.

    Without an emulated cluster every rank runs in this namespace on loopback (``nodes`` then
    only sets the rank numbering: rank = node * ranks_per_node + local).
    """

    nodes: int = 1
    ranks_per_node: int = 2
    emulated: EmulatedCluster | None = None
    backend: str = "gloo"
    timeout_s: float = 300.0
    nice: int = -10  # niceness change of the rank processes (negative needs root; best effort)

    def __post_init__(self) -> None:
        for name in ("nodes", "ranks_per_node"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InputError(f"{name} = {v!r} must be a positive integer")
        if self.backend not in BACKENDS:
            raise InputError(f"backend {self.backend!r} is not known; expected one of "
                             f"{', '.join(BACKENDS)}")
        if self.emulated is not None and self.emulated.nodes != self.nodes:
            raise InputError(f"emulated cluster has {self.emulated.nodes} nodes but the launch "
                             f"asks for {self.nodes}")

    @property
    def world(self) -> int:
        return self.nodes * self.ranks_per_node


@dataclass
class TaskResult:
    """Timings of one task: per timed iteration the slowest rank's elapsed time."""

    id: str
    times_s: list[float]
    problems: list[str]
    backend: str
    mode: str
    spans: list[tuple[float, float] | None] = field(default_factory=list)  # median per item
    cpu_s: list[float] = field(default_factory=list)  # per iteration, summed over ranks

    @property
    def cores_used(self) -> float:
        """Median CPU seconds of all ranks per second of wall time (host load of the run)."""
        if not self.cpu_s:
            return float("nan")
        pairs = zip(self.cpu_s, self.times_s, strict=True)
        return statistics.median(c / t for c, t in pairs if t > 0)

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)


def auto_iters(predicted_s: float, budget_s: float = 1.0, lo: int = 5, hi: int = 9) -> int:
    """Timed iterations for a task predicted to take ``predicted_s``: as many as fit in
    ``budget_s``, between ``lo`` and ``hi`` (short tasks are noisier and cheap to repeat).

    >>> auto_iters(0.01), auto_iters(0.15), auto_iters(1.0)
    (9, 6, 5)
    """
    if not predicted_s > 0:
        return hi
    return max(lo, min(hi, int(budget_s / predicted_s)))


def program_phases(program, channel_prefix: str = "lane:") -> list[dict]:
    """A lowered Program's phases as the worker's JSON (channel = prefix + lane)."""
    return [{"name": ph.name, "op": ph.op.value, "rings": [list(r) for r in ph.ringset.rings],
             "buffer_bytes": float(ph.buffer_bytes), "lane": ph.lane, "deps": list(ph.deps),
             "channel": f"{channel_prefix}{ph.lane}"} for ph in program.phases]


def collective_task(task_id: str, program, mode: str = "explicit", warmup: int = 1,
                    iters: int = 3, check: bool = False) -> dict:
    """A worker task running ``program`` ``warmup + iters`` times."""
    if mode not in MODES:
        raise InputError(f"mode {mode!r} is not known; expected one of {', '.join(MODES)}")
    return {"id": task_id, "kind": "collective", "mode": mode, "warmup": warmup,
            "iters": iters, "check": check, "phases": program_phases(program)}


def _groups(tasks: list[dict]) -> list[list]:
    seen: dict[tuple[str, tuple[int, ...]], None] = {}
    for task in tasks:
        phases = task.get("phases", [])
        if task["kind"] == "plan":
            phases = [ph for op in task["ops"] if op["kind"] == "collective"
                      for ph in op["phases"]]
        for ph in phases:
            for ring in ph["rings"]:
                if len(ring) > 1:  # one group per direction, see ring._pg
                    for d in ("/up", "/down"):
                        seen.setdefault((ph["channel"] + d, tuple(sorted(ring))), None)
    return [[c, list(m)] for c, m in seen]


def worker_config(tasks: list[dict], world: int, backend: str = "auto",
                  timeout_s: float = 600.0, nice: int = 0) -> dict:
    """The JSON config every rank reads (:mod:`parosim.validate.worker`)."""
    return {"backend": backend, "world": world, "groups": _groups(tasks), "tasks": tasks,
            "timeout_s": timeout_s, "nice": nice}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _check_ranks(launch: Launch, tasks: list[dict]) -> None:
    for task in tasks:
        phases = task.get("phases") or [ph for op in task.get("ops", [])
                                         for ph in op.get("phases", [])]
        for ph in phases:
            for ring in ph["rings"]:
                if max(ring) >= launch.world:
                    raise InputError(f"task {task['id']!r} uses rank {max(ring)} but the launch "
                                     f"has {launch.world} ranks")


def run_tasks(launch: Launch, tasks: list[dict], workdir: str | None = None) -> dict:
    """Run ``tasks`` on ``launch.world`` real ranks; results by task id.

    Raises ``RuntimeError`` (with the failing rank's stderr) if a rank fails, and
    ``TimeoutError`` after ``launch.timeout_s``; the rank processes are killed in both cases.
    """
    _check_ranks(launch, tasks)
    tmp = Path(workdir or tempfile.mkdtemp(prefix="parosim-validate-"))
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        out = tmp / "results.json"
        cfg = worker_config(tasks, launch.world, launch.backend, launch.timeout_s, launch.nice)
        cfg["out"] = str(out)
        (tmp / "config.json").write_text(json.dumps(cfg))
        procs = _start(launch, tmp)
        _wait(procs, launch.timeout_s, tmp)
        raw = json.loads(out.read_text())
    finally:
        if workdir is None:
            shutil.rmtree(tmp, ignore_errors=True)
    return summarise(raw, tasks)


def _start(launch: Launch, tmp: Path) -> list[subprocess.Popen]:
    emu = launch.emulated
    env = dict(os.environ, PYTHONPATH=f"{_REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if emu is not None:
        env.update(MASTER_ADDR=emu.address(0), MASTER_PORT="29500",
                   GLOO_SOCKET_IFNAME=emu.ifname)
    else:
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
                   GLOO_SOCKET_IFNAME="lo")
    procs = []
    try:
        for rank in range(launch.world):
            node = rank // launch.ranks_per_node
            args = [sys.executable, "-m", "parosim.validate.worker", "--config",
                    str(tmp / "config.json"), "--rank", str(rank)]
            renv = dict(env, LOCAL_RANK=str(rank % launch.ranks_per_node))
            err = open(tmp / f"rank{rank}.err", "w")
            kw = dict(env=renv, cwd=str(_REPO), stdout=subprocess.DEVNULL, stderr=err)
            if emu is not None:
                p = emu.popen(node, args, **kw)
            else:
                p = subprocess.Popen(args, start_new_session=True, **kw)
            err.close()
            procs.append(p)
    except BaseException:
        _kill(procs)
        raise
    return procs


def _kill(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def _wait(procs: list[subprocess.Popen], timeout_s: float, tmp: Path) -> None:
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = [i for i, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                i = failed[0]
                tail = (tmp / f"rank{i}.err").read_text()[-2000:]
                raise RuntimeError(f"rank {i} failed with exit code {codes[i]}:\n{tail}")
            if all(c == 0 for c in codes):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"validation ranks did not finish within {timeout_s:.0f} s")
            time.sleep(0.05)
    finally:
        _kill(procs)


def summarise(raw: dict, tasks: list[dict]) -> dict:
    """Per task: iteration time = max over ranks; spans = (min start, max end) over ranks."""
    res = {}
    ranks = raw["ranks"]
    for task in tasks:
        tid = task["id"]
        per_rank = [r["results"][tid] for r in ranks]
        n_it = len(per_rank[0]["records"])
        times = [max(pr["records"][i]["elapsed_s"] for pr in per_rank) for i in range(n_it)]
        n_items = len(per_rank[0]["records"][0]["spans"]) if n_it else 0
        spans: list = []
        for j in range(n_items):
            its = []
            for i in range(n_it):
                ss = [pr["records"][i]["spans"][j] for pr in per_rank
                      if pr["records"][i]["spans"][j] is not None]
                if ss:
                    its.append((min(s for s, _ in ss), max(e for _, e in ss)))
            spans.append((statistics.median(s for s, _ in its),
                          statistics.median(e for _, e in its)) if its else None)
        problems = [p for pr in per_rank for p in pr["problems"]]
        cpu = [sum(pr["records"][i].get("cpu_s", 0.0) for pr in per_rank) for i in range(n_it)]
        res[tid] = TaskResult(tid, times, problems, raw["backend"], task["mode"], spans, cpu)
    return res
