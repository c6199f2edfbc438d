"""Gather: store one generation batch and say whether the train batch needs another (the refill)."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics

from gagar.pipeline.images import stage_image


@dsl.component(base_image=stage_image("grader"), install_kfp_package=False)
def gather(
    settings: dict,
    step: int,
    gen_batch: int,
    trajectories: Input[Dataset],
    results: Input[Dataset],
    rollout_metrics: Input[Metrics],
    sandbox_metrics: Input[Metrics],
) -> bool:
    """Store generation batch ``gen_batch`` in the run's store and select over every batch of the step
    so far (``gagar.pipeline.store_stages.gather``).

    Args:
        settings: the pipeline's parameters (the run's training config).
        step: the RL step (``prepare``'s output).
        gen_batch: which generation batch of the step this is (0, 1, …; fixed when the pipeline is built).
        trajectories: this batch's trajectories (JSONL).
        results: their test results (JSONL).
        rollout_metrics: this batch's rollout metrics (kept beside the batch in the store).
        sandbox_metrics: this batch's sandbox metrics.

    Returns:
        Whether another generation batch is drawn: the train batch is still short of its mixed groups
        and the run's rollout.max_gen_batches allows one (a single return value, as kfp.local
        resolves conditions only on an ``Output``).
    """
    from gagar.pipeline import store_stages

    outcome = store_stages.gather(
        settings=settings,
        step=step,
        gen_batch=gen_batch,
        trajectories=trajectories.path,
        results=results.path,
        rollout_metrics=rollout_metrics.metadata,
        sandbox_metrics=sandbox_metrics.metadata,
    )
    return outcome.short
