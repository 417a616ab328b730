"""Loglikelihoods of requests that share a context, with the context computed once.

A multiple-choice item is one lm-eval request per choice, each the same context followed by that
choice: lm-eval's HFLM runs the whole context once per choice (its own TODO: "lump together
requests with the same context"). On the bundled tasks that is 3x the tokens needed (2,160
requests over 522 contexts). Here a batch of contexts (each minus its last token) runs once, its
key/value cache is repeated for each choice, and every choice of the batch continues from there
(positions and attention mask as generation gives them): the logits of exactly the positions
lm-eval scores.

The answer of each request is what lm-eval's causal `_loglikelihood_tokens` returns: the sum of
the continuation's log-probabilities (log-softmax in lm-eval's softmax dtype) and whether every
continuation token is the argmax. Numbers agree with the whole-sequence forward to rounding (a
cached forward multiplies other shapes); both sides of a comparison are computed the same way. A
model whose cached forward does not reproduce its whole-sequence forward is never trusted: the
first batch is scored both ways, and a difference beyond rounding turns sharing off.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable

SELF_CHECK_NATS = 1e-3  # plus the caller's relative resolution of its dtype (lmodels: 16 eps)

Request = tuple  # lm-eval's ((context, continuation) strings or None, context ids, continuation ids)
Answer = tuple[float, bool]


def plain_attention(config) -> bool:
    """Whether every layer is full attention with a plain growing cache (no sliding window,
    chunked, linear or recurrent layer), the case in which a padded prefix's cache is exact."""
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    windowed = any(getattr(config, name, None) for name in ("sliding_window",
                                                            "attention_chunk_size"))
    if getattr(config, "use_sliding_window", None) is False:
        windowed = False
    return kinds == {"full_attention"} and not windowed


def shared_groups(requests: list[Request], max_length: int, min_context: int = 2
                  ) -> tuple[list[list[int]], list[int]]:
    """Indices of requests grouped by identical context (groups of 2+ that fit the model's
    window whole and have a context of at least min_context, and 2, tokens), and the indices of
    the rest."""
    by_context: dict[tuple[int, ...], list[int]] = defaultdict(list)
    rest: list[int] = []
    for index, (_, context, continuation) in enumerate(requests):
        if len(context) >= max(2, min_context) and \
                len(context) + len(continuation) <= max_length + 1:
            by_context[tuple(context)].append(index)
        else:  # lm-eval truncates it from the left, or there is nothing to share: its own path
            rest.append(index)
    groups = []
    for members in by_context.values():
        if len(members) > 1:
            groups.append(members)
        else:
            rest.extend(members)
    return groups, sorted(rest)


def batches(groups: list[list[int]], requests: list[Request], batch_tokens: int
            ) -> list[list[list[int]]]:
    """Groups in batches, longest context first as lm-eval orders its own (a batch too big fails
    first). A batch holds at most ~batch_tokens of (choices x padded context): the context's
    cache is repeated per choice, so memory is what lm-eval's whole-sequence batch of the same
    requests would take."""
    def width(group):
        return len(requests[group[0]][1])

    out: list[list[list[int]]] = []
    current: list[list[int]] = []
    rows = longest = 0
    for group in sorted(groups, key=lambda g: -width(g)):
        grown_rows = rows + len(group)
        grown_longest = max(longest, *(len(requests[i][2]) for i in group))
        widest = width(current[0] if current else group)
        if current and grown_rows * (widest + grown_longest) > batch_tokens:
            out.append(current)
            current, grown_rows = [], len(group)
            grown_longest = max(len(requests[i][2]) for i in group)
        current.append(group)
        rows, longest = grown_rows, grown_longest
    if current:
        out.append(current)
    return out


def score_batch(model, contexts: list[list[int]], continuations: list[list[list[int]]], *,
                softmax_dtype, autocast_dtype, pad_id: int) -> list[list[Answer]]:
    """Per group, each continuation's (sum of log-probs, greedy), the contexts run once."""
    import torch
    import torch.nn.functional as F

    from day0.torchkit.kvcache import cache_argument, returned_cache

    device = next(model.parameters()).device
    lengths = [len(c) - 1 for c in contexts]  # the context's last token starts the suffix
    width = max(lengths)
    prefix = torch.tensor([c[:-1] + [pad_id] * (width - len(c) + 1) for c in contexts],
                          dtype=torch.long, device=device)
    owner = [g for g, conts in enumerate(continuations) for _ in conts]
    flat = [cont for conts in continuations for cont in conts]
    span = max(len(c) for c in flat)
    suffix = torch.tensor([[contexts[g][-1]] + c[:-1] + [pad_id] * (span - len(c))
                           for g, c in zip(owner, flat)], dtype=torch.long, device=device)
    real = torch.tensor(lengths, device=device)
    rows = torch.tensor(owner, device=device)
    # a padded prefix slot is masked out; a suffix position attends to its real prefix and to
    # itself and before (right padding of the suffix needs no mask: causality keeps it out)
    prefix_mask = (torch.arange(width, device=device)[None, :] < real[:, None]).long()
    mask = torch.cat([prefix_mask[rows], torch.ones_like(suffix)], dim=1)
    positions = real[rows][:, None] + torch.arange(span, device=device)[None, :]
    with torch.no_grad(), torch.autocast(device_type=device.type, dtype=autocast_dtype,
                                         enabled=autocast_dtype is not None):
        # right-padded prefixes: a real position never sees a later pad (causal), no mask
        cache = returned_cache(model(prefix, use_cache=True, logits_to_keep=1))
        cache.batch_select_indices(rows)
        logits = model(suffix, attention_mask=mask, position_ids=positions, use_cache=True,
                       **{cache_argument(model): cache}).logits
    logprobs = F.log_softmax(logits, dim=-1, dtype=softmax_dtype)
    answers: list[list[Answer]] = [[] for _ in contexts]
    for g, row, cont in zip(owner, logprobs, flat):
        scored = row[:len(cont)]
        wanted = torch.tensor(cont, dtype=torch.long, device=device)
        greedy = bool((scored.argmax(dim=-1) == wanted).all())
        answers[g].append((float(scored.gather(1, wanted.unsqueeze(-1)).sum()), greedy))
    return answers


def agrees(shared: list[Answer], whole: list[Answer], resolution: float) -> float | None:
    """The largest difference, or None when one exceeds rounding (SELF_CHECK_NATS plus the
    answer dtype's relative `resolution`)."""
    worst = 0.0
    for (a, _), (b, _) in zip(shared, whole):
        diff = abs(a - b)
        if diff > SELF_CHECK_NATS + resolution * max(abs(a), abs(b)):
            return None
        worst = max(worst, diff)
    return worst


def loglikelihoods(requests: list[Request], *, max_length: int, batch_tokens: int,
                   min_context: int = 2,
                   score: Callable[[list[list[int]], list[list[list[int]]]], list[list[Answer]]],
                   whole: Callable[[list[Request]], list[Answer]],
                   on_answer: Callable[[Request, Answer], None], resolution: float,
                   log: Callable[[str], None] = print) -> list[Answer]:
    """Every request's answer in request order: shared groups (contexts of min_context tokens
    or more) through `score` (batches of groups), the rest, and everything when the self-check
    fails, through `whole` (lm-eval's)."""
    groups, rest = shared_groups(requests, max_length, min_context)
    answers: list[Answer | None] = [None] * len(requests)
    answered_whole: set[int] = set()  # lm-eval's own path already cached these
    for batch in batches(groups, requests, batch_tokens):
        scored = score([requests[g[0]][1] for g in batch],
                       [[requests[i][2] for i in g] for g in batch])
        if not answered_whole:  # the first (longest) context, also run whole: answers kept
            first = batch[0]
            answered_whole.update(first)
            full = whole([requests[i] for i in first])
            if agrees(scored[0], full, resolution) is None:
                log("evaluation: this model's cached forward does not reproduce its whole-"
                    "sequence forward: every request runs whole (share_context off)")
                return whole(requests)
            scored[0] = full
        for group, group_answers in zip(batch, scored):
            for index, answer in zip(group, group_answers):
                answers[index] = answer
                if index not in answered_whole:
                    on_answer(requests[index], answer)
    if rest:
        for index, answer in zip(rest, whole([requests[i] for i in rest])):
            answers[index] = answer
    return answers


__all__ = ["plain_attention", "shared_groups", "batches", "score_batch", "agrees", "loglikelihoods",
           "SELF_CHECK_NATS"]
