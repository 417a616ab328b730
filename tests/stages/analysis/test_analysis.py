"""day0.stages.analysis against published figures of real models, unseen configs and real tiny checkpoints.

Published figures (facts, not outputs of this code):
* Llama-3.1-8B: 8,030,261,248 parameters (tensor sum of the released checkpoint), dense.
* Mixtral-8x7B: 46.7B total, 12.9B active (Mixtral of Experts, arXiv:2401.04088).
* DeepSeek-V3: 671B main model (MTP excluded), 37B active (arXiv:2412.19437); KV cache
  70,272 bytes/token in BF16 (MLA: 61 layers x (512 + 64) x 2; arXiv:2505.09343, Table 1).
* Qwen3-30B-A3B: 30.5B total, 3.3B active (Qwen3 model card).
* Mistral-7B-v0.1: 7.24B parameters, sliding window 4096 (Mistral 7B, arXiv:2310.06825).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from pathlib import Path

import pytest
import yaml

from day0 import stages
from day0.stages.analysis import core as analysis
from day0.stages.analysis.report import summary_text
from day0.stages.analysis.plan import GIB, make_plan
from day0.execution.contract import StageInputs
from day0.errors import CheckpointError, InputError
from day0.execution.targets import Target, resolve_target

CONFIGS = Path(__file__).resolve().parents[2] / "fixtures" / "configs"
METRICS_YAML = stages.get("analysis").metrics_file


def analyze(source, target: Target | None = None, **config) -> analysis.Result:
    inputs = StageInputs(source=str(source), target=target or resolve_target("cuda-bf16"))
    return analysis.run(analysis.Config(**config), inputs)


@pytest.fixture(scope="module")
def llama8b() -> analysis.Result:
    return analyze(CONFIGS / "Llama-3.1-8B.json")


@pytest.fixture(scope="module")
def mixtral() -> analysis.Result:
    return analyze(CONFIGS / "Mixtral-8x7B-v0.1.json")


@pytest.fixture(scope="module")
def deepseek() -> analysis.Result:
    return analyze(CONFIGS / "DeepSeek-V3.json")


def risk_ids(result) -> set[str]:
    return {r.id for r in result.risks}


# ------------------------------------------------------------------------------- published figures

def test_llama_3_1_8b(llama8b):
    r = llama8b
    assert r.params.total == 8_030_261_248 and r.params.active == r.params.total
    assert r.moe is None and r.attention.kind == "gqa"
    assert (r.attention.num_heads, r.attention.num_kv_heads, r.attention.head_dim) == (32, 8, 128)
    assert r.kv_cache.bytes_per_token["bfloat16"] == 2 * 32 * 8 * 128 * 2
    assert r.kv_cache.bytes_per_token["float8"] == 2 * 32 * 8 * 128
    assert r.kv_cache.bytes_at_max_context["bfloat16"] == 131072 * 131072
    assert r.rope.type == "llama3" and r.rope.factor == 8.0 and r.rope.theta == 500000.0
    assert r.rope.original_max_positions == 8192 and r.max_context == 131072
    assert r.memory.weights_bytes["bfloat16"] == 2 * r.params.total
    assert r.memory.weights_bytes["float32"] == 4 * r.params.total
    assert r.params.total < r.memory.weights_bytes["float8"] < 2 * r.params.total
    assert {"rope_scaling", "very_long_context", "no_weights"} <= risk_ids(r)
    assert r.plan.fits and r.plan.tp == 1 and r.plan.ep is None


def test_mixtral_8x7b(mixtral):
    r = mixtral
    assert r.params.total == pytest.approx(46.7e9, rel=0.01)
    assert r.params.active == pytest.approx(12.9e9, rel=0.01)
    assert (r.moe.num_experts, r.moe.experts_per_token, r.moe.shared_experts, r.moe.moe_layers) == (8, 2, 0, 32)
    assert r.params.active == r.params.total - round(r.moe.routed_params * (1 - 2 / 8))
    assert r.attention.kind == "gqa" and r.rope.type == "default"
    # 87 GiB of bf16 weights do not fit one 80 GiB card: TP=2 with experts split EP=2 in the node
    assert r.plan.fits and (r.plan.tp, r.plan.pp, r.plan.ep) == (2, 1, 2)


def _deepseek_by_hand(c: dict) -> tuple[int, int]:
    """Total and active parameters of DeepSeek-V3's main model from its hyperparameters."""
    h, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
    qr, kvr, rope = c["q_lora_rank"], c["kv_lora_rank"], c["qk_rope_head_dim"]
    nope, v = c["qk_nope_head_dim"], c["v_head_dim"]
    attn = (h * qr + qr + qr * heads * (nope + rope) + h * (kvr + rope) + kvr
            + kvr * heads * (nope + v) + heads * v * h)
    expert = 3 * h * c["moe_intermediate_size"]
    dense_layers = c["first_k_dense_replace"]
    moe_layers = layers - dense_layers
    base = (layers * (attn + 2 * h) + dense_layers * 3 * h * c["intermediate_size"]
            + moe_layers * (c["n_shared_experts"] * expert + c["n_routed_experts"] * h)
            + 2 * c["vocab_size"] * h + h)
    total = base + moe_layers * c["n_routed_experts"] * expert
    active = base + moe_layers * c["num_experts_per_tok"] * expert
    return total, active


def test_deepseek_v3(deepseek):
    r = deepseek
    by_hand_total, by_hand_active = _deepseek_by_hand(json.loads((CONFIGS / "DeepSeek-V3.json").read_text()))
    assert r.params.total == pytest.approx(by_hand_total, rel=1e-6)
    assert r.params.active == pytest.approx(by_hand_active, rel=1e-6)
    assert r.params.total == pytest.approx(671e9, rel=0.01)
    # The published "37B" is rounded: the hyperparameters give 37.55B (36.6B without the input
    # embedding); 2% is the widest reading of a two-significant-figure number.
    assert r.params.active == pytest.approx(37e9, rel=0.02)
    assert r.kv_cache.bytes_per_token["bfloat16"] == 70_272
    assert r.kv_cache.bytes_per_token["float8"] == 35_136
    assert r.attention.kind == "mla" and r.attention.kv_lora_rank == 512
    assert (r.moe.num_experts, r.moe.experts_per_token, r.moe.shared_experts, r.moe.moe_layers) == (256, 8, 1, 58)
    assert r.moe.scoring == "sigmoid" and r.moe.n_group == 8 and r.moe.topk_group == 4
    assert r.rope.type == "yarn" and r.rope.factor == 40 and r.rope.original_max_positions == 4096
    assert {"mla", "mla_cache_expanded", "moe", "moe_grouped_routing", "sigmoid_scoring", "rope_yarn",
            "very_long_context", "fp8_quantization", "mtp_layers", "remote_code"} <= risk_ids(r)
    # 1.25 TiB of bf16 weights cannot fit 8 x 80 GiB: fits is false, with the reason and an error risk
    assert not r.plan.fits and r.plan.reason and r.plan.min_cards and r.plan.min_cards > 8
    assert "plan_does_not_fit" in risk_ids(r) and r.metrics()["analysis.risk_errors"] >= 1


def test_deepseek_plan_on_a_bigger_cluster_uses_pp_across_domains():
    big = Target(name="h200x32", device="cuda", dtype="bfloat16", card_memory_gib=141,
                 cards=32, cards_per_domain=8)
    r = analyze(CONFIGS / "DeepSeek-V3.json", big)
    p = r.plan
    assert p.fits and p.tp == 8 and p.ep == 8 and p.pp > 1 and p.tp * p.pp <= 32
    assert p.heaviest_traffic == "ep" and "EP" in p.rationale and "PP" in p.rationale
    assert p.per_card_bytes["weights"] + p.per_card_bytes["kv"] <= p.per_card_bytes["usable"]
    # MLA's latent cache is not split by TP: each card of a stage holds that stage's whole cache
    assert p.per_card_bytes["kv"] == math.ceil(r.kv_cache.bytes_at_max_context["bfloat16"] / p.pp)


# ------------------------------------------------------------------------------- unseen configs

def _write(tmp_path: Path, name: str, config: dict) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(config))
    return path


def test_unknown_model_type_falls_back_and_is_reported(tmp_path):
    cfg = json.loads((CONFIGS / "DeepSeek-V3.json").read_text())
    cfg["model_type"] = "kimi_k2"
    r = analyze(_write(tmp_path, "kimi", cfg))
    assert r.config_model_type == "kimi_k2" and r.architecture == "DeepseekV3ForCausalLM"
    assert any(x.id == "config_fallback" and "kimi_k2" in x.message for x in r.risks)
    assert "remote_code" in risk_ids(r)
    assert r.params.total == pytest.approx(671e9, rel=0.01)


def test_unknown_model_type_without_known_architecture_is_input_error(tmp_path):
    cfg = json.loads((CONFIGS / "Llama-3.1-8B.json").read_text())
    cfg.update(model_type="brand_new", architectures=["BrandNewForCausalLM"])
    with pytest.raises(InputError, match="brand_new"):
        analyze(_write(tmp_path, "new", cfg))


def test_qwen3_30b_a3b_from_transformers_config(tmp_path):
    from transformers import Qwen3MoeConfig

    cfg = Qwen3MoeConfig(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                         moe_intermediate_size=768, num_hidden_layers=48, num_attention_heads=32,
                         num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
                         max_position_embeddings=40960, tie_word_embeddings=False, norm_topk_prob=True)
    r = analyze(_write(tmp_path, "qwen3", cfg.to_dict()))
    assert r.params.total == pytest.approx(30.5e9, rel=0.01)
    assert r.params.active == pytest.approx(3.3e9, rel=0.02)  # 3.35B; the card rounds to 3.3B
    assert r.moe.num_experts == 128 and r.moe.moe_layers == 48 and r.attention.kind == "gqa"
    assert r.kv_cache.bytes_per_token["bfloat16"] == 2 * 48 * 4 * 128 * 2
    assert "qk_norm" in risk_ids(r)


def test_mistral_7b_sliding_window_caps_kv(tmp_path):
    from transformers import MistralConfig

    cfg = MistralConfig(vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                        sliding_window=4096, max_position_embeddings=32768)
    r = analyze(_write(tmp_path, "mistral", cfg.to_dict()))
    assert r.params.total == pytest.approx(7.24e9, rel=0.01)
    per_token = r.kv_cache.bytes_per_token["bfloat16"]
    assert r.kv_cache.bytes_at_max_context["bfloat16"] == per_token * 4096  # not x 32768
    assert r.kv_cache.layers == {"full": 0, "windowed": 32, "stateful": 0}
    assert "sliding_window" in risk_ids(r)


@pytest.mark.parametrize("host", ["warm", "cold"])
def test_config_only_counts_come_from_a_child_process_that_never_hangs(host, monkeypatch):
    """Without weights the class is built on the meta device in a child (analysis imports no
    torch), forked from the warm stage host or started cold: its timeout and its crash are
    one-line input errors naming config.json."""
    from day0.execution import stagehost
    from day0.stages.analysis import metaparams

    if host == "cold":
        monkeypatch.setenv(stagehost.DISABLE_ENV, "0")
    hosts = set(stagehost._hosts)

    source = CONFIGS / "Llama-3.1-8B.json"
    with pytest.raises(InputError, match="within 0.01 s") as info:
        analyze(source, count_timeout_s=0.01)
    assert info.value.file == str(source) and "count_timeout_s" in info.value.fix
    monkeypatch.setattr(metaparams, "MODULE", "day0.no_such_module")
    with pytest.raises(InputError, match="transformers cannot build LlamaForCausalLM") as info:
        analyze(source)
    # exit 1 started cold (python -m), 70 forked from the warm stage host (day0.execution.stagehost)
    assert re.search(r"exited (1|70):", str(info.value)) and "\n" not in str(info.value)
    # warm: forked from the host of this process's own environment, no host of its own
    assert set(stagehost._hosts) == hosts | ({stagehost.host_key(dict(os.environ))}
                                             if host == "warm" else set())


def test_mqa_and_tied_embeddings(tmp_path):
    from transformers import LlamaConfig

    cfg = LlamaConfig(hidden_size=256, num_hidden_layers=2, num_attention_heads=8,
                      num_key_value_heads=1, vocab_size=1000, intermediate_size=512,
                      tie_word_embeddings=True)
    r = analyze(_write(tmp_path, "mqa", cfg.to_dict()))
    assert r.attention.kind == "mqa" and "tied_embeddings" in risk_ids(r)
    assert r.params.embedding == 1000 * 256  # the tied head is not counted twice
    assert r.kv_cache.bytes_per_token["float32"] == 2 * 2 * 1 * 32 * 4


# ------------------------------------------------------------------------------- with weights

@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory) -> Path:
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, vocab_size=256, intermediate_size=128,
                         moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2)
    path = tmp_path_factory.mktemp("tiny-moe")
    Qwen3MoeForCausalLM(cfg).save_pretrained(path, max_shard_size="200KB")
    return path


def test_weights_give_exact_header_counts_and_agree_with_config_only(tiny_moe):
    from safetensors import safe_open

    with_weights = analyze(tiny_moe)
    config_only = analyze(tiny_moe / "config.json")
    numel = 0
    for shard in tiny_moe.glob("*.safetensors"):
        with safe_open(str(shard), "pt") as fh:
            numel += sum(math.prod(fh.get_slice(k).get_shape()) for k in fh.keys())
    assert with_weights.params.total == numel and with_weights.params.source == "checkpoint"
    assert config_only.params.source == "config"
    # per-expert checkpoint names and fused meta-model parameters give the same counts
    assert with_weights.params.total == config_only.params.total
    assert with_weights.params.active == config_only.params.active < with_weights.params.total
    assert with_weights.moe.routed_params == config_only.moe.routed_params == 2 * 4 * 3 * 64 * 32
    ck = with_weights.checkpoint
    assert ck.has_weights and ck.bytes_read_ratio < 0.05 and ck.dtypes == {"F32": ck.tensors}
    assert with_weights.memory.stored_bytes == 4 * numel


def test_extra_tensors_are_risks_and_excluded_from_total(tiny_moe, tmp_path):
    folder = Path(shutil.copytree(tiny_moe, tmp_path / "m"))
    cfg = json.loads((folder / "config.json").read_text())
    cfg["num_hidden_layers"] = 1
    (folder / "config.json").write_text(json.dumps(cfg))
    r = analyze(folder)
    assert "extra_tensors" in risk_ids(r) and r.params.unused > 0
    assert r.params.total + r.params.unused == analyze(tiny_moe).params.total


def test_fp8_checkpoint_with_mtp_layer_like_deepseek_v3(tmp_path):
    """DeepSeek-V3's release layout in miniature: fp8 matrices with block scales, a bf16 router,
    an fp32 score-correction bias and one MTP layer beyond num_hidden_layers."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(0)
    cfg = DeepseekV3Config(hidden_size=64, num_hidden_layers=2, first_k_dense_replace=1,
                           n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1,
                           n_shared_experts=1, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8,
                           qk_nope_head_dim=16, v_head_dim=16, num_attention_heads=4,
                           num_key_value_heads=4, moe_intermediate_size=32, intermediate_size=128,
                           vocab_size=256, num_nextn_predict_layers=1)
    DeepseekV3ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    bf16_only = analyze(tmp_path / "bf16" / "config.json")
    state = load_file(tmp_path / "bf16" / "model.safetensors")
    fp8 = {}
    for name, t in state.items():
        quantize = t.dim() == 2 and "_proj" in name
        fp8[name] = t.to(torch.float8_e4m3fn) if quantize else t
        if quantize:
            fp8[name + "_scale_inv"] = torch.ones(1, 1, dtype=torch.float32)
        if name.startswith("model.layers.1."):  # MTP layer = a copy of the last layer, index 2
            fp8["model.layers.2." + name[len("model.layers.1."):]] = t.clone()
    fp8["model.layers.2.eh_proj.weight"] = torch.zeros(64, 128, dtype=torch.bfloat16)
    folder = tmp_path / "fp8"
    folder.mkdir()
    save_file(fp8, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((tmp_path / "bf16" / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3",
                                     "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
    (folder / "config.json").write_text(json.dumps(config))

    r = analyze(folder)
    mtp = sum(t.numel() for n, t in fp8.items() if n.startswith("model.layers.2."))
    assert r.params.total == bf16_only.params.total and r.params.active == bf16_only.params.active
    assert r.params.unused == mtp
    by_id = {x.id: x for x in r.risks}
    assert "beyond num_hidden_layers=2" in by_id["extra_tensors"].message
    assert by_id["quantized_dtypes"].severity == "info" and "F8_E4M3" in by_id["quantized_dtypes"].message
    assert {"fp8_quantization", "mla", "moe_grouped_routing", "mtp_layers"} <= set(by_id)
    assert r.checkpoint.dtypes["F8_E4M3"] > 0 and r.memory.stored_bytes < 2 * r.params.total


def test_broken_checkpoint_raises_checkpoint_error(tiny_moe, tmp_path):
    folder = Path(shutil.copytree(tiny_moe, tmp_path / "m"))
    shard = sorted(folder.glob("*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:-16])
    with pytest.raises(CheckpointError, match="truncated"):
        analyze(folder)


# ------------------------------------------------------------------------------- contract

def test_json_document_and_metrics(deepseek):
    doc = json.loads(json.dumps(deepseek.model_dump(mode="json")))
    assert doc["attention"]["kind"] == "mla" and doc["moe"]["num_experts"] == 256
    for key in ("architecture", "model_type", "plan", "risks", "checkpoint"):
        assert key in doc
    assert set(doc["memory"]["weights_bytes"]) == set(doc["kv_cache"]["bytes_per_token"]) == {
        "bfloat16", "float8", "float16", "float32"}
    assert {"bytes_read", "total_bytes", "files", "notes"} <= set(doc["checkpoint"])
    assert analysis.Result.model_validate(doc) == deepseek
    metrics = deepseek.metrics()
    declared = yaml.safe_load(METRICS_YAML.read_text())["metrics"]
    assert set(metrics) == set(declared)
    assert all(name.startswith("analysis.") and declared[name]["description"] for name in declared)
    assert all(v is None or isinstance(v, float) for v in metrics.values())
    assert metrics["analysis.plan_fits"] == 0.0 and metrics["analysis.kv_bytes_per_token_bf16"] == 70272.0
    assert metrics["analysis.bytes_read_ratio"] is None  # no weights


def test_config_is_strict_and_documented():
    for name, field in analysis.Config.model_fields.items():
        assert field.description, name
    with pytest.raises(Exception, match="extra"):
        analysis.Config(batch=2)


def test_summary_text(deepseek, llama8b):
    text = summary_text(deepseek)
    assert "DeepseekV3ForCausalLM" in text and "MLA" in text and "70,272 B/token" in text
    assert "DOES NOT FIT" in text and "[error] plan_does_not_fit" in text
    assert "MoE: none (dense)" in summary_text(llama8b)


# ------------------------------------------------------------------------------- plan

def _plan(**kw):
    base = dict(weights=100 * GIB, kv=8 * GIB, layers=32, moe_layers=0, hidden=4096, heads=32,
                kv_heads=8, mla=False, num_experts=None, experts_per_token=None,
                card_memory_gib=80, cards=16, cards_per_domain=8, headroom_fraction=0.1,
                weights_dtype="bfloat16", kv_dtype="bfloat16", batch=1, context=1024)
    base.update(kw)
    return make_plan(**base)


def test_plan_smallest_tp_then_pp():
    p = _plan()
    assert (p.tp, p.pp, p.dp) == (2, 1, 8) and p.heaviest_traffic == "tp"
    assert p.per_card_bytes["kv"] == 4 * GIB  # 8 KV heads split over TP=2
    p = _plan(weights=1000 * GIB)  # more than one 8-card domain holds
    assert p.fits and p.tp == 8 and p.pp == 2 and p.traffic_bytes_per_token["pp"] == 4096 * 2


def test_plan_replicates_kv_beyond_kv_heads_and_reports_misfit():
    p = _plan(weights=300 * GIB, kv_heads=2)
    assert p.tp == 8 and p.per_card_bytes["kv"] == 4 * GIB and "replicated" in p.rationale
    p = _plan(weights=10_000 * GIB)
    assert not p.fits and "usable" in p.reason and p.min_cards > 16


def test_reference_estimate_resident_vs_streamed(llama8b, deepseek):
    """Before anything runs: the float32 reference and bf16 control of Llama-3.1-8B need 58 GiB
    resident; streamed, the largest layer (218 M parameters) and one window's activations."""
    from day0.stages.analysis.reference import estimate

    e = llama8b.reference
    assert e.resident_gib == pytest.approx(8_030_261_248 * (4 + 2) * 1.3 / GIB, rel=1e-3)
    assert e.largest_layer_params == 218_112_000  # attention 42 M + MLP 176 M + 2 norms
    assert 3 < e.streamed_peak_gib < 8 and e.pass_seconds > 0
    assert e.mode == ("resident" if e.available_gib and e.available_gib >= e.resident_gib
                      else "streamed")
    # DeepSeek-V3: the dense layers are the largest; one expert group on top
    d = deepseek.reference
    assert d.largest_layer_params > 500_000_000 and d.streamed_peak_gib < 16
    assert d.resident_gib > 4000
    tensors = [("model.layers.0.mlp.weight", (1000, 1000))]
    small = estimate(tensors, active_params=10**6, hidden=1000, vocab=1000,
                     target_dtype="bfloat16", intermediate=None, available_gib=64.0)
    big = estimate(tensors, active_params=10**6, hidden=1000, vocab=1000,
                   target_dtype="bfloat16", intermediate=None, available_gib=0.001)
    assert (small.mode, big.mode) == ("resident", "streamed")


def test_experts_in_the_config_but_no_moe_layer_is_dense(tmp_path):
    """A DeepSeek config whose first_k_dense_replace covers every layer builds no expert at all:
    the model runs dense (no routing gates to judge), whatever num_experts says; with one MoE
    layer it is MoE again."""
    from transformers import DeepseekV3Config

    small = dict(vocab_size=512, hidden_size=64, intermediate_size=128,
                 moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2,
                 n_shared_experts=1, n_group=1, topk_group=1, q_lora_rank=None,
                 kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16)
    dense = DeepseekV3Config(first_k_dense_replace=2, **small).to_dict()
    assert analyze(_write(tmp_path, "dense", dense)).moe is None
    moe = analyze(_write(tmp_path, "moe", DeepseekV3Config(first_k_dense_replace=1,
                                                           **small).to_dict())).moe
    assert moe.num_experts == 8 and moe.moe_layers == 1
