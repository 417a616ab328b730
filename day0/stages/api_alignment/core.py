"""The api_alignment stage's core: windows through the engine's API, the same windows in process
on the reference and the control, and their paired comparison (see the package docstring)."""

from __future__ import annotations

import math

import torch
from pydantic import BaseModel, ConfigDict, Field

from day0.execution import progress
from day0.execution.contract import Laps, StageInputs
from day0.engines.client import EngineClient
from day0.engines.greedy import compare_greedy
from day0.engines.process import max_model_len
from day0.errors import ConfigError
from day0.store.sources import local_checkpoint
from day0.engines.logprobs import Engine, EngineVsControl
from day0.torchkit.inprocess import Side, load_sides
from day0.stages.api_alignment.measures import Measures, bucket_bounds, bucket_index
from day0.stages.api_alignment.report import KL_DEFINITION
from day0.stages.api_alignment.rows import BucketRow, GenerationRow
from day0.torchkit.evaltext import (load_tokenizer, prefix_token, prompts, read_text,
                                   resolve_text_file, tokenize, windows)
from day0.torchkit.paired import Blocks, Comparison, mean_excess, ratios
from day0.torchkit.tolerances import load_tolerances


class Config(BaseModel):
    """Settings of the api_alignment stage."""

    model_config = ConfigDict(extra="forbid")

    text_file: str | None = Field(None, description=(
        "UTF-8 evaluation text. Default: heldout.txt in the checkpoint folder if present, else "
        "day0's built-in text (day0/data/eval_text.txt)."))
    seq_len: int | None = Field(None, ge=3, description=(
        "Positions per evaluation window. Default and upper bound: the engine's max_model_len "
        "minus 1 (a prompt must leave room for the one generated token), so windows reach the "
        "far end of the served context."))
    max_windows: int = Field(4, ge=1, description="Evaluation windows (non-overlapping).")
    context_tokens: int = Field(8, ge=1, description=(
        "Leading positions of each window (start token included) that are context only, never "
        "scored."))
    top_k: int = Field(20, ge=1, description=(
        "Logprobs requested per position (prompt_logprobs and generation logprobs): the size "
        "of the top-k set the truncated KL and the greedy comparison use. Capped by the "
        "engine's max_logprobs (vLLM --max-logprobs, default 20): a larger value is lowered to "
        "what the engine allows, with a note."))
    position_buckets: int = Field(4, ge=1, description=(
        "Equal position ranges that the truncated KL is reported and gated by (faults at far "
        "positions, e.g. a wrong RoPE base, show in the last buckets)."))
    chunk_tokens: int = Field(1024, ge=16, description=(
        "The in-process sides run a longer window in chunks of this many positions over a KV "
        "cache (bounds memory: a chunk's logits, never the window's)."))
    generation_prompts: int = Field(4, ge=0, description="Prompts for greedy generation.")
    prompt_tokens: int = Field(16, ge=1, description="Tokens per generation prompt.")
    new_tokens: int = Field(32, ge=1, description="Tokens generated per prompt.")
    tolerance_file: str | None = Field(None, description=(
        "Tolerances YAML replacing day0/data/tolerances.yaml: its control.block_size and "
        "control.floors (kl, top1_disagreement) are the paired comparison's."))


class Result(EngineVsControl):
    """Evidence of the api_alignment stage; metrics() gives the flat gate inputs."""

    text_file: str = Field(description="Evaluation text used.")
    text_tokens: int = Field(0, description="Tokens of the evaluation text.")
    max_model_len: int = Field(description="Context of the engine (windows are 1 shorter).")
    seq_len: int = Field(description="Positions per window (start token included).")
    prefix_token: int | None = Field(None, description="Start token of every window.")
    context_tokens: int = Field(0, description="Leading positions per window not scored.")
    windows: int = Field(description="Windows evaluated.")
    positions: int = Field(description="Scored positions (with a next token) over all windows.")
    top_k: int = Field(description="Logprobs per position actually used (after the engine's cap).")
    kl_definition: str = Field(KL_DEFINITION, description="What kl_topk is (truncated).")
    kl_topk_mean: float = Field(description="Mean truncated KL(ref || engine) over the engine's "
                                            "top-k, nats.")
    kl_topk_p99: float = Field(description="99th percentile of the per-position truncated KL.")
    kl_topk_max: float = Field(description="Largest per-position truncated KL.")
    control_kl_topk_mean: float = Field(description="Mean truncated KL(ref || control) over the "
                                                    "control's top-k.")
    control_kl_topk_p99: float = Field(description="99th percentile of the control's.")
    topk_reference_mass: float = Field(description=(
        "Mean reference probability inside the engine's top-k set: how much of the "
        "distribution the truncated KL sees."))
    top1_agreement: float = Field(description="Fraction of positions where the reference's "
                                              "argmax is among the engine's rank-1 tokens.")
    control_top1_agreement: float = Field(description="The control's (ties count likewise).")
    perplexity_reference: float = Field(description="Reference perplexity on the positions.")
    perplexity_engine: float = Field(description="Engine perplexity (its logprob of the actual "
                                                 "next token), same positions.")
    perplexity_control: float = Field(description="Control perplexity, same positions.")
    perplexity_rel_delta: float = Field(description="|engine - reference| / reference.")
    control_perplexity_rel_delta: float = Field(description="|control - reference| / reference.")
    nll_abs_diff_mean: float = Field(description=(
        "Mean |engine logprob - reference logprob| of the actual next token, nats."))
    comparisons: list[Comparison] = Field(default_factory=list, description=(
        "Engine vs control, paired: the statistics the relative gates read."))
    buckets: list[BucketRow] = Field(default_factory=list, description="Per position bucket.")
    generation: list[GenerationRow] = Field(default_factory=list, description=(
        "Per prompt: greedy engine and control vs reference (vLLM check_logprobs_close)."))
    moe: bool = Field(False, description="The model has routed experts.")
    expert_agreement: float | None = Field(None, description=(
        "Expert-set agreement with the reference; None: not measured (see notes)."))
    nonfinite: int = Field(description="NaN/inf logprobs returned by the engine.")
    notes: list[str] = Field(default_factory=list, description="What limited the evaluation.")
    timings: dict[str, float] = Field(default_factory=dict, description="Seconds per part.")

    def comparison(self, metric: str) -> Comparison | None:
        return next((c for c in self.comparisons if c.metric == metric), None)

    def metrics(self) -> dict[str, float | None]:
        def low(metric):
            found = self.comparison(metric)
            return found.low if found else None

        gens = self.generation
        lows = [b.kl_topk_ratio_low for b in self.buckets if b.kl_topk_ratio_low is not None]
        return {
            "api_alignment.kl_topk_mean": self.kl_topk_mean,
            "api_alignment.kl_topk_p99": self.kl_topk_p99,
            "api_alignment.top1_agreement": self.top1_agreement,
            "api_alignment.perplexity_rel_delta": self.perplexity_rel_delta,
            "api_alignment.perplexity.reference": self.perplexity_reference,
            "api_alignment.perplexity.engine": self.perplexity_engine,
            "api_alignment.perplexity.control": self.perplexity_control,
            "api_alignment.control.kl_topk_mean": self.control_kl_topk_mean,
            "api_alignment.control.top1_agreement": self.control_top1_agreement,
            "api_alignment.vs_control.kl_topk_ratio_low": low("kl_topk"),
            "api_alignment.vs_control.kl_topk_bucket_ratio_low": _nan_max(lows),
            "api_alignment.vs_control.top1_disagreement_ratio_low": low("top1_disagreement"),
            "api_alignment.vs_control.perplexity_ratio_low": low("perplexity"),
            "api_alignment.generation.not_close": (float(sum(not g.close for g in gens))
                                                   if gens else None),
            "api_alignment.generation.control_not_close": (
                float(sum(not g.control_close for g in gens)) if gens else None),
            "api_alignment.generation.token_match_rate": (
                sum(g.matched_prefix / g.tokens for g in gens if g.tokens) / len(gens)
                if gens else None),
            "api_alignment.nonfinite": float(self.nonfinite),
        }


def _nan_max(values: list[float]) -> float | None:
    if not values:
        return None
    return math.nan if any(math.isnan(v) for v in values) else max(values)


def _exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def _rel(x: float, ref: float) -> float:
    if math.isnan(x) or math.isnan(ref) or not ref:
        return math.nan
    return math.inf if math.isinf(x) else abs(x - ref) / ref


def _is_moe(config) -> bool:
    return any((getattr(config, key, None) or 0) > 1 for key in (
        "num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"))


def run(config: Config, inputs: StageInputs) -> Result:
    laps = Laps()
    lap = laps.lap

    target = inputs.target
    if inputs.endpoint is None or target.engine is None:
        raise ConfigError("api_alignment needs an engine target and its endpoint",
                          field="target.engine", fix="run it on a target of kind: engine "
                          "(the flow attaches or launches the engine)")
    progress.plan({"models": 1, "windows": 6, "generation": 2})
    tolerances = load_tolerances(config.tolerance_file).control
    source = local_checkpoint(inputs.source, log=print)
    notes: list[str] = []
    client = EngineClient.of(inputs.endpoint, timeout_s=target.engine.request_timeout_s)
    engine = Engine(client, inputs.endpoint.served_name)
    try:
        mml, seq_len = _served_lengths(config, engine, target, source, notes)
        text_path = resolve_text_file(config.text_file, source)
        tokenizer = load_tokenizer(source, inputs.trust_remote_code)
        ref, ctl = load_sides(source, inputs)
        lap("load")
        ids = tokenize(tokenizer, read_text(text_path), getattr(ref.model.config, "vocab_size",
                                                                 None))
        prefix = prefix_token(tokenizer)
        wins, text_notes = windows(ids, seq_len, config.max_windows, prefix,
                                   config.context_tokens)
        notes += text_notes
        k, capped = engine.cap_top_k(config.top_k, wins[0].ids)
        notes += [capped] if capped else []
        measures, nonfinite = _measure_windows(config, wins, engine, ref, ctl, k)
        lap("windows")
        moe = _is_moe(ref.model.config)
        if moe:
            notes.append(_expert_note(engine))
        summary = _summarize(measures, tolerances, seq_len,
                             min(config.position_buckets, seq_len))
        gen_rows = _generation(config, ids, prefix, tokenizer, ref, ctl, engine, k)
        lap("generation")
    finally:
        client.close()
    problems = ([f"the cpu/float32 reference produced {measures.reference_nonfinite} non-finite "
                 "log-probabilities"] if measures.reference_nonfinite else [])
    return Result(
        **EngineVsControl.sides(inputs, engine.fingerprint), text_file=str(text_path), text_tokens=len(ids), max_model_len=mml, seq_len=seq_len,
        prefix_token=prefix, context_tokens=wins[0].score_from, windows=len(wins), top_k=k,
        generation=gen_rows, moe=moe,
        nonfinite=nonfinite + sum(r.nonfinite for r in gen_rows), notes=notes,
        timings=laps.timings,
        checkpoint_problems=problems, **summary)


def _served_lengths(config: Config, engine: Engine, target, source: str,
                    notes: list[str]) -> tuple[int, int]:
    """(the engine's max_model_len, the window length): a prompt leaves room for the one
    generated token."""
    mml = max_model_len(target.engine, source)
    reported = engine.reported_max_model_len()
    if reported is not None and reported != mml:
        notes.append(f"the engine serves max_model_len {reported}; the target's settings "
                     f"(capped at the trained context) give {mml}: using {min(reported, mml)}")
        mml = min(reported, mml)
    seq_len = min(config.seq_len or mml - 1, mml - 1)
    if config.seq_len and config.seq_len > seq_len:
        notes.append(f"seq_len {config.seq_len} lowered to {seq_len} (max_model_len - 1)")
    return mml, seq_len


def _measure_windows(config: Config, wins, engine: Engine, ref: Side, ctl: Side,
                     k: int) -> tuple[Measures, int]:
    """(every scored position's measures, NaN/inf logprobs the engine returned): each window
    through the engine's API and, chunk by chunk, through the reference and the control."""
    measures, nonfinite = Measures(), 0
    for w, window in enumerate(wins):
        answer = engine.window(window.ids, k)
        nonfinite += answer.nonfinite
        control = None if ctl is ref else ctl.logits(window.ids, config.chunk_tokens)
        for start, logits_r in ref.logits(window.ids, config.chunk_tokens):
            logits_c = logits_r if control is None else next(control)[1]
            measures.add(w, window.ids, window.score_from, start, logits_r, logits_c,
                         answer, k)
        progress.update("windows", w + 1, len(wins),
                        detail=f"window {w + 1}: {len(window.ids)} positions")
    return measures, nonfinite


def _expert_note(engine: Engine) -> str:
    return "expert agreement not measured: " + (
        "the engine returned routed experts, which this stage does not compare yet"
        if engine.routed_experts else
        "the engine returned no routed experts (vLLM 0.32 returns them only with "
        "--enable-return-routed-experts, which needs its Model Runner V2 and Triton: "
        "not available in vLLM for CPU)")


def _summarize(m: Measures, control, span: int, n_buckets: int) -> dict:
    """Absolute statistics per side and the paired engine-vs-control comparisons."""
    if not len(m):
        raise ConfigError("no scored positions: the windows are shorter than context_tokens + 2",
                          field="context_tokens", fix="lower context_tokens or raise seq_len")
    col = m.column
    bucket_of = bucket_index(col("position"), span, n_buckets)
    blocks = Blocks.build(col("window"), bucket_of, control.block_size)
    kl_e, kl_c = col("kl_e"), col("kl_c")
    top1_e, top1_c = col("top1_e").bool(), col("top1_c").bool()
    nll_r, nll_e, nll_c = col("nll_r"), col("nll_e"), col("nll_c")
    comparisons = ratios(["kl_topk"], kl_e, kl_c, blocks, control.floors.kl)
    comparisons += ratios(["top1_disagreement"], (~top1_e).double(), (~top1_c).double(),
                          blocks, control.floors.top1_disagreement)
    comparisons.append(mean_excess("perplexity", nll_e, nll_c, blocks))
    buckets = []
    for b, (start, end) in enumerate(bucket_bounds(span, n_buckets)):
        mask = bucket_of == b
        count = int(mask.sum())
        cmp = ratios([f"kl_topk bucket {b}"], kl_e, kl_c, blocks, control.floors.kl,
                     blocks.bucket_of_block == b)[0] if count else None
        buckets.append(BucketRow(
            bucket=b, start=start, end=end, positions=count,
            kl_topk_mean=kl_e[mask].mean().item() if count else None,
            control_kl_topk_mean=kl_c[mask].mean().item() if count else None,
            kl_topk_ratio=cmp.ratio if cmp else None,
            kl_topk_ratio_low=cmp.low if cmp else None,
            top1_agreement=top1_e[mask].double().mean().item() if count else None,
            control_top1_agreement=top1_c[mask].double().mean().item() if count else None))
    ppl = {k: _exp(v.mean().item()) for k, v in (("r", nll_r), ("e", nll_e), ("c", nll_c))}
    return dict(
        positions=len(m), kl_topk_mean=kl_e.mean().item(),
        kl_topk_p99=torch.quantile(kl_e, 0.99).item(), kl_topk_max=kl_e.max().item(),
        control_kl_topk_mean=kl_c.mean().item(),
        control_kl_topk_p99=torch.quantile(kl_c, 0.99).item(),
        topk_reference_mass=col("mass_e").mean().item(),
        top1_agreement=top1_e.double().mean().item(),
        control_top1_agreement=top1_c.double().mean().item(),
        perplexity_reference=ppl["r"], perplexity_engine=ppl["e"], perplexity_control=ppl["c"],
        perplexity_rel_delta=_rel(ppl["e"], ppl["r"]),
        control_perplexity_rel_delta=_rel(ppl["c"], ppl["r"]),
        nll_abs_diff_mean=(nll_e - nll_r).abs().mean().item(), comparisons=comparisons,
        buckets=buckets)


def _generation(config: Config, ids, prefix, tokenizer, ref: Side, ctl: Side, engine: Engine,
                k: int) -> list[GenerationRow]:
    if not config.generation_prompts:
        return []
    chosen = prompts(ids, config.generation_prompts, config.prompt_tokens)
    head = [prefix] if prefix is not None else []
    batch = [head + p for _, p in chosen]
    what = f"{len(batch)} prompts x {config.new_tokens} tokens"
    progress.update("generation", 0, 3, detail=f"{what}: engine")
    gens = engine.greedy(batch, config.new_tokens, k)
    progress.update("generation", 1, 3, detail=f"{what}: reference")
    refs = ref.greedy(batch, config.new_tokens, k)
    progress.update("generation", 2, 3, detail=f"{what}: control")
    ctls = refs if ctl is ref else ctl.greedy(batch, config.new_tokens, k)
    progress.update("generation", 3, 3, detail=f"{what}: done")
    rows = []
    for (start, prompt), r, c, g in zip(chosen, refs, ctls, gens):
        got = compare_greedy(r, g.steps)
        control = compare_greedy(r, c)
        rows.append(GenerationRow(
            prompt_start=start, prompt_tokens=len(prompt), tokens=got.tokens, close=got.close,
            first_difference=got.first_difference, matched_prefix=got.matched_prefix,
            max_logprob_diff=got.max_logprob_diff, why=got.why, control_close=control.close,
            control_first_difference=control.first_difference,
            reference_text=tokenizer.decode([t for t, _ in r]),
            engine_text=tokenizer.decode([t for t, _ in g.steps]), nonfinite=g.nonfinite))
    return rows


__all__ = ["Config", "Result", "run"]
