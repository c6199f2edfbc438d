"""Plain per-group loop versions of :mod:`gagar.advantage`, written straight from DESIGN.md §4.

They are slow and obvious on purpose: the tests check that the vectorised functions
agree with them, and ``benchmarks/advantage.py`` measures the speed-up against them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Sequence

__all__ = ["grpo_advantages_loop", "keep_mixed_groups_loop", "redistribute_loop"]


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
