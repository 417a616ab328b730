"""Attention/cache layouts of today's configs: each figure against its config's arithmetic,
written out here (not by calling the code under test). Tiny configs from transformers' own
config classes, analysed config-only."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from day0.stages.analysis import core as analysis
from day0.stages.analysis.report import summary_text
from day0.execution.contract import StageInputs
from day0.execution.targets import resolve_target


def analyze(path) -> analysis.Result:
    inputs = StageInputs(source=str(path), target=resolve_target("cuda-bf16"))
    return analysis.run(analysis.Config(), inputs)


def write(tmp_path, config) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config.to_dict() if hasattr(config, "to_dict") else config))
    return str(path)


def test_gemma3_sliding_layers_hold_their_window_and_rope_per_layer_type(tmp_path):
    from transformers import Gemma3TextConfig

    cfg = Gemma3TextConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                           sliding_window=128, max_position_embeddings=4096)
    r = analyze(write(tmp_path, cfg))
    per_token_layer = 2 * 2 * 32 * 2  # K and V x kv_heads x head_dim x bf16
    # 5 sliding layers hold 128 tokens, the 6th (global) all 4096
    assert r.kv_cache.bytes_at_max_context["bfloat16"] == per_token_layer * (4096 + 5 * 128)
    assert r.kv_cache.per_layer_type["sliding"].tokens_held == 128
    assert r.attention.layer_indices["full_attention"] == [5]
    assert r.attention.layout == "5 sliding_attention + 1 full_attention"
    assert r.rope.per_layer_type["full_attention"].theta == 1_000_000.0
    assert r.rope.per_layer_type["sliding_attention"].theta == 10_000.0
    assert r.rope.theta == 1_000_000.0  # the summary: full attention's
    assert {"sliding_window", "rope_per_layer_type"} <= {x.id for x in r.risks}
    assert "sliding_attention: theta 10000" in summary_text(r)


def test_llama4_chunked_layers_hold_their_chunk_and_nope_layers(tmp_path):
    from transformers import Llama4TextConfig

    cfg = Llama4TextConfig(vocab_size=256, hidden_size=64, intermediate_size=64,
                           intermediate_size_mlp=128, num_hidden_layers=4, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=16, attention_chunk_size=256,
                           max_position_embeddings=2048, num_local_experts=2)
    r = analyze(write(tmp_path, cfg))
    per_token_layer = 2 * 2 * 16 * 2
    # layers 0-2 chunked (256 tokens), layer 3 global (2048)
    assert r.kv_cache.bytes_at_max_context["bfloat16"] == per_token_layer * (2048 + 3 * 256)
    assert r.attention.chunk_size == 256 and r.kv_cache.per_layer_type["chunked"].layers == 3
    assert r.rope.no_rope_layers == [3]
    assert {"chunked_attention", "no_rope_layers"} <= {x.id for x in r.risks}


def test_deepseek_v32_caches_latent_rope_key_and_indexer_key(tmp_path):
    from transformers import DeepseekV32Config

    cfg = DeepseekV32Config(vocab_size=256, hidden_size=64, intermediate_size=128,
                            moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                            kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=16, qk_nope_head_dim=16,
                            v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
                            topk_group=1, index_n_heads=4, index_head_dim=24, index_topk=8,
                            max_position_embeddings=1024)
    r = analyze(write(tmp_path, cfg))
    assert r.attention.kind == "mla" and (r.attention.index_n_heads, r.attention.index_topk) == (4, 8)
    # latent 32 + rope key 16 + the indexer's single-head key 24, per layer, bf16
    assert r.kv_cache.bytes_per_token["bfloat16"] == 2 * (32 + 16 + 24) * 2


def test_mamba2_state_per_sequence(tmp_path):
    from transformers import Mamba2Config

    cfg = Mamba2Config(vocab_size=256, hidden_size=64, num_hidden_layers=3, state_size=16, expand=2,
                       n_groups=2, num_heads=8, head_dim=16, conv_kernel=4)
    r = analyze(write(tmp_path, cfg))
    conv = (2 * 64 + 2 * 2 * 16) * 4   # (expand x hidden + 2 x groups x state) x kernel
    ssm = 8 * 16 * 16                  # heads x head_dim x state
    assert r.attention.kind == "none" and r.kv_cache.bytes_per_token["bfloat16"] == 0
    assert (r.state.conv_elements_per_layer, r.state.ssm_elements_per_layer) == (conv, ssm)
    assert r.state.bytes_per_sequence["bfloat16"] == 3 * (conv + ssm) * 2
    assert r.state.bytes_per_sequence["float32"] == 3 * (conv + ssm) * 4
    assert "recurrent state: 3 stateful" in summary_text(r)


def test_qwen3_next_linear_attention_state_and_full_layers(tmp_path):
    from transformers import Qwen3NextConfig

    cfg = Qwen3NextConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                          linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=12,
                          linear_num_key_heads=2, linear_num_value_heads=4, num_experts=2,
                          num_experts_per_tok=1, moe_intermediate_size=32,
                          shared_expert_intermediate_size=32, max_position_embeddings=512)
    r = analyze(write(tmp_path, cfg))
    conv = (2 * 2 * 8 + 4 * 12) * 4   # (2 x key heads x key dim + value heads x value dim) x kernel
    ssm = 4 * 8 * 12                  # value heads x key dim x value dim
    assert r.kv_cache.layers["stateful"] == 3 and r.state.attention_layers == 1
    assert r.state.bytes_per_sequence["bfloat16"] == 3 * (conv + ssm) * 2
    assert r.kv_cache.bytes_at_max_context["bfloat16"] == 1 * 2 * 2 * 16 * 2 * 512
    assert r.rope.partial_rotary_factor == 0.25


def test_falcon_h1_saved_by_transformers_is_accepted_with_its_infinity(tmp_path):
    """save_pretrained writes time_step_limit's inf as {"__float__": "Infinity"}: day0 reads it
    as transformers does (it used to refuse the config, exit 2)."""
    from transformers import FalconH1Config

    cfg = FalconH1Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, mamba_d_ssm=96,
                         mamba_n_heads=8, mamba_d_head=12, mamba_n_groups=2, mamba_d_state=8,
                         mamba_d_conv=4, max_position_embeddings=256)
    cfg.save_pretrained(tmp_path)
    assert '"__float__": "Infinity"' in (tmp_path / "config.json").read_text()
    proc = subprocess.run([sys.executable, "-m", "day0.cli", "analyze", str(tmp_path), "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    conv = (96 + 2 * 2 * 8) * 4   # (mamba_d_ssm + 2 x groups x state) x d_conv
    ssm = 8 * 12 * 8              # heads x head_dim x state
    assert doc["state"]["bytes_per_sequence"]["bfloat16"] == 2 * (conv + ssm) * 2
    # every layer is hybrid: attention beside the SSM, so each also holds K/V
    assert doc["kv_cache"]["bytes_per_token"]["bfloat16"] == 2 * 2 * 2 * 16 * 2


def test_unknown_field_values_are_noted_not_guessed_and_never_crash(tmp_path):
    from transformers import MistralConfig

    cfg = MistralConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2).to_dict()
    cfg["no_rope_layers"] = "some"   # fields transformers' Mistral ignores, of the wrong type
    cfg["index_topk"] = "many"
    r = analyze(write(tmp_path, cfg))
    assert r.attention.index_topk is None and r.rope.no_rope_layers == []
    assert any("unknown: no_rope_layers" in u for u in r.unknown)
    assert any("unknown: index_topk" in u for u in r.unknown)
    assert "unknown_field" in {x.id for x in r.risks}
    assert "unknown: index_topk" in summary_text(r)
    # every formatter takes None: a result whose figures are unknown still renders
    blank = r.model_copy(deep=True)
    blank.rope.theta = blank.rope.original_max_positions = None
    blank.rope.factor = None
    blank.vocab_size = None
    assert "theta unknown" in summary_text(blank)


def test_per_type_rope_summary_is_never_null_when_a_type_has_theta(tmp_path):
    from transformers import Gemma3TextConfig

    cfg = Gemma3TextConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=32).to_dict()
    cfg["rope_parameters"]["full_attention"]["rope_theta"] = None
    r = analyze(write(tmp_path, cfg))
    assert r.rope.theta == 10_000.0 and r.rope.per_layer_type["full_attention"].theta is None
    summary_text(r)


def test_rope_factor_of_the_wrong_type_is_unknown():
    from day0.checkpoint.configview import resolve
    from day0.stages.analysis.model import rope_facts

    unknown: list[str] = []
    rope = rope_facts(resolve({"model_type": "llama", "rope_parameters": {
        "rope_type": "yarn", "rope_theta": 1e4, "factor": "large", "beta_fast": 32,
        "original_max_position_embeddings": 4096}}), unknown)
    assert rope.factor is None and rope.theta == 1e4 and rope.variant["beta_fast"] == 32
    assert unknown == ["unknown: rope_parameters.factor (not a number: 'large')"]
