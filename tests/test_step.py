"""One training step: timeline, engine vs analytic, compare, determinism, bad input."""

import json

import pytest

from parosim.cli.commands import main
from parosim.collectives import Algo, Op, Scope, closed_form_time
from parosim.evaluate.analytic import evaluate
from parosim.evaluate.replay import replay
from parosim.io import load_cluster
from parosim.plan.dataparallel import build_plan
from parosim.simulate.step import compare, simulate_step, with_overrides
from parosim.spec.model import ModelSpec, preset
from parosim.spec.strategy import ALL_STRATEGIES
from parosim.spec.system import ClusterSpec
from parosim.spec.training import TrainingSpec

TINY = ModelSpec(name="tiny", layers=2, hidden=64, ffn_hidden=128, heads=2, vocab=100)


def test_two_layer_timeline_is_exactly_the_expected_event_list():
    """NIG, s = 1, ring: every op's start and end follow from the stream rules."""
    spec = ClusterSpec(nodes=2, gpus_per_node=2)
    train = TrainingSpec(micro_batch=1, accum_steps=1, seq_len=16)
    plan = build_plan(TINY, "NIG", spec, train)
    d = {o.name: o.duration_s for o in plan.ops if hasattr(o, "duration_s")}
    size = {o.name: o.size_bytes for o in plan.ops if hasattr(o, "size_bytes")}

    def coll(name, op, scope):
        return closed_form_time(spec, op, scope, size[name], Algo.RING)

    ev = []

    def add(name, lane, start, dur):
        ev.append((name, lane, start, start + dur))
        return start + dur

    t = add("fwd embed mb0", "compute", 0.0, d["fwd embed mb0"])
    t = add("fwd L0 mb0", "compute", t, d["fwd L0 mb0"])
    t = add("fwd L1 mb0", "compute", t, d["fwd L1 mb0"])
    t = add("fwd head mb0", "compute", t, d["fwd head mb0"])
    e_head = add("bwd head mb0", "compute", t, d["bwd head mb0"])
    g = add("rs-grad head mb0", "comm-grad", e_head,
            coll("rs-grad head mb0", Op.REDUCE_SCATTER, Scope.INTRA))
    e_l1 = add("bwd L1 mb0", "compute", e_head, d["bwd L1 mb0"])
    g = add("rs-grad L1 mb0", "comm-grad", max(e_l1, g),
            coll("rs-grad L1 mb0", Op.REDUCE_SCATTER, Scope.INTRA))
    e_l0 = add("bwd L0 mb0", "compute", e_l1, d["bwd L0 mb0"])
    g = add("rs-grad L0 mb0", "comm-grad", max(e_l0, g),
            coll("rs-grad L0 mb0", Op.REDUCE_SCATTER, Scope.INTRA))
    e_emb = add("bwd embed mb0", "compute", e_l0, d["bwd embed mb0"])
    g = add("rs-grad embed mb0", "comm-grad", max(e_emb, g),
            coll("rs-grad embed mb0", Op.REDUCE_SCATTER, Scope.INTRA))
    g = add("sync-grad reduce-scatter inter", "comm-grad", g,
            coll("sync-grad reduce-scatter inter", Op.REDUCE_SCATTER, Scope.INTER))
    t = add("optimizer step", "compute", g, d["optimizer step"])
    end = add("sync-param all-gather global", "comm-param", t,
              coll("sync-param all-gather global", Op.ALL_GATHER, Scope.GLOBAL))

    rep = replay(plan, spec, Algo.RING, trace=True)
    got = sorted((r.name, r.lane, r.start_s, r.end_s) for r in rep.records)
    want = sorted(ev)
    assert [g[:2] for g in got] == [w[:2] for w in want]
    for (_, _, s1, e1), (_, _, s2, e2) in zip(got, want, strict=True):
        assert s1 == pytest.approx(s2, abs=1e-11) and e1 == pytest.approx(e2, abs=1e-11)
    assert rep.step_time_s == pytest.approx(end, abs=1e-11)


@pytest.mark.parametrize("strategy", ["NIG", "ING", "NNG"])
def test_engine_matches_analytic_when_communication_is_hidden(strategy):
    c = load_cluster("paper-a100-roce")
    p = build_plan(preset("llama-7b"), strategy, c, TrainingSpec())
    an = evaluate(p, c, Algo.HO_RING)
    assert an.t_comm_s < 0.3 * an.t_comp_s  # hidden regime
    assert replay(p, c, Algo.HO_RING).step_time_s == pytest.approx(an.step_time_s, rel=0.05)


@pytest.mark.parametrize("strategy", ["GGG", "IIG"])
def test_engine_matches_analytic_when_communication_is_exposed(strategy):
    c = with_overrides(load_cluster("paper-a100-roce"), nic_bandwidth_Bps=1.25e9,
                       intra_bandwidth_Bps=5e9)
    t = TrainingSpec(accum_steps=2)
    p = build_plan(preset("llama-7b"), strategy, c, t)
    an = evaluate(p, c, Algo.RING)
    assert an.t_comm_s > 3 * an.t_comp_s  # exposed regime
    assert replay(p, c, Algo.RING).step_time_s == pytest.approx(an.step_time_s, rel=0.05)


def test_compare_ranks_all_14_and_marks_non_fitting():
    c = with_overrides(load_cluster("paper-a100-roce"), gpu_memory_bytes=24 * 10**9)
    rows = compare(preset("llama-7b"), c, TrainingSpec(), mode="analytic")
    assert len(rows) == 14
    assert {r.strategy for r in rows} == set(ALL_STRATEGIES)
    fit = [r for r in rows if r.fits]
    nofit = [r for r in rows if not r.fits]
    assert fit and nofit
    assert rows[:len(fit)] == fit  # fitting first
    times = [r.step_time_s for r in fit]
    assert times == sorted(times)
    for r in nofit:
        assert r.step_time_s is None
        assert r.memory.shortfall_bytes == pytest.approx(r.memory.total_bytes -
                                                         r.memory.capacity_bytes)


def test_metrics_are_consistent():
    c = load_cluster("paper-a100-roce")
    t = TrainingSpec()
    r = simulate_step(preset("llama-7b"), c, "IIG", t)
    tokens = t.micro_batch * t.seq_len * t.accum_steps * c.gpus
    assert r.tokens_per_s == pytest.approx(tokens / r.step_time_s)
    assert r.tokens_per_s_per_gpu == pytest.approx(r.tokens_per_s / 32)
    assert r.samples_per_s == pytest.approx(r.tokens_per_s / t.seq_len)
    assert 0 < r.mfu < 0.5 + 1e-9  # never above the compute efficiency
    assert r.exposed_comm_s == pytest.approx(r.step_time_s - r.compute_s)
    # IIG: per micro-step intra traffic; inter only at the boundary: 2 x (ng-1)/ng x 2Ψ'/m
    psi = preset("llama-7b").params
    assert r.bytes_inter == pytest.approx(2 * 3 / 4 * 2 * psi / 8, rel=1e-9)


def test_analytic_bytes_match_engine_bytes():
    c = load_cluster("paper-a100-roce")
    for s in ("GGG", "NIG", "IGG"):
        e = simulate_step(preset("llama-7b"), c, s, TrainingSpec(accum_steps=2))
        a = simulate_step(preset("llama-7b"), c, s, TrainingSpec(accum_steps=2),
                          mode="analytic")
        assert e.bytes_inter == pytest.approx(a.bytes_inter, rel=1e-9)
        assert e.bytes_intra == pytest.approx(a.bytes_intra, rel=1e-9)


def test_two_runs_give_identical_json(capsys):
    argv = ["simulate", "--strategy", "IGG", "--accum", "2", "--json"]
    assert main(argv) == 0
    a = capsys.readouterr().out
    assert main(argv) == 0
    b = capsys.readouterr().out
    assert a == b and json.loads(a)["step_time_s"] > 0


def test_compare_cli_default_prints_14_ranked_rows(capsys):
    assert main(["compare", "--mode", "analytic"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [ln for ln in out if ln[:3].strip().isdigit()]
    assert len(rows) == 14
    assert "does not fit" in rows[-1]  # NNN (DDP) of LLaMA-7B does not fit 80 GB


def test_trace_is_chrome_trace_json(tmp_path, capsys):
    f = tmp_path / "t.json"
    assert main(["simulate", "--strategy", "NIG", "--accum", "1", "--trace", str(f)]) == 0
    data = json.loads(f.read_text())
    names = {e["args"]["name"] for e in data["traceEvents"] if e["ph"] == "M"}
    assert {"compute", "comm-grad"} <= names
    xs = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert xs and all(e["dur"] >= 0 for e in xs)


@pytest.mark.parametrize("argv,needle", [
    (["simulate", "--strategy", "GNN"], "PaRO-GNN is invalid"),
    (["simulate", "--strategy", "XYZ"], "'XYZ'"),
    (["simulate", "--model", "gpt9"], "unknown model 'gpt9'"),
    (["simulate", "--micro-batch", "0"], "--micro-batch = 0"),
    (["simulate", "--seq-len", "-4"], "--seq-len = -4"),
    (["simulate", "--trainable-ratio", "1.5"], "'1.5' must be in (0, 1]"),
    (["simulate", "--trainable-ratio", "0"], "must be in (0, 1]"),
    (["simulate", "--accum", "0"], "--accum = 0"),
    (["simulate", "--group-nodes", "3"], "does not divide the 4 nodes"),
    (["compare", "--gpu-memory", "lots"], "'lots' is not a size"),
    (["memory", "--model", "/nope.yaml"], "does not exist"),
])
def test_bad_step_input(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


def test_memory_command_reports_fit_and_max_micro_batch(capsys):
    assert main(["memory", "--model", "llama-65b", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["results"]
    assert len(rows) == 14
    fits = {r["strategy"] for r in rows if r["fits"]}
    assert "PaRO-GGG" in fits and "PaRO-NNN" not in fits
    for r in rows:
        assert r["total_bytes"] == pytest.approx(r["model_states_bytes"] +
                                                 r["activations_bytes"] +
                                                 r["buffers_bytes"] + r["margin_bytes"])
        if r["fits"]:  # the default micro-batch of 4 fits, so the largest is at least 4
            assert r["max_micro_batch"] >= 4


@pytest.mark.parametrize("strategy", ["NNN", "NIG", "IGG", "GGG", "ING"])
def test_analytic_of_one_micro_step_repeated_equals_full_plan(strategy):
    c = load_cluster("paper-a100-roce")
    t = TrainingSpec(accum_steps=7, recompute=False)
    full = evaluate(build_plan(preset("llama-7b"), strategy, c, t), c, Algo.HO_RING)
    t1 = TrainingSpec(accum_steps=1, recompute=False)
    one = evaluate(build_plan(preset("llama-7b"), strategy, c, t1), c, Algo.HO_RING, repeat=7)
    assert one.step_time_s == pytest.approx(full.step_time_s, rel=1e-12)
    a = simulate_step(preset("llama-7b"), c, strategy, t, mode="analytic")
    if a.fits:
        assert a.step_time_s == pytest.approx(full.step_time_s, rel=1e-12)
        e = simulate_step(preset("llama-7b"), c, strategy, t, mode="engine")
        assert a.bytes_inter == pytest.approx(e.bytes_inter, rel=1e-9)
        assert a.tokens_per_s * a.step_time_s == pytest.approx(e.tokens_per_s * e.step_time_s)
        assert a.mfu * a.step_time_s == pytest.approx(e.mfu * e.step_time_s)


def test_bytes_split_on_a_node_without_nvlink():
    """PCIe-switch nodes: intra and inter bytes are told apart by where the GPU's link goes."""
    from dataclasses import replace

    from parosim.spec.system import IntraFabric, LinkSpec

    c = replace(load_cluster("paper-a100-roce"), intra_fabric=IntraFabric.PCIE_SWITCH,
                intra=LinkSpec(32e9, 1e-6))
    t = TrainingSpec(accum_steps=2)
    e = simulate_step(preset("llama-7b"), c, "NIG", t)
    a = simulate_step(preset("llama-7b"), c, "NIG", t, mode="analytic")
    assert e.bytes_inter > 0 and e.bytes_intra > 0
    assert e.bytes_inter == pytest.approx(a.bytes_inter, rel=1e-9)
    assert e.bytes_intra == pytest.approx(a.bytes_intra, rel=1e-9)


def test_simulate_of_a_configuration_that_does_not_fit(capsys):
    """The breakdown is printed (nothing lost), one line says why, exit code 2."""
    assert main(["simulate", "--strategy", "ddp", "--json"]) == 2
    out = capsys.readouterr()
    res = json.loads(out.out)
    assert res["fits"] is False and res["step_time_s"] is None
    assert res["memory"]["shortfall_bytes"] > 0
    assert "PaRO-NNN does not fit" in out.err and out.err.count("\n") == 1
