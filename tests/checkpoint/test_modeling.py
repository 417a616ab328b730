"""Config resolution: known types, the architectures fallback, and remote code only when allowed."""

import json

import pytest

from day0.errors import InputError
from day0.checkpoint.modeling import build_meta_model, resolve_config

CONFIG_PY = '''
from transformers import LlamaConfig

class TinyCustomConfig(LlamaConfig):
    model_type = "tiny_custom"
'''
MODELING_PY = '''
from transformers import LlamaForCausalLM
from .configuration_tiny import TinyCustomConfig

class TinyCustomForCausalLM(LlamaForCausalLM):
    config_class = TinyCustomConfig
'''


@pytest.fixture
def remote_ckpt(tmp_path):
    (tmp_path / "configuration_tiny.py").write_text(CONFIG_PY)
    (tmp_path / "modeling_tiny.py").write_text(MODELING_PY)
    config = {"model_type": "tiny_custom", "architectures": ["TinyCustomForCausalLM"],
              "auto_map": {"AutoConfig": "configuration_tiny.TinyCustomConfig",
                           "AutoModelForCausalLM": "modeling_tiny.TinyCustomForCausalLM"},
              "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path, config


def test_remote_code_needs_explicit_permission(remote_ckpt):
    folder, config = remote_ckpt
    with pytest.raises(InputError) as err:
        resolve_config(config, file=str(folder / "config.json"))
    assert "tiny_custom" in str(err.value) and "--trust-remote-code" in str(err.value)


def test_remote_code_loads_when_allowed(remote_ckpt):
    folder, config = remote_ckpt
    resolved = resolve_config(config, trust_remote_code=True, file=str(folder / "config.json"))
    assert resolved.model_class.__name__ == "TinyCustomForCausalLM"
    assert any("trust_remote_code" in n for n in resolved.notes)
    model = build_meta_model(resolved)
    assert sum(p.numel() for p in model.parameters()) > 0


def test_broken_remote_code_is_input_error(remote_ckpt):
    folder, config = remote_ckpt
    (folder / "modeling_tiny.py").write_text("raise RuntimeError('boom')\n")
    with pytest.raises(InputError, match="remote code does not load"):
        resolve_config(config, trust_remote_code=True, file=str(folder / "config.json"))


def test_architectures_fallback_prefers_the_matching_type():
    config = {"model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"],
              "hidden_size": 64, "num_hidden_layers": 2}
    resolved = resolve_config(config)
    assert resolved.config.model_type == "deepseek_v3"
    assert "unknown to transformers" in resolved.notes[0]


@pytest.mark.parametrize("model_type, where, dims", [
    ("mamba2", "backbone.layers", dict(hidden_size=64, num_hidden_layers=3, num_heads=4,
                                       head_dim=32, state_size=8, n_groups=1, expand=2)),
    ("gpt2", "transformer.h", dict(n_embd=64, n_layer=3, n_head=4))])
def test_decoder_layers_of_classes_without_model_layers(model_type, where, dims):
    """The blocks of an architecture day0 names nowhere: the module list holding
    num_hidden_layers blocks, the shallowest (never a block's own list, e.g. MoE experts)."""
    import torch
    import transformers

    from day0.checkpoint.modeling import decoder_layers

    config = transformers.AutoConfig.for_model(model_type, vocab_size=128, **dims)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    layers = decoder_layers(model)
    assert len(layers) == 3 and layers[0] is model.get_submodule(where)[0]
