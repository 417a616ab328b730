"""Paired target-vs-control statistics: block bootstrap bounds behave as a gate needs."""

from __future__ import annotations

import math

import torch

from day0.torchkit.paired import Blocks, mean_excess, ratios, worst


def _blocks(n: int, windows: int = 2, buckets: int = 4, size: int = 32) -> Blocks:
    per = n // windows
    window_of = torch.arange(n) // per
    bucket_of = (torch.arange(n) % per) * buckets // per
    return Blocks.build(window_of, bucket_of, size)


def test_blocks_never_cross_a_window_or_bucket():
    blocks = _blocks(1000, windows=2, buckets=4, size=32)
    window_of = torch.arange(1000) // 500
    for b in range(blocks.n_blocks):
        members = (blocks.block_of == b).nonzero().flatten()
        assert 1 <= members.numel() <= 32
        assert window_of[members].unique().numel() == 1
        assert (members.diff() == 1).all()


def test_same_distribution_gives_a_bound_below_one_and_triple_error_is_caught():
    gen = torch.Generator().manual_seed(0)
    control = torch.rand(4096, generator=gen).pow(4) * 1e-3      # skewed, like per-position KL
    same = torch.rand(4096, generator=gen).pow(4) * 1e-3
    blocks = _blocks(4096)
    equal = ratios(["kl"], same, control, blocks, floor=1e-6)[0]
    assert equal.low < 1.0 < equal.high
    assert 0.8 < equal.ratio < 1.25
    worse = ratios(["kl"], 3 * same, control, blocks, floor=1e-6)[0]
    assert worse.low > 2.0 and worse.ratio == 3 * equal.ratio or \
        math.isclose(worse.ratio, 3 * equal.ratio, rel_tol=1e-9)


def test_floor_keeps_an_exact_control_from_inflating_noise():
    blocks = _blocks(512)
    control = torch.zeros(512)                          # float32 target: control == reference
    noise = torch.full((512,), 1e-9)
    r = ratios(["kl"], noise, control, blocks, floor=1e-6)[0]
    assert r.ratio == r.low == r.high and math.isclose(r.ratio, 1e-3, rel_tol=1e-6)
    zero = ratios(["kl"], control, control, blocks, floor=1e-6)[0]
    assert zero.ratio == 0.0


def test_columns_are_independent():
    blocks = _blocks(512)
    control = torch.full((512, 2), 0.01)                # per-position relative errors
    target = torch.stack([torch.full((512,), 0.02), torch.full((512,), 0.01)], 1)
    rows = ratios(["a", "b"], target, control, blocks, floor=1e-6)
    assert math.isclose(rows[0].ratio, 2.0, rel_tol=1e-6)
    assert math.isclose(rows[1].ratio, 1.0, rel_tol=1e-6)
    assert math.isclose(rows[0].target, 0.02, rel_tol=1e-6)
    assert math.isclose(rows[0].control, 0.01, rel_tol=1e-6)
    assert worst(rows).metric == "a"


def test_subset_restricts_to_one_bucket():
    blocks = _blocks(1024, windows=1, buckets=4)
    target = torch.ones(1024)
    target[768:] = 50.0                                 # only the last bucket is bad
    control = torch.ones(1024)
    first = ratios(["b0"], target, control, blocks, 1e-6, blocks.bucket_of_block == 0)[0]
    last = ratios(["b3"], target, control, blocks, 1e-6, blocks.bucket_of_block == 3)[0]
    assert first.ratio == 1.0 and last.low == 50.0 and last.positions == 256


def test_nan_in_the_target_makes_the_bound_infinite():
    blocks = _blocks(256)
    target = torch.ones(256)
    target[7] = math.nan
    r = ratios(["kl"], target, torch.ones(256), blocks, 1e-6)[0]
    assert math.isinf(r.low) and math.isnan(r.ratio)
    assert worst([ratios(["ok"], torch.ones(256), torch.ones(256), blocks, 1e-6)[0], r]) is r


def test_mean_excess_is_the_perplexity_ratio():
    blocks = _blocks(2048)
    gen = torch.Generator().manual_seed(1)
    control = torch.rand(2048, generator=gen) * 4
    r = mean_excess("perplexity", control + 0.01, control, blocks)
    assert math.isclose(r.ratio, math.exp(0.01), rel_tol=1e-6)  # float32 inputs
    assert r.low <= r.ratio <= r.high
    same = mean_excess("perplexity", control, control, blocks)
    assert same.ratio == same.low == same.high == 1.0


def test_bootstrap_is_reproducible():
    blocks = _blocks(1024)
    gen = torch.Generator().manual_seed(2)
    a, b = torch.rand(1024, generator=gen), torch.rand(1024, generator=gen)
    assert ratios(["x"], a, b, blocks, 1e-6) == ratios(["x"], a, b, blocks, 1e-6)
