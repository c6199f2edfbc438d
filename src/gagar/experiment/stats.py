"""Confidence intervals over seeds: Student-t intervals of a mean and of paired differences.

No SciPy here: the t quantile is found by bisection on the Student-t CDF, which is written with the
regularised incomplete beta function (continued fraction, Numerical Recipes §6.4).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

from pydantic import BaseModel

__all__ = ["Interval", "paired_difference", "student_t_cdf", "student_t_quantile", "t_interval"]


class Interval(BaseModel):
    """A mean and its two-sided confidence interval; ``low``/``high`` are None with fewer than 2 values."""

    mean: float
    low: float | None
    high: float | None
    n: int
    confidence: float

    @property
    def half_width(self) -> float | None:
        """Half the interval's width; None when there is no interval."""
        return None if self.low is None or self.high is None else (self.high - self.low) / 2


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz's method)."""
    tiny, eps = 1e-300, 1e-15
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def _regularised_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b) for ``0 <= x <= 1``."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(b, a, 1.0 - x) / b


def student_t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom.

    Raises:
        ValueError: ``df`` not positive.
    """
    if df <= 0:
        raise ValueError(f"degrees of freedom must be positive, got {df}")
    tail = 0.5 * _regularised_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


@functools.lru_cache(maxsize=256)
def student_t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection to 1e-12).

    Raises:
        ValueError: ``p`` outside (0, 1) or ``df`` not positive.
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"a quantile needs 0 < p < 1, got {p}")
    if df <= 0:
        raise ValueError(f"degrees of freedom must be positive, got {df}")
    if p < 0.5:
        return -student_t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while student_t_cdf(high, df) < p:
        low, high = high, high * 2.0
    while high - low > 1e-12 * max(1.0, high):
        mid = (low + high) / 2.0
        low, high = (mid, high) if student_t_cdf(mid, df) < p else (low, mid)
    return (low + high) / 2.0


def t_interval(values: Sequence[float], confidence: float = 0.95) -> Interval:
    """Mean of ``values`` (one per seed) with its Student-t confidence interval.

    ``mean ± t_{(1+c)/2, n-1} · s / √n`` with ``s`` the unbiased standard deviation; with a single
    value the mean has no interval (``low``/``high`` None).

    Raises:
        ValueError: no values, a non-finite value, or ``confidence`` outside (0, 1).
    """
    if not values:
        raise ValueError("a confidence interval needs at least one value")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"values must be finite, got {list(values)}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    n = len(values)
    mean = math.fsum(values) / n
    if n < 2:
        return Interval(mean=mean, low=None, high=None, n=n, confidence=confidence)
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    half = student_t_quantile((1.0 + confidence) / 2.0, n - 1) * sd / math.sqrt(n)
    return Interval(mean=mean, low=mean - half, high=mean + half, n=n, confidence=confidence)


def paired_difference(
    treatment: Sequence[float], control: Sequence[float], confidence: float = 0.95
) -> Interval:
    """Paired t-interval of ``treatment[i] - control[i]`` (the same seed ``i`` in both arms).

    Raises:
        ValueError: the sequences differ in length, or as :func:`t_interval`.
    """
    if len(treatment) != len(control):
        raise ValueError(f"paired values need equal lengths, got {len(treatment)} and {len(control)}")
    return t_interval([a - b for a, b in zip(treatment, control, strict=True)], confidence)
