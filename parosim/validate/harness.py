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
from ..specs import ClusterSpec
from .executor import Launch, collective_task, run_tasks
from .report import row

MiB = 2**20
DEFAULT_SIZES = (1 * MiB, 4 * MiB, 16 * MiB)
DEFAULT_OPS = (Op.ALL_GATHER, Op.REDUCE_SCATTER, Op.ALL_REDUCE)
DEFAULT_ALGOS = (Algo.RING, Algo.HIERARCHICAL, Algo.HO_RING)


def validate_collectives(launch: Launch, spec: ClusterSpec, ops=DEFAULT_OPS,
                         algos=DEFAULT_ALGOS, sizes=DEFAULT_SIZES, scope: Scope = Scope.GLOBAL,
                         mode: str = "explicit", warmup: int = 1, iters: int = 3,
                         check: bool = False) -> list[dict]:
    """Measure every (op, algo, size) on ``launch`` and compare with the simulator on ``spec``.

    Returns report rows (``what = "collective"``) with ``measured_by`` = ``explicit-ring``
    (point-to-point ring steps) or ``backend-native`` (the backend's own collectives on the
    rings' groups), plus ``closed_form_s``, ``chunks`` and the measured iteration times.
    """
    items = []
    for op in ops:
        for algo in algos:
            for size in sizes:
                prog = lower(spec, op, scope, size, algo)
                tid = f"{op.value}/{algo.value}/{int(size)}"
                items.append((tid, op, algo, size, prog))
    tasks = [collective_task(t, p, mode, warmup, iters, check) for t, _, _, _, p in items]
    res = run_tasks(launch, tasks)
    rows = []
    for tid, op, algo, size, prog in items:
        r = res[tid]
        sim = simulate_program(spec, prog).time_s
        rows.append(row("collective", sim, r.median_s, op=op.value, algo=algo.value,
                        size_bytes=float(size), scope=scope.value,
                        closed_form_s=program_time(spec, prog), chunks=prog.chunks,
                        measured_by="explicit-ring" if mode == "explicit" else "backend-native",
                        backend=r.backend, times_s=r.times_s, problems=r.problems,
                        ranks=launch.world, nodes=launch.nodes))
    return rows
