"""The soak's fixed checks: greedy probes (before and after: must not change) and the context
boundaries (at the limit, one token below, one above: a clean refusal; the longest output)."""

from __future__ import annotations

from day0.engines.client import EngineClient, EngineUnreachable
from day0.stages.soak.result import Boundary, Probe


def probe_prompts(tokenizer, count: int, length: int = 24) -> list[list[int]]:
    """Token-id prompts cut from day0's evaluation text (the same for every run)."""
    from day0 import DATA_DIR

    ids = tokenizer((DATA_DIR / "eval_text.txt").read_text(), add_special_tokens=False)["input_ids"]
    step = max(1, (len(ids) - length) // max(1, count))
    return [ids[i * step:i * step + length] for i in range(count)]


def generate(client: EngineClient, served: str, prompts: list[list[int]],
             max_tokens: int) -> list[str | None]:
    """Greedy continuations, one request at a time (None: the request failed)."""
    out = []
    for prompt in prompts:
        status, answer = client.send("POST", "/v1/completions", {
            "model": served, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True})
        try:
            out.append(answer["choices"][0]["text"] if status == 200 else None)
        except (KeyError, IndexError, TypeError):
            out.append(None)
    return out


def compare_probes(before: list[str | None], after: list[str | None]) -> list[Probe]:
    return [Probe(index=i, before=b, after=a, changed=(b != a or b is None))
            for i, (b, a) in enumerate(zip(before, after))]


def boundaries(client: EngineClient, served: str, context: int, token: int) -> list[Boundary]:
    """Requests around the engine's context (prompt + max_tokens = context, context - 1,
    context + 1) and the longest output; each must end as expected with the engine healthy."""
    cases = [("at the context limit", context - 1, 1, "ok"),
             ("one token below", context - 2, 1, "ok"),
             ("one token above", context, 1, "refused"),
             ("longest output", 8, context - 8, "ok")]
    rows = []
    for name, prompt_len, max_tokens, expect in cases:
        if prompt_len < 1 or max_tokens < 1:
            continue
        body = {"model": served, "prompt": [token] * prompt_len, "max_tokens": max_tokens,
                "temperature": 0, "ignore_eos": True}
        try:
            status, answer = client.send("POST", "/v1/completions", body)
        except EngineUnreachable as exc:
            rows.append(Boundary(name=name, prompt_tokens=prompt_len, max_tokens=max_tokens,
                                 expect=expect, status=None, passed=False,
                                 healthy_after=client.healthy(), detail=str(exc)[:200]))
            continue
        detail = ""
        if expect == "refused":
            passed = 400 <= status < 500
            detail = "" if passed else f"expected a 4xx refusal, got HTTP {status}"
        else:
            usage = (answer.get("usage") or {}) if isinstance(answer, dict) else {}
            got = usage.get("completion_tokens")
            passed = status == 200 and got == max_tokens
            detail = "" if passed else f"HTTP {status}, {got} of {max_tokens} tokens"
        healthy = client.healthy()
        rows.append(Boundary(name=name, prompt_tokens=prompt_len, max_tokens=max_tokens,
                             expect=expect, status=status, passed=passed and healthy,
                             healthy_after=healthy,
                             detail=detail or ("" if healthy else "engine unhealthy after it")))
    return rows
