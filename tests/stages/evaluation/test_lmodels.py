"""Day0LM scores only the positions its requests read: the same answers as lm-eval's HFLM over
the whole sequence, with logits for the batch's tail only."""

from __future__ import annotations

import random

import pytest

from day0.stages.evaluation.lmodels import Day0LM, scored_tail
from tests.conftest import MODELS


def test_scored_tail_covers_every_row_of_a_right_padded_batch():
    scored_from = {(5, 6, 7, 8): 2, (5, 6): 1}
    # row 1 needs positions 2.. of 4; row 2 (padded to 4) needs 1.. -> 3 last positions
    assert scored_tail([[5, 6, 7, 8], [5, 6, 0, 0]], scored_from) == 3
    assert scored_tail([[5, 6, 7, 8]], scored_from) == 2


def test_scored_tail_finds_an_input_that_ends_in_token_zero():
    assert scored_tail([[4, 0, 0]], {(4, 0): 1}) == 2


def test_scored_tail_computes_everything_for_a_row_it_does_not_know():
    assert scored_tail([[9, 9, 9]], {(5, 6): 1}) is None


@pytest.fixture(scope="module")
def tiny_llama_lm():
    return Day0LM(pretrained=str(MODELS / "tiny-llama"), device="cpu", dtype="float32",
                  batch_size=4, max_length=64)


def test_loglikelihoods_equal_the_whole_sequence_ones(tiny_llama_lm):
    """Requests of mixed lengths (some truncated from the left, some sharing a context):
    the tail-only forward answers exactly what lm-eval's full forward answers."""
    rng = random.Random(0)
    vocab = tiny_llama_lm.model.config.vocab_size
    requests = []
    for _ in range(24):
        context = [rng.randrange(1, vocab) for _ in range(rng.randrange(1, 90))]
        for continuation in ([rng.randrange(vocab)], [rng.randrange(vocab) for _ in range(5)]):
            requests.append((("c", "x"), context, continuation))
    calls = []
    forward = tiny_llama_lm.model.forward

    def spy(*args, **kwargs):
        out = forward(*args, **kwargs)
        calls.append(out.logits.shape[1])
        return out

    tiny_llama_lm.model.forward = spy
    try:
        tail = tiny_llama_lm._loglikelihood_tokens(requests, disable_tqdm=True)
    finally:
        tiny_llama_lm.model.forward = forward
    tiny_llama_lm._keeps_tail = False
    try:
        full = tiny_llama_lm._loglikelihood_tokens(requests, disable_tqdm=True)
    finally:
        tiny_llama_lm._keeps_tail = True
    assert [b for _, b in tail] == [b for _, b in full]
    assert [ll for ll, _ in tail] == pytest.approx([ll for ll, _ in full], rel=1e-5, abs=1e-5)
    assert calls and max(calls) < 64  # only the scored tail was computed


def _choice_requests(seed: int, vocab: int, items: int = 30, window: int = 64):
    """Multiple-choice shaped requests: a context shared by 2-4 choices, plus a context too
    long for the window (lm-eval truncates it) and a context of one token."""
    rng = random.Random(seed)
    requests = []
    for _ in range(items):
        context = [rng.randrange(1, vocab) for _ in range(rng.randrange(2, 50))]
        for _ in range(rng.randrange(2, 5)):
            choice = [rng.randrange(vocab) for _ in range(rng.randrange(1, 6))]
            requests.append((("c", "x"), context, choice))
    long_context = [rng.randrange(1, vocab) for _ in range(window + 10)]
    requests += [(("c", "x"), long_context, [5]), (("c", "x"), long_context, [6, 7])]
    requests += [(("c", "x"), [9], [3]), (("c", "x"), [9], [4, 4])]
    rng.shuffle(requests)
    return requests


@pytest.fixture(scope="module")
def sharing_lm():
    return Day0LM(pretrained=str(MODELS / "tiny-llama"), device="cpu", dtype="float32",
                  batch_size=4, max_length=64, share_context=True)


def test_shared_contexts_answer_like_whole_sequences_with_fewer_tokens(sharing_lm):
    """A context shared by several choices runs once: every answer equals the whole-sequence
    one (to fp32 rounding, the same greedy flags), in request order, with a third of the
    tokens; truncated and one-token contexts take lm-eval's own path."""
    requests = _choice_requests(1, sharing_lm.model.config.vocab_size)
    tokens = []
    forward = sharing_lm.model.forward

    def spy(*args, **kwargs):
        ids = args[0] if args else kwargs["input_ids"]
        tokens.append(ids.numel())
        return forward(*args, **kwargs)

    sharing_lm.model.forward = spy
    try:
        shared = sharing_lm._loglikelihood_tokens(requests, disable_tqdm=True)
        shared_tokens, tokens[:] = sum(tokens), []
        whole = sharing_lm._whole(requests, disable_tqdm=True)
        whole_tokens = sum(tokens)
    finally:
        sharing_lm.model.forward = forward
    assert [g for _, g in shared] == [g for _, g in whole]
    assert [ll for ll, _ in shared] == pytest.approx([ll for ll, _ in whole], rel=1e-5, abs=1e-5)
    assert shared_tokens < 0.7 * whole_tokens, (shared_tokens, whole_tokens)


def test_a_cache_that_disagrees_with_the_whole_forward_turns_sharing_off(sharing_lm,
                                                                        monkeypatch, capsys):
    from day0.stages.evaluation import prefix

    requests = _choice_requests(2, sharing_lm.model.config.vocab_size)
    real = prefix.score_batch

    def off_by_one_nat(*args, **kwargs):
        return [[(ll - 1.0, g) for ll, g in group] for group in real(*args, **kwargs)]

    monkeypatch.setattr(prefix, "score_batch", off_by_one_nat)
    answers = sharing_lm._loglikelihood_tokens(requests, disable_tqdm=True)
    assert answers == sharing_lm._whole(requests, disable_tqdm=True)
    assert "every request runs whole" in capsys.readouterr().out


def test_windowed_or_recurrent_layers_are_never_shared():
    from types import SimpleNamespace

    from day0.stages.evaluation.prefix import plain_attention

    assert plain_attention(SimpleNamespace(layer_types=["full_attention"] * 4))
    assert plain_attention(SimpleNamespace(sliding_window=4096, use_sliding_window=False))
    assert not plain_attention(SimpleNamespace(sliding_window=4096))
    assert not plain_attention(SimpleNamespace(layer_types=["full_attention",
                                                            "sliding_attention"]))
    assert not plain_attention(SimpleNamespace(layer_types=["linear_attention"]))


def test_batches_hold_the_whole_paths_token_budget():
    from day0.stages.evaluation.prefix import batches, shared_groups

    requests = _choice_requests(3, 512, items=40)
    groups, rest = shared_groups(requests, max_length=64)
    assert sorted([i for g in groups for i in g] + rest) == list(range(len(requests)))
    assert all(len(requests[i][1]) > 64 or len(requests[i][1]) < 2 for i in rest)
    planned = batches(groups, requests, batch_tokens=256)
    assert sorted(i for b in planned for g in b for i in g) == sorted(i for g in groups for i in g)
    for batch in planned:
        rows = sum(len(g) for g in batch)
        width = max(len(requests[g[0]][1]) for g in batch)
        longest = max(len(requests[i][2]) for g in batch for i in g)
        assert len(batch) == 1 or rows * (width + longest) <= 256


def test_only_long_contexts_are_shared_by_default():
    """share_context off: contexts of share_context_from_tokens or more still run once per item
    (a long document repeated per choice), shorter ones whole; null turns sharing off."""
    from day0.stages.evaluation.config import Config
    from day0.stages.evaluation.prefix import shared_groups
    from day0.stages.evaluation.refstore import shared_from

    requests = _choice_requests(4, 512, items=40)
    groups, rest = shared_groups(requests, max_length=64, min_context=30)
    assert groups and all(len(requests[g[0]][1]) >= 30 for g in groups)
    assert any(2 <= len(requests[i][1]) < 30 for i in rest)
    assert sorted([i for g in groups for i in g] + rest) == list(range(len(requests)))
    assert shared_from(Config()) == 512
    assert shared_from(Config(share_context=True)) == 2
    assert shared_from(Config(share_context_from_tokens=None)) is None


def test_long_contexts_shared_answer_like_whole_sequences():
    lm = Day0LM(pretrained=str(MODELS / "tiny-llama"), device="cpu", dtype="float32",
                batch_size=4, max_length=64, share_from=30)
    assert lm._share_from == 30
    requests = _choice_requests(5, lm.model.config.vocab_size)
    shared = lm._loglikelihood_tokens(requests, disable_tqdm=True)
    whole = lm._whole(requests, disable_tqdm=True)
    assert [g for _, g in shared] == [g for _, g in whole]
    assert [ll for ll, _ in shared] == pytest.approx([ll for ll, _ in whole], rel=1e-5, abs=1e-5)
