"""Select: dynamic sampling over every generation batch the step drew."""

from kfp import dsl
from kfp.dsl import Dataset, Metrics, Output

from gagar.pipeline.images import stage_image


@dsl.component(base_image=stage_image("grader"), install_kfp_package=False)
def select(
    settings: dict,
    step: int,
    trajectories: Output[Dataset],
    results: Output[Dataset],
    selection: Output[Dataset],
    metrics: Output[Metrics],
):
    """Keep the mixed groups of the step's generation batches, read back from the store
    (``gagar.pipeline.store_stages.select``); grade, redistribute and train read its outputs.

    Args:
        settings: the pipeline's parameters (the run's training config).
        step: the RL step (``prepare``'s output).
        trajectories: every trajectory of the batches consumed (JSONL).
        results: their test results (JSONL).
        selection: what dynamic sampling kept (one KeptBatch record, JSONL).
        metrics: ``sampling/…``, ``rollout/…`` and ``sandbox/…`` over the batches consumed.
    """
    from gagar.pipeline import store_stages

    store_stages.log_metrics(
        metrics,
        store_stages.select(
            settings=settings,
            step=step,
            trajectories=trajectories.path,
            results=results.path,
            selection=selection.path,
        ),
    )
