"""Runtime profiles carry the memory settings their framework has (runtimes/*.yaml: memory
model, attention kernel, bytes per logit); explicit settings win; ideal keeps the old estimate.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from parosim.cli.commands import main
from parosim.cost.memory import max_micro_batch, memory_breakdown
from parosim.errors import InputError
from parosim.io import load_cluster
from parosim.io.runtime import load_runtime, runtime_from_dict, training_for_runtime
from parosim.simulate.step import simulate_step
from parosim.spec.model import mpt, preset
from parosim.spec.runtime import IDEAL, RuntimeSpec
from parosim.spec.training import TrainingSpec

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments" / "07_compute_model"))
from published import foundry_rows, split  # noqa: E402

ROWS = foundry_rows()


def _published(r) -> TrainingSpec:
    """Only what the published run states: micro-batch, accumulation, sequence, checkpointing."""
    return TrainingSpec(micro_batch=r.micro_batch, accum_steps=r.accum, seq_len=r.seq_len,
                        recompute=r.recompute)


def _fit_and_within(rows, runtime):
    fits, within = [], []
    for r in rows:
        m, c = mpt(r.model, r.seq_len), load_cluster("llm-foundry-a100-roce", nodes=r.gpus // 8)
        fits.append(memory_breakdown(m, "GGG", c, _published(r), runtime=runtime).fits)
        mx = max_micro_batch(m, "GGG", c, _published(r), limit=4096, runtime=runtime)
        within.append(r.micro_batch / 2 <= mx <= 2 * r.micro_batch)
    return np.mean(fits), np.mean(within)


def test_fsdp_runtime_by_default_fits_the_published_llm_foundry_runs():
    """Acceptance (issue 9, memory): with ``runtime="fsdp"`` and no memory setting, >= 95 % of
    the 61 published FSDP runs fit and the largest micro-batch is within one power of two of
    the published one for >= 95 % (the held-out half alone too: the profile's 6 bytes per
    logit were fitted on the other half)."""
    fit, within = _fit_and_within(ROWS, "fsdp")
    fit_h, within_h = _fit_and_within(split(ROWS, "held-out"), "fsdp")
    assert fit == 1.0 and fit_h == 1.0, (fit, fit_h)
    assert within >= 0.95 and within_h >= 0.95, (within, within_h)
    # the ideal runtime keeps the earlier estimate, which said "does not fit" for most
    assert _fit_and_within(ROWS, None)[0] < 0.2


def test_committed_fragmentation_is_the_one_sided_fit(monkeypatch):
    """check_memory.py's one-sided fit on the fit half (the largest fraction, in 0.5 % steps,
    under which every fit-half run still fits) on the nvidia-smi capacity gives 7.5 %, the
    committed value; one step more and a fit-half run no longer fits."""
    import parosim.cost.memory as memory
    assert memory.FRAGMENTATION_FRACTION == 0.075
    assert _fit_and_within(split(ROWS, "fit"), "fsdp")[0] == 1.0
    monkeypatch.setattr(memory, "FRAGMENTATION_FRACTION", 0.08)
    assert _fit_and_within(split(ROWS, "fit"), "fsdp")[0] < 1.0


def test_fsdp_runtime_simulates_a_published_run_that_the_ideal_runtime_refuses():
    r = next(x for x in ROWS if x.key == "mpt-7b seq2048 8gpu mb6")
    m, c = mpt(r.model, r.seq_len), load_cluster("llm-foundry-a100-roce", nodes=1)
    res = simulate_step(m, c, "GGG", _published(r), mode="analytic", runtime="fsdp")
    assert res.fits and res.step_time_s > 0
    assert (res.memory.memory_model, res.memory.attention, res.memory.logit_bytes) == (
        "runtime", "flash", 6)
    assert not simulate_step(m, c, "GGG", _published(r), "ring", "analytic").fits


def test_profiles_carry_their_frameworks_memory_settings():
    got = {n: (load_runtime(n).memory_model, load_runtime(n).attention,
               load_runtime(n).logit_bytes) for n in ("ideal", "deepspeed", "paro", "fsdp")}
    assert got == {"ideal": ("korthikanti", "eager", None),
                   "deepspeed": ("runtime", "eager", 10), "paro": ("runtime", "eager", 10),
                   "fsdp": ("runtime", "flash", 6)}
    assert load_runtime("ideal").is_ideal and replace(load_runtime("ideal"), sources="") == IDEAL


def test_explicit_settings_override_the_profile():
    fsdp = load_runtime("fsdp")
    t = training_for_runtime(TrainingSpec(attention="eager", memory_model="korthikanti",
                                          logit_bytes=4), fsdp)
    assert (t.attention, t.memory_model, t.logit_bytes) == ("eager", "korthikanti", 4)
    m, c = preset("llama-7b"), load_cluster("paper-a100-roce", nodes=4)
    base = TrainingSpec(seq_len=2048, micro_batch=1, recompute=False)
    flash = memory_breakdown(m, "GGG", c, base, runtime=fsdp)
    eager = memory_breakdown(m, "GGG", c, replace(base, attention="eager"), runtime=fsdp)
    # eager stores the bf16 probabilities: 2·b·heads·s² bytes per layer more
    assert eager.activations_bytes - flash.activations_bytes == pytest.approx(
        m.layers * (2 * 32 * 2048**2 - 4 * 32 * 2048))


def test_ideal_default_is_the_explicit_korthikanti_estimate():
    m, c = preset("llama-65b"), load_cluster("paper-a100-roce", nodes=4)
    for s in ("GGG", "NIG", "IIG"):
        a = memory_breakdown(m, s, c, TrainingSpec())
        b = memory_breakdown(m, s, c, TrainingSpec(attention="eager",
                                                   memory_model="korthikanti"), runtime="ideal")
        assert a == b


def _memory_json(capsys, *flags) -> dict:
    assert main(["memory", "--json", "--model", "mpt-7b", "--cluster",
                 "llm-foundry-a100-roce", "--strategy", "GGG", "--seq-len", "2048",
                 "--micro-batch", "6", "--recompute", "off", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_profile_defaults_and_flags_override(capsys):
    d = _memory_json(capsys, "--runtime", "fsdp")
    # published: 6 (A100 81920MiB, 7.5 % fragmentation)
    assert d["fits"] and d["max_micro_batch"] == 6
    assert (d["memory_model"], d["attention"], d["logit_bytes"]) == ("runtime", "flash", 6)
    e = _memory_json(capsys, "--runtime", "fsdp", "--attention", "eager", "--memory-model",
                     "korthikanti", "--logit-bytes", "4")
    assert (e["memory_model"], e["attention"], e["logit_bytes"]) == ("korthikanti", "eager", 4)
    assert not e["fits"]
    i = _memory_json(capsys, "--fidelity", "paper")
    assert (i["memory_model"], i["attention"], i["logit_bytes"]) == ("korthikanti", "eager", 4)
    # the ideal runtime under the default fidelity: memory as frameworks keep it
    i = _memory_json(capsys)
    assert (i["memory_model"], i["attention"], i["logit_bytes"]) == ("runtime", "flash", 6)


@pytest.mark.parametrize("field, match", [
    ({"memory_model": "guess"}, "memory_model"),
    ({"attention": "sparse"}, "attention"),
    ({"logit_bytes": 1}, "logit_bytes"),
    ({"logit_bytes": 6.5}, "logit_bytes"),
    ({"collective_algo": "ring", "paro_cc_min_elements": 1024}, "paro_cc_min_elements"),
    ({"stages": {"GGG": "FULL_SHARD"}, "forward_only_gather": ["NGG"]}, "forward_only_gather"),
    ({"attention_kernel": "flash"}, "attention_kernel"),
])
def test_profile_fields_that_cannot_be_honoured_are_refused(field, match):
    with pytest.raises(InputError, match=match):
        runtime_from_dict({"name": "x", **field})


def test_refusals_in_the_spec_itself():
    with pytest.raises(InputError, match="paro_cc_min_elements"):
        RuntimeSpec(paro_cc_min_elements=5)
    assert RuntimeSpec(collective_algo="paro-cc", paro_cc_min_elements=5).paro_cc_min_elements
