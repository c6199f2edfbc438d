"""What every sandbox backend implements: evaluate predictions against tasks."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from pydantic import Field

from gagar.records import Record
from gagar.schema.result import TestResult
from gagar.schema.task import Task

__all__ = ["Prediction", "ProgressCallback", "SandboxBackend"]


class Prediction(Record):
    """A patch to evaluate, in SWE-bench prediction form.

    A trajectories file is also a predictions file: it carries these three fields.
    """

    instance_id: str = Field(min_length=1)
    model_patch: str = ""
    trajectory_id: str | None = None
    infra_error: str | None = None
    """Set when the platform already failed this prediction (a trajectory's ``infra_error``): it is
    judged ``infra_error`` with this reason, and its patch is not run."""

    @property
    def key(self) -> str:
        """The id results are reported under: the trajectory id, else the instance id."""
        return self.trajectory_id or self.instance_id


ProgressCallback = Callable[[TestResult], None]


class SandboxBackend(Protocol):
    """Runs each prediction's patch against its task's tests, isolated from the host and each other."""

    def evaluate(
        self,
        jobs: Iterable[tuple[Task, Prediction]],
        on_result: ProgressCallback | None = None,
    ) -> list[TestResult]:
        """One TestResult per job, in the order of ``jobs``; never raises for a bad patch. ``jobs`` may
        arrive lazily (a backend may start on the first before the last is known)."""
        ...
