"""Step sweeps through parosim.simulate.run_point: rows for fitting, non-fitting and bad points."""

from __future__ import annotations

import pytest

from parosim.io.sweep import COLUMNS, load_sweep_spec, sweep_from_dict
from parosim.sweep.runner import read_results, run_sweep

pytest.importorskip("parosim.simulate")

SPEC = {
    "name": "step", "kind": "step", "mode": "analytic",
    "grid": {"nodes": [2, 4], "group_nodes": [1, 3],
             "strategy": ["NNN", "NIG", "PaRO-IIG", "zero3"]},
    "fixed": {"model": "llama-7b", "cluster": "paper-a100-roce", "algo": "ho-ring",
              "trainable_ratio": "full"},
    "figures": [{"plot": "throughput", "by": ["nodes", "group_nodes"]},
                {"plot": "memory", "by": ["nodes", "group_nodes"]},
                {"plot": "scalability", "by": ["group_nodes"]}],
}


def test_step_sweep_rows_statuses_and_figures(tmp_path):
    res = run_sweep(sweep_from_dict(SPEC), tmp_path, workers=1, progress=False)
    df = read_results(tmp_path / "results.csv")
    assert list(df.columns) == list(COLUMNS["step"])
    assert len(df) == res["points"] == 16
    # group of 3 nodes divides neither 2 nor 4 nodes: error rows with the reason
    bad = df[df.group_nodes == 3]
    assert set(bad.status) == {"error"} and bad.reason.str.contains("does not divide").all()
    good = df[df.group_nodes == 1]
    # DDP (NNN) keeps 16 bytes per parameter of a 6.7B model on every GPU: 108 GB > 80 GB
    nnn = good[good.strategy == "NNN"]
    assert set(nnn.status) == {"does-not-fit"}
    assert (nnn.total_bytes > nnn.capacity_bytes).all() and nnn.step_time_s.isna().all()
    assert not nnn.fits.any()
    ok = good[good.strategy != "NNN"]
    assert set(ok.status) == {"ok"} and ok.fits.all()
    assert (ok.tokens_per_s == ok.tokens_per_s_per_gpu * ok.gpus).all()
    assert sorted(ok.gpus.unique()) == [16, 32]
    assert (res["ok"], res["does_not_fit"], res["errors"]) == (6, 2, 8)
    stems = sorted({p.rsplit("/", 1)[1].rsplit(".", 1)[0] for p in res["figures"]})
    assert "throughput-nodes=4-group_nodes=1" in stems
    assert "memory-nodes=2-group_nodes=1" in stems and "scalability-group_nodes=1" in stems


def test_engine_and_analytic_rows_have_the_same_shape(tmp_path):
    spec = dict(SPEC, grid={"strategy": ["NIG", "IGG"]}, figures=[])
    spec["fixed"] = dict(SPEC["fixed"], nodes=2)
    for mode in ("engine", "analytic"):
        run_sweep(sweep_from_dict(dict(spec, mode=mode)), tmp_path / mode, workers=1,
                  progress=False)
    eng = read_results(tmp_path / "engine" / "results.csv")
    ana = read_results(tmp_path / "analytic" / "results.csv")
    assert list(eng.strategy) == list(ana.strategy) == ["NIG", "IGG"]
    assert (eng.status == "ok").all() and (ana.status == "ok").all()
    # the two evaluators agree on a communication-hidden strategy within 10 %
    assert eng.step_time_s[0] == pytest.approx(ana.step_time_s[0], rel=0.1)


@pytest.mark.parametrize("name", ["01_paper_32gpu", "02_scalability", "03_allgather_1gb",
                                  "04_bandwidth", "05_large_scale", "06_group_rack"])
def test_experiment_specs_are_valid(name):
    from pathlib import Path

    spec = load_sweep_spec(Path(__file__).resolve().parents[1] / "experiments" / name /
                           "sweep.yaml")
    assert spec.points() and spec.description
