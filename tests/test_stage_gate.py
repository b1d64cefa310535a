"""The overlap-interference gate is per pipeline stage on 3D plans (docs/parallelism.md,
"Overlap interference per stage"): a collective slows only the compute of the stages whose
GPUs it involves."""

from dataclasses import replace

import pytest

from parosim.collectives.cost import program_time
from parosim.collectives.types import Algo, Op, Scope
from parosim.evaluate.replay import replay
from parosim.evaluate.threed import dp_overlap_bound, dp_overlap_exposed, grad_chain_slowed
from parosim.io import load_cluster
from parosim.plan.dataparallel import ComputeOp
from parosim.plan.layout import ParallelSpec, layout_for
from parosim.plan.threed import GroupOp, build_plan_3d
from parosim.simulate.step import simulate_3d
from parosim.spec.model import preset
from parosim.spec.training import TrainingSpec

M13 = preset("llama-13b")


def _hand_plan(c, coll_stage, group, f_ms=1.0):
    """compute 1 ms on stage 0 and on stage 1, beside one collective of ``coll_stage``
    (``group`` "tp", "dp" or "p2p" from stage 0 to 1) that starts with them."""
    lay = layout_for(c, 2, 2)
    tr = TrainingSpec(micro_batch=1, accum_steps=1, seq_len=2048, recompute=False)
    base = build_plan_3d(M13, "NNN", c, tr, ParallelSpec(tp=2, pp=2))
    k = coll_stage
    scopes = {"tp": lay.tp_scopes(k), "dp": lay.dp_scopes(k), "p2p": lay.pairs(0, 1)}[group]
    ops = (
        ComputeOp(0, "gemm s0", "fwd", None, 0, 1.0, f_ms * 1e-3, "compute/s0"),
        ComputeOp(1, "gemm s1", "fwd", None, 0, 1.0, f_ms * 1e-3, "compute/s1"),
        GroupOp(2, "coll", Op.ALL_GATHER, Scope.GLOBAL, 4e9, "tp", None, 0,
                f"comm-grad/s{k}", (), stage=k, group=group, scopes=scopes),
    )
    return replace(base, ops=ops, dp_grad_chains=(), dp_param_chains=())


@pytest.mark.parametrize("stage,group,slowed", [
    (0, "tp", {"gemm s0"}),            # stage 0's TP all-gather: stage 1 runs at full speed
    (0, "dp", {"gemm s0"}),            # stage 0's DP collective
    (1, "tp", {"gemm s1"}),
    (0, "p2p", {"gemm s0", "gemm s1"}),   # a send involves both ends
])
def test_collective_slows_only_its_own_stage(stage, group, slowed):
    c = load_cluster("dgx-a100-ib", 2)      # 16 GPUs: TP 2 x PP 2 x DP 4
    plan = _hand_plan(c, stage, group)
    x = program_time(c, plan.ops[2].lower(c, Algo.RING))
    assert x > 2e-3                          # the collective outlasts both GEMMs (slowed)
    rep = replay(plan, c, Algo.RING, 2.0, trace=True)
    dur = {r.name: r.end_s - r.start_s for r in rep.records}
    for name in ("gemm s0", "gemm s1"):
        # beside the collective for the whole GEMM: 2 x 1 ms; else 1 ms exactly
        assert dur[name] == pytest.approx(2e-3 if name in slowed else 1e-3, abs=1e-12)
    # f = 1: nobody slowed, the plain timeouts
    one = replay(plan, c, Algo.RING, 1.0, trace=True)
    assert all(r.end_s - r.start_s == pytest.approx(1e-3, abs=1e-12)
               for r in one.records if r.name.startswith("gemm"))


def test_gates_name_the_stages_of_the_ranks():
    c = load_cluster("dgx-a100-ib", 2)
    tr = TrainingSpec(micro_batch=1, accum_steps=4, seq_len=2048, recompute=True)
    plan = build_plan_3d(M13, "NNG", c, tr, ParallelSpec(tp=2, pp=2))
    gates = plan.overlap_gates()
    assert len(gates) == len(plan.ops)
    seen = set()
    for op, g in zip(plan.ops, gates, strict=True):
        if isinstance(op, GroupOp) and op.group == "p2p":
            assert g == (0, 1)
        elif isinstance(op, GroupOp):
            assert g == (op.stage,)
        else:
            assert g == (int(op.stream[-1]),)
        seen.add((type(op).__name__, getattr(op, "group", ""), g))
    assert ("GroupOp", "tp", (1,)) in seen and ("GroupOp", "dp", (0,)) in seen


def test_cooldown_slowdown_hand_case():
    # two stages, each: two buckets of 1 s busy, reductions 0.5 s, f = 2. The second
    # bucket's backward runs beside the first reduction (1 s to 1.5 s): 0.25 s of work in
    # that 0.5 s, the other 0.75 s after: its busy time ends at 2.25 s, 0.25 s late; the
    # second reduction ends at 2.75 s (0.75 s exposed). Stage 1's 0.25 s delays stage 0's
    # last backward (the cool-down), so stage 0's side is 0.75 + 0.25.
    ch = [(1.0, 0.5, True), (1.0, 0.5, True)]
    assert grad_chain_slowed([(1.0, 0.5), (1.0, 0.5)], 2.0) == pytest.approx(0.25)
    assert dp_overlap_exposed(ch, 2.0) == pytest.approx(0.75)
    assert dp_overlap_bound([ch, ch], 2.0) == pytest.approx([1.0, 0.75])
    assert dp_overlap_bound([ch, ch], 1.0) == [dp_overlap_exposed(ch, 1.0)] * 2


CASES = [  # nodes, tp, pp, schedule, strategy, m, sequence parallel + TP overlap, DP overlap
    (1, 2, 2, "1f1b", "NNN", 4, True, False),        # TP 2 x PP 2 x DP 2
    (1, 4, 2, "1f1b", "NNN", 4, True, False),        # TP 4 x PP 2
    (1, 4, 2, "1f1b", "NNN", 4, False, False),       # blocking TP collectives
    (1, 2, 2, "interleaved", "NNN", 4, True, False),
    (8, 4, 2, "1f1b", "NNG", 4, False, True),        # DP overlap (was +2.9 %)
    (8, 4, 2, "1f1b", "NNG", 4, True, True),         # both overlaps
    (8, 4, 2, "interleaved", "NNG", 4, False, True),
    (8, 2, 4, "interleaved", "NNN", 8, False, True),
    (1, 4, 1, "1f1b", "IIG", 2, True, False),        # PaRO micro-step gathers (was +2.8 %)
]


@pytest.mark.parametrize("nodes,tp,pp,sched,strat,m,tpo,dpo", CASES)
def test_engine_matches_closed_form_with_interference(nodes, tp, pp, sched, strat, m, tpo,
                                                      dpo):
    c = load_cluster("dgx-a100-ib", nodes)
    tr = TrainingSpec(micro_batch=1, accum_steps=m, seq_len=2048, overlap_slowdown=1.3)
    par = ParallelSpec(tp=tp, pp=pp, schedule=sched, sequence_parallel=tpo,
                       tp_comm_overlap=tpo, dp_comm_overlap=dpo)
    a = simulate_3d(M13, c, strat, tr, par, "ring", "analytic")
    e = simulate_3d(M13, c, strat, tr, par, "ring", "engine")
    assert e.step_time_s == pytest.approx(a.step_time_s, rel=0.01)
    one = simulate_3d(M13, c, strat, replace(tr, overlap_slowdown=1.0), par, "ring",
                      "engine")
    assert e.step_time_s > one.step_time_s      # the interference is there
