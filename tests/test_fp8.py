"""FP8 training precision (``TrainingSpec.precision = "fp8"``, ``--precision fp8``):
the kernel and flat compute models, the TP/PP path, memory, the YAML key, the CLI and sweeps
(docs/compute.md, "FP8")."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import yaml

from parosim.cli.commands import main
from parosim.cost.compute import (
    ADAM_BYTES_PER_PARAM,
    compute_seconds,
    head_backward_flops,
    head_forward_flops,
    layer_attention_flops_per_token,
    layer_fp8_params,
    layer_linear_flops_per_token,
    op_seconds,
    optimizer_step_seconds,
    step_flops,
)
from parosim.cost.kernels import ComputeProfile, gemm_seconds, layer_times
from parosim.cost.memory import memory_breakdown
from parosim.errors import InputError
from parosim.io import load_cluster
from parosim.io.cluster import cluster_from_dict, cluster_to_yaml
from parosim.plan.layout import ParallelSpec
from parosim.plan.threed import memory_3d, optimizer_seconds_3d, unit_seconds
from parosim.simulate.point import run_point
from parosim.simulate.step import simulate_3d, simulate_step
from parosim.spec.gpus import known_gpu
from parosim.spec.model import preset
from parosim.spec.strategy import parse_strategy
from parosim.spec.system import ClusterSpec, Override
from parosim.spec.training import TrainingSpec

H100 = known_gpu("H100-SXM5-80GB")
H100C = ClusterSpec(gpu=H100)                       # one node of 8 H100, flat model
KERNEL = ComputeProfile(model="kernel")
FP8 = TrainingSpec(precision="fp8")


def test_gpu_table_and_default():
    assert TrainingSpec().precision == "bf16"
    assert H100.peak_fp8_flops == 1979e12 and H100.peak_flops == 989e12
    assert known_gpu("H200-SXM-141GB").peak_fp8_flops == 1979e12
    assert known_gpu("H100-PCIe-80GB").peak_fp8_flops == 1513e12
    assert known_gpu("H100-PCIe-80GB").peak_flops == 756e12
    assert KERNEL.sms("H100-PCIe-80GB") == 114 and KERNEL.sms("H100-SXM5-80GB") == 132
    assert known_gpu("A100-SXM4-80GB").peak_fp8_flops == 0.0
    assert known_gpu("V100-SXM2-32GB").peak_fp8_flops == 0.0
    with pytest.raises(InputError, match="precision = 'fp16'"):
        TrainingSpec(precision="fp16")


def test_fp8_refused_without_fp8_tensor_cores(capsys):
    with pytest.raises(InputError, match="A100-SXM4-80GB has none"):
        op_seconds(preset("llama-7b"), ClusterSpec(), FP8)
    with pytest.raises(InputError, match="A100"):
        memory_breakdown(preset("llama-7b"), "NNN", ClusterSpec(), FP8)
    # CLI: one line, exit 2, naming the GPU and the flag
    for cmd in (["simulate", "--mode", "analytic"], ["memory"], ["simulate", "--tp", "2",
                                                                 "--mode", "analytic"]):
        assert main([*cmd, "--cluster", "dgx-a100-ib", "--precision", "fp8"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--precision fp8" in err[0] and "A100-SXM4-80GB" in err[0]
    # a GPU with another FP8 / bf16 ratio among the ranks: refused, not scaled wrongly
    odd = replace(H100, model="X-fp8", peak_fp8_flops=1500e12)
    mixed = ClusterSpec(nodes=2, gpu=H100, overrides=(Override(nodes=(1,), gpu=odd),))
    with pytest.raises(InputError, match="another FP8 / bf16 peak ratio"):
        op_seconds(preset("llama-7b"), mixed, FP8)
    h200 = ClusterSpec(nodes=2, gpu=H100, overrides=(Override(nodes=(1,),
                                                     gpu=known_gpu("H200-SXM-141GB")),))
    op_seconds(preset("llama-7b"), h200, FP8)          # same ratio: accepted
    a100 = ClusterSpec(nodes=2, gpu=H100, overrides=(Override(nodes=(1,),
                                                     gpu=known_gpu("A100-SXM4-80GB")),))
    with pytest.raises(InputError, match="A100-SXM4-80GB has none"):
        op_seconds(preset("llama-7b"), a100, FP8)


def _lt(model, fp8: float, tokens_mb=4, seq=2048, r=1.0, tp=1, attention="flash"):
    return layer_times(model, tokens_mb, seq, r, attention, H100.peak_flops,
                       H100.hbm_bandwidth_Bps, KERNEL, 132, tp, False, fp8)


def test_kernel_model_gemms_faster_attention_unchanged():
    m = preset("llama-2-70b")                       # large GEMMs: h 8192, ffn 28672
    bf, f8 = _lt(m, 0.0), _lt(m, H100.peak_fp8_flops)
    # the FP8 peak is 1979 / 989 = 2.001 x bf16, reached at fp8_gemm_efficiency (0.716,
    # fitted on NeMo FP8 rows) of the bf16 efficiency; the depth and quantization terms are
    # the same, so compute-bound GEMMs go ~1.43 x faster, never more
    top = 1979 / 989 * KERNEL.fp8_gemm_efficiency * (1 + 1e-12)
    assert KERNEL.fp8_gemm_efficiency == 0.716
    assert 0.95 * top < bf.gemm_fwd_s / f8.gemm_fwd_s <= top
    assert 0.95 * top < bf.gemm_bwd_s / f8.gemm_bwd_s <= top
    # the whole layer (casts and bf16 attention included) is faster, less than the GEMMs
    whole = (bf.forward_s + bf.backward_s) / (f8.forward_s + f8.backward_s)
    assert 1.1 < whole < bf.gemm_fwd_s / f8.gemm_fwd_s
    for f in ("attention_fwd_s", "attention_bwd_s", "elementwise_fwd_s", "elementwise_bwd_s"):
        assert getattr(bf, f) == getattr(f8, f)
    assert bf.cast_fwd_s == bf.cast_bwd_s == 0.0
    assert f8.cast_fwd_s > 0 and f8.cast_bwd_s > 0
    # eager attention also stays bf16
    assert _lt(m, 0.0, attention="eager").attention_bwd_s == _lt(
        m, H100.peak_fp8_flops, attention="eager").attention_bwd_s
    # bf16 = the old numbers to the bit (the module's doctest value)
    t = layer_times(preset("llama-7b"), 4, 512, 1.0, "flash", 312e12, 2e12, KERNEL)
    assert t == layer_times(preset("llama-7b"), 4, 512, 1.0, "flash", 312e12, 2e12, KERNEL,
                            peak_fp8_flops=0.0)
    assert f"{t.forward_s * 1e3:.2f} ms fwd" == "4.52 ms fwd"


@pytest.mark.parametrize("tp,r", [(1, 1.0), (2, 1.0), (1, 0.25)])
def test_cast_traffic_by_hand(tp, r):
    m = preset("llama-7b")
    b, s = 4, 2048
    tokens = b * s
    f8 = _lt(m, H100.peak_fp8_flops, b, s, r, tp)
    bw = H100.hbm_bandwidth_Bps * KERNEL.hbm_efficiency
    h, f = 4096, 11008
    # inputs of q/k/v (h), o (h / tp), gate+up (h), down (ffn / tp)
    k_in = h + h / tp + h + f / tp
    # incoming gradients of q/k/v (3h / tp), o (h), gate+up (2 ffn / tp), down (h)
    n_out = 3 * h / tp + h + 2 * f / tp + h
    per_el = 3 + r                      # read 2, write fp8 (1) + fp8 transpose (r)
    assert f8.cast_fwd_s == pytest.approx(per_el * tokens * k_in / bw, rel=1e-12)
    assert f8.cast_bwd_s == pytest.approx(per_el * tokens * n_out / bw, rel=1e-12)
    assert f8.forward_s == pytest.approx(f8.gemm_fwd_s + f8.attention_fwd_s
                                         + f8.elementwise_fwd_s + f8.cast_fwd_s, rel=1e-15)


def test_fp8_gemm_traffic_bound():
    # K = 16 without the depth term: memory-bound; fp8 operands (1 byte), bf16 output (2)
    p = ComputeProfile(model="kernel", gemm_k_half=0.0)
    m, n, k = 65536, 65536, 16
    bw = H100.hbm_bandwidth_Bps * p.hbm_efficiency
    t = gemm_seconds(m, n, k, H100.peak_fp8_flops, H100.hbm_bandwidth_Bps, p, 1, 132, None, 1)
    assert t == pytest.approx((m * k + k * n + 2 * m * n) / bw, rel=1e-12)
    t2 = gemm_seconds(m, n, k, H100.peak_flops, H100.hbm_bandwidth_Bps, p, 1, 132)
    assert t2 == 2.0 * (m * k + k * n + m * n) / bw


def test_flat_split_exact():
    m = preset("llama-7b")
    tr = TrainingSpec(precision="fp8", micro_batch=2, seq_len=1024, trainable_ratio=0.5,
                      compute_efficiency=0.4)
    t = op_seconds(m, H100C, tr)
    tokens = 2 * 1024
    lin = tokens * 2 * (4 * 4096**2 + 3 * 4096 * 11008)    # hand count: q, k, v, o, SwiGLU
    att = tokens * 4 * 1024 * 4096
    assert lin == tokens * layer_linear_flops_per_token(m)
    assert att == tokens * layer_attention_flops_per_token(m, 1024)
    e8, e16 = 1979e12 * 0.4, 989e12 * 0.4
    assert t[("layer", "fwd")] == pytest.approx(lin / e8 + att / e16, rel=1e-15)
    assert t[("layer", "bwd")] == pytest.approx(1.5 * lin / e8 + 2 * att / e16, rel=1e-15)
    # the LM head stays bf16
    bf = op_seconds(m, H100C, replace(tr, precision="bf16"))
    assert t[("head", "fwd")] == bf[("head", "fwd")] == compute_seconds(
        head_forward_flops(m, tr), H100C, tr)
    assert t[("head", "bwd")] == bf[("head", "bwd")] == compute_seconds(
        head_backward_flops(m, tr), H100C, tr)


def test_optimizer_weight_cast_and_memory():
    m, s = preset("llama-7b"), parse_strategy("NNG")
    w = m.layers * layer_fp8_params(m)
    assert w == 32 * (4 * 4096**2 + 3 * 4096 * 11008)
    d = optimizer_step_seconds(m, s, H100C, FP8) - optimizer_step_seconds(m, s, H100C,
                                                                          TrainingSpec())
    assert d == pytest.approx(4 * w / H100.hbm_bandwidth_Bps, rel=1e-12)   # once per step
    assert ADAM_BYTES_PER_PARAM == 28
    bf = memory_breakdown(m, s, H100C, TrainingSpec(recompute=False))
    f8 = memory_breakdown(m, s, H100C, TrainingSpec(recompute=False, precision="fp8"))
    assert bf.fp8_weight_cache_bytes == 0.0 and f8.fp8_weight_cache_bytes == 2 * w
    assert f8.model_states_bytes - bf.model_states_bytes == pytest.approx(2 * w, rel=1e-12)
    # activations: Transformer Engine keeps fp8 GEMM inputs (parosim.cost.fp8mem), fewer bytes
    from parosim.cost.fp8mem import fp8_activation_bytes

    assert f8.activations_bytes == fp8_activation_bytes(m, FP8.with_defaults(), False)
    assert f8.activations_bytes < bf.activations_bytes
    assert f8.params_bytes == bf.params_bytes and f8.optimizer_bytes == bf.optimizer_bytes


def test_tp_pp_path_honours_fp8():
    m = preset("llama-7b")
    c = load_cluster("dgx-h100-ib")
    par = ParallelSpec(tp=2, pp=2)
    tr = TrainingSpec(micro_batch=1, accum_steps=4, seq_len=2048, recompute=False)
    f8 = replace(tr, precision="fp8")
    # flat: unit seconds are the exact split / t
    ks = unit_seconds(m, c, f8, par, False)
    assert unit_seconds(m, c, tr, par, False) is None           # bf16 flat: as before
    lin = 2048 * layer_linear_flops_per_token(m) / 2
    att = 2048 * layer_attention_flops_per_token(m, 2048) / 2
    assert ks[("layer", "fwd")] == pytest.approx(lin / (1979e12 * 0.5) + att / (989e12 * 0.5),
                                                 rel=1e-15)
    # kernel: the layer is the TP-split FP8 layer
    kc = replace(c, compute=KERNEL)
    kk = unit_seconds(m, kc, f8, par, False)
    lt = layer_times(m, 1, 2048, 1.0, "eager", c.gpu.peak_flops, c.gpu.hbm_bandwidth_Bps,
                     KERNEL, 132, 2, False, 1979e12)
    assert kk[("layer", "fwd")] == lt.forward_s and lt.cast_fwd_s > 0
    # per stage: optimizer adds the weight cast of the stage's layers / t
    per_stage = 16 * layer_fp8_params(m) / 2
    assert optimizer_seconds_3d(1e9, 4, c, f8, per_stage) - optimizer_seconds_3d(
        1e9, 4, c, tr, per_stage) == pytest.approx(4 * per_stage / c.gpu.hbm_bandwidth_Bps,
                                                   rel=1e-12)
    assert memory_3d(m, "NNN", c, f8, par).fp8_weight_cache_bytes == 2 * per_stage
    for cl in (c, kc):
        b = simulate_3d(m, cl, "NNN", tr, par, mode="analytic")
        f = simulate_3d(m, cl, "NNN", f8, par, mode="analytic")
        assert f.step_time_s < b.step_time_s
        # MFU stays against the bf16 peak
        toks = f.tokens_per_s * f.step_time_s / cl.gpus
        assert f.mfu == pytest.approx(step_flops(m, f8, toks) / (f.step_time_s * 989e12),
                                      rel=1e-12)
    # engine replay agrees with the closed form for the flat fp8 step (nothing shared)
    e = simulate_3d(m, c, "NNN", f8, par, mode="engine")
    a = simulate_3d(m, c, "NNN", f8, par, mode="analytic")
    assert e.compute_s == pytest.approx(a.compute_s, rel=1e-9)


def test_step_faster_mfu_vs_bf16_peak():
    m = preset("llama-7b")
    tr = TrainingSpec(micro_batch=2, seq_len=2048, recompute=True)
    b = simulate_step(m, H100C, "NNG", tr, mode="analytic")
    f = simulate_step(m, H100C, "NNG", replace(tr, precision="fp8"), mode="analytic")
    assert b.fits and f.fits
    assert f.step_time_s < b.step_time_s
    assert f.mfu / b.mfu == pytest.approx(b.step_time_s / f.step_time_s, rel=1e-12)


def test_yaml_round_trip():
    c = load_cluster("dgx-h100-ib")
    assert c.gpu.peak_fp8_flops == 1979e12
    back = cluster_from_dict(yaml.safe_load(cluster_to_yaml(c)))
    assert back.gpu == c.gpu
    mixed = load_cluster("mixed-a100-h100")
    back = cluster_from_dict(yaml.safe_load(cluster_to_yaml(mixed)))
    assert back.overrides == mixed.overrides and back.gpu.peak_fp8_flops == 0.0
    assert [o.gpu.peak_fp8_flops for o in back.overrides if o.gpu] == [1979e12]
    raw = yaml.safe_load(cluster_to_yaml(ClusterSpec()))
    assert "peak_fp8_tflops" not in raw["gpu"]                 # A100: written as before
    raw["gpu"]["peak_fp8_tflops"] = 700
    assert cluster_from_dict(raw).gpu.peak_fp8_flops == 700e12
    raw["gpu"]["peak_fp8_tflops"] = 0
    assert cluster_from_dict(raw).gpu.peak_fp8_flops == 0.0
    # an override of another GPU model does not inherit the cluster GPU's FP8 figure
    raw = yaml.safe_load(cluster_to_yaml(c))
    raw["overrides"] = [{"nodes": [1], "gpu": {"model": "A100-SXM4-80GB", "peak_tflops": 312}}]
    assert cluster_from_dict(raw).overrides[0].gpu.peak_fp8_flops == 0.0
    raw["overrides"] = [{"nodes": [1], "gpu": {"model": "H100-SXM5-80GB", "memory": "40GB"}}]
    assert cluster_from_dict(raw).overrides[0].gpu.peak_fp8_flops == 1979e12


def test_cli_settings_echo(capsys):
    args = ["simulate", "--cluster", "dgx-h100-ib", "--mode", "analytic", "--strategy", "NNG"]
    assert main([*args, "--precision", "fp8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["settings"]["precision"] == "fp8"
    assert main([*args, "--json"]) == 0
    bf = json.loads(capsys.readouterr().out)
    assert bf["settings"]["precision"] == "bf16"
    assert out["step_time_s"] < bf["step_time_s"]
    assert main([*args, "--precision", "fp8"]) == 0
    assert "precision fp8" in capsys.readouterr().out


def test_sweep_key(tmp_path):
    from parosim.io.sweep import COLUMNS, sweep_from_dict

    base = {"cluster": "dgx-h100-ib", "mode": "analytic", "strategy": "NNG", "model": "llama-7b"}
    b, f = run_point(base), run_point({**base, "precision": "fp8"})
    assert b["status"] == f["status"] == "ok" and f["step_time_s"] < b["step_time_s"]
    assert run_point({**base, "precision": "bf16"})["step_time_s"] == b["step_time_s"]
    bad = run_point({"mode": "analytic", "precision": "fp8"})      # paper cluster: A100
    assert bad["status"] == "error" and "FP8" in bad["reason"]
    assert "precision" in COLUMNS["step"]
    spec = sweep_from_dict({"name": "p", "kind": "step", "mode": "analytic",
                            "grid": {"precision": ["bf16", "fp8"]}, "fixed": base})
    assert [p["precision"] for p in spec.points()] == ["bf16", "fp8"]
    with pytest.raises(InputError, match="precision = 'fp16'"):
        sweep_from_dict({"name": "p", "kind": "step", "mode": "analytic",
                         "grid": {"precision": ["fp16"]}, "fixed": base})


def test_results_written_before_the_precision_column_resume(tmp_path):
    from parosim.io.sweep import COLUMNS, ResultsLog

    cols = list(COLUMNS["step"])
    old = [c for c in cols if c != "precision"]
    row = ["abc123"] + ["1"] * (len(old) - 1)
    (tmp_path / "results.csv").write_text(",".join(old) + "\n" + ",".join(row) + "\n")
    log = ResultsLog(tmp_path / "results.csv", cols)
    try:
        got = log.rows["abc123"]
        assert len(got) == len(cols) and got[cols.index("precision")] == ""
        assert [got[cols.index(c)] for c in old] == row
    finally:
        log.release()
    assert (tmp_path / "results.csv").read_text().split("\n")[0].split(",") == cols
    # any other difference is still another sweep
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "results.csv").write_text(",".join(old[:-1]) + "\n")
    with pytest.raises(InputError, match="different sweep"):
        ResultsLog(tmp_path / "d" / "results.csv", cols)


def test_jobs_key(tmp_path, capsys):
    f = tmp_path / "jobs.yaml"
    f.write_text("cluster: dgx-h100-ib\nnodes: 2\njobs:\n"
                 "  - {name: a, nodes: [0], precision: fp8, strategy: NNG, micro_batch: 1, "
                 "accum: 1, seq_len: 512}\n"
                 "  - {name: b, nodes: [1], strategy: NNG, micro_batch: 1, accum: 1, "
                 "seq_len: 512}\n")
    assert main(["simulate", "--jobs", str(f), "--json"]) == 0
    jobs = {j["name"]: j for j in json.loads(capsys.readouterr().out)["jobs"]}
    assert jobs["a"]["settings"]["precision"] == "fp8"
    assert "precision" not in jobs["b"]["settings"]
    assert jobs["a"]["step_time_alone_s"] < jobs["b"]["step_time_alone_s"]
    f.write_text(f.read_text().replace("precision: fp8", "precision: fp4"))
    assert main(["simulate", "--jobs", str(f)]) == 2
    assert "precision = 'fp4'" in capsys.readouterr().err


def test_calibrate_steps_precision_column(tmp_path):
    from parosim.calibrate.steps import read_steps, simulate_run

    f = tmp_path / "runs.csv"
    f.write_text("model,strategy,nodes,micro_batch,accum,seq_len,step_time_s,precision,tp\n"
                 "llama-7b,NNG,1,1,4,2048,1.0,fp8,1\n"
                 "llama-7b,NNG,1,1,4,2048,1.0,bf16,1\n"
                 "llama-7b,NNG,1,1,4,2048,1.0,fp8,2\n"
                 "llama-7b,NNG,1,1,4,2048,1.0,bf16,2\n")
    runs = read_steps(f)
    assert [r.precision for r in runs] == ["fp8", "bf16", "fp8", "bf16"]
    c = load_cluster("dgx-h100-ib", 1)
    t = [simulate_run(r, c, KERNEL) for r in runs]
    assert t[0] < t[1] and t[2] < t[3]
    with pytest.raises(InputError, match="line 2: .*A100"):
        simulate_run(runs[0], ClusterSpec(), KERNEL)
    f.write_text("model,strategy,nodes,micro_batch,accum,seq_len,step_time_s,precision\n"
                 "llama-7b,NNG,1,1,4,2048,1.0,int8\n")
    with pytest.raises(InputError, match="line 2: precision = 'int8'"):
        simulate_run(read_steps(f)[0], c, KERNEL)
