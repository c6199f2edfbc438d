"""Rank agreement: Kendall's tau-b with ties, the Kendall distance between rankings, top-1 accuracy.

All functions take per-candidate *scores* where higher is better (pass ``-rank`` for ranks).
They are written as plain pair loops: groups have a handful of candidates.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

__all__ = [
    "kendall_distance",
    "kendall_tau_b",
    "mean_ignoring_nan",
    "mean_interval",
    "scores_from_ranking",
    "top1_correct",
]


def _sign(x: float) -> int:
    return int(x > 0) - int(x < 0)


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b of two paired score lists ``(n,)``; NaN when either side is all tied.

    ``tau_b = (n_c - n_d) / sqrt((n_0 - t_x) (n_0 - t_y))`` with ``n_0 = n (n - 1) / 2`` pairs,
    ``t_x``/``t_y`` the pairs tied in ``x``/``y``, ``n_c``/``n_d`` concordant/discordant pairs.
    """
    if len(x) != len(y):
        raise ValueError(f"x has {len(x)} entries but y has {len(y)}")
    n = len(x)
    concordant = discordant = tied_x = tied_y = 0
    for i in range(n):
        for j in range(i + 1, n):
            sx, sy = _sign(x[i] - x[j]), _sign(y[i] - y[j])
            tied_x += sx == 0
            tied_y += sy == 0
            concordant += sx * sy > 0
            discordant += sx * sy < 0
    pairs = n * (n - 1) // 2
    denominator = math.sqrt((pairs - tied_x) * (pairs - tied_y))
    return (concordant - discordant) / denominator if denominator > 0 else math.nan


def kendall_distance(a: Mapping[str, float], b: Mapping[str, float]) -> float:
    """Share of candidate pairs that ``a`` and ``b`` order oppositely, in [0, 1]; a tie on one side
    and an order on the other counts half. ``a`` and ``b`` must score the same ids."""
    if set(a) != set(b):
        raise ValueError(f"the rankings score different candidates: {sorted(set(a) ^ set(b))}")
    ids = sorted(a)
    pairs = len(ids) * (len(ids) - 1) // 2
    if pairs == 0:
        return 0.0
    disagreement = 0.0
    for i, u in enumerate(ids):
        for v in ids[i + 1 :]:
            sa, sb = _sign(a[u] - a[v]), _sign(b[u] - b[v])
            disagreement += 1.0 if sa * sb < 0 else 0.5 if sa != sb else 0.0
    return disagreement / pairs


def scores_from_ranking(ranking: Sequence[Sequence[str]]) -> dict[str, float]:
    """Scores that order like ``ranking``: minus the competition rank (tiers best first)."""
    out: dict[str, float] = {}
    rank = 1
    for tier in ranking:
        for tid in tier:
            out[tid] = -float(rank)
        rank += len(tier)
    return out


def top1_correct(predicted: Mapping[str, float], truth: Mapping[str, float]) -> bool:
    """Whether every candidate the prediction puts first is among the truth's best."""
    if set(predicted) != set(truth):
        differ = sorted(set(predicted) ^ set(truth))
        raise ValueError(f"predicted and truth score different candidates: {differ}")
    best_p, best_t = max(predicted.values()), max(truth.values())
    return all(truth[t] == best_t for t, s in predicted.items() if s == best_p)


def mean_ignoring_nan(values: Sequence[float]) -> float:
    """Mean of the finite values; NaN when there is none."""
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else math.nan


def mean_interval(
    values: Sequence[float], confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """A percentile bootstrap interval of the mean of ``values`` (NaN left out), resampling them with
    replacement ``resamples`` times; (NaN, NaN) with no value."""
    import numpy as np

    kept = np.asarray([v for v in values if not math.isnan(v)], dtype=float)
    if kept.size == 0:
        return math.nan, math.nan
    means = np.random.default_rng(seed).choice(kept, size=(resamples, kept.size)).mean(axis=1)
    tail = (1.0 - confidence) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(low), float(high)
