"""An engine through its OpenAI-compatible API: prompt logprobs of windows and greedy
continuations through /v1/completions with token ids in and out (no tokenizer of the engine's is
involved, so both sides see exactly the same tokens), and greedy chat answers through
/v1/chat/completions (the engine renders the prompt with its own chat template).

What vLLM returns (and what this module relies on):

* ``prompt_logprobs: k`` - per prompt position ``i >= 1`` a dict ``{token id: {logprob, rank,
  decoded_token}}`` holding the engine's ``k`` most likely tokens given ``ids[:i]`` plus the
  actual token ``ids[i]`` with its rank (position 0 is null); ``rank`` counts the tokens with a
  strictly larger logprob, plus one, for the actual token, but the top-k are numbered 1..k in
  order, so tied tokens get different ranks (rank-1 ties are read from the logprobs).
* ``logprobs: k`` with ``return_tokens_as_token_ids`` - per generated token the top-k as
  ``{"token_id:<id>": logprob}``; ``return_token_ids`` gives the generated (and prompt) ids.
* ``max_logprobs`` caps ``k`` server-side: a larger request is a 400 that says "max allowed: N".
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from pydantic import ConfigDict, Field

from day0.engines.client import EngineClient, EngineHTTPError, EngineProtocolError
from day0.engines.greedy import Step
from day0.errors import TargetFault
from day0.execution.contract import StageResult

MAX_ALLOWED = re.compile(r"max allowed:?\s*(\d+)", re.IGNORECASE)
TOKEN_ID = re.compile(r"^token_id:(-?\d+)$")


@dataclass
class WindowLogprobs:
    """The engine's answer for one window, per position p = 0..n-2 (predicting ids[p + 1])."""

    actual: list[float]                       # logprob of ids[p + 1]
    top: list[dict[int, float]]               # S_p: tokens returned with rank <= k -> logprob
    rank1: list[set[int]] = field(default_factory=list)  # tokens at the top logprob (ties)
    nonfinite: int = 0                         # NaN/inf logprobs among all returned values


@dataclass
class Generation:
    steps: list[Step]                          # (token id, {token id: logprob} top-k) per step
    nonfinite: int = 0


class EngineVsControl(StageResult):
    """Evidence of a stage that compares an engine, through its API, with the reference and the
    control in process: who the three sides are."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")

    target: str = Field(description="Target label.")
    engine: str = Field(description="Served model name and base URL of the engine.")
    engine_fingerprint: str | None = Field(None, description="The engine's system_fingerprint.")
    control: str = Field(description="What the control is: reference device, target dtype.")

    @staticmethod
    def sides(inputs, fingerprint: str | None) -> dict:
        """The four fields for a stage's inputs (day0.execution.contract.StageInputs)."""
        return dict(target=inputs.target.label, engine=f"{inputs.endpoint.served_name} at "
                    f"{inputs.endpoint.base_url}", engine_fingerprint=fingerprint,
                    control=f"{inputs.reference.device}/{inputs.target.dtype}, transformers, "
                    "no plugins")


class Engine:
    """One served model behind the completions API; every request names it."""

    def __init__(self, client: EngineClient, model: str):
        self.client, self.model = client, model
        self.fingerprint: str | None = None
        self.routed_experts = False   # the engine returned routing data (MoE, flag on)

    def reported_max_model_len(self) -> int | None:
        """max_model_len of the served model as /v1/models lists it (vLLM does), else None."""
        status, answer = self.client.send("GET", "/v1/models")
        if status >= 400 or not isinstance(answer, dict):
            return None
        for card in answer.get("data") or []:
            if isinstance(card, dict) and card.get("id") == self.model:
                value = card.get("max_model_len")
                return int(value) if isinstance(value, int) and value > 0 else None
        return None

    def cap_top_k(self, k: int, probe: list[int]) -> tuple[int, str | None]:
        """The k the engine accepts: k, or the 'max allowed' its 400 names (with a note)."""
        body = {"model": self.model, "prompt": probe[:2], "max_tokens": 1, "temperature": 0,
                "prompt_logprobs": k, "logprobs": k}
        status, answer = self.client.send("POST", "/v1/completions", body)
        if status < 400:
            return k, None
        text = answer if isinstance(answer, str) else str(answer)
        found = MAX_ALLOWED.search(text)
        if status == 400 and found and 0 < int(found.group(1)) < k:
            allowed = int(found.group(1))
            return allowed, (f"the engine allows at most {allowed} logprobs (its max_logprobs); "
                             f"top_k {k} lowered to {allowed}")
        raise EngineHTTPError(f"POST /v1/completions (prompt_logprobs={k}): HTTP {status}: "
                              f"{text[:300]}", status, text)

    def window(self, ids: list[int], k: int) -> WindowLogprobs:
        """Prompt logprobs of one window (one request; one token is generated and ignored)."""
        answer = self.client.completion({
            "model": self.model, "prompt": ids, "max_tokens": 1, "temperature": 0,
            "prompt_logprobs": k, "return_token_ids": True})
        self.fingerprint = answer.get("system_fingerprint") or self.fingerprint
        choice = _only_choice(answer)
        self.routed_experts = self.routed_experts or bool(choice.get("routed_experts"))
        return _prompt_logprobs(choice, ids, k)

    def score_and_continue(self, ids: list[int], new_tokens: int,
                           k: int) -> tuple[WindowLogprobs, Generation]:
        """One completions request: the prompt logprobs of ids (prefill) and its greedy
        continuation of exactly new_tokens (decode), top-k logprobs per generated step."""
        answer = self.client.completion({
            "model": self.model, "prompt": ids, "max_tokens": new_tokens, "temperature": 0,
            "ignore_eos": True, "prompt_logprobs": k, "logprobs": k,
            "return_tokens_as_token_ids": True, "return_token_ids": True})
        self.fingerprint = answer.get("system_fingerprint") or self.fingerprint
        choice = _only_choice(answer)
        return _prompt_logprobs(choice, ids, k), _generation(choice, 0)

    def chat_greedy(self, messages: list[dict], tools: list[dict] | None, new_tokens: int,
                    k: int) -> tuple[list[int] | None, Generation]:
        """(the prompt ids the engine rendered, when it returns them; its greedy answer) through
        /v1/chat/completions: the engine applies its own chat template. Only temperature 0,
        the length and the logprobs are set: every other sampling parameter is the engine's
        default, as a user's request gets it."""
        body = {"model": self.model, "messages": messages, "max_tokens": new_tokens,
                "temperature": 0, "ignore_eos": True, "logprobs": True, "top_logprobs": k,
                "return_tokens_as_token_ids": True, "return_token_ids": True}
        if tools:
            body |= {"tools": tools, "tool_choice": "none"}
        answer = self.client.chat(body)
        self.fingerprint = answer.get("system_fingerprint") or self.fingerprint
        choice = _only_choice(answer, "/v1/chat/completions")
        logprobs = choice.get("logprobs")
        if not isinstance(logprobs, dict) or not isinstance(logprobs.get("content"), list):
            raise EngineProtocolError("/v1/chat/completions: no logprobs.content (does the "
                                      "engine support logprobs with top_logprobs?)")
        steps, nonfinite = _chat_steps(logprobs["content"])
        ids = choice.get("token_ids")
        if ids is not None and [t for t, _ in steps] != list(ids):
            raise EngineProtocolError("/v1/chat/completions: logprobs tokens differ from "
                                      "token_ids")
        prompt = answer.get("prompt_token_ids") or choice.get("prompt_token_ids")
        return (list(prompt) if prompt is not None else None), Generation(steps, nonfinite)

    def greedy(self, prompts: list[list[int]], new_tokens: int, k: int) -> list[Generation]:
        """Greedy continuations (temperature 0) of each prompt, exactly new_tokens each: EOS
        does not stop them (ignore_eos), as the in-process sides do not stop either."""
        answer = self.client.completion({
            "model": self.model, "prompt": prompts, "max_tokens": new_tokens,
            "temperature": 0, "logprobs": k, "ignore_eos": True,
            "return_tokens_as_token_ids": True, "return_token_ids": True})
        self.fingerprint = answer.get("system_fingerprint") or self.fingerprint
        choices = sorted(answer["choices"],
                         key=lambda c: c.get("index", 0) if isinstance(c, dict) else 0)
        if len(choices) != len(prompts):
            raise EngineProtocolError(f"/v1/completions: {len(choices)} choices for "
                                      f"{len(prompts)} prompts")
        return [_generation(c, i) for i, c in enumerate(choices)]


def _prompt_logprobs(choice: dict, ids: list[int], k: int) -> WindowLogprobs:
    """The prompt_logprobs of a completions choice for the prompt ids, checked and parsed."""
    echoed = choice.get("prompt_token_ids")
    if echoed is not None and list(echoed) != list(ids):
        at = next((i for i, (a, b) in enumerate(zip(echoed, ids)) if a != b),
                  min(len(echoed), len(ids)))
        raise TargetFault(
            f"the engine changed the prompt: it ran {len(echoed)} tokens for the {len(ids)} "
            f"token ids sent (first difference at {at})",
            field="target.engine", fix="token-id prompts must reach the model unchanged "
            "(no BOS added, no truncation)")
    rows = choice.get("prompt_logprobs")
    if not isinstance(rows, list) or len(rows) != len(ids):
        raise EngineProtocolError(
            f"/v1/completions: prompt_logprobs has "
            f"{len(rows) if isinstance(rows, list) else repr(rows)[:40]} entries for a "
            f"{len(ids)}-token prompt (does the engine support prompt_logprobs?)")
    out = WindowLogprobs([], [])
    for i in range(1, len(ids)):
        entry = rows[i]
        if not isinstance(entry, dict) or not entry:
            raise EngineProtocolError(f"prompt_logprobs[{i}] is {str(entry)[:100]}")
        parsed: dict[int, tuple[float, object]] = {}
        for key, item in entry.items():
            try:
                parsed[int(key)] = (float(item["logprob"]), item.get("rank"))
            except (TypeError, ValueError, KeyError, AttributeError):
                raise EngineProtocolError(f"prompt_logprobs[{i}]: bad entry {key!r}: "
                                          f"{str(item)[:100]}") from None
        out.nonfinite += sum(not math.isfinite(lp) for lp, _ in parsed.values())
        actual = parsed[ids[i]][0] if ids[i] in parsed else None
        if all(isinstance(rank, int) for _, rank in parsed.values()):
            top = {t: lp for t, (lp, rank) in parsed.items() if rank <= k}
        else:  # no ranks: k entries are the top-k; k + 1 hold the actual token besides
            top = {t: lp for t, (lp, _) in parsed.items()
                   if len(parsed) <= k or t != ids[i]}
        if actual is None:
            raise EngineProtocolError(f"prompt_logprobs[{i}] lacks the prompt's own token "
                                      f"{ids[i]}")
        if not top:
            raise EngineProtocolError(f"prompt_logprobs[{i}] has no token of rank <= {k}")
        # ties: vLLM numbers its top-k 1..k in topk order, so equal logprobs get different
        # ranks; every token at the largest logprob is a rank-1 token
        best = max(top.values())
        rank1 = {t for t, v in top.items() if v == best}
        out.actual.append(actual)
        out.top.append(top)
        out.rank1.append(rank1)
    return out


def _chat_steps(content: list) -> tuple[list[Step], int]:
    """(token, top-k) per answer token of a chat answer's logprobs.content, and how many of the
    returned logprobs are not finite; a malformed item is the engine's protocol error."""
    steps, nonfinite = [], 0
    for at, item in enumerate(content):
        try:
            top = {_token(t["token"]): float(t["logprob"]) for t in item.get("top_logprobs") or []}
            steps.append((_token(item["token"]), top))
        except (TypeError, ValueError, KeyError, AttributeError):
            raise EngineProtocolError(f"/v1/chat/completions: logprobs.content[{at}] is not "
                                      f"{{token, logprob, top_logprobs}}: {str(item)[:120]}") from None
        nonfinite += sum(not math.isfinite(v) for v in top.values())
    return steps, nonfinite


def _only_choice(answer: dict, path: str = "/v1/completions") -> dict:
    choices = answer.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise EngineProtocolError(f"{path}: expected one choice, got {str(choices)[:200]}")
    return choices[0]


def _token(key: str) -> int:
    match = TOKEN_ID.match(str(key))
    if not match:
        raise EngineProtocolError(f"logprobs token {str(key)[:60]!r} is not 'token_id:<id>' "
                                  "(return_tokens_as_token_ids unsupported?)")
    return int(match.group(1))


def _generation(choice: dict, index: int) -> Generation:
    logprobs = choice.get("logprobs") if isinstance(choice, dict) else None
    if not isinstance(logprobs, dict):
        raise EngineProtocolError(f"choice {index}: no logprobs")
    tops = logprobs.get("top_logprobs") or []
    ids = choice.get("token_ids")
    if ids is None:
        ids = [_token(t) for t in logprobs.get("tokens") or []]
    if len(tops) != len(ids):
        raise EngineProtocolError(f"choice {index}: {len(ids)} tokens but {len(tops)} top_logprobs")
    steps, nonfinite = [], 0
    for at, (token, top) in enumerate(zip(ids, tops)):
        try:
            parsed = {_token(key): float(value) for key, value in (top or {}).items()}
            steps.append((int(token), parsed))
        except (TypeError, ValueError, AttributeError):
            raise EngineProtocolError(f"choice {index}: step {at}: token {str(token)[:40]} or "
                                      f"top_logprobs {str(top)[:100]} malformed") from None
        nonfinite += sum(not math.isfinite(v) for v in parsed.values())
    return Generation(steps, nonfinite)


__all__ = ["Engine", "EngineVsControl", "WindowLogprobs", "Generation"]
