"""Tests of day0.verdict.statistics: exact McNemar, Agresti-Min CI, Connor power, paired bootstrap."""

from __future__ import annotations

import json
import math
from statistics import NormalDist

import numpy as np
import pytest

from day0.verdict.statistics import (PairedTest, bootstrap_items_needed, bootstrap_mde, mcnemar,
                                     mcnemar_items_needed, mcnemar_mde, paired_bootstrap)

KW = dict(alpha=0.05, power=0.8)


def table(b: int, c: int, both: int = 0, neither: int = 0) -> tuple[list[int], list[int]]:
    """Paired correctness lists with the given 2x2 cells (b: ref right/target wrong)."""
    ref = [1] * b + [0] * c + [1] * both + [0] * neither
    tgt = [0] * b + [1] * c + [1] * both + [0] * neither
    return ref, tgt


# ---- exact McNemar ----------------------------------------------------------------------------

@pytest.mark.parametrize("b,c", [(0, 1), (1, 0), (1, 1), (3, 0), (9, 1), (5, 5), (2, 12), (20, 2),
                                 (40, 25), (100, 70), (300, 280), (1100, 1000), (1001, 1000)])
def test_exact_p_matches_scipy(b, c):
    from scipy.stats import binomtest

    r = mcnemar(*table(b, c, both=7, neither=3), allowed_drop=0.05)
    assert (r.b, r.c) == (b, c)
    assert r.p_value == pytest.approx(binomtest(b, b + c, 0.5, alternative="greater").pvalue, rel=1e-9)


@pytest.mark.parametrize("b,c", [(50_500, 49_500), (50_000, 50_000), (49_000, 51_000), (100_000, 0)])
def test_large_counts_no_overflow(b, c):
    from scipy.stats import binomtest

    r = mcnemar(*table(b, c), allowed_drop=0.01)
    expected = binomtest(b, b + c, 0.5, alternative="greater").pvalue
    assert math.isfinite(r.p_value) and 0 <= r.p_value <= 1
    assert r.p_value == pytest.approx(expected, rel=1e-7, abs=1e-300)


def test_no_discordance_p_one_and_identical_drop_zero():
    r = mcnemar([1, 0, 1, 1], [1, 0, 1, 1], allowed_drop=0.1)
    assert r.b == r.c == 0 and r.p_value == 1.0 and r.regressed is False
    assert r.drop == 0.0 and r.reference_score == r.target_score == 0.75
    assert r.ci_low < 0 < r.ci_high


def test_clear_regression_and_symmetric():
    bad = mcnemar(*table(20, 2, both=60, neither=18), allowed_drop=0.1)
    assert bad.n == 100 and bad.regressed is True and bad.p_value < 1e-3
    assert bad.drop == pytest.approx(0.18)
    assert bad.reference_score == pytest.approx(0.80) and bad.target_score == pytest.approx(0.62)
    assert bad.ci_low > 0
    sym = mcnemar(*table(10, 10, both=60, neither=20), allowed_drop=0.1)
    assert sym.regressed is False and sym.drop == 0.0 and sym.p_value > 0.5
    # p = 299/4096 = 0.073: fails only a gate at alpha 0.1
    edge = mcnemar(*table(9, 3, both=30), allowed_drop=0.1)
    assert edge.p_value == pytest.approx(299 / 4096) and edge.regressed is False
    assert mcnemar(*table(9, 3, both=30), allowed_drop=0.1, alpha=0.1).regressed is True
    better = mcnemar(*table(2, 20, both=60, neither=18), allowed_drop=0.1)
    assert better.regressed is False and better.drop < 0 and better.p_value > 0.99


def test_accepts_bool_and_float_and_numpy():
    ref = [True, True, 1.0, np.int64(1), np.bool_(False)]
    tgt = [False, 1, 0.0, np.float64(1.0), False]
    r = mcnemar(ref, tgt, allowed_drop=0.1)
    assert (r.b, r.c, r.n) == (2, 0, 5)


def test_summary_and_json():
    r = mcnemar(*table(9, 1, both=30, neither=8), allowed_drop=0.1)
    s = r.summary()
    assert "drop 0.167" in s and "(90% CI)" in s and "< alpha 0.05" in s
    assert "exact McNemar, b=9 c=1, n=48" in s and "at power 0.8" in s
    assert "underpowered" in s and f"needs {r.items_needed} items" in s  # MDE at n=48 > 0.1
    ok = mcnemar(*table(1, 1, both=10), allowed_drop=0.5, discordance=0.2)
    assert ">= alpha" in ok.summary() and "underpowered" not in ok.summary()
    # inf serialises as a string and round-trips
    tiny = mcnemar([1], [1], allowed_drop=0.1)
    assert tiny.mde == math.inf
    data = json.loads(tiny.model_dump_json())
    assert data["mde"] == "Infinity"
    assert PairedTest.model_validate_json(tiny.model_dump_json()).mde == math.inf


# ---- Connor power / MDE ----------------------------------------------------------------------

def test_connor_closed_form():
    za, zb = NormalDist().inv_cdf(0.95), NormalDist().inv_cdf(0.8)
    pd, d = 0.1, 0.01
    by_hand = (za * math.sqrt(pd) + zb * math.sqrt(pd - d * d)) ** 2 / d ** 2
    assert 6180 < by_hand < 6181
    assert mcnemar_items_needed(0.01, alpha=0.05, power=0.8, discordance=0.1) == math.ceil(by_hand) == 6181


@pytest.mark.parametrize("d,pd", [(0.01, 0.1), (0.02, 0.05), (0.05, 0.3), (0.03, 0.2)])
def test_mde_items_needed_inverse(d, pd):
    n = mcnemar_items_needed(d, discordance=pd, **KW)
    assert mcnemar_mde(n, discordance=pd, **KW) <= d
    assert mcnemar_mde(n - 50, discordance=pd, **KW) > d


def test_mde_decreases_with_n_and_grows_with_discordance():
    mdes = [mcnemar_mde(n, discordance=0.1, **KW) for n in (10, 40, 100, 1000, 10000)]
    assert all(a > b for a, b in zip(mdes, mdes[1:]))
    assert mcnemar_mde(500, discordance=0.3, **KW) > mcnemar_mde(500, discordance=0.1, **KW)
    assert mcnemar_items_needed(0.02, discordance=0.3, **KW) > mcnemar_items_needed(0.02, discordance=0.1, **KW)


def test_mde_floor_and_unsolvable():
    assert mcnemar_mde(2, discordance=0.1, **KW) == math.inf  # n < z_{1-alpha}^2: nothing detectable
    # with full discordance the Connor MDE at n=3 is < 1/3 is impossible; the floor is 1/n
    assert mcnemar_mde(3, discordance=1.0, **KW) >= 1 / 3
    # Connor alone would give ~0.072 at n=10, pd=0.01; a drop below 1/n cannot be observed
    assert mcnemar_mde(10, discordance=0.01, **KW) == pytest.approx(0.1)
    assert mcnemar_mde(10, discordance=0.02, **KW) < mcnemar_mde(10, discordance=0.04, **KW)
    # items_needed past sqrt(pd) is still computed (pd - d^2 clipped at 0), at least ceil(1/d)
    assert mcnemar_items_needed(0.5, discordance=0.1, **KW) >= 2


def test_one_point_drop_on_40_items_underpowered():
    assert mcnemar_mde(40, discordance=0.1, **KW) > 0.01
    assert mcnemar_items_needed(0.01, discordance=0.1, **KW) > 40
    r = mcnemar(*table(1, 0, both=30, neither=9), allowed_drop=0.01)
    assert r.underpowered and r.items_needed > 40 and r.mde > 0.01


def test_observed_discordance_used_when_larger():
    r = mcnemar(*table(30, 20, both=30, neither=20), allowed_drop=0.05, discordance=0.1)
    assert r.discordance == pytest.approx(0.5)
    assert r.mde == mcnemar_mde(100, discordance=0.5, **KW)
    assert r.items_needed == mcnemar_items_needed(0.05, discordance=0.5, **KW)
    low = mcnemar(*table(1, 0, both=99), allowed_drop=0.05, discordance=0.2)
    assert low.discordance == 0.2


# ---- Agresti-Min CI --------------------------------------------------------------------------

@pytest.mark.parametrize("b,c,both,neither", [(0, 0, 5, 5), (1, 0, 0, 0), (10, 0, 0, 0), (0, 10, 0, 0),
                                              (200, 0, 0, 0), (20, 2, 60, 18), (3, 4, 50, 43),
                                              (0, 500, 0, 0), (9, 1, 30, 8)])
def test_ci_contains_drop_within_bounds(b, c, both, neither):
    r = mcnemar(*table(b, c, both, neither), allowed_drop=0.1)
    assert -1 <= r.ci_low <= r.drop <= r.ci_high <= 1
    assert r.confidence == pytest.approx(0.9)


def test_ci_agresti_min_values():
    r = mcnemar(*table(9, 1, both=30, neither=8), allowed_drop=0.1)
    m = 50
    p12, p21 = 9.5 / m, 1.5 / m
    half = NormalDist().inv_cdf(0.95) * math.sqrt((p12 + p21 - (p12 - p21) ** 2) / m)
    assert r.ci_low == pytest.approx(p12 - p21 - half) and r.ci_high == pytest.approx(p12 - p21 + half)


def test_ci_coverage_simulation():
    rng = np.random.default_rng(1234)
    probs = [0.08, 0.04, 0.7, 0.18]  # b, c, both, neither: true drop 0.04
    true = probs[0] - probs[1]
    hits = 0
    for _ in range(400):
        b, c, both, neither = rng.multinomial(200, probs)
        r = mcnemar(*table(int(b), int(c), int(both), int(neither)), allowed_drop=0.05)
        hits += r.ci_low <= true <= r.ci_high
    assert 0.85 <= hits / 400 <= 0.95


# ---- paired bootstrap ------------------------------------------------------------------------

def test_bootstrap_deterministic():
    rng = np.random.default_rng(0)
    ref = rng.normal(0.5, 0.2, 300).tolist()
    tgt = (np.array(ref) - 0.01 + rng.normal(0, 0.05, 300)).tolist()
    a = paired_bootstrap(ref, tgt, allowed_drop=0.02, iterations=2000, seed=7)
    b = paired_bootstrap(ref, tgt, allowed_drop=0.02, iterations=2000, seed=7)
    assert a == b
    c = paired_bootstrap(ref, tgt, allowed_drop=0.02, iterations=2000, seed=8)
    assert (c.ci_low, c.ci_high) != (a.ci_low, a.ci_high)


def test_bootstrap_clear_shift():
    rng = np.random.default_rng(1)
    ref = rng.normal(0.6, 0.1, 500)
    tgt = ref - 0.05 + rng.normal(0, 0.05, 500)
    r = paired_bootstrap(ref.tolist(), tgt.tolist(), allowed_drop=0.02)
    assert r.test == "bootstrap" and r.p_value < 0.01 and r.regressed
    assert 0 < r.ci_low < r.drop < r.ci_high
    assert r.drop == pytest.approx(float(np.mean(ref - tgt)))
    assert r.sd == pytest.approx(float(np.std(ref - tgt, ddof=1)))
    assert "paired bootstrap" in r.summary()
    # the percentile CI at confidence 1 - 2*alpha is close to the normal one: mean +- z_{0.95} * se
    se = r.sd / math.sqrt(r.n)
    assert r.ci_high - r.ci_low == pytest.approx(2 * NormalDist().inv_cdf(0.95) * se, rel=0.07)
    assert (r.ci_low + r.ci_high) / 2 == pytest.approx(r.drop, abs=0.2 * se)


def test_bootstrap_no_shift():
    rng = np.random.default_rng(2)
    ref = rng.normal(0.6, 0.1, 400)
    noise = rng.normal(0, 0.05, 200)
    tgt = ref + np.concatenate([noise, -noise])  # symmetric noise: mean drop exactly 0
    r = paired_bootstrap(ref.tolist(), tgt.tolist(), allowed_drop=0.02)
    assert r.p_value > 0.2 and not r.regressed
    assert r.ci_low < 0 < r.ci_high
    same = paired_bootstrap(ref.tolist(), ref.tolist(), allowed_drop=0.02, iterations=500)
    assert same.drop == 0 and same.p_value == 1.0 and same.sd == 0 and same.mde == 0


def test_bootstrap_lower_is_better_flips_sign():
    rng = np.random.default_rng(3)
    ref = rng.normal(2.0, 0.3, 300)
    tgt = ref + 0.1 + rng.normal(0, 0.05, 300)  # e.g. perplexity: target higher = worse
    up = paired_bootstrap(ref.tolist(), tgt.tolist(), allowed_drop=0.05, iterations=2000)
    down = paired_bootstrap(ref.tolist(), tgt.tolist(), allowed_drop=0.05, iterations=2000,
                            higher_is_better=False)
    assert up.drop == pytest.approx(-down.drop) and down.drop > 0
    assert down.regressed and not up.regressed


def test_bootstrap_large_n_chunked():
    rng = np.random.default_rng(4)
    ref = rng.normal(0.5, 0.1, 20000)
    r = paired_bootstrap(ref, ref - 0.001, allowed_drop=0.01, iterations=300)
    assert r.n == 20000 and r.drop == pytest.approx(0.001) and r.regressed


def test_bootstrap_rejects_nonfinite():
    with pytest.raises(ValueError, match=r"target\[2\]"):
        paired_bootstrap([1.0, 2.0, 3.0], [1.0, 2.0, float("nan")], allowed_drop=0.1)
    with pytest.raises(ValueError, match=r"reference\[0\]"):
        paired_bootstrap([float("inf"), 2.0], [1.0, 2.0], allowed_drop=0.1)
    with pytest.raises(ValueError, match=r"reference\[1\]"):
        paired_bootstrap([1.0, "x"], [1.0, 2.0], allowed_drop=0.1)


@pytest.mark.parametrize("d,sd", [(0.01, 0.1), (0.05, 0.3), (0.002, 0.02)])
def test_bootstrap_mde_inverse(d, sd):
    n = bootstrap_items_needed(d, sd, **KW)
    assert bootstrap_mde(n, sd, **KW) <= d
    assert bootstrap_mde(n - 1, sd, **KW) > d
    za, zb = NormalDist().inv_cdf(0.95), NormalDist().inv_cdf(0.8)
    assert bootstrap_mde(100, sd, **KW) == pytest.approx((za + zb) * sd / 10)
    assert bootstrap_items_needed(d, 0.0, **KW) == 1 and bootstrap_mde(10, 0.0, **KW) == 0


def test_bootstrap_single_item():
    r = paired_bootstrap([1.0], [0.5], allowed_drop=0.1, iterations=100)
    assert r.sd == 0 and r.drop == 0.5 and r.ci_low == r.ci_high == 0.5


# ---- bad arguments ---------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,msg", [
    (dict(alpha=0.6), "alpha"), (dict(alpha=0.0), "alpha"), (dict(power=0.3), "power"),
    (dict(power=1.0), "power"), (dict(allowed_drop=0.0), "allowed_drop"),
    (dict(allowed_drop=-0.1), "allowed_drop")])
def test_bad_arguments(kwargs, msg):
    args = dict(allowed_drop=0.1) | kwargs
    with pytest.raises(ValueError, match=msg):
        mcnemar([1, 0], [1, 1], **args)
    with pytest.raises(ValueError, match=msg):
        paired_bootstrap([1.0, 0.0], [1.0, 1.0], **args)


def test_bad_inputs():
    with pytest.raises(ValueError, match="paired"):
        mcnemar([1, 0, 1], [1, 0], allowed_drop=0.1)
    with pytest.raises(ValueError, match="paired"):
        paired_bootstrap([1.0], [1.0, 2.0], allowed_drop=0.1)
    with pytest.raises(ValueError, match="no items"):
        mcnemar([], [], allowed_drop=0.1)
    with pytest.raises(ValueError, match=r"target\[1\]"):
        mcnemar([1, 0], [1, 2], allowed_drop=0.1)
    with pytest.raises(ValueError, match=r"reference\[0\]"):
        mcnemar([0.5, 0], [1, 1], allowed_drop=0.1)
    with pytest.raises(ValueError, match=r"reference\[1\]"):
        mcnemar([1, "1"], [1, 1], allowed_drop=0.1)
    with pytest.raises(ValueError, match="discordance"):
        mcnemar([1], [1], allowed_drop=0.1, discordance=0.0)
    with pytest.raises(ValueError, match="n must"):
        mcnemar_mde(0, discordance=0.1, **KW)
    with pytest.raises(ValueError, match="alpha"):
        mcnemar_items_needed(0.01, alpha=0.5, power=0.8, discordance=0.1)
