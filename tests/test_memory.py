"""Memory: activations against Korthikanti et al. 2022, model states, fits/shortfall, max b."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parosim.cost.memory import (
    FRAGMENTATION_FRACTION,
    MARGIN_FRACTION,
    RUNTIME_RESERVE_BYTES,
    activation_bytes,
    max_micro_batch,
    memory_breakdown,
    resolve_recompute,
)
from parosim.errors import InputError
from parosim.spec.model import preset
from parosim.spec.strategy import ALL_STRATEGIES, parse_strategy
from parosim.spec.system import ClusterSpec, GPUSpec
from parosim.spec.training import TrainingSpec

PAPER = ClusterSpec(name="paper", nodes=4, gpus_per_node=8)


def korthikanti(model, b, s):
    """Published per-layer activation bytes (fp16, no recompute) x layers."""
    h, a = model.hidden, model.heads
    return model.layers * s * b * h * (34 + 5 * a * s / h)


@pytest.mark.parametrize("name", ["llama-7b", "llama-13b", "llama-65b"])
@pytest.mark.parametrize("b, s", [(1, 512), (4, 512), (2, 2048)])
def test_activations_within_5pct_of_korthikanti(name, b, s):
    m = preset(name)
    ours = activation_bytes(m, b, s, recompute=False)
    assert ours == pytest.approx(korthikanti(m, b, s), rel=0.05)
    assert ours >= korthikanti(m, b, s)        # plus the output layer, never less


def test_recompute_keeps_layer_inputs_plus_one_layer():
    m, b, s = preset("llama-65b"), 4, 512
    per_layer = korthikanti(m, b, s) / m.layers
    out = 4 * s * b * m.hidden + 4 * s * b * m.vocab
    assert activation_bytes(m, b, s, recompute=True) == pytest.approx(
        m.layers * 2 * s * b * m.hidden + per_layer + out)
    assert activation_bytes(m, b, s, True) < activation_bytes(m, b, s, False) / 10


@pytest.mark.parametrize("memory_model", ["runtime", "korthikanti"])
@pytest.mark.parametrize("strategy", ALL_STRATEGIES, ids=lambda s: s.short)
def test_breakdown_sums_and_states_formula(strategy, memory_model):
    m = preset("llama-7b")
    t = TrainingSpec(trainable_ratio=1 / 16, memory_model=memory_model)
    mb = memory_breakdown(m, strategy, PAPER, t)
    n, g = 32, 8
    d = {"N": 1, "I": g, "G": n}
    p, gr, os = strategy.short
    psi, psi_t = m.params, m.params / 16
    assert mb.model_states_bytes == 2 * psi / d[p] + 2 * psi_t / d[gr] + 12 * psi_t / d[os]
    assert mb.model_states_bytes == pytest.approx(
        mb.params_bytes + mb.grads_bytes + mb.optimizer_bytes)
    rest = mb.model_states_bytes + mb.activations_bytes + mb.buffers_bytes
    frac = MARGIN_FRACTION if memory_model == "korthikanti" else FRAGMENTATION_FRACTION
    assert mb.margin_bytes == pytest.approx(frac * rest + RUNTIME_RESERVE_BYTES)
    assert mb.total_bytes == pytest.approx(rest + mb.margin_bytes)
    assert mb.capacity_bytes == 81920 * 2**20  # A100-SXM4-80GB nvidia-smi total (spec/gpus.py)
    assert mb.fits == (mb.total_bytes <= mb.capacity_bytes)
    assert mb.shortfall_bytes == max(0.0, mb.total_bytes - mb.capacity_bytes)
    assert (mb.buffers_bytes == 0) == (p == "N" and gr == "N")


def test_not_fitting_is_a_result():
    mb = memory_breakdown(preset("llama-7b"), "ddp", PAPER, TrainingSpec())
    assert not mb.fits and mb.shortfall_bytes > 0
    assert mb.model_states_bytes == 16 * preset("llama-7b").params


def test_paper_recompute_choice():
    # The paper trains LLaMA-65B with recomputation and LLaMA-7B without.
    t = TrainingSpec()
    assert not resolve_recompute(preset("llama-7b"), "GGG", PAPER, t)
    assert resolve_recompute(preset("llama-65b"), "GGG", PAPER, t)
    assert memory_breakdown(preset("llama-65b"), "GGG", PAPER, t).fits
    assert resolve_recompute(preset("llama-7b"), "GGG", PAPER, t.with_recompute(True))
    assert not resolve_recompute(preset("llama-65b"), "GGG", PAPER, t.with_recompute(False))
    assert not memory_breakdown(preset("llama-65b"), "GGG", PAPER,
                                t.with_recompute(False)).fits


@pytest.mark.parametrize("strategy", ["NNG", "NIG", "IIG", "GGG"])
def test_max_micro_batch_is_the_boundary(strategy):
    m, t = preset("llama-7b"), TrainingSpec(recompute=False)
    b = max_micro_batch(m, strategy, PAPER, t)
    assert b >= 1
    assert memory_breakdown(m, strategy, PAPER, t.with_micro_batch(b)).fits
    assert not memory_breakdown(m, strategy, PAPER, t.with_micro_batch(b + 1)).fits


def test_max_micro_batch_zero_and_limit():
    assert max_micro_batch(preset("llama-65b"), "NNN", PAPER, TrainingSpec()) == 0
    big = ClusterSpec(nodes=4, gpu=GPUSpec(memory_bytes=10**15))
    assert max_micro_batch(preset("llama-7b"), "GGG", big, TrainingSpec(), limit=100) == 100
    with pytest.raises(InputError):
        max_micro_batch(preset("llama-7b"), "GGG", big, TrainingSpec(), limit=0)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(ALL_STRATEGIES), st.integers(1, 64), st.sampled_from([None, True, False]),
       st.sampled_from([1.0, 1 / 16, 3 / 1000]))
def test_memory_monotone_in_micro_batch(strategy, b, recompute, r):
    m = preset("llama-13b")
    t = TrainingSpec(micro_batch=b, recompute=recompute, trainable_ratio=r)
    one = memory_breakdown(m, strategy, PAPER, t)
    two = memory_breakdown(m, strategy, PAPER, t.with_micro_batch(b + 1))
    if one.recompute == two.recompute:
        assert two.total_bytes > one.total_bytes
    assert two.fits <= one.fits           # fitting at b+1 implies fitting at b
    assert one.model_states_bytes == two.model_states_bytes


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(ALL_STRATEGIES), st.integers(1, 16))
def test_more_nodes_never_need_more_memory(strategy, nodes):
    m, t = preset("llama-7b"), TrainingSpec(recompute=False)
    a = memory_breakdown(m, strategy, ClusterSpec(nodes=nodes), t)
    b = memory_breakdown(m, strategy, ClusterSpec(nodes=nodes + 1), t)
    assert b.total_bytes <= a.total_bytes


def test_strategy_text_accepted_and_bad_text_rejected():
    assert memory_breakdown(preset("7b"), "zero3", PAPER, TrainingSpec()) == \
        memory_breakdown(preset("7b"), parse_strategy("GGG"), PAPER, TrainingSpec())
    with pytest.raises(InputError, match="invalid"):
        memory_breakdown(preset("7b"), "GGN", PAPER, TrainingSpec())
