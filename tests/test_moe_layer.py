"""One MoE layer on the engine with token imbalance (parosim.evaluate.moe_layer, docs/moe.md
"Token imbalance"): forced balance equals the deterministic layer exactly and the closed form
within 1 %, a max/mean load of 1.5 grows the layer as the critical path predicts, reruns are
bit-identical, the routing draws, and ``parosim experts --routing``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from parosim.cli.commands import main
from parosim.collectives.alltoall import lower_p2p
from parosim.collectives.cost import program_time
from parosim.errors import InputError
from parosim.evaluate.moe_layer import (
    Routing,
    expert_flops_per_row,
    layer_closed_form,
    layer_distribution,
    route,
    simulate_layer,
)
from parosim.io import load_cluster
from parosim.spec.collective import Scope
from parosim.spec.model import preset
from parosim.spec.training import TrainingSpec

M = preset("mixtral-8x7b")
T = TrainingSpec(micro_batch=1, seq_len=1024)
ROWS = 1024 * 2                      # tokens x top-2 per rank


@pytest.mark.parametrize("nodes", [1, 2])
def test_forced_balance_is_the_deterministic_layer_and_the_closed_form(nodes):
    spec = load_cluster("dgx-h100-ib", nodes)
    groups = [list(range(8 * nodes))]
    ep = 8 * nodes
    rng = np.random.default_rng(0)
    forced = simulate_layer(spec, M, groups, [route(Routing("balanced"), ep, 8 * nodes, ROWS,
                                                        rng)], T).time_s
    expected = np.full((ep, ep), ROWS // ep)            # the expected loads, no draw at all
    det = simulate_layer(spec, M, groups, [expected], T).time_s
    assert forced == det
    cf = layer_closed_form(spec, M, groups, ROWS, T)
    assert abs(det / cf - 1) < 0.01


def test_max_over_mean_of_1_5_follows_the_critical_path():
    spec = load_cluster("dgx-h100-ib", 1)
    groups = [list(range(8))]
    rows = 8192                      # 8192 x 1.5 / 8 = 1536 rows to the hot rank, exactly
    rng = np.random.default_rng(0)
    bal = simulate_layer(spec, M, groups, [route(Routing(), 8, 8, rows, rng)], T).time_s
    R = route(Routing("skew", 1.5), 8, 8, rows, rng)
    loads = R.sum(axis=0)
    assert loads.max() / loads.mean() == 1.5
    imb = simulate_layer(spec, M, groups, [R], T).time_s
    # hand: L = one all-to-all's latency part, C = 3 x the expert compute of the mean rank,
    # t = one balanced all-to-all's bandwidth part. The hot rank receives 1.5x in the
    # dispatch and the combine gradient and sends 1.5x in the combine and the dispatch
    # gradient, and computes 1.5x: 4 x 1.5 t + 4 L + 1.5 C (compute dominates, so the
    # others' transfers never overlap the hot rank's)
    lat = program_time(spec, lower_p2p(spec, Scope.GLOBAL, 8, groups=groups))
    comp = 3 * rows * expert_flops_per_row(M) / (spec.gpu.peak_flops * T.compute_efficiency)
    t = (bal - 4 * lat - comp) / 4
    assert imb == pytest.approx(6 * t + 4 * lat + 1.5 * comp, rel=1e-3)
    assert imb / bal > 1.45


def test_reruns_are_bit_identical_and_seeds_matter():
    spec = load_cluster("dgx-h100-ib", 1)
    groups = [list(range(8))]
    a = layer_distribution(spec, M, groups, ROWS, T, Routing("uniform", seed=3), 3)
    b = layer_distribution(spec, M, groups, ROWS, T, Routing("uniform", seed=3), 3)
    c = layer_distribution(spec, M, groups, ROWS, T, Routing("uniform", seed=4), 3)
    assert a == b and a["times_s"] != c["times_s"]
    assert a["mean_s"] >= a["balanced_s"] and a["imbalance_cost"] >= 0


def test_routing_draws():
    rng = np.random.default_rng(1)
    for kind in ("balanced", "uniform", "skew", "zipf"):
        R = route(Routing(kind, 2.0, 1.2), 8, 64, 4096, rng)
        assert R.shape == (8, 8) and (R.sum(axis=1) == 4096).all()
    z = route(Routing("zipf", zipf=1.2), 8, 64, 4096, rng).sum(axis=0)
    u = route(Routing("uniform"), 8, 64, 4096, rng).sum(axis=0)
    assert z.max() / z.mean() > u.max() / u.mean()
    for bad in (dict(kind="x"), dict(max_over_mean=0.5), dict(zipf=-1)):
        with pytest.raises(InputError):
            Routing(**bad)


def test_experts_routing_command(capsys):
    assert main(["experts", "--model", "mixtral-8x7b", "--nodes", "1", "--ep", "8",
                 "--expert-strategy", "NNG", "--seq-len", "1024", "--routing", "skew",
                 "--draws", "2", "--json"]) == 0
    y = json.loads(capsys.readouterr().out)["moe_layer"]
    assert y["routing"] == "skew" and len(y["times_s"]) == 2
    assert y["load_max_over_mean"][0] == pytest.approx(1.5, rel=0.01)
    assert y["imbalance_cost"] > 0.3
    assert main(["experts", "--model", "mixtral-8x7b", "--nodes", "1", "--ep", "1",
                 "--routing", "uniform"]) == 2
    assert "--routing needs --ep > 1" in capsys.readouterr().err


def test_distribution_plot(tmp_path, capsys):
    out = tmp_path / "layer.png"
    assert main(["experts", "--model", "mixtral-8x7b", "--nodes", "1", "--ep", "8",
                 "--expert-strategy", "NNG", "--seq-len", "512", "--routing", "uniform",
                 "--draws", "3", "--plot", str(out), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["plot"] == str(out) and out.stat().st_size > 1000
    assert out.read_bytes()[:4] == b"\x89PNG"
    assert main(["experts", "--model", "mixtral-8x7b", "--nodes", "1", "--ep", "8",
                 "--plot", str(out)]) == 2
    assert "goes with --routing" in capsys.readouterr().err
