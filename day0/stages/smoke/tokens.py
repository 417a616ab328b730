"""Tokenizer and chat-template parity: the engine's token ids against the checkpoint tokenizer's.

The engine's ids come from its /tokenize endpoint (vLLM, SGLang) or, where it has none (404,
``tokenize_via: auto``) or when asked (``completion``), from the prompt_token_ids of a one-token
(chat) completion. The checkpoint's ids: ``tokenizer(text, add_special_tokens=True)`` (what an
engine does to a completion prompt) and ``apply_chat_template(messages,
add_generation_prompt=True, tokenize=True)`` (what it does to chat messages).
"""

from __future__ import annotations

import json

from day0.engines.client import EngineHTTPError, EngineProtocolError
from day0.stages.smoke.checks import CheckFailure, Session
from day0.stages.smoke.parity import Mismatch, chat_ids, compare_ids, describe, preview, short
from day0.stages.smoke.result import ChatTemplateParity, TokenizerParity

SHOWN = 3  # mismatches named in a check's detail (all are in the evidence)


class EngineIds:
    """The engine's prompt ids of a text or of messages, by the configured route."""

    def __init__(self, s: Session):
        self.s = s
        self.via = s.config.tokenize_via

    def _tokenize(self, body: dict) -> list[int] | None:
        """/tokenize's ids; None when the route is completions (auto: /tokenize answered 404)."""
        if self.via == "completion":
            return None
        if self.via == "tokenize":
            return [int(i) for i in self.s.client.tokenize(body)]
        status, answer = self.s.client.send("POST", "/tokenize", body)
        if status == 404:
            self.via = "completion"
            self.s.notes.append("the engine has no /tokenize (404): token ids read from the "
                                "prompt_token_ids of one-token completions")
            return None
        self.via = "tokenize"
        if status >= 400:
            text = answer if isinstance(answer, str) else json.dumps(answer)
            raise EngineHTTPError(f"POST /tokenize: HTTP {status}: {text[:300]}", status, text)
        if not isinstance(answer, dict) or not isinstance(answer.get("tokens"), list):
            raise EngineProtocolError(f"/tokenize: answer has no 'tokens': {str(answer)[:200]}")
        return [int(i) for i in answer["tokens"]]

    def text(self, text: str) -> list[int]:
        ids = self._tokenize({"model": self.s.served, "prompt": text, "add_special_tokens": True})
        if ids is not None:
            return ids
        answer = self.s.client.completion({"model": self.s.served, "prompt": text,
                                           "max_tokens": 1, "temperature": 0,
                                           **self.s.config.extra_body})
        ids = ((answer.get("choices") or [{}])[0] or {}).get("prompt_token_ids")
        return self._checked(ids, "/v1/completions")

    def messages(self, messages: list[dict]) -> list[int]:
        ids = self._tokenize({"model": self.s.served, "messages": messages,
                              "add_generation_prompt": True})
        if ids is not None:
            return ids
        answer = self.s.client.chat({"model": self.s.served, "messages": messages,
                                     "max_tokens": 1, "temperature": 0,
                                     **self.s.config.extra_body})
        return self._checked(answer.get("prompt_token_ids"), "/v1/chat/completions")

    @staticmethod
    def _checked(ids, path: str) -> list[int]:
        if not isinstance(ids, list):
            raise EngineProtocolError(f"{path}: no prompt_token_ids in the answer; give the "
                                      "engine's field in extra_body (vLLM: return_token_ids) or "
                                      "use tokenize_via: tokenize")
        return [int(i) for i in ids]

    @property
    def label(self) -> str:
        return "/tokenize" if self.via == "tokenize" else "prompt_token_ids of completions"


def _refused(case: str, text: str, expected: list[int], exc: Exception) -> Mismatch:
    error = (f"HTTP {exc.status}: {exc.body}" if isinstance(exc, EngineHTTPError)
             else f"{type(exc).__name__}: {exc}")
    return Mismatch(case=case, index=0, engine_id=None, checkpoint_id=None, engine_len=0,
                    checkpoint_len=len(expected), preview=preview(text), error=short(error))


def _detail(count: int, noun: str, mismatches: list[Mismatch]) -> str:
    if not mismatches:
        return f"{count} {noun}: the engine's ids equal the checkpoint tokenizer's"
    shown = "; ".join(describe(m) for m in mismatches[:SHOWN])
    more = f" (+{len(mismatches) - SHOWN} more)" if len(mismatches) > SHOWN else ""
    return f"{len(mismatches)} of {count} {noun} differ: {shown}{more}"


def tokenizer_parity(s: Session, cases: list[tuple[str, str]]) -> TokenizerParity:
    engine = EngineIds(s)
    mismatches: list[Mismatch] = []
    for case, text in cases:
        expected = s.text_ids(text)
        try:
            got = engine.text(text)
        except CheckFailure as exc:
            mismatches.append(_refused(case, text, expected, exc))
            continue
        if (m := compare_ids(case, got, expected, preview(text))) is not None:
            mismatches.append(m)
    s.add("tokenizer.parity", "tokenizer", not mismatches,
          _detail(len(cases), "texts", mismatches) + f" (via {engine.label})")
    return TokenizerParity(via=engine.label, cases=len(cases), mismatches=mismatches)


def chat_template_parity(s: Session, conversations: list[tuple[str, list[dict]]]
                         ) -> ChatTemplateParity:
    engine = EngineIds(s)
    mismatches: list[Mismatch] = []
    for case, messages in conversations:
        text = " | ".join(f"{m['role']}: {m['content']}" for m in messages)
        expected = chat_ids(s.tokenizer, messages)
        try:
            got = engine.messages(messages)
        except CheckFailure as exc:
            mismatches.append(_refused(case, text, expected, exc))
            continue
        if (m := compare_ids(case, got, expected, preview(text))):
            mismatches.append(m)
    s.add("chat_template.parity", "chat_template", not mismatches,
          _detail(len(conversations), "conversations", mismatches) + f" (via {engine.label})")
    return ChatTemplateParity(applicable=True, via=engine.label,
                              conversations=len(conversations), mismatches=mismatches)


def renderable(s: Session, conversations: list[tuple[str, list[dict]]]
               ) -> list[tuple[str, list[dict]]]:
    """The conversations the checkpoint's own chat template renders; each one it refuses (e.g.
    a template that raises on a system message) is left out with a note."""
    kept = []
    for case, messages in conversations:
        try:
            chat_ids(s.tokenizer, messages)
        except Exception as exc:  # jinja raises its own errors, templates raise_exception()
            s.notes.append(f"the checkpoint's chat template refuses conversation '{case}' "
                           f"({type(exc).__name__}: {short(str(exc))}): left out")
            continue
        kept.append((case, messages))
    return kept


def no_chat_template(s: Session, conversations: list[tuple[str, list[dict]]],
                     why: str = "the checkpoint has no chat template "
                     "(tokenizer_config.json chat_template or chat_template.jinja)"
                     ) -> ChatTemplateParity:
    """Parity of absence: the checkpoint renders no chat prompt, so the engine must refuse to
    build one (a template the engine invents, e.g. a default one, is a mismatch: the served
    model would be prompted in a format it was never trained on). Chat completions are then
    not checked."""
    engine = EngineIds(s)
    invented: list[Mismatch] = []
    for case, messages in conversations:
        try:
            got = engine.messages(messages)
        except CheckFailure:
            continue  # refused, like the checkpoint
        text = " | ".join(f"{m['role']}: {m['content']}" for m in messages)
        invented.append(Mismatch(case=case, index=0, engine_id=got[0] if got else None,
                                 checkpoint_id=None, engine_len=len(got), checkpoint_len=0,
                                 preview=preview(text),
                                 error="the engine built a chat prompt the checkpoint has no "
                                       "template for"))
    note = (f"{why}: the engine must refuse chat prompts too ({len(conversations) - len(invented)}"
            f" of {len(conversations)} refused); chat completions are not checked")
    s.add("chat_template.parity", "chat_template", not invented,
          _detail(len(conversations), "conversations", invented) + f" (via {engine.label})")
    s.notes.append(note)
    return ChatTemplateParity(applicable=False, note=note, via=engine.label,
                              conversations=len(conversations), mismatches=invented)


__all__ = ["EngineIds", "tokenizer_parity", "chat_template_parity", "renderable",
           "no_chat_template"]
