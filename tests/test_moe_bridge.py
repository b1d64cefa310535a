"""The MoE step model under TP x PP x VP x CP x EP (parosim.evaluate.moe_parallel) and its
calibration on Megatron-Bridge's published MoE throughput (parosim.calibrate.moe_throughput;
docs/moe.md, "MoE steps with TP / PP / VP")."""

import json
from dataclasses import replace

import numpy as np
import pytest

import parosim.calibrate.moe_throughput as mt
from parosim.calibrate.moe_throughput import (
    EXCLUDED,
    FAMILIES,
    FITTED,
    GPU_HARDWARE,
    REGRESSION_REASON,
    VARIANTS,
    RowBatch,
    cv_folds,
    family_errors,
    parse_rows,
    row_cluster,
    row_parts,
)
from parosim.cli import main
from parosim.errors import InputError
from parosim.evaluate.moe_parallel import (
    KernelEfficiency,
    MoEParallel,
    moe_step_parts,
    moe_step_time,
    step_from_parts,
)
from parosim.spec.model import preset


def _row(label_part: str):
    rows, _ = parse_rows()
    return next(r for r in rows if label_part in r.label)


def test_rows_parsed_and_excluded_with_reasons():
    rows, excluded = parse_rows()
    assert len(rows) + len(excluded) == 193
    assert len(rows) == 117
    assert {r.family for r in rows} == {"deepseek-v3", "gpt-oss-120b", "qwen3-30b-a3b",
                                        "qwen3-235b-a22b"}
    assert {why for _, _, why in excluded} <= set(EXCLUDED.values()) | {REGRESSION_REASON}
    assert sum(1 for _, fam, _ in excluded if fam.startswith("Nemotron_3")) == 53
    # the two GPT-OSS-120B rows of NeMo 26.06.01 whose footnote reports a regression
    regressed = [(i, fam) for i, fam, why in excluded if why == REGRESSION_REASON]
    assert [fam for _, fam in regressed] == ["GPT OSS 120B"] * 2
    # the fit / held-out split: even / odd rows inside each family, the regressed rows
    # keeping their places in the alternation
    for fam in {r.family for r in rows}:
        place = sorted([(r.index, r.fit) for r in rows if r.family == fam]
                       + [(i, None) for i, f in regressed if FAMILIES[f] == fam])
        assert all(fit is None or fit == (k % 2 == 0) for k, (_, fit) in enumerate(place))


def test_deepseek_layout_by_hand():
    """DeepSeek-V3 on 256 GB200, TP1 PP4 VP4 EP64, GBS 4096, MBS 1: DP = 256 / 4 = 64,
    EDP = 64 / 64 = 1, m = 4096 / 64 = 64 micro-batches; forced balance gives every expert
    64 x 4096 x 8 / 256 = 8192 rows; one all-to-all moves 4096 x 8 x 7168 x 2 B per rank."""
    r = _row("DeepSeekV3 GB200 NVL72 26.08")
    sp = row_parts(r)
    assert (sp.dp, sp.edp, sp.microbatches, sp.pp, sp.vp) == (64, 1, 64, 4, 4)
    assert sp.rows_per_expert == 8192
    assert sp.moe_layers == 58
    assert r.par == MoEParallel(tp=1, pp=4, vp=4, cp=1, ep=64)
    assert row_cluster("GB200", 256).gpus_per_node == 64


def test_pipeline_schedule_by_hand():
    """step = m x W/p + (p-1)/v x W/p + p2p + optimizer, W the micro-batch's work."""
    r = _row("Qwen3_235B_a22B GB300 NVL72 26.08")
    sp = row_parts(r)
    eff = KernelEfficiency(gemm_efficiency=0.5, attention_efficiency=0.4, a2a_exposed=0.3,
                           hbm_efficiency=0.8, moe_layer_overhead_s=1e-3)
    st = step_from_parts(sp, eff)
    stage = (st.gemm_s + st.grouped_gemm_s + st.attention_s + st.memory_s + st.a2a_s
             + st.tp_s + st.host_s)
    assert st.bubble_s == pytest.approx((sp.pp - 1) / sp.vp * stage, rel=1e-12)
    assert st.step_s == pytest.approx(sp.microbatches * stage + st.bubble_s + st.p2p_s
                                      + st.optimizer_s, rel=1e-12)
    assert st.host_s == pytest.approx(94 * 1e-3 / 4)
    assert st.a2a_s == pytest.approx(sp.a2a_s * 0.3 / 4)
    # interleaving shrinks the bubble: VP 12 against plain 1F1B
    plain = step_from_parts(replace(sp, vp=1), eff)
    assert plain.bubble_s == pytest.approx(12 * st.bubble_s)
    assert st.tokens_per_s_per_gpu == pytest.approx(8192 * 4096 / st.step_s / 256)


def test_fp8_and_ep_change_the_right_parts():
    m = preset("qwen3-30b-a3b")
    c = row_cluster("B200", 16)
    bf = moe_step_parts(m, c, MoEParallel(ep=8), 256, 2, 4096, "bf16")
    f8 = moe_step_parts(m, c, MoEParallel(ep=8), 256, 2, 4096, "fp8")
    # the linear layers run at the FP8 peak (twice bf16 on B200): their compute halves
    assert sum(x[0] for x in f8.grouped) == pytest.approx(sum(x[0] for x in bf.grouped) / 2)
    assert all(x[2] for x in f8.grouped) and not any(x[2] for x in bf.grouped)
    # fp8_gemm_efficiency slows exactly the FP8 GEMMs
    e1 = step_from_parts(f8, KernelEfficiency(fp8_gemm_efficiency=1.0))
    e5 = step_from_parts(f8, KernelEfficiency(fp8_gemm_efficiency=0.5))
    assert e5.grouped_gemm_s > e1.grouped_gemm_s and e5.attention_s == e1.attention_s
    b1 = step_from_parts(bf, KernelEfficiency(fp8_gemm_efficiency=1.0))
    assert step_from_parts(bf, KernelEfficiency(fp8_gemm_efficiency=0.5)) == b1
    assert f8.attention_s == bf.attention_s
    # EP 16 crosses the NICs: the all-to-alls get slower than at EP 8 (NVLink)
    e16 = moe_step_parts(m, c, MoEParallel(ep=16), 256, 2, 4096, "bf16")
    assert e16.a2a_s > bf.a2a_s > 0
    assert e16.rows_per_expert == 2 * bf.rows_per_expert


def test_refusals():
    m = preset("qwen3-30b-a3b")
    c = row_cluster("B200", 8)
    with pytest.raises(InputError, match="etp"):
        MoEParallel(etp=2)
    with pytest.raises(InputError, match="dense"):
        moe_step_time(preset("llama-7b"), c, MoEParallel(), 64, 1, 2048)
    with pytest.raises(InputError, match="token dropping"):
        moe_step_time(replace(m, moe=replace(m.moe, capacity_factor=1.0)), c,
                      MoEParallel(ep=8), 64, 1, 2048)
    with pytest.raises(InputError, match="not a multiple"):
        moe_step_time(m, c, MoEParallel(ep=8), 60, 1, 2048)
    with pytest.raises(InputError, match="precision"):
        moe_step_time(m, c, MoEParallel(ep=8), 64, 1, 2048, precision="fp4")
    with pytest.raises(InputError, match="must be in"):
        KernelEfficiency(gemm_efficiency=1.5)


def test_bit_identical_reruns():
    r = _row("GPT OSS 120B GB200 NVL72 26.08")
    a = step_from_parts(row_parts(r), KernelEfficiency())
    moe_step_parts.cache_clear()
    b = step_from_parts(row_parts(r), KernelEfficiency())
    assert a == b


def test_vectorised_fit_step_equals_step_from_parts():
    """The least-squares residual's array form predicts what step_from_parts does."""
    rows, _ = parse_rows()
    rows = rows[::7]
    eff = KernelEfficiency(gemm_efficiency=0.5, attention_efficiency=0.4, a2a_exposed=0.3,
                           hbm_efficiency=0.8, moe_layer_overhead_s=1e-3,
                           fp8_gemm_efficiency=0.7)
    p = {f: np.full(len(rows), getattr(eff, f)) for f in
         ("gemm_efficiency", "attention_efficiency", "a2a_exposed", "hbm_efficiency",
          "moe_layer_overhead_s", "fp8_gemm_efficiency")}
    fast = RowBatch(rows).tokens(p)
    slow = [step_from_parts(row_parts(r), eff).tokens_per_s_per_gpu for r in rows]
    assert {r.par.pp > 1 for r in rows} == {True, False}
    assert {r.precision for r in rows} == {"bf16", "fp8"}
    assert list(fast) == pytest.approx(slow, rel=1e-12)


def test_cv_folds_inside_each_family():
    rows, _ = parse_rows()
    train = [r for r in rows if r.fit]
    folds = cv_folds(train, 5)
    for fam in {r.family for r in train}:
        mine = [g for r, g in zip(train, folds, strict=True) if r.family == fam]
        assert mine == [i % 5 for i in range(len(mine))]


@pytest.mark.slow
def test_calibrated_held_out_error_per_family(monkeypatch):
    """The parameter set is chosen by 5-fold cross-validation inside the fit rows (no
    held-out row is seen), fitted on the even rows of each family, and predicts the odd ones
    once: median |error| <= 12 % for every family (DeepSeek-V3, GPT-OSS-120B,
    Qwen3-235B-A22B, Qwen3-30B-A3B)."""
    seen = []
    original = mt.select_variant

    def recording(rows, *a, **k):
        seen.extend(rows)
        return original(rows, *a, **k)
    monkeypatch.setattr(mt, "select_variant", recording)
    f, errs, _, table = mt.calibrate()
    # the selection saw exactly the fit rows, never a held-out one
    assert seen and all(r.fit for r in seen)
    assert len(seen) == sum(1 for r, _, _ in errs if r.fit)
    assert len(table) == len(VARIANTS) and sum(t["chosen"] for t in table) == 1
    chosen = next(t for t in table if t["chosen"])
    assert chosen["score"] == min(t["score"] for t in table)
    assert chosen["variant"].release_by == f.release_by == "release"
    held = family_errors(errs)
    assert set(held) == {"deepseek-v3", "gpt-oss-120b", "qwen3-30b-a3b", "qwen3-235b-a22b"}
    for fam in held:
        assert held[fam]["median_abs_error"] <= 0.12, (fam, held[fam])
    for hw, e in f.hardware.items():
        assert 0.05 < e.gemm_efficiency < 1
        assert 0.3 <= e.fp8_gemm_efficiency <= 1
        # the constants the CLI uses are this fit, rounded
        for k in ("gemm_efficiency", "moe_layer_overhead_s", "a2a_exposed",
                  "attention_efficiency", "hbm_efficiency", "fp8_gemm_efficiency"):
            assert getattr(FITTED[hw], k) == pytest.approx(getattr(e, k), abs=1e-6), (hw, k)
    assert f.releases[("26.08", "")] == 1.0


def test_fitted_constants_state_their_source():
    assert set(FITTED) == set(GPU_HARDWARE.values())
    for e in FITTED.values():
        assert "cross-validation" in e.source and e.fp8_gemm_efficiency == 1.0


def test_cli_moe_tp_pp_runs_the_closed_form(capsys):
    """`parosim simulate` of DeepSeek-V3 with PP 4, VP 4, EP 64 on 256 GB200: the closed form
    with the fitted GB200 parameters, i.e. the prediction of the held-out Megatron-Bridge row
    (26.08, measured 4,912 tokens/s/GPU)."""
    argv = ["simulate", "--model", "deepseek-v3", "--cluster", "gb200-nvl72", "--nodes", "4",
            "--pp", "4", "--pp-schedule", "interleaved", "--virtual-stages", "4", "--ep", "64",
            "--micro-batch", "1", "--global-batch", "4096", "--seq-len", "4096",
            "--precision", "fp8", "--mode", "analytic"]
    assert main(argv + ["--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    row = _row("DeepSeekV3 GB200 NVL72 26.08")
    expected = step_from_parts(row_parts(row), FITTED["GB200"])
    assert d["tokens_per_s_per_gpu"] == expected.tokens_per_s_per_gpu
    assert d["step_time_s"] == expected.step_s
    assert abs(d["tokens_per_s_per_gpu"] / row.measured - 1) < 0.12
    assert (d["tp"], d["pp"], d["virtual_stages"], d["ep"], d["dp"], d["edp"]) == \
        (1, 4, 4, 64, 64, 1)
    assert d["micro_batches"] == 64 and d["global_batch_seqs"] == 4096
    assert d["mode"] == "analytic" and d["memory_checked"] is False
    assert d["bubble_s"] == pytest.approx(3 / 4 * sum(d["stage_microbatch_s"].values()))
    assert d["calibration"]["hardware"] == "GB200"
    assert d["calibration"]["release"] == "NeMo 26.08"
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"{d['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU" in out
    assert "TP 1 x PP 4 (4 chunk(s) per stage)" in out and "memory not checked" in out
    # reruns are bit-identical
    assert main(argv + ["--json"]) == 0
    assert json.loads(capsys.readouterr().out) == d


def test_cli_moe_tp_pp_refusals(capsys):
    base = ["simulate", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100-ib", "--nodes", "2",
            "--pp", "2", "--ep", "8", "--micro-batch", "1", "--accum", "4", "--seq-len",
            "4096"]
    assert main(base + ["--mode", "analytic", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["pp"], d["dp"], d["micro_batches"]) == (2, 8, 4)
    for extra, words in (
            ([], "--mode engine: the engine does not model MoE steps with --tp / --pp"),
            (["--mode", "engine"], "expected --mode analytic"),
            (["--mode", "analytic", "--strategy", "NIG"], "--strategy NIG is not in the MoE"),
            (["--mode", "analytic", "--recompute", "full"], "--recompute full"),
            (["--mode", "analytic", "--tp", "2"], "expected --sequence-parallel"),
            (["--mode", "analytic", "--virtual-stages", "2"], "--virtual-stages 2 needs"),
            (["--mode", "analytic", "--cluster", "dgx-a100-ib"], "calibrated for")):
        assert main(base + extra) == 2
        err = capsys.readouterr().err
        assert words in err and err.count("\n") == 1, err
