"""TP x PP x DP Plans on the validation harness: the task's structure (no torch), and a real
run on 4 gloo ranks over loopback (every op on the right ranks, sends delivered, no hang)."""

from __future__ import annotations

import pytest

from parosim.collectives import Algo
from parosim.errors import InputError
from parosim.plan.layout import ParallelSpec
from parosim.plan.threed import build_plan_3d
from parosim.validate.calibrate import emulated_spec
from parosim.validate.emulate import Shaping
from parosim.validate.harness import parse_parallel, plan3d_task, small_model, small_training

SPEC = emulated_spec(2, 2, Shaping(nic_rate_Bps=1e9, intra_rate_Bps=2e9), name="loopback")


def test_plan3d_task_structure():
    tr = small_training(2)
    pp = plan3d_task("x", build_plan_3d(small_model(), "NNN", SPEC, tr, ParallelSpec(pp=2)),
                     SPEC, Algo.RING)
    sends = [op for op in pp["ops"] if op["kind"] == "collective"
             and op["phases"][0]["op"] == "send"]
    # 2 micro-batches: one activation and one gradient transfer each, stage 0 <-> stage 1
    assert len(sends) == 4
    acts = [op for op in sends if op["name"].startswith("send act")]
    assert all(op["phases"][0]["rings"] == [[0, 2], [1, 3]] for op in acts)
    comp = [op for op in pp["ops"] if op["kind"] == "compute"]
    assert {tuple(op["ranks"]) for op in comp} == {(0, 1), (2, 3)}
    tp = plan3d_task("y", build_plan_3d(small_model(), "NNN", SPEC, tr, ParallelSpec(tp=2)),
                     SPEC, Algo.RING)
    # a coalesced TP op (2 layers x 2 all-reduces + the embedding's) runs as 5 calls in a row
    fwd = [op for op in tp["ops"] if op["name"].startswith("tp all-reduce fwd c0 mb0")]
    assert len(fwd) == 5 and all(op["phases"][0]["rings"] == [[0, 1], [2, 3]] for op in fwd)
    pos = [tp["ops"].index(op) for op in fwd]
    assert pos == list(range(pos[0], pos[0] + 5))          # back to back on one stream
    assert len({op["id"] for op in tp["ops"]}) == len(tp["ops"])


def test_parse_parallel():
    assert parse_parallel("2x1, 1x2:IIG") == [(2, 1, "NNN"), (1, 2, "IIG")]
    with pytest.raises(InputError, match="TPxPP"):
        parse_parallel("2by1")


def test_3d_plans_run_on_real_ranks():
    pytest.importorskip("torch")
    from parosim.validate.executor import Launch
    from parosim.validate.harness import validate_steps_3d

    rows = validate_steps_3d(Launch(2, 2, None, "gloo", 240), SPEC,
                             [(2, 1, "NNN"), (1, 2, "NNG")], Algo.RING,
                             training=small_training(2), iters=1)
    assert [(r["tp"], r["pp"], r["dp"]) for r in rows] == [(2, 1, 2), (1, 2, 2)]
    assert all(r["measured_s"] > 0 and r["simulated_s"] > 0 for r in rows)
