"""The committed fixture checkpoints (scripts/make_fixtures.py) load with plain transformers, have
a real sharded Hugging Face layout, and still model the held-out text."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.conftest import HELDOUT, MODELS

REQUIRED = {"tiny-llama", "tiny-qwen3moe"}
NAMES = sorted(REQUIRED | ({p.name for p in MODELS.iterdir() if p.is_dir()} if MODELS.is_dir() else set()))
SEQ_LEN = 256
WINDOWS = 12  # bounded slice of heldout.txt: 12 x 256 tokens keeps the whole file well under 30 s


def _load(name: str):
    path = MODELS / name
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    return tok, model.eval()


@torch.no_grad()
def _ppl(model, ids: torch.Tensor) -> float:
    logits = model(input_ids=ids).logits
    nll = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    return math.exp(nll.item())


def _heldout_windows(tok) -> torch.Tensor:
    ids = tok(HELDOUT.read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"]
    assert len(ids) >= WINDOWS * SEQ_LEN, "heldout.txt is too short for the perplexity slice"
    return torch.tensor(ids[: WINDOWS * SEQ_LEN]).view(WINDOWS, SEQ_LEN)


@pytest.mark.parametrize("name", NAMES)
def test_layout(name: str) -> None:
    path = MODELS / name
    for f in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "model.safetensors.index.json", "day0-fixture.json"):
        assert (path / f).is_file(), f"{path / f} missing"
    shards = sorted(path.glob("*.safetensors"))
    assert len(shards) >= 2, f"{path}: {len(shards)} shard(s), the fixtures must be sharded"
    weight_map = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
    stored = {}
    for shard in shards:
        with safe_open(shard, framework="pt") as f:
            for key in f.keys():
                assert key not in stored, f"{key} stored twice"
                stored[key] = shard.name
                assert f.get_slice(key).get_dtype() == "F32", f"{shard.name}:{key} is not float32"
    assert weight_map == stored, "index weight_map must list every stored tensor, in its own shard"
    assert set(weight_map.values()) == {s.name for s in shards}


@pytest.mark.parametrize("name", NAMES)
def test_tokenizer_matches_config(name: str) -> None:
    config = json.loads((MODELS / name / "config.json").read_text())
    tok = AutoTokenizer.from_pretrained(MODELS / name, local_files_only=True)
    assert len(tok) == config["vocab_size"]
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (
        config["bos_token_id"], config["eos_token_id"], config["pad_token_id"])
    assert config["max_position_embeddings"] == SEQ_LEN
    text = "Return a new list containing all items from the iterable."
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text


@pytest.mark.parametrize("name", NAMES)
def test_heldout_perplexity(name: str) -> None:
    tok, model = _load(name)
    ppl = _ppl(model, _heldout_windows(tok))
    limit = model.config.vocab_size / 4
    assert ppl <= limit, f"{name}: held-out perplexity {ppl:.1f} > vocab/4 = {limit}"
    recorded = json.loads((MODELS / name / "day0-fixture.json").read_text())
    assert recorded["heldout_ppl_float32"] <= limit
    assert recorded["architecture"] == model.config.architectures[0]
    assert recorded["parameters"] == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", [n for n in NAMES if n != "tiny-llama"])
def test_routing_matters(name: str) -> None:
    """Sending tokens to their least-preferred experts must hurt: the routers are trained."""
    tok, model = _load(name)
    ids = _heldout_windows(tok)[:4]
    gates = [m for n, m in model.named_modules() if n.endswith("mlp.gate")]
    assert gates, f"{name}: no MoE router found"
    ppl = _ppl(model, ids)
    with torch.no_grad():
        for g in gates:
            g.weight.neg_()
    assert _ppl(model, ids) > 1.05 * ppl
