"""What dynamic sampling kept of one step's generation batches: the train batch before advantages."""

from __future__ import annotations

from gagar.records import Record

__all__ = ["KeptBatch", "KeptTrajectory"]


class KeptTrajectory(Record):
    """One trajectory dynamic sampling kept for the update, with its reward."""

    trajectory_id: str
    group_id: str
    gen_batch: int
    reward: float


class KeptBatch(Record):
    """The kept trajectories in generation order and the dynamic-sampling counts of the step.

    The grade stage writes it (as one JSON document) so the redistribute stage advantages exactly
    the groups that were graded, without selecting again.
    """

    kept: list[KeptTrajectory]
    metrics: dict[str, float]
    """``sampling/…`` counts and ``sampling/batch_full``."""
