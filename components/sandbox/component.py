"""Sandbox: run each trajectory's patch against its task's tests under the pristine judge."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Output

from gagar.pipeline.images import stage_image


@dsl.component(base_image=stage_image("sandbox"), install_kfp_package=False)
def sandbox(
    settings: dict,
    tasks: Input[Dataset],
    trajectories: Input[Dataset],
    results: Output[Dataset],
    metrics: Output[Metrics],
):
    """Evaluate every trajectory (``gagar.pipeline.store_stages.sandbox``); one TestResult each.

    Args:
        settings: the pipeline's parameters (the run's training config: ``sandbox.*``).
        tasks: the tasks (JSONL).
        trajectories: the trajectories to evaluate (JSONL).
        results: one TestResult per trajectory (JSONL).
        metrics: ``sandbox/…`` counts, the resolved rate and ``perf/sandbox_s``.
    """
    from gagar.pipeline import store_stages

    store_stages.log_metrics(
        metrics,
        store_stages.sandbox(
            settings=settings, tasks=tasks.path, trajectories=trajectories.path, results=results.path
        ),
    )
