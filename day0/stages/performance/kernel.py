"""Device (in-process PyTorch) targets: the workloads as a kernel-level profile.

Per workload, its median prompt and output lengths (the same seeded trace an engine run
replays, sized for the model's context), at each batch size (1 and 8 by default): the prefill
(one forward over batch x prompt tokens) and the decode (one token per sequence per step from the
prefill's KV cache, greedy), ``kernel_repeats`` times after one unmeasured warm-up. Figures:
prefill tokens/s and decode ms per token (a step's time: every sequence of the batch gets one
token per step).

Each repeat is recorded like a request of a load run (ttft_ms = the prefill, e2el_ms = prefill
+ decode, output_tokens = steps + 1), so baselines, promotion and the bootstrap comparison are
the engine runs' own: TTFT's slowdown is the prefill's, TPOT's the decode's.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from typing import Callable

from day0.checkpoint.configview import trained_context
from day0.execution import progress
from day0.execution.contract import StageInputs
from day0.engines import workloads as wl
from day0.errors import TargetFault
from day0.stages.performance.compare import quantile
from day0.stages.performance.result import Config, Request, RunRow
from day0.torchkit.kvcache import cache_argument

DEFINITIONS = ("day0's kernel profile (in-process PyTorch): prefill = one forward over batch x "
               "prompt tokens; decode = one greedy step per token from the prefill's KV cache; "
               "prefill tokens/s = batch x prompt / prefill time; decode ms/token = a step's "
               "time; medians over repeats after a warm-up")


def key(name: str, batch: int, prompt: int, steps: int, context: int) -> str:
    material = {"kernel": name, "batch": batch, "prompt": prompt, "steps": steps,
                "context": context}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:24]


def lengths(config: Config, file: wl.WorkloadFile, names: list[str], context: int,
            notes: list[str]) -> list[tuple[str, int, int, int]]:
    """(workload, batch, prompt tokens, decode steps) per measurement, within the context and
    kernel_max_tokens (noted when a prompt is cut)."""
    plan = []
    for name in names:
        trace = wl.trace_for(name, file.workloads[name], context=context, seed=config.seed)
        prompt = int(statistics.median(e.input_length for e in trace))
        steps = max(1, min(int(statistics.median(e.output_length for e in trace)),
                           config.kernel_decode_steps))
        prompt = max(1, min(prompt, context - steps))
        for batch in config.kernel_batches:
            fits = max(1, min(prompt, config.kernel_max_tokens // batch))
            if fits < prompt:
                notes.append(f"{name}-b{batch}: prompts of {fits} tokens instead of {prompt} "
                             f"(kernel_max_tokens {config.kernel_max_tokens} per forward)")
            plan.append((name, batch, fits, steps))
    return plan


def prepare(config: Config, inputs: StageInputs, file: wl.WorkloadFile, names: list[str],
            notes: list[str]) -> tuple[Callable, int]:
    """Load the target (its plugins applied); (measure, context): measure(run_ids=None) gives
    the rows and per-repeat records of every (workload, batch), or of the runs named."""
    import torch

    from day0.checkpoint.modeling import load_pretrained
    from day0.execution.plugins import apply_plugins
    from day0.store.sources import local_checkpoint

    target = inputs.target
    source = local_checkpoint(inputs.source, log=print)
    model = load_pretrained(source, device=target.device, dtype=target.dtype,
                            trust_remote_code=inputs.trust_remote_code)
    apply_plugins(model, target.plugins)
    context = int(trained_context(model.config) or 2048)
    vocab = int(getattr(model.config, "vocab_size", 0) or 2)
    plan = lengths(config, file, names, context, notes)
    sync = (torch.accelerator.synchronize if target.device != "cpu"
            and hasattr(torch, "accelerator") else (lambda: None))
    done, total = [0], [0]
    cache_name = cache_argument(model)  # transformers 5.x: `cache`; earlier: past_key_values
    progress.plan({"measurements": 1})

    def measure(run_ids: list[str] | None = None) -> tuple[list[RunRow], list[Request]]:
        todo = [p for p in plan if run_ids is None or f"{p[0]}-b{p[1]}" in run_ids]
        total[0] += len(todo)
        rows, records = [], []
        for name, batch, prompt, steps in todo:
            run_id = f"{name}-b{batch}"
            # the same token ids on every measurement of this run
            generator = torch.Generator().manual_seed(config.seed + plan.index(
                (name, batch, prompt, steps)))
            ids = torch.randint(3, max(4, vocab), (batch, prompt), generator=generator)
            ids = ids.to(target.device)
            timings = []
            for repeat in range(config.kernel_repeats + 1):
                prefill_ms, total_ms = _once(model, ids, steps, sync, target, cache_name)
                if repeat:  # the first is the warm-up
                    timings.append((prefill_ms, total_ms))
            done[0] += 1
            progress.update("measurements", done[0], total[0], detail=run_id)
            records += [Request(run=run_id, index=r, input_tokens=prompt,
                                output_tokens=steps + 1, ttft_ms=round(p, 3),
                                e2el_ms=round(t, 3)) for r, (p, t) in enumerate(timings)]
            rows.append(_row(run_id, name, batch, prompt, steps, timings, context))
        return rows, records

    return measure, context


def _once(model, ids, steps: int, sync, target, name: str) -> tuple[float, float]:
    """(prefill ms, prefill + decode ms) of one batch; a raising forward is the target's
    fault."""
    import torch

    try:
        with torch.inference_mode():
            started = time.perf_counter()
            out = model(input_ids=ids, use_cache=True)
            nxt = out.logits[:, -1:].argmax(-1)
            sync()
            prefilled = time.perf_counter()
            past = getattr(out, name)
            for _ in range(steps):
                out = model(input_ids=nxt, use_cache=True, **{name: past})
                past, nxt = getattr(out, name), out.logits[:, -1:].argmax(-1)
            sync()
            done = time.perf_counter()
    except Exception as exc:
        raise TargetFault(f"target forward raised {type(exc).__name__}: {exc}",
                          field="target.plugins" if target.plugins else "target",
                          fix="fix the target's kernels/plugins (the kernel profile's prefill "
                              "and decode)") from exc
    return (prefilled - started) * 1000, (done - started) * 1000


def _row(run_id: str, name: str, batch: int, prompt: int, steps: int,
         timings: list[tuple[float, float]], context: int) -> RunRow:
    prefill = [p for p, _ in timings]
    decode = [(t - p) / steps for p, t in timings]
    row = RunRow(run=run_id, workload=name, level=f"b{batch}", requests=len(timings),
                 completed=len(timings), batch=batch, prompt_tokens=prompt, decode_steps=steps,
                 duration_s=round(sum(t for _, t in timings) / 1000, 3),
                 prefill_tokens_per_s=batch * prompt / (statistics.median(prefill) / 1000),
                 decode_ms_per_token=statistics.median(decode),
                 baseline_key=key(name, batch, prompt, steps, context))
    row.output_throughput = batch / (row.decode_ms_per_token / 1000)
    for q, label in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
        setattr(row, f"ttft_{label}_ms", quantile(prefill, q))
        setattr(row, f"tpot_{label}_ms", quantile(decode, q))
        setattr(row, f"e2el_{label}_ms", quantile([t for _, t in timings], q))
    return row
