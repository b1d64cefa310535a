"""Runtime profiles: each changes what its framework's documented behaviour says it should."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from parosim.cli.commands import main
from parosim.collectives.types import Algo, Op, Scope
from parosim.errors import InputError
from parosim.io import load_cluster
from parosim.io.runtime import deepspeed_config_runtime, load_runtime
from parosim.plan.dataparallel import CollectiveOp, ComputeOp, build_plan
from parosim.simulate.step import compare, simulate_step
from parosim.spec.model import preset
from parosim.spec.training import TrainingSpec, parse_trainable_ratio

GOLDEN = Path(__file__).parent / "data" / "ideal_runtime_golden.json"
CLUSTER = load_cluster("paper-a100-roce")
M7 = preset("llama-7b")


def _colls(plan, purpose=None):
    return [o for o in plan.ops if isinstance(o, CollectiveOp)
            and (purpose is None or o.purpose == purpose)]


@pytest.mark.parametrize("runtime", [None, "ideal"])
def test_ideal_runtime_reproduces_pre_runtime_numbers_exactly(runtime):
    """Pinned numbers (tests/data/ideal_runtime_golden.json, first recorded on main @7b5de80
    before runtime profiles existed, reproduced bit for bit; regenerated with
    tests/data/make_ideal_golden.py only when collective or compute costs change on purpose).
    The memory model of that time is ``memory_model="korthikanti"``."""
    for g in json.loads(GOLDEN.read_text()):
        t = TrainingSpec(trainable_ratio=parse_trainable_ratio(g["trainable_ratio"]),
                         accum_steps=g["accum"], memory_model="korthikanti")
        d = simulate_step(preset(g["model"]), CLUSTER, g["strategy"], t, g["algo"], g["mode"],
                          runtime=runtime).to_dict()
        for k in ("step_time_s", "exposed_comm_s", "bytes_inter"):
            assert d[k] == g[k], (g, k, d[k])
        assert d["memory"]["total_bytes"] == g["total_bytes"]


@pytest.mark.parametrize("strategy, ratio, recompute", [
    ("NIG", "full", None), ("GGG", "partial", True), ("IGG", "peft", None),
    ("NNN", "full", False), ("III", "full", True), ("GNG", "partial", None)])
def test_generic_runtime_builder_reduces_to_the_ideal_plan(strategy, ratio, recompute):
    """The runtime Plan builder, given the ideal profile's settings, emits exactly the ops
    of the ideal builder: every runtime is a change from the ideal schedule, nothing else."""
    from parosim.plan.runtime import build_runtime_plan
    from parosim.spec.runtime import IDEAL

    t = TrainingSpec(accum_steps=2, trainable_ratio=parse_trainable_ratio(ratio),
                     recompute=recompute)
    ideal = build_plan(M7, strategy, CLUSTER, t)
    forced = build_runtime_plan(M7, strategy, CLUSTER, t, IDEAL)
    strip = lambda ops: [o.__class__(**{**o.__dict__, "name": ""}) for o in ops]  # noqa: E731
    assert strip(forced.ops) == strip(ideal.ops)


def _intervals(records, pred):
    return [(r.start_s, r.end_s) for r in records if pred(r)]


def test_overlap_comm_false_exposes_every_zero2_reduce_scatter():
    """DeepSpeed ZeRO-2 with overlap_comm false (its 0.10.0 default for stage 2) reduces on
    the compute stream: no backward runs while a gradient bucket is reduced."""
    ds = load_runtime("deepspeed")
    assert ds.overlaps_grad_reduce(p_partitioned=False) is False      # the default
    t = TrainingSpec(accum_steps=2)
    r = simulate_step(M7, CLUSTER, "zero2", t, mode="engine", trace=True, runtime=ds)
    rs = _intervals(r.records, lambda x: x.kind == "grad-reduce")
    comp = _intervals(r.records, lambda x: x.lane == "compute")
    # 6.74e9 grads in 14 buckets of 5e8 elements, 2 micro-steps; one reduce per gradient
    # partition a bucket touches (grad_reduce_per_owner): 14 buckets + 31 inner partition
    # boundaries over the 32 GPUs = 45 calls per micro-step
    assert ds.grad_reduce_per_owner and CLUSTER.gpus == 32
    assert len(rs) == 2 * (14 + 32 - 1)
    one = simulate_step(M7, CLUSTER, "zero2", t, mode="engine", trace=True,
                        runtime=replace(ds, grad_reduce_per_owner=False))
    assert len(_intervals(one.records, lambda x: x.kind == "grad-reduce")) == 2 * 14
    for a, b in rs:
        assert not any(c0 < b - 1e-12 and c1 > a + 1e-12 for c0, c1 in comp)
    assert r.exposed_comm_s >= sum(b - a for a, b in rs) - 1e-9
    # overlap_comm true: the same buckets now run beside the backward
    on = simulate_step(M7, CLUSTER, "zero2", t, mode="engine", trace=True,
                       runtime=replace(ds, overlap_comm=True))
    rs_on = _intervals(on.records, lambda x: x.kind == "grad-reduce")
    comp_on = _intervals(on.records, lambda x: x.lane == "compute")
    assert any(c0 < b and c1 > a for a, b in rs_on for c0, c1 in comp_on)
    assert on.step_time_s < r.step_time_s
    # analytic mode counts the blocked reductions in full too (within 5 % of the engine)
    an = simulate_step(M7, CLUSTER, "zero2", t, mode="analytic", runtime=ds)
    assert an.step_time_s == pytest.approx(r.step_time_s, rel=0.05)


def test_persistence_threshold_keeps_norms_replicated():
    """stage3_param_persistence_threshold (1e5): the RMSNorm weights (4096 elements) are not
    partitioned: never gathered, and held in full on every GPU."""
    ds = load_runtime("deepspeed")
    t = TrainingSpec(accum_steps=1)
    plan = build_plan(M7, "zero3", CLUSTER, t, ds)
    layer_ag = {o.size_bytes for o in _colls(plan, "param-gather") if o.layer is not None}
    assert layer_ag == {2.0 * (M7.layer_params - 2 * M7.hidden)}
    none = replace(ds, persistence_threshold=0)
    plan0 = build_plan(M7, "zero3", CLUSTER, t, none)
    assert {o.size_bytes for o in _colls(plan0, "param-gather")
            if o.layer is not None} == {2.0 * M7.layer_params}
    from parosim.cost.memory import memory_breakdown

    n = CLUSTER.gpus
    norms = 2 * M7.hidden * M7.layers + M7.hidden
    mem = memory_breakdown(M7, "zero3", CLUSTER, t, ds)
    assert mem.params_bytes == pytest.approx(2 * M7.params / n + 2 * norms * (1 - 1 / n))


def test_fsdp_hybrid_shard_is_iii_with_inter_node_all_reduce():
    """HYBRID_SHARD: FULL_SHARD inside the node, replicas across nodes; every backward
    reduce-scatters inside the node and all-reduces the shard across nodes."""
    fsdp = load_runtime("fsdp")
    assert fsdp.label("III") == "III (HYBRID_SHARD)"
    t = TrainingSpec(accum_steps=2)
    plan = build_plan(M7, "III", CLUSTER, t, fsdp)
    red = _colls(plan, "grad-reduce")
    rs = [o for o in red if o.op is Op.REDUCE_SCATTER]
    ar = [o for o in red if o.op is Op.ALL_REDUCE]
    assert rs and all(o.scope is Scope.INTRA for o in rs)
    assert len(ar) == len(rs) and all(o.scope is Scope.INTER for o in ar)
    for a, b in zip(rs, ar, strict=True):       # the 1/m shard of the same unit, after it
        assert b.size_bytes == pytest.approx(a.size_bytes / CLUSTER.group_size)
        assert a.id in b.deps
    assert not _colls(plan, "sync-grad")         # nothing left for the boundary
    ag = _colls(plan, "param-gather")
    assert ag and all(o.scope is Scope.INTRA for o in ag)
    assert all(o.algo is Algo.RING for o in _colls(plan))


def test_fsdp_shard_grad_op_gathers_in_forward_only():
    fsdp = load_runtime("fsdp")
    plan = build_plan(M7, "NGG", CLUSTER, TrainingSpec(accum_steps=1), fsdp)
    ag = _colls(plan, "param-gather")
    assert ag and all(o.scope is Scope.GLOBAL and " fwd " in o.name for o in ag)
    assert not _colls(plan, "sync-param")


def test_zero3_reuse_distance_keeps_last_units_live():
    """stage3_max_reuse_distance / max_live_parameters (1e9 each): the units used last in
    forward are reused first in backward and are not fetched again."""
    ds = load_runtime("deepspeed")
    plan = build_plan(M7, "zero3", CLUSTER, TrainingSpec(accum_steps=1), ds)
    bwd = {o.name.split()[2] for o in _colls(plan, "param-gather") if " bwd " in o.name}
    assert {"head", "L31", "L30", "L29", "L28"}.isdisjoint(bwd)
    assert "L27" in bwd and "L0" in bwd and "embed" in bwd
    off = build_plan(M7, "zero3", CLUSTER, TrainingSpec(accum_steps=1),
                     replace(ds, max_reuse_distance=0))
    assert len(_colls(off, "param-gather")) == len(_colls(plan, "param-gather")) + 5


def test_prefetch_zero_fetches_on_demand():
    """Prefetch 0 (DeepSpeed stage3_prefetch_bucket_size: 0): every gather waits for the
    compute before it and the compute after it waits for the gather: all exposed."""
    paro = replace(load_runtime("paro"), overlap_slowdown=1.0)
    t = TrainingSpec(accum_steps=1)
    on = simulate_step(M7, CLUSTER, "IIG", t, runtime=paro, trace=True)
    off = simulate_step(M7, CLUSTER, "IIG", t, trace=True, runtime=replace(
        paro, prefetch_forward=0, prefetch_backward=0))
    ag = sum(r.end_s - r.start_s for r in off.records if r.kind == "param-gather")
    comp = _intervals(off.records, lambda x: x.lane == "compute")
    for a, b in _intervals(off.records, lambda x: x.kind == "param-gather"):
        assert not any(c0 < b - 1e-12 and c1 > a + 1e-12 for c0, c1 in comp)
    assert off.step_time_s - on.step_time_s > 0.9 * ag > 0


def test_paro_runtime_routes_only_large_list_api_calls_through_paro_cc():
    paro = load_runtime("paro")
    t = TrainingSpec(accum_steps=1)
    nig = build_plan(M7, "NIG", CLUSTER, t, paro)
    (sp,) = _colls(nig, "sync-param")[:1]
    assert sp.scope is Scope.GLOBAL and sp.algo is Algo.HIERARCHICAL
    igg = build_plan(M7, "IGG", CLUSTER, t, paro)
    assert all(o.algo is Algo.RING for o in _colls(igg, "grad-reduce"))   # coalesced RS
    ing = build_plan(M7, "ING", CLUSTER, t, paro)
    assert all(o.algo is Algo.RING for o in _colls(ing, "sync-grad"))
    tiny = replace(paro, paro_cc_min_elements=10**12)
    assert all(o.algo is Algo.RING for o in _colls(build_plan(M7, "NIG", CLUSTER, t, tiny)))


def test_runtime_refuses_a_strategy_its_framework_has_no_stage_for():
    with pytest.raises(InputError, match="no stage for PaRO-NIG"):
        simulate_step(M7, CLUSTER, "NIG", TrainingSpec(), runtime="deepspeed")
    names = [r.strategy.short for r in compare(M7, CLUSTER, TrainingSpec(accum_steps=1),
                                              mode="analytic", runtime="deepspeed")]
    assert sorted(names) == ["GGG", "NGG", "NNG", "NNN"]


def test_runtime_reruns_are_bit_identical():
    t = TrainingSpec(accum_steps=2)
    a = simulate_step(M7, CLUSTER, "zero3", t, runtime="deepspeed").to_dict()
    b = simulate_step(M7, CLUSTER, "zero3", t, runtime="deepspeed").to_dict()
    assert a == b


def _ds_config(tmp_path, **zero):
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
           "train_batch_size": 2 * 4 * 32, "bf16": {"enabled": True},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
           "zero_optimization": {"stage": 2, **zero}}
    p = tmp_path / "ds_config.json"
    p.write_text(json.dumps(cfg))
    return p


def test_deepspeed_config_is_read_into_the_same_settings(tmp_path):
    p = _ds_config(tmp_path, overlap_comm=True, reduce_bucket_size=2e8,
                   contiguous_gradients=True)
    rt, strategy, tr, no_effect = deepspeed_config_runtime(p, load_runtime("deepspeed"), 32)
    assert strategy == "NGG" and tr == {"micro_batch": 2, "accum": 4}
    assert rt.overlap_comm is True and rt.grad_bucket_elements == 200_000_000
    assert no_effect == ["bf16", "optimizer"]


def test_deepspeed_config_cli(tmp_path, capsys):
    p = _ds_config(tmp_path)
    assert main(["simulate", "--deepspeed-config", str(p), "--mode", "analytic",
                 "--json"]) == 0
    cap = capsys.readouterr()
    out = json.loads(cap.out)
    assert out["strategy"] == "PaRO-NGG" and out["framework_stage"] == "ZeRO-2"
    assert out["label"] == "NGG (ZeRO-2)" and out["runtime"].startswith("deepspeed")
    assert out["deepspeed_config"]["no_effect_keys"] == ["bf16", "optimizer"]
    assert "bf16, optimizer" in cap.err


@pytest.mark.parametrize("zero, top, word", [
    ({"offload_optimizer": {"device": "cpu"}}, {}, "offload_optimizer"),
    ({"zero_hpz_partition_size": 8}, {}, "zero_hpz_partition_size"),
    ({"mystery_knob": 1}, {}, "mystery_knob"),
    ({}, {"pipeline": {"stages": 2}}, "pipeline"),
    ({"stage": 4}, {}, "stage"),
])
def test_deepspeed_config_unsupported_keys_are_refused(tmp_path, capsys, zero, top, word):
    p = _ds_config(tmp_path, **zero)
    if top:
        data = json.loads(p.read_text())
        data.update(top)
        p.write_text(json.dumps(data))
    assert main(["simulate", "--deepspeed-config", str(p)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and word in err[0] and "Traceback" not in err[0]


@pytest.mark.parametrize("argv, word", [
    (["simulate", "--runtime", "deepspeed", "--strategy", "NIG"], "no stage for PaRO-NIG"),
    (["simulate", "--runtime", "deepspeed", "--algo", "ho-ring"], "--algo"),
    (["simulate", "--runtime", "megatron"], "--runtime"),
    (["compare", "--runtime", "fsdp", "--deepspeed-config", "x.json"], "--deepspeed-config"),
])
def test_runtime_cli_errors(capsys, argv, word):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and word in err[0]


def test_framework_stage_named_beside_paro_name(capsys):
    assert main(["compare", "--runtime", "deepspeed", "--mode", "analytic", "--accum", "2"]) == 0
    out = capsys.readouterr().out
    assert "PaRO-NGG (ZeRO-2)" in out and "PaRO-GGG (ZeRO-3)" in out


def test_compute_ops_untouched_by_runtime():
    """The runtime shapes communication only: the compute ops are those of the ideal plan."""
    t = TrainingSpec(accum_steps=1)
    ideal = [(o.name, o.duration_s) for o in build_plan(M7, "GGG", CLUSTER, t).ops
             if isinstance(o, ComputeOp)]
    ds = [(o.name, o.duration_s) for o in build_plan(M7, "GGG", CLUSTER, t,
                                                      load_runtime("deepspeed")).ops
          if isinstance(o, ComputeOp)]
    assert ideal == ds


@pytest.mark.parametrize("cfg, want", [
    ({"train_batch_size": 64}, {"micro_batch": 2, "accum": 1}),
    ({"train_batch_size": 256, "train_micro_batch_size_per_gpu": 2}, {"micro_batch": 2,
                                                                      "accum": 4}),
    ({"train_batch_size": 256, "gradient_accumulation_steps": 2}, {"micro_batch": 4,
                                                                   "accum": 2}),
])
def test_deepspeed_batch_arithmetic(tmp_path, cfg, want):
    """DeepSpeed's rule: train_batch_size = micro-batch x accumulation x GPUs."""
    p = tmp_path / "ds.json"
    p.write_text(json.dumps({**cfg, "zero_optimization": {"stage": 3}}))
    _, strategy, tr, _ = deepspeed_config_runtime(p, load_runtime("deepspeed"), 32)
    assert strategy == "GGG" and tr == want


def test_deepspeed_batch_disagreement_refused(tmp_path):
    p = tmp_path / "ds.json"
    p.write_text(json.dumps({"train_batch_size": 100, "train_micro_batch_size_per_gpu": 2,
                             "gradient_accumulation_steps": 4}))
    with pytest.raises(InputError, match="train_batch_size"):
        deepspeed_config_runtime(p, load_runtime("deepspeed"), 32)


@pytest.mark.parametrize("text, word", [
    ("name: x\nbucket: 5\n", "bucket"),
    ("name: x\ngrad_bucket_elements: many\n", "grad_bucket_elements"),
    ("name: x\noverlap_comm: sometimes\n", "overlap_comm"),
    ("name: x\ncollective_algo: tree\n", "collective_algo"),
    ("name: x\nstages: {NIX: foo}\n", "NIX"),
    ("name: x\noverlap_slowdown: 0.5\n", "overlap_slowdown"),
    ("framework: x\n", "name"),
])
def test_bad_runtime_yaml_is_one_clear_line(tmp_path, capsys, text, word):
    p = tmp_path / "rt.yaml"
    p.write_text(text)
    assert main(["simulate", "--runtime", str(p), "--mode", "analytic"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and word in err[0]


def test_own_runtime_yaml_runs(tmp_path):
    p = tmp_path / "mine.yaml"
    p.write_text("name: mine\nstages: {GGG: my-zero3}\ncollective_algo: ring\n"
                 "prefetch_forward: 0\nprefetch_backward: 0\noverlap_slowdown: 1.0\n")
    r = simulate_step(M7, CLUSTER, "GGG", TrainingSpec(accum_steps=1), mode="analytic",
                      runtime=str(p))
    assert r.framework_stage == "my-zero3" and r.fits and r.step_time_s > 0


def test_zero2_reduce_scatter_false_all_reduces_each_bucket(tmp_path):
    """DeepSpeed ``reduce_scatter: false``: average_tensor all-reduces the whole bucket."""
    p = _ds_config(tmp_path, reduce_scatter=False)
    rt, strategy, _, _ = deepspeed_config_runtime(p, load_runtime("deepspeed"), 32)
    t = TrainingSpec(accum_steps=1)
    plan = build_plan(M7, strategy, CLUSTER, t, rt)
    red = _colls(plan, "grad-reduce")
    assert red and all(o.op is Op.ALL_REDUCE and o.scope is Scope.GLOBAL for o in red)
    rs = simulate_step(M7, CLUSTER, "NGG", t, mode="analytic", runtime=load_runtime("deepspeed"))
    ar = simulate_step(M7, CLUSTER, "NGG", t, mode="analytic", runtime=rt)
    assert ar.step_time_s > rs.step_time_s
    z1 = build_plan(M7, "NNG", CLUSTER, t, rt)
    assert {o.op for o in _colls(z1, "sync-grad")} == {Op.ALL_REDUCE}
    z3 = build_plan(M7, "GGG", CLUSTER, t, replace(rt, reduce_scatter=False))
    assert all(o.op is Op.REDUCE_SCATTER for o in _colls(z3, "grad-reduce"))
