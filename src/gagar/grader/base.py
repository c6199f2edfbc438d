"""One interface for every grader, and the wrapper that makes grading safe for training.

A grader ranks the passing candidates of one group's workspace and may fail by raising
:class:`GraderFailure` (or anything else). :func:`grade_group` turns every outcome into a
:class:`~gagar.schema.grade.Grade`. Candidates identical to another of the group's are shown to the
grader once and share its rank (:func:`identical_candidates`); a group with fewer than two distinct
passing candidates gets a trivial grade without a grader call; a failure, an invalid ranking or (with
the position-bias guard) two disagreeing orderings become an all-way tie — GRPO for that group — with
the reason recorded and counted. Grading never raises for a bad grader.

A grader that waits on a server (``concurrency > 1``) ranks the two candidate orders of the guard at
once, and :func:`gagar.grader.run.grade_groups` grades that many groups at once, so one warm server
decodes them together. A group larger than the grader's ``max_candidates`` is ranked in chunks and
merged (:mod:`gagar.grader.split`), never dropped.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gagar.grader.kendall import kendall_distance, scores_from_ranking
from gagar.grader.split import rank_in_chunks, run_all
from gagar.grader.workspace import GroupWorkspace
from gagar.schema.grade import Grade, RankingError, tie_grade, validate_ranking

__all__ = [
    "Grader",
    "GraderFailure",
    "GraderMetrics",
    "PositionGuard",
    "Ranking",
    "grade_group",
    "identical_candidates",
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
    concurrency: int
    """How many gradings may run at once: 1 for in-process graders, more for one that waits on a server."""
    max_candidates: int | None
    """Most candidates one ``rank`` call may see (its context); None: any number."""

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
    copies: int = 0
    """Passing candidates identical to another of their group's, graded through that one."""
    duration_s: float = 0.0

    def add(self, grade: Grade) -> None:
        self.groups += 1
        self.trivial += grade.grader == "trivial"
        if grade.fallback:
            self.fallbacks[grade.fallback_reason or "unspecified"] += 1
        self.duration_s += grade.duration_s

    def merge(self, other: GraderMetrics) -> None:
        """Add ``other``'s counts (a group graded on another thread) to these."""
        self.groups += other.groups
        self.trivial += other.trivial
        self.fallbacks.update(other.fallbacks)
        self.guard_checks += other.guard_checks
        self.guard_disagreements += other.guard_disagreements
        self.copies += other.copies
        self.duration_s += other.duration_s

    def as_dict(self) -> dict[str, float]:
        out: dict[str, float] = {
            "grader/groups": self.groups,
            "grader/trivial": self.trivial,
            "grader/fallbacks": sum(self.fallbacks.values()),
            "grader/duration_s": self.duration_s,
            "grader/position_checks": self.guard_checks,
            "grader/position_disagreements": self.guard_disagreements,
            "grader/copies": self.copies,
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


def _rank_once(grader: Grader, ws: GroupWorkspace, order: list[str]) -> Ranking:
    """One ranking of ``order``: in one call when it fits ``grader.max_candidates``, else in chunks
    merged by pairs (:func:`gagar.grader.split.rank_in_chunks`; scores dropped, evidence kept)."""
    limit = grader.max_candidates
    if limit is None or len(order) <= limit:
        return _checked(grader.rank(ws, order), order)
    evidence: dict[str, str] = {}
    lock = threading.Lock()

    def rank(subset: Sequence[str]) -> list[list[str]]:
        ranking = _checked(grader.rank(ws, subset), subset)
        with lock:
            for tid, line in ranking.evidence.items():
                evidence.setdefault(tid, line)
        return ranking.tiers

    tiers = rank_in_chunks(rank, order, limit, parallel=grader.concurrency > 1)
    return Ranking(validate_ranking(order, tiers), None, evidence)


def _rank_guarded(
    grader: Grader,
    ws: GroupWorkspace,
    passing: list[str],
    guard: PositionGuard | None,
    metrics: GraderMetrics,
) -> Ranking:
    orders = [passing] if guard is None else [passing, passing[::-1]]
    calls = [lambda order=order: _rank_once(grader, ws, order) for order in orders]
    rankings = run_all(calls, parallel=grader.concurrency > 1)
    if guard is None:
        return rankings[0]
    first, second = rankings
    metrics.guard_checks += 1
    distance = kendall_distance(scores_from_ranking(first.tiers), scores_from_ranking(second.tiers))
    if distance > guard.threshold:
        metrics.guard_disagreements += 1
        raise GraderFailure(
            "position_bias", f"rankings in two candidate orders disagree: Kendall distance {distance:.2f}"
        )
    return _merge(first, second)


def identical_candidates(ws: GroupWorkspace, passing: Sequence[str]) -> dict[str, list[str]]:
    """The passing candidates by what they are (:meth:`GroupWorkspace.fingerprint`): the first of each
    set of identical candidates -> the whole set, in ``passing`` order. The grader sees one of each, so
    identical patches always share a rank and a group of copies needs no grading."""
    by_fingerprint: dict[str, list[str]] = {}
    for tid in passing:
        by_fingerprint.setdefault(ws.fingerprint(tid), []).append(tid)
    return {ids[0]: ids for ids in by_fingerprint.values()}


def _with_copies(ranking: Ranking, copies: dict[str, list[str]]) -> Ranking:
    """``ranking`` of the first of each set of identical candidates, extended to every copy."""
    tiers = [[tid for first in tier for tid in copies[first]] for tier in ranking.tiers]
    scores = None
    if ranking.scores is not None:
        scores = {tid: ranking.scores[first] for first in copies for tid in copies[first]}
    evidence = {
        tid: line for first, line in ranking.evidence.items() if first in copies for tid in copies[first]
    }
    return Ranking(tiers, scores, evidence)


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
    copies = identical_candidates(ws, passing)
    metrics.copies += len(passing) - len(copies)
    if len(copies) < 2:
        grade = Grade(group_id=ws.group_id, ranking=[passing] if passing else [], grader="trivial")
        metrics.add(grade)
        return grade
    try:
        ranking = _with_copies(_rank_guarded(grader, ws, list(copies), guard, metrics), copies)
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
