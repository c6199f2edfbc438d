"""Grader: rank the passing trajectories of every group the step's selection kept."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Output

from gagar.pipeline.images import stage_image


@dsl.component(base_image=stage_image("grader"), install_kfp_package=False)
def grade(
    settings: dict,
    tasks: Input[Dataset],
    trajectories: Input[Dataset],
    results: Input[Dataset],
    selection: Input[Dataset],
    grades: Output[Dataset],
    metrics: Output[Metrics],
):
    """One Grade per group the step's selection kept when the run's estimator uses a grader
    (``gagar.pipeline.store_stages.grade``: ``gagar.rl_step.grade``).

    Args:
        settings: the pipeline's parameters (the run's training config: ``advantage.algo``, ``grader.*``).
        tasks: the tasks (JSONL).
        trajectories: the step's trajectories, every generation batch consumed (JSONL).
        results: their test results (JSONL).
        selection: what dynamic sampling kept (the select stage's KeptBatch record, JSONL).
        grades: one Grade per kept group (JSONL; empty for an estimator that uses no grader).
        metrics: ``grader/…`` metrics and ``perf/grade_s``.
    """
    from gagar.pipeline import store_stages

    store_stages.log_metrics(
        metrics,
        store_stages.grade(
            settings=settings,
            tasks=tasks.path,
            trajectories=trajectories.path,
            results=results.path,
            selection=selection.path,
            grades=grades.path,
        ),
    )
