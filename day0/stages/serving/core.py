"""The serving stage's core: the plain configuration's prompt set, then batching and each
variant, compared. What it proves and needs: the face, __init__.py.
"""

from __future__ import annotations

import time

from pydantic import BaseModel, ConfigDict, Field

from day0.execution import progress
from day0.execution.contract import StageInputs, StageResult
from day0.engines.client import EngineClient
from day0.errors import ConfigError, InputError
from day0.stages.serving.compare import Agreement, agreement, worst
from day0.stages.serving.runs import generate, generate_concurrently
from day0.stages.serving.prompts import PromptPlan, build
from day0.stages.serving.report import findings, markdown
from day0.stages.serving.variants import VariantRow, check


class Config(BaseModel):
    """Settings of the serving stage."""

    model_config = ConfigDict(extra="forbid")

    prompts: int = Field(8, ge=1, le=64, description="Prompts in the set.")
    new_tokens: int = Field(16, ge=1, le=512, description="Greedy tokens generated per prompt.")
    top_k: int = Field(5, ge=1, le=20, description=(
        "Logprobs per step (the engine's --max-logprobs must allow it); a token that parts "
        "from the baseline must be in the other side's top-k to count as a near tie."))
    min_prompt_tokens: int = Field(144, ge=2, description=(
        "Shortest prompt (tokens); lengths are spread evenly up to max_prompt_tokens, both "
        "capped so prompt + new_tokens fits the engine's context."))
    max_prompt_tokens: int = Field(240, ge=2, description="Longest prompt (tokens).")
    shared_prefix_tokens: int = Field(136, ge=0, description=(
        "Tokens every prompt starts with, so prompts hit each other's cached prefix (above "
        "128, vLLM for CPU's KV block size: only whole blocks are cached)."))
    logprob_tolerance: float = Field(0.05, gt=0, description=(
        "Largest |Δlogprob| (nats) of a matched token between a run and the baseline. A "
        "serving feature may reorder bf16 arithmetic (batch shapes, chunk boundaries, cached "
        "blocks), which moves logprobs by less than running the whole model in float32 instead "
        "of bf16 (0.022 on the fixture; batching 0.001, prefix caching and a 64-token chunked "
        "prefill 0); it must not lose information (fp8 KV cache: 0.28)."))
    concurrency: int = Field(16, ge=2, le=256, description=(
        "Simultaneous requests of the batching check (the prompt set padded with other "
        "prompts up to this many)."))
    variants: list[str] | None = Field(None, description=(
        "The engine variants to check (names of engine.variants); None: all of them, [] none."))
    text_file: str | None = Field(None, description=(
        "Text the prompts are cut from; default heldout.txt next to the checkpoint, else the "
        "built-in evaluation text."))


class Batching(BaseModel):
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")

    concurrency: int = Field(description="Requests sent at once.")
    padding: int = Field(description="Of them, extra prompts (not compared).")
    max_in_flight: int = Field(description="Most requests in flight at one time (client side).")
    wall_s: float = Field(description="Seconds the concurrent requests took.")
    agreement: Agreement = Field(description="Each prompt in the batch vs alone.")
    passed: bool = Field(description="Close, within tolerance, and requests really overlapped.")
    reasons: list[str] = Field(default_factory=list, description="Why it failed.")


class Result(StageResult):
    """Evidence of the serving stage."""

    served_name: str = Field(description="Model name the requests named.")
    plan: PromptPlan = Field(description="The prompt set.")
    tolerance: float = Field(description="logprob_tolerance used.")
    top_k: int = Field(description="Logprobs per step.")
    repeat: Agreement = Field(description="The baseline run again vs itself (engine noise).")
    batching: Batching
    variants: list[VariantRow] = Field(description="One row per variant checked.")
    declared_variants: list[str] = Field(description="engine.variants of the target.")
    notes: list[str] = Field(default_factory=list, description="What was and was not checked.")
    wall_s: float = Field(description="Seconds the stage took.")

    def metrics(self) -> dict[str, float | None]:
        rows = self.variants
        prefix = [r.prefix_cache_hits for r in rows if "prefix-caching" in r.features]
        return {
            "serving.variants": float(len(rows)),
            "serving.variants_failed": float(sum(not r.passed for r in rows)),
            "serving.variants_not_close": float(sum(r.not_close > 0 for r in rows)),
            "serving.variants_over_tolerance": float(sum(any(a.over_tolerance for a in r.passes)
                                                         for r in rows)),
            "serving.variants_vacuous": float(sum(r.vacuous for r in rows)),
            "serving.max_logprob_diff": worst(r.max_logprob_diff for r in rows) if rows else None,
            "serving.prefix_cache_hits": (None if not prefix else
                                          min(-1.0 if h is None else h for h in prefix)),
            "serving.batching.failed": 0.0 if self.batching.passed else 1.0,
            "serving.batching.not_close": float(self.batching.agreement.not_close),
            "serving.batching.max_logprob_diff": self.batching.agreement.max_logprob_diff,
            "serving.repeat_max_logprob_diff": self.repeat.max_logprob_diff,
        }


def _selected(config: Config, declared: dict[str, list[str]]) -> dict[str, list[str]]:
    if config.variants is None:
        return dict(declared)
    unknown = [n for n in config.variants if n not in declared]
    if unknown:
        raise ConfigError(f"variant(s) {', '.join(unknown)} not declared by the target",
                          field="variants", fix=f"use some of: {', '.join(declared) or '(none)'}")
    return {n: declared[n] for n in config.variants}


def run(config: Config, inputs: StageInputs) -> Result:
    from day0.engines.process import launched, max_model_len
    from day0.store.sources import local_checkpoint

    started = time.monotonic()
    settings, endpoint = inputs.target.engine, inputs.endpoint
    if settings is None or endpoint is None:
        raise InputError("the serving stage needs an engine target and its running plain "
                         "configuration (inputs.endpoint)", field="target",
                         fix="run it on a kind: engine target")
    selected = _selected(config, settings.variants)
    model_dir = local_checkpoint(inputs.source, log=print)
    context = max_model_len(settings, model_dir)
    padding = max(0, config.concurrency - config.prompts)
    prompt_set, pads, plan = build(model_dir, config.text_file, count=config.prompts,
                                   min_tokens=config.min_prompt_tokens,
                                   max_tokens=config.max_prompt_tokens,
                                   shared_prefix=config.shared_prefix_tokens, context=context,
                                   new_tokens=config.new_tokens, padding=padding,
                                   trust_remote_code=inputs.trust_remote_code)
    prompts = [p.ids for p in prompt_set]
    tol, k, n = config.logprob_tolerance, config.top_k, config.new_tokens
    print(f"[serving] {plan.count} prompts of {plan.shortest}-{plan.longest} tokens sharing "
          f"{plan.shared_prefix}, {n} new tokens, top-{k}, tolerance {tol:g}")
    total = 2 + len(selected)
    progress.update("checks", 0, total, detail="baseline on the plain configuration")
    with EngineClient.of(endpoint, timeout_s=settings.request_timeout_s) as client:
        baseline = generate(client, endpoint.served_name, prompts, n, k)
        repeat = agreement("repeat", baseline, generate(client, endpoint.served_name, prompts,
                                                        n, k), tol)
        progress.update("checks", 1, total, detail=f"batching ({config.concurrency} at once)")
        batch_started = time.monotonic()
        batched, in_flight = generate_concurrently(
            client, endpoint.served_name, prompts + [p.ids for p in pads], n, k)
        batch_wall = time.monotonic() - batch_started
    together = agreement("batching", baseline, batched[:len(prompts)], tol)
    reasons = together.problems(tol)
    if in_flight < 2:
        reasons.append(f"vacuous: at most {in_flight} request in flight at once; nothing was "
                       "batched")
    batching = Batching(concurrency=len(batched), padding=len(pads), max_in_flight=in_flight,
                        wall_s=round(batch_wall, 3), agreement=together, passed=not reasons,
                        reasons=reasons)
    print(f"[serving] batching: {len(batched)} at once (max {in_flight} in flight), "
          f"{together.not_close} not close, max |Δlogprob| {together.max_logprob_diff:.4g}")
    notes: list[str] = []
    if not settings.variants:
        notes.append("the target declares no engine.variants: only batching was checked")
    elif not selected:
        notes.append("no variant selected (config.variants is empty): only batching was checked")
    rows: list[VariantRow] = []
    for number, (name, args) in enumerate(selected.items()):
        progress.update("checks", 2 + number, total, detail=f"variant {name}")
        with launched(settings, model_dir, inputs.target.dtype, log=print, extra_args=args,
                      name=name) as engine:
            with EngineClient.of(engine.endpoint, timeout_s=settings.request_timeout_s) as client:
                rows.append(check(name, args, client, engine.endpoint.served_name, prompts,
                                  baseline, new_tokens=n, top_k=k, tolerance=tol,
                                  cache_metric=settings.prefix_cache_metric,
                                  ready_s=engine.endpoint.ready_s))
        print(f"[serving] variant {name}: {'PASS' if rows[-1].passed else 'FAIL'}"
              + "".join(f"\n  {r}" for r in rows[-1].reasons))
    progress.update("checks", total, total, detail="done")
    return Result(served_name=endpoint.served_name, plan=plan, tolerance=tol, top_k=k,
                  repeat=repeat, batching=batching, variants=rows,
                  declared_variants=list(settings.variants), notes=notes,
                  wall_s=round(time.monotonic() - started, 3))
