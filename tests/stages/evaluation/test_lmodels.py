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
