"""Quality of a policy's sampled answers: parse rate, pass@1 and the share of unclean fixes.

Passing is decided by a sandbox backend (the real one: each patch runs the task's tests);
unnecessary modifications by the patch-quality oracle (:func:`gagar.tasks.oracle.score_patch`).
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel

from gagar.policy.trajectory import Trajectory
from gagar.sandbox.base import Prediction, SandboxBackend
from gagar.sandbox.results import Status, TestResult
from gagar.tasks.oracle import score_patch
from gagar.tasks.schema import Task

__all__ = ["RolloutQuality", "evaluate_trajectories"]


class RolloutQuality(BaseModel):
    """Summary of one evaluation (pass@1 is the mean over all sampled answers)."""

    n: int
    """Trajectories evaluated (infra errors excluded)."""
    parse_rate: float
    pass_at_1: float
    unclean_share_of_resolving: float | None
    """Among resolving answers, the share the oracle calls not clean; None when none resolves."""
    n_resolved: int
    n_infra_errors: int


def evaluate_trajectories(
    tasks: Sequence[Task], trajectories: Sequence[Trajectory], sandbox: SandboxBackend
) -> tuple[RolloutQuality, list[TestResult]]:
    """Run every trajectory's patch through ``sandbox`` and summarise (see :class:`RolloutQuality`).

    Raises:
        KeyError: a trajectory whose instance_id is not among ``tasks``.
    """
    by_id = {t.instance_id: t for t in tasks}
    jobs = [
        (
            by_id[tr.instance_id],
            Prediction(
                instance_id=tr.instance_id, model_patch=tr.model_patch, trajectory_id=tr.trajectory_id
            ),
        )
        for tr in trajectories
    ]
    results = sandbox.evaluate(jobs)
    kept = [(tr, r) for tr, r in zip(trajectories, results, strict=True) if r.status != Status.INFRA_ERROR]
    resolving = [tr for tr, r in kept if r.resolved]
    unclean = [tr for tr in resolving if not score_patch(by_id[tr.instance_id], tr.model_patch).clean]
    n = len(kept)
    quality = RolloutQuality(
        n=n,
        parse_rate=sum(tr.parse_error is None for tr, _ in kept) / n if n else 0.0,
        pass_at_1=len(resolving) / n if n else 0.0,
        unclean_share_of_resolving=len(unclean) / len(resolving) if resolving else None,
        n_resolved=len(resolving),
        n_infra_errors=len(trajectories) - n,
    )
    return quality, results
