"""DP communication overlap on the 3D path (Megatron-Core ``overlap_grad_reduce`` +
``overlap_param_gather``, ``--dp-comm-overlap``): refusals, bounds, a hand-computed step,
closed form == summary == engine, CLI settings echo, sweep key, calibrate column
(docs/parallelism.md, "DP communication overlap")."""

import csv
import json
from dataclasses import replace

import pytest

from parosim.cli.commands import main
from parosim.collectives.cost import program_time
from parosim.collectives.types import Algo, Op, Scope
from parosim.errors import InputError
from parosim.evaluate.threed import evaluate_3d, grad_chain_exposed, param_fill_exposed, summary_3d
from parosim.io import load_cluster
from parosim.plan.dataparallel import ComputeOp
from parosim.plan.layout import ParallelSpec, layout_for, lower_group
from parosim.plan.threed import GroupOp, build_plan_3d, dp_buckets
from parosim.simulate.step import simulate_3d, with_overrides
from parosim.spec.model import preset
from parosim.spec.strategy import parse_strategy
from parosim.spec.training import BYTES_PER_GRAD, TrainingSpec

M13 = preset("llama-13b")     # 40 layers, 314.6M parameters per layer
M7 = preset("llama-7b")


def _tr(m=4, rc=True, b=1):
    return TrainingSpec(micro_batch=b, accum_steps=m, seq_len=2048, recompute=rc)


# -- refusals ------------------------------------------------------------------------------

def test_refused_without_tp_or_pp():
    with pytest.raises(InputError, match="--dp-comm-overlap needs --tp >= 2 or --pp >= 2"):
        ParallelSpec(dp_comm_overlap=True)


@pytest.mark.parametrize("extra,msg", [
    ([], "the --runtime profile's"),
    (["--tp", "2", "--strategy", "NGG"], "strategy NGG gathers or reduces them per"),
    (["--pp", "2", "--strategy", "GGG"], "expected one of NNN, NNI, NNG"),
])
def test_cli_refusals_are_one_line(capsys, extra, msg):
    rc = main(["simulate", "--model", "llama-7b", "--cluster", "dgx-a100-ib", "--nodes", "2",
               "--dp-comm-overlap", "--mode", "analytic", *extra])
    err = capsys.readouterr().err
    assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1


def test_compare_keeps_the_strategies_it_applies_to(capsys):
    rc = main(["compare", "--model", "llama-7b", "--cluster", "dgx-a100-ib", "--nodes", "2",
               "--tp", "8", "--micro-batch", "1", "--accum", "2", "--algo", "ring",
               "--mode", "analytic", "--dp-comm-overlap", "--json"])
    assert rc == 0
    rows = json.loads(capsys.readouterr().out)["results"]
    assert sorted(r["strategy"] for r in rows) == ["PaRO-NNG", "PaRO-NNI", "PaRO-NNN"]
    assert all(r["dp_comm_overlap"] for r in rows)


# -- buckets -------------------------------------------------------------------------------

def test_buckets_follow_megatron():
    # 13B, t = 2: 157M parameters per layer per rank >= 40M: one layer per bucket
    b = dp_buckets(M13, ParallelSpec(tp=2, pp=2), 8)
    assert b[0] == [[i] for i in range(20, -1, -1)]          # embed + 20 layers, reversed
    # interleaved: a stage's second chunk is one bucket (disable_bucketing)
    b = dp_buckets(M13, ParallelSpec(tp=2, pp=2, schedule="interleaved"), 8)
    assert len(b[0]) == 11 and b[2] == [list(range(9, -1, -1))]
    # a DP group of 64: buckets of at least 64M parameters
    b = dp_buckets(M7, ParallelSpec(tp=4, pp=1), 64)
    assert all(len(x) >= 2 for x in b[0][:-1])


# -- bounds --------------------------------------------------------------------------------

def _no_dp_comm(plan):
    """The plan with its DP synchronisation removed (count 0: free in the closed form)."""
    ops = tuple(replace(o, count=0) if isinstance(o, GroupOp) and o.group == "dp"
                and o.micro_step is None else o for o in plan.ops)
    return replace(plan, ops=ops)


CASES = [  # nodes, tp, pp, schedule, strategy, nic
    (8, 4, 2, "1f1b", "NNN", None),
    (8, 4, 2, "1f1b", "NNG", None),
    (8, 4, 2, "interleaved", "NNG", None),
    (8, 2, 4, "1f1b", "NNI", None),
    (4, 8, 1, "1f1b", "NNG", "25Gbps"),
    (4, 4, 2, "interleaved", "NNN", "10Gbps"),
    (8, 4, 2, "1f1b", "NNG", "25Gbps"),
    (8, 4, 2, "interleaved", "NNG", "25Gbps"),
]


@pytest.mark.parametrize("nodes,tp,pp,sched,strat,nic", CASES)
def test_never_longer_never_shorter_than_free(nodes, tp, pp, sched, strat, nic):
    c = load_cluster("dgx-a100-ib", nodes)
    if nic:
        c = with_overrides(c, float(nic[:-4]) * 1e9 / 8, None, None)
    tr = _tr(m=pp if sched == "interleaved" else 1)
    on = ParallelSpec(tp=tp, pp=pp, schedule=sched, dp_comm_overlap=True)
    off = replace(on, dp_comm_overlap=False)
    for f in (1.0, 1.3):
        p_on, p_off = (build_plan_3d(M13, strat, c, tr, x) for x in (on, off))
        t_on, t_off, t_free = (evaluate_3d(p, c, Algo.RING, m=8, overlap_slowdown=f).step_time_s
                               for p in (p_on, p_off, _no_dp_comm(p_off)))
        assert t_free <= t_on + 1e-12 and t_on <= t_off + 1e-12
        assert t_on < t_off      # there is DP traffic to hide in each case
        # summary_3d (advise) is the same sum
        s = summary_3d(M13, parse_strategy(strat), c, replace(tr, accum_steps=8), on,
                       Algo.RING, True, f)
        assert s.step_time_s == pytest.approx(t_on, rel=1e-12)


def test_flag_off_builds_the_plan_unchanged():
    c = load_cluster("dgx-a100-ib", 4)
    par = ParallelSpec(tp=4, pp=2)
    plan = build_plan_3d(M13, "NNG", c, _tr(), par)
    assert plan.dp_grad_chains == () and plan.dp_param_chains == ()
    assert not any(o.purpose in ("grad-bucket", "param-bucket") for o in plan.ops
                   if isinstance(o, GroupOp))


# -- hand-computed -------------------------------------------------------------------------

def test_chain_formulas_by_hand():
    # reductions (0.3 s) shorter than each bucket's backward (1 s): only the last one shows
    assert grad_chain_exposed([(1.0, 0.3)] * 4) == pytest.approx(0.3)
    # longer (2.5 s): the first starts after 1 s of backward, then back to back:
    # 1 + 4 x 2.5 - 4 = 7 s exposed (the excess over the remaining backward)
    assert grad_chain_exposed([(1.0, 2.5)] * 4) == pytest.approx(7.0)
    # compute beside a reduction at 1/f (f = 2): bucket 2's 1 s of work while bucket 1's
    # 0.3 s reduction runs takes 0.3 + (1 - 0.15) = 1.15 s
    assert grad_chain_exposed([(1.0, 0.3), (1.0, 0.3)], 2.0) == pytest.approx(0.45)
    # gathers: the first exposed, the next prefetched beside the previous bucket
    assert param_fill_exposed([[(0.2, 1.0)] * 3], 1, 1) == pytest.approx(0.2)
    assert param_fill_exposed([[(1.5, 1.0)] * 3], 1, 1) == pytest.approx(1.5 + 2 * 0.5)


def _hand(nic_bps, b):
    """LLaMA-13B, TP 8 x DP 2 on two DGX A100 nodes, PaRO-NNN, m = 4 (closed form)."""
    c = load_cluster("dgx-a100-ib", 2)
    if nic_bps:
        c = with_overrides(c, nic_bps, None, None)
    tr = _tr(b=b)
    on = ParallelSpec(tp=8, dp_comm_overlap=True)
    r_on = simulate_3d(M13, c, "NNN", tr, on, "ring", "analytic")
    r_off = simulate_3d(M13, c, "NNN", tr, replace(on, dp_comm_overlap=False), "ring",
                        "analytic")
    lay = layout_for(c, 8, 1)
    gs = lay.dp_scopes(0)
    units = [M13.embedding_params] + [M13.layer_params] * 40 + [M13.head_params]

    def ar(params):   # one all-reduce of these parameters' bf16 gradients (per rank: / 8)
        return program_time(c, lower_group(c, Op.ALL_REDUCE, Scope.GLOBAL,
                                           BYTES_PER_GRAD * params / 8, Algo.RING, gs))

    buckets = dp_buckets(M13, on, 2)[0]
    r = [ar(sum(units[i] for i in b)) for b in buckets]
    whole = ar(sum(units))
    # the busy time of the last micro-batch's backward, bucket by bucket, from the plan
    plan = build_plan_3d(M13, "NNN", c, replace(tr, accum_steps=1), on)
    ops = plan.ops

    def busy(i):
        o = ops[i]
        if isinstance(o, ComputeOp):
            return o.duration_s
        return program_time(c, o.lower(c, Algo.RING)) * o.count

    w = [sum(busy(i) for i in ids) for ids, _, _ in plan.dp_grad_chains[0]]
    return r_on.step_time_s, r_off.step_time_s, whole, r, w, buckets


def test_hand_case_fast_network_only_last_bucket_exposed():
    on, off, whole, r, w, buckets = _hand(None, 2)     # micro-batch 2
    assert len(buckets) == 21 and buckets[0] == [41, 40] and buckets[-1] == [1, 0]
    # every reduction shorter than the next bucket's backward
    assert all(r[i] < w[i + 1] for i in range(len(r) - 1))
    # off: the whole all-reduce after the pipeline; on: only the last bucket's (embed + L0)
    assert off - on == pytest.approx(whole - r[-1], rel=1e-9)


def test_hand_case_slow_network_excess_exposed():
    on, off, whole, r, w, _ = _hand(10e9 / 8, 1)     # 10 Gbit/s NICs, micro-batch 1
    assert min(r) > max(w)            # every reduction longer than a bucket's backward
    # the first reduction starts after bucket 1's backward, then they run back to back:
    # exposed = w_1 + Σ r - Σ w
    assert off - on == pytest.approx(whole - (w[0] + sum(r) - sum(w)), rel=1e-9)


def test_hand_case_distributed_optimizer_first_gather_exposed():
    """NNG (reduce-scatter + all-gather per bucket), fast network: the last bucket's
    reduce-scatter shows; the gathers all start at the step's start, back to back, so bucket
    i's forward waits until max(G_i, W_{i-1}) (G_i: the first i gathers, W_{i-1}: the first
    i - 1 forwards after the first gather): exposed max_i (G_i - W_{i-1})."""
    c = load_cluster("dgx-a100-ib", 2)
    tr = _tr(b=2)
    on = ParallelSpec(tp=8, dp_comm_overlap=True)
    t_on, t_off = (simulate_3d(M13, c, "NNG", tr, x, "ring", "analytic").step_time_s
                   for x in (on, replace(on, dp_comm_overlap=False)))
    gs = layout_for(c, 8, 1).dp_scopes(0)

    def t(op, params):
        return program_time(c, lower_group(c, op, Scope.GLOBAL, BYTES_PER_GRAD * params / 8,
                                           Algo.RING, gs))

    units = [M13.embedding_params] + [M13.layer_params] * 40 + [M13.head_params]
    fwd = [sorted(b) for b in reversed(dp_buckets(M13, on, 2)[0])]   # forward order
    assert fwd[0] == [0, 1] and fwd[-1] == [40, 41]
    g = [t(Op.ALL_GATHER, sum(units[i] for i in b)) for b in fwd]
    plan = build_plan_3d(M13, "NNG", c, replace(tr, accum_steps=1), on)
    w = [sum(plan.ops[i].duration_s if isinstance(plan.ops[i], ComputeOp) else
             program_time(c, plan.ops[i].lower(c, Algo.RING)) * plan.ops[i].count
             for i in ids) for ids, _ in plan.dp_param_chains[0]]
    gathers = max(sum(g[:i + 1]) - sum(w[:i]) for i in range(len(g)))
    whole = sum(units)
    r_last = t(Op.REDUCE_SCATTER, units[0] + units[1])
    hidden = t(Op.REDUCE_SCATTER, whole) + t(Op.ALL_GATHER, whole) - r_last - gathers
    assert gathers > g[0]             # here a later gather shows a little too
    assert t_off - t_on == pytest.approx(hidden, rel=1e-9)


# -- engine vs closed form -----------------------------------------------------------------

ENGINE = [  # nodes, tp, pp, schedule, strategy, m, extra ParallelSpec / TrainingSpec fields
    (8, 8, 2, "1f1b", "NNN", 4, {}),
    (8, 4, 2, "1f1b", "NNG", 4, {}),
    (8, 4, 2, "interleaved", "NNG", 4, {}),
    (8, 2, 4, "1f1b", "NNI", 8, {}),
    (8, 4, 2, "1f1b", "NNG", 4, {"sequence_parallel": True, "tp_comm_overlap": True}),
    (8, 8, 1, "1f1b", "NNG", 2, {"overlap_slowdown": 1.3}),
    (8, 4, 2, "1f1b", "NNG", 4, {"overlap_slowdown": 1.3}),    # was +3.7 % (global gate)
    (8, 4, 2, "interleaved", "NNG", 4, {"overlap_slowdown": 1.3}),
]


@pytest.mark.parametrize("nodes,tp,pp,sched,strat,m,kw", ENGINE)
def test_engine_matches_closed_form(nodes, tp, pp, sched, strat, m, kw):
    c = load_cluster("dgx-a100-ib", nodes)
    kw = dict(kw)
    tr = replace(_tr(m=m), overlap_slowdown=kw.pop("overlap_slowdown", None))
    par = ParallelSpec(tp=tp, pp=pp, schedule=sched, dp_comm_overlap=True, **kw)
    a = simulate_3d(M13, c, strat, tr, par, "ring", "analytic")
    e = simulate_3d(M13, c, strat, tr, par, "ring", "engine")
    off = simulate_3d(M13, c, strat, tr, replace(par, dp_comm_overlap=False), "ring",
                      "analytic")
    assert e.step_time_s == pytest.approx(a.step_time_s, rel=0.01)
    assert a.step_time_s < off.step_time_s
    assert e.parallel["dp_comm_overlap"] is True
    assert e.bytes_inter == pytest.approx(a.bytes_inter, rel=1e-6)


# -- CLI echo, sweep, calibrate ------------------------------------------------------------

def test_settings_echo_json_and_text(capsys):
    argv = ["simulate", "--model", "llama-13b", "--cluster", "dgx-a100-ib", "--nodes", "2",
            "--tp", "8", "--dp-comm-overlap", "--micro-batch", "1", "--accum", "2",
            "--seq-len", "2048", "--strategy", "NNG", "--mode", "analytic"]
    assert main([*argv, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["settings"]["dp_comm_overlap"] is True and d["dp_comm_overlap"] is True
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "DP comm overlap on" in out and ", DP comm overlap" in out
    argv.remove("--dp-comm-overlap")
    assert main([*argv, "--json"]) == 0   # off by default
    d = json.loads(capsys.readouterr().out)
    assert d["settings"]["dp_comm_overlap"] is False and d["dp_comm_overlap"] is False


def test_sweep_key(tmp_path, capsys):
    spec = tmp_path / "s.yaml"
    spec.write_text("name: dpo\nkind: step\nmode: analytic\n"
                    "grid:\n  dp_comm_overlap: [false, true]\n"
                    "fixed:\n  model: llama-13b\n  cluster: dgx-a100-ib\n  nodes: 2\n"
                    "  strategy: NNG\n  algo: ring\n  micro_batch: 1\n  accum: 2\n"
                    "  seq_len: 2048\n  tp: 8\n"
                    "  fidelity: paper\n")   # the reference below: the closed forms
    assert main(["sweep", str(spec), "--out", str(tmp_path / "out"), "--no-progress"]) == 0
    rows = list(csv.DictReader(open(tmp_path / "out" / "results.csv")))
    assert [r["dp_comm_overlap"] for r in rows] == ["False", "True"]
    assert all(r["status"] == "ok" for r in rows)
    off, on = (float(r["step_time_s"]) for r in rows)
    c = load_cluster("dgx-a100-ib", 2)
    ref = simulate_3d(M13, c, "NNG", _tr(m=2, rc=None), ParallelSpec(tp=8, dp_comm_overlap=True),
                      "ring", "analytic")
    assert on == pytest.approx(ref.step_time_s, rel=1e-12) and on < off
    assert "dp_comm_overlap" in (tmp_path / "out" / "columns.md").read_text()
    spec.write_text(spec.read_text().replace("[false, true]", "[maybe]"))
    assert main(["sweep", str(spec), "--out", str(tmp_path / "o2"), "--no-progress"]) == 2
    assert "dp_comm_overlap = 'maybe' must be true or false" in capsys.readouterr().err
    spec.write_text(spec.read_text().replace("[maybe]", "[true]").replace("NNG", "NGG"))
    assert main(["sweep", str(spec), "--out", str(tmp_path / "o3"), "--no-progress"]) == 0
    row = next(csv.DictReader(open(tmp_path / "o3" / "results.csv")))
    assert row["status"] == "error" and "expected one of NNN, NNI, NNG" in row["reason"]


def test_calibrate_steps_column(tmp_path):
    from parosim.calibrate.steps import read_steps

    f = tmp_path / "steps.csv"
    head = "model,strategy,nodes,micro_batch,accum,seq_len,step_time_s,tp,dp_comm_overlap\n"
    f.write_text(head + "llama-13b,NNG,2,1,2,2048,0.5,8,on\n")
    run = read_steps(f)[0]
    assert run.dp_comm_overlap is True and run.is_3d
    f.write_text(head + "llama-13b,NNG,2,1,2,2048,0.5,8,maybe\n")
    with pytest.raises(InputError, match="dp_comm_overlap = 'maybe'; expected on or off"):
        read_steps(f)


def test_calibrate_steps_row_is_simulated_with_overlap(tmp_path):
    from parosim.calibrate.steps import read_steps, simulate_run

    f = tmp_path / "steps.csv"
    head = "model,strategy,nodes,micro_batch,accum,seq_len,step_time_s,tp,dp_comm_overlap\n"
    f.write_text(head + "llama-13b,NNG,2,1,2,2048,0.5,8,on\n"
                 "llama-13b,NNG,2,1,2,2048,0.5,8,off\n"
                 "llama-13b,NNG,2,1,2,2048,0.5,1,on\n")
    on, off, dp_only = read_steps(f)
    base = load_cluster("dgx-a100-ib")
    prof = replace(base.compute, model="kernel")
    assert simulate_run(on, base, prof) < simulate_run(off, base, prof)
    # no tp / pp: the row is refused with its line, never simulated without the overlap
    with pytest.raises(InputError, match="line 4: --dp-comm-overlap needs --tp >= 2"):
        simulate_run(dp_only, base, prof)


def test_advise_fixed_setting():
    from parosim.studies.advise import advise

    c = load_cluster("dgx-a100-ib", 2)
    kw = dict(top=40, engine_top=0, max_micro_batch=1, strategies=["NNN", "NGG"])
    res = advise(M13, c, 16, 2048, dp_comm_overlap=True, **kw)
    cands = res["candidates"]
    assert any(x["dp_comm_overlap"] for x in cands)
    for x in cands:   # Megatron-Core's DDP buckets: the ideal runtime's, not a framework's
        assert x["dp_comm_overlap"] == (x["strategy"] == "NNN" and (x["tp"] > 1 or x["pp"] > 1)
                                        and x["runtime"] == "ideal")
