"""HuggingFace ``config.json`` as a model (parosim.io.model.read_hf_config, docs/model-yaml.md).

Parameter counts are checked against the published totals of the models whose configs the
fixtures in tests/data/hf/ copy (SOURCES.md there); what the model cannot represent is refused
with one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parosim.cli.commands import main
from parosim.errors import InputError
from parosim.io.model import load_model, model_from_hf_config

HF = Path(__file__).parent / "data" / "hf"

PUBLISHED = {   # folder -> published parameter count
    "llama-2-7b": 6_738_415_616,
    "mistral-7b-instruct-v0.2": 7_241_732_096,
    "qwen2-7b": 7_615_616_512,
}


@pytest.mark.parametrize("folder", sorted(PUBLISHED))
def test_parameter_count_matches_the_published_total(folder):
    m = load_model(str(HF / folder / "config.json"))
    assert m.name == folder
    assert abs(m.params - PUBLISHED[folder]) / PUBLISHED[folder] < 0.005


def test_exact_where_the_layout_is_representable():
    assert load_model(str(HF / "llama-2-7b" / "config.json")).params == 6_738_415_616
    mistral = load_model(str(HF / "mistral-7b-instruct-v0.2" / "config.json"))
    assert mistral.params == 7_241_732_096 and mistral.kv_heads == 8
    # Qwen2's q/k/v biases (28 layers x (3584 + 2 x 512)) are the only parameters not counted
    qwen = load_model(str(HF / "qwen2-7b" / "config.json"))
    assert PUBLISHED["qwen2-7b"] - qwen.params == 28 * (3584 + 2 * 512)


def test_llama_2_config_equals_the_preset():
    from parosim.spec.model import preset

    m, p = load_model(str(HF / "llama-2-7b" / "config.json")), preset("llama-2-7b")
    assert (m.layers, m.hidden, m.ffn_hidden, m.heads, m.vocab, m.kv_heads, m.params) == (
        p.layers, p.hidden, p.ffn_hidden, p.heads, p.vocab, p.kv_heads, p.params)


def _cfg(**changes):
    data = json.loads((HF / "llama-2-7b" / "config.json").read_text())
    data.update(changes)
    return {k: v for k, v in data.items() if v is not ...}


@pytest.mark.parametrize("changes, words", [
    ({"num_local_experts": 8, "num_experts_per_tok": 2}, "mixture-of-experts"),
    ({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, "model_type"),
    ({"model_type": ...}, "model_type"),
    ({"hidden_size": ...}, "missing required key 'hidden_size'"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"head_dim": 256}, "head_dim"),
    ({"attention_bias": True}, "attention_bias"),
    ({"sliding_window": 4096}, "sliding_window"),
    ({"quantization_config": {"bits": 4}}, "quantization_config"),
    ({"architectures": ["MistralForCausalLM"]}, "architectures"),
    ({"some_new_field": 1}, "'some_new_field'"),
    ({"num_key_value_heads": 5}, "kv_heads"),
])
def test_what_cannot_be_honoured_is_refused(changes, words):
    with pytest.raises(InputError, match=words) as e:
        model_from_hf_config(_cfg(**changes))
    assert "\n" not in str(e.value)


def test_both_biases_are_the_biased_layout():
    m = model_from_hf_config(_cfg(attention_bias=True, mlp_bias=True))
    assert m.bias and m.params > PUBLISHED["llama-2-7b"]


def test_tied_embeddings_and_gqa_change_the_count():
    base = model_from_hf_config(_cfg()).params
    assert model_from_hf_config(_cfg(tie_word_embeddings=True)).params == base - 32000 * 4096
    gqa = model_from_hf_config(_cfg(num_key_value_heads=8)).params
    assert base - gqa == 32 * 2 * 4096 * (4096 - 1024)


def test_sliding_window_file_is_refused_in_one_line_and_moe_file_is_sized(capsys):
    rc = main(["memory", "--model", str(HF / "mistral-7b-v0.1" / "config.json"), "--json"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "sliding_window" in err
    # a MoE config.json is a MoE model: parosim memory sizes its steps (docs/moe.md)
    rc = main(["memory", "--model", str(HF / "mixtral-8x7b" / "config.json"), "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and len(d["results"]) == 14
    assert all("expert_strategy" in r for r in d["results"])


def test_cli_memory_reads_a_config_json(capsys):
    rc = main(["memory", "--model", str(HF / "mistral-7b-instruct-v0.2" / "config.json"),
               "--json"])
    out = capsys.readouterr().out
    assert rc == 0
    d = json.loads(out)
    assert d["model"] == "mistral-7b-instruct-v0.2"
    # model states of the DDP row: 16 bytes per parameter of the config's 7,241,732,096
    ddp = next(r for r in d["results"] if r["strategy"].endswith("NNN"))
    assert ddp["params_bytes"] + ddp["grads_bytes"] + ddp["optimizer_bytes"] == (
        16 * PUBLISHED["mistral-7b-instruct-v0.2"])


def test_parosim_keys_in_json_read_like_yaml(tmp_path):
    p = tmp_path / "m.json"
    p.write_text(json.dumps({"name": "m", "params": 7.5e9}))
    assert load_model(str(p)).params == 7_500_000_000
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match="malformed JSON"):
        load_model(str(bad))
