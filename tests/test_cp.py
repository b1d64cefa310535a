"""Context parallelism (--cp): Megatron-Core context_parallel_size with Transformer Engine's
p2p ring attention (docs/parallelism.md, "Context parallelism")."""

import json
import math

import pytest

from parosim.cli.commands import main
from parosim.collectives.cost import program_time
from parosim.collectives.types import Algo
from parosim.cost.compute import (
    compute_seconds,
    head_backward_flops,
    head_forward_flops,
    layer_attention_flops_per_token,
    layer_backward_flops,
    layer_forward_flops,
)
from parosim.errors import InputError
from parosim.evaluate.threed import evaluate_3d, summary_3d
from parosim.plan.layout import ParallelSpec, layout_for, lower_p2p
from parosim.plan.threed import build_plan_3d, cp_kv_bytes, cp_local, memory_3d
from parosim.simulate.step import simulate_3d, with_overrides
from parosim.spec.model import preset
from parosim.spec.system import ClusterSpec
from parosim.spec.training import TrainingSpec

M = preset("llama-7b")


def _tr(s=8192, m=1, rc=False):
    return TrainingSpec(micro_batch=1, seq_len=s, accum_steps=m, recompute=rc)


@pytest.mark.parametrize("argv, msg", [
    (["--cp", "0"], "--cp = 0 must be a positive integer"),
    (["--cp", "3", "--seq-len", "8190"], "does not divide the 16 GPUs"),
    (["--cp", "4", "--seq-len", "8196"], "divisible by 2 x cp = 8"),
    (["--cp", "2", "--runtime", "deepspeed"], "--cp / --sequence-parallel"),
    (["--cp", "2", "--attention", "eager"], "needs --attention flash"),
])
def test_refusals_are_one_line(capsys, argv, msg):
    rc = main(["simulate", "--model", "llama-7b", "--nodes", "2", "--strategy", "NNN",
               "--micro-batch", "1", "--seq-len", "8192", "--mode", "analytic", *argv])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and "\n" not in err and "Traceback" not in err


def test_advise_searches_a_fixed_cp(capsys):
    rc = main(["advise", "--model", "llama-7b", "--nodes", "2", "--global-batch", "64",
               "--cp", "2", "--strategy", "GGG", "--tp", "1,2", "--pp", "1",
               "--max-micro-batch", "2", "--top", "2", "--json"])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    assert res["search_space"]["cp"] == [2] and res["search_space"]["attention"] == [
        "flash", "eager"]
    for c in res["candidates"]:   # CP runs with flash attention only (Transformer Engine)
        assert c["cp"] == 2 and c["attention"] == "flash"
        assert c["tp"] * c["cp"] * c["pp"] * c["dp"] == 16


def test_cp1_is_the_plan_without_cp():
    cl = ClusterSpec(nodes=2, gpus_per_node=8)
    a = simulate_3d(M, cl, "NNG", _tr(m=2), ParallelSpec(tp=2, pp=2), mode="analytic")
    b = simulate_3d(M, cl, "NNG", _tr(m=2), ParallelSpec(tp=2, pp=2, cp=1), mode="analytic")
    assert a.step_time_s == b.step_time_s and "cp" not in b.parallel


def test_layout_rings_follow_megatron_order():
    # tp-cp-dp-pp: rank = tp + t·(cp_rank + cp·dp + cp·d·pp); the ring sends cp_rank -> +1
    lay = layout_for(ClusterSpec(nodes=2, gpus_per_node=8), 2, 1)
    ring = lay.cp_ring(0, 4)
    assert ring.rings[:4] == ((0, 2), (1, 3), (2, 4), (3, 5))
    assert (6, 0) in ring.rings and (7, 1) in ring.rings and (14, 8) in ring.rings
    assert len(ring.rings) == 16


@pytest.mark.parametrize("intra_Bps, bound", [(250e9, "compute"), (5e9, "comm")])
def test_hand_computed_layer(intra_Bps, bound):
    """One node, t = 1, cp = 2, p = 1, one micro-batch, NNN: the pipeline is L layers of
    (forward at s/cp tokens + ring) + (backward at s/cp tokens, its attention core in 2 ring
    steps) + head/embedding; each ring step costs max(attention step, transfer)."""
    cl = with_overrides(ClusterSpec(nodes=1, gpus_per_node=8), intra_bandwidth_Bps=intra_Bps)
    tr, par = _tr(), ParallelSpec(cp=2)
    loc = cp_local(tr, par)
    s2 = 4096
    assert loc.seq_len == s2
    # attention: the local layer's core (s/cp queries x s/cp keys) + (cp-1) more steps =
    # the whole causal-balanced attention / cp
    att1 = 1 * s2 * layer_attention_flops_per_token(M, s2)
    att_full = 1 * 8192 * layer_attention_flops_per_token(M, 8192)
    assert math.isclose(att1 * 2, att_full / 2, rel_tol=1e-12)
    kv = 2 * 1 * s2 * M.kv_dim * 2
    assert cp_kv_bytes(M, loc, par) == kv
    x = kv / intra_Bps + cl.intra.latency_s           # one ring transfer, NVLink
    ring = layout_for(cl, 1, 1).cp_ring(0, 2)
    assert math.isclose(program_time(cl, lower_p2p(ring, kv)), x, rel_tol=1e-12)
    a_f = compute_seconds(att1, cl, loc)
    a_b = compute_seconds(2 * att1, cl, loc)
    assert (a_f > x) == (bound == "compute") and (a_b > x) == (bound == "compute")
    fwd = compute_seconds(layer_forward_flops(M, loc), cl, loc)    # GEMMs etc. at s/cp
    bwd = compute_seconds(layer_backward_flops(M, loc), cl, loc)
    layer = fwd + max(a_f, x) + (bwd - a_b) + 2 * max(a_b, x)
    head = (compute_seconds(head_forward_flops(M, loc), cl, loc)
            + compute_seconds(head_backward_flops(M, loc), cl, loc))
    hand = M.layers * layer + head
    plan = build_plan_3d(M, "NNN", cl, tr, par)
    an = evaluate_3d(plan, cl, Algo.RING)
    assert math.isclose(an.pipeline_s, hand, rel_tol=1e-9)
    exposed = M.layers * (max(0.0, x - a_f) + 2 * max(0.0, x - a_b))
    assert (exposed == 0.0) == (bound == "compute")
    ring_ops = [o for o in plan.ops if getattr(o, "purpose", "") == "cp-ring"]
    assert {o.size_bytes for o in ring_ops} == {kv}
    sm = summary_3d(M, plan.strategy, cl, tr, par, Algo.RING, False)
    assert math.isclose(sm.step_time_s, an.step_time_s, rel_tol=1e-9)


def test_backward_middle_steps_send_kv_and_dkv():
    """cp = 4: steps 0 and 3 send B, steps 1-2 send K/V + dK/dV (2B), as TE's backward."""
    cl = ClusterSpec(nodes=2, gpus_per_node=8)
    plan = build_plan_3d(M, "NNN", cl, _tr(), ParallelSpec(tp=2, cp=4))
    kv = cp_kv_bytes(M, cp_local(_tr(), ParallelSpec(cp=4)), ParallelSpec(tp=2, cp=4))
    bwd = {(o.size_bytes, o.count) for o in plan.ops
           if getattr(o, "purpose", "") == "cp-ring" and " bwd " in o.name}
    fwd = {(o.size_bytes, o.count) for o in plan.ops
           if getattr(o, "purpose", "") == "cp-ring" and " fwd " in o.name}
    assert bwd == {(kv, 2 * M.layers), (2 * kv, 2 * M.layers)}
    assert fwd == {(kv, 3 * M.layers)}


@pytest.mark.parametrize("cp, tp, pp, sp, strat, nodes", [
    (2, 2, 1, False, "NNN", 2), (4, 2, 1, True, "NNG", 2), (2, 2, 2, False, "NNN", 2),
    (4, 1, 2, False, "NNI", 2), (2, 8, 1, True, "NNN", 2)])
def test_engine_matches_closed_form(cp, tp, pp, sp, strat, nodes):
    cl = ClusterSpec(nodes=nodes, gpus_per_node=8)
    par = ParallelSpec(tp=tp, pp=pp, cp=cp, sequence_parallel=sp)
    tr = _tr(m=4, rc=True)
    a = simulate_3d(M, cl, strat, tr, par, mode="analytic")
    e = simulate_3d(M, cl, strat, tr, par, mode="engine")
    assert abs(e.step_time_s / a.step_time_s - 1) < 0.01
    assert a.parallel["cp"] == cp and a.parallel["dp"] == 16 // (tp * pp * cp)


def test_tokens_and_mfu_count_the_whole_sequence():
    cl = ClusterSpec(nodes=2, gpus_per_node=8)
    r = simulate_3d(M, cl, "NNN", _tr(m=2, rc=True), ParallelSpec(tp=2, cp=2),
                     mode="analytic")
    assert math.isclose(r.tokens_per_s * r.step_time_s, 8192 * 2 * 4)   # b·s·m·dp


def test_memory_shrinks_with_cp():
    cl = ClusterSpec(nodes=2, gpus_per_node=8)
    tr = TrainingSpec(micro_batch=1, seq_len=32768, accum_steps=4, recompute=False)
    acts = [memory_3d(M, "NNN", cl, tr, ParallelSpec(tp=2, cp=c)).activations_bytes
            for c in (1, 2, 4)]
    assert acts[0] > acts[1] > acts[2]
    b1 = memory_3d(M, "NNN", cl, tr, ParallelSpec(tp=2)).buffers_bytes
    b2 = memory_3d(M, "NNN", cl, tr, ParallelSpec(tp=2, cp=2)).buffers_bytes
    par = ParallelSpec(tp=2, cp=2)
    assert math.isclose(b2 - b1, 4 * cp_kv_bytes(M, cp_local(tr, par), par))


def test_settings_echo_and_json(capsys):
    argv = ["simulate", "--model", "llama-7b", "--nodes", "2", "--strategy", "NNN",
            "--micro-batch", "1", "--seq-len", "8192", "--accum", "2", "--tp", "2",
            "--cp", "2", "--mode", "analytic"]
    assert main(argv) in (0, None)
    out = capsys.readouterr().out
    assert "context parallel 2 (ring attention)" in out and "x DP 4 x CP 2" in out
    assert main([*argv, "--json"]) in (0, None)
    d = json.loads(capsys.readouterr().out)
    assert d["settings"]["context_parallel"] == 2 and d["settings"]["data_parallel"] == 4
    assert d["cp"] == 2 and d["dp"] == 4


def test_sweep_key_cp():
    from parosim.io.sweep import sweep_columns, sweep_from_dict
    from parosim.simulate.point import point_parallel, run_point

    assert point_parallel({"cp": 4}).cp == 4 and point_parallel({}).cp == 1
    base = {"cluster": "paper-a100-roce", "nodes": 2, "mode": "analytic", "strategy": "NNN",
            "model": "llama-7b", "tp": 2, "micro_batch": 1, "accum": 2, "seq_len": 4096,
            "recompute": True}
    one, two = run_point(base), run_point({**base, "cp": 2})
    assert one["status"] == two["status"] == "ok"
    assert two["step_time_s"] < one["step_time_s"]     # half the data-parallel replicas
    bad = run_point({**base, "cp": 3})
    assert bad["status"] == "error" and "--cp 3" in bad["reason"]
    spec = sweep_from_dict({"name": "c", "kind": "step", "mode": "analytic",
                            "grid": {"cp": [1, 2, 4]}, "fixed": base})
    assert [p["cp"] for p in spec.points()] == [1, 2, 4]
    assert "cp" in sweep_columns("step", ["cp"])
    with pytest.raises(InputError, match="cp"):
        sweep_from_dict({"name": "c", "kind": "step", "mode": "analytic",
                         "grid": {"cp": [0]}, "fixed": base})
    with pytest.raises(InputError):
        ParallelSpec(cp=0)


def test_calibrate_steps_cp_column(tmp_path):
    from dataclasses import replace

    from parosim.calibrate.steps import read_steps, simulate_run
    from parosim.io import load_cluster

    p = tmp_path / "cp.csv"
    p.write_text("model,strategy,nodes,micro_batch,accum,seq_len,step_time_s,tp,cp,recompute\n"
                 "llama-7b,NNN,2,1,2,16384,5.0,2,2,on\n"
                 "llama-7b,NNN,2,1,2,16384,5.0,2,1,on\n")
    r2, r1 = read_steps(p)
    assert r2.cp == 2 and r2.is_3d and r1.cp == 1
    base = load_cluster("dgx-a100-ib")
    prof = replace(base.compute, model="kernel")
    assert simulate_run(r2, base, prof) < simulate_run(r1, base, prof)


def test_engine_symmetry_reduction_keeps_the_cp_rings():
    """t = 8, cp = 2 on 4 nodes: the DP/TP groups translate by one node, the CP rings
    (0<->8, 16<->24, ...) do not, so the engine simulates every node, and agrees."""
    cl = ClusterSpec(nodes=4, gpus_per_node=8)
    lay = layout_for(cl, 8, 1)
    assert lay.symmetric_period() == 1 and lay.symmetric_period(2) == 4
    par = ParallelSpec(tp=8, cp=2, sequence_parallel=True)
    tr = _tr(s=16384, m=2, rc=True)
    a = simulate_3d(M, cl, "NNG", tr, par, mode="analytic")
    e = simulate_3d(M, cl, "NNG", tr, par, mode="engine")
    assert abs(e.step_time_s / a.step_time_s - 1) < 1e-6
