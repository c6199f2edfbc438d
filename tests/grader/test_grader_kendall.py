"""mean_interval: the bootstrap interval of a mean over groups."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from gagar.grader.kendall import mean_interval


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(min_value=-1, max_value=1), min_size=1, max_size=40))
def test_the_interval_lies_within_the_values(values: list[float]) -> None:
    low, high = mean_interval(values, resamples=500)
    assert min(values) - 1e-9 <= low <= high <= max(values) + 1e-9


def test_the_interval_narrows_with_more_groups_and_ignores_nan() -> None:
    few = mean_interval([0.0, 1.0] * 5)
    assert few[0] < 0.5 < few[1]
    many = mean_interval([0.0, 1.0] * 200)
    assert many[1] - many[0] < (few[1] - few[0]) / 3
    assert mean_interval([0.5, math.nan, 0.5]) == (0.5, 0.5)
    assert all(math.isnan(v) for v in mean_interval([math.nan]))
