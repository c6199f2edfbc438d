"""One step's generation batches and what dynamic sampling kept of them: the train batch before
advantages. :class:`GeneratedBatch` and :class:`Selection` are the in-memory forms a step hands
between its phases; :class:`KeptBatch` is the record a pipeline's select stage writes."""

from __future__ import annotations

from dataclasses import dataclass

from gagar.records import Record
from gagar.schema.result import TestResult
from gagar.schema.trajectory import Trajectory

__all__ = ["GeneratedBatch", "KeptBatch", "KeptTrajectory", "Selection"]


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


@dataclass(frozen=True)
class GeneratedBatch:
    """One generation batch: its trajectories and their test results, in the same order."""

    trajectories: list[Trajectory]
    results: list[TestResult]


@dataclass(frozen=True)
class Selection:
    """What dynamic sampling kept of the generation batches it consumed."""

    batches: list[GeneratedBatch]
    """Every generation batch consumed, kept members or not."""
    kept: list[tuple[int, int]]
    """``(generation batch, index in it)`` of each kept trajectory, in generation order."""
    metrics: dict[str, float]
    """``sampling/…`` counts and ``sampling/batch_full``."""

    @property
    def trajectories(self) -> list[Trajectory]:
        """The kept trajectories, in generation order."""
        return [self.batches[b].trajectories[i] for b, i in self.kept]

    @property
    def results(self) -> list[TestResult]:
        """The kept trajectories' results, aligned with :attr:`trajectories`."""
        return [self.batches[b].results[i] for b, i in self.kept]

    @property
    def kept_batch(self) -> KeptBatch:
        """The kept trajectories with their rewards and the counts: what the advantages need."""
        kept = [
            KeptTrajectory(
                trajectory_id=self.batches[b].trajectories[i].trajectory_id,
                group_id=self.batches[b].trajectories[i].group_id,
                gen_batch=b,
                reward=float(self.batches[b].results[i].resolved),
            )
            for b, i in self.kept
        ]
        return KeptBatch(kept=kept, metrics=self.metrics)
