"""The fault plugins of tests/plugins really inject their fault; the correct-stack plugins do not.

Each runs on the float32 fixtures and is compared with the same model without it.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from day0.checkpoint.modeling import decoder_layers, load_pretrained
from day0.execution.plugins import load_plugin
from tests.conftest import MODELS, PLUGINS

SEQ = 256  # == max_position_embeddings of every fixture


def model(name: str):
    return load_pretrained(MODELS / name)


def plugin(name: str):
    return load_plugin(str(PLUGINS / f"{name}.py"))


@functools.cache
def tokens() -> torch.Tensor:
    return torch.randint(3, 512, (1, SEQ), generator=torch.Generator().manual_seed(0))


def logits(m, ids=None, **kwargs) -> torch.Tensor:
    with torch.inference_mode():
        return m(input_ids=tokens() if ids is None else ids, **kwargs).logits[0].float()


@functools.cache
def clean(name: str) -> torch.Tensor:
    return logits(model(name))


FAULTS = [
    ("scale_layer", "tiny-llama"), ("rmsnorm_eps", "tiny-llama"), ("rmsnorm_eps", "tiny-qwen3moe"),
    ("rope_base_low", "tiny-llama"), ("rope_base_low", "tiny-qwen3moe"),
    ("rope_base_low", "tiny-deepseekv3"), ("expert_swap", "tiny-qwen3moe"),
    ("expert_swap", "tiny-deepseekv3"), ("int8_weights", "tiny-llama"),
    ("int8_weights", "tiny-qwen3moe"), ("int4_weights", "tiny-llama"),
    ("int4_weights", "tiny-deepseekv3"), ("int4_late", "tiny-llama"), ("int4_late", "tiny-qwen3moe"),
]


@pytest.mark.parametrize("fault,name", FAULTS)
def test_fault_changes_the_logits(fault, name):
    m = model(name)
    plugin(fault)(m)
    faulty = logits(m)
    assert torch.isfinite(faulty).all()
    assert (faulty - clean(name)).abs().max() > 1e-3


def test_scale_layer_hits_the_middle_layer_by_default():
    m = model("tiny-llama")
    plugin("scale_layer")(m)
    assert m.day0_scaled_layer == len(decoder_layers(m)) // 2


def test_expert_swap_refuses_a_dense_model():
    with pytest.raises(ValueError, match="no MoE router"):
        plugin("expert_swap")(model("tiny-llama"))


@pytest.mark.parametrize("name", ["tiny-qwen3moe", "tiny-deepseekv3"])
def test_expert_swap_exchanges_ranks_one_and_two(name):
    m = model(name)
    plugin("expert_swap")(m)
    routers = [mod for mod in m.modules() if type(mod).__name__.endswith(("Router", "router"))]
    assert routers
    hidden = torch.randn(40, m.config.hidden_size, generator=torch.Generator().manual_seed(1))
    for router in routers:
        with torch.no_grad():
            _, weights, indices = router.forward(hidden)  # forward skips the plugin's hook
            _, swapped_weights, swapped = router(hidden)
        order = weights.argsort(dim=-1, descending=True)
        rank = lambda idx, r: idx.gather(-1, order[:, r:r + 1])  # noqa: E731
        assert torch.equal(swapped_weights, weights)  # weights stay in rank order
        assert torch.equal(rank(swapped, 0), rank(indices, 1))
        assert torch.equal(rank(swapped, 1), rank(indices, 0))
        assert (rank(indices, 0) != rank(indices, 1)).all()


def test_rope_base_low_recomputes_inv_freq_and_leaves_the_config():
    m = model("tiny-llama")
    theta = m.config.rope_parameters["rope_theta"]
    plugin("rope_base_low")(m)
    dim = m.config.head_dim
    expected = 1.0 / (0.9 * theta) ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)
    torch.testing.assert_close(m.model.rotary_emb.inv_freq, expected)
    assert m.config.rope_parameters["rope_theta"] == theta


def test_rope_base_low_keeps_yarn_attention_scaling():
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(MODELS / "tiny-deepseekv3")
    config.rope_parameters = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                              "original_max_position_embeddings": 64, "beta_fast": 32,
                              "beta_slow": 1}
    m = AutoModelForCausalLM.from_config(config).eval()
    rotary = m.model.rotary_emb
    before, scaling = rotary.inv_freq.clone(), rotary.attention_scaling
    reference = logits(m)
    plugin("rope_base_low")(m)
    assert rotary.attention_scaling == pytest.approx(scaling) and scaling != 1.0
    assert (rotary.inv_freq > before).any() and torch.equal(rotary.original_inv_freq,
                                                            rotary.inv_freq)
    assert (logits(m) - reference).abs().max() > 1e-4


def test_rmsnorm_eps_sets_every_norm():
    m = model("tiny-qwen3moe")
    plugin("rmsnorm_eps")(m)
    norms = [mod for mod in m.modules() if type(mod).__name__.endswith("RMSNorm")]
    assert len(norms) > 2 * m.config.num_hidden_layers  # q_norm/k_norm too
    assert all(mod.variance_epsilon == 1e-2 for mod in norms)


@pytest.mark.parametrize("fault,levels,group", [("int8_weights", 255, None),
                                                ("int4_weights", 15, 32)])
def test_weight_quantization_granularity(fault, levels, group):
    m = model("tiny-llama")
    before = m.lm_head.weight.clone()
    plugin(fault)(m)
    weight = decoder_layers(m)[0].self_attn.q_proj.weight
    blocks = weight.reshape(weight.shape[0], -1, group or weight.shape[1])
    assert max(len(torch.unique(block)) for block in blocks.reshape(-1, blocks.shape[-1])) <= levels
    assert torch.equal(m.lm_head.weight, before)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3moe"])
def test_int4_late_changes_only_late_positions(name):
    m = model(name)
    plugin("int4_late")(m)
    start = m.day0_quantized_from_position
    assert start == int(0.75 * m.config.max_position_embeddings)
    faulty = logits(m)
    # not bit-equal everywhere: an MoE's expert batches change with the late tokens' routes,
    # and with them the matmuls' blocking on some CPUs (AVX2 EPYC: last-bit differences); a
    # change the fault makes is over 100x this tolerance
    torch.testing.assert_close(faulty[:start], clean(name)[:start], rtol=1e-5, atol=1e-5)
    assert ((faulty[start:] - clean(name)[start:]).abs().amax(-1) > 1e-3).all()


def test_int4_late_uses_absolute_positions_of_cached_chunks():
    from transformers import DynamicCache

    m = model("tiny-llama")
    plugin("int4_late")(m)
    start, half = m.day0_quantized_from_position, SEQ // 2
    cache, chunks = DynamicCache(config=m.config), []
    for begin in (0, half):
        positions = torch.arange(begin, begin + half)[None]
        chunks.append(logits(m, tokens()[:, begin:begin + half], position_ids=positions,
                             cache=cache, use_cache=True))
    chunked = torch.cat(chunks)
    reference = clean("tiny-llama")
    torch.testing.assert_close(chunked[:start], reference[:start], rtol=1e-4, atol=1e-4)
    assert ((chunked[start:] - reference[start:]).abs().amax(-1) > 1e-3).all()


def test_nan_once_fires_on_the_first_forward_only():
    m = model("tiny-llama")
    plugin("nan_once")(m)
    first, second = logits(m), logits(m)
    assert torch.isnan(first[SEQ // 2:]).all()  # attention spreads it to later positions
    assert torch.equal(second, clean("tiny-llama"))


def test_stack_threads1_runs_single_threaded_and_restores():
    m = model("tiny-llama")
    seen = []
    decoder_layers(m)[0].register_forward_pre_hook(lambda *_: seen.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    plugin("stack_threads1")(m)
    torch.testing.assert_close(logits(m), clean("tiny-llama"), rtol=1e-5, atol=1e-5)
    assert seen == [1] and torch.get_num_threads() == before


@pytest.mark.slow
def test_stack_compile_matches_eager_in_generate():
    eager = model("tiny-llama")
    compiled = copy.deepcopy(eager)
    plugin("stack_compile")(compiled)
    prompt = tokens()[:, :8]
    kwargs = dict(max_new_tokens=2, do_sample=False, attention_mask=torch.ones_like(prompt),
                  output_logits=True, return_dict_in_generate=True)
    got, want = compiled.generate(prompt, **kwargs), eager.generate(prompt, **kwargs)
    assert torch.equal(got.sequences, want.sequences)
    for step_got, step_want in zip(got.logits, want.logits, strict=True):  # prefill, then decode
        torch.testing.assert_close(step_got, step_want, rtol=1.6e-2, atol=1e-5)  # bf16's tolerance
