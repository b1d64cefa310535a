"""Plan: the schedule of one step for every strategy, and its traffic by scope.

Closed forms here are written from docs/model.md independently of parosim/plan/dataparallel.py.
"""

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parosim.collectives.types import Op, Scope
from parosim.errors import InputError
from parosim.plan.dataparallel import (
    COMPUTE_KINDS,
    PURPOSES,
    STREAMS,
    CollectiveOp,
    ComputeOp,
    Plan,
    build_plan,
    plan_summary,
    plan_traffic,
)
from parosim.spec.model import ModelSpec, preset
from parosim.spec.strategy import ALL_STRATEGIES, parse_strategy
from parosim.spec.system import ClusterSpec
from parosim.spec.training import TrainingSpec

TINY = ModelSpec("tiny", layers=3, hidden=64, ffn_hidden=172, heads=4, vocab=100)
PAPER = ClusterSpec(nodes=4)        # n = 32, m = 8, ng = 4
AG, RS, AR = Op.ALL_GATHER, Op.REDUCE_SCATTER, Op.ALL_REDUCE
GL, IN, XG = Scope.GLOBAL, Scope.INTRA, Scope.INTER


def colls(plan, boundary=None, mb=None):
    out = [o for o in plan.ops if isinstance(o, CollectiveOp)]
    if boundary is True:
        out = [o for o in out if o.micro_step is None]
    if mb is not None:
        out = [o for o in out if o.micro_step == mb]
    return out


def kinds(ops):
    return Counter((o.op, o.scope) for o in ops)


# --- docs/model.md's worked examples -------------------------------------------------------------
UNITS = TINY.layers + 2          # embed, layers, head


@pytest.mark.parametrize("name, per_micro, boundary", [
    # NIG: intra reduce-scatter per micro-step; inter RS + global AG once per step.
    ("NIG", {(RS, IN): UNITS}, [(RS, XG), (AG, GL)]),
    # IIG: 2 intra AGs + intra RS per micro-step; inter RS + inter AG per step.
    ("IIG", {(AG, IN): 2 * UNITS, (RS, IN): UNITS}, [(RS, XG), (AG, XG)]),
    # IGG: 2 intra AGs + global RS per micro-step; inter AG per step.
    ("IGG", {(AG, IN): 2 * UNITS, (RS, GL): UNITS}, [(AG, XG)]),
    # ING: 2 intra AGs per micro-step; global RS + inter AG per step.
    ("ING", {(AG, IN): 2 * UNITS}, [(RS, GL), (AG, XG)]),
    # NNN: global all-reduce once; GGG: everything per micro-step.
    ("NNN", {}, [(AR, GL)]),
    ("GGG", {(AG, GL): 2 * UNITS, (RS, GL): UNITS}, []),
])
def test_paper_examples(name, per_micro, boundary):
    t = TrainingSpec(accum_steps=3)
    plan = build_plan(TINY, name, PAPER, t)
    for mb in range(3):
        assert kinds(colls(plan, mb=mb)) == Counter(per_micro)
    assert [(o.op, o.scope) for o in colls(plan, boundary=True)] == boundary
    psi_t = TINY.params
    for o in colls(plan, boundary=True):
        assert o.size_bytes == (2 * psi_t / 8 if o.scope is XG else 2 * psi_t)


def test_boundary_order_sync_grad_optimizer_sync_param():
    plan = build_plan(TINY, "NIG", PAPER, TrainingSpec(accum_steps=2))
    tail = [o for o in plan.ops if o.micro_step is None]
    assert [getattr(o, "purpose", getattr(o, "kind", None)) for o in tail] == \
        ["sync-grad", "optimizer", "sync-param"]
    sg, opt, sp = tail
    assert sg.stream == "comm-grad" and sp.stream == "comm-param"
    assert sg.id in opt.deps and opt.id in sp.deps
    last_rs = [o for o in colls(plan) if o.purpose == "grad-reduce"][-1]
    assert last_rs.id in sg.deps


# --- structure --------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", ALL_STRATEGIES, ids=lambda s: s.short)
def test_plan_is_well_formed(strategy):
    t = TrainingSpec(accum_steps=2, recompute=True)
    plan = build_plan(TINY, strategy, PAPER, t)
    assert isinstance(plan, Plan) and plan.strategy == strategy
    assert plan.tokens_per_step == 4 * 512 * 2 * 32
    for i, o in enumerate(plan.ops):
        assert o.id == i
        assert all(d < i for d in o.deps)
        assert o.stream in STREAMS
        if isinstance(o, ComputeOp):
            assert o.kind in COMPUTE_KINDS and o.stream == "compute" and o.duration_s >= 0
        else:
            assert o.purpose in PURPOSES and o.size_bytes > 0
            assert o.stream == ("comm-param" if o.op is AG else "comm-grad")
    c = Counter(o.kind for o in plan.ops if isinstance(o, ComputeOp))
    assert c == {"fwd": 6, "bwd": 6, "recompute": 6, "head-fwd": 2, "head-bwd": 2,
                 "embed-fwd": 2, "embed-bwd": 2, "optimizer": 1}
    assert build_plan(TINY, strategy, PAPER, t) == plan          # deterministic


def test_compute_order_forward_then_backward_with_recompute():
    plan = build_plan(TINY, "GGG", PAPER, TrainingSpec(accum_steps=1, recompute=True))
    names = [o.name for o in plan.ops if isinstance(o, ComputeOp)]
    assert names == ["fwd embed mb0", "fwd L0 mb0", "fwd L1 mb0", "fwd L2 mb0", "fwd head mb0",
                     "bwd head mb0", "recompute L2 mb0", "bwd L2 mb0", "recompute L1 mb0",
                     "bwd L1 mb0", "recompute L0 mb0", "bwd L0 mb0", "bwd embed mb0",
                     "optimizer step"]


def test_one_unit_ahead_prefetch():
    plan = build_plan(TINY, "IIG", PAPER, TrainingSpec(accum_steps=2))
    gathers = [o for o in colls(plan) if o.purpose == "param-gather"]
    users = [o for o in plan.ops if isinstance(o, ComputeOp) and o.kind != "optimizer"]
    assert len(gathers) == len(users)
    for j, (g, u) in enumerate(zip(gathers, users, strict=True)):
        assert g.id in u.deps                                   # a unit waits for its params
        assert g.deps == ((users[j - 2].id,) if j >= 2 else ())  # reuse the buffer of j-2
        assert g.size_bytes == 2 * {"embed": TINY.embedding_params,
                                    "head": TINY.head_params}.get(u.name.split()[1],
                                                                  TINY.layer_params)


def test_gradient_reduce_after_each_backward():
    plan = build_plan(TINY, "NGG", PAPER, TrainingSpec(accum_steps=1, trainable_ratio=0.5))
    for o in colls(plan):
        if o.purpose == "grad-reduce":
            producer = plan.ops[o.deps[0]]
            assert producer.kind.endswith("bwd") and producer.layer == o.layer
    rs = [o for o in colls(plan) if o.purpose == "grad-reduce"]
    assert sum(o.size_bytes for o in rs) == pytest.approx(2 * TINY.params * 0.5)


def test_single_group_has_no_inter_ops_and_single_gpu_no_collectives():
    one_node = build_plan(TINY, "IIG", ClusterSpec(nodes=1), TrainingSpec(accum_steps=1))
    assert all(o.scope is not XG for o in colls(one_node))
    alone = build_plan(TINY, "GGG", ClusterSpec(nodes=1, gpus_per_node=1), TrainingSpec())
    assert colls(alone) == []


def test_shape_needed_and_bad_strategy():
    with pytest.raises(InputError, match="shape"):
        build_plan(ModelSpec("x", params=1e9), "NNN", PAPER, TrainingSpec())
    with pytest.raises(InputError, match="invalid"):
        build_plan(TINY, "NGI", PAPER, TrainingSpec())


def test_summary_mentions_strategy_and_traffic():
    text = plan_summary(build_plan(TINY, "NIG", PAPER, TrainingSpec()))
    assert "PaRO-NIG" in text and "intra" in text and str(build_plan(
        TINY, "NIG", PAPER, TrainingSpec())) == text


# --- traffic: closed form from docs/model.md ------------------------------------------------
def closed_form(short, psi, psi_t, n, m, s):
    """Bytes sent per GPU per step by scope, ring model, written from docs/model.md directly."""
    ng = n // m
    k = {"global": n, "intra": m, "inter": ng}
    out = {"global": 0.0, "intra": 0.0, "inter": 0.0}

    def send(scope, size, allreduce=False):
        out[scope] += (2 if allreduce else 1) * (k[scope] - 1) / k[scope] * size

    lvl_scope = {"I": "intra", "G": "global"}
    p, g, os = short
    for _ in range(s):
        if p != "N":                                   # AG in forward and again in backward
            send(lvl_scope[p], 2 * psi)
            send(lvl_scope[p], 2 * psi)
        if g != "N":                                   # RS after backward
            send(lvl_scope[g], 2 * psi_t)
    sync_g = {  # (g, os): gradients to the optimizer partition
        "NN": [("global", 2 * psi_t, True)],
        "NI": [("intra", 2 * psi_t, False), ("inter", 2 * psi_t / m, True)],
        "NG": [("global", 2 * psi_t, False)],
        "II": [("inter", 2 * psi_t / m, True)],
        "IG": [("inter", 2 * psi_t / m, False)],
        "GG": [],
    }[g + os]
    sync_p = {"NN": [], "II": [], "GG": [],  # (os, p): parameters back to p's partition
              "IN": [("intra", 2 * psi_t)], "GN": [("global", 2 * psi_t)],
              "GI": [("inter", 2 * psi_t / m)]}[os + p]
    for scope, size, allreduce in sync_g:
        send(scope, size, allreduce)
    for scope, size in sync_p:
        send(scope, size)
    return out


@pytest.mark.parametrize("strategy", ALL_STRATEGIES, ids=lambda s: s.short)
@pytest.mark.parametrize("s", [1, 10])
@pytest.mark.parametrize("r", [1.0, 1 / 16])
def test_traffic_matches_closed_form(strategy, s, r):
    plan = build_plan(TINY, strategy, PAPER, TrainingSpec(accum_steps=s, trainable_ratio=r))
    got = plan_traffic(plan)
    want = closed_form(strategy.short, TINY.params, TINY.params * r, 32, 8, s)
    assert got.keys() == want.keys()
    for scope in want:
        assert got[scope] == pytest.approx(want[scope], rel=1e-12, abs=1e-6)


def test_traffic_llama_7b_paper_cluster():
    m = preset("llama-7b")
    got = plan_traffic(build_plan(m, "NIG", PAPER, TrainingSpec()))
    assert got == pytest.approx(closed_form("NIG", m.params, m.params, 32, 8, 10))


def test_zero3_moves_1_5x_ddp():
    t = TrainingSpec(accum_steps=1)
    ggg = sum(plan_traffic(build_plan(TINY, "GGG", PAPER, t)).values())
    nnn = sum(plan_traffic(build_plan(TINY, "NNN", PAPER, t)).values())
    assert ggg == pytest.approx(1.5 * nnn, rel=1e-12)


def test_nig_inter_traffic_does_not_grow_with_accumulation():
    inter = [plan_traffic(build_plan(TINY, "NIG", PAPER, TrainingSpec(accum_steps=s)))["inter"]
             for s in (1, 4, 10)]
    intra = [plan_traffic(build_plan(TINY, "NIG", PAPER, TrainingSpec(accum_steps=s)))["intra"]
             for s in (1, 4, 10)]
    assert inter[0] > 0 and inter[0] == inter[1] == inter[2]
    assert intra[0] * 10 == pytest.approx(intra[2])


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(ALL_STRATEGIES), st.integers(1, 4), st.integers(0, 3),
       st.integers(1, 3), st.sampled_from([1.0, 1 / 16, 3 / 1000]))
def test_traffic_properties(strategy, nodes, gpn_exp, s, r):
    cluster = ClusterSpec(nodes=nodes, gpus_per_node=2 ** gpn_exp)
    n, m = cluster.gpus, cluster.group_size
    plan = build_plan(TINY, strategy, cluster, TrainingSpec(accum_steps=s, trainable_ratio=r))
    got = plan_traffic(plan)
    assert all(v >= 0 for v in got.values())
    want = closed_form(strategy.short, TINY.params, TINY.params * r, n, m, s)
    assert sum(got.values()) == pytest.approx(sum(want.values()), rel=1e-9, abs=1e-6)
    # Conservation: reducing 2Ψ' gradients onto a 1/n optimizer shard sends (n-1)/n·2Ψ' per
    # GPU at s = 1 however the reduce-scatter is split into intra / inter / global pieces.
    if strategy.os.value == "G" and s == 1:
        grad = sum(o.op.ring_factor * (plan.scope_size(o.scope) - 1) / plan.scope_size(o.scope)
                   * o.size_bytes for o in colls(plan)
                   if o.purpose in ("grad-reduce", "sync-grad"))
        assert grad == pytest.approx((n - 1) / n * 2 * TINY.params * r, rel=1e-9, abs=1e-6)


def test_known_alias_plans_equal():
    assert build_plan(TINY, "zero3", PAPER, TrainingSpec()) == \
        build_plan(TINY, parse_strategy("PaRO-GGG"), PAPER, TrainingSpec())
