"""Overlap interference: compute beside a collective advances at 1/f (engine and analytic)."""

from __future__ import annotations

import pytest

from parosim.collectives.cost import program_time
from parosim.collectives.lowering import lower
from parosim.collectives.types import Algo, Op, Scope
from parosim.evaluate.analytic import evaluate
from parosim.evaluate.replay import replay
from parosim.io import load_cluster
from parosim.plan.dataparallel import COMM_PARAM, COMPUTE, CollectiveOp, ComputeOp, Plan
from parosim.simulate.point import run_point
from parosim.simulate.step import simulate_step
from parosim.spec.model import preset
from parosim.spec.strategy import parse_strategy
from parosim.spec.training import TrainingSpec

CLUSTER = load_cluster("paper-a100-roce")
SIZE = 2e9


def _plan(work_s: float) -> Plan:
    """One compute op of ``work_s`` and one intra all-gather starting with it."""
    ops = (ComputeOp(0, "fwd L0 mb0", "fwd", 0, 0, 1.0, work_s),
           CollectiveOp(1, "ag", Op.ALL_GATHER, Scope.INTRA, SIZE, "param-gather", 0, 0,
                        COMM_PARAM))
    return Plan(ops, parse_strategy("IIG"), CLUSTER.gpus, CLUSTER.group_size, "x", 1, 1, 1,
                1.0, 1, 1.0, runtime="test")


@pytest.mark.parametrize("mode", ["engine", "analytic"])
def test_26_percent_overlap_at_factor_1_5_costs_13_percent(mode):
    """A collective overlapping 26 % of the compute's work, slowed by 1.5 there: +13 %."""
    c = program_time(CLUSTER, lower(CLUSTER, Op.ALL_GATHER, Scope.INTRA, SIZE, Algo.RING))
    f = 1.5
    work = c / f / 0.26            # the work done beside the collective is c / f = 26 %
    plan = _plan(work)
    assert plan.ops[0].stream == COMPUTE
    if mode == "engine":
        base = replay(plan, CLUSTER, Algo.RING, 1.0).step_time_s
        slow = replay(plan, CLUSTER, Algo.RING, f).step_time_s
    else:
        base = evaluate(plan, CLUSTER, Algo.RING).step_time_s
        slow = evaluate(plan, CLUSTER, Algo.RING, overlap_slowdown=f).step_time_s
    assert base == pytest.approx(work, rel=1e-6)
    assert slow / base - 1 == pytest.approx(0.26 * (f - 1), rel=1e-3)   # 13 %


def test_engine_rate_changes_when_a_collective_starts_mid_compute():
    """The collective starts after the compute op: the slowdown still applies (it is not
    decided when the compute op starts)."""
    c = program_time(CLUSTER, lower(CLUSTER, Op.ALL_GATHER, Scope.INTRA, SIZE, Algo.RING))
    ops = (ComputeOp(0, "a", "fwd", 0, 0, 1.0, c),             # on the compute stream
           ComputeOp(1, "b", "fwd", 1, 0, 1.0, 4 * c),
           CollectiveOp(2, "ag", Op.ALL_GATHER, Scope.INTRA, SIZE, "param-gather", 0, 0,
                        COMM_PARAM, deps=(0,)))                 # starts while b runs
    plan = Plan(ops, parse_strategy("IIG"), CLUSTER.gpus, CLUSTER.group_size, "x", 1, 1, 1,
                1.0, 1, 1.0)
    t = replay(plan, CLUSTER, Algo.RING, 2.0).step_time_s
    # b does c/2 of work beside the collective (c seconds at half speed), the rest alone
    assert t == pytest.approx(c + c + (4 * c - c / 2), rel=1e-6)


def test_slowdown_moves_a_real_step_in_both_modes():
    m, t = preset("llama-7b"), TrainingSpec(accum_steps=2)
    res = {}
    for mode in ("engine", "analytic"):
        a = simulate_step(m, CLUSTER, "IIG", t, mode=mode)
        b = simulate_step(m, CLUSTER, "IIG", TrainingSpec(accum_steps=2, overlap_slowdown=1.5),
                          mode=mode)
        res[mode] = b.step_time_s / a.step_time_s - 1
        assert b.overlap_slowdown == 1.5 and a.overlap_slowdown == 1.0
    assert res["engine"] > 0.03 and res["analytic"] > 0.03
    assert res["engine"] == pytest.approx(res["analytic"], abs=0.02)


def test_slowdown_from_cluster_yaml_and_sweepable(tmp_path):
    src = open(__import__("parosim.io.cluster", fromlist=["x"]).topologies_dir()
               / "paper-a100-roce.yaml").read()
    p = tmp_path / "c.yaml"
    p.write_text(src + "compute: {overlap_slowdown: 1.5}\n")
    c = load_cluster(str(p))
    assert c.overlap_slowdown == 1.5
    m, t = preset("llama-7b"), TrainingSpec(accum_steps=2)
    r = simulate_step(m, c, "IIG", t, mode="analytic")
    assert r.overlap_slowdown == 1.5
    explicit = simulate_step(m, c, "IIG", TrainingSpec(accum_steps=2, overlap_slowdown=1.0),
                             mode="analytic")
    assert explicit.overlap_slowdown == 1.0 and explicit.step_time_s < r.step_time_s
    rows = [run_point({"strategy": "IIG", "mode": "analytic", "overlap_slowdown": f})
            for f in (1.0, 1.5)]
    assert rows[1]["step_time_s"] > rows[0]["step_time_s"]
    # the framework runtimes default to the cited measurement
    ds = simulate_step(m, CLUSTER, "zero3", t, mode="analytic", runtime="deepspeed")
    assert ds.overlap_slowdown == pytest.approx(1.189)
