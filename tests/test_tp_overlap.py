"""TP communication overlap (Megatron-Core / Transformer Engine ``tp_comm_overlap``):
refusals, the per-collective formula on a hand-computed layer, closed form == engine, CLI
settings echo, sweep key (docs/comm-overlap.md, "TP communication overlap")."""

import csv
import json
from dataclasses import replace

import pytest

from parosim.cli.commands import main
from parosim.collectives.cost import program_time
from parosim.collectives.types import Algo, Op
from parosim.errors import InputError
from parosim.evaluate.threed import evaluate_3d, summary_3d
from parosim.io import load_cluster
from parosim.plan.layout import ParallelSpec
from parosim.plan.threed import (
    UB_PIPELINE_SPLITS,
    GroupOp,
    build_plan_3d,
    memory_3d,
    tp_overlap_pairs,
)
from parosim.plan.threed_parts import layer_gemms
from parosim.simulate.step import simulate_step, with_overrides
from parosim.spec.model import preset
from parosim.spec.strategy import parse_strategy
from parosim.spec.training import TrainingSpec

M13 = preset("llama-13b")     # h 5120, ffn 13824 (SwiGLU), 40 layers, 40 heads


def _par(tp=8, pp=1, ovl=True, **kw):
    return ParallelSpec(tp=tp, pp=pp, sequence_parallel=True, tp_comm_overlap=ovl, **kw)


# -- refusals ------------------------------------------------------------------------------

@pytest.mark.parametrize("argv,needle", [
    (["--tp", "2", "--tp-comm-overlap"], "without --sequence-parallel"),
    (["--tp-comm-overlap"], "--tp 1 without --sequence-parallel"),
    (["--tp", "1", "--sequence-parallel", "--tp-comm-overlap"], "(got --tp 1)"),
])
def test_flag_refused_without_sp_or_tp(argv, needle, capsys):
    for cmd in ("simulate", "compare"):
        rc = main([cmd, "--mode", "analytic", *argv])
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1, err
        assert "--tp-comm-overlap needs --sequence-parallel and --tp >= 2" in err
        assert needle in err and "Traceback" not in err


def test_api_refuses_too():
    with pytest.raises(InputError, match="tp-comm-overlap"):
        ParallelSpec(tp=4, tp_comm_overlap=True)
    with pytest.raises(InputError, match="tp-comm-overlap"):
        ParallelSpec(tp=1, sequence_parallel=True, tp_comm_overlap=True)


def test_run_draws_the_step_that_simulate_gives(capsys):
    """A whole run with TP comm overlap is costed on the same step as ``simulate``."""
    flags = ["--tp", "2", "--sequence-parallel", "--tp-comm-overlap", "--mode", "analytic",
             "--json"]
    assert main(["simulate", *flags]) == 0
    step = json.loads(capsys.readouterr().out)["step_time_s"]
    assert main(["run", *flags]) == 0
    run = json.loads(capsys.readouterr().out)
    assert run["step_time_s"] == step and run["wall_clock_s"] > run["steps"] * step


# -- the formula, by hand ------------------------------------------------------------------

def test_gemm_times_hand_derived():
    # flat model: FLOPs / t at 0.5 x 312 TFLOP/s; qkv GEMM 2·b·s·3h·h / t
    c, tr = load_cluster("dgx-a100-ib", 1), TrainingSpec(micro_batch=1, seq_len=2048)
    g = layer_gemms(M13, c, tr, ParallelSpec(tp=8, sequence_parallel=True))
    assert g[0][0] == pytest.approx(2 * 2048 * 3 * 5120 * 5120 / 8 / 156e12, rel=1e-12)
    assert g[3][0] == pytest.approx(2 * 2048 * 5120 * 13824 / 8 / 156e12, rel=1e-12)
    assert [p.name for p in tp_overlap_pairs(M13, c, tr, _par(), "fwd")] == [
        "qkv_fprop", "proj_fprop", "fc1_fprop", "fc2_fprop"]
    bwd = tp_overlap_pairs(M13, c, tr, _par(), "bwd")
    assert [(p.op, p.chunks) for p in bwd] == [
        (Op.ALL_GATHER, 8), (Op.REDUCE_SCATTER, 0), (Op.ALL_GATHER, 8),
        (Op.REDUCE_SCATTER, 0)]
    assert [p.chunks for p in tp_overlap_pairs(M13, c, tr, _par(), "fwd")] == [
        8, UB_PIPELINE_SPLITS, 8, UB_PIPELINE_SPLITS]


def _step(c, tr, par):
    plan = build_plan_3d(M13, "NNN", c, tr, par)
    return plan, evaluate_3d(plan, c, Algo.RING)


@pytest.mark.parametrize("intra", [None, 10e9])   # NVLink 300 GB/s; a slow 10 GB/s link
def test_layer_exposure_hand_computed(intra):
    # One node, TP 8, DP 1, PP 1, one micro-batch, no recomputation: the step is the sum of
    # the compute and TP ops, so overlap on minus overlap off is, per layer and collective
    # of time x beside a GEMM of g: max(0, x - g) + chunk - x.
    c = with_overrides(load_cluster("dgx-a100-ib", 1), intra_bandwidth_Bps=intra)
    tr = TrainingSpec(micro_batch=1, accum_steps=1, seq_len=2048, recompute=False)
    plan, on = _step(c, tr, _par())
    _, off = _step(c, tr, _par(ovl=False))
    lowered = {}
    for op in plan.ops:
        if isinstance(op, GroupOp) and op.purpose in ("tp-overlap", "tp-chunk"):
            lowered[(op.op, op.size_bytes)] = program_time(c, op.lower(c, Algo.RING))
    buf = 2 * 2048 * 5120                    # 2·s·b·h bytes
    x = {op: lowered[(op, buf)] for op in (Op.ALL_GATHER, Op.REDUCE_SCATTER)}
    # by hand: the ring all-gather of the buffer over 8 GPUs sends 7/8 of it over the link,
    # plus NCCL's Simple-protocol ring latency on NVLink (8.4 us + 7 steps x 3.4 us)
    bw = intra or c.intra.bandwidth_Bps
    assert x[Op.ALL_GATHER] == pytest.approx(7 / 8 * buf / bw + 8.4e-6 + 7 * 3.4e-6,
                                             rel=0.01)
    expect = 0.0
    qkv = None
    for ph in ("fwd", "bwd"):
        for pr in tp_overlap_pairs(M13, c, tr, _par(), ph):
            chunk = lowered[(pr.op, buf / pr.chunks)] if pr.chunks else 0.0
            exposed = max(0.0, x[pr.op] - pr.gemm_s) + chunk
            if pr.name == "qkv_fprop":
                qkv = (x[pr.op], pr.gemm_s, chunk, exposed)
            expect += exposed - x[pr.op]
    assert on.step_time_s - off.step_time_s == pytest.approx(40 * expect, rel=1e-9)
    xq, gq, cq, eq = qkv
    if intra is None:     # NVLink: the all-gather hides under the qkv GEMM, one chunk stays
        assert xq < gq and eq == cq
        assert (xq, gq, cq) == pytest.approx((9.34e-5, 2.581e-4, 3.63e-5), rel=0.01)
    else:                 # 10 GB/s: the excess over the GEMM stays exposed, plus the chunk
        assert xq > gq and eq == pytest.approx(xq - gq + cq, rel=1e-12)
        assert (xq, gq, cq) == pytest.approx((1.867e-3, 2.581e-4, 2.616e-4), rel=0.01)
    assert on.step_time_s < off.step_time_s
    assert on.step_time_s >= on.compute_s


@pytest.mark.parametrize("tp,pp,acc,strategy,rc", [
    (2, 2, 4, "NNN", None), (4, 2, 4, "NNN", False), (2, 4, 8, "IIG", False),
    (8, 1, 2, "GGG", True), (4, 2, 4, "NNN", True)])
def test_overlap_shorter_never_below_compute(tp, pp, acc, strategy, rc):
    c = load_cluster("dgx-a100-ib", 2)
    tr = TrainingSpec(micro_batch=1, accum_steps=acc, seq_len=2048, recompute=rc)
    on = simulate_step(M13, c, strategy, tr, "ring", "analytic", parallel=_par(tp, pp))
    off = simulate_step(M13, c, strategy, tr, "ring", "analytic",
                        parallel=_par(tp, pp, ovl=False))
    assert on.compute_s <= on.step_time_s < off.step_time_s
    assert on.compute_s == pytest.approx(off.compute_s, rel=1e-9)   # the same compute
    assert on.bytes_intra == pytest.approx(off.bytes_intra, rel=1e-9)   # the same bytes


# -- engine == closed form -----------------------------------------------------------------

@pytest.mark.parametrize("tp,pp,acc,strategy,f,kernel", [
    (2, 2, 4, "NNN", None, False),     # TP 2 PP 2 DP 2, recomputation on (auto)
    (4, 2, 4, "NNN", None, False),     # TP 4 PP 2 DP 1
    (2, 4, 8, "NNN", None, False),     # PP 4
    (8, 1, 2, "NNN", 1.3, False),      # overlap interference: the GEMMs slowed beside comm
    (4, 2, 4, "NNN", 1.3, False),      # ... with PP 2: per-stage gates (was +1.0 %)
    (2, 2, 4, "NNN", 1.3, False),      # TP 2 PP 2 DP 2 (was +0.7 %)
    (4, 2, 4, "NNN", None, True),      # kernel compute model
    (4, 1, 2, "IIG", None, False),     # per-layer ops, PaRO DP traffic beside
    (4, 1, 2, "IIG", 1.3, False),      # ... slowing the compute (was +2.8 %)
])
def test_engine_matches_closed_form(tp, pp, acc, strategy, f, kernel):
    c = load_cluster("dgx-a100-ib", 1)
    tr = TrainingSpec(micro_batch=1, accum_steps=acc, seq_len=2048, overlap_slowdown=f,
                      compute_model="kernel" if kernel else None)
    par = _par(tp, pp)
    a = simulate_step(M13, c, strategy, tr, "ring", "analytic", parallel=par)
    e = simulate_step(M13, c, strategy, tr, "ring", "engine", parallel=par)
    assert abs(e.step_time_s / a.step_time_s - 1) < 0.01
    assert e.bytes_intra == pytest.approx(a.bytes_intra, rel=1e-6)
    # the screening closed form (advise) is the same sums, term by term
    s = summary_3d(M13, parse_strategy(strategy), c,
                   replace(tr, recompute=a.memory.recompute), par, Algo.RING,
                   a.memory.recompute, f or 1.0)
    assert s.step_time_s == pytest.approx(a.step_time_s, rel=1e-9)


def test_interference_slows_only_the_paired_gemm():
    # f > 1 with the communication shorter than its GEMM: the GEMM takes g + x (1 - 1/f)
    c = load_cluster("dgx-a100-ib", 1)
    tr = TrainingSpec(micro_batch=1, accum_steps=1, seq_len=2048, recompute=False)
    _, one = _step(c, tr, _par())
    plan = build_plan_3d(M13, "NNN", c, tr, _par())
    two = evaluate_3d(plan, c, Algo.RING, overlap_slowdown=2.0)
    extra = 0.0
    for op in plan.ops:
        if isinstance(op, GroupOp) and op.purpose == "tp-overlap":
            x, g = program_time(c, op.lower(c, Algo.RING)) * op.count, \
                plan.ops[op.pair].duration_s
            extra += max(x, g + x / 2) - max(x, g)
    assert two.step_time_s - one.step_time_s == pytest.approx(extra, rel=1e-9)
    assert extra > 0


# -- CLI echo and sweep --------------------------------------------------------------------

def test_settings_echo_json_and_text(capsys):
    argv = ["simulate", "--model", "llama-13b", "--cluster", "dgx-a100-ib", "--nodes", "1",
            "--tp", "8", "--sequence-parallel", "--tp-comm-overlap", "--micro-batch", "1",
            "--accum", "2", "--seq-len", "2048", "--strategy", "NNN", "--mode", "analytic"]
    assert main([*argv, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["settings"]["tp_comm_overlap"] is True and d["tp_comm_overlap"] is True
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "TP comm overlap on" in out and "sequence parallel, TP comm overlap" in out
    argv.remove("--tp-comm-overlap")
    assert main([*argv, "--json"]) == 0   # off by default
    assert json.loads(capsys.readouterr().out)["settings"]["tp_comm_overlap"] is False


def test_sweep_key(tmp_path, capsys):
    spec = tmp_path / "s.yaml"
    spec.write_text("name: tpo\nkind: step\nmode: analytic\n"
                    "grid:\n  tp_comm_overlap: [false, true]\n"
                    "fixed:\n  model: llama-13b\n  cluster: dgx-a100-ib\n  nodes: 1\n"
                    "  strategy: NNN\n  algo: ring\n  micro_batch: 1\n  accum: 2\n"
                    "  seq_len: 2048\n  tp: 8\n  sequence_parallel: true\n"
                    "  fidelity: paper\n")   # the reference below: the closed forms
    assert main(["sweep", str(spec), "--out", str(tmp_path / "out"), "--no-progress"]) == 0
    rows = list(csv.DictReader(open(tmp_path / "out" / "results.csv")))
    assert [r["tp_comm_overlap"] for r in rows] == ["False", "True"]
    assert all(r["status"] == "ok" for r in rows)
    off, on = (float(r["step_time_s"]) for r in rows)
    c = load_cluster("dgx-a100-ib", 1)
    tr = TrainingSpec(micro_batch=1, accum_steps=2, seq_len=2048)
    ref = simulate_step(M13, c, "NNN", tr, "ring", "analytic", parallel=_par())
    assert on == pytest.approx(ref.step_time_s, rel=1e-12) and on < off
    assert "tp_comm_overlap" in (tmp_path / "out" / "columns.md").read_text()
    # a bad value is one line, and the flag without sequence parallelism is a row error
    spec.write_text(spec.read_text().replace("[false, true]", "[maybe]"))
    assert main(["sweep", str(spec), "--out", str(tmp_path / "o2"), "--no-progress"]) == 2
    assert "tp_comm_overlap = 'maybe' must be true or false" in capsys.readouterr().err
    spec.write_text(spec.read_text().replace("[maybe]", "[true]")
                    .replace("sequence_parallel: true", "sequence_parallel: false"))
    assert main(["sweep", str(spec), "--out", str(tmp_path / "o3"), "--no-progress"]) == 0
    row = next(csv.DictReader(open(tmp_path / "o3" / "results.csv")))
    assert row["status"] == "error" and "needs --sequence-parallel" in row["reason"]


def test_advise_accepts_the_fixed_setting():
    from parosim.studies.advise import advise

    c = load_cluster("dgx-a100-ib", 1)
    kw = dict(top=2, engine_top=1, max_micro_batch=1, strategies=["NNN"])
    on = advise(M13, c, 8, 2048, tp_comm_overlap=True, **kw)
    off = advise(M13, c, 8, 2048, **kw)
    sp_on = [x for x in on["candidates"] if x["sequence_parallel"]]
    assert all(x["tp_comm_overlap"] for x in sp_on)
    assert not any(x["tp_comm_overlap"] for x in off["candidates"])
    assert on["candidates"][0]["tokens_per_s"] >= off["candidates"][0]["tokens_per_s"]


def test_userbuffers_memory():
    # TE allocates 10 userbuffers of (s·b, h) bf16 per GPU: 10 x 2 x 2048 x 2 x 5120 bytes
    c = load_cluster("dgx-a100-ib", 1)
    tr = TrainingSpec(micro_batch=2, accum_steps=4, seq_len=2048, recompute=True)
    on = memory_3d(M13, "NNN", c, tr, _par(4, 2))
    off = memory_3d(M13, "NNN", c, tr, _par(4, 2, ovl=False))
    assert on.buffers_bytes - off.buffers_bytes == 10 * 2 * 2048 * 2 * 5120
    assert on.activations_bytes == off.activations_bytes


def test_fp8_overlap_gemms_at_fp8_peak_and_fp8_all_gathers():
    # FP8 training (where the FP8 model is present): the paired GEMMs run at the FP8 peak,
    # TE's ring-exchange all-gathers and 6 of its 10 userbuffers hold fp8 (1 byte)
    if not hasattr(TrainingSpec(), "precision"):
        pytest.skip("no FP8 model in this tree")
    c = load_cluster("dgx-h100-ib", 1)
    tr = TrainingSpec(micro_batch=1, accum_steps=4, seq_len=2048, precision="fp8")
    par = _par(4, 2)
    g = layer_gemms(M13, c, tr, par)
    assert g[0][0] == pytest.approx(2 * 2048 * 3 * 5120 * 5120 / 4 / (1979e12 * 0.5),
                                    rel=1e-12)
    assert [p.size_scale for p in tp_overlap_pairs(M13, c, tr, par, "fwd")] == [
        0.5, 1.0, 0.5, 1.0]
    a = simulate_step(M13, c, "NNN", tr, "ring", "analytic", parallel=par)
    e = simulate_step(M13, c, "NNN", tr, "ring", "engine", parallel=par)
    off = simulate_step(M13, c, "NNN", tr, "ring", "analytic", parallel=_par(4, 2, ovl=False))
    assert abs(e.step_time_s / a.step_time_s - 1) < 0.01
    assert a.compute_s == pytest.approx(off.compute_s, rel=1e-9)
    assert a.compute_s <= a.step_time_s < off.step_time_s
    assert a.memory.buffers_bytes - off.memory.buffers_bytes == (6 + 2 * 4) * 2048 * 5120


def test_calibrate_steps_column(tmp_path):
    from parosim.calibrate.steps import read_steps

    f = tmp_path / "steps.csv"
    head = ("model,strategy,nodes,micro_batch,accum,seq_len,step_time_s,tp,"
            "sequence_parallel,tp_comm_overlap\n")
    f.write_text(head + "llama-13b,NNN,1,1,2,2048,0.5,8,on,on\n")
    assert read_steps(f)[0].tp_comm_overlap is True
    f.write_text(head + "llama-13b,NNN,1,1,2,2048,0.5,8,on,maybe\n")
    with pytest.raises(InputError, match="tp_comm_overlap = 'maybe'; expected on or off"):
        read_steps(f)
