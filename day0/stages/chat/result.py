"""The chat stage's settings and evidence (pydantic): one row per conversation, the paired
prefill and decode comparisons, the flat metrics the gates read."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from day0.engines.logprobs import EngineVsControl
from day0.execution.contract import Row
from day0.torchkit.paired import Comparison


class Config(BaseModel):
    """Settings of the chat stage."""

    model_config = ConfigDict(extra="forbid")

    bundled_conversations: bool = Field(True, description=(
        "Answer day0's bundled conversations (day0/stages/chat/data/conversations.jsonl)."))
    conversations_file: str | None = Field(None, description=(
        "Your own conversations, JSONL, one per line: {\"id\", \"messages\", \"tools\"?}; "
        "answered after the bundled ones."))
    new_tokens: int = Field(24, ge=1, le=512, description=(
        "Tokens each side answers greedily (temperature 0, EOS ignored on every side so the "
        "answers are compared over the same length)."))
    top_k: int = Field(20, ge=1, description=(
        "Logprobs per step and per prompt position the engine is asked for (capped by its "
        "max_logprobs): the top-k sets the closeness test reads."))
    max_tie_gap: float = Field(0.5, gt=0, description=(
        "At the first token where two answers differ, each side's logprob margin between its "
        "own token and the other's must be at most this many nats for the answers to count as "
        "close (a near-tie that a rounding difference flips); besides, each token must be in "
        "the other side's top-k, as vLLM's check_logprobs_close requires."))
    error_floor: float = Field(1e-3, gt=0, description=(
        "Control errors (mean |logprob - reference logprob|, nats) below this count as this in "
        "the engine/control ratios: a control that is exactly right does not make noise an "
        "infinite ratio."))
    block_size: int = Field(8, ge=1, description=(
        "Consecutive tokens per bootstrap block (never across conversations) for the ratios' "
        "confidence bounds."))
    prefill_ratio_diagnosis: float = Field(3.0, gt=0, description=(
        "A diverging conversation whose prompt logprobs (prefill) are off by more than this "
        "times the control's is diagnosed 'prefill'; otherwise 'decode'."))


class Top(Row):
    token: int = Field(description="Token id.")
    text: str = Field(description="The token decoded by the checkpoint's tokenizer.")
    logprob: float = Field(description="Its logprob on that side.")


class ConversationRow(Row):
    """One conversation: the engine's and the control's greedy answers against the reference's."""

    id: str = Field(description="The conversation's id.")
    prompt_tokens: int = Field(description="Tokens of the checkpoint's chat rendering.")
    prompt_matches: bool | None = Field(description=(
        "The engine rendered the same prompt ids (None: it did not return them)."))
    path_agrees: bool = Field(description=(
        "The engine's chat answer equals its completions answer for the checkpoint's prompt "
        "ids (same greedy request): False points at the chat path or its request defaults."))
    not_greedy_steps: int = Field(0, description=(
        "Steps of the engine's chat answer whose token is not its own top-1 logprob: at "
        "temperature 0, other sampling parameters (request defaults) shaped the answer."))
    tokens: int = Field(description="Answer tokens compared.")
    close: bool = Field(description="Engine answer close to the reference's.")
    first_difference: int | None = Field(description="First answer token that differs.")
    tie_gap: float | None = Field(description="Larger margin at the first difference, nats.")
    why: str = Field(description="Why not close.")
    control_close: bool = Field(description="Control answer close to the reference's.")
    control_first_difference: int | None = Field(description="The control's first difference.")
    where: str = Field(description=(
        "'' identical; 'near-tie' close but parted at a near-tie; for a conversation not close: "
        "'prompt' (another prompt), 'request' (the chat answer differs from the completions "
        "answer, or picks tokens below its own top-1: request defaults), 'prefill' "
        "(its prompt logprobs are off), 'decode' (prompt logprobs fine, answer steps not)."))
    prefill_error: float = Field(description=(
        "Mean |engine - reference| logprob of each actual prompt token (completions "
        "prompt_logprobs of the same ids), nats."))
    control_prefill_error: float = Field(description="The control's, same tokens.")
    decode_error: float = Field(description=(
        "Mean |engine step logprob - reference teacher-forced logprob| of the engine's answer "
        "tokens for the checkpoint's prompt ids (completions path), nats."))
    control_decode_error: float = Field(description=(
        "Mean |control - reference| teacher-forced logprob of the same answer tokens."))
    reference_text: str = Field(description="The reference's answer (float32).")
    engine_text: str = Field(description="The engine's chat answer.")
    control_text: str = Field(description="The control's answer.")
    engine_top: list[Top] = Field(default_factory=list, description=(
        "At the first difference: the engine's top logprobs."))
    reference_top: list[Top] = Field(default_factory=list, description=(
        "At the first difference: the reference's top logprobs (same context)."))
    prefill_top: list[Top] = Field(default_factory=list, description=(
        "The engine's completions answer at the first difference, same prompt ids: equal to "
        "engine_top unless the chat path differs."))


class Result(EngineVsControl):
    """Evidence of the chat stage; metrics() gives the flat gate inputs."""

    request: dict = Field(description=(
        "The chat request's parameters besides the messages: nothing else is set, so every "
        "other sampling parameter is the engine's default (generation_config.json's included)."))
    generation_defaults: dict = Field(default_factory=dict, description=(
        "Sampling fields of the checkpoint's generation_config.json, which an engine such as "
        "vLLM applies to every request that does not set them."))
    top_k: int = Field(description="Logprobs per step actually used (after the engine's cap).")
    max_tie_gap: float = Field(description="The near-tie bound used, nats.")
    conversations: list[ConversationRow] = Field(default_factory=list, description=(
        "Per conversation, in order."))
    comparisons: list[Comparison] = Field(default_factory=list, description=(
        "Engine vs control, paired over tokens: prefill_error and decode_error."))
    nonfinite: int = Field(0, description="NaN/inf logprobs the engine returned.")
    notes: list[str] = Field(default_factory=list, description="What limited the check.")
    timings: dict[str, float] = Field(default_factory=dict, description="Seconds per part.")

    def comparison(self, metric: str) -> Comparison | None:
        return next((c for c in self.comparisons if c.metric == metric), None)

    def metrics(self) -> dict[str, float | None]:
        rows = self.conversations

        def count(test) -> float | None:
            return float(sum(1 for r in rows if test(r))) if rows else None

        def low(metric: str) -> float | None:
            found = self.comparison(metric)
            return found.low if found else None

        def mean(metric: str, side: str) -> float | None:
            found = self.comparison(metric)
            return getattr(found, side) if found else None

        not_close, control_not_close = count(lambda r: not r.close), count(
            lambda r: not r.control_close)
        return {
            "chat.conversations": float(len(rows)),
            "chat.not_close": not_close,
            "chat.control_not_close": control_not_close,
            "chat.vs_control.not_close_excess": (None if not rows
                                                 else not_close - control_not_close),
            "chat.prompt_mismatches": count(lambda r: r.prompt_matches is False),
            "chat.path_mismatches": count(lambda r: not r.path_agrees),
            "chat.not_greedy_steps": (float(sum(r.not_greedy_steps for r in rows))
                                      if rows else None),
            "chat.token_match_rate": (sum((r.first_difference if r.first_difference is not None
                                           else r.tokens) / max(r.tokens, 1) for r in rows)
                                      / len(rows) if rows else None),
            "chat.prefill_error_mean": mean("prefill_error", "target"),
            "chat.control.prefill_error_mean": mean("prefill_error", "control"),
            "chat.decode_error_mean": mean("decode_error", "target"),
            "chat.control.decode_error_mean": mean("decode_error", "control"),
            "chat.vs_control.prefill_error_ratio_low": low("prefill_error"),
            "chat.vs_control.decode_error_ratio_low": low("decode_error"),
            "chat.nonfinite": float(self.nonfinite),
        }


__all__ = ["Config", "Result", "ConversationRow", "Top"]
