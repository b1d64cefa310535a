"""The strong- and weak-scaling experiments run from their one spec each (made small: one
configuration, closed form)."""

import pandas as pd

from parosim.io.sweep import load_sweep_spec, sweep_from_dict
from parosim.io.yamlspec import read_yaml
from parosim.sweep.runner import run_sweep


def _run(path, tmp_path, **change):
    data = {**read_yaml(path, "spec"), **change}
    spec = sweep_from_dict(data, base_dir="experiments")
    summary = run_sweep(spec, tmp_path, workers=1, progress=False, figures=False)
    df = pd.read_csv(tmp_path / "results.csv")
    assert (df["status"] == "ok").all(), df["reason"].tolist()
    return spec, summary, df


def test_strong_scaling_keeps_the_global_batch_from_4_to_64_nodes(tmp_path):
    path = "experiments/14_strong_scaling/sweep.yaml"
    full = load_sweep_spec(path)
    assert full.grid["nodes"] == (4, 8, 16, 32, 64) and "global_batch" in full.fixed
    spec, _, df = _run(path, tmp_path, grid={"nodes": [4, 8, 16, 32, 64],
                                             "strategy": ["GGG"]}, figures=[])
    seqs = df["micro_batch"] * df["accum"] * df["gpus"]
    assert (seqs == 2**22 // 2048).all()                      # 4Mitok of 2048-token sequences
    assert list(df["nodes"]) == [4, 8, 16, 32, 64]
    assert df["step_time_s"].is_monotonic_decreasing          # the same batch, more GPUs
    assert df["tokens_per_s"].is_monotonic_increasing
    assert "global_batch" in df.columns and set(df["global_batch"]) == {"4Mitok"}


def test_weak_scaling_zips_nodes_with_the_global_batch(tmp_path):
    path = "experiments/15_weak_scaling/sweep.yaml"
    full = load_sweep_spec(path)
    assert len(full.points()) == 10 and any(n is None for n, _ in full.axes)
    spec, _, df = _run(path, tmp_path, points=[{"strategy": "GGG"}], figures=[])
    assert len(df) == 5
    per_node = df["micro_batch"] * df["accum"] * df["gpus"] / df["nodes"]
    assert (per_node == 64).all()                             # 64 sequences per node
    per_gpu = df["tokens_per_s_per_gpu"]
    assert per_gpu.max() / per_gpu.min() < 1.05               # the same work per GPU
