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
            "compute_efficiency", "gpu_memory_bytes"} <= set(res["settings"])
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
    tr = TrainingSpec(micro_batch=c["micro_batch"], accum_steps=c["accum"], seq_len=2048,
                      recompute=c["recompute"] == "full")
    mode = "engine" if c["mode"] == "engine" else "analytic"
    r = simulate_step(preset("llama-13b"), cl, c["strategy"], tr, c["algo"], mode,
                      parallel=par)
    assert r.tokens_per_s == pytest.approx(c["tokens_per_s"], rel=1e-9)
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
