"""Evaluate a predictions file against a tasks file and write the results file.

Predictions are in SWE-bench form (``instance_id``, ``model_patch``, optional
``trajectory_id``); a trajectories file works as is. Results are TestResult records,
one per prediction, in prediction order, written atomically.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from enum import StrEnum

from gagar.sandbox.base import Prediction, ProgressCallback, SandboxBackend
from gagar.schema.result import HackKind, Status, TestResult
from gagar.schema.task import Task

__all__ = ["BackendName", "evaluate_jobs", "iter_jobs", "join_jobs", "make_backend", "summary_line"]


class BackendName(StrEnum):
    """Where evaluations run."""

    LOCAL = "local"
    KUBERNETES = "kubernetes"


def make_backend(name: BackendName, workers: int | None = None) -> SandboxBackend:
    """The backend called ``name``; the Kubernetes one is imported only when asked for."""
    if name == BackendName.KUBERNETES:
        from gagar.sandbox.k8s import KubernetesBackend, KubernetesSandboxConfig

        return KubernetesBackend(KubernetesSandboxConfig())
    from gagar.sandbox.local import LocalBackend

    return LocalBackend(workers=workers)


def evaluate_jobs(
    sandbox: SandboxBackend,
    jobs: Iterable[tuple[Task, Prediction]],
    on_result: ProgressCallback | None = None,
) -> list[TestResult]:
    """``sandbox.evaluate(jobs)``, except that a prediction the platform already failed (its
    ``infra_error`` is set: a trajectory whose tool session died) is judged ``infra_error`` with that
    reason and never run. One result per job, in job order; ``jobs`` may arrive lazily."""
    failed: dict[int, TestResult] = {}
    count = 0

    def runnable() -> Iterator[tuple[Task, Prediction]]:
        nonlocal count
        for task, pred in jobs:
            index, count = count, count + 1
            if pred.infra_error is None:
                yield task, pred
                continue
            result = TestResult(
                trajectory_id=pred.key, instance_id=pred.instance_id, status=Status.INFRA_ERROR,
                reason=pred.infra_error,
            )  # fmt: skip
            failed[index] = result
            if on_result is not None:
                on_result(result)

    ran = iter(sandbox.evaluate(runnable(), on_result))
    return [failed[i] if i in failed else next(ran) for i in range(count)]


def join_jobs(tasks: Sequence[Task], predictions: Iterable[Prediction]) -> list[tuple[Task, Prediction]]:
    """Pair each prediction with its task by ``instance_id`` (see :func:`iter_jobs`)."""
    return list(iter_jobs(tasks, predictions))


def iter_jobs(tasks: Sequence[Task], predictions: Iterable[Prediction]) -> Iterator[tuple[Task, Prediction]]:
    """Pair each prediction with its task by ``instance_id``, as the predictions arrive.

    Raises:
        ValueError: two tasks share an instance_id, or a prediction names an unknown one.
    """
    by_id: dict[str, Task] = {}
    for task in tasks:
        if task.instance_id in by_id:
            raise ValueError(f"tasks: instance_id {task.instance_id!r} appears twice")
        by_id[task.instance_id] = task
    for n, pred in enumerate(predictions, start=1):
        if pred.instance_id not in by_id:
            raise ValueError(f"prediction #{n}: instance_id {pred.instance_id!r} is not in the tasks file")
        yield by_id[pred.instance_id], pred


def summary_line(results: Sequence[TestResult]) -> str:
    """E.g. ``10 evaluated, 4 resolved (40.0%): passed 4, failed 3, error 0, timeout 1, infra_error 0,
    hack 2 (test_infrastructure 1, introspection 1)``: the hack kinds seen, each evaluation counted
    under every kind it was flagged for."""
    counts = Counter(r.status for r in results)
    resolved = sum(r.resolved for r in results)
    rate = 100.0 * resolved / len(results) if results else 0.0
    by_status = ", ".join(f"{s.value} {counts.get(s, 0)}" for s in Status)
    kinds = Counter(kind for r in results for kind in {f.kind for f in r.hacks})
    by_kind = ", ".join(f"{k.value} {kinds[k]}" for k in HackKind if kinds[k])
    return f"{len(results)} evaluated, {resolved} resolved ({rate:.1f}%): {by_status}" + (
        f" ({by_kind})" if by_kind else ""
    )
