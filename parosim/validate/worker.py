"""One rank of a validation run: ``python -m parosim.validate.worker --config CFG.json``.

Started by :mod:`parosim.validate.executor` (one process per rank, inside the node's network
namespace when emulating) or by ``torchrun`` on a real cluster (rank and world size from the
environment, ``env://`` rendezvous). Imports only torch and the standard library.

The config (JSON, written by the executor) holds

* ``backend``: ``gloo``, ``nccl`` or ``auto`` (NCCL when CUDA is available, else gloo);
* ``groups``: ``[[channel, [ranks...]], ...]`` - every process group, created in this order by
  every rank (torch.distributed requires the same order everywhere). A *channel* keeps
  concurrent traffic apart: lanes of an HO-Ring and streams of a Plan each get their own groups;
* ``tasks``: collectives (a lowered Program's phases) or Plans (ops on streams), each with
  ``warmup`` and ``iters``; a phase is ``{name, op, rings, buffer_bytes, lane, deps, channel}``.

Semantics (the same as the simulator's, see :mod:`parosim.collectives.types`): a lane runs its
phases in list order, lanes run at once (one thread each), ``deps`` wait for phases of other
lanes; a Plan stream runs its ops in order, an op waits for its deps. Compute ops sleep their
simulated duration. Timing: every iteration starts at a global barrier; a rank's elapsed time is
from its barrier exit to its last phase end; rank 0 gathers every rank's records and writes
``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from . import ring as R

EXPLICIT = {"all-gather": R.ring_all_gather, "reduce-scatter": R.ring_reduce_scatter,
            "all-reduce": R.ring_all_reduce}
NATIVE = {"all-gather": R.native_all_gather, "reduce-scatter": R.native_reduce_scatter,
          "all-reduce": R.native_all_reduce}


class Ctx:
    """Per-rank state: rank, device, groups by (channel, members)."""

    def __init__(self, rank: int, world: int, device: torch.device, cuda: bool):
        self.rank, self.world, self.device, self.cuda = rank, world, device, cuda
        self.groups: dict[tuple[str, tuple[int, ...]], object] = {}

    def group(self, channel: str, ring: tuple[int, ...]):
        """(up, down) process groups of a ring on a channel (see :func:`ring._pg`)."""
        members = tuple(sorted(ring))
        up = self.groups[channel + "/up", members]
        if self.cuda:  # NCCL is full duplex on one communicator; batch the step on it
            return up
        return up, self.groups[channel + "/down", members]

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)


def _my_ring(phase: dict, rank: int) -> tuple[int, ...] | None:
    for ring in phase["rings"]:
        if rank in ring:
            return tuple(ring)
    return None


class PhaseRunner:
    """Buffers and execution of one phase on this rank."""

    def __init__(self, ctx: Ctx, phase: dict, mode: str):
        self.ctx, self.ph, self.mode = ctx, phase, mode
        self.ring = _my_ring(phase, ctx.rank)
        numel = max(1, int(phase["buffer_bytes"] // 4))
        if self.ring is not None:
            k = len(self.ring)  # equal pieces (backends' collectives need them): round up
            if phase["op"] == "send":
                k = 1
            numel = -(-numel // k) * k
            self.buf = torch.zeros(numel, dtype=torch.float32, device=ctx.device)
            self.scratch = torch.empty(numel // len(self.ring) + 1, dtype=torch.float32,
                                       device=ctx.device)
            self.group = ctx.group(phase["channel"], self.ring) if k > 1 else None

    def fill(self) -> None:
        if self.ring is not None:
            self.buf.fill_(float(self.ctx.rank + 1))

    def run(self) -> None:
        if self.ring is None or len(self.ring) < 2:
            return
        op = self.ph["op"]
        if op == "send":   # point-to-point (pipeline stages): rings are (src, dst) pairs
            src, dst = self.ring
            me = self.ctx.rank
            if me == src:
                dist.send(self.buf, dst, group=R._pg(self.group, src, dst))
            else:
                dist.recv(self.buf, src, group=R._pg(self.group, src, dst))
            self.ctx.sync()
            return
        if self.mode == "native":
            NATIVE[op](self.buf, self.ring, self.ctx.rank, self.group)
        elif op == "all-gather":
            R.ring_all_gather(self.buf, self.ring, self.ctx.rank, self.group)
        else:
            EXPLICIT[op](self.buf, self.ring, self.ctx.rank, self.group, self.scratch)
        self.ctx.sync()

    def check(self) -> str | None:
        """None if the data is right after one run from :meth:`fill`, else what is wrong."""
        if self.ring is None or len(self.ring) < 2 or self.ph["op"] == "send":
            return None
        k, p = len(self.ring), self.ring.index(self.ctx.rank)
        ps = R.pieces(self.buf.cpu(), k)
        total = float(sum(r + 1 for r in self.ring))
        op = self.ph["op"]
        if op == "all-gather":
            want = [float(r + 1) for r in self.ring]
            bad = [c for c in range(k) if not bool((ps[c] == want[c]).all())]
        elif op == "reduce-scatter":
            bad = [] if bool((ps[p] == total).all()) else [p]
        else:
            bad = [c for c in range(k) if not bool((ps[c] == total).all())]
        if bad:
            return (f"rank {self.ctx.rank}: {op} on ring {self.ring} wrong in pieces {bad} "
                    f"(piece {bad[0]} holds {ps[bad[0]][:3].tolist()}...)")
        return None


def run_lanes(runners: list[PhaseRunner], phases: list[dict], t0: float,
              spans: list, errors: list) -> None:
    """Run phases on their lanes (one thread per lane) honouring deps; fill spans[i]."""
    lanes: dict[str, list[int]] = {}
    for i, ph in enumerate(phases):
        lanes.setdefault(ph["lane"], []).append(i)
    done = [threading.Event() for _ in phases]

    def lane(idx: list[int]) -> None:
        for i in idx:
            for d in phases[i]["deps"]:
                while not done[d].wait(1.0):
                    if errors:
                        return
            s = time.perf_counter()
            try:
                runners[i].run()
            except Exception as e:  # reported, and the other lanes stop waiting
                errors.append(f"rank {runners[i].ctx.rank} phase {phases[i]['name']}: {e!r}")
                done[i].set()
                return
            spans[i] = (s - t0, time.perf_counter() - t0)
            done[i].set()

    if len(lanes) == 1:
        lane(next(iter(lanes.values())))
        return
    threads = [threading.Thread(target=lane, args=(idx,), daemon=True) for idx in lanes.values()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def run_collective(ctx: Ctx, task: dict) -> dict:
    phases = task["phases"]
    runners = [PhaseRunner(ctx, ph, task["mode"]) for ph in phases]
    records, problems = [], []
    for it in range(task["warmup"] + task["iters"]):
        for r in runners:
            r.fill()
        ctx.sync()
        spans: list = [None] * len(phases)
        errors: list[str] = []
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        run_lanes(runners, phases, t0, spans, errors)
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
        if errors:
            raise RuntimeError("; ".join(errors))
        if task.get("check") and it == 0:
            problems = [p for p in (r.check() for r in runners) if p]
        if it >= task["warmup"]:
            records.append({"elapsed_s": elapsed, "cpu_s": cpu, "spans": spans})
    return {"records": records, "problems": problems}


def run_plan(ctx: Ctx, task: dict) -> dict:
    """Streams as threads; collective ops run their phases on their lanes (nested threads)."""
    ops = task["ops"]
    index = {op["id"]: i for i, op in enumerate(ops)}
    # an op with "ranks" runs only on those ranks (3D plans: a pipeline stage's ops)
    mine = [op.get("ranks") is None or ctx.rank in op["ranks"] for op in ops]
    runners = {i: [PhaseRunner(ctx, ph, task["mode"]) for ph in op["phases"]]
               for i, op in enumerate(ops) if op["kind"] == "collective" and mine[i]}
    streams: dict[str, list[int]] = {}
    for i, op in enumerate(ops):
        streams.setdefault(op["stream"], []).append(i)
    records = []
    for it in range(task["warmup"] + task["iters"]):
        for rs in runners.values():
            for r in rs:
                r.fill()
        ctx.sync()
        done = [threading.Event() for _ in ops]
        spans: list = [None] * len(ops)
        errors: list[str] = []
        dist.barrier()
        t0 = time.perf_counter()

        def stream(idx: list[int], done=done, spans=spans, errors=errors, t0=t0) -> None:
            for i in idx:
                for d in ops[i]["deps"]:
                    while not done[index[d]].wait(1.0):
                        if errors:
                            return
                if not mine[i]:
                    done[i].set()
                    continue
                s = time.perf_counter()
                if ops[i]["kind"] == "compute":
                    time.sleep(ops[i]["duration_s"])
                else:
                    ph = ops[i]["phases"]
                    run_lanes(runners[i], ph, t0, [None] * len(ph), errors)
                spans[i] = (s - t0, time.perf_counter() - t0)
                done[i].set()
                if errors:
                    return

        threads = [threading.Thread(target=stream, args=(idx,), daemon=True)
                   for idx in streams.values()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
        if errors:
            raise RuntimeError("; ".join(errors))
        if it >= task["warmup"]:
            records.append({"elapsed_s": elapsed, "spans": spans})
    return {"records": records, "problems": []}


def init(cfg: dict, rank: int | None) -> Ctx:
    backend = cfg.get("backend", "auto")
    cuda = torch.cuda.is_available()
    if backend == "auto":
        backend = "nccl" if cuda and dist.is_nccl_available() else "gloo"
    if backend == "nccl" and not cuda:
        raise SystemExit("backend nccl asked for but CUDA is not available in this rank")
    timeout = timedelta(seconds=float(cfg.get("timeout_s", 300)))
    if rank is None:  # torchrun: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    else:
        world = int(cfg["world"])
    use_cuda = backend == "nccl"
    if use_cuda:
        local = int(os.environ.get("LOCAL_RANK", rank % max(1, torch.cuda.device_count())))
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout,
                            init_method="env://")
    ctx = Ctx(rank, world, device, use_cuda)
    for channel, members in cfg["groups"]:
        members = tuple(sorted(members))
        ctx.groups[channel, members] = dist.new_group(list(members))
    return ctx


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--rank", type=int, default=None)
    ap.add_argument("--out", default=None, help="where rank 0 writes the results JSON")
    a = ap.parse_args(argv)
    with open(a.config) as f:
        cfg = json.load(f)
    torch.set_num_threads(1)
    # Lanes and streams are threads of one process: hand the GIL over every 0.1 ms rather than
    # every 5 ms (CPython's default), or a lane whose data just arrived waits for the other
    # lane's time slice, a delay no GPU lane has.
    sys.setswitchinterval(1e-4)
    nice = int(cfg.get("nice", 0))
    if nice:  # a benchmark's ranks ahead of other work on a shared host (root may go below 0)
        try:
            os.nice(nice)
        except OSError:
            pass
    ctx = init(cfg, a.rank)
    results = {}
    for task in cfg["tasks"]:
        fn = run_plan if task["kind"] == "plan" else run_collective
        results[task["id"]] = fn(ctx, task)
    gathered = [None] * ctx.world if ctx.rank == 0 else None
    dist.gather_object({"rank": ctx.rank, "results": results}, gathered, dst=0)
    if ctx.rank == 0:
        out = {"backend": dist.get_backend(), "world": ctx.world, "ranks": gathered}
        path = a.out or cfg.get("out")
        if path:
            with open(path + ".tmp", "w") as f:
                json.dump(out, f)
            os.replace(path + ".tmp", path)
        else:
            json.dump(out, sys.stdout)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
