"""Mixture-of-experts models (parosim.spec.moe, docs/moe.md): presets against the published
total and active parameter counts, counts by hand, FLOPs per token, the model YAML and
HuggingFace readers, and the one-line refusal of every command that cannot honour MoE yet.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parosim.cli.commands import main
from parosim.cost.compute import step_flops
from parosim.errors import InputError
from parosim.io.model import load_model, model_from_dict, model_from_hf_config
from parosim.spec.model import ModelSpec, known_models, preset
from parosim.spec.moe import MOE_PRESETS, Attention, MoE, count_params, flops_per_token
from parosim.spec.training import TrainingSpec

HF = Path(__file__).parent / "data" / "hf"
# presets whose published active count has two significant digits only ("3.3B", "22B"):
# parosim's count lies inside the published figure's truncation interval but not within
# 0.5 % of it (docs/moe.md, "Published counts")
TWO_DIGIT_ACTIVE = {"qwen3-30b-a3b", "qwen3-235b-a22b"}


@pytest.mark.parametrize("name", sorted(MOE_PRESETS))
def test_total_within_half_a_percent_of_the_published_count(name):
    total, _active, _conv = MOE_PRESETS[name]["published"]
    m = preset(name)
    assert m.is_moe and name in known_models()
    assert abs(m.params / total - 1) < 0.005, (name, m.params, total)


@pytest.mark.parametrize("name", sorted(MOE_PRESETS))
def test_active_against_the_published_count(name):
    _total, active, conv = MOE_PRESETS[name]["published"]
    got = getattr(preset(name).param_counts, conv)
    if name in TWO_DIGIT_ACTIVE:
        unit = 0.1e9 if active < 10e9 else 1e9   # the published figure's last digit
        assert active <= got < active + unit, (name, got)
        assert abs(got / active - 1) >= 0.005  # the stated miss of docs/moe.md, kept honest
    else:
        assert abs(got / active - 1) < 0.005, (name, got, active)


def test_mixtral_8x7b_by_hand_and_the_safetensors_total():
    h, f, kv = 4096, 14336, 1024
    attn = 2 * h * h + 2 * h * kv                  # q, o; k, v of 8 kv heads x 128
    layer = attn + 8 * 3 * h * f + h * 8 + 2 * h   # 8 SwiGLU experts, router, two norms
    total = 32 * layer + 2 * 32000 * h + h          # embedding, head, final norm
    m = preset("mixtral-8x7b")
    assert m.params == total == 46_702_792_704     # the Hub's safetensors total
    c = m.param_counts
    assert c.active == total - 32 * 6 * 3 * h * f  # 6 of 8 experts idle per token
    assert c.expert_params == 8 * 3 * h * f and c.moe_layers == 32


def test_deepseek_v3_mla_and_dense_layers_by_hand():
    h, n = 7168, 128
    mla = (h * 1536 + 1536 + 1536 * n * 192 + h * 576 + 512 + 512 * n * 256 + n * 128 * h)
    c = preset("deepseek-v3").param_counts
    assert c.attention + c.norms == 61 * (mla + 2 * h)
    assert c.dense_mlp == 3 * 3 * h * 18432
    assert c.routed_experts == 58 * 256 * 3 * h * 2048
    assert c.shared_experts == 58 * 3 * h * 2048
    assert c.router == 58 * (h * 256 + 256)        # gate weights and the bias correction


def test_a_dense_model_counts_as_before():
    for name in ("llama-7b", "llama-3-8b", "gpt3-175b", "mpt-7b"):
        m = preset(name)
        assert count_params(m).total == m.params
        assert not m.is_moe and m.active_params == m.params


def test_flops_per_token_from_active_parameters():
    m = preset("llama-7b")
    c = count_params(m)
    # dense: 6Ψ + 12·L·h·s of the MFU count, less the embedding and norms (not matmuls)
    t = TrainingSpec(seq_len=2048)
    assert flops_per_token(m, 2048) == pytest.approx(
        step_flops(m, t, 1) - 6 * (c.embedding + c.norms + c.head - 32000 * 4096))
    mx = preset("mixtral-8x7b")
    cx = mx.param_counts
    h = 4096
    matmul = 32 * (2 * h * h + 2 * h * 1024 + 2 * 3 * h * 14336 + h * 8) + 32000 * h
    assert cx.active_matmul == matmul
    assert flops_per_token(mx, 4096) == 6 * matmul + 3 * 2 * (2 * h) * 32 * 4096
    # GPT-OSS: half its layers attend to a window of 128 tokens
    g = preset("gpt-oss-120b")
    full = flops_per_token(g, 4096)
    hd = 64 * 64
    assert full - 6 * g.param_counts.active_matmul == 3 * 2 * 2 * hd * (18 * 4096 + 18 * 128)


def test_moe_yaml_and_its_checks(tmp_path):
    d = {"name": "tiny-moe", "layers": 4, "hidden": 64, "ffn_hidden": 128, "heads": 4,
         "vocab": 100, "moe": {"experts": 4, "top_k": 2, "expert_ffn": 32,
                               "shared_experts": 1, "dense_layers": 1}}
    m = model_from_dict(d)
    c = m.param_counts
    assert c.dense_mlp == 3 * 64 * 128 and c.routed_experts == 3 * 4 * 3 * 64 * 32
    assert c.shared_experts == 3 * 3 * 64 * 32 and c.router == 3 * 64 * 4
    assert c.active == c.total - 3 * 2 * 3 * 64 * 32
    for moe, words in [({"experts": 4, "top_k": 5, "expert_ffn": 8}, "top_k"),
                       ({"experts": 4, "top_k": 1, "expert_ffn": 8, "capacity_factor": -1},
                        "capacity_factor"),
                       ({"experts": 4, "top_k": 1, "expert_ffn": 8, "dense_layers": 4},
                        "dense_layers"),
                       ({"experts": 4, "top_k": 1}, "expert_ffn"),
                       ({"experts": 4, "top_k": 1, "expert_ffn": 8, "gate": 1}, "gate")]:
        with pytest.raises(InputError, match=words):
            model_from_dict({**d, "moe": moe})
    with pytest.raises(InputError, match="mla"):
        model_from_dict({**d, "attention": {"kv_lora_rank": 8}})
    with pytest.raises(InputError, match="describe a shape"):
        model_from_dict({"name": "x", "params": 1e9, "moe": {"experts": 2}})


def test_hf_mixtral_and_qwen3_moe_configs():
    mx = load_model(str(HF / "mixtral-8x7b" / "config.json"))
    assert mx.params == preset("mixtral-8x7b").params and mx.moe.top_k == 2
    q = load_model(str(HF / "qwen3-30b-a3b" / "config.json"))
    p = preset("qwen3-30b-a3b")
    assert (q.params, q.moe, q.attention) == (p.params, p.moe, p.attention)
    data = json.loads((HF / "qwen3-30b-a3b" / "config.json").read_text())
    for change, words in [({"decoder_sparse_step": 2}, "decoder_sparse_step"),
                          ({"mlp_only_layers": [0]}, "mlp_only_layers"),
                          ({"n_routed_experts": 8}, "n_routed_experts"),
                          ({"model_type": "deepseek_v3"}, "deepseek-v3")]:
        with pytest.raises(InputError, match=words):
            model_from_hf_config({**data, **change})


@pytest.mark.parametrize("argv", [
    ["run", "--model", "mixtral-8x22b"],
])
def test_every_command_that_cannot_honour_moe_refuses_it_in_one_line(argv, capsys):
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert argv[2] in err and "mixture of experts" in err and "expert parallelism" in err


def test_the_python_api_refuses_moe_on_dense_paths():
    from parosim.cost.memory import memory_breakdown
    from parosim.spec.strategy import parse_strategy
    from parosim.spec.system import ClusterSpec

    with pytest.raises(InputError, match="mixture of experts"):
        memory_breakdown(preset("mixtral-8x7b"), parse_strategy("NIG"), ClusterSpec(),
                         TrainingSpec())
    dense_mla = ModelSpec("mla", layers=2, hidden=64, ffn_hidden=128, heads=4, vocab=100,
                          attention=Attention(kind="mla", kv_lora_rank=16, qk_nope_dim=8,
                                              qk_rope_dim=8, v_head_dim=8))
    with pytest.raises(InputError, match="attention beyond LLaMA"):
        _ = dense_mla.layer_params
    assert MoE(experts=2, top_k=1, expert_ffn=4).capacity_factor is None


def test_model_command(capsys):
    assert main(["model", "--model", "deepseek-v3", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["moe"] and d["params"]["total"] == preset("deepseek-v3").params
    assert d["experts"]["shared_experts"] == 1 and d["attention"]["kind"] == "mla"
    assert main(["model", "--model", "mixtral-8x7b"]) == 0
    assert "12,879,925,248" in capsys.readouterr().out


def test_jobs_and_step_calibration_refuse_moe_in_one_line(tmp_path, capsys):
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("cluster: dgx-h100-ib\nnodes: 2\njobs:\n"
                    "  - {name: a, model: mixtral-8x7b, strategy: GGG, nodes: [0]}\n"
                    "  - {name: b, model: llama-7b, strategy: GGG, nodes: [1]}\n")
    steps = tmp_path / "steps.csv"
    steps.write_text("model,strategy,nodes,micro_batch,accum,seq_len,step_time_s\n"
                     "mixtral-8x7b,NNG,2,1,1,512,1.0\n")
    for argv in (["simulate", "--jobs", str(jobs)],
                 ["calibrate", "--steps", str(steps), "--cluster", "dgx-h100-ib", "-o",
                  str(tmp_path / "x.yaml")]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "mixtral-8x7b" in err, err
        assert "mixture of experts" in err
