"""Passkey-style long-context retrieval items, sized to the model's own context length.

Several key/value facts ("The code for amber is 4821.") are hidden at varied depths in
filler prose; the question asks for one key's value. The 4 choices are values of keys that all
appear in the context, so a model must retrieve the right one, not just any number. Prompt +
answer token lengths (measured with the model's tokenizer) spread evenly from ~25% to ~95% of
max_tokens over the items. Pure and deterministic for (tokenizer, max_tokens, n_items, seed).
"""

from __future__ import annotations

import random
from pathlib import Path

FILLER = Path(__file__).parent / "data" / "long_context_filler.txt"
KEYS = ["amber", "birch", "cedar", "delta", "ember", "flint", "grove", "haven", "ivory", "jasper",
        "karst", "lumen", "maple", "nectar", "onyx", "pearl", "quartz", "raven", "sable", "topaz"]
LOW, HIGH = 0.25, 0.95
N_FACTS = 4  # facts in every context: the asked one and the 3 distractors' sources
QUESTION = "\nWhat is the code for {key}? The code for {key} is"


def _words(text: str) -> list[str]:
    return text.split()


def _count(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def _fact(key: str, value: str) -> str:
    return f"The code for {key} is {value}."


def _prompt(filler: list[str], facts: list[str], depths: list[float], key: str) -> str:
    body = list(filler)
    for fact, depth in sorted(zip(facts, depths), key=lambda fd: -fd[1]):
        body.insert(round(depth * len(body)), fact)
    return " ".join(body) + QUESTION.format(key=key)


def _fit(tokenizer, sents: list[str], start: int, facts: list[str], depths: list[float],
         key: str, answer: str, budget: int) -> tuple[str, int]:
    """Longest prompt (filler words from start on) whose prompt + answer fits budget."""

    def prompt_of(words: int) -> str:
        return _prompt([sents[(start + i) % len(sents)] for i in range(words)], facts, depths,
                       key)

    def fits(prompt: str) -> bool:
        return _count(tokenizer, prompt + " " + answer) <= budget

    # the search's upper end doubles from the budget while it still fits: the same answer as
    # searching all the filler's words, without tokenizing prompts many times the budget
    hi = min(len(sents), max(budget, 1))
    while hi < len(sents) and fits(prompt_of(hi)):
        hi = min(len(sents), 2 * hi)
    lo, best = 0, None
    while lo <= hi:  # binary search on the number of filler words
        mid = (lo + hi) // 2
        prompt = prompt_of(mid)
        if fits(prompt):
            best, lo = prompt, mid + 1
        else:
            hi = mid - 1
    if best is None:
        best = _prompt([], facts, depths, key)
    return best, _count(tokenizer, best)


def build_items(tokenizer, max_tokens: int, n_items: int, seed: int = 0,
                filler: str | None = None) -> list[dict]:
    """n_items multiple-choice retrieval records {id, category, question, choices, answer, tokens}.

    Item i targets prompt + answer length LOW..HIGH of max_tokens, evenly spaced over the items;
    the asked fact's depth in the filler varies evenly too (shuffled)."""
    if n_items < 1 or max_tokens < 32:
        raise ValueError("need n_items >= 1 and max_tokens >= 32")
    text = filler if filler is not None else FILLER.read_text(encoding="utf-8")
    sents = _words(text)
    if not sents:
        raise ValueError("filler text has no words")
    rng = random.Random(seed)
    asked_depths = [(i + 0.5) / n_items for i in range(n_items)]
    rng.shuffle(asked_depths)
    items = []
    for i in range(n_items):
        frac = LOW if n_items == 1 else LOW + (HIGH - LOW) * i / (n_items - 1)
        keys = rng.sample(KEYS, N_FACTS)
        values = [str(v) for v in rng.sample(range(1000, 10000), N_FACTS)]
        depths = [asked_depths[i]] + [rng.random() for _ in range(N_FACTS - 1)]
        facts = [_fact(k, v) for k, v in zip(keys, values)]
        start = rng.randrange(len(sents))
        prompt, tokens = _fit(tokenizer, sents, start, facts, depths, keys[0], values[0],
                              int(frac * max_tokens))
        choices = values[:]
        rng.shuffle(choices)
        items.append({"id": f"long_context-{i:03d}", "category": "long_context",
                      "question": prompt, "choices": choices, "answer": choices.index(values[0]),
                      "tokens": tokens})
    return items


__all__ = ["build_items"]
