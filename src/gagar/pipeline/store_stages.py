"""What each pipeline component does: artifact-store I/O around one call into :mod:`gagar.stages`.

A component body is one call into this module, so the components stay declarations (inputs,
outputs, image) and everything here runs and is tested without KFP. Each function returns the
stage's metrics plus ``perf/<stage>_s``, the seconds the stage function itself took: the rest of a
task's wall time (process start, imports, KFP's executor, store transfers) is orchestration overhead.

KFP parameters cannot be unset, so an empty string or 0 stands for "unset" in the pipeline
parameters; :func:`unset` turns them back into None at this boundary.
"""

from __future__ import annotations

import json
import logging
import math
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

from gagar import stages
from gagar.pipeline import store
from gagar.pipeline.report import credit_table, merge_metrics, step_summary

__all__ = [
    "RL_STAGES",
    "MetricsSink",
    "evaluate",
    "grade",
    "grader_sft",
    "log_metrics",
    "prepare",
    "redistribute",
    "rollout",
    "sandbox",
    "train",
    "unset",
]

log = logging.getLogger(__name__)

T = TypeVar("T")


class MetricsSink(Protocol):
    """What KFP's ``Output[Metrics]`` offers: one scalar per name."""

    def log_metric(self, metric: str, value: float) -> None: ...


def unset(value: T) -> T | None:
    """None for a KFP parameter left at its "unset" value ("" or 0), else the value."""
    return None if value in ("", 0) else value


def log_metrics(sink: MetricsSink, metrics: Mapping[str, float]) -> None:
    """Log every finite metric on a KFP ``Output[Metrics]`` (NaN and inf are not JSON numbers)."""
    for key, value in sorted(metrics.items()):
        if math.isfinite(float(value)):
            sink.log_metric(key, float(value))


def _timed(name: str, call: Callable[[], dict[str, float]]) -> dict[str, float]:
    start = time.perf_counter()
    metrics = dict(call())
    metrics[f"perf/{name}_s"] = time.perf_counter() - start
    return metrics


def prepare(*, storage: str, model: str, tasks_uri: str, tasks: str) -> store.StepStart:
    """Copy the tasks into ``tasks`` as JSONL (validated) and find the step's start in the store."""
    from gagar.records import write_records
    from gagar.tasks.loaders import load_tasks

    with tempfile.TemporaryDirectory() as tmp:
        local = store.fetch_file(tasks_uri, Path(tmp) / Path(tasks_uri).name)
        write_records(tasks, load_tasks(local))
    start = store.resolve_start(store.normalise_storage(storage), model)
    log.info("step %d samples from %s", start.step, start.policy)
    return start


def rollout(*, policy: str, tasks: str, trajectories: str, step: int, **options: Any) -> dict[str, float]:
    """Download the policy and sample one generation batch (``gen_batch`` 0) into ``trajectories``.

    ``options`` are :func:`gagar.stages.rollout_stage`'s (groups, group_size, seed, temperature, …).
    """
    options = {
        key: unset(value) if key in ("endpoint", "model_name") else value for key, value in options.items()
    }
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = store.fetch_policy(policy, Path(tmp) / "policy")
        return _timed(
            "rollout",
            lambda: stages.rollout_stage(
                policy=model_dir,
                tasks=tasks,
                out=trajectories,
                step=step,
                gen_batch=0,
                progress=False,
                **options,
            ),
        )


def sandbox(*, tasks: str, trajectories: str, results: str, backend: str, workers: int) -> dict[str, float]:
    """Run every trajectory's tests (the fan-out over evaluations happens inside the stage)."""
    return _timed(
        "sandbox",
        lambda: stages.sandbox_stage(
            tasks=tasks,
            trajectories=trajectories,
            out=results,
            backend=backend,
            workers=unset(workers),
            progress=False,
        ),
    )


def grade(
    *,
    algo: str,
    tasks: str,
    trajectories: str,
    results: str,
    selection: str,
    grades: str,
    grader: str,
    grader_model: str,
    endpoint: str,
    train_batch_groups: int,
    max_steps: int = 8,
    position_guard: float = 0.0,
) -> dict[str, float]:
    """Dynamic sampling into ``selection`` (the step's one selection, which redistribute reads), then
    grade the groups it keeps; with an algo other than gagar, write no grades.

    A ``position_guard`` of 0 grades each group once.
    """
    stages.select_stage(
        trajectories=[trajectories], results=[results], out=selection, train_batch_groups=train_batch_groups
    )
    if algo != "gagar":
        Path(grades).write_text("", encoding="utf-8")
        return {"grader/skipped": 1.0, "perf/grade_s": 0.0}
    with tempfile.TemporaryDirectory() as tmp:
        return _timed(
            "grade",
            lambda: stages.grade_stage(
                tasks=tasks,
                trajectories=[trajectories],
                results=[results],
                selection=selection,
                out=grades,
                workspace=Path(tmp) / "workspace",
                grader=grader,
                grader_model=unset(grader_model),
                endpoint=unset(endpoint),
                max_steps=max_steps,
                position_guard=unset(position_guard),
                progress=False,
            ),
        )


def redistribute(*, selection: str, grades: str, batch: str, credit: str, **options: Any) -> dict[str, float]:
    """Advantages of the grade stage's ``selection`` (``options`` as
    :func:`gagar.stages.redistribute_stage`) into ``batch``; writes the credit table as Markdown to
    ``credit``."""
    metrics = _timed(
        "redistribute",
        lambda: stages.redistribute_stage(selection=selection, grades=grades, out=batch, **options),
    )
    Path(credit).write_text(credit_table(batch), encoding="utf-8")
    return metrics


def train(
    *,
    storage: str,
    policy: str,
    trajectories: str,
    results: str,
    grades: str,
    batch: str,
    step: int,
    seed: int,
    lr: float,
    epochs: int,
    minibatch_size: int,
    keep_checkpoints: int,
    rollout_metrics: Mapping[str, float],
    sandbox_metrics: Mapping[str, float],
    grade_metrics: Mapping[str, float],
    redistribute_metrics: Mapping[str, float],
    summary: str,
    pushgateway: str = "",
) -> dict[str, float]:
    """Update the policy, publish checkpoint ``step`` to the store, store and push the step's metrics.

    The earlier stages' metrics of this step, merged with the update's, go to
    ``metrics/step-N.json`` in the store, to the Pushgateway when one is given (with each sandbox
    run's and each graded group's seconds from ``results`` and ``grades`` for the histograms), and
    as a Markdown summary to ``summary``.
    """
    from gagar.train.update import OptimConfig

    optim = OptimConfig(lr=lr, epochs=epochs, minibatch_size=minibatch_size)
    upstream = [rollout_metrics, sandbox_metrics, grade_metrics, redistribute_metrics]
    storage = store.normalise_storage(storage)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "checkpoints"
        root.mkdir()
        if policy.startswith(f"{storage.rstrip('/')}/{store.CHECKPOINTS}/"):
            model_dir = store.restore_checkpoint(policy, root) / "model"  # its optimizer state continues
        else:
            model_dir = store.fetch_policy(policy, Path(tmp) / "policy")
        metrics = _timed(
            "train",
            lambda: stages.train_stage(
                policy=model_dir,
                trajectories=[trajectories],
                batch=batch,
                checkpoints=root,
                step=step,
                seed=seed,
                optim=optim,
            ),
        )
        store.publish_checkpoint(root / f"step-{step:06d}", storage, step, Path(tmp) / "staging")
    store.prune_checkpoints(storage, keep_checkpoints)
    merged = {**merge_metrics([*upstream, metrics]), "step": float(step)}
    store.write_step_metrics(storage, step, merged)
    if pushgateway:
        _push(pushgateway, storage, merged, _observations(results, grades))
    Path(summary).write_text(step_summary(step, merged), encoding="utf-8")
    return metrics


def _observations(results: str, grades: str) -> dict[str, list[float]]:
    from gagar.metrics import step_observations
    from gagar.records import read_records
    from gagar.schema.grade import Grade
    from gagar.schema.result import TestResult

    graded = [g.duration_s for g in read_records(grades, Grade)]
    return step_observations(read_records(results, TestResult), graded)


def _push(
    url: str, storage: str, metrics: Mapping[str, float], observations: Mapping[str, list[float]]
) -> None:
    from prometheus_client import CollectorRegistry

    from gagar.metrics import build_metrics, push_step, record_step

    collectors = build_metrics(CollectorRegistry())
    record_step(collectors, metrics, observations)
    run = storage.rstrip("/").rpartition("/")[2] or "gagar"
    push_step(url, "gagar-pipeline", collectors.registry, {"run": run})


def grader_sft(
    *,
    tasks: str,
    trajectories: str,
    results: str,
    out: str,
    eval_tasks: str,
    groups_per_task: int,
    epochs: int,
    seed: int,
) -> dict[str, float]:
    """Train the learned grader on noise groups and the rollout's passing groups; evaluate it on
    held-out tasks' noise groups (Kendall tau, top-1 accuracy)."""
    from gagar.grader.learned import ScorerConfig
    from gagar.grader.sft import evaluate as evaluate_grader
    from gagar.grader.sft import load_labelled_groups, train_grader

    def run() -> dict[str, float]:
        groups = load_labelled_groups(
            Path(tasks), Path(trajectories), Path(results), None, groups_per_task, seed
        )
        learned = train_grader(groups, Path(out), ScorerConfig(epochs=epochs, seed=seed), progress=False)
        held_out = load_labelled_groups(Path(eval_tasks), groups_per_task=groups_per_task, seed=seed + 1)
        report = evaluate_grader(learned, held_out, reverse_check=False)  # a deterministic scorer
        return {
            "grader_sft/train_groups": float(len(groups)),
            "grader_sft/eval_groups": float(report.groups),
            "grader_sft/kendall_tau": report.kendall_tau,
            "grader_sft/top1_accuracy": report.top1_accuracy,
        }

    return _timed("grader_sft", run)


def evaluate(
    *, tasks: str, trajectories: str, results_out: str, backend: str, workers: int
) -> dict[str, float]:
    """Run every trajectory's tests and summarise the policy's answers (pass@1, parse rate, clean fixes)."""
    from gagar.policy.evaluate import evaluate_trajectories
    from gagar.records import read_records, write_records
    from gagar.sandbox.runner import BackendName, make_backend
    from gagar.schema.task import Task
    from gagar.schema.trajectory import Trajectory

    def run() -> dict[str, float]:
        quality, results = evaluate_trajectories(
            read_records(tasks, Task),
            read_records(trajectories, Trajectory),
            make_backend(BackendName(backend), unset(workers)),
        )
        write_records(results_out, results)
        summary = json.loads(quality.model_dump_json())
        return {f"eval/{key}": float(value) for key, value in summary.items() if value is not None}

    return _timed("evaluate", run)


RL_STAGES: dict[str, Callable[..., Any]] = {
    "prepare": prepare,
    "rollout": rollout,
    "sandbox": sandbox,
    "grade": grade,
    "redistribute": redistribute,
    "train": train,
}
"""The function of each stage of :data:`gagar.pipeline.graph.RL_STEP`, called with the graph's names:
its parameters, its inputs (artifact paths; an earlier stage's metrics as a dict) and its output
artifacts (paths) but ``metrics``, which it returns. The KFP components and the Argo entry point
both call these."""
