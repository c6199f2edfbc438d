"""One interface for every grader, and the wrapper that makes grading safe for training.

A grader ranks the passing candidates of one group's workspace and may fail by raising
:class:`GraderFailure` (or anything else). :func:`grade_group` turns every outcome into a
:class:`~gagar.schema.grade.Grade`: a group with fewer than two passing candidates gets a
trivial grade without a grader call; a failure, an invalid ranking or (with the position-bias
guard) two disagreeing orderings become an all-way tie — GRPO for that group — with the reason
recorded and counted. Grading never raises for a bad grader.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gagar.grader.kendall import kendall_distance, scores_from_ranking
from gagar.grader.workspace import GroupWorkspace
from gagar.schema.grade import Grade, RankingError, tie_grade, validate_ranking

__all__ = [
    "Grader",
    "GraderFailure",
    "GraderMetrics",
    "PositionGuard",
    "Ranking",
    "grade_group",
    "scores_agree",
]


class GraderFailure(RuntimeError):
    """A grader that could not produce a ranking; ``reason`` is a short code (``timeout``, ...)."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


@dataclass
class Ranking:
    """What a grader returns: tiers of trajectory ids (best first), optional scores, evidence."""

    tiers: list[list[str]]
    scores: dict[str, float] | None = None
    evidence: dict[str, str] = field(default_factory=dict)


class Grader(Protocol):
    """Ranks the passing candidates of a group. ``order`` is the order to present them in."""

    name: str
    version: str

    def rank(self, ws: GroupWorkspace, order: Sequence[str]) -> Ranking: ...


@dataclass(frozen=True)
class PositionGuard:
    """Grade twice, the second time with the candidates in reverse order; tie when the two
    rankings' Kendall distance exceeds ``threshold``, else merge them by mean rank."""

    threshold: float = 0.34


@dataclass
class GraderMetrics:
    """Counts and time across the groups graded, as ``grader/…`` metric keys."""

    groups: int = 0
    trivial: int = 0
    fallbacks: Counter[str] = field(default_factory=Counter)
    guard_checks: int = 0
    guard_disagreements: int = 0
    duration_s: float = 0.0

    def add(self, grade: Grade) -> None:
        self.groups += 1
        self.trivial += grade.grader == "trivial"
        if grade.fallback:
            self.fallbacks[grade.fallback_reason or "unspecified"] += 1
        self.duration_s += grade.duration_s

    def as_dict(self) -> dict[str, float]:
        out: dict[str, float] = {
            "grader/groups": self.groups,
            "grader/trivial": self.trivial,
            "grader/fallbacks": sum(self.fallbacks.values()),
            "grader/duration_s": self.duration_s,
            "grader/position_checks": self.guard_checks,
            "grader/position_disagreements": self.guard_disagreements,
        }
        out.update({f"grader/fallbacks/{reason}": n for reason, n in sorted(self.fallbacks.items())})
        return out


def scores_agree(tiers: Sequence[Sequence[str]], scores: dict[str, float]) -> bool:
    """Whether ``scores`` order the candidates like ``tiers``: equal within a tier, lower in worse tiers."""
    values = [[scores[t] for t in tier] for tier in tiers]
    if any(len(set(v)) > 1 for v in values):
        return False
    heads = [v[0] for v in values]
    return all(a > b for a, b in itertools.pairwise(heads))


def _checked(ranking: Ranking, passing: Sequence[str]) -> Ranking:
    tiers = validate_ranking(passing, ranking.tiers)
    scores = ranking.scores
    if scores is not None and (set(scores) != set(passing) or not scores_agree(tiers, scores)):
        scores = None  # scores that contradict the ranking are dropped; the ranking stands
    return Ranking(tiers, scores, ranking.evidence)


def _merge(first: Ranking, second: Ranking) -> Ranking:
    """Tiers by mean rank of the two rankings; scores are dropped (they were per ordering)."""
    r1, r2 = scores_from_ranking(first.tiers), scores_from_ranking(second.tiers)
    mean = {t: (r1[t] + r2[t]) / 2 for t in r1}
    tiers: dict[float, list[str]] = {}
    for tid, value in mean.items():
        tiers.setdefault(value, []).append(tid)
    return Ranking([sorted(tiers[v]) for v in sorted(tiers, reverse=True)], None, first.evidence)


def _rank_guarded(
    grader: Grader,
    ws: GroupWorkspace,
    passing: list[str],
    guard: PositionGuard | None,
    metrics: GraderMetrics,
) -> Ranking:
    first = _checked(grader.rank(ws, passing), passing)
    if guard is None:
        return first
    second = _checked(grader.rank(ws, passing[::-1]), passing)
    metrics.guard_checks += 1
    distance = kendall_distance(scores_from_ranking(first.tiers), scores_from_ranking(second.tiers))
    if distance > guard.threshold:
        metrics.guard_disagreements += 1
        raise GraderFailure(
            "position_bias", f"rankings in two candidate orders disagree: Kendall distance {distance:.2f}"
        )
    return _merge(first, second)


def _failure_reason(exc: Exception) -> str:
    if isinstance(exc, GraderFailure):
        return exc.reason
    if isinstance(exc, RankingError):
        return exc.kind
    return "grader_error"


def grade_group(
    grader: Grader,
    ws: GroupWorkspace,
    guard: PositionGuard | None = None,
    metrics: GraderMetrics | None = None,
) -> Grade:
    """The grade of one group; never raises because of the grader (see the module docstring)."""
    metrics = metrics if metrics is not None else GraderMetrics()
    passing = ws.passing_ids
    start = time.monotonic()
    if len(passing) < 2:
        grade = Grade(group_id=ws.group_id, ranking=[passing] if passing else [], grader="trivial")
        metrics.add(grade)
        return grade
    try:
        ranking = _rank_guarded(grader, ws, passing, guard, metrics)
        grade = Grade(
            group_id=ws.group_id,
            ranking=ranking.tiers,
            scores=ranking.scores,
            grader=grader.name,
            grader_version=grader.version,
            evidence=ranking.evidence,
            duration_s=time.monotonic() - start,
        )
    except Exception as exc:  # a grader must never stop training: any failure is a tie
        reason = _failure_reason(exc)
        grade = tie_grade(
            ws.group_id,
            passing,
            reason,
            grader=grader.name,
            detail=f"{type(exc).__name__}: {exc}"[:1000],
            duration_s=time.monotonic() - start,
        )
        grade.grader_version = grader.version
    metrics.add(grade)
    return grade
