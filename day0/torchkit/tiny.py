"""Tiny random checkpoints of any transformers causal-LM architecture: the model type's own
default config shrunk (day0.torchkit.shrink), random weights saved as safetensors, and a given
512-token tokenizer. For sweeps over every architecture transformers ships and for tests that
need one checkpoint per layout family (sliding, MLA, SSM, MoE) without downloading anything.

A model type that cannot give such a checkpoint raises Unbuildable with a one-line reason."""

from __future__ import annotations

import contextlib
import json
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

from day0.checkpoint.modeling import config_for_class, text_config
from day0.torchkit.shrink import EXPERT_COUNT_KEYS, TOWER_KEYS, read_attribute, shrink_config

DIMS = dict(hidden=64, heads=4, intermediate=128, vocab=512, max_layers=8)
# The fixtures' context: alignment evaluates windows of max_position_embeddings tokens (up to
# 8192), which on a 2-core machine costs most of a tiny model's validation.
MAX_POSITIONS = 256
SPECIAL_IDS = dict(bos_token_id=0, eos_token_id=1, pad_token_id=2)  # tiny-llama's tokenizer
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
# A shrunk model above this still has a dimension shrink does not know: refuse it before
# random init and save take minutes and gigabytes.
MAX_PARAMS = 10_000_000


class Unbuildable(Exception):
    """The model type gives no tiny checkpoint here; str() is the one-line reason."""


@dataclass
class TinyCheckpoint:
    folder: Path
    model_type: str
    class_name: str
    tensor_elements: int  # sum over the saved tensors (the safetensors headers)


def first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    text = " ".join(lines[:2]) if lines and lines[0].endswith(":") else (lines or [""])[0]
    return f"{type(exc).__name__}: {text}"[:200]  # a validator's first line only says "error:"


def causal_lm_types() -> dict[str, str]:
    """model_type -> causal-LM class name, as transformers' auto mapping has them."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return dict(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def tiny_config(model_type: str, *, max_positions: int | None = MAX_POSITIONS, **dims):
    """The model type's default config shrunk to DIMS (overridable), special ids 0/1/2, context
    at most max_positions."""
    from transformers import AutoConfig

    try:
        with _quiet():
            config = AutoConfig.for_model(model_type)
    except ImportError as exc:
        raise Unbuildable(f"needs a package not installed ({first_line(exc)})") from None
    except Exception as exc:  # the default itself: transformers' own bug
        raise Unbuildable(f"default config fails (transformers): {first_line(exc)}") from None
    if getattr(config, "is_encoder_decoder", False):
        raise Unbuildable("encoder-decoder")
    try:
        with _quiet():
            _fill_unset(config)
            small = shrink_config(config, **{**DIMS, **dims})
    except Exception as exc:
        raise Unbuildable(f"shrink fails: {first_line(exc)}") from None
    _set_special_ids(small)
    _fill_defaults(small, max_positions)
    return small


def build_tiny(model_type: str, folder: Path, *, tokenizer_from: Path, dtype: str = "float32",
               seed: int = 0, max_positions: int | None = MAX_POSITIONS, **dims) -> TinyCheckpoint:
    """Write a tiny random checkpoint of model_type to folder (replaced if there)."""
    import torch
    import transformers

    class_name = causal_lm_types().get(model_type)
    model_class = getattr(transformers, class_name or "", None)
    if model_class is None:
        raise Unbuildable(f"no causal-LM class {class_name!r} in transformers (remote code?)")
    try:
        full = tiny_config(model_type, max_positions=max_positions, **dims)
        config = config_for_class(full, model_class)
    except Unbuildable:
        raise
    except Exception as exc:  # never crash a sweep: whatever fails is this type's reason
        raise Unbuildable(f"config fails: {first_line(exc)}") from None
    torch.manual_seed(seed)
    try:
        with _quiet():
            with torch.device("meta"):
                meta = model_class._from_config(config)
            count = sum(p.numel() for p in meta.parameters())
            if count > MAX_PARAMS:
                raise Unbuildable(_too_large(config, meta, count))
            model = model_class._from_config(config, dtype=getattr(torch, dtype))
    except Unbuildable:
        raise
    except ImportError as exc:
        raise Unbuildable(f"needs a package not installed ({first_line(exc)})") from None
    except Exception as exc:
        raise Unbuildable(_build_failure(model_type, model_class, exc)) from None
    folder = Path(folder)
    shutil.rmtree(folder, ignore_errors=True)
    try:
        with _quiet():
            model.save_pretrained(folder, safe_serialization=True)
            if config is not full and config.model_type not in causal_lm_types():
                # a text part no auto class loads alone (mllama_text_model): the whole config,
                # as a release ships it; AutoModelForCausalLM takes its text part from it
                full.save_pretrained(folder)
    except Exception as exc:
        shutil.rmtree(folder, ignore_errors=True)
        raise Unbuildable(f"save_pretrained fails: {first_line(exc)}") from None
    for name in TOKENIZER_FILES:
        shutil.copy(Path(tokenizer_from) / name, folder / name)
    return TinyCheckpoint(folder, model_type, class_name, tensor_elements(folder))


def _build_failure(model_type: str, model_class, exc: Exception) -> str:
    """Why the class does not build from the tiny config: the shrink's fault, unless transformers'
    own default config (unshrunk, on the meta device) fails the same way."""
    import torch
    from transformers import AutoConfig

    try:
        with _quiet(), torch.device("meta"):
            model_class._from_config(AutoConfig.for_model(model_type))
    except Exception as default_exc:  # noqa: BLE001 - any failure of the default is its own
        if type(default_exc) is type(exc):
            return f"default config fails (transformers; its class does not build either): " \
                   f"{first_line(exc)}"
    return f"class fails to build: {first_line(exc)}"


def tensor_elements(folder: Path) -> int:
    """Sum of the element counts of every tensor in the folder's safetensors headers."""
    total = 0
    for file in sorted(Path(folder).glob("*.safetensors")):
        with open(file, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
        for name, entry in header.items():
            if name != "__metadata__":
                count = 1
                for dim in entry["shape"]:
                    count *= dim
                total += count
    return total


# What every release of the family sets where the class's default leaves None (or {}), so its
# class cannot build: filled on the full-size default, before the shrink sizes it. The values
# are the families' released ones where known (dots1, DBRX's clip_qkv), else valid ones;
# Cohere Compass's sliding theta is Cohere's sliding-layer base (Command A), which transformers'
# code does not state: a tiny random checkpoint needs a valid theta, not the exact one.
_RELEASED = {
    # dots.llm1 (base and inst): 128 routed experts, 6 of them per token, 2 shared
    "dots1": dict(n_routed_experts=128, num_experts_per_tok=6, n_shared_experts=2),
    # Qwen4-Exp's QSA indexer (it enables QSA on the full-attention layers): one key head, as
    # the class requires; transformers states no other size, so these are small valid ones
    "qwen4_exp_text": dict(indexer_n_heads=4, indexer_kv_heads=1, indexer_head_dim=128,
                           indexer_budget=2048, indexer_compress_ratio=4),
    # North (Cohere Compass): RoPE is per layer type; its full-attention layers have none (NoPE,
    # an explicit None), its sliding layers interleaved M-RoPE. Only the types in use are filled.
    "cohere_compass_text": dict(rope_parameters={
        "full_attention": None,
        "sliding_attention": {"rope_type": "default", "rope_theta": 50000.0,
                              "mrope_section": [24, 20, 20], "mrope_interleaved": True}}),
}
# LFM2-MoE's hybrid layout: short-conv layers with a full-attention layer about every fourth
# (LFM2-8B-A1B: attention at layers 2, 6, 10, 14, 18, 21 of 24); the shrink keeps both kinds.
_LFM2_PERIOD = ("conv", "conv", "full_attention", "conv")


def _fill_unset(config) -> None:
    """Fields transformers' default config leaves unset although every release sets them (its
    class then does not build even unshrunk): the released value where it is known, otherwise a
    valid one or one derived from the config's own fields, never one that changes the
    architecture."""
    text = text_config(config)
    for key, value in _RELEASED.get(text.model_type, {}).items():
        if read_attribute(text, key) in (None, {}):
            if key == "rope_parameters":  # per layer type: the entries of the types in use
                value = {kind: value[kind] for kind in dict.fromkeys(text.layer_types)}
            setattr(text, key, value)
    rope = read_attribute(text, "rope_parameters")
    rope = rope if isinstance(rope, dict) else {}
    rotary = int((read_attribute(text, "head_dim") or 0) * rope.get("partial_rotary_factor", 1))
    if isinstance(read_attribute(text, "indexer_head_dim"), int) and rotary > text.indexer_head_dim:
        # the index heads take the attention's rotary dims (validated): released 64 of 128 at
        # partial_rotary_factor 0.25, the default's full rotary needs its whole head_dim
        text.indexer_head_dim = rotary
    if text.model_type == "lfm2_moe" and text.layer_types is None:
        text.layer_types = [_LFM2_PERIOD[i % len(_LFM2_PERIOD)]
                            for i in range(text.num_hidden_layers)]
    # DBRX: released attn_configs carry rope_theta, which the attention only stores (its rotary
    # reads the top-level rope_parameters): the same theta, so the two agree. They also clip
    # q/k/v at 8 (clip_qkv); the forward clamps with it unconditionally, so None fails.
    attn = read_attribute(text, "attn_config")
    theta = rope.get("rope_theta")
    if attn is not None and not hasattr(attn, "rope_theta") and theta is not None:
        attn.rope_theta = theta
    if text.model_type == "dbrx" and attn is not None and attn.clip_qkv is None:
        attn.clip_qkv = 8


def _fill_defaults(config, max_positions: int | None) -> None:
    """Fields some classes' defaults leave None although every release sets them (transformers
    then cannot build its own default); BERT-like classes are causal only as decoders."""
    for target in {id(c): c for c in (config, text_config(config))}.values():
        heads = read_attribute(target, "num_attention_heads", 0)
        if read_attribute(target, "head_dim", 0) is None and heads:
            target.head_dim = target.hidden_size // heads
        if read_attribute(target, "num_key_value_heads", 0) is None and heads:
            target.num_key_value_heads = heads
        experts = any(isinstance(read_attribute(target, k, 0), int) for k in EXPERT_COUNT_KEYS)
        if read_attribute(target, "num_experts_per_tok", 0) is None and experts:  # DeepSeek-V2
            target.num_experts_per_tok = 2
        if read_attribute(target, "is_decoder", 0) is False:
            target.is_decoder = True
        positions = read_attribute(target, "max_position_embeddings", 0)
        if max_positions and isinstance(positions, int) and positions > max_positions:
            target.max_position_embeddings = max_positions


def _too_large(config, model, count: int) -> str:
    """Why a shrunk model is still too large: the tower (a sub-model the text shrink does not
    size) holding most of it, or a size field the shrink does not know."""
    towers = [k.removesuffix("_config") for k in TOWER_KEYS if getattr(config, k, None) is not None]
    # the deepest module (two levels at most) holding most of the parameters
    heavy = [name for name, child in model.named_modules() if name and name.count(".") <= 1
             and sum(p.numel() for p in child.parameters()) > count / 2]
    where = f", most in {max(heavy, key=len)}" if heavy else ""
    if towers:
        return (f"multimodal: the shrunk model with its {towers[0]} tower keeps "
                f"{count / 1e6:.0f} M parameters{where} (a size field the shrink does not know)")
    return f"shrink leaves {count / 1e6:.0f} M parameters{where} (a size field it does not know)"


def _set_special_ids(config) -> None:
    """The tokenizer's bos/eos/pad ids, on the config and on a text sub-config that has them."""
    targets = [config]
    text = getattr(config, "text_config", None)
    if text is not None and text is not config:
        targets.append(text)
    for target in targets:
        for key, value in SPECIAL_IDS.items():
            setattr(target, key, value)


@contextlib.contextmanager
def _quiet():
    """transformers' and torch's warnings about defaults are noise for random models."""
    from transformers.utils import logging as hf_logging

    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # save_pretrained's per-shard bar (left off: a global)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(previous)
