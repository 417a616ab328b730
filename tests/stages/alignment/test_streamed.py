"""Streamed (layer by layer from the shards) vs resident alignment: the same numbers.

Windows of at most chunk_tokens positions are one forward on both paths, so every metric must be
identical (==, not approx): the same modules, dtypes and op order. Longer windows run in KV-cache
chunks resident and in one forward streamed; they differ by float rounding only (bound below).
MoE experts split into several read groups are summed like expert-parallel ranks (bound below).
"""

from __future__ import annotations

import math

import pytest
import torch

from day0.execution import memory
from day0.execution.contract import StageInputs
from day0.errors import ConfigError
from day0.checkpoint.modeling import load_pretrained
from day0.stages.alignment.core import Config, run
from day0.stages.alignment.layers import Capture
from day0.execution.targets import Target
from day0.torchkit.streamed import StreamedModel

from tests.stages.alignment.conftest import MODELS, PLUGINS

BF16 = Target(name="cpu-bf16", device="cpu", dtype="bfloat16")


def _metrics(source, streaming: str, target=BF16, **config) -> dict:
    # the bank off: both sides compute their reference (test_bank.py replays it)
    result = run(Config(streaming=streaming, reference_bank="off", **config),
                 StageInputs(source=str(source), target=target))
    assert result.streamed == (streaming == "on")
    return result.metrics()


def _differences(a: dict, b: dict, rel: float = 0.0) -> dict:
    def same(x, y):
        if x is None or y is None:
            return x is y
        if math.isnan(x) or math.isnan(y):
            return math.isnan(x) and math.isnan(y)
        return x == y if rel == 0 else abs(x - y) <= rel * max(abs(x), abs(y), 1e-12)
    return {k: (a[k], b[k]) for k in a if not same(a[k], b[k])}


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-deepseekv3", "tiny-qwen3moe"])
def test_streamed_metrics_equal_resident(name):
    source = MODELS / name
    settings = dict(max_windows=2, seq_len=64, generation_prompts=2, new_tokens=8)
    resident, streamed = _metrics(source, "off", **settings), _metrics(source, "on", **settings)
    assert _differences(resident, streamed) == {}
    assert resident["alignment.ops.checked"] > 20  # the op replay ran on the streamed path too


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-deepseekv3", "tiny-qwen3moe"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_streamed_layers_logits_and_routes_are_bit_identical(name, dtype):
    source = MODELS / name
    resident = load_pretrained(source, dtype=dtype)
    ids = torch.randint(3, resident.config.vocab_size, (1, 48), generator=torch.Generator()
                        .manual_seed(0))
    capture = Capture(resident)
    with torch.no_grad(), capture:
        logits = resident(input_ids=ids, position_ids=torch.arange(48)[None],
                          use_cache=False).logits
    streamed = StreamedModel(source, dtype=dtype)
    hooks, hidden, routes = Capture(streamed.model), [], {}
    batch = streamed.prepare(ids)
    for k in range(len(streamed.layers)):
        with streamed.layer(k), hooks:
            # only the running layer holds weights
            real = {n.split(".")[2] for n, p in streamed.model.named_parameters()
                    if p.device.type != "meta" and ".layers." in n}
            streamed.run_layer(k, batch)
        assert real == {str(k)}
        hidden.append(hooks.hidden[k])
        routes.update(hooks.routes)
    assert torch.equal(streamed.logits(batch.hidden), logits)
    assert all(torch.equal(a, b) for a, b in zip(capture.hidden, hidden))
    assert routes.keys() == capture.routes.keys()
    assert all(torch.equal(routes[k], capture.routes[k]) for k in routes)
    assert all(p.device.type == "meta" for n, p in streamed.model.named_parameters()
               if ".layers." in n)


@pytest.mark.parametrize("dtype,bound", [("float32", 1e-5), ("bfloat16", 2 ** -6)])
def test_expert_groups_sum_like_expert_parallel_ranks(dtype, bound):
    """One expert per read group (the tightest memory): routes identical, logits within the
    rounding of summing per-group outputs (float32 1e-5, bfloat16 one part in 64)."""
    source = MODELS / "tiny-qwen3moe"
    ids = torch.randint(3, 200, (1, 40), generator=torch.Generator().manual_seed(1))
    whole = StreamedModel(source, dtype=dtype)
    split = StreamedModel(source, dtype=dtype, expert_group_bytes=1)
    outs = []
    for model in (whole, split):
        batch = model.prepare(ids)
        for k in range(len(model.layers)):
            with model.layer(k):
                model.run_layer(k, batch)
        outs.append(model.logits(batch.hidden).float())
    assert split.experts_read == whole.experts_read > 0
    scale = outs[0].abs().max().item()
    assert (outs[0] - outs[1]).abs().max().item() <= bound * scale


def test_long_windows_streamed_within_rounding_of_kv_chunks():
    """256-position windows: resident in 4 KV-cache chunks of 64, streamed in one forward.
    Measured: relative differences up to 3e-5 on KL statistics, 1e-8 on layer errors."""
    settings = dict(max_windows=2, seq_len=256, chunk_tokens=64, generation_prompts=0)
    resident = _metrics(MODELS / "tiny-llama", "off", **settings)
    streamed = _metrics(MODELS / "tiny-llama", "on", **settings)
    assert _differences(resident, streamed, rel=1e-3) == {}
    assert streamed["alignment.logits.kl_mean"] > 0


def test_auto_streams_only_when_the_resident_copies_do_not_fit(monkeypatch):
    settings = dict(max_windows=1, seq_len=32, generation_prompts=0, check_ops=False,
                    reference_bank="off")  # a banked reference leaves only the target to hold
    source = StageInputs(source=str(MODELS / "tiny-llama"), target=BF16)
    assert not run(Config(**settings), source).streamed
    monkeypatch.setattr(memory, "available_bytes", lambda: 1024.0)
    result = run(Config(**settings), source)
    assert result.streamed and any(n.startswith("streamed:") for n in result.notes)


def test_a_target_with_plugins_is_never_streamed():
    """A plugin may rewrite weights or replace the model's forward; streaming would bypass it
    and pass a faulty target: refused with the fix instead."""
    target = BF16.model_copy(update={"plugins": [str(PLUGINS / "perturb_layer.py")]})
    with pytest.raises(ConfigError, match="streaming: off"):
        run(Config(streaming="on", max_windows=1, seq_len=32),
            StageInputs(source=str(MODELS / "tiny-llama"), target=target))


def test_streamed_progress_names_the_layer(capsys):
    _metrics(MODELS / "tiny-llama", "on", max_windows=1, seq_len=32, generation_prompts=0,
             check_ops=False)
    assert "layer 4 of 4" in capsys.readouterr().out


def test_streamed_from_s3_reads_shards_by_range_and_never_downloads_them(s3_server, monkeypatch,
                                                                        tmp_path):
    """An s3:// checkpoint streamed: config and tokenizer come to the cache, the shards stay on
    the store (ranged GETs); the metrics are the local run's."""
    from day0.store import sources

    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("DAY0_CACHE_DIR", str(tmp_path / "cache"))
    s3_server.create_bucket("streamed")
    uri = s3_server.upload_dir(MODELS / "tiny-deepseekv3", "streamed", "ds")
    settings = dict(max_windows=1, seq_len=48, generation_prompts=1, new_tokens=4)
    local = _metrics(MODELS / "tiny-deepseekv3", "on", **settings)
    remote = _metrics(uri, "on", **settings)
    assert _differences(local, remote) == {}
    cached = list(sources.cache_root().rglob("*"))
    assert any(p.name == "tokenizer.json" for p in cached)
    assert not any(p.name.endswith(".safetensors") for p in cached)


# architectures with their own twists: sliding windows and layer types (gemma3, gpt_oss,
# mistral), embedding scales and logit softcapping (gemma2/3), logit scales (cohere, granite),
# renamed MoE modules (mixtral: block_sparse_moe.experts.N.w1), experts with biases (gpt_oss:
# not streamed per expert, read with their layer)
ARCHITECTURES = {
    "qwen3": ("Qwen3Config", dict(head_dim=16)),
    "gemma3_text": ("Gemma3TextConfig", dict(head_dim=16, sliding_window=8, layer_types=[
        "sliding_attention", "sliding_attention", "full_attention"])),
    "gemma2": ("Gemma2Config", dict(head_dim=16, sliding_window=8)),
    "mistral": ("MistralConfig", dict(sliding_window=8)),
    "mixtral": ("MixtralConfig", dict(num_local_experts=4, num_experts_per_tok=2)),
    "phi3": ("Phi3Config", dict(pad_token_id=0, eos_token_id=1, bos_token_id=2)),
    "olmo2": ("Olmo2Config", dict(pad_token_id=0, eos_token_id=1, bos_token_id=2)),
    "gpt_oss": ("GptOssConfig", dict(num_local_experts=4, num_experts_per_tok=2, head_dim=16,
                                     sliding_window=8, layer_types=[
                                         "sliding_attention", "full_attention",
                                         "sliding_attention"])),
    "cohere": ("CohereConfig", dict(pad_token_id=0, eos_token_id=1, bos_token_id=2)),
    "granite": ("GraniteConfig", dict(logits_scaling=2.0)),
}


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_streamed_logits_bit_identical_across_architectures(arch, tmp_path):
    import transformers

    cls, extra = ARCHITECTURES[arch]
    torch.manual_seed(0)
    config = getattr(transformers, cls)(
        hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=300, max_position_embeddings=256, intermediate_size=128, **extra)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    resident = load_pretrained(tmp_path, dtype="float32")
    ids = torch.randint(3, 300, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = resident(input_ids=ids, position_ids=torch.arange(40)[None],
                            use_cache=False).logits
    streamed = StreamedModel(tmp_path, dtype="float32")
    batch = streamed.prepare(ids)
    for k in range(len(streamed.layers)):
        with streamed.layer(k):
            streamed.run_layer(k, batch)
    assert torch.equal(streamed.logits(batch.hidden), expected)
    assert bool(streamed.experts) == (arch == "mixtral")


def test_a_tensor_split_on_load_is_refused_by_streaming_not_misread(fused_checkpoint):
    """sarvam_moe's checkpoint fuses q/k/v into one tensor the class splits on load: streaming
    reads each parameter from one tensor whole, so it says it cannot (resident can)."""
    from day0.errors import InputError

    with pytest.raises(InputError) as info:
        StreamedModel(fused_checkpoint, dtype="float32")
    assert info.value.field == "streaming" and "query_key_value" in str(info.value)
