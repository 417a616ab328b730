"""The alignment stage's core: models, windows and comparisons (see the package docstring)."""

from __future__ import annotations

import hashlib
import math
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from day0.stages.alignment import generation as gen
from day0.stages.alignment import sides
from day0.stages.alignment import streamed as stream
from day0.stages.alignment.bank import size_text
from day0.stages.alignment.banked import RecordedOps, encode_ops
from day0.stages.alignment.engine import MemoSide, evaluate
from day0.stages.alignment.layers import LayerRow, RouterRow
from day0.stages.alignment.logits import BucketRow, bucket_bounds
from day0.torchkit.replay import OpRow, record_ops, replay_recorded
from day0.torchkit.paired import Blocks, Comparison, mean_excess, ratios, worst
from day0.torchkit.evaltext import (load_tokenizer, prefix_token, prompts, read_text,
                                 resolve_text_file, tokenize, windows)
from day0.torchkit.tolerances import load_tolerances
from day0 import progress
from day0.contract import Laps, StageInputs, StageResult
from day0.errors import ConfigError
from day0.checkpoint_io import read_config_dict
from day0.modeling import check_source, resolve_config
from day0.plugins import apply_plugins
from day0.sources import local_checkpoint

OP_CHECK_SCOPE = (
    "Each aten op of a short reference forward is replayed on the target device at the target "
    "dtype from the recorded inputs and compared with float32. This exercises the target's "
    "device kernels for those aten ops, including torch.library overrides a plugin registered "
    "globally; it does NOT exercise model-level changes a plugin makes (replaced module "
    "forwards, fused or custom ops, quantized weights): those are judged by the layer, logit "
    "and perplexity comparisons, which run the target exactly as it is.")


class Config(BaseModel):
    """Settings of the alignment stage."""

    model_config = ConfigDict(extra="forbid")

    text_file: str | None = Field(None, description=(
        "UTF-8 evaluation text. Default: heldout.txt in the checkpoint folder if present, else "
        "day0's built-in text (day0/data/eval_text.txt)."))
    seq_len: int | None = Field(None, ge=3, description=(
        "Positions per evaluation window. Default: the model's max_position_embeddings, capped "
        "at seq_len_cap, so windows reach the far end of the trained context."))
    seq_len_cap: int = Field(8192, ge=3, description=(
        "Upper bound of the default seq_len (CPU time grows with it; the report gives the "
        "covered fraction of the trained context)."))
    max_windows: int = Field(4, ge=1, description="Evaluation windows (non-overlapping).")
    context_tokens: int = Field(8, ge=1, description=(
        "Leading positions of each window (start token included) that are context only, never "
        "scored: every scored position has real text before it."))
    chunk_tokens: int = Field(1024, ge=16, description=(
        "A longer window runs in chunks of this many positions over a KV cache (bounds memory)."))
    position_buckets: int = Field(4, ge=1, description=(
        "Equal position ranges that layer and logit errors are reported and gated by."))
    check_ops: bool = Field(True, description="Run the per-operator replay.")
    op_tokens: int = Field(32, ge=1, description="Input tokens of the forward whose ops are replayed.")
    reference_inputs: Literal["rounded", "float32"] = Field("rounded", description=(
        "Per-op reference inputs: 'rounded' to the target dtype (isolates kernel error) or "
        "'float32' as recorded. Discrete ops always use rounded inputs."))
    check_weights: bool = Field(True, description=(
        "Scan every weight of the checkpoint (non-finite, zeroed, constant, corrupted values) "
        "and the reference perplexity's plausibility: a broken checkpoint is its own verdict."))
    generation_prompts: int = Field(4, ge=0, description="Prompts for greedy generation.")
    prompt_tokens: int = Field(16, ge=1, description="Tokens per generation prompt.")
    new_tokens: int = Field(32, ge=1, description="Tokens generated per prompt.")
    tolerance_file: str | None = Field(None, description=(
        "Tolerances YAML replacing day0/data/tolerances.yaml (same schema)."))
    streaming: Literal["auto", "on", "off"] = Field("auto", description=(
        "Run reference, control and an in-process target layer by layer, each layer's weights "
        "read from the shards when needed (peak memory: about one layer, not the model). "
        "'auto': stream when the resident copies would not fit in the available memory."))
    expert_group_gib: float = Field(1.0, gt=0, description=(
        "Streaming: MoE experts routed to are read this many GiB at a time."))
    reference_bank: Literal["use", "refresh", "off"] = Field("use", description=(
        "The reference bank (what reference and control computed on these windows, keyed by "
        "weights, windows, settings and versions): 'use' replays it when present and stores "
        "it when computed; 'refresh' recomputes and replaces it; 'off' neither reads nor "
        "writes."))
    reference_bank_max_gib: float = Field(16.0, gt=0, description=(
        "Largest bank a run stores (float32 logits and every layer's output per position: "
        "Llama-3.1-8B at the defaults takes ~32 GiB, ~48 with a bf16 control); a larger one "
        "is computed but not stored, said in the log."))
    reference_bank_uri: str | None = Field(None, description=(
        "Where banks are kept (s3://BUCKET/PREFIX or a folder). Default: "
        "$DAY0_REFERENCE_BANK_URI, else <results>/<model>/<revision>/reference-cpu-float32/"
        "alignment-bank next to the targets' results ($DAY0_RESULTS_URI, or the s3 source's "
        "bucket), else the local cache."))


class Result(StageResult):
    """Evidence of the alignment stage; metrics() gives the flat gate inputs."""

    # NaN/inf are findings: keep them in JSON instead of turning them into null.
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")

    target: str = Field(description="Target label (name, device, dtype).")
    claim: str = Field("faithful", description="The target's numerics claim (selects bounds).")
    control: str = Field(description="What the control is: reference device, target dtype.")
    target_is_control: bool = Field(description=(
        "The target is the control itself (same device and dtype, no plugins): relative gates "
        "compare it with itself and the absolute bounds decide."))
    plugins: list[str] = Field(default_factory=list, description="Plugins applied to the target.")
    text_file: str = Field(description="Evaluation text used.")
    text_tokens: int = Field(0, description="Tokens of the evaluation text.")
    seq_len: int = Field(description="Positions per window (start token included).")
    prefix_token: int | None = Field(None, description="Start token of every window (BOS/EOS).")
    context_tokens: int = Field(0, description="Leading positions per window not scored.")
    max_position_embeddings: int | None = Field(None, description="The model's trained context.")
    covered_fraction: float | None = Field(None, description=(
        "Furthest scored position + 1 over the trained context."))
    windows: int = Field(description="Windows evaluated.")
    positions: int = Field(description="Scored positions (logit level) over all windows.")
    op_check_scope: str = Field(OP_CHECK_SCOPE, description="What the op check covers.")
    ops: list[OpRow] = Field(default_factory=list, description="Per-operator replay table.")
    layers: list[LayerRow] = Field(description="Per-decoder-layer error, target vs control.")
    first_divergent_layer: int | None = Field(description=(
        "First layer whose error departs from the control's beyond the bound, or None."))
    buckets: list[BucketRow] = Field(description="Logit agreement per position bucket.")
    comparisons: list[Comparison] = Field(default_factory=list, description=(
        "Target vs control, paired: the statistics the relative gates read."))
    kl_mean: float = Field(description="Mean over scored positions of KL(ref||target), nats.")
    kl_p99: float = Field(description="99th percentile over scored positions of KL, nats.")
    kl_max: float = Field(description="Largest per-position KL, nats.")
    kl_max_bucket: float = Field(description="Largest per-bucket mean KL, nats.")
    top1_agreement: float = Field(description="Fraction of positions with the same argmax.")
    control_kl_mean: float = Field(math.nan, description="Mean KL(ref||control), nats.")
    control_kl_p99: float = Field(math.nan, description="99th percentile of KL(ref||control).")
    control_kl_max: float = Field(math.nan, description="Largest per-position KL(ref||control).")
    control_top1_agreement: float = Field(math.nan, description="Control's top-1 agreement.")
    routers: list[RouterRow] | None = Field(None, description="Per-router agreement (MoE).")
    expert_agreement: float | None = Field(None, description=(
        "Mean Jaccard index of selected expert sets per token and router (None: dense)."))
    control_expert_agreement: float | None = Field(None, description="The control's.")
    expert_exact_match: float | None = Field(None, description=(
        "Fraction of token routings with the identical expert set (None: dense)."))
    perplexity_reference: float = Field(description="Reference perplexity on the windows.")
    perplexity_target: float = Field(description="Target perplexity on the windows.")
    perplexity_control: float = Field(math.nan, description="Control perplexity, same windows.")
    perplexity_rel_delta: float = Field(description="|target - reference| / reference.")
    generation: list[gen.GenerationRow] = Field(default_factory=list,
                                                description="Per-prompt greedy comparison.")
    nonfinite: int = Field(description="Non-finite values in target logits and hidden states.")
    notes: list[str] = Field(default_factory=list, description="What limited the evaluation.")
    timings: dict[str, float] = Field(default_factory=dict, description="Seconds per part.")
    peak_rss_mib: dict[str, float] = Field(default_factory=dict, description=(
        "Peak resident memory per part, MiB (the stage process's own)."))
    streamed: bool = Field(False, description=(
        "Reference, control and target ran layer by layer from the shards."))
    reference_bank: str | None = Field(None, description="The reference bank used (its key).")
    reference_bank_hit: bool = Field(False, description=(
        "The reference was replayed from the bank: no reference forward ran."))
    reference_bank_bytes: int | None = Field(None, description="Size of the bank, bytes.")

    def comparison(self, metric: str) -> Comparison | None:
        return next((c for c in self.comparisons if c.metric == metric), None)

    def metrics(self) -> dict[str, float | None]:
        checked = [o for o in self.ops if o.status != "skipped"]
        ops = bool(self.ops)

        def low(metric):
            found = self.comparison(metric)
            return found.low if found else None

        bucket_lows = [b.kl_ratio_low for b in self.buckets if b.kl_ratio_low is not None]
        gens = self.generation
        return {
            "alignment.ops.checked": float(len(checked)) if ops else None,
            "alignment.ops.failed": (float(sum(o.status in ("failed", "error") for o in checked))
                                     if ops else None),
            "alignment.ops.discrete_mismatches": (
                float(sum(o.status in ("failed", "error") and o.kind == "discrete"
                          for o in checked)) if ops else None),
            "alignment.ops.skipped": float(len(self.ops) - len(checked)) if ops else None,
            "alignment.layers.max_rel_error": _nan_max([r.rel_error for r in self.layers]),
            "alignment.layers.max_ratio_low": _nan_max([r.ratio_low for r in self.layers]),
            "alignment.layers.diverged": float(sum(r.diverged for r in self.layers)),
            "alignment.logits.kl_mean": self.kl_mean,
            "alignment.logits.kl_p99": self.kl_p99,
            "alignment.logits.kl_max": self.kl_max,
            "alignment.logits.kl_max_bucket": self.kl_max_bucket,
            "alignment.logits.top1_agreement": self.top1_agreement,
            "alignment.control.kl_mean": self.control_kl_mean,
            "alignment.control.top1_agreement": self.control_top1_agreement,
            "alignment.vs_control.kl_mean_ratio": (self.comparison("kl_mean").ratio
                                                   if self.comparison("kl_mean") else None),
            "alignment.vs_control.kl_mean_ratio_low": low("kl_mean"),
            "alignment.vs_control.kl_bucket_ratio_low": _nan_max(bucket_lows),
            "alignment.vs_control.top1_disagreement_ratio_low": low("top1_disagreement"),
            "alignment.vs_control.perplexity_ratio_low": low("perplexity"),
            "alignment.vs_control.expert_disagreement_ratio_low": low("expert_disagreement"),
            "alignment.moe.expert_agreement": self.expert_agreement,
            "alignment.perplexity.reference": self.perplexity_reference,
            "alignment.perplexity.target": self.perplexity_target,
            "alignment.perplexity.control": self.perplexity_control,
            "alignment.perplexity.rel_delta": self.perplexity_rel_delta,
            "alignment.generation.token_match_rate": (
                sum(g.match_rate for g in gens) / len(gens) if gens else None),
            "alignment.generation.control_token_match_rate": (
                sum(g.control_match_rate for g in gens) / len(gens) if gens else None),
            "alignment.generation.first_divergence": (
                float(min(g.first_divergence for g in gens)) if gens else None),
            "alignment.coverage.fraction": self.covered_fraction,
            "alignment.nonfinite": float(self.nonfinite),
        }


def _nan_max(values: list[float]) -> float | None:
    if not values:
        return None
    return math.nan if any(math.isnan(v) for v in values) else max(values)


def _is_control(target, reference) -> bool:
    return (not target.plugins and target.device.split(":")[0] == reference.device.split(":")[0]
            and target.runner != "deployment")


class Memo:
    """Sides kept across run() calls on the same checkpoint and text (for calibration and tests
    that validate many targets): the reference and control loaded once and each window computed
    once; the last target too, so a target judged again under another claim runs nothing again.
    Not used by the stage runner, where every stage is a fresh process."""

    def __init__(self):
        self.sides: dict[tuple, MemoSide] = {}
        self.generations: dict[tuple, list] = {}

    def greedy(self, model, batch, new_tokens: int, device: str, pad) -> list:
        # kept only for models the memo holds: a freed model's id may name the next one
        if not any(side.model is model for side in self.sides.values()):
            return gen.greedy(model, batch, new_tokens, device, pad)
        key = (id(model), hash(tuple(map(tuple, batch))), new_tokens)
        if key not in self.generations:
            self.generations[key] = gen.greedy(model, batch, new_tokens, device, pad)
        return self.generations[key]

    def side(self, name: str, source: str, device: str, dtype: str, load) -> MemoSide:
        key = (name, source, device, dtype)
        if key not in self.sides:
            self.sides[key] = MemoSide(name, load(), device)
        return self.sides[key]

    def target(self, source: str, profile, load) -> MemoSide:
        """The target side with its plugins applied; only the last target is kept (a new one
        frees it and its generations first)."""
        key = ("target", source, profile.device, profile.dtype,
               tuple(plugin_key(p) for p in profile.plugins))
        if key not in self.sides:
            for old in [k for k in self.sides if k[0] == "target"]:
                gone = id(self.sides.pop(old).model)
                self.generations = {k: v for k, v in self.generations.items() if k[0] != gone}
            model = load()
            apply_plugins(model, profile.plugins)
            self.sides[key] = MemoSide("target", model, profile.device, profile.plugins)
        return self.sides[key]


def plugin_key(spec: str) -> str:
    """A file plugin by its content (edited between calls: another target), else its name."""
    from pathlib import Path

    from day0.identity import file_digest

    return file_digest(Path(spec)) if Path(spec).is_file() else spec


def run(config: Config, inputs: StageInputs, *, memo: Memo | None = None) -> Result:
    laps = Laps()
    lap = laps.lap

    target, reference = inputs.target, inputs.reference
    # rough shares of the stage's time on a CPU target (the windows dominate)
    progress.plan({"weights": 1, "models": 1, "ops": 1, "windows": 6, "generation": 1})
    tolerances = load_tolerances(config.tolerance_file)
    source_name = inputs.source
    check_source(source_name)  # a hostile config.json is refused before any weight is read
    same = _is_control(target, reference)
    # s3:// sources: config, tokenizer and texts first; the shards only if a model runs resident
    local = local_checkpoint(source_name, log=print, weights=False)
    lap("fetch")
    if target.dtype not in tolerances.ops.tolerances or \
            target.dtype not in tolerances.control.floors.layer_rel_error:
        raise ConfigError(f"no tolerances for dtype {target.dtype}",
                          file=config.tolerance_file or "day0/data/tolerances.yaml",
                          field="ops.tolerances", fix=f"add a '{target.dtype}' entry under "
                          "ops.tolerances and control.floors.layer_rel_error")
    text_path = resolve_text_file(config.text_file, local)
    text = read_text(text_path)
    tokenizer = load_tokenizer(local, inputs.trust_remote_code)
    model_config = resolve_config(read_config_dict(local),
                                  trust_remote_code=inputs.trust_remote_code).config
    notes: list[str] = []
    max_pos = getattr(model_config, "max_position_embeddings", None)
    seq_len = config.seq_len or min(max_pos or config.seq_len_cap, config.seq_len_cap)
    ids = tokenize(tokenizer, text, getattr(model_config, "vocab_size", None))
    prefix = prefix_token(tokenizer)
    wins, text_notes = windows(ids, seq_len, config.max_windows, prefix, config.context_tokens)
    notes += text_notes + _window_notes(config, wins, seq_len, max_pos, prefix)
    span = max(len(w.ids) for w in wins)
    chosen = prompts(ids, config.generation_prompts, config.prompt_tokens) \
        if config.generation_prompts else []
    batch = [([prefix] if prefix is not None else []) + prompt for _, prompt in chosen]
    op_ids = wins[0].ids[:config.op_tokens] if config.check_ops else None

    control_profile = reference.model_copy(update={"dtype": target.dtype})
    plan = sides.open_bank(config, source_name, reference, control_profile, wins, op_ids, batch,
                           model_config, inputs.revision)
    lap("bank")  # identifying the weights (a local folder: every byte hashed) and the bank
    live = sides.live_dtypes(plan, reference, control_profile, same, target)
    streamed = sides.streaming(config, source_name, live)
    if live and not streamed:  # a model runs resident: its shards, local
        inputs = inputs.model_copy(update={"source": local_checkpoint(source_name, log=print)})
    weights_source = source_name if streamed else inputs.source
    problems: list[str] = []
    banked_scan = plan.reference.meta.weight_problems if plan.reference is not None else None
    if config.check_weights and banked_scan is not None:
        problems += banked_scan
        progress.update("weights", 1, 1, detail="the weight scan's findings, from the bank")
    elif config.check_weights:  # shards read in place when no model needs them local
        from day0 import sanity

        problems += sanity.check_weights(weights_source if live else source_name)
        lap("weights")
    scanned = list(problems)  # what the bank keeps of the weight scan
    try:
        ref, ctl, tgt = sides.load_sides(
            plan, streamed=streamed, same=same, memo=memo, wins=wins, reference=reference,
            inputs=inputs.model_copy(update={"source": weights_source}), target=target,
            control_profile=control_profile,
            expert_group_bytes=int(config.expert_group_gib * 2**30))
        lap("load")
        op_rows, recorded = _ops(config, plan, ref, op_ids, reference, target, tolerances)
        if op_rows is not None:
            lap("ops")
        n_buckets = min(config.position_buckets, span)
        if streamed:
            notes.append(stream.NOTE)
            evidence = stream.evaluate_streamed(wins, ref, ctl, tgt, span=span,
                                                n_buckets=n_buckets,
                                                logit_chunk=config.chunk_tokens)
        else:
            evidence = evaluate(wins, ref, ctl, tgt, span=span, n_buckets=n_buckets,
                                chunk=config.chunk_tokens)
        sides.flush(plan)  # the bank's tensors to disk before generation
        lap("windows")
        result = _summarize(config, evidence, tolerances, target, span, n_buckets)
        if bad_ref := evidence.logits.reference_nonfinite:
            problems.append(f"the cpu/float32 reference produced {bad_ref} non-finite logits")
        if config.check_weights:
            problems += _perplexity_check(result["perplexity_reference"], model_config,
                                          source_name, inputs, text, seq_len, len(wins),
                                          bool(problems))
        made: dict[str, list] = {}
        gen_rows = gen.compared(config.new_tokens, chosen, batch, tokenizer, ref, ctl, tgt,
                                reference.device, target, memo.greedy if memo else None,
                                streamed, made)
        lap("generation")
        bank_bytes = sides.commit(
            plan, {"reference": (ref, reference), plan.control_part: (ctl, control_profile)},
            made, built="streamed" if streamed else "resident", wins=wins, ops=recorded,
            weight_problems=scanned if config.check_weights else None)
    finally:
        sides.abort(plan)  # a run that did not finish stores nothing
    if plan.root:
        notes.append(f"reference bank {plan.where} ({size_text(bank_bytes)}): "
                     + ("reference replayed, no reference forward" if plan.reference is not None
                        else "reference computed here"))
    covered = int(evidence.column("position_of").max()) + 1 if result["positions"] else 0
    return Result(
        target=target.label, claim=target.claim,
        control=f"{reference.device}/{target.dtype}, no plugins", target_is_control=same,
        plugins=list(target.plugins), text_file=str(text_path), text_tokens=len(ids),
        seq_len=seq_len, prefix_token=prefix, context_tokens=wins[0].score_from,
        max_position_embeddings=max_pos,
        covered_fraction=covered / max_pos if max_pos else None, windows=len(wins),
        ops=op_rows or [], generation=gen_rows, notes=notes, timings=laps.timings,
        peak_rss_mib=laps.peak_rss_mib, streamed=streamed,
        reference_bank=plan.where, reference_bank_hit=plan.reference is not None,
        reference_bank_bytes=bank_bytes if plan.root else None,
        checkpoint_problems=problems, **result)


def _window_notes(config: Config, wins, seq_len: int, max_pos, prefix) -> list[str]:
    notes = []
    span = max(len(w.ids) for w in wins)
    if max_pos and seq_len > max_pos:
        notes.append(f"seq_len {seq_len} exceeds the trained context {max_pos}")
    if max_pos and span < max_pos:
        notes.append(f"windows cover positions 0-{span - 1} of the trained context {max_pos} "
                     f"({span / max_pos:.1%}); raise seq_len_cap to reach further")
    if prefix is None:
        notes.append("the tokenizer has no BOS/EOS token: windows start mid-text; the first "
                     f"{config.context_tokens} positions are context only")
    return notes


def _ops(config: Config, plan, ref, op_ids, reference, target, tolerances) -> tuple:
    """(op rows or None, the op list for bank.json or None): replayed from the bank's recorded
    inputs, or recorded from a short reference forward (its inputs then go to the bank)."""
    if op_ids is None:
        return None, None
    recorded = None
    if plan.reference is not None:  # a bank part without its op inputs is not opened
        recorder = RecordedOps(plan.reference.meta.ops, plan.reference.ops())
    else:
        recorder = record_ops(ref.model, torch.tensor([op_ids], device=reference.device))
        writer = plan.writers.get("reference")
        if writer is not None and (encoded := encode_ops(recorder)) is not None:
            recorded, examples = encoded
            writer.put_ops(examples)  # to disk now, not held until the end
    rows = replay_recorded(recorder, device=target.device, dtype=target.dtype,
                           tolerances=tolerances, reference_inputs=config.reference_inputs)
    return rows, recorded


def _summarize(config: Config, evidence, tolerances, target, span: int, n_buckets: int) -> dict:
    """Absolute statistics per side and the paired target-vs-control comparisons."""
    control = tolerances.control
    floors = control.floors
    blocks = Blocks.build(evidence.column("window_of"), evidence.column("bucket_of"),
                          control.block_size)
    logits = evidence.logits
    summary = logits.summary()
    kl_t, kl_c = logits.column("kl_t"), logits.column("kl_c")
    top1_t, top1_c = logits.column("top1_t"), logits.column("top1_c")
    comparisons = ratios(["kl_mean"], kl_t, kl_c, blocks, floors.kl)
    comparisons += ratios(["top1_disagreement"], (~top1_t.bool()).double(),
                          (~top1_c.bool()).double(), blocks, floors.top1_disagreement)
    has_next = logits.column("has_next").bool()
    kept = Blocks.build(evidence.column("window_of")[has_next],
                        evidence.column("bucket_of")[has_next], control.block_size)
    comparisons.append(mean_excess("perplexity", logits.column("nll_t")[has_next],
                                   logits.column("nll_c")[has_next], kept))
    routed = evidence.routers.positions()
    routers = evidence.routers.rows() or None
    agreement = control_agreement = exact = None
    if routed is not None and routers:
        comparisons += ratios(["expert_disagreement"], routed[0], routed[1], blocks,
                              floors.expert_disagreement)
        tokens = sum(r.tokens for r in routers)
        agreement = sum(r.jaccard * r.tokens for r in routers) / tokens
        control_agreement = sum(r.control_jaccard * r.tokens for r in routers) / tokens
        exact = sum(r.exact * r.tokens for r in routers) / tokens

    bucket_rows = []
    for b, (start, end) in enumerate(bucket_bounds(span, n_buckets)):
        mask = evidence.column("bucket_of") == b
        count = int(mask.sum())
        cmp = ratios([f"kl_mean bucket {b}"], kl_t, kl_c, blocks, floors.kl,
                     blocks.bucket_of_block == b)[0]
        bucket_rows.append(BucketRow(
            bucket=b, start=start, end=end, positions=count,
            kl_mean=kl_t[mask].mean().item() if count else None,
            control_kl_mean=kl_c[mask].mean().item() if count else None,
            kl_ratio=cmp.ratio if count else None, kl_ratio_low=cmp.low if count else None,
            top1_agreement=top1_t[mask].double().mean().item() if count else None,
            control_top1_agreement=top1_c[mask].double().mean().item() if count else None))
    bound = control.layer_ratio[target.claim]
    layer_rows = evidence.layers.rows(blocks, n_buckets,
                                      floors.layer_rel_error[target.dtype], bound)
    first = next((r.layer for r in layer_rows if r.diverged), None)
    bucket_kls = [r.kl_mean for r in bucket_rows if r.kl_mean is not None]
    return dict(
        positions=summary["positions"], layers=layer_rows, first_divergent_layer=first,
        buckets=bucket_rows, comparisons=comparisons, kl_mean=summary["kl_mean"],
        kl_p99=summary["kl_p99"], kl_max=summary["kl_max"],
        kl_max_bucket=_nan_max(bucket_kls) if bucket_kls else math.nan,
        top1_agreement=summary["top1_agreement"], control_kl_mean=summary["control_kl_mean"],
        control_kl_p99=summary["control_kl_p99"], control_kl_max=summary["control_kl_max"],
        control_top1_agreement=summary["control_top1_agreement"], routers=routers,
        expert_agreement=agreement, control_expert_agreement=control_agreement,
        expert_exact_match=exact, perplexity_reference=summary["perplexity_reference"],
        perplexity_target=summary["perplexity_target"],
        perplexity_control=summary["perplexity_control"],
        perplexity_rel_delta=summary["perplexity_rel_delta"],
        nonfinite=summary["nonfinite"] + sum(r.nonfinite for r in layer_rows))


def _perplexity_check(ppl_ref: float, model_config, source: str, inputs: StageInputs, text: str,
                      seq_len: int, n_windows: int, already_broken: bool) -> list[str]:
    """The reference perplexity must be far from a uniform guess and near the score this
    model/revision had before on the same text and windows (stored after a sane run)."""
    from day0 import sanity

    revision = getattr(inputs, "revision", None)
    key = None
    if revision:
        digest = hashlib.sha256(f"{text}|{seq_len}|{n_windows}".encode()).hexdigest()[:16]
        key = f"{source}@{revision}#{digest}"
    stored = sanity.stored_reference_perplexity(key) if key else None
    found = sanity.perplexity_problems(ppl_ref, getattr(model_config, "vocab_size", 0) or 0,
                                       stored)
    if key and stored is None and not found and not already_broken and math.isfinite(ppl_ref):
        sanity.store_reference_perplexity(key, ppl_ref)
    return found


__all__ = ["Config", "Result", "run"]
