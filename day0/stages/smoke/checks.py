"""The API checks of the smoke stage: listing, completions and chat completions (plain and
streamed), max_tokens, stop strings, usage counts and detokenization against the checkpoint
tokenizer.

Every check adds a :class:`Check` row. An error status or a malformed answer fails the check it
belongs to; an unreachable engine (EngineUnreachable) is not caught: the stage ends ERROR.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from day0.engines.client import EngineClient, EngineHTTPError, EngineProtocolError
from day0.engines.greedy import compare_greedy
from day0.stages.smoke.parity import (chat_ids, chat_steps, completion_steps, first_difference,
                                      short, stop_string)
from day0.stages.smoke.result import Check, Config, Family

CheckFailure = (EngineHTTPError, EngineProtocolError)  # a failed check; EngineUnreachable is not


@dataclass
class Session:
    """What the checks share: the engine, the checkpoint tokenizer, the rows and counters."""

    config: Config
    client: EngineClient
    served: str
    tokenizer: Any
    checks: list[Check] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: {"stream": 0, "usage": 0,
                                                             "detokenize": 0})
    notes: list[str] = field(default_factory=list)

    def add(self, name: str, family: Family, passed: bool | None, detail: str = "") -> bool:
        self.checks.append(Check(name=name, family=family, passed=passed, detail=detail))
        return bool(passed)

    def guarded(self, name: str, family: Family, fn: Callable[[], tuple[bool, str]]) -> bool:
        """Run fn -> (passed, detail); an HTTP or protocol error fails the check."""
        try:
            passed, detail = fn()
        except CheckFailure as exc:
            passed, detail = False, short(str(exc))
        return self.add(name, family, passed, detail)

    def text_ids(self, text: str) -> list[int]:
        """The checkpoint's ids of a prompt, special tokens added as an engine adds them."""
        return [int(i) for i in self.tokenizer(text, add_special_tokens=True,
                                                    verbose=False)["input_ids"]]


# -- one generation, either API -----------------------------------------------------------
@dataclass
class Generation:
    text: str
    finish_reason: str | None
    ids: list[int]            # generated token ids ([] when the engine does not return them)
    steps: list              # [(id, {id: logprob})] when logprob tokens are ids
    usage: dict
    prompt_ids: list[int] | None
    stop_reason: Any = None


@dataclass
class Api:
    """The completions or chat completions API: request body and answer parsing."""

    kind: str  # "completion" | "chat"
    path: str

    def body(self, s: Session, prompt, max_tokens: int, stop: list[str] | None = None) -> dict:
        body = {"model": s.served, "temperature": 0, "max_tokens": max_tokens,
                **s.config.extra_body}
        if self.kind == "completion":
            body["prompt"] = prompt
            if s.config.top_logprobs:
                body["logprobs"] = s.config.top_logprobs
        else:
            body["messages"] = prompt
            if s.config.top_logprobs:
                body.update(logprobs=True, top_logprobs=s.config.top_logprobs)
        if stop:
            body["stop"] = stop
        return body

    def expected_prompt_ids(self, s: Session, prompt) -> list[int]:
        return s.text_ids(prompt) if self.kind == "completion" else chat_ids(s.tokenizer, prompt)

    def call(self, s: Session, body: dict) -> Generation:
        answer = s.client.completion(body) if self.kind == "completion" else s.client.chat(body)
        choices = answer.get("choices") or []
        if not choices or not isinstance(choices[0], dict):
            raise EngineProtocolError(f"{self.path}: no choice in {str(answer)[:200]}")
        choice = choices[0]
        if self.kind == "completion":
            text, steps = choice.get("text"), completion_steps(choice.get("logprobs"))
            prompt_ids = choice.get("prompt_token_ids")
        else:
            text = (choice.get("message") or {}).get("content")
            steps, prompt_ids = chat_steps(choice.get("logprobs")), answer.get("prompt_token_ids")
        if not isinstance(text, str):
            raise EngineProtocolError(f"{self.path}: the choice has no text: {str(choice)[:200]}")
        ids = choice.get("token_ids") or [tid for tid, _ in steps]
        return Generation(text=text, finish_reason=choice.get("finish_reason"), ids=list(ids),
                          steps=steps, usage=answer.get("usage") or {}, prompt_ids=prompt_ids,
                          stop_reason=choice.get("stop_reason"))

    def stream(self, s: Session, body: dict) -> Generation:
        chunks = s.client.stream(self.path, body)
        text, ids, steps, finish, prompt_ids = [], [], [], None, None
        for chunk in chunks:
            prompt_ids = prompt_ids or chunk.get("prompt_token_ids")
            for choice in chunk.get("choices") or []:
                if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                    continue
                prompt_ids = prompt_ids or choice.get("prompt_token_ids")
                if self.kind == "completion":
                    piece = choice.get("text")
                    steps += completion_steps(choice.get("logprobs"))
                else:
                    piece = (choice.get("delta") or {}).get("content")
                    steps += chat_steps(choice.get("logprobs"))
                text.append(piece or "")
                ids += choice.get("token_ids") or []
                finish = choice.get("finish_reason") or finish
        return Generation(text="".join(text), finish_reason=finish, ids=ids or
                          [tid for tid, _ in steps], steps=steps, usage={}, prompt_ids=prompt_ids)


COMPLETION = Api("completion", "/v1/completions")
CHAT = Api("chat", "/v1/chat/completions")


def models_check(s: Session) -> None:
    def check():
        names = s.client.models()
        return s.served in names, f"/v1/models lists {names}"
    s.guarded("models.listed", "api", check)


def generation_checks(s: Session, api: Api, prompts: list) -> None:
    """The checks of one API: a greedy reference run, then streaming, stop, usage, decode."""
    n, k = s.config.max_tokens, api.kind
    ref, prompt, tried = None, None, []
    try:
        for prompt in prompts:
            ref = api.call(s, api.body(s, prompt, n))
            tried.append(f"{ref.finish_reason} after {ref.usage.get('completion_tokens')}")
            if ref.finish_reason == "length" and ref.text:
                break  # an early EOS says nothing about max_tokens: try the next prompt
    except CheckFailure as exc:
        for name, family in ((f"{k}.text", "api"), (f"{k}.max_tokens", "api"),
                             (f"{k}.usage", "usage"), (f"{k}.detokenize", "detokenize"),
                             (f"{k}.stream_text", "api"), (f"{k}.stream_matches", "stream"),
                             (f"{k}.stop", "api")):
            s.add(name, family, False, f"not checked: the greedy {k} request failed: "
                                       f"{short(str(exc))}")
        return
    s.add(f"{k}.text", "api", bool(ref.text.strip()), f"greedy text {ref.text[:60]!r}")
    got = ref.usage.get("completion_tokens")
    s.add(f"{k}.max_tokens", "api", ref.finish_reason == "length" and got == n,
          f"max_tokens {n}: finish_reason {ref.finish_reason!r}, completion_tokens {got}"
          + (f" (prompts tried: {'; '.join(tried)})" if len(tried) > 1 else ""))
    _usage(s, api, prompt, ref)
    _detokenize(s, k, ref)
    _stream(s, api, prompt, ref)
    _stop(s, api, prompt, ref)


def _usage(s: Session, api: Api, prompt, ref: Generation) -> None:
    expected = api.expected_prompt_ids(s, prompt)
    problems = []
    if ref.usage.get("prompt_tokens") != len(expected):
        problems.append(f"prompt_tokens {ref.usage.get('prompt_tokens')} != checkpoint "
                        f"tokenizer's {len(expected)}")
    if ref.prompt_ids is not None and list(ref.prompt_ids) != expected:
        index = first_difference(list(ref.prompt_ids), expected)
        problems.append(f"prompt_token_ids differ from the checkpoint's at token {index}")
    if ref.ids and ref.usage.get("completion_tokens") != len(ref.ids):
        problems.append(f"completion_tokens {ref.usage.get('completion_tokens')} != "
                        f"{len(ref.ids)} generated ids")
    s.counts["usage"] += len(problems)
    s.add(f"{api.kind}.usage", "usage", not problems, "; ".join(problems) or (
        f"prompt_tokens {len(expected)} = checkpoint tokenizer's"
        + ("" if ref.prompt_ids is None else ", prompt_token_ids equal")
        + (f", completion_tokens = {len(ref.ids)} ids" if ref.ids else "")))


def _detokenize(s: Session, kind: str, ref: Generation) -> None:
    if not ref.ids:
        s.add(f"{kind}.detokenize", "detokenize", None,
              "not applicable: the engine returned no generated token ids (extra_body)")
        return
    decoded = s.tokenizer.decode(ref.ids, skip_special_tokens=True)
    same = decoded == ref.text
    s.counts["detokenize"] += not same
    s.add(f"{kind}.detokenize", "detokenize", same,
          "the checkpoint tokenizer decodes the generated ids to the engine's text" if same
          else f"engine text {ref.text[:60]!r} vs checkpoint decode {decoded[:60]!r}")


def _stream(s: Session, api: Api, prompt, ref: Generation) -> None:
    k = api.kind
    try:
        got = api.stream(s, api.body(s, prompt, s.config.max_tokens))
    except CheckFailure as exc:
        s.add(f"{k}.stream_text", "api", False, f"streamed request failed: {short(str(exc))}")
        s.add(f"{k}.stream_matches", "stream", False, "not checked: the stream failed")
        s.counts["stream"] += 1
        return
    s.add(f"{k}.stream_text", "api", bool(got.text.strip()) and got.finish_reason is not None,
          f"streamed deltas {got.text[:60]!r}, finish_reason {got.finish_reason!r}")
    if got.text == ref.text:
        s.add(f"{k}.stream_matches", "stream", True,
              "concatenated deltas equal the non-streamed greedy text")
        return
    verdict = compare_greedy(ref.steps, got.steps) if ref.steps and got.steps else None
    if verdict is not None and verdict.close and verdict.first_difference is not None:
        s.add(f"{k}.stream_matches", "stream", True,
              f"parted at token {verdict.first_difference} on a near tie (each token in the "
              "other's top-k)")
        return
    s.counts["stream"] += 1
    s.add(f"{k}.stream_matches", "stream", False,
          f"streamed {got.text[:60]!r} vs non-streamed {ref.text[:60]!r}"
          + (f"; {verdict.why}" if verdict is not None and verdict.why else ""))


def _stop(s: Session, api: Api, prompt, ref: Generation) -> None:
    k = api.kind
    stop = stop_string(ref.text)
    if stop is None:
        s.add(f"{k}.stop", "api", None,
              f"not applicable: the greedy text {ref.text[:60]!r} has no character to stop at")
        return
    expected = ref.text[:ref.text.find(stop)]

    def check():
        got = api.call(s, api.body(s, prompt, s.config.max_tokens, stop=[stop]))
        ok = got.finish_reason == "stop" and stop not in got.text and got.text == expected
        return ok, (f"stop {stop!r}: finish_reason {got.finish_reason!r}, text {got.text[:60]!r}"
                    + ("" if got.text == expected else f", expected {expected[:60]!r}"))
    s.guarded(f"{k}.stop", "api", check)


CHAT_FAMILIES: tuple[tuple[str, Family], ...] = (
    ("chat.text", "api"), ("chat.max_tokens", "api"), ("chat.usage", "usage"),
    ("chat.detokenize", "detokenize"), ("chat.stream_text", "api"),
    ("chat.stream_matches", "stream"), ("chat.stop", "api"))


def chat_not_applicable(s: Session, note: str) -> None:
    for name, family in CHAT_FAMILIES:
        s.add(name, family, None, f"not applicable: {note}")


__all__ = ["Session", "Api", "COMPLETION", "CHAT", "models_check", "generation_checks",
           "chat_not_applicable", "CheckFailure"]
