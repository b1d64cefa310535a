"""advise's rankings and counts are pinned: the costing caches (docs/performance.md) must
give the very numbers of the version before them (tests/data/advise_pinned.json, written on
main @7a746f6 by tests/data/make_advise_pinned.py), bit for bit."""

import json
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
PINNED = json.loads((DATA / "advise_pinned.json").read_text())
sys.path.insert(0, str(DATA))
from make_advise_pinned import CASES, run  # noqa: E402  (the generator's own cases)

COUNTS = ("screened", "pruned", "not_fitting", "fitting", "variants", "evaluated", "refused",
          "replayed")


@pytest.mark.parametrize("name", sorted(CASES))
def test_advise_reproduces_the_pinned_search(name):
    """Each case in turn in one process: the later ones run with the caches warm from the
    earlier ones' clusters (other keys), as a session of several searches would."""
    pinned = PINNED[name]
    assert pinned["args"] == CASES[name]
    got, want = run(CASES[name]), pinned["result"]
    if "best" in want:   # mixture of experts: the ranked list and the counts
        assert [(d["label"], d["ep"], d["micro_batch"], d["attention"]) for d in got["best"]] \
            == [(d["label"], d["ep"], d["micro_batch"], d["attention"]) for d in want["best"]]
        assert (got["points"], got["fitting"]) == (want["points"], want["fitting"])
        assert want["fitting"] > 10 and "engine_step_s" in want["best"][0]
    else:   # the ranking first (the clearest failure), then the counts
        assert got["top_labels"] == want["top_labels"]
        assert [c["tokens_per_s"] for c in got["candidates"]] == [
            c["tokens_per_s"] for c in want["candidates"]]
        assert {k: got[k] for k in COUNTS} == {k: want[k] for k in COUNTS}
        assert len(want["points"]) == want["evaluated"] > 100   # a real search was pinned
    assert got == want   # every figure, point and front entry, bit for bit


def test_the_peak_stage_shortcut_equals_every_stage():
    """memory_3d builds only stages 0, 1 and p - 1 when the middle stages hold the same
    parameters: the breakdown is the first largest of every stage's (stage_memory_3d)."""
    import itertools

    from parosim.io import load_cluster
    from parosim.plan.layout import ParallelSpec
    from parosim.plan.memory3d import memory_3d, stage_memory_3d
    from parosim.spec.model import ModelSpec
    from parosim.spec.training import TrainingSpec

    m = ModelSpec("small", layers=32, hidden=1024, ffn_hidden=2816, heads=8, vocab=32000)
    c = load_cluster("dgx-h100-ib", 4)
    checked = 0
    for pp, sched, m_acc, rc, prec, strat in itertools.product(
            (4, 8, 16), ("1f1b", "interleaved"), (1, 32), (False, True),
            ("bf16", "fp8"), ("IIG", "GGG")):
        if sched == "interleaved" and (32 % (2 * pp) or m_acc % pp):
            continue
        par = ParallelSpec(tp=2, pp=pp, schedule=sched)
        tr = TrainingSpec(micro_batch=2, accum_steps=m_acc, seq_len=2048, recompute=rc,
                          precision=prec)
        every = stage_memory_3d(m, strat, c, tr, par)
        assert memory_3d(m, strat, c, tr, par) == max(every, key=lambda b: b.total_bytes)
        checked += 1
    assert checked > 40


def test_an_equal_plan_reuses_the_engine_figures_exactly(monkeypatch):
    """Eager and flash attention under selective recomputation build the same 3D plan: the
    second step reuses the first's engine figures, equal to a fresh replay's."""
    from parosim.evaluate import replay as engine
    from parosim.io import load_cluster
    from parosim.io.model import load_model
    from parosim.plan.layout import ParallelSpec
    from parosim.simulate import step as st
    from parosim.spec.training import TrainingSpec

    m, c = load_model("llama-13b"), load_cluster("dgx-h100-ib", 2)
    par = ParallelSpec(tp=2, pp=2, schedule="interleaved", selective_recompute=True)

    def run(att):
        tr = TrainingSpec(seq_len=2048, micro_batch=1, accum_steps=4, attention=att,
                          precision="bf16", recompute=False)
        r = st.simulate_step(m, c, "IGG", tr, "hierarchical", "engine", parallel=par)
        return (r.step_time_s, r.events, r.exposed_comm_s, r.compute_s, r.tokens_per_s,
                r.tflops_per_gpu, r.bytes_intra, r.bytes_inter, r.parallel["bubble_fraction"])

    fresh = {}
    for att in ("eager", "flash"):   # each replayed on its own
        monkeypatch.setattr(st, "_REPLAYED", {})
        fresh[att] = run(att)
    assert fresh["eager"] == fresh["flash"] and fresh["eager"][0] > 0
    calls = []
    real = st.replay
    monkeypatch.setattr(st, "replay", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(st, "_REPLAYED", {})
    assert run("eager") == fresh["eager"] and run("flash") == fresh["flash"]
    assert len(calls) == 1 and engine.replay is real   # the second step was not replayed
