"""Checkpoints for the alignment tests: the shared tiny fixtures when present, otherwise a small
random model of the same family built once per session (same HF layout, byte-level tokenizer)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
MODELS = ROOT / "tests" / "fixtures" / "models"
HELDOUT = ROOT / "tests" / "fixtures" / "text" / "heldout.txt"
PLUGINS = ROOT / "tests" / "plugins"


def _byte_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=None).save_pretrained(folder)


def _build(folder: Path, kind: str) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    common = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=256, max_position_embeddings=256)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(intermediate_size=128, **common))
    else:
        model = Qwen3MoeForCausalLM(Qwen3MoeConfig(
            intermediate_size=128, moe_intermediate_size=32, num_experts=8,
            num_experts_per_tok=2, head_dim=16, **common))
    model.save_pretrained(folder, max_shard_size="200KB")
    _byte_tokenizer(folder)
    return folder


def _checkpoint(tmp_path_factory, name: str, kind: str) -> Path:
    fixture = MODELS / name
    if (fixture / "config.json").is_file():
        return fixture
    return _build(tmp_path_factory.mktemp(name), kind)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    return _checkpoint(tmp_path_factory, "tiny-llama", "llama")


@pytest.fixture(scope="session")
def tiny_moe(tmp_path_factory) -> Path:
    return _checkpoint(tmp_path_factory, "tiny-qwen3moe", "moe")


@pytest.fixture(scope="session")
def eval_text() -> Path | None:
    """The held-out fixture text when present, else None (the stage uses its built-in text)."""
    return HELDOUT if HELDOUT.is_file() else None
