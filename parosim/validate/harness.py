"""The validation flow: calibrate on the target, lower with the calibrated spec, measure, simulate.

>>> with EmulatedCluster(nodes=2, shaping=shaping) as emu:                      # doctest: +SKIP
...     launch = Launch(nodes=2, ranks_per_node=2, emulated=emu)
...     cal = calibrate(launch, emulated_spec(2, 2, shaping))
...     rows = validate_collectives(launch, cal.spec, sizes=[2**20, 4 * 2**20])

Like for like: the collectives run on the ranks are the Programs the simulator lowers from the
*calibrated* spec (HO-Ring's chunk count included), and the simulated time is the flow-level
engine's (:func:`parosim.collectives.simulate_program`) on that spec; the closed form is
reported beside it.
"""

from __future__ import annotations

from ..collectives import Algo, Op, Scope, lower, program_time, simulate_program
from ..errors import InputError
from ..evaluate.replay import replay
from ..evaluate.threed import replay_3d
from ..plan.dataparallel import ComputeOp, build_plan
from ..plan.layout import PairSet, ParallelSpec, layout_for
from ..plan.threed import build_plan_3d, check_supported
from ..spec.model import ModelSpec
from ..spec.strategy import parse_strategy
from ..spec.system import ClusterSpec
from ..spec.training import TrainingSpec
from .executor import Launch, auto_iters, collective_task, program_phases, run_tasks
from .report import row

MiB = 2**20
DEFAULT_SIZES = (1 * MiB, 4 * MiB, 16 * MiB)
DEFAULT_OPS = (Op.ALL_GATHER, Op.REDUCE_SCATTER, Op.ALL_REDUCE)
DEFAULT_ALGOS = (Algo.RING, Algo.HIERARCHICAL, Algo.HO_RING)


def validate_collectives(launch: Launch, spec: ClusterSpec, ops=DEFAULT_OPS,
                         algos=DEFAULT_ALGOS, sizes=DEFAULT_SIZES, scope: Scope = Scope.GLOBAL,
                         mode: str = "explicit", warmup: int = 1, iters: int | None = None,
                         check: bool = False, nominal: ClusterSpec | None = None,
                         seen: set | None = None) -> list[dict]:
    """Measure every (op, algo, size) on ``launch`` and compare with the simulator on ``spec``.

    ``iters`` timed runs per collective (default :func:`~.executor.auto_iters` of the
    prediction), after ``warmup`` untimed ones; the measured time is the median. Returns
    rows (``what = "collective"``) with ``measured_by`` = ``explicit-ring`` (point-to-point
    ring steps) or ``backend-native`` (the backend's own collectives on the rings' groups),
    plus ``closed_form_s``, ``chunks`` and the measured iteration times. With ``nominal`` (the
    uncalibrated spec) every row also has ``simulated_nominal_s`` and ``error_nominal_pct``:
    the same program simulated with the nominal costs. ``seen``: (op, algo, scope, size) keys
    of the calibration programs; rows say ``seen_in_calibration``.
    """
    items = []
    for op in ops:
        for algo in algos:
            for size in sizes:
                prog = lower(spec, op, scope, size, algo)
                tid = f"{op.value}/{algo.value}/{int(size)}"
                items.append((tid, op, algo, size, prog))
    tasks = [collective_task(t, p, mode, warmup, iters or auto_iters(program_time(spec, p)),
                             check) for t, _, _, _, p in items]
    res = run_tasks(launch, tasks)
    rows = []
    for tid, op, algo, size, prog in items:
        r = res[tid]
        sim = simulate_program(spec, prog).time_s
        extra = {}
        if nominal is not None:
            nom = simulate_program(nominal, prog).time_s
            extra = {"simulated_nominal_s": nom,
                     "error_nominal_pct": 100.0 * (nom - r.median_s) / r.median_s}
        key = (op.value, algo.value, scope.value, int(size))
        extra["seen_in_calibration"] = bool(seen) and key in seen
        rows.append(row("collective", sim, r.median_s, op=op.value, algo=algo.value, **extra,
                        size_bytes=float(size), scope=scope.value,
                        closed_form_s=program_time(spec, prog), chunks=prog.chunks,
                        measured_by="explicit-ring" if mode == "explicit" else "backend-native",
                        backend=r.backend, times_s=r.times_s, problems=r.problems,
                        ranks=launch.world, nodes=launch.nodes))
    return rows


# -- step level: whole Plans -------------------------------------------------------------------

def small_model():
    """The validation model: 2 LLaMA-shaped layers, h = 256, vocab 2048 (units of 1-1.6 MB of
    bf16 parameters, so one collective takes tens of ms on a 300 Mbit/s emulated NIC)."""
    return ModelSpec("tiny-validate", layers=2, hidden=256, ffn_hidden=688, heads=4,
                     vocab=2048)


def small_training(accum_steps: int = 2):
    """micro-batch 2, sequence 128, s = ``accum_steps``, no recomputation."""
    return TrainingSpec(micro_batch=2, accum_steps=accum_steps, seq_len=128, recompute=False)


def plan_task(task_id: str, plan, spec: ClusterSpec, algo: Algo, mode: str = "explicit",
              warmup: int = 1, iters: int = 3) -> dict:
    """A worker task executing every op of ``plan``: compute ops sleep their simulated
    duration, collectives run the Programs lowered on ``spec`` by ``algo``; every stream and
    lane has its own process groups (channel ``stream|lane``)."""

    ops = []
    for op in plan.ops:
        d = {"id": op.id, "name": op.name, "stream": op.stream, "deps": list(op.deps)}
        if isinstance(op, ComputeOp):
            d.update(kind="compute", duration_s=float(op.duration_s))
        else:
            prog = lower(spec, op.op, op.scope, op.size_bytes, algo)
            d.update(kind="collective", phases=program_phases(prog, f"{op.stream}|"))
        ops.append(d)
    return {"id": task_id, "kind": "plan", "mode": mode, "warmup": warmup, "iters": iters,
            "ops": ops}


_COPY_ID = 10**9   # ids of the extra copies of a coalesced op (above every plan op id)


def plan3d_task(task_id: str, plan, spec: ClusterSpec, algo: Algo, mode: str = "explicit",
                warmup: int = 1, iters: int = 3) -> dict:
    """:func:`plan_task` for a TP x PP x DP Plan (:mod:`parosim.plan.threed`): every op carries the
    ranks that run it (its stage's, or its group set's), a point-to-point send is a ``send``
    phase on its (src, dst) pairs, and a coalesced op (``count`` > 1) becomes count
    collective calls in a row on its stream."""

    lay = layout_for(spec, plan.tp, plan.pp)
    stage_ranks = {k: sorted(r for g in lay.tp_groups(k) for r in g) for k in range(plan.pp)}
    ops = []
    for op in plan.ops:
        d = {"id": op.id, "name": op.name, "stream": op.stream, "deps": list(op.deps)}
        k = int(op.stream.rsplit("/s", 1)[1])
        if isinstance(op, ComputeOp):
            d.update(kind="compute", duration_s=float(op.duration_s), ranks=stage_ranks[k])
            ops.append(d)
            continue
        if isinstance(op.scopes, PairSet):
            phases = [{"name": op.name, "op": "send", "rings": [list(p) for p in
                                                                   op.scopes.rings],
                       "buffer_bytes": float(op.size_bytes), "lane": "main", "deps": [],
                       "channel": f"{op.stream}|main"}]
        else:
            phases = program_phases(op.lower(spec, algo), f"{op.stream}|")
        ranks = sorted({r for ph in phases for ring in ph["rings"] for r in ring})
        # a coalesced op (count collectives back to back) runs as count separate calls on
        # its stream, as Megatron issues them; the last copy keeps the op's id
        for c in range(op.count - 1):
            ops.append(dict(d, id=_COPY_ID + op.id * 1000 + c, name=f"{op.name} #{c}",
                            deps=list(op.deps) if c == 0 else [], kind="collective",
                            phases=phases, ranks=ranks))
        d.update(kind="collective", phases=phases, ranks=ranks)
        ops.append(d)
    return {"id": task_id, "kind": "plan", "mode": mode, "warmup": warmup, "iters": iters,
            "ops": ops}


def parse_parallel(text: str) -> list[tuple[int, int, str]]:
    """``"2x1,1x2:IIG"`` -> [(tp, pp, strategy)]: TP x PP, optional PaRO strategy (NNN).

    >>> parse_parallel("2x1,1x2:nng")
    [(2, 1, 'NNN'), (1, 2, 'NNG')]
    """
    out = []
    for item in (x.strip() for x in str(text).split(",")):
        if not item:
            continue
        shape, _, strat = item.partition(":")
        try:
            tp, pp = (int(v) for v in shape.lower().split("x"))
        except ValueError:
            raise InputError(f"--parallel {item!r} is not TPxPP[:STRATEGY]; expected e.g. "
                             "2x1 or 1x2:IIG") from None
        out.append((tp, pp, parse_strategy(strat or "NNN").short))
    return out


def validate_steps_3d(launch: Launch, spec: ClusterSpec, configs, algo: Algo = Algo.RING,
                      model=None, training=None, mode: str = "explicit", warmup: int = 1,
                      iters: int = 3) -> list[dict]:
    """Run one global step of TP x PP x DP Plans for real and compare with the engine.

    ``configs``: [(tp, pp, strategy)] (see :func:`parse_parallel`). Rows as
    :func:`validate_steps`, with ``strategy`` = ``TPxPP strategy`` and ``tp``, ``pp``,
    ``dp``."""

    model = model or small_model()
    training = training or small_training()
    check_supported(spec, training, algo)
    plans = {}
    for tp, pp, strat in configs:
        par = ParallelSpec(tp=tp, pp=pp)
        plans[f"TP{tp}xPP{pp} {strat}"] = build_plan_3d(model, strat, spec, training, par)
    tasks = [plan3d_task(f"step3d/{k}", p, spec, algo, mode, warmup, iters)
             for k, p in plans.items()]
    res = run_tasks(launch, tasks)
    rows = []
    for k, p in plans.items():
        r = res[f"step3d/{k}"]
        sim = replay_3d(p, spec, algo)[0].step_time_s
        rows.append(row("step", sim, r.median_s, algo=algo.value, strategy=k,
                        model=model.name, accum_steps=training.accum_steps, ops=len(p.ops),
                        tp=p.tp, pp=p.pp, dp=p.dp,
                        measured_by="explicit-ring" if mode == "explicit" else
                        "backend-native", backend=r.backend, times_s=r.times_s,
                        ranks=launch.world, nodes=launch.nodes))
    return rows


def validate_steps(launch: Launch, spec: ClusterSpec, strategies=("GGG", "IIG", "NIG"),
                   algo: Algo = Algo.RING, model=None, training=None, mode: str = "explicit",
                   warmup: int = 1, iters: int = 3,
                   nominal: ClusterSpec | None = None) -> list[dict]:
    """Run one global step of each strategy's Plan for real and compare with the replay.

    Returns rows with ``what = "step"``, ``strategy``, ``algo``, ``simulated_s`` (the simpy
    replay, :func:`parosim.evaluate.replay.replay`) and ``measured_s`` (median step time).
    """

    model = model or small_model()
    training = training or small_training()
    plans = {s: build_plan(model, s, spec, training) for s in strategies}
    tasks = [plan_task(f"step/{s}", p, spec, algo, mode, warmup, iters)
             for s, p in plans.items()]
    res = run_tasks(launch, tasks)
    rows = []
    for s, p in plans.items():
        r = res[f"step/{s}"]
        sim = replay(p, spec, algo).step_time_s
        extra = {"seen_in_calibration": False}  # the fit sees single collectives only
        if nominal is not None:
            nom = replay(p, nominal, algo).step_time_s
            extra.update(simulated_nominal_s=nom,
                         error_nominal_pct=100.0 * (nom - r.median_s) / r.median_s)
        rows.append(row("step", sim, r.median_s, algo=algo.value, strategy=p.strategy.name,
                        **extra,
                        model=model.name,
                        accum_steps=training.accum_steps, ops=len(p.ops),
                        measured_by="explicit-ring" if mode == "explicit" else
                        "backend-native", backend=r.backend, times_s=r.times_s,
                        ranks=launch.world, nodes=launch.nodes))
    return rows
