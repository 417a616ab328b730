"""Greedy generations over the prompt set, alone or all at once, and the engine's counters.

One request per prompt: /v1/completions with the prompt as token ids, temperature 0,
``max_tokens`` new tokens whatever the model says (``ignore_eos``), the top-k log-probabilities
of every step, tokens named by id (vLLM's ``return_tokens_as_token_ids``: two tokens that
decode to the same text stay apart). An engine that ignores that flag answers with token
texts; they are compared as texts then (the same on both sides of a comparison).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from day0.engines.client import EngineClient, EngineHTTPError, EngineProtocolError, counter, parse_metrics
from day0.engines.greedy import Step

_ID_PREFIX = "token_id:"


def body(served: str, ids: list[int], new_tokens: int, top_k: int) -> dict:
    return {"model": served, "prompt": ids, "max_tokens": new_tokens, "temperature": 0.0,
            "logprobs": top_k, "ignore_eos": True, "return_tokens_as_token_ids": True, "n": 1}


def _token(key):
    if isinstance(key, str) and key.startswith(_ID_PREFIX):
        try:
            return int(key[len(_ID_PREFIX):])
        except ValueError:
            return key
    return key


def steps_of(answer: dict, expected: int | None = None) -> list[Step]:
    """The (token, top-k {token: logprob}) steps of a completion answer; the chosen token's
    own logprob is part of its step's top (vLLM lists it there when it is outside the top-k)."""
    try:
        choice = answer["choices"][0]
        logprobs = choice["logprobs"]
        tokens, chosen, tops = (logprobs["tokens"], logprobs["token_logprobs"],
                                logprobs["top_logprobs"])
    except (KeyError, IndexError, TypeError):
        raise EngineProtocolError("/v1/completions: the answer has no logprobs.tokens/"
                                  "token_logprobs/top_logprobs (does the engine return logprobs "
                                  f"for completions?): {str(answer)[:200]}") from None
    if not (len(tokens) == len(chosen) == len(tops)):
        raise EngineProtocolError(f"/v1/completions: {len(tokens)} tokens, {len(chosen)} "
                                  f"logprobs and {len(tops)} top-logprob lists")
    if expected is not None and len(tokens) != expected:
        raise EngineProtocolError(f"/v1/completions: {len(tokens)} tokens generated, "
                                  f"{expected} asked with ignore_eos (finish_reason "
                                  f"{choice.get('finish_reason')!r})")
    steps: list[Step] = []
    for token, logprob, top in zip(tokens, chosen, tops):
        table = {_token(k): float(v) for k, v in (top or {}).items()}
        token = _token(token)
        if logprob is not None:
            table.setdefault(token, float(logprob))
        steps.append((token, table))
    return steps


def generate(client: EngineClient, served: str, prompts: list[list[int]], new_tokens: int,
             top_k: int) -> list[list[Step]]:
    """Each prompt alone, one after the other."""
    return [steps_of(client.completion(body(served, ids, new_tokens, top_k)), new_tokens)
            for ids in prompts]


def generate_concurrently(client: EngineClient, served: str, prompts: list[list[int]],
                          new_tokens: int, top_k: int) -> tuple[list[list[Step]], int]:
    """All prompts at once (one thread each, released together); (steps per prompt, the most
    requests the client had in flight at one time)."""
    count = len(prompts)
    gate = threading.Barrier(count)
    spans: list[tuple[float, float]] = [(0.0, 0.0)] * count

    def one(index: int) -> list[Step]:
        gate.wait(timeout=60)
        started = time.monotonic()
        try:
            return steps_of(client.completion(body(served, prompts[index], new_tokens, top_k)),
                            new_tokens)
        finally:
            spans[index] = (started, time.monotonic())

    with ThreadPoolExecutor(max_workers=count, thread_name_prefix="serving-batch") as pool:
        futures = [pool.submit(one, i) for i in range(count)]
        results = [f.result() for f in futures]
    return results, max_in_flight(spans)


def max_in_flight(spans: list[tuple[float, float]]) -> int:
    """The most intervals (start, end) open at one time."""
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans],
                    key=lambda ev: (ev[0], ev[1]))
    current = best = 0
    for _, delta in events:
        current += delta
        best = max(best, current)
    return best


def scrape(client: EngineClient) -> str | None:
    """The engine's Prometheus text; None when it has no /metrics."""
    status, text = client.send("GET", "/metrics")
    if status == 404:
        return None
    if status >= 400 or not isinstance(text, str):
        raise EngineHTTPError(f"GET /metrics: HTTP {status}", status, str(text)[:300])
    return text


def settled(client: EngineClient, interval_s: float = 0.5, tries: int = 8) -> str | None:
    """/metrics once two reads in a row agree (counters are updated just after the answers)."""
    last = scrape(client)
    for _ in range(tries):
        time.sleep(interval_s)
        now = scrape(client)
        if now is None or _values(now) == _values(last):
            return now
        last = now
    return last


def _values(text: str | None) -> dict[str, float]:
    if text is None:
        return {}
    # created timestamps and gauges of time move by themselves: compare counters and histograms
    return {k: v for k, v in parse_metrics(text).items()
            if k.endswith(("_total", "_count", "_bucket", "_sum")) and not k.endswith("_seconds_sum")}


def counter_value(text: str | None, name: str) -> float | None:
    """A counter (total over its label sets) from Prometheus text; None when absent."""
    return None if text is None else counter(parse_metrics(text), name)


__all__ = ["body", "steps_of", "generate", "generate_concurrently", "max_in_flight", "scrape",
           "settled", "counter_value"]
