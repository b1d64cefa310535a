"""Expert parallelism (parosim.plan.experts, docs/moe.md "Expert parallelism"): Megatron-Core's
EP / ETP / EDP groups, expert states per GPU for each of the 14 levels applied to the experts
(by hand), the expert traffic formulas, one MoE layer's dispatch / combine bytes for
Mixtral-8x7B at EP 8 (by hand), and ``parosim experts``."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from parosim.cli.commands import main
from parosim.collectives.alltoall import lower_alltoall
from parosim.collectives.cost import program_time
from parosim.collectives.lowering import lower
from parosim.errors import InputError
from parosim.plan.experts import (
    ExpertLayout,
    dispatch_bytes,
    expert_params_per_gpu,
    expert_states_bytes,
    expert_traffic,
)
from parosim.spec.collective import Algo, Op, Scope
from parosim.spec.model import preset
from parosim.spec.moe import MoE
from parosim.spec.strategy import ALL_STRATEGIES, parse_strategy
from parosim.spec.system import ClusterSpec
from parosim.spec.training import TrainingSpec


@pytest.mark.parametrize("nodes,tp,cp,pp,ep,etp", [(2, 1, 1, 1, 8, 1), (4, 2, 1, 1, 4, 1),
                                                   (4, 2, 2, 2, 4, 2), (2, 4, 1, 1, 2, 2)])
def test_megatron_groups(nodes, tp, cp, pp, ep, etp):
    c = ClusterSpec(nodes=nodes, gpus_per_node=8)
    lay = ExpertLayout(c, experts=8, ep=ep, etp=etp, tp=tp, pp=pp, cp=cp)
    dp = c.gpus // (tp * cp * pp)
    assert lay.dp == dp and lay.edp == dp * cp * tp // (ep * etp)   # Megatron-Core's EDP
    for k in range(pp):
        stage = set(range(k * c.gpus // pp, (k + 1) * c.gpus // pp))
        for groups, size in ((lay.ep_groups(k), ep), (lay.edp_groups(k), lay.edp)):
            flat = [r for g in groups for r in g]
            assert sorted(flat) == sorted(stage) and all(len(g) == size for g in groups)
    # order "tp-ep-dp": ETP fastest, then EP, then EDP
    assert lay.ep_groups(0)[0] == tuple(e * etp for e in range(ep))
    assert lay.edp_groups(0)[0] == tuple(d * ep * etp for d in range(lay.edp))


def test_layout_refusals():
    c = ClusterSpec(nodes=2, gpus_per_node=8)
    with pytest.raises(InputError, match="--ep 3 does not divide the model's 8"):
        ExpertLayout(replace(c, nodes=3), experts=8, ep=3)
    with pytest.raises(InputError, match="does not divide the 16 GPUs of a pipeline stage"):
        ExpertLayout(c, experts=32, ep=32)


# 4 nodes x 8 GPUs, EP 2: EDP 16, of which 4 per node; N / I / G divide by 1 / 4 / 16
CL = ClusterSpec(nodes=4, gpus_per_node=8)
MODEL = preset("mixtral-8x7b")


def test_expert_states_for_each_of_the_14_levels_by_hand():
    lay = ExpertLayout(CL, experts=8, ep=2)
    assert (lay.edp, lay.m_edp) == (16, 4)
    psi = 32 * 8 * 3 * 4096 * 14336 / 2           # 32 MoE layers, 8 experts, EP 2
    assert expert_params_per_gpu(MODEL, lay) == psi
    div = {"N": 1, "I": 4, "G": 16}
    seen = set()
    for s in ALL_STRATEGIES:
        p, g, o = s.short
        hand = 2 * psi / div[p] + 2 * psi / div[g] + 12 * psi / div[o]
        assert expert_states_bytes(MODEL, s, lay) == pytest.approx(hand, rel=1e-12), s.short
        seen.add(s.short)
    assert len(seen) == 14
    # partly trainable: gradients and optimizer states of Ψ' = Ψ/16 only
    s = parse_strategy("IIG")
    assert expert_states_bytes(MODEL, s, lay, 1 / 16) == pytest.approx(
        2 * psi / 4 + 2 * psi / 16 / 4 + 12 * psi / 16 / 16)
    # bf16 optimizer states (TrainingSpec.optim_state_bytes: Adam m, v in bf16): 4 bytes
    ob = TrainingSpec(optimizer_dtype="bf16").optim_state_bytes
    assert expert_states_bytes(MODEL, s, lay, 1.0, ob) == pytest.approx(
        2 * psi / 4 + 2 * psi / 4 + 4 * psi / 16)


def test_with_ep_inside_a_node_the_intra_level_shards_nothing():
    lay = ExpertLayout(CL, experts=8, ep=8)   # one EDP rank per node
    assert lay.m_edp == 1 and lay.ep_nodes == 1
    assert expert_states_bytes(MODEL, parse_strategy("III"), lay) == expert_states_bytes(
        MODEL, parse_strategy("NNN"), lay)


def test_expert_traffic_formulas_by_hand():
    lay = ExpertLayout(CL, experts=8, ep=2)
    psi = expert_params_per_gpu(MODEL, lay)
    P = 2 * psi
    rows = {r["what"]: r for r in expert_traffic(MODEL, parse_strategy("IIG"), lay, 4)}
    ag = rows["expert params gather"]
    assert (ag["op"], ag["scope"], ag["ranks"], ag["calls"]) == ("all-gather", "intra", 4, 8)
    assert ag["bytes_per_gpu"] == pytest.approx(8 * 3 / 4 * P)
    rs = rows["expert grads reduce-scatter"]
    assert rs["bytes_per_gpu"] == pytest.approx(4 * 3 / 4 * P)
    sg, sp = rows["expert sync-grad"], rows["expert sync-param"]
    assert (sg["op"], sg["scope"], sg["ranks"]) == ("reduce-scatter", "inter", 4)
    assert sg["bytes_per_gpu"] == pytest.approx(3 / 4 * P / 4)
    assert (sp["op"], sp["scope"]) == ("all-gather", "inter")
    assert sp["bytes_per_gpu"] == pytest.approx(3 / 4 * P / 4)
    # DDP of the experts: one all-reduce over the 16 EDP ranks per step
    ddp = expert_traffic(MODEL, parse_strategy("NNN"), lay, 4)
    assert [(r["op"], r["scope"], r["ranks"]) for r in ddp] == [("all-reduce", "global", 16)]
    assert ddp[0]["bytes_per_gpu"] == pytest.approx(2 * 15 / 16 * P)


def test_mixtral_8x7b_dispatch_and_combine_bytes_at_ep_8_by_hand():
    lay = ExpertLayout(ClusterSpec(nodes=1, gpus_per_node=8), experts=8, ep=8)
    t = TrainingSpec(micro_batch=1, seq_len=4096)
    d = dispatch_bytes(MODEL, t, lay)
    # 4096 tokens x top-2 x hidden 4096 x 2 bytes (bf16) = 64 MiB sent by each rank; 7/8 of
    # it to the other 7 ranks; the combine returns the same, and backward repeats both
    assert d["a2a_size_bytes"] == 4096 * 2 * 4096 * 2 == 64 * 2**20
    assert d["remote_bytes"] == 56 * 2**20 and d["all_to_alls_per_layer"] == 4
    capped = replace(MODEL, moe=replace(MODEL.moe, capacity_factor=1.25), params=None)
    dc = dispatch_bytes(capped, t, lay)
    assert dc["rows"] == 8 * math.ceil(1.25 * 4096 * 2 / 8) == 10240
    # the EP group is the node: its all-to-all is the intra-scope one
    spec = ClusterSpec(nodes=1, gpus_per_node=8)
    groups = [list(g) for g in lay.ep_groups(0)]
    assert program_time(spec, lower_alltoall(spec, Scope.GLOBAL, 64 * 2**20, Algo.P2P,
                                             groups)) == pytest.approx(
        program_time(spec, lower(spec, Op.ALL_TO_ALL, Scope.INTRA, 64 * 2**20, Algo.P2P)))
    with pytest.raises(InputError, match="--etp 2"):
        dispatch_bytes(MODEL, t, ExpertLayout(spec, experts=8, ep=4, etp=2))
    assert isinstance(MODEL.moe, MoE)


def test_experts_command(capsys):
    assert main(["experts", "--model", "mixtral-8x7b", "--cluster", "dgx-h100-ib", "--nodes",
                 "4", "--ep", "2", "--expert-strategy", "IIG", "--accum", "4", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["layout"]["edp"] == 16 and d["layout"]["m_edp"] == 4
    r = d["results"][0]
    assert r["expert_strategy"] == "PaRO-IIG"
    assert r["states_bytes"] == r["expert_states_bytes"] + r["dense_states_bytes"]
    assert d["dispatch"]["p2p_time_s"] > 0
    assert main(["experts", "--model", "mixtral-8x7b", "--nodes", "2", "--ep", "8"]) == 0
    out = capsys.readouterr().out
    assert "PaRO-GGG" in out and "dispatch" in out
    assert main(["experts", "--model", "llama-7b"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "llama-7b" in err
