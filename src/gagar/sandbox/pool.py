"""Run evaluations on a pool of worker slots; each slot is a thread that launches subprocesses.

A slot number is handed to the evaluation, and at most one evaluation uses a slot at a
time; the local backend starts its uid search there, but the uid itself is leased
machine-wide (:mod:`gagar.sandbox.uids`), since other pools number their slots alike.
Results come back in job order; the progress callback sees each as it finishes. An
evaluation that raises becomes an ``infra_error`` result: one broken evaluation never
takes the batch down.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

from gagar.sandbox.base import Prediction, ProgressCallback
from gagar.schema.result import Status, TestResult
from gagar.schema.task import Task

__all__ = ["EvaluateFn", "run_pool"]

EvaluateFn = Callable[[Task, Prediction, int], TestResult]
"""Evaluate (task, prediction) as worker slot ``slot``."""


def run_pool(
    jobs: Iterable[tuple[Task, Prediction]],
    evaluate: EvaluateFn,
    workers: int,
    on_result: ProgressCallback | None = None,
) -> list[TestResult]:
    """Evaluate every job with at most ``workers`` at a time; one result per job, in order. Each job is
    handed to a slot as soon as ``jobs`` yields it."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    slots: queue.SimpleQueue[int] = queue.SimpleQueue()
    for slot in range(workers):
        slots.put(slot)
    lock = threading.Lock()

    def one(job: tuple[Task, Prediction]) -> TestResult:
        task, pred = job
        slot = slots.get()
        try:
            result = evaluate(task, pred, slot)
        except Exception as exc:  # the batch survives any single evaluation
            result = TestResult(
                trajectory_id=pred.key,
                instance_id=pred.instance_id,
                status=Status.INFRA_ERROR,
                reason=f"evaluation crashed: {type(exc).__name__}: {exc}",
            )
        finally:
            slots.put(slot)
        if on_result is not None:
            with lock:
                on_result(result)
        return result

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sandbox") as pool:
        return list(pool.map(one, jobs))
