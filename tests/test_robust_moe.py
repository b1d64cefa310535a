"""Mixture-of-experts commands never ignore a flag: a layout flag a MoE step without --tp /
--pp cannot honour is refused in one line (exit 2), as the dense path refuses it, and a value
outside its domain is refused, never replaced by a default (``--ep 0`` is not "unset")."""

from __future__ import annotations

import json

import pytest
from cli_harness import ERR, OK, check_err, run_case

MOE = ["--model", "mixtral-8x7b", "--cluster", "dgx-h100-ib", "--nodes", "2", "--ep", "8",
       "--seq-len", "512", "--micro-batch", "1", "--accum", "1", "--mode", "analytic"]
SIM = ["simulate", *MOE, "--strategy", "GGG", "--expert-strategy", "GGG"]

CASES = [
    ("sim-ok", SIM, OK()),
    ("sim-virtual-stages", [*SIM, "--virtual-stages", "2"], ERR("--virtual-stages 2")),
    ("sim-interleaved", [*SIM, "--pp-schedule", "interleaved"], ERR("--pp-schedule")),
    ("sim-sequence-parallel", [*SIM, "--sequence-parallel"], ERR("--sequence-parallel")),
    ("sim-tp-comm-overlap", [*SIM, "--tp-comm-overlap"], ERR("--tp-comm-overlap")),
    ("sim-dp-comm-overlap", [*SIM, "--dp-comm-overlap"], ERR("--dp-comm-overlap")),
    ("sim-selective", [*SIM, "--recompute", "selective"], ERR("--recompute selective")),
    ("sim-tp-algo", [*SIM, "--tp-algo", "ring"], ERR("--tp-algo ring")),
    ("sim-ep-0", [*SIM, "--ep", "0"], ERR("--ep = 0")),
    ("sim-ep-0-tp", [*SIM, "--ep", "0", "--tp", "2", "--sequence-parallel"], ERR("--")),
    ("compare-ep-0", ["compare", *MOE, "--ep", "0"], ERR("--ep = 0")),
    ("compare-selective", ["compare", *MOE, "--recompute", "selective"],
     ERR("--recompute selective")),
    ("memory-ep-0", ["memory", "--model", "qwen3-30b-a3b", "--ep", "0"], ERR("--ep = 0")),
    ("memory-sequence-parallel", ["memory", "--model", "mixtral-8x7b", "--ep", "8",
                                  "--sequence-parallel"], ERR("--sequence-parallel")),
    ("experts-seed-neg", ["experts", "--model", "mixtral-8x7b", "--ep", "8", "--routing",
                          "uniform", "--seed", "-1"], ERR("--seed = -1")),
    ("sim-routing-seed-neg", [*SIM, "--routing", "uniform", "--seed", "-5"], ERR("--seed = -5")),
]


@pytest.mark.parametrize("argv,want", [(c[1], c[2]) for c in CASES], ids=[c[0] for c in CASES])
def test_moe_flags_refused_or_honoured(argv, want, capsys):
    rc, out, err = run_case(argv, capsys)
    if want[0] == "ok":
        assert rc == 0 and "Traceback" not in err, err
    else:
        check_err(rc, out, err, want[1])


def test_explicit_ep_1_equals_unset(capsys):
    """``--ep 1`` is the default spelled out: the same step as no ``--ep``."""
    base = [a for a in SIM if a not in ("--ep", "8")]
    outs = []
    for extra in ([], ["--ep", "1"]):
        rc, out, err = run_case([*base, *extra, "--strategy", "GGG", "--json"], capsys)
        assert rc == 0, err
        outs.append(json.loads(out))
    assert outs[0]["step_time_s"] == outs[1]["step_time_s"]
    assert outs[0]["settings"]["ep"] == outs[1]["settings"]["ep"] == 1
