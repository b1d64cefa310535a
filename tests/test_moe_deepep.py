"""DeepEP's kernels (normal, low-latency, HybridEP) as the dispatcher of a MoE step and of
one MoE layer (docs/moe.md, "DeepEP dispatch and combine" and "A MoE training step"):
engine against closed form, a layer by hand, bit-identical reruns, refusals."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from parosim.cli import main
from parosim.collectives.cost import program_time
from parosim.collectives.deepep import (
    EPCall,
    EPDispatcher,
    deepep_routing,
    lower_ep_call,
    lower_ep_groups,
)
from parosim.errors import InputError
from parosim.evaluate.moe_layer import (
    Routing,
    busiest_scale,
    expert_flops_per_row,
    layer_distribution,
    route,
)
from parosim.io import load_cluster
from parosim.plan.experts import ExpertLayout
from parosim.plan.moe_step import A2AOp, build_moe_plan, parse_a2a_algo
from parosim.simulate.moe import simulate_moe_step
from parosim.spec.model import preset
from parosim.spec.training import TrainingSpec

Q = preset("qwen3-30b-a3b")   # 128 experts, top-8, hidden 2048
T1 = TrainingSpec(micro_batch=1, seq_len=1024, accum_steps=1, compute_model="flat")
DISPATCHERS = ("deepep-normal", "deepep-ll", "hybridep")


@pytest.fixture(scope="module")
def h800x2():
    return load_cluster("dgx-h800-ib", nodes=2)


@pytest.mark.parametrize("algo", DISPATCHERS)
def test_step_engine_equals_closed_form(h800x2, algo):
    """2 x 8 H800, EP 16 across both nodes, each DeepEP kernel family."""
    e = simulate_moe_step(Q, h800x2, "NNG", "NNG", T1, 16, mode="engine", a2a_algo=algo)
    a = simulate_moe_step(Q, h800x2, "NNG", "NNG", T1, 16, mode="analytic", a2a_algo=algo)
    assert e.fits and a.fits and e.extra["ep_nodes"] == 2
    assert e.extra["a2a_algo"] == algo
    assert e.step_time_s == pytest.approx(a.step_time_s, rel=0.01)
    assert e.bytes_inter > 0
    # the kernels differ from NCCL's all-to-all, and from each other
    p = simulate_moe_step(Q, h800x2, "NNG", "NNG", T1, 16, mode="analytic")
    assert abs(a.step_time_s / p.step_time_s - 1) > 0.01


def test_step_hybridep_fitted_h100():
    """HybridEP's fitted H100 costs (experiments/16_moe_alltoall), 2 x 8 H100."""
    path = Path(__file__).resolve().parents[1] / "experiments/16_moe_alltoall"
    c = load_cluster(str(path / "dgx-h100-hybridep.yaml"), nodes=2)
    assert c.collective.ep_hybrid.rdma_efficiency < 1
    e = simulate_moe_step(Q, c, "NNG", "NNG", T1, 16, mode="engine", a2a_algo="hybridep")
    a = simulate_moe_step(Q, c, "NNG", "NNG", T1, 16, mode="analytic", a2a_algo="hybridep")
    assert e.step_time_s == pytest.approx(a.step_time_s, rel=0.01)


def test_step_kernels_distinct_and_rerun_bit_identical(h800x2):
    times = {}
    for algo in DISPATCHERS:
        r1 = simulate_moe_step(Q, h800x2, "NNG", "NNG", T1, 16, mode="engine", a2a_algo=algo)
        r2 = simulate_moe_step(Q, h800x2, "NNG", "NNG", T1, 16, mode="engine", a2a_algo=algo)
        assert r1.step_time_s == r2.step_time_s and r1.extra == r2.extra
        assert r1.bytes_inter == r2.bytes_inter and r1.events == r2.events
        times[algo] = r1.step_time_s
    assert len(set(times.values())) == 3
    # drawn routing: reruns bit-identical too
    sk = Routing("skew", 1.5, seed=3)
    a = simulate_moe_step(Q, h800x2, "NNG", "NNG", T1, 16, mode="analytic",
                          a2a_algo="deepep-normal", routing=sk, repeats=2)
    b = simulate_moe_step(Q, h800x2, "NNG", "NNG", T1, 16, mode="analytic",
                          a2a_algo="deepep-normal", routing=sk, repeats=2)
    assert a.extra["step_times_s"] == b.extra["step_times_s"]
    assert a.step_time_s > a.extra["balanced_step_s"]


def test_step_calls_bytes_and_directions(h800x2):
    """Each A2AOp is DeepEP's call of the step's T tokens of h x 2 B (bf16), dispatch for the
    dispatch and the combine's gradient, combine for the others; the inter-node bytes per
    GPU are T x p_node x b per call where NCCL's all-to-all sends 8/15 of S x 15/16."""
    plan = build_moe_plan(Q, "NNG", "NNG", h800x2, T1, 16, "deepep-normal")
    ops = [o for o in plan.ops if isinstance(o, A2AOp)]
    assert len(ops) == 4 * 48
    assert {o.ep_call for o in ops} == {(1024, 4096.0, 128, 8)}
    dirs = {o.name.split()[1]: o.direction for o in ops}
    assert dirs == {"dispatch": "dispatch", "combine": "combine",
                    "combine-grad": "dispatch", "dispatch-grad": "combine"}
    # the program of one call is lower_ep_call's for the one EP group (ranks 0..15)
    r = deepep_routing(16, 8, 128, 8, grouped=False)
    call = EPCall("normal", "dispatch", 1024, 4096.0, r)
    prog = ops[0].lower(h800x2, None)
    ref = lower_ep_call(h800x2, call, chunks=prog.chunks)[1]
    assert [p.ringset.hop_list for p in prog.phases] == [p.ringset.hop_list for p in ref.phases]
    assert [p.buffer_bytes for p in prog.phases] == [p.buffer_bytes for p in ref.phases]
    assert program_time(h800x2, prog) == program_time(h800x2, lower_ep_call(h800x2, call)[1])
    d = simulate_moe_step(Q, h800x2, "NNG", "NNG", T1, 16, mode="analytic",
                          a2a_algo="deepep-normal")
    p = simulate_moe_step(Q, h800x2, "NNG", "NNG", T1, 16, mode="analytic")
    size = 1024 * 8 * 2048 * 2
    per_call = 1024 * r.p_node * 4096.0 - size * 15 / 16 * 8 / 15
    assert d.bytes_inter - p.bytes_inter == pytest.approx(192 * per_call, rel=1e-9)


def test_layer_by_hand_one_node():
    """qwen3-30b-a3b, EP 8 on one H800 node, balanced, normal kernels: each of the four
    calls moves T x p_rank x h x 2 B to each of 7 peers over NVLink, p_rank = 1 -
    C(112, 8) / C(128, 8); the layer is 4 calls + 3 x rows x F at peak x efficiency."""
    c = load_cluster("dgx-h800-ib", nodes=1)
    groups = [list(range(8))]
    tok, rows = 1024, 1024 * 8
    p_rank = 1 - math.comb(112, 8) / math.comb(128, 8)
    cost, tun = c.collective.ep_normal, c.collective
    per_flow = tok * p_rank * 2048 * 2
    call = (tun.call_overhead_s + cost.latency_s + tun.phase_overhead_s + tun.step_latency_s
            + c.intra.latency_s + 7 * per_flow / (cost.nvlink_efficiency * c.intra.bandwidth_Bps))
    comp = 3 * rows * expert_flops_per_row(Q) / (c.gpu.peak_flops * T1.compute_efficiency)
    res = layer_distribution(c, Q, groups, rows, T1, Routing(), 1,
                             EPDispatcher.DEEPEP_NORMAL, tok)
    assert res["closed_form_s"] == pytest.approx(4 * call + comp, rel=1e-9)
    assert res["balanced_s"] == pytest.approx(res["closed_form_s"], rel=0.01)
    assert res["times_s"] == [res["balanced_s"]]     # balanced: every draw the same
    # the same numbers on a rerun
    again = layer_distribution(c, Q, groups, rows, T1, Routing(), 1,
                               EPDispatcher.DEEPEP_NORMAL, tok)
    assert again == res


def test_layer_two_nodes_skew(h800x2):
    """EP 16 over two nodes, each kernel: forced balance = closed form within 1 %; skew 1.5
    scales the calls' bytes by the busiest rank's remote rows and its compute by 1.5."""
    groups = [list(range(16))]
    for disp in EPDispatcher:
        res = layer_distribution(h800x2, Q, groups, 8192, T1, Routing("skew", 1.5), 2,
                                 disp, 1024)
        assert res["balanced_s"] == pytest.approx(res["closed_form_s"], rel=0.01)
        assert all(t > res["balanced_s"] for t in res["times_s"])
    R = route(Routing("skew", 1.5), 16, 128, 8192, np.random.default_rng(0))
    w = R[0]                      # skew: every rank splits its rows alike
    assert (R == w).all()
    hot = max(15 * w.max(), 8192 - w.min())   # received by the hot rank, sent by any
    assert busiest_scale(R) == pytest.approx(hot * 16 / (15 * 8192), rel=1e-12)
    assert busiest_scale(R) == pytest.approx(1.5, rel=0.01)
    assert busiest_scale(route(Routing(), 16, 128, 8192, None)) == 1.0


def test_refusals(h800x2):
    assert parse_a2a_algo("HybridEP") is EPDispatcher.HYBRIDEP
    for bad in ("ring", "deepep", "bogus", "nccl"):
        with pytest.raises(InputError, match="--a2a-algo"):
            parse_a2a_algo(bad)
    r = deepep_routing(8, 8, 128, 8, grouped=False)
    call = EPCall("normal", "dispatch", 64, 4096.0, r)
    with pytest.raises(InputError, match="consecutive ranks"):
        lower_ep_groups(h800x2, call, [[0, 2, 4, 6, 8, 10, 12, 14]])
    with pytest.raises(InputError, match="nvlink=True"):
        lower_ep_groups(h800x2, EPCall("low-latency", "dispatch", 64, 4096.0, r, False),
                        [list(range(8))])
    lay = ExpertLayout(h800x2, 128, ep=8)
    assert lower_ep_groups(h800x2, call, lay.ep_groups(0)).phases[0].ringset.hop_list[-1] \
        == (15, 14)


def test_cli(capsys):
    base = ["--model", "qwen3-30b-a3b", "--cluster", "dgx-h800-ib", "--nodes", "2",
            "--ep", "16", "--seq-len", "256", "--micro-batch", "1"]
    step = ["simulate", *base, "--strategy", "NNG", "--expert-strategy", "NNG", "--accum",
            "1", "--mode", "analytic", "--compute-model", "flat"]
    assert main(step + ["--a2a-algo", "deepep-ll"]) == 0
    out = capsys.readouterr().out
    assert "(deepep-ll)" in out and "DeepEP low-latency kernels" in out
    for bad in ("deepep-foo", "ring"):
        assert main(step + ["--a2a-algo", bad]) == 2
        err = capsys.readouterr().err.strip()
        assert "--a2a-algo" in err and "hybridep" in err and "\n" not in err
    exp = ["experts", *base, "--expert-strategy", "NNG"]
    assert main(exp + ["--a2a-algo", "hybridep"]) == 0
    assert "hybridep dispatch of bf16 tokens" in capsys.readouterr().out
    assert main(exp + ["--a2a-algo", "hierarchical-a2a"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--a2a-algo" in err and "\n" not in err
