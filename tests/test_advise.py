"""parosim advise: ranked, fitting, consistent with simulate; bad input exits 2."""

import itertools
import json

import pytest

from parosim.cli.commands import main
from parosim.collectives.types import Algo
from parosim.errors import InputError
from parosim.evaluate.threed import evaluate_3d, summary_3d
from parosim.io import load_cluster
from parosim.plan.layout import ParallelSpec
from parosim.plan.threed import build_plan_3d
from parosim.simulate.step import simulate_step
from parosim.spec.model import ModelSpec, preset
from parosim.spec.strategy import parse_strategy
from parosim.spec.training import TrainingSpec
from parosim.studies.advise import parse_global_batch

ARGS = ["advise", "--model", "llama-13b", "--cluster", "dgx-a100-ib", "--seq-len", "2048",
        "--nodes", "2", "--global-batch", "64",
        "--strategies", "NNN,NNG,IIG,GGG", "--top", "4", "--engine-top", "1"]


def test_advise_json_ranked_fitting_and_reproducible(capsys, tmp_path):
    plot = tmp_path / "pareto.png"
    assert main([*ARGS, "--json", "--plot", str(plot)]) == 0
    res = json.loads(capsys.readouterr().out)
    cands = res["candidates"]
    assert 1 <= len(cands) <= 4 and plot.stat().st_size > 10_000
    keys = {"tp", "pp", "strategy", "micro_batch", "accum", "recompute", "algo",
            "tokens_per_s", "memory_bytes"}
    assert all(keys <= set(c) for c in cands)
    # every input is echoed (issue 12)
    assert {"global_batch", "seq_len", "top", "engine_top", "max_micro_batch", "strategies",
            "compute_model", "gpu_memory_bytes"} <= set(res["settings"])
    # an efficiency is the flat model's: not echoed beside the kernel model it did not apply to
    assert "compute_efficiency" not in res["settings"]
    tps = [c["tokens_per_s"] for c in cands]
    assert tps == sorted(tps, reverse=True)
    for c in cands:
        assert c["memory_bytes"] <= c["capacity_bytes"]
        # the global batch is honoured: b x m x dp sequences
        assert c["micro_batch"] * c["accum"] * c["dp"] == 64
        assert c["tp"] * c["pp"] * c["dp"] == 16
        assert c["reason"]
    # the winner, simulated on its own with simulate, gives the same figure
    c = cands[0]
    par = ParallelSpec(tp=c["tp"], pp=c["pp"], schedule=c["schedule"],
                       virtual=c["virtual_stages"], sequence_parallel=c["sequence_parallel"],
                       selective_recompute=c["recompute"] == "selective")
    cl = load_cluster("dgx-a100-ib", 2).with_group_nodes(c["group_nodes"])
    # the compute model advise applied (the kernel model by default, as simulate's)
    assert res["settings"]["compute_model"] == "kernel"
    tr = TrainingSpec(micro_batch=c["micro_batch"], accum_steps=c["accum"], seq_len=2048,
                      recompute=c["recompute"] == "full", attention=c["attention"],
                      precision=c["precision"], compute_model="kernel")
    mode = "engine" if c["mode"] == "engine" else "analytic"
    r = simulate_step(preset("llama-13b"), cl, c["strategy"], tr, c["algo"], mode,
                      parallel=par if (c["tp"] > 1 or c["pp"] > 1 or c["recompute"] ==
                                       "selective") else None, runtime=c["runtime"])
    assert r.tokens_per_s == pytest.approx(c["tokens_per_s"], rel=1e-9)
    assert r.mfu == pytest.approx(c["mfu"], rel=1e-9)   # the same MFU as simulate's
    # same inputs, same answer
    assert main([*ARGS, "--json"]) == 0
    again = json.loads(capsys.readouterr().out)["candidates"]
    assert [(x["tokens_per_s"], x["strategy"]) for x in again] == \
        [(x["tokens_per_s"], x["strategy"]) for x in cands]


def test_summary_equals_the_plans_closed_form():
    """The screening formula is the closed form of the Plan, term by term."""
    m = ModelSpec("small", layers=8, hidden=1024, ffn_hidden=2816, heads=8, vocab=32000)
    worst = 0.0
    for nodes, gn in ((2, 1), (4, 2)):
        c = load_cluster("dgx-a100-ib", nodes).with_group_nodes(gn)
        for tp, pp, sched, sp, sel, s, rc, algo in itertools.product(
                (1, 2, 8), (1, 2, 4), ("1f1b", "interleaved"), (False, True),
                (False, True), ("NNN", "IIG", "GGG", "INI"), (False, True),
                (Algo.RING, Algo.HO_RING)):
            if (sp and tp == 1) or (sched == "interleaved" and pp == 1) or tp * pp > c.gpus:
                continue
            par = ParallelSpec(tp=tp, pp=pp, schedule=sched, sequence_parallel=sp,
                               selective_recompute=sel)
            tr = TrainingSpec(micro_batch=2, accum_steps=pp if sched == "interleaved" else 1,
                              seq_len=1024, recompute=rc)
            a = evaluate_3d(build_plan_3d(m, s, c, tr, par), c, algo)
            b = summary_3d(m, parse_strategy(s), c, tr, par, algo, rc)
            worst = max(worst, abs(b.step_time_s / a.step_time_s - 1))
    assert worst < 1e-12


@pytest.mark.parametrize("extra,needle", [
    (["--global-batch", "3x"], "--global-batch '3x' is not a batch"),
    (["--global-batch", "1000tok"], "is not a whole number of 2048-token sequences"),
    (["--top", "0"], "--top = 0 must be a positive integer"),
    (["--strategies", "XYZ"], "strategy 'XYZ' is not known"),
    (["--model", "llama-65b", "--nodes", "1", "--global-batch", "8"],
     "no configuration of llama-65b fits"),
    (["--plot", "/nonexistent-dir/p.png"], "does not exist"),
    (["--plot", "p.jpg"], "expected a .png, .svg or .pdf"),
])
def test_advise_bad_input_exit_2(extra, needle, capsys):
    argv = ["advise", "--model", "llama-7b", "--cluster", "dgx-a100-ib", "--seq-len", "2048",
            "--nodes", "1", "--global-batch", "16", "--strategies", "NNN"]
    rc = main(argv + extra)
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and err.count("\n") == 1


def test_parse_global_batch():
    assert parse_global_batch("2048seq", 2048) == 2048
    assert parse_global_batch("4194304tokens", 2048) == 2048
    assert parse_global_batch("1K", 512) == 1024
    with pytest.raises(InputError):
        parse_global_batch("0", 2048)


SMALL = ["advise", "--model", "llama-7b", "--cluster", "dgx-h100-ib", "--nodes", "1",
         "--global-batch", "32", "--max-micro-batch", "2", "--top", "3", "--json"]


def _advise(capsys, *extra):
    assert main([*SMALL, *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_advise_fixed_flags_are_accepted_and_searched(capsys):
    """--attention / --precision / --runtime take simulate's values; unset, they are
    searched (fp8 only where the GPU has it)."""
    res = _advise(capsys, "--attention", "flash", "--precision", "fp8", "--runtime", "fsdp",
                  "--strategy", "GGG,NGG")
    assert res["search_space"]["attention"] == ["flash"]
    assert res["search_space"]["precision"] == ["fp8"]
    assert res["search_space"]["runtime"] == ["fsdp"]
    assert res["settings"]["fixed"]["runtime"] == ["fsdp"]
    for c in res["candidates"]:
        assert (c["attention"], c["precision"], c["runtime"]) == ("flash", "fp8", "fsdp")
        assert c["strategy"] in ("GGG", "NGG") and c["tp"] == c["pp"] == 1
    # unset: every value is searched; an A100 has no FP8
    free = _advise(capsys, "--strategy", "GGG", "--recompute", "none", "--tp", "1,2")
    assert free["search_space"]["attention"] == ["flash", "eager"]
    assert free["search_space"]["precision"] == ["bf16", "fp8"]
    assert {"ideal", "deepspeed", "fsdp", "paro"} <= set(free["search_space"]["runtime"])
    assert free["search_space"]["tp"] == [1, 2] and free["search_space"]["recompute"] == [
        "none"]
    a100 = ["--cluster", "dgx-a100-ib", "--strategy", "GGG", "--tp", "1", "--runtime", "ideal"]
    assert _advise(capsys, *a100)["search_space"]["precision"] == ["bf16"]
    assert main([*SMALL, *a100, "--precision", "fp8"]) == 2
    assert "needs FP8 tensor cores" in capsys.readouterr().err


def test_advise_top_are_all_engine_results_and_counts_reconcile(capsys):
    res = _advise(capsys, "--strategy", "GGG,IIG,NNG", "--runtime", "ideal,fsdp",
                  "--tp", "1,2", "--pp", "1,2")
    cands = res["candidates"]
    assert len(cands) == 3 and all(c["mode"] == "engine" for c in cands)
    assert res["ranked_by"] == "engine" and "closed_form_candidates" not in res
    tps = [c["tokens_per_s"] for c in cands]
    assert tps == sorted(tps, reverse=True)
    # counts: configurations, then their algorithm variants
    assert res["screened"] == res["pruned"] + res["not_fitting"] + res["fitting"]
    assert res["variants"] == res["evaluated"] + res["refused"]
    assert res["fitting"] <= res["variants"] and res["replayed"] >= len(cands)
    # GPU-hours for the token budget (default 1B tokens), cost with a price
    c = cands[0]
    assert c["gpu_hours"] == pytest.approx(1e9 / c["tokens_per_s"] * 8 / 3600)
    priced = _advise(capsys, "--strategy", "GGG", "--tp", "1", "--pp", "1", "--tokens",
                     "20B", "--gpu-hour-price", "2.5", "--runtime", "ideal")
    p = priced["candidates"][0]
    assert p["gpu_hours"] == pytest.approx(20e9 / p["tokens_per_s"] * 8 / 3600)
    assert p["cost"] == pytest.approx(2.5 * p["gpu_hours"])


def test_advise_engine_top_shows_the_closed_form_apart(capsys):
    res = _advise(capsys, "--strategy", "GGG,NNG", "--runtime", "ideal", "--tp", "1,2",
                  "--engine-top", "1")
    assert [c["mode"] for c in res["candidates"]] == ["engine"]
    assert res["closed_form_candidates"] and all(
        c["mode"] != "engine" for c in res["closed_form_candidates"])
    # the text labels the two lists and prints GiB and GPU-hours
    argv = [a for a in SMALL if a != "--json"]
    assert main([*argv, "--strategy", "GGG,NNG", "--runtime", "ideal", "--tp", "1,2",
                 "--engine-top", "1"]) == 0
    out = capsys.readouterr().out
    assert "ranked by the engine's step time" in out
    assert "costed in closed form only" in out and "mem GiB" in out and "GPU-h" in out
    assert " GB " not in out


def test_advise_compute_model_default_and_efficiency(capsys):
    """Unset, the compute model is simulate's accurate default (kernel); an --efficiency is
    the flat model's and selects it; beside --compute-model kernel it is refused."""
    assert _advise(capsys)["settings"]["compute_model"] == "kernel"
    flat = _advise(capsys, "--efficiency", "0.4")
    assert flat["settings"]["compute_model"] == "flat"
    assert flat["settings"]["compute_efficiency"] == 0.4
    assert main([*SMALL, "--efficiency", "0.4", "--compute-model", "kernel"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--efficiency 0.4 applies to the flat compute model" in err


def test_advise_plausibility_notes_as_simulate(capsys):
    """A GPU without calibration rows gets simulate's caution, in text and JSON."""
    args = ["advise", "--model", "mpt-125m", "--cluster", "dgx-b200-ib", "--nodes", "1",
            "--seq-len", "512", "--global-batch", "64", "--max-micro-batch", "4",
            "--engine-top", "0"]
    assert main([*args, "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert any(w.startswith("GPU B200") and "extrapolation" in w for w in res["warnings"])
    assert all(0 < c["mfu"] < 1 for c in res["candidates"])
    assert main(args) == 0
    assert "caution: GPU B200" in capsys.readouterr().out
    # a calibrated GPU and precision in its range: no caution
    assert "warnings" not in _advise(capsys, "--precision", "bf16")
