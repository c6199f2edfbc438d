"""The train batch: one record per trajectory the update trains on, with its advantage."""

from __future__ import annotations

from gagar.schema.selection import KeptTrajectory

__all__ = ["BatchEntry"]


class BatchEntry(KeptTrajectory):
    """One kept trajectory of the train batch with the advantage the update will use."""

    advantage: float
    grpo_advantage: float
    rank: float | None = None
