"""Limits and load: an over-long prompt gets a clean 4xx and leaves the engine healthy; N
concurrent requests all succeed.

An engine that drops the connection or stops answering (EngineUnreachable) is not a failed
check: it propagates and the stage ends ERROR, with the client's message saying what happened.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from day0.engines.client import EngineClient
from day0.stages.smoke.checks import CheckFailure, Session
from day0.stages.smoke.parity import short
from day0.stages.smoke.result import Concurrency, Overlong

FILLER = " hello"  # about one token per repeat in byte-level BPE vocabularies


def overlong_prompt(tokenizer, limit: int, margin: int) -> tuple[str, int]:
    """A prompt of at least limit + margin checkpoint tokens, and not many more (the engine
    counts the same way, or the tokenizer parity check says otherwise): short in characters,
    so the engine really tokenizes it instead of refusing it by its length in characters."""
    want = limit + margin

    def count(repeats: int) -> int:
        text = "Count:" + FILLER * repeats
        return len(tokenizer(text, add_special_tokens=True, verbose=False)["input_ids"])

    per = max(count(16) - count(0), 1) / 16  # tokens per repeat
    repeats = max(int((want - count(0)) / per), 1)
    while count(repeats) < want:
        repeats += 1
    return "Count:" + FILLER * repeats, count(repeats)


def overlong_check(s: Session, limit: int) -> Overlong:
    text, count = overlong_prompt(s.tokenizer, limit, s.config.overlong_margin)
    status, answer = s.client.send("POST", "/v1/completions",
                                   {"model": s.served, "prompt": text, "max_tokens": 1,
                                    "temperature": 0})
    message = answer if isinstance(answer, str) else str(answer)
    clean = 400 <= status < 500
    s.add("overlong.rejected", "overlong", clean,
          f"{count} tokens > max_model_len {limit}: HTTP {status}"
          + ("" if clean else f" (expected a 4xx): {short(message)}"))
    healthy, why = True, "GET /v1/models and a short completion answered afterwards"
    try:
        if not s.client.healthy():
            healthy, why = False, "GET /v1/models did not answer 200 afterwards"
        else:
            after = s.client.completion({"model": s.served, "prompt": "Hello", "max_tokens": 2,
                                         "temperature": 0})
            if not isinstance((after["choices"] or [{}])[0].get("text"), str):
                healthy, why = False, "a short completion afterwards returned no text"
    except CheckFailure as exc:
        healthy, why = False, f"a short completion afterwards failed: {short(str(exc))}"
    s.add("overlong.healthy_after", "overlong", healthy, why)
    return Overlong(max_model_len=limit, prompt_tokens=count, status=status,
                    answer=message[:300], healthy_after=healthy)


def concurrency_check(s: Session, endpoint, timeout_s: float) -> Concurrency:
    """config.concurrency completions at once (threads, one client each bounded by timeout_s);
    each must answer 200 with text and a finish_reason."""
    n, prompts = s.config.concurrency, s.config.prompts
    errors: list[str] = []
    client = EngineClient.of(endpoint, timeout_s=timeout_s)  # httpx: safe across threads

    def one(index: int) -> str | None:
        body = {"model": s.served, "prompt": prompts[index % len(prompts)],
                "max_tokens": s.config.concurrent_max_tokens, "temperature": 0}
        try:
            choice = (client.completion(body)["choices"] or [{}])[0]
        except CheckFailure as exc:
            return f"request {index}: {short(str(exc))}"
        if not isinstance(choice.get("text"), str) or choice.get("finish_reason") not in (
                "length", "stop"):
            return f"request {index}: no text or finish_reason in {str(choice)[:120]}"
        return None

    started = time.monotonic()
    try:
        with ThreadPoolExecutor(max_workers=n, thread_name_prefix="smoke-concurrent") as pool:
            futures = [pool.submit(one, i) for i in range(n)]
            for future in futures:
                # EngineUnreachable (a dropped connection, a timeout) propagates: ERROR
                if (error := future.result()) is not None:
                    errors.append(error)
    finally:
        client.close()
    seconds = time.monotonic() - started
    s.add("concurrency", "concurrency", not errors,
          f"{n - len(errors)}/{n} concurrent requests succeeded in {seconds:.1f} s"
          + (f"; {errors[0]}" if errors else ""))
    return Concurrency(requests=n, failed=len(errors), seconds=round(seconds, 3), errors=errors)


__all__ = ["overlong_prompt", "overlong_check", "concurrency_check"]
