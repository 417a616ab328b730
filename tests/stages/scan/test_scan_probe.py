"""Probe helpers: config shrinking and the CPU float32 fallback for ops the target lacks."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from day0.stages.scan.probe import ProbeAborted, ProbeRecorder, cpu_fallback
from day0.torchkit.shrink import shrink_config

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
