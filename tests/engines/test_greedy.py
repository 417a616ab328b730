"""day0.engines.greedy: vLLM's check_logprobs_close, and the near-tie bound the chat stage adds."""

from __future__ import annotations

from day0.engines.greedy import compare_greedy

# SmolLM2-135M-Instruct asked "What is the capital of France?": the float32 reference's first
# answer token is 'The' (id 504), 0.08 nats ahead of 'L' (id 61); vLLM's bf16 ties them
REFERENCE = [(504, {504: -1.883, 61: -1.965, 2: -2.266})]
ENGINE = [(61, {61: -1.906, 504: -1.906, 2: -2.281})]


def test_a_near_tie_is_close_and_says_its_margin():
    got = compare_greedy(REFERENCE, ENGINE, max_gap=0.5)
    assert got.close and got.first_difference == 0 and abs(got.tie_gap - 0.082) < 1e-9


def test_a_margin_above_the_bound_is_not_close_though_both_are_in_the_top_k():
    far = [(61, {61: -0.5, 504: -2.5})]
    assert compare_greedy(REFERENCE, far).close  # vLLM's test: membership only
    got = compare_greedy(REFERENCE, far, max_gap=0.5)
    assert not got.close and got.tie_gap == 2.0 and "margin 2.000 nats > 0.5" in got.why


def test_a_token_outside_the_other_top_k_is_not_close_and_identical_answers_are():
    outside = [(7, {7: -0.1, 61: -3.0})]
    got = compare_greedy(REFERENCE, outside, max_gap=0.5)
    assert not got.close and got.tie_gap is None and "not in" in got.why
    same = compare_greedy(REFERENCE * 3, REFERENCE * 3, max_gap=0.5)
    assert same.close and same.first_difference is None and same.matched_prefix == 3
