"""Probe helpers: config shrinking and the CPU float32 fallback for ops the target lacks."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from day0.stages.scan.probe import ProbeAborted, ProbeRecorder, cpu_fallback
from day0.torchkit.shrink import shrink_config
from tests.conftest import MODELS

CONFIGS = Path(__file__).parents[2] / "fixtures" / "configs"
aten = torch.ops.aten


def test_shrink_keeps_every_layer_kind():
    from transformers import GptOssConfig

    from day0.checkpoint.files import read_config_dict
    from day0.checkpoint.modeling import resolve_config

    deepseek = resolve_config(read_config_dict(CONFIGS / "DeepSeek-V3.json")).config
    small = shrink_config(deepseek, hidden=64, heads=4, intermediate=128, vocab=256, max_layers=8)
    assert (small.num_hidden_layers, small.first_k_dense_replace) == (2, 1)
    assert small.n_routed_experts % small.n_group == 0
    assert small.topk_group * small.n_routed_experts // small.n_group >= small.num_experts_per_tok
    assert small.num_key_value_heads == small.num_attention_heads == 4   # MHA ratio 1 kept
    gpt_oss = GptOssConfig(num_hidden_layers=24)
    small = shrink_config(gpt_oss, hidden=64, heads=4, intermediate=128, vocab=256, max_layers=8)
    assert set(small.layer_types) == set(gpt_oss.layer_types)
    assert len(small.layer_types) == small.num_hidden_layers
    assert small.num_attention_heads // small.num_key_value_heads == \
        min(4, gpt_oss.num_attention_heads // gpt_oss.num_key_value_heads)


@pytest.mark.parametrize("model_type, check", [
    # sizes the class derives from hidden_size in __post_init__ follow the shrunk one
    ("recurrent_gemma", lambda c: c.lru_width == c.hidden_size
     and "attention" in [c.block_types[i % 3] for i in range(c.num_hidden_layers)]),
    ("xlstm", lambda c: c.embedding_dim == c.hidden_size and c.num_blocks == c.num_hidden_layers),
    # layer kinds under an aliased name (layers_block_type) are kept like layer_types
    ("zamba2", lambda c: c.attention_hidden_size == 2 * c.hidden_size
     and set(c.layers_block_type) == {"linear_attention", "hybrid"}),
    # HRM: two stacks of num_layers_per_stack layers; num_hidden_layers counts their runs
    ("hrm_text", lambda c: c.num_layers_per_stack <= 8
     and c.num_hidden_layers == c.num_layers_per_stack * c.H_cycles * (c.L_cycles + 1)),
])
def test_shrink_sizes_what_the_class_derives(model_type, check):
    from transformers import AutoConfig

    small = shrink_config(AutoConfig.for_model(model_type), hidden=64, heads=4,
                          intermediate=128, vocab=256, max_layers=8)
    assert small.hidden_size == 64 and check(small), small.to_dict()


@pytest.mark.parametrize("model_type, check", [
    # sections that must sum to the layer count (input + recurrent + output) still do
    ("dory", lambda c: c.n_input_layers + c.n_recurrent_layers + c.n_output_layers
     == c.num_hidden_layers <= 8 and "mlp" not in c.layer_types),
    # the sliding layers' MLA head_dim is their own qk_nope + qk_rope widths, as validated
    ("dots3_note_text", lambda c: c.per_layer_config["sliding_attention"].head_dim
     == c.per_layer_config["sliding_attention"].qk_nope_head_dim + c.qk_rope_head_dim),
    # axial position embedding widths still sum to the hidden size
    ("reformer", lambda c: sum(c.axial_pos_embds_dim) == c.hidden_size),
    # two hybrid layers: one's shared block is tied to the other's
    ("zamba", lambda c: c.layers_block_type.count("hybrid") >= 2),
    # kinds placed by offset and period (attention at layer 4 of every 8): each one kept
    ("jamba", lambda c: {"attention", "mamba"} <= set(c.layers_block_type)
     and any(c.layers_num_experts[i] > 1 for i in range(c.num_hidden_layers))),
])
def test_shrunk_config_builds_its_class(model_type, check):
    """Sizes the config validates against each other stay consistent: the class constructs."""
    import transformers

    from day0.torchkit.tiny import causal_lm_types, tiny_config

    small = tiny_config(model_type)
    assert small.hidden_size == 64 and check(small), small.to_dict()
    with torch.device("meta"):
        getattr(transformers, causal_lm_types()[model_type])._from_config(small)


def test_shrink_follows_sub_configs():
    """DBRX sizes attention and FFN in sub-configs: their widths, experts and KV heads follow."""
    from transformers import DbrxConfig, DbrxForCausalLM

    release = DbrxConfig(d_model=6144, n_heads=48, n_layers=40, vocab_size=100352,
                         attn_config={"kv_n_heads": 8, "clip_qkv": 8, "rope_theta": 5e5},
                         ffn_config={"hidden_size": 6144, "ffn_hidden_size": 10752,
                                     "moe_num_experts": 16, "moe_top_k": 4})
    small = shrink_config(release, hidden=64, heads=4, intermediate=128, vocab=256, max_layers=8)
    assert small.ffn_config.hidden_size == small.d_model == 64
    assert small.attn_config.kv_n_heads == small.num_key_value_heads == 1
    assert small.ffn_config.moe_top_k < small.ffn_config.moe_num_experts <= 16
    with torch.device("meta"):
        DbrxForCausalLM(small)


@pytest.mark.parametrize("model_type, unfilled", [
    ("gemma4_assistant", False),  # its default config fails its own validation
    ("lfm2_moe", True),  # layer_types None: the class does not build from its default either
])
def test_default_config_that_does_not_build_is_blamed_on_transformers(tmp_path, monkeypatch,
                                                                      model_type, unfilled):
    """A class that does not build from its own unshrunk default is not the shrink's failure."""
    from day0.torchkit import tiny

    if unfilled:  # as transformers ships it, without the values tiny fills in
        monkeypatch.setattr(tiny, "_fill_unset", lambda config: None)
    with pytest.raises(tiny.Unbuildable, match=r"^default config fails \(transformers"):
        tiny.build_tiny(model_type, tmp_path / "tiny", tokenizer_from=tmp_path)


@pytest.mark.parametrize("model_type, check", [
    # full-attention layers without RoPE (NoPE), as North's releases
    ("cohere_compass_text", lambda c: c.rope_parameters == {"full_attention": None}),
    # the attention sub-config's stored theta is the model's; q/k/v clipped as released
    ("dbrx", lambda c: c.attn_config.rope_theta == c.rope_parameters["rope_theta"]
     and c.attn_config.clip_qkv == 8),
    # routed and shared experts, top-k below the (shrunk) expert count
    ("dots1", lambda c: 0 < c.num_experts_per_tok < c.n_routed_experts and c.n_shared_experts),
    # the hybrid layout: a dense conv layer, then an MoE attention layer
    ("lfm2_moe", lambda c: c.layer_types == ["conv", "full_attention"]
     and c.num_dense_layers == 1),
    # the QSA indexer, its head wide enough for the attention's rotary dims
    ("qwen4_exp_text", lambda c: c.indexer_kv_heads == 1 and c.indexer_head_dim >= c.head_dim
     and c.indexer_budget % c.indexer_compress_ratio == 0),
])
def test_valid_values_fill_what_the_default_leaves_unset(model_type, check):
    """Defaults that leave a field every release sets unset (the class does not build even
    unshrunk) get a valid value: the released one where it is known (dots1, DBRX), otherwise
    one the class accepts where transformers states none. The tiny config builds its class."""
    import transformers

    from day0.torchkit.tiny import causal_lm_types, tiny_config

    small = tiny_config(model_type)
    assert check(small), small.to_dict()
    with torch.device("meta"):
        getattr(transformers, causal_lm_types()[model_type])._from_config(small)


def test_multimodal_types_build_tiny_as_their_class_takes_them(tmp_path):
    """A causal-LM class that is the language model alone (Llama4ForCausalLM) gets the text
    config; one that builds its towers too (Gemma3ForConditionalGeneration) gets them shrunk
    by the same rules, with the widths joining tower and language model kept equal; a tower
    the rules cannot shrink is refused by size, naming where the parameters are."""
    import transformers

    from day0.torchkit import tiny

    llama4 = tiny.build_tiny("llama4", tmp_path / "llama4", tokenizer_from=MODELS / "tiny-llama")
    saved = json.loads((llama4.folder / "config.json").read_text())
    assert saved["model_type"] == "llama4_text" and "vision_config" not in saved
    gemma3 = tiny.build_tiny("gemma3", tmp_path / "gemma3", tokenizer_from=MODELS / "tiny-llama")
    saved = json.loads((gemma3.folder / "config.json").read_text())
    assert saved["vision_config"]["hidden_size"] == saved["text_config"]["hidden_size"] == 64
    assert saved["vision_config"]["num_hidden_layers"] <= 8
    assert gemma3.tensor_elements < 1_000_000
    # an audio tower's blocks beside the language model's, as many and as deep: never walked
    from day0.checkpoint.modeling import decoder_layers

    moss = tiny.tiny_config("moss_transcribe_diarize")
    with torch.device("meta"):
        model = getattr(transformers, tiny.causal_lm_types()["moss_transcribe_diarize"])(moss)
    assert decoder_layers(model)[0] is model.model.language_model.layers[0]
    with pytest.raises(tiny.Unbuildable, match=r"^multimodal: .* encoder tower keeps \d+ M "
                                               r"parameters, most in model\.encoder_hash"):
        tiny.build_tiny("blt", tmp_path / "blt", tokenizer_from=MODELS / "tiny-llama")


def test_cpu_fallback_keeps_dtype_and_in_place_semantics():
    x = torch.randn(4, 4, dtype=torch.bfloat16)
    y = torch.randn(4, 4, dtype=torch.bfloat16)
    out = cpu_fallback(aten.mm.default, (x, y), {})
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, (x.float() @ y.float()).bfloat16())
    expected = (x.float() + y.float()).bfloat16()
    same = cpu_fallback(aten.add_.Tensor, (x, y), {})
    assert same is x and torch.equal(x, expected)
    up = cpu_fallback(aten._to_copy.default, (x,), {"dtype": torch.float32})
    assert up.dtype == torch.float32                  # the op's own dtype, taken from meta


def test_probe_recorder_marks_failures_and_continues():
    """silu's CPU kernel raises: recorded as a failure, computed by its decomposition instead."""
    def missing(*args, **kwargs):
        raise NotImplementedError("aten::silu missing (test)")

    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lib.impl("silu", missing, "CPU")
    try:
        x = torch.randn(4, 8, dtype=torch.bfloat16)
        with ProbeRecorder() as rec:
            out = torch.nn.functional.silu(x) * 2
    finally:
        lib._destroy()
    torch.testing.assert_close(out, (torch.nn.functional.silu(x.float()) * 2).bfloat16())
    assert "silu missing" in rec.failures["aten.silu.default"]
    assert set(rec.failures) == {"aten.silu.default"} and rec.ops["aten.mul.Tensor"].count == 1


def test_composite_failing_before_any_kernel_is_uncovered():
    """SDPA can refuse before dispatching a kernel ('no available kernel'): blamed on SDPA."""
    def refuse(*args, **kwargs):
        raise RuntimeError("No available kernel. Aborting execution. (test)")

    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lib.impl("scaled_dot_product_attention", refuse, "CompositeImplicitAutograd")
    q = torch.randn(1, 2, 4, 8)
    try:
        with pytest.raises(ProbeAborted, match="scaled_dot_product_attention"), \
                ProbeRecorder() as rec:   # the CPU fallback is the same refusing CPU here
            torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    finally:
        lib._destroy()
    assert "No available kernel" in rec.failures["aten.scaled_dot_product_attention.default"]
