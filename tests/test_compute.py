"""Compute: FLOPs per layer from shapes, times, optimizer step, MFU FLOPs."""

import pytest

from parosim.cost.compute import (
    ADAM_BYTES_PER_PARAM,
    compute_seconds,
    head_backward_flops,
    head_forward_flops,
    layer_backward_flops,
    layer_forward_flops,
    optimizer_step_seconds,
    step_flops,
)
from parosim.plan.dataparallel import ComputeOp, build_plan
from parosim.spec.model import ModelSpec, preset
from parosim.spec.strategy import ALL_STRATEGIES
from parosim.spec.system import ClusterSpec
from parosim.spec.training import TrainingSpec

PAPER = ClusterSpec(nodes=4)
M7 = preset("llama-7b")


def test_layer_forward_flops_formula():
    t = TrainingSpec(micro_batch=4, seq_len=512)
    h, f, s = 4096, 11008, 512
    per_token = 2 * (4 * h * h + 3 * h * f) + 2 * 2 * s * h     # matmuls + QK^T and AV
    assert layer_forward_flops(M7, t) == 4 * 512 * per_token


def test_gpt_shape_matches_narayanan():
    # Narayanan et al. 2021: a GPT layer's forward is 24·b·s·h² + 4·b·s²·h (4h MLP = two
    # matmuls; ours has three for SwiGLU, so an ffn of 8h/3 gives the same matmul count).
    h, b, s = 3072, 2, 1024
    gpt_like = ModelSpec("gpt-like", layers=1, hidden=h, ffn_hidden=8 * h // 3, heads=24,
                         vocab=1000)
    t = TrainingSpec(micro_batch=b, seq_len=s)
    assert layer_forward_flops(gpt_like, t) == 24 * b * s * h * h + 4 * b * s * s * h


def test_backward_is_twice_forward_for_full_training():
    t = TrainingSpec()
    assert layer_backward_flops(M7, t) == 2 * layer_forward_flops(M7, t)
    assert head_backward_flops(M7, t) == 2 * head_forward_flops(M7, t)


def test_frozen_weights_skip_weight_gradients():
    full, peft = TrainingSpec(), TrainingSpec(trainable_ratio=3 / 1000)
    assert layer_forward_flops(M7, full) < layer_backward_flops(M7, peft) \
        < layer_backward_flops(M7, full)


def test_times():
    t = TrainingSpec(compute_efficiency=0.5)
    assert compute_seconds(312e12, PAPER, t) == 2.0
    # Adam on a 1/32 shard of 7B: 28 bytes per param over 2 TB/s
    s = optimizer_step_seconds(M7, ALL_STRATEGIES[-1], PAPER, t)
    assert s == ADAM_BYTES_PER_PARAM * M7.params / 32 / 2.0e12


@pytest.mark.parametrize("strategy", ALL_STRATEGIES, ids=lambda s: s.short)
def test_optimizer_time_scales_with_os_shard(strategy):
    t = TrainingSpec(trainable_ratio=1 / 16)
    d = {"N": 1, "I": 8, "G": 32}[strategy.os.value]
    assert optimizer_step_seconds(M7, strategy, PAPER, t) == pytest.approx(
        28 * M7.params / 16 / d / PAPER.gpu.hbm_bandwidth_Bps)


def test_step_flops_mfu_definition():
    t = TrainingSpec()
    tokens = 20480
    assert step_flops(M7, t, tokens) == 6 * M7.params * tokens + 12 * 32 * 4096 * 512 * tokens


@pytest.mark.parametrize("recompute", [False, True])
def test_plan_flops_agree_with_mfu_count(recompute):
    # The plan counts matmuls only: 6Ψ·T minus the embedding and norm weights (6·(vocab·h +
    # 2·L·h + h)·T, no matmul FLOPs), plus one forward per layer when recomputing.
    t = TrainingSpec(accum_steps=3, recompute=recompute)
    plan = build_plan(M7, "NIG", PAPER, t)
    total = sum(o.flops for o in plan.ops if isinstance(o, ComputeOp))
    T = t.tokens_per_gpu_step
    h, L, V = 4096, 32, 32000
    expect = step_flops(M7, t, T) - 6 * (V * h + 2 * L * h + h) * T
    if recompute:
        expect += t.accum_steps * L * layer_forward_flops(M7, t)
    assert total == pytest.approx(expect, rel=1e-12)
    assert plan.model_flops_per_step == step_flops(M7, t, T)
