"""The train batch: one record per trajectory the update trains on, with its advantage."""

from __future__ import annotations

from gagar.records import Record

__all__ = ["BatchEntry"]


class BatchEntry(Record):
    """One trajectory of the train batch with the advantage the update will use."""

    trajectory_id: str
    group_id: str
    gen_batch: int
    reward: float
    advantage: float
    grpo_advantage: float
    rank: float | None = None
