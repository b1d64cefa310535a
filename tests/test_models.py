"""Models: LLaMA parameter counts from shapes, presets, params-only models, YAML loading."""

import pytest

from parosim.cost.compute import layer_forward_flops, step_flops
from parosim.cost.memory import memory_breakdown
from parosim.errors import InputError
from parosim.io.model import load_model
from parosim.plan.dataparallel import build_plan
from parosim.spec.model import ModelSpec, known_models, nominal_shape, preset
from parosim.spec.system import ClusterSpec
from parosim.spec.training import TrainingSpec

# Published parameter counts of the HuggingFace LLaMA checkpoints.
PUBLISHED = {"llama-7b": 6_738_415_616, "llama-13b": 13_015_864_320,
             "llama-30b": 32_528_943_616, "llama-65b": 65_285_660_672}


def llama_count(layers, h, ffn, vocab):
    # per layer 4h^2 (q,k,v,o) + 3·h·ffn (SwiGLU) + 2h (RMSNorm); embedding + untied head + norm
    return layers * (4 * h * h + 3 * h * ffn + 2 * h) + 2 * vocab * h + h


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_presets_match_published_counts(name):
    m = preset(name)
    assert m.params == PUBLISHED[name]
    assert m.params == llama_count(m.layers, m.hidden, m.ffn_hidden, m.vocab)
    assert m.params == m.layers * m.layer_params + m.embedding_params + m.head_params


def test_llama_7b_is_6_74e9():
    assert preset("llama-7b").params == pytest.approx(6.74e9, rel=1e-3)


def test_paper_shapes():
    shapes = {"llama-7b": (32, 4096, 11008, 32), "llama-13b": (40, 5120, 13824, 40),
              "llama-30b": (60, 6656, 17920, 52), "llama-65b": (80, 8192, 22016, 64)}
    for name, (layers, h, ffn, heads) in shapes.items():
        m = preset(name)
        assert (m.layers, m.hidden, m.ffn_hidden, m.heads, m.vocab) == (layers, h, ffn, heads,
                                                                         32000)


@pytest.mark.parametrize("alias", ["7b", "7B", "LLaMA-7B", "llama_7b", "llama7b", " llama-7b "])
def test_preset_aliases(alias):
    assert preset(alias) == preset("llama-7b")


def test_unknown_preset_lists_known_names():
    with pytest.raises(InputError) as e:
        preset("gpt-3")
    for name in known_models():
        assert name in str(e.value)


def test_params_only_model_answers_memory_but_not_compute():
    m = ModelSpec("my-7.5b", params=7.5e9)
    assert m.params == 7_500_000_000 and not m.has_shape
    mb = memory_breakdown(m, "GGG", ClusterSpec(nodes=4), TrainingSpec())
    assert mb.shape_estimated and mb.model_states_bytes == 16 * 7.5e9 / 32
    for call in (lambda: m.layer_params, lambda: layer_forward_flops(m, TrainingSpec()),
                 lambda: step_flops(m, TrainingSpec(), 1),
                 lambda: build_plan(m, "GGG", ClusterSpec(nodes=4), TrainingSpec())):
        with pytest.raises(InputError, match="shape"):
            call()


def test_nominal_shape_is_close_in_params():
    for p in (1.3e9, 7.5e9, 70e9):
        s = nominal_shape(ModelSpec("x", params=p))
        assert s.params == pytest.approx(p, rel=0.2)


@pytest.mark.parametrize("kwargs, word", [
    (dict(layers=2, hidden=64, ffn_hidden=172, heads=5, vocab=100), "divisible"),
    (dict(layers=0, hidden=64, ffn_hidden=172, heads=4, vocab=100), "layers"),
    (dict(layers=2, hidden=64), "incomplete"),
    (dict(layers=2, hidden=64, ffn_hidden=172, heads=4, vocab=100, params=5), "disagrees"),
    (dict(params=-1), "params"),
    (dict(params=1.5), "params"),
    (dict(), "params"),
])
def test_bad_model_specs(kwargs, word):
    with pytest.raises(InputError, match=word):
        ModelSpec("bad", **kwargs)


def test_load_model_preset_and_yaml(tmp_path):
    assert load_model("LLaMA-65B") == preset("llama-65b")
    shaped = tmp_path / "tiny.yaml"
    shaped.write_text("name: tiny\nlayers: 2\nhidden: 64\nffn_hidden: 172\nheads: 4\n"
                      "vocab: 100\n")
    assert load_model(shaped).params == llama_count(2, 64, 172, 100)
    bare = tmp_path / "bare.yaml"
    bare.write_text("name: my-7.5b\nparams: 7.5e9\n")
    assert load_model(str(bare)) == ModelSpec("my-7.5b", params=7_500_000_000)
    bare.write_text("name: my-7.5b\nparams: 7.5B\n")
    assert load_model(bare).params == 7_500_000_000


@pytest.mark.parametrize("text, word", [
    ("name: x\nparams: 1e9\ncolour: red\n", "unknown key 'colour'"),
    ("name: x\nlayers: [1, 2\n", "malformed YAML"),
    ("name: x\nlayers: 2\nhidden: 64\n", "incomplete"),
    ("params: 1e9\n", "name"),
    ("name: x\n", "params"),
    ("name: x\nparams: lots\n", "number"),
    ("name: x\nparams: [1]\n", "number"),
    ("- a\n- b\n", "mapping"),
])
def test_load_model_yaml_errors(tmp_path, text, word):
    p = tmp_path / "m.yaml"
    p.write_text(text)
    with pytest.raises(InputError, match=word):
        load_model(p)


def test_load_model_missing_file_and_unknown_name(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load_model(tmp_path / "nope.yaml")
    with pytest.raises(InputError, match="llama-7b"):
        load_model("bert-large")
