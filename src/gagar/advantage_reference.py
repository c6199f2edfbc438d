"""Plain per-group loop versions of :mod:`gagar.advantage`, written straight from DESIGN.md §4.

They are slow and obvious on purpose: the tests check that the vectorised functions
agree with them, and ``benchmarks/advantage.py`` measures the speed-up against them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Sequence

__all__ = ["grpo_advantages_loop", "keep_mixed_groups_loop", "redistribute_loop", "tiered_redistribute_loop"]


def _groups(group_ids: Sequence[Hashable]) -> dict[Hashable, list[int]]:
    members: dict[Hashable, list[int]] = defaultdict(list)
    for i, g in enumerate(group_ids):
        members[g].append(i)
    return members


def grpo_advantages_loop(
    rewards: Sequence[float], group_ids: Sequence[Hashable], *, norm_std: bool = True, eps: float = 1e-6
) -> list[float]:
    out = [0.0] * len(rewards)
    for idx in _groups(group_ids).values():
        if len(idx) < 2:
            continue
        rs = [float(rewards[i]) for i in idx]
        mean = sum(rs) / len(rs)
        std = math.sqrt(sum((r - mean) ** 2 for r in rs) / (len(rs) - 1))
        for i, r in zip(idx, rs, strict=True):
            out[i] = (r - mean) / (std + eps) if norm_std else r - mean
    return out


def keep_mixed_groups_loop(rewards: Sequence[float], group_ids: Sequence[Hashable]) -> list[bool]:
    out = [False] * len(rewards)
    for idx in _groups(group_ids).values():
        passes = sum(1 for i in idx if rewards[i] == 1)
        for i in idx:
            out[i] = 0 < passes < len(idx)
    return out


def _weight(decay: str, rank: float, best: float, worst: float, gamma: float, floor: float) -> float:
    if decay == "geometric":
        return gamma ** (rank - best)
    if worst == best:
        return 1.0
    return 1.0 - (1.0 - floor) * (rank - best) / (worst - best)


def redistribute_loop(
    advantages: Sequence[float],
    passed: Sequence[bool],
    group_ids: Sequence[Hashable],
    ranks: Sequence[float],
    *,
    decay: str = "geometric",
    gamma: float = 0.5,
    floor: float = 0.1,
    scores: Sequence[float] | None = None,
) -> list[float]:
    out = [float(a) for a in advantages]
    for idx in _groups(group_ids).values():
        winners = [i for i in idx if passed[i]]
        if not winners or any(advantages[i] <= 0 for i in winners):
            continue
        # For "score", the weight is linear in the negated score, so the best score gets 1.
        key = {i: (-scores[i] if decay == "score" else ranks[i]) for i in winners}  # type: ignore[index]
        best, worst = min(key.values()), max(key.values())
        w = {i: _weight(decay, key[i], best, worst, gamma, floor) for i in winners}
        total = sum(advantages[i] for i in winners)
        weighted = sum(advantages[i] * w[i] for i in winners)
        for i in winners:
            out[i] = advantages[i] * w[i] * total / weighted
    return out


def tiered_redistribute_loop(
    rewards: Sequence[float],
    group_ids: Sequence[Hashable],
    ranks: Sequence[float],
    *,
    tier1_best: float = 1.0,
    tier1_rest: float = 0.9,
    tier2_top: float = 0.85,
    tier2_bottom: float = 0.4,
    tier3: float = 0.2,
    cutoffs: tuple[float, float] = (1 / 3, 2 / 3),
    lambda_max: float = 1.5,
) -> list[float]:
    out = grpo_advantages_loop(rewards, group_ids, norm_std=False)
    for idx in _groups(group_ids).values():
        winners = [i for i in idx if rewards[i] == 1]
        if not winners or any(math.isnan(ranks[i]) for i in winners) or any(out[i] <= 0 for i in winners):
            continue
        k = len(winners)
        tier = {
            i: 1 if (ranks[i] - 1) / k < cutoffs[0] else 2 if (ranks[i] - 1) / k < cutoffs[1] else 3
            for i in winners
        }
        best1 = min((ranks[i] for i in winners if tier[i] == 1), default=None)
        in2 = [ranks[i] for i in winners if tier[i] == 2]
        factor = {}
        for i in winners:
            if tier[i] == 1:
                factor[i] = tier1_best if ranks[i] == best1 else tier1_rest
            elif tier[i] == 2:
                lo, hi = min(in2), max(in2)
                along = (ranks[i] - lo) / (hi - lo) if hi > lo else 0.0
                factor[i] = tier2_top - (tier2_top - tier2_bottom) * along
            else:
                factor[i] = tier3
        total = sum(out[i] for i in winners)
        lam = min(total / sum(out[i] * factor[i] for i in winners), lambda_max)
        for i in winners:
            out[i] = out[i] * factor[i] * lam
        mean = sum(out[i] for i in idx) / len(idx)
        for i in idx:
            out[i] -= mean
    return out
