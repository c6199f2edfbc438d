"""Student-t quantiles and intervals against tables, invariances and a coverage simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gagar.experiment.stats import (
    paired_difference,
    student_t_cdf,
    student_t_quantile,
    t_interval,
)

finite = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_infinity=False)
samples = st.lists(finite, min_size=2, max_size=12)


@pytest.mark.parametrize(
    ("df", "expected"),
    [(1, 12.7062), (2, 4.3027), (3, 3.1824), (4, 2.7764), (9, 2.2622), (29, 2.0452), (10**6, 1.9600)],
)
def test_quantile_matches_the_t_table(df, expected):
    assert student_t_quantile(0.975, df) == pytest.approx(expected, abs=1e-4)


def test_quantile_of_other_levels_and_the_cauchy_case():
    assert student_t_quantile(0.95, 5) == pytest.approx(2.0150, abs=1e-4)
    assert student_t_quantile(0.995, 2) == pytest.approx(9.9248, abs=1e-4)
    # df = 1 is the Cauchy distribution: F(t) = 1/2 + atan(t)/pi.
    for t in (-3.0, -0.5, 0.0, 0.7, 10.0):
        assert student_t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.floats(min_value=0.001, max_value=0.999), st.integers(min_value=1, max_value=200))
def test_cdf_inverts_quantile_and_is_symmetric(p, df):
    q = student_t_quantile(p, df)
    assert student_t_cdf(q, df) == pytest.approx(p, abs=1e-9)
    assert student_t_quantile(1 - p, df) == pytest.approx(-q, abs=1e-9)


@settings(max_examples=80, deadline=None)
@given(samples, finite)
def test_interval_is_centred_on_the_mean_and_moves_with_a_shift(values, shift):
    base = t_interval(values)
    assert base.low <= base.mean <= base.high
    assert base.mean == pytest.approx(sum(values) / len(values), abs=1e-9)
    assert base.mean - base.low == pytest.approx(base.high - base.mean, abs=1e-9)
    moved = t_interval([v + shift for v in values])
    assert moved.low == pytest.approx(base.low + shift, abs=1e-6)
    assert moved.high == pytest.approx(base.high + shift, abs=1e-6)


@settings(max_examples=60, deadline=None)
@given(samples)
def test_a_higher_confidence_never_gives_a_narrower_interval(values):
    narrow, wide = t_interval(values, 0.8), t_interval(values, 0.99)
    assert wide.low <= narrow.low + 1e-9
    assert narrow.high <= wide.high + 1e-9


@settings(max_examples=60, deadline=None)
@given(samples, samples)
def test_paired_difference_is_the_interval_of_the_differences(a, b):
    n = min(len(a), len(b))
    a, b = a[:n], b[:n]
    paired = paired_difference(a, b)
    direct = t_interval([x - y for x, y in zip(a, b, strict=True)])
    assert (paired.mean, paired.low, paired.high) == pytest.approx((direct.mean, direct.low, direct.high))
    same = paired_difference(a, a)
    assert same.mean == 0
    assert same.low == 0
    assert same.high == 0


def test_a_seed_effect_shared_by_both_arms_cancels_in_the_paired_interval():
    seed_effect = [0.0, 30.0, -25.0]
    control = [10 + e for e in seed_effect]
    treatment = [12 + e for e in seed_effect]
    assert paired_difference(treatment, control).half_width == pytest.approx(0.0, abs=1e-9)
    assert t_interval(treatment).half_width > 20


def test_ninety_five_percent_intervals_cover_the_mean_about_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    covered = 0
    for _ in range(3000):
        values = rng.normal(loc=5.0, scale=2.0, size=3).tolist()
        i = t_interval(values)
        covered += i.low <= 5.0 <= i.high
    assert 0.935 <= covered / 3000 <= 0.965


def test_one_value_has_a_mean_but_no_interval_and_bad_input_is_refused():
    one = t_interval([0.25])
    assert (one.mean, one.low, one.high, one.half_width) == (0.25, None, None, None)
    with pytest.raises(ValueError, match="at least one value"):
        t_interval([])
    with pytest.raises(ValueError, match="finite"):
        t_interval([1.0, math.nan])
    with pytest.raises(ValueError, match="confidence"):
        t_interval([1.0, 2.0], confidence=1.0)
    with pytest.raises(ValueError, match="equal lengths"):
        paired_difference([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="0 < p < 1"):
        student_t_quantile(1.0, 3)
    with pytest.raises(ValueError, match="degrees of freedom"):
        student_t_cdf(0.0, 0)
