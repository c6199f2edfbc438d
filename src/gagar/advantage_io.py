"""Graded trajectory records in, GRPO and GAGAR advantages out (what ``gagar advantages`` does)."""

from __future__ import annotations

import os

import numpy as np
from pydantic import model_validator

from gagar.advantage import (
    AdvantageConfig,
    AdvantageInputs,
    Decay,
    Estimator,
    compute_advantages,
    credit_moved_ratio,
    keep_mixed_groups,
)
from gagar.records import Record, read_records

__all__ = ["AdvantageRecord", "advantages_for_records", "read_advantage_records", "summarize"]


class AdvantageRecord(Record):
    """A trajectory's group, outcome and grader rank; other fields are carried through."""

    group_id: str | int
    resolved: bool | None = None
    reward: float | None = None
    rank: float | None = None
    """Rank among the passing members of the group, 1 = best; unset for failing ones."""
    score: float | None = None
    grpo_advantage: float | None = None
    gagar_advantage: float | None = None

    @model_validator(mode="after")
    def _has_an_outcome(self) -> AdvantageRecord:
        if self.resolved is None and self.reward is None:
            raise ValueError("needs 'resolved' or 'reward'")
        if self.reward is not None and self.reward not in (0.0, 1.0):
            raise ValueError(f"reward must be 0 or 1, got {self.reward}")
        return self

    @property
    def passed(self) -> bool:
        return bool(self.resolved) if self.resolved is not None else self.reward == 1.0


def read_advantage_records(path: str | os.PathLike[str]) -> list[AdvantageRecord]:
    """Records of a JSONL file; a passing record without a rank is an error naming its line."""
    records = read_records(path, AdvantageRecord)
    for line, rec in enumerate(records, start=1):
        if rec.passed and rec.rank is None:
            raise ValueError(f"{path}: record {line} (group {rec.group_id!r}) passed but has no 'rank'")
    return records


def advantages_for_records(
    records: list[AdvantageRecord],
    *,
    decay: Decay | str = Decay.GEOMETRIC,
    gamma: float = 0.5,
    floor: float = 0.1,
    norm_std: bool = True,
) -> list[AdvantageRecord]:
    """Copies of ``records`` with ``grpo_advantage`` and ``gagar_advantage`` filled in (both through
    the estimator registry, :func:`gagar.advantage.compute_advantages`)."""
    if not records:
        return []
    scores = np.array([np.nan if r.score is None else r.score for r in records])
    inputs = AdvantageInputs(
        rewards=np.array([r.passed for r in records], dtype=float),
        group_ids=np.array([str(r.group_id) for r in records]),
        ranks=np.array([np.nan if r.rank is None else r.rank for r in records]),
        scores=scores if Decay(decay) is Decay.SCORE else None,
    )
    config = AdvantageConfig(norm_std=norm_std, decay=Decay(decay), gamma=gamma, floor=floor)
    base, _ = compute_advantages(Estimator.GRPO, inputs, config)
    new, _ = compute_advantages(Estimator.GAGAR, inputs, config)
    return [
        r.model_copy(update={"grpo_advantage": float(b), "gagar_advantage": float(g)})
        for r, b, g in zip(records, base, new, strict=True)
    ]


def summarize(records: list[AdvantageRecord]) -> str:
    """One line: trajectories, groups, mixed groups, and the share of passing credit that moved."""
    if not records:
        return "0 trajectories"
    groups = np.array([str(r.group_id) for r in records])
    passed = np.array([r.passed for r in records], dtype=float)
    base = np.array([r.grpo_advantage for r in records], dtype=float)
    new = np.array([r.gagar_advantage for r in records], dtype=float)
    mixed = keep_mixed_groups(passed, groups)
    delta = new - base
    return (
        f"{len(records)} trajectories in {len(np.unique(groups))} groups "
        f"({len(np.unique(groups[mixed]))} mixed); {int(passed.sum())} passing; "
        f"credit moved {credit_moved_ratio(base, new, passed):.1%} of the passing advantage "
        f"(largest gain {delta.max():+.3f}, largest loss {delta.min():+.3f})"
    )
