"""Sweep points with a mixture-of-experts model (docs/sweeps.md, "Mixture-of-experts points"):
the MoE keys parse and are checked like the others, a point runs the step of ``parosim
simulate`` (its row holds the numbers ``simulate --json`` prints for the same inputs), a point
the command line refuses records the command line's line, and the example
experiments/18_moe_sweep runs and reproduces its committed results bit for bit."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from cli_harness import run_case

from parosim.errors import InputError
from parosim.io.sweep import format_cell, load_sweep_spec, sweep_columns, sweep_from_dict
from parosim.simulate.point import (
    MOE_RESULT_COLUMNS,
    RESULT_COLUMNS,
    SIMULATE_DEFAULTS,
    run_point,
)
from parosim.sweep.runner import run_sweep

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "experiments" / "18_moe_sweep"
#: a small MoE point that fits: Mixtral 8x7B, EP 8 on 2 DGX H100 nodes, ZeRO-3 everywhere
BASE = {"kind": "step", "model": "mixtral-8x7b", "cluster": "dgx-h100-ib", "nodes": 2,
        "seq_len": 512, "micro_batch": 1, "accum": 2, "mode": "analytic", "strategy": "GGG",
        "ep": 8}
#: the closed form with TP / PP (its own flags: no strategy; sequence parallelism with TP)
CLOSED = {"kind": "step", "model": "mixtral-8x7b", "cluster": "dgx-h100-ib", "nodes": 4,
          "seq_len": 1024, "micro_batch": 1, "accum": 8, "mode": "analytic", "tp": 2,
          "pp": 2, "sequence_parallel": True, "ep": 8}
#: the columns whose values a MoE row takes from ``simulate --json``
FROM_JSON = (*(c for c in RESULT_COLUMNS[2:] if c != "warnings"), *MOE_RESULT_COLUMNS, "ep",
             "expert_strategy", "a2a_algo")


def _argv(point: dict) -> list[str]:
    """``parosim simulate`` flags of a sweep point."""
    out = []
    for k, v in point.items():
        if k == "kind":
            continue
        if k == "cluster_set":
            for item in v.split(";"):
                out += ["--set", item.strip()]
        elif v is True:
            out.append(f"--{k.replace('_', '-')}")
        elif v is not False:
            out += [f"--{k.replace('_', '-')}", str(v)]
    return out


def _simulate(point: dict, capsys) -> tuple[int, dict | str]:
    """(exit code, ``simulate --json`` result or the error line) of the point's flags."""
    rc, out, err = run_case(["simulate", *_argv(point), "--json"], capsys)
    if rc:
        assert "Traceback" not in err
        return rc, err.strip().removeprefix("parosim: error: ")
    return rc, json.loads(out)


def _expected(d: dict, column: str):
    """A result column's value in ``simulate --json``'s output (None: not there)."""
    if column == "a2a_exposed_s":
        return d.get("stage_microbatch_s", {}).get("a2a_s")
    if column in d:
        return d[column]
    return d.get("memory", {}).get(column)


def _assert_row_is_the_cli(point: dict, capsys) -> dict:
    row = run_point(point)
    rc, d = _simulate(point, capsys)
    assert rc == 0, d
    assert row["status"] == ("ok" if d.get("fits", True) else "does-not-fit"), row["reason"]
    filled = 0
    for c in FROM_JSON:
        want = _expected(d, c)
        assert row[c] == want, (c, row[c], want)
        filled += want is not None
    assert filled >= 8          # the comparison is not of empty cells
    # the cautions: simulate's JSON list, joined in one cell
    assert row["warnings"] == " | ".join(w for w in d.get("warnings", [])
                                         if "percentile" not in w)
    return row


# ---------------------------------------------------------------------------------------------
# Keys.
# ---------------------------------------------------------------------------------------------


def test_simulate_defaults_are_the_parsers():
    """A point read as flags starts from the command line's own defaults."""
    from parosim.cli.parser import build_parser

    sub = build_parser("simulate")._subparsers._group_actions[0].choices["simulate"]
    parser = {a.dest: a.default for a in sub._actions if a.dest != "help"}
    assert SIMULATE_DEFAULTS == parser


def test_moe_keys_parse_and_bad_values_are_one_line():
    spec = sweep_from_dict({"kind": "step", "fixed": {"model": "mixtral-8x7b"},
                            "grid": {"ep": [1, 8], "expert_strategy": ["GGG", "zero3"],
                                     "a2a_algo": ["p2p", "hiera2a", "deepep-ll"],
                                     "routing": ["skew"], "max_over_mean": [1.5],
                                     "zipf": [0]}})
    assert len(spec.points()) == 12 and spec.has_moe()
    for key, bad, needle in (("ep", 0, "ep = 0 must be a positive integer"),
                             ("ep", 1.5, "ep = 1.5 must be a positive integer"),
                             ("expert_strategy", "XYZ",
                              "expert_strategy: strategy 'XYZ' is not known"),
                             ("a2a_algo", "ring", "a2a_algo 'ring' is not an all-to-all"),
                             ("routing", "hot", "routing 'hot' is not known"),
                             ("max_over_mean", 0.5, "max_over_mean 0.5 must be a number >= 1"),
                             ("zipf", -1, "zipf -1 must be a non-negative exponent"),
                             ("zipf", True, "zipf True")):
        with pytest.raises(InputError, match=needle) as e:
            sweep_from_dict({"kind": "step", "fixed": {"model": "mixtral-8x7b"},
                             "grid": {key: [bad]}})
        assert "\n" not in str(e.value)


def test_a_dense_sweep_keeps_its_columns_and_a_mixed_one_adds_the_moe_columns():
    dense = sweep_from_dict({"kind": "step", "grid": {"model": ["llama-7b"]}})
    mixed = sweep_from_dict({"kind": "step", "grid": {"model": ["llama-7b", "mixtral-8x7b"]}})
    assert not dense.has_moe() and mixed.has_moe()
    plain = list(sweep_columns("step", dense.input_keys(), dense.has_moe()))
    assert plain == list(sweep_columns("step", dense.input_keys()))
    assert not set(MOE_RESULT_COLUMNS) & set(plain) and "ep" not in plain
    cols = list(sweep_columns("step", mixed.input_keys(), True))
    assert cols[:cols.index("status")][-6:] == ["ep", "expert_strategy", "a2a_algo",
                                                "routing", "max_over_mean", "zipf"]
    assert cols[-len(MOE_RESULT_COLUMNS):] == list(MOE_RESULT_COLUMNS)
    assert [c for c in cols if c in plain] == plain     # the dense columns, in their order


def test_the_a2a_and_routing_names_are_the_models():
    from parosim.evaluate.moe_layer import Routing
    from parosim.plan.moe_step import A2A_CHOICES
    from parosim.spec.collective import A2A_ALGO_NAMES
    from parosim.spec.moe import ROUTINGS

    assert A2A_ALGO_NAMES == tuple(a.value for a in A2A_CHOICES)
    for kind in ROUTINGS:
        Routing(kind)
    with pytest.raises(InputError, match="--routing 'hot' is not known"):
        Routing("hot")


# ---------------------------------------------------------------------------------------------
# Rows: the command line's numbers and refusals.
# ---------------------------------------------------------------------------------------------


def test_an_ep_dp_row_is_simulates_json(capsys):
    row = _assert_row_is_the_cli(BASE, capsys)
    assert (row["ep"], row["edp"], row["expert_strategy"], row["a2a_algo"]) == (
        8, 2, "PaRO-GGG", "p2p")
    assert row["fits"] is True and row["step_time_s"] > 0 and row["a2a_per_step"] > 0
    # the deterministic step has no routing statistics and no closed-form columns
    assert row["step_time_p50_s"] is None and row["a2a_exposed_s"] is None


def test_a_routing_row_with_a_seed_is_simulates_json(capsys):
    point = {**BASE, "routing": "zipf", "zipf": 1.2, "repeats": 3, "seed": 7,
             "expert_strategy": "NNG", "a2a_algo": "deepep-normal", "accum": 1}
    row = _assert_row_is_the_cli(point, capsys)
    assert row["step_time_p50_s"] > 0 and row["balanced_step_s"] > 0
    assert row["imbalance_cost"] == row["step_time_s"] / row["balanced_step_s"] - 1
    other = run_point({**point, "seed": 8})
    assert other["step_time_s"] != row["step_time_s"]       # the seed draws other loads


def test_a_tp_pp_row_is_simulates_closed_form(capsys):
    row = _assert_row_is_the_cli(CLOSED, capsys)
    assert row["status"] == "ok" and row["fits"] is None and row["total_bytes"] is None
    assert row["micro_batches"] == 8 and 0 < row["bubble_fraction"] < 1
    assert row["a2a_exposed_s"] > 0 and row["tokens_per_s_per_gpu"] > 0


def test_an_engine_row_is_simulates_json(capsys):
    _assert_row_is_the_cli({**BASE, "mode": "engine", "accum": 1}, capsys)


_EP = [{"runtime": "deepspeed"}, {"runtime": "ideal"}, {"jitter_cv": 0.1},
       {"recompute": "selective"}, {"sequence_parallel": True}, {"tp_algo": "ring"},
       {"cp": 2}, {"pp_schedule": "interleaved"}, {"repeats": 3}, {"ep": 16}]
_TP_PP = [{"sequence_parallel": False}, {"mode": "engine"}, {"strategy": "GGG"},
          {"routing": "skew"}, {"recompute": "full"}, {"jitter_cv": 0.1},
          {"fidelity": "paper"}, {"a2a_algo": "deepep-normal"}, {"tp": 3}]


@pytest.mark.parametrize("base,extra", [(BASE, e) for e in _EP] + [(CLOSED, e) for e in _TP_PP])
def test_a_point_simulate_refuses_records_its_line(base, extra, capsys):
    point = {**base, **extra}
    row = run_point(point)
    rc, line = _simulate(point, capsys)
    assert rc == 2 and row["status"] == "error"
    assert row["reason"] == line
    assert row["step_time_s"] is None and row["edp"] is None


def test_a_moe_key_on_a_dense_model_is_simulates_line(capsys):
    point = {"kind": "step", "model": "llama-7b", "mode": "analytic", "nodes": 1,
             "a2a_algo": "deepep-ll"}
    row = run_point(point)
    rc, line = _simulate(point, capsys)
    assert rc == 2 and row["status"] == "error" and row["reason"] == line
    assert line == "--a2a-algo is for mixture-of-experts models; model 'llama-7b' is dense"
    # the command line cannot tell --zipf from its default; a sweep point can
    row = run_point({**point, "a2a_algo": None, "zipf": 2.0})
    assert row["reason"] == "--zipf is for mixture-of-experts models; model 'llama-7b' is dense"


def test_routing_parameters_without_their_routing_are_refused():
    row = run_point({**BASE, "max_over_mean": 2.0})
    assert row["status"] == "error"
    assert row["reason"] == ("max_over_mean = 2.0 shapes routing skew only; got routing None; "
                             "expected routing skew or no max_over_mean")
    assert run_point({**BASE, "routing": "skew", "zipf": 1.5})["status"] == "error"
    assert run_point({**BASE, "routing": "skew", "max_over_mean": 2.0})["status"] == "ok"


def test_a_point_that_does_not_fit_has_its_memory_columns():
    row = run_point({**BASE, "ep": 1, "strategy": "NNN", "accum": 1})
    assert row["status"] == "does-not-fit" and row["fits"] is False
    assert row["shortfall_bytes"] > 0 and row["total_bytes"] > row["capacity_bytes"]
    assert row["reason"] == f"lacks {row['shortfall_bytes']:.0f} bytes of memory"
    assert row["step_time_s"] is None and row["ep"] == 1 and row["edp"] == 16


# ---------------------------------------------------------------------------------------------
# Whole sweeps.
# ---------------------------------------------------------------------------------------------


def _rows(path: Path) -> list[dict]:
    return list(csv.DictReader(path.open()))


def test_the_example_runs_reproduces_its_results_and_equals_simulate(tmp_path, capsys):
    spec = load_sweep_spec(EXAMPLE / "sweep.yaml")
    nodes = {p["nodes"] for p in spec.points()}
    assert spec.has_moe() and nodes == {2, 4, 8} and spec.mode == "analytic"
    s = run_sweep(spec, tmp_path / "out", workers=1, progress=False, figures=False)
    assert s["ok"] == s["points"] == 12 and s["wall_s"] < 60
    new = (tmp_path / "out" / "results.csv").read_bytes()
    assert new == (EXAMPLE / "out" / "results.csv").read_bytes()
    assert ((tmp_path / "out" / "columns.md").read_text()
            == (EXAMPLE / "out" / "columns.md").read_text())
    row = next(r for r in _rows(tmp_path / "out" / "results.csv")
               if (r["nodes"], r["ep"], r["a2a_algo"]) == ("4", "16", "deepep-normal"))
    point = {k: v for k, v in spec.points()[0].items()}
    point.update(nodes=4, ep=16, a2a_algo="deepep-normal")
    rc, d = _simulate(point, capsys)
    assert rc == 0
    for c in FROM_JSON:
        assert row[c] == format_cell(_expected(d, c)), c


def test_a_seeded_routing_sweep_is_the_same_bit_for_bit(tmp_path):
    spec = sweep_from_dict({"name": "moe-routing", "kind": "step", "mode": "analytic",
                            "grid": {"routing": ["uniform", "skew"], "nodes": [2, 4]},
                            "fixed": {**{k: v for k, v in BASE.items()
                                         if k not in ("kind", "mode", "nodes")},
                                      "accum": 1, "repeats": 4, "seed": 3}})
    one = run_sweep(spec, tmp_path / "a", workers=1, progress=False, figures=False)
    two = run_sweep(spec, tmp_path / "b", workers=2, progress=False, figures=False)
    assert one["ok"] == two["ok"] == 4
    a, b = (tmp_path / "a" / "results.csv").read_bytes(), (tmp_path / "b" / "results.csv")
    assert a == b.read_bytes()
    rows = _rows(tmp_path / "a" / "results.csv")
    assert all(float(r["step_time_p99_s"]) >= float(r["step_time_p50_s"]) > 0 for r in rows)


def test_a_mixed_sweep_keeps_the_dense_rows_values(tmp_path):
    dense = {"model": "llama-7b", "cluster": "dgx-h100-ib", "nodes": 2, "strategy": "NIG",
             "micro_batch": 1, "accum": 2}
    only = sweep_from_dict({"kind": "step", "mode": "analytic", "grid": {"nodes": [2]},
                            "fixed": {k: v for k, v in dense.items() if k != "nodes"}})
    run_sweep(only, tmp_path / "dense", workers=1, progress=False, figures=False)
    mixed = sweep_from_dict({"kind": "step", "mode": "analytic",
                             "points": [{"model": "llama-7b"},
                                        {"model": "mixtral-8x7b", "ep": 8}],
                             "fixed": {k: v for k, v in dense.items() if k != "model"}})
    run_sweep(mixed, tmp_path / "mixed", workers=1, progress=False, figures=False)
    (d,), (m_dense, m_moe) = _rows(tmp_path / "dense" / "results.csv"), _rows(
        tmp_path / "mixed" / "results.csv")
    for c, v in d.items():
        if c != "point_id":
            assert m_dense[c] == v, c
    assert all(m_dense[c] == "" for c in MOE_RESULT_COLUMNS) and m_dense["ep"] == ""
    assert m_moe["status"] == "ok" and m_moe["edp"] == "2" and m_moe["ep"] == "8"
