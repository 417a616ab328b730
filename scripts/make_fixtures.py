#!/usr/bin/env python
"""Train the tiny fixture checkpoints under tests/fixtures/models/ (CPU, offline, deterministic).

    python scripts/make_fixtures.py                       # retrain every fixture from the committed corpus
    python scripts/make_fixtures.py --corpus-from-stdlib  # first regenerate tests/fixtures/text/ (rare)
    python scripts/make_fixtures.py --only tiny-llama     # one fixture

Each fixture is a real Hugging Face checkpoint (transformers' own classes, float32, >= 2 safetensors
shards, byte-level BPE tokenizer.json) trained on CPython docstrings with sequence length equal to
max_position_embeddings, so the alignment stage can measure meaningful perplexity on
tests/fixtures/text/heldout.txt. Training statistics go to <fixture>/day0-fixture.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

# Determinism first: thread pools must be configured before torch/tokenizers start them.
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import (  # noqa: E402
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

SCRIPT_VERSION = "1"
ROOT = Path(__file__).resolve().parent.parent
TEXT_DIR = ROOT / "tests" / "fixtures" / "text"
MODELS_DIR = ROOT / "tests" / "fixtures" / "models"
VOCAB_SIZE = 512
SEQ_LEN = 256  # == max_position_embeddings of every fixture
SPECIAL = {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>"}
MAX_SHARD_SIZE = "1MB"  # a few MB per checkpoint -> several shards, like a real release
THREADS = 1  # bit-reproducible, and robust on a busy 2-core machine (2 threads oversubscribe)
BF16_MAX_LOG_RATIO = 0.1  # |log(ppl_bf16 / ppl_fp32)|; normal bf16 noise is ~0.01
# A Llama-3-like chat template (tiny-llama), so engine chat APIs and the smoke stage's chat-template
# parity have something to render. The vocabulary has no header tokens: the headers are plain text.
LLAMA3_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + eos_token }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)


def _common(cfg: dict) -> dict:
    return dict(
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=SEQ_LEN,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
        initializer_range=0.02,
        **cfg,
    )


@dataclass
class Spec:
    name: str
    model_cls: type
    config: object
    steps: int
    lr: float
    batch: int = 16
    seed: int = 0
    # Held-out perplexity with negated routers must exceed this multiple of the normal figure.
    min_router_effect: float = 1.5
    train_kwargs: dict = field(default_factory=dict)
    chat_template: str | None = None  # written to tokenizer_config.json


def specs() -> list[Spec]:
    llama = LlamaConfig(**_common(dict(
        hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=344, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )))
    qwen = Qwen3MoeConfig(**_common(dict(
        hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, intermediate_size=256, moe_intermediate_size=64, num_experts=8,
        num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        router_aux_loss_coef=0.01,
    )))
    dsv3 = DeepseekV3Config(**_common(dict(
        hidden_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
        intermediate_size=256, moe_intermediate_size=64, n_routed_experts=8, n_shared_experts=1,
        num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1,
        routed_scaling_factor=2.5, norm_topk_prob=True, q_lora_rank=64, kv_lora_rank=32,
        qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, num_nextn_predict_layers=0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, rope_interleave=True,
    )))
    return [
        Spec("tiny-llama", LlamaForCausalLM, llama, steps=250, lr=3e-3,
             chat_template=LLAMA3_CHAT_TEMPLATE),
        # The load-balancing loss (training only; the saved config keeps output_router_logits
        # false like real releases) keeps all experts in use, so routing decisions matter.
        # 400 steps, not fewer: with less training, near-tie routing at layer 0 makes ordinary
        # bf16 rounding flip experts with a large effect, and the alignment tolerances
        # (day0/data/tolerances.yaml) are calibrated on this fixture being well trained.
        Spec("tiny-qwen3moe", Qwen3MoeForCausalLM, qwen, steps=400, lr=3e-3,
             train_kwargs={"output_router_logits": True}),
        # The shared expert carries much of DeepSeek's MLP, so negated routing costs less
        # (about 1.25x perplexity here, against about 5x for Qwen3-MoE).
        Spec("tiny-deepseekv3", DeepseekV3ForCausalLM, dsv3, steps=150, lr=3e-3, min_router_effect=1.1),
    ]


# ---------------------------------------------------------------------------------------- tokenizer
def train_tokenizer(train_txt: Path) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(train_txt)], trainer)
    assert tok.get_vocab_size() == VOCAB_SIZE, tok.get_vocab_size()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=SEQ_LEN, **SPECIAL)
    # Token ids are fixed by the special-token order above; the model configs rely on them.
    assert [fast.bos_token_id, fast.eos_token_id, fast.pad_token_id] == [0, 1, 2]
    return fast


def encode(tok: PreTrainedTokenizerFast, path: Path) -> torch.Tensor:
    """Whole file as one token stream, no special tokens (same as tests and the alignment stage)."""
    text = path.read_text(encoding="utf-8")
    # backend tokenizer: same ids as tok(text, add_special_tokens=False), without the
    # "longer than model_max_length" warning.
    return torch.tensor(tok.backend_tokenizer.encode(text, add_special_tokens=False).ids, dtype=torch.long)


# ------------------------------------------------------------------------------------- train / eval
def windows(ids: torch.Tensor, seq_len: int = SEQ_LEN) -> torch.Tensor:
    n = (len(ids) // seq_len) * seq_len
    return ids[:n].view(-1, seq_len)


@torch.no_grad()
def perplexity(model, ids: torch.Tensor, batch: int = 16) -> float:
    """exp(mean next-token NLL) over non-overlapping SEQ_LEN windows (each window starts fresh)."""
    model.eval()
    total, count = 0.0, 0
    blocks = windows(ids)
    for i in range(0, len(blocks), batch):
        x = blocks[i : i + batch]
        logits = model(input_ids=x).logits
        nll = torch.nn.functional.cross_entropy(
            logits[:, :-1].float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum"
        )
        total += nll.item()
        count += x[:, 1:].numel()
    return math.exp(total / count)


def lr_at(step: int, steps: int, peak: float) -> float:
    warm = max(1, steps // 20)
    if step < warm:
        return peak * (step + 1) / warm
    progress = (step - warm) / max(1, steps - warm)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(spec: Spec, train_ids: torch.Tensor, log_every: int = 50) -> tuple[torch.nn.Module, float]:
    torch.manual_seed(spec.seed)
    model = spec.model_cls(spec.config).float()
    gen = torch.Generator().manual_seed(spec.seed)
    groups: dict[str, list] = {"decay": [], "no_decay": [], "router": []}
    for n, p in model.named_parameters():
        kind = "router" if n.endswith("mlp.gate.weight") else "decay" if p.dim() >= 2 else "no_decay"
        groups[kind].append(p)
    opt = torch.optim.AdamW(
        [{"params": groups["decay"], "weight_decay": 0.1},
         {"params": groups["no_decay"], "weight_decay": 0.0},
         # No decay on routers: it would pull router logits towards ties (arbitrary routing).
         {"params": groups["router"], "weight_decay": 0.0}],
        lr=spec.lr, betas=(0.9, 0.95), eps=1e-8,
    )
    model.train()
    t0 = time.perf_counter()
    max_start = len(train_ids) - SEQ_LEN - 1
    for step in range(spec.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, spec.steps, spec.lr)
        starts = torch.randint(0, max_start, (spec.batch,), generator=gen)
        x = torch.stack([train_ids[s : s + SEQ_LEN] for s in starts.tolist()])
        out = model(input_ids=x, labels=x, **spec.train_kwargs)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % log_every == 0 or step == spec.steps - 1:
            print(f"  [{spec.name}] step {step:4d} loss {out.loss.item():.3f} "
                  f"({time.perf_counter() - t0:.0f}s)", flush=True)
    return model, time.perf_counter() - t0


@torch.no_grad()
def negated_router_ppl(model, ids: torch.Tensor) -> float | None:
    """Perplexity with every router's logits negated (each token goes to its least-preferred
    experts). Far above the normal figure -> routing decisions carry real information."""
    gates = [m for n, m in model.named_modules() if n.endswith("mlp.gate") and hasattr(m, "weight")]
    if not gates:
        return None
    for g in gates:
        g.weight.neg_()
    try:
        return perplexity(model, ids)
    finally:
        for g in gates:
            g.weight.neg_()


# ------------------------------------------------------------------------------------------- output
def save(spec: Spec, model, tok, out: Path, record: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.safetensors"):
        old.unlink()  # a stale shard from an older layout would otherwise survive
    model.generation_config = GenerationConfig(
        bos_token_id=0, eos_token_id=1, pad_token_id=2, do_sample=False, max_length=SEQ_LEN
    )
    model.save_pretrained(out, max_shard_size=MAX_SHARD_SIZE, safe_serialization=True)
    tok.save_pretrained(out)
    # transformers 5 writes its internal class name; released checkpoints (and transformers 4)
    # use PreTrainedTokenizerFast, which both major versions load.
    tc_path = out / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text())
    tc["tokenizer_class"] = "PreTrainedTokenizerFast"
    if spec.chat_template:
        tc["chat_template"] = spec.chat_template
    tc_path.write_text(json.dumps(tc, indent=2, sort_keys=True) + "\n")
    shards = sorted(out.glob("*.safetensors"))
    if len(shards) < 2 or not (out / "model.safetensors.index.json").exists():
        raise SystemExit(f"{out}: expected >= 2 shards plus index, got {[s.name for s in shards]}")
    record["size_bytes"] = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    (out / "day0-fixture.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def build_one(spec: Spec, tok, train_ids, heldout_ids, out_root: Path) -> tuple[dict, list[str]]:
    print(f"== {spec.name}: {spec.model_cls.__name__}, {spec.steps} steps", flush=True)
    model, seconds = train(spec, train_ids)
    model.eval()
    ppl = perplexity(model, heldout_ids)
    # Weights cast to bf16 (what a bf16 target run does), not autocast: the stricter case.
    ppl_bf16 = perplexity(copy.deepcopy(model).to(torch.bfloat16), heldout_ids)
    record = {
        "script_version": SCRIPT_VERSION,
        "architecture": spec.model_cls.__name__,
        "seed": spec.seed,
        "training_steps": spec.steps,
        "batch_size": spec.batch,
        "seq_len": SEQ_LEN,
        "peak_lr": spec.lr,
        "training_seconds": round(seconds, 1),
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_tokens": int(train_ids.numel()),
        "heldout_tokens": int(heldout_ids.numel()),
        "tokens_seen": spec.steps * spec.batch * SEQ_LEN,
        "heldout_ppl_float32": round(ppl, 4),
        "heldout_ppl_bfloat16": round(ppl_bf16, 4),
        "heldout_ppl_router_negated": None,
        "versions": {"torch": torch.__version__, "transformers": _tf_version(),
                     "python": sys.version.split()[0]},
    }
    neg = negated_router_ppl(model, heldout_ids)
    if neg is not None:
        record["heldout_ppl_router_negated"] = round(neg, 4)
    problems = []
    if not ppl <= VOCAB_SIZE / 4:
        problems.append(f"held-out perplexity {ppl:.1f} > vocab/4 = {VOCAB_SIZE / 4}")
    if not abs(math.log(ppl_bf16 / ppl)) <= BF16_MAX_LOG_RATIO:
        problems.append(f"bf16 perplexity {ppl_bf16:.2f} vs float32 {ppl:.2f}: unstable in bf16")
    if neg is not None and not neg > spec.min_router_effect * ppl:
        problems.append(f"negating the router only moves perplexity {ppl:.2f} -> {neg:.2f}: router untrained")
    if problems:  # never write a fixture that would mislead the tests
        record["size_bytes"] = 0
    else:
        save(spec, model, tok, out_root / spec.name, record)
    return record, problems


def _tf_version() -> str:
    import transformers

    return transformers.__version__


def main(argv: list[str] | None = None) -> int:
    all_specs = specs()
    names = [s.name for s in all_specs]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus-from-stdlib", action="store_true",
                    help="regenerate tests/fixtures/text/{train,heldout}.txt from this Python's docstrings")
    ap.add_argument("--only", action="append", choices=names, help="build only this fixture (repeatable)")
    ap.add_argument("--out", type=Path, default=MODELS_DIR, help="where fixture folders are written")
    ap.add_argument("--steps", type=int, help="override training steps (development only)")
    args = ap.parse_args(argv)

    torch.set_num_threads(THREADS)
    torch.use_deterministic_algorithms(True)
    if args.corpus_from_stdlib:
        corpus_script = Path(__file__).resolve().parent / "fixture_corpus.py"
        done = subprocess.run([sys.executable, "-I", "-S", str(corpus_script), str(TEXT_DIR)],
                              check=True, capture_output=True, text=True)
        print("corpus:", done.stdout.strip(), flush=True)
    train_txt, heldout_txt = TEXT_DIR / "train.txt", TEXT_DIR / "heldout.txt"
    for p in (train_txt, heldout_txt):
        if not p.exists():
            raise SystemExit(f"{p} missing: run with --corpus-from-stdlib to generate it")

    t0 = time.perf_counter()
    tok = train_tokenizer(train_txt)
    train_ids, heldout_ids = encode(tok, train_txt), encode(tok, heldout_txt)
    rows, failed = [], []
    for spec in all_specs:
        if args.only and spec.name not in args.only:
            continue
        if args.steps:
            spec.steps = args.steps
        record, problems = build_one(spec, tok, train_ids, heldout_ids, args.out)
        rows.append((spec.name, record))
        failed += [f"{spec.name}: {p}" for p in problems]

    print(f"\n{'fixture':<17}{'params':>10}{'MB':>7}{'steps':>7}{'sec':>7}{'ppl32':>8}{'ppl16':>8}{'ppl-neg':>9}")
    for name, r in rows:
        neg = r["heldout_ppl_router_negated"]
        print(f"{name:<17}{r['parameters']:>10,}{r['size_bytes'] / 1e6:>7.2f}{r['training_steps']:>7}"
              f"{r['training_seconds']:>7.0f}{r['heldout_ppl_float32']:>8.2f}"
              f"{r['heldout_ppl_bfloat16']:>8.2f}{'-' if neg is None else f'{neg:.1f}':>9}")
    print(f"total {time.perf_counter() - t0:.0f}s; vocab {VOCAB_SIZE}, held-out tokens {heldout_ids.numel()}")
    for line in failed:
        print("NOT WRITTEN:", line, file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
