"""The Grade record (DESIGN.md §3): one group's passing trajectories ranked by quality.

A ranking is a list of tiers, best first; the trajectories of one tier are tied. The
equivalent rank view gives every trajectory ``1 + the number of trajectories in better
tiers`` (competition ranking, 1 = best), which is what :func:`gagar.advantage.redistribute`
consumes through :func:`ranks_for`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from pydantic import Field, model_validator

from gagar.records import Record

__all__ = [
    "Grade",
    "RankingError",
    "ranking_from_scores",
    "ranks_for",
    "scores_for",
    "tie_grade",
    "validate_ranking",
]


class RankingError(ValueError):
    """A ranking that omits, duplicates or invents candidates; ``kind`` names which."""

    def __init__(self, kind: str, ids: Sequence[str], message: str) -> None:
        self.kind, self.ids = kind, list(ids)
        super().__init__(message)


def validate_ranking(candidates: Iterable[str], ranking: Sequence[Sequence[str]]) -> list[list[str]]:
    """``ranking`` as a list of non-empty tiers, checked to hold every candidate exactly once.

    Raises:
        RankingError: ``kind`` is ``invented_candidate``, ``duplicated_candidate``,
            ``omitted_candidate`` or ``empty_tier``; the message names the ids.
    """
    expected = list(candidates)
    known = set(expected)
    seen: set[str] = set()
    tiers: list[list[str]] = []
    for number, tier in enumerate(ranking, start=1):
        if not tier:
            raise RankingError("empty_tier", [], f"tier {number} of the ranking is empty")
        invented = [t for t in tier if t not in known]
        if invented:
            raise RankingError("invented_candidate", invented, f"ranking names unknown candidates {invented}")
        duplicated = [t for t in tier if t in seen or list(tier).count(t) > 1]
        if duplicated:
            dups = sorted(set(duplicated))
            raise RankingError("duplicated_candidate", dups, f"ranking names candidates twice: {dups}")
        seen.update(tier)
        tiers.append(list(tier))
    omitted = [t for t in expected if t not in seen]
    if omitted:
        raise RankingError("omitted_candidate", omitted, f"ranking omits candidates {omitted}")
    return tiers


def ranking_from_scores(scores: Mapping[str, float], decimals: int = 6) -> list[list[str]]:
    """Tiers from scores, higher is better; scores equal to ``decimals`` places are tied."""
    by_score: dict[float, list[str]] = {}
    for tid, score in scores.items():
        by_score.setdefault(round(float(score), decimals), []).append(tid)
    return [sorted(by_score[s]) for s in sorted(by_score, reverse=True)]


class Grade(Record):
    """The grader's verdict on one group's passing trajectories."""

    group_id: str = Field(min_length=1)
    ranking: list[list[str]] = Field(default_factory=list)
    """Tiers of passing trajectory ids, best first; the ids of one tier are tied."""
    scores: dict[str, float] | None = None
    """Grader scores per trajectory id, higher is better; consistent with ``ranking``."""
    grader: str = Field(min_length=1)
    """Which grader produced it: ``heuristic``, ``learned``, ``llm`` or ``trivial``."""
    grader_version: str = ""
    evidence: dict[str, str] = Field(default_factory=dict)
    """A short summary per trajectory id of what the grader based its verdict on."""
    fallback: bool = False
    """True when the grader failed and the ranking is an all-way tie (plain GRPO)."""
    fallback_reason: str | None = None
    """Why it fell back: a short code such as ``timeout`` or ``malformed_json``."""
    fallback_detail: str | None = None
    """The error message behind ``fallback_reason``."""
    duration_s: float = Field(default=0.0, ge=0.0)

    @model_validator(mode="after")
    def _consistent(self) -> Grade:
        ids = [t for tier in self.ranking for t in tier]
        validate_ranking(ids, self.ranking)  # no duplicates, no empty tier
        if self.fallback and self.fallback_reason is None:
            raise ValueError("a fallback grade needs a fallback_reason")
        if self.fallback and len(self.ranking) > 1:
            raise ValueError("a fallback grade ties every candidate: it must have at most one tier")
        if self.scores is not None and set(self.scores) != set(ids):
            raise ValueError("scores must name exactly the ranked trajectory ids")
        return self

    @property
    def ranks(self) -> dict[str, int]:
        """Rank per trajectory id: 1 = best, tied ids share a rank (competition ranking)."""
        out: dict[str, int] = {}
        rank = 1
        for tier in self.ranking:
            for tid in tier:
                out[tid] = rank
            rank += len(tier)
        return out

    @property
    def candidates(self) -> list[str]:
        """Every ranked trajectory id, best tier first."""
        return [t for tier in self.ranking for t in tier]


def tie_grade(
    group_id: str,
    passing_ids: Sequence[str],
    reason: str,
    *,
    grader: str = "fallback",
    detail: str | None = None,
    duration_s: float = 0.0,
) -> Grade:
    """The fallback grade: every passing trajectory tied, which makes GAGAR reproduce GRPO."""
    return Grade(
        group_id=group_id,
        ranking=[list(passing_ids)] if passing_ids else [],
        grader=grader,
        fallback=True,
        fallback_reason=reason,
        fallback_detail=detail,
        duration_s=duration_s,
    )


def ranks_for(trajectory_ids: Sequence[str], grades: Iterable[Grade]) -> np.ndarray:
    """Rank of each trajectory ``(n_traj,)``: its rank in its group's grade, NaN when it is unranked.

    Feed the result to :func:`gagar.advantage.redistribute` as ``ranks``; failing
    trajectories are not in any ranking and get NaN, which ``redistribute`` ignores.

    Raises:
        ValueError: if two grades rank the same trajectory.
    """
    lookup: dict[str, int] = {}
    for grade in grades:
        for tid, rank in grade.ranks.items():
            if tid in lookup:
                raise ValueError(f"trajectory {tid!r} is ranked by more than one grade")
            lookup[tid] = rank
    return np.array([lookup.get(t, np.nan) for t in trajectory_ids], dtype=np.float64)


def scores_for(trajectory_ids: Sequence[str], grades: Iterable[Grade]) -> np.ndarray:
    """Grader score of each trajectory ``(n_traj,)``, for ``redistribute(decay="score")``.

    A ranked trajectory whose grade carries no scores (a tie fallback, or a grader that only ranks)
    gets ``rank``-consistent scores: minus its rank, so a tie stays a tie. Unranked ones get NaN.
    """
    lookup: dict[str, float] = {}
    for grade in grades:
        for tid, rank in grade.ranks.items():
            lookup[tid] = float(grade.scores[tid]) if grade.scores and tid in grade.scores else -float(rank)
    return np.array([lookup.get(t, np.nan) for t in trajectory_ids], dtype=np.float64)
