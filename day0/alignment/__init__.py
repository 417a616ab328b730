"""Numerical alignment stage: does the target compute what the cpu/float32 reference computes?

Levels, from the smallest unit to end-to-end behaviour:

* operators   - every aten op of a short reference forward, replayed on the target (ops.py);
* layers      - each decoder layer's output hidden states, by position bucket (layers.py);
* logits      - per-position KL(ref||target), top-1 agreement, by position bucket (logits.py);
* MoE routing - agreement of the selected expert sets per token (layers.py);
* perplexity  - on seq_len windows of the evaluation text (logits.py);
* generation  - greedy continuations of prompts from the text (generation.py).

Windows reach the model's trained context (up to ``seq_len_cap``) so faults that only show at
far positions are found. Target plugins are applied to the target model only.
"""

from __future__ import annotations

import math
import time
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from day0.alignment import generation as gen
from day0.alignment.layers import (Capture, LayerAccumulator, LayerRow, RouterAccumulator,
                                   RouterRow)
from day0.alignment.logits import BucketRow, LogitAccumulator, bucket_index
from day0.alignment.ops import OpRow, check_ops
from day0.alignment.text import (load_tokenizer, prompts, read_text, resolve_text_file,
                                 tokenize, windows)
from day0.alignment.tolerances import load_tolerances
from day0.contract import StageInputs, StageResult
from day0.errors import ConfigError, StageError
from day0.modeling import load_pretrained
from day0.plugins import apply_plugins
from day0.sources import local_checkpoint


class Config(BaseModel):
    """Settings of the alignment stage."""

    model_config = ConfigDict(extra="forbid")

    text_file: str | None = Field(None, description=(
        "UTF-8 evaluation text. Default: heldout.txt in the checkpoint folder if present, else "
        "day0's built-in text (day0/data/eval_text.txt)."))
    seq_len: int | None = Field(None, ge=2, description=(
        "Tokens per evaluation window. Default: the model's max_position_embeddings, capped at "
        "seq_len_cap, so windows reach the trained context."))
    seq_len_cap: int = Field(256, ge=2, description="Upper bound of the default seq_len.")
    max_windows: int = Field(4, ge=1, description="Evaluation windows (non-overlapping).")
    position_buckets: int = Field(4, ge=1, description=(
        "Equal position ranges that layer and logit errors are reported by."))
    check_ops: bool = Field(True, description="Run the per-operator replay.")
    op_tokens: int = Field(32, ge=1, description="Input tokens of the forward whose ops are replayed.")
    reference_inputs: Literal["rounded", "float32"] = Field("rounded", description=(
        "Per-op reference inputs: 'rounded' to the target dtype (isolates kernel error) or "
        "'float32' as recorded. Discrete ops always use rounded inputs."))
    generation_prompts: int = Field(4, ge=0, description="Prompts for greedy generation.")
    prompt_tokens: int = Field(16, ge=1, description="Tokens per generation prompt.")
    new_tokens: int = Field(32, ge=1, description="Tokens generated per prompt.")
    tolerance_file: str | None = Field(None, description=(
        "Tolerances YAML replacing day0/data/tolerances.yaml (same schema)."))


class Result(StageResult):
    """Evidence of the alignment stage; metrics() gives the flat gate inputs."""

    # NaN/inf are findings: keep them in JSON instead of turning them into null.
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")

    target: str = Field(description="Target label (name, device, dtype).")
    plugins: list[str] = Field(default_factory=list, description="Plugins applied to the target.")
    text_file: str = Field(description="Evaluation text used.")
    seq_len: int = Field(description="Tokens per window.")
    max_position_embeddings: int | None = Field(None, description="The model's trained context.")
    windows: int = Field(description="Windows evaluated.")
    positions: int = Field(description="Positions compared at the logit level.")
    ops: list[OpRow] = Field(default_factory=list, description="Per-operator replay table.")
    layers: list[LayerRow] = Field(description="Per-decoder-layer error table.")
    first_divergent_layer: int | None = Field(description="First layer over tolerance, or None.")
    buckets: list[BucketRow] = Field(description="Logit agreement per position bucket.")
    kl_mean: float = Field(description="Mean per-position KL(ref||target), nats.")
    kl_p99: float = Field(description="99th percentile of per-position KL, nats.")
    kl_max: float = Field(description="Largest per-position KL, nats.")
    kl_max_bucket: float = Field(description="Largest per-bucket mean KL, nats.")
    top1_agreement: float = Field(description="Fraction of positions with the same argmax.")
    routers: list[RouterRow] | None = Field(None, description="Per-router agreement (MoE).")
    expert_agreement: float | None = Field(None, description=(
        "Mean Jaccard index of selected expert sets per token and router (None: dense)."))
    expert_exact_match: float | None = Field(None, description=(
        "Fraction of token routings with the identical expert set (None: dense)."))
    perplexity_reference: float = Field(description="Reference perplexity on the windows.")
    perplexity_target: float = Field(description="Target perplexity on the windows.")
    perplexity_rel_delta: float = Field(description="|target - reference| / reference.")
    generation: list[gen.GenerationRow] = Field(default_factory=list,
                                                description="Per-prompt greedy comparison.")
    nonfinite: int = Field(description="Non-finite values in target logits and hidden states.")
    notes: list[str] = Field(default_factory=list, description="What limited the evaluation.")
    timings: dict[str, float] = Field(default_factory=dict, description="Seconds per part.")

    def metrics(self) -> dict[str, float | None]:
        checked = [o for o in self.ops if o.status != "skipped"]
        layer_errors = [r.worst_bucket_rel_error for r in self.layers]
        return {
            "alignment.ops.checked": float(len(checked)) if self.ops else None,
            "alignment.ops.failed": (float(sum(o.status in ("failed", "error") for o in checked))
                                     if self.ops else None),
            "alignment.ops.discrete_mismatches": (
                float(sum(o.status in ("failed", "error") and o.kind == "discrete"
                          for o in checked)) if self.ops else None),
            "alignment.ops.skipped": float(len(self.ops) - len(checked)) if self.ops else None,
            "alignment.layers.max_rel_error": _nan_max(layer_errors),
            "alignment.layers.diverged": float(self.first_divergent_layer is not None),
            "alignment.logits.kl_mean": self.kl_mean,
            "alignment.logits.kl_p99": self.kl_p99,
            "alignment.logits.kl_max_bucket": self.kl_max_bucket,
            "alignment.logits.top1_agreement": self.top1_agreement,
            "alignment.moe.expert_agreement": self.expert_agreement,
            "alignment.perplexity.reference": self.perplexity_reference,
            "alignment.perplexity.target": self.perplexity_target,
            "alignment.perplexity.rel_delta": self.perplexity_rel_delta,
            "alignment.generation.token_match_rate": (
                sum(g.match_rate for g in self.generation) / len(self.generation)
                if self.generation else None),
            "alignment.generation.first_divergence": (
                float(min(g.first_divergence for g in self.generation))
                if self.generation else None),
            "alignment.nonfinite": float(self.nonfinite),
        }


def _nan_max(values: list[float]) -> float | None:
    if not values:
        return None
    return math.nan if any(math.isnan(v) for v in values) else max(values)


def _forward(model, ids: torch.Tensor, side: str, plugins: list[str]) -> torch.Tensor:
    """Logits [seq, vocab] on CPU float32; a target failure names the target and its plugins."""
    try:
        with torch.no_grad():
            logits = model(input_ids=ids, use_cache=False).logits
    except Exception as exc:
        if side == "reference":
            raise
        raise StageError(f"target forward raised {type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''}",
                         field="target.plugins" if plugins else "target",
                         fix="fix the target's kernels/plugins for the failing op") from exc
    return logits[0].detach().to("cpu", torch.float32)


def run(config: Config, inputs: StageInputs) -> Result:
    timings: dict[str, float] = {}
    clock = time.monotonic()

    def lap(name: str):
        nonlocal clock
        now = time.monotonic()
        timings[name] = round(now - clock, 3)
        clock = now

    target, reference = inputs.target, inputs.reference
    tolerances = load_tolerances(config.tolerance_file)
    # s3:// sources: streamed shard by shard into the local cache (unchanged ETags: no download)
    inputs = inputs.model_copy(update={"source": local_checkpoint(inputs.source, log=print)})
    lap("fetch")
    if target.dtype not in tolerances.layers or target.dtype not in tolerances.ops.tolerances:
        raise ConfigError(f"no tolerances for dtype {target.dtype}",
                          file=config.tolerance_file or "day0/data/tolerances.yaml",
                          field="layers", fix=f"add a '{target.dtype}' entry under ops.tolerances "
                                              "and layers")
    text_path = resolve_text_file(config.text_file, inputs.source)
    text = read_text(text_path)
    tokenizer = load_tokenizer(inputs.source, inputs.trust_remote_code)
    ref = load_pretrained(inputs.source, device=reference.device, dtype=reference.dtype,
                          trust_remote_code=inputs.trust_remote_code)
    tgt = load_pretrained(inputs.source, device=target.device, dtype=target.dtype,
                          trust_remote_code=inputs.trust_remote_code)
    apply_plugins(tgt, target.plugins)
    lap("load")

    notes: list[str] = []
    max_pos = getattr(ref.config, "max_position_embeddings", None)
    seq_len = config.seq_len or min(max_pos or config.seq_len_cap, config.seq_len_cap)
    ids = tokenize(tokenizer, text, getattr(ref.config, "vocab_size", None))
    wins = windows(ids, seq_len, config.max_windows)
    span = max(len(w) for w in wins)
    if span < seq_len:
        notes.append(f"evaluation text has {len(ids)} tokens, fewer than seq_len {seq_len}: "
                     f"positions >= {span} are not evaluated")
    if max_pos and seq_len > max_pos:
        notes.append(f"seq_len {seq_len} exceeds the trained context {max_pos}")
    if max_pos and span < max_pos:
        notes.append(f"windows cover positions 0-{span - 1} of the trained context {max_pos}")

    op_rows: list[OpRow] = []
    if config.check_ops:
        op_ids = torch.tensor([ids[:config.op_tokens]], device=reference.device)
        op_rows = check_ops(ref, op_ids, device=target.device, dtype=target.dtype,
                            tolerances=tolerances, reference_inputs=config.reference_inputs)
        lap("ops")

    n_buckets = min(config.position_buckets, span)
    ref_cap, tgt_cap = Capture(ref), Capture(tgt)
    layer_acc = LayerAccumulator(len(ref_cap.layers), n_buckets)
    logit_acc, router_acc = LogitAccumulator(), RouterAccumulator()
    for window in wins:
        x = torch.tensor([window])
        with ref_cap:
            ref_logits = _forward(ref, x.to(reference.device), "reference", target.plugins)
        with tgt_cap:
            tgt_logits = _forward(tgt, x.to(target.device), "target", target.plugins)
        bucket_of = bucket_index(len(window), span, n_buckets)
        layer_acc.add(ref_cap.hidden, tgt_cap.hidden, bucket_of)
        router_acc.add(ref_cap.routes, tgt_cap.routes)
        logit_acc.add(ref_logits, tgt_logits, x[0], bucket_of)
    lap("windows")

    if bad_ref := logit_acc.reference_nonfinite:
        notes.append(f"the cpu/float32 REFERENCE produced {bad_ref} non-finite logits: "
                     "the checkpoint itself is broken; target comparisons are meaningless")
    layer_tol = tolerances.layers[target.dtype]
    layer_rows = layer_acc.rows(layer_tol.rel_error, layer_tol.jump_factor, layer_tol.jump_floor)
    first = next((r.layer for r in layer_rows if r.diverged), None)
    summary, bucket_rows = logit_acc.summary(span, n_buckets)

    routers = router_acc.rows() if ref_cap.routers else None
    agreement = exact = None
    if ref_cap.routers and not router_acc.stats:
        notes.append(f"found router modules {sorted(ref_cap.routers)[:3]} but none reported "
                     "expert indices; expert agreement not computed")
        routers = None
    elif routers:
        tokens = sum(r.tokens for r in routers)
        agreement = sum(r.jaccard * r.tokens for r in routers) / tokens
        exact = sum(r.exact * r.tokens for r in routers) / tokens

    gen_rows = _generation(config, ids, tokenizer, ref, tgt, reference.device, target)
    lap("generation")

    return Result(
        target=target.label, plugins=list(target.plugins), text_file=str(text_path),
        seq_len=seq_len, max_position_embeddings=max_pos, windows=len(wins),
        positions=summary["positions"], ops=op_rows, layers=layer_rows,
        first_divergent_layer=first, buckets=bucket_rows, kl_mean=summary["kl_mean"],
        kl_p99=summary["kl_p99"], kl_max=summary["kl_max"],
        kl_max_bucket=summary["kl_max_bucket"], top1_agreement=summary["top1_agreement"],
        routers=routers, expert_agreement=agreement, expert_exact_match=exact,
        perplexity_reference=summary["perplexity_reference"],
        perplexity_target=summary["perplexity_target"],
        perplexity_rel_delta=summary["perplexity_rel_delta"], generation=gen_rows,
        nonfinite=summary["nonfinite"] + sum(r.nonfinite for r in layer_rows),
        notes=notes, timings=timings)


def _generation(config: Config, ids, tokenizer, ref, tgt, ref_device: str, target
                ) -> list[gen.GenerationRow]:
    from transformers.utils import logging as hf_logging

    if not config.generation_prompts:
        return []
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    rows = []
    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    chosen = prompts(ids, config.generation_prompts, config.prompt_tokens)
    batch = [prompt for _, prompt in chosen]
    try:
        refs = gen.greedy(ref, batch, config.new_tokens, ref_device, pad)
        try:
            tgts = gen.greedy(tgt, batch, config.new_tokens, target.device, pad)
        except Exception as exc:
            raise StageError(f"target generate() raised {type(exc).__name__}: {exc}",
                             field="target.plugins" if target.plugins else "target",
                             fix="fix the target's kernels/plugins (cached decoding path)"
                             ) from exc
        for (start, prompt), r, t in zip(chosen, refs, tgts):
            rate, first = gen.compare(r, t, config.new_tokens)
            rows.append(gen.GenerationRow(
                prompt_start=start, prompt_tokens=len(prompt), new_tokens=config.new_tokens,
                match_rate=rate, first_divergence=first,
                reference_text=tokenizer.decode(r), target_text=tokenizer.decode(t)))
    finally:
        hf_logging.set_verbosity(previous)
    return rows


__all__ = ["Config", "Result", "run"]
