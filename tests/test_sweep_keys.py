"""The sweep spec reference (docs/sweeps.md) lists every key the sweep parser takes, and
every option of ``parosim simulate`` that shapes the step is a sweep key."""

import re
from pathlib import Path

from parosim.cli.parser import build_parser
from parosim.io.sweep import INPUT_KEYS, sweep_from_dict

DOC = Path(__file__).resolve().parents[1] / "docs" / "sweeps.md"
#: simulate options that choose outputs, not the simulated step
OUTPUT_OPTIONS = {"help", "trace", "plot", "link_timeline", "jobs", "json"}
#: simulate options of MoE models: sweep keys too (tests/test_sweep_moe.py runs them)
MOE_OPTIONS = {"ep", "expert_strategy", "a2a_algo", "routing", "max_over_mean", "zipf"}


def _doc_keys(kind: str) -> set[str]:
    text = DOC.read_text()
    section = text.split(f"### `kind: {kind}` keys", 1)[1].split("###", 1)[0]
    return set(re.findall(r"^\| `([a-z0-9_]+)` \|", section, re.M))


#: simulate options whose sweep key has another name
KEY_OF = {"set": "cluster_set"}


def _simulate_options() -> set[str]:
    sub = build_parser("simulate")._subparsers._group_actions[0].choices["simulate"]
    return {KEY_OF.get(a.dest, a.dest) for a in sub._actions} - OUTPUT_OPTIONS


def test_reference_lists_exactly_the_parsers_keys():
    for kind in ("step", "collective"):
        assert _doc_keys(kind) == set(INPUT_KEYS[kind]), kind


def test_every_simulate_option_is_a_step_sweep_key():
    missing = _simulate_options() - set(INPUT_KEYS["step"])
    assert not missing, f"simulate options without a sweep key: {sorted(missing)}"
    sub = build_parser("simulate")._subparsers._group_actions[0].choices["simulate"]
    assert MOE_OPTIONS <= {a.dest for a in sub._actions} & set(INPUT_KEYS["step"])


def test_a_moe_model_in_a_sweep_runs_its_step_per_point(tmp_path):
    import csv

    from parosim.sweep.runner import run_sweep

    spec = sweep_from_dict({"name": "moe", "kind": "step", "mode": "analytic",
                            "grid": {"model": ["mixtral-8x7b"]},
                            "fixed": {"cluster": "dgx-h100-ib", "nodes": 2, "strategy": "NIG",
                                      "micro_batch": 1, "accum": 4, "seq_len": 1024}})
    run_sweep(spec, tmp_path / "out", workers=1, progress=False, figures=False)
    rows = list(csv.DictReader((tmp_path / "out" / "results.csv").open()))
    # EP 1 on 16 H100s: every GPU holds all 8 experts' states, which do not fit
    assert [r["status"] for r in rows] == ["does-not-fit"]
    assert float(rows[0]["shortfall_bytes"]) > 0 and rows[0]["fits"] == "False"
    assert rows[0]["ep"] == "1" and rows[0]["edp"] == "16"


def test_every_documented_key_parses_in_a_spec(tmp_path):
    """Each step key with a valid value goes through the parser (no key is documented but
    refused)."""
    value = {"mode": "analytic", "model": "llama-7b", "cluster": "dgx-a100-ib", "nodes": 1,
             "group_nodes": 1, "strategy": "NIG", "algo": "ring", "trainable_ratio": "full",
             "micro_batch": 1, "accum": 1, "seq_len": 512, "nic_bandwidth": "200Gbps",
             "intra_bandwidth": "2400Gbps", "gpu_memory": "80GB", "recompute": "selective",
             "runtime": "ideal", "overlap_slowdown": 1.1, "precision": "bf16",
             "global_batch": "4Mtok", "efficiency": 0.5, "compute_model": "kernel",
             "attention": "flash", "memory_model": "korthikanti", "logit_bytes": 4, "seed": 0,
             "repeats": 1, "jitter_cv": 0.0,
             "deepspeed_config": str(tmp_path / "ds.json"),
             "tp": 2, "pp": 1, "cp": 1, "sequence_parallel": True, "tp_comm_overlap": False,
             "dp_comm_overlap": False, "pp_schedule": "1f1b", "virtual_stages": 2,
             "tp_algo": "ring", "ep": 2, "expert_strategy": "GGG", "a2a_algo": "deepep-ll",
             "routing": "skew", "max_over_mean": 2.0, "zipf": 1.2}
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 3}}')
    for key in _doc_keys("step"):
        if value.get(key) is None:
            continue
        fixed = {"model": "llama-7b"} if key != "model" else {}
        sweep_from_dict({"kind": "step", "grid": {key: [value[key]]}, "fixed": fixed})


def test_zip_and_points_errors_are_one_line():
    import pytest

    from parosim.errors import InputError

    base = {"kind": "step", "fixed": {"model": "llama-7b"}}
    with pytest.raises(InputError, match="lists have different lengths"):
        sweep_from_dict({**base, "grid": {"zip": {"nodes": [1, 2], "global_batch": [8]}}})
    with pytest.raises(InputError, match="in both"):
        sweep_from_dict({**base, "grid": {"nodes": [1], "zip": {"nodes": [2]}}})
    with pytest.raises(InputError, match="in both"):
        sweep_from_dict({**base, "grid": {"nodes": [1]}, "points": [{"nodes": 2}]})
    with pytest.raises(InputError, match="unknown key 'bogus'"):
        sweep_from_dict({**base, "points": [{"strategy": "GGG", "bogus": 1}]})
    spec = sweep_from_dict({**base, "grid": {"zip": {"nodes": [1, 2], "accum": [3, 4]},
                                             "seq_len": [128, 256]},
                            "points": [{"strategy": "GGG"}, {"strategy": "NNG", "tp": 2}]})
    pts = spec.points()
    assert len(pts) == 2 * 2 * 2
    assert [(p["nodes"], p["accum"]) for p in pts[::4]] == [(1, 3), (2, 4)]
    assert [p["seq_len"] for p in pts[:4]] == [128, 128, 256, 256]
    assert pts[1]["tp"] == 2 and "tp" not in pts[0]
    assert {"tp", "strategy", "nodes", "accum", "seq_len"} <= spec.input_keys()
