"""Select: dynamic sampling over every generation batch the step drew (once a step)."""

from kfp import dsl
from kfp.dsl import Dataset, Metrics, Output

from gagar.pipeline.images import stage_image


@dsl.component(base_image=stage_image("grader"), install_kfp_package=False)
def select(
    storage: str,
    step: int,
    trajectories: Output[Dataset],
    results: Output[Dataset],
    selection: Output[Dataset],
    metrics: Output[Metrics],
    train_batch_groups: int = 8,
):
    """The step's one selection over the generation batches ``gather`` stored
    (``gagar.pipeline.store_stages.select``); grade, redistribute and train read its outputs.

    Args:
        storage: the run's artifact store: a local directory or ``s3://bucket/prefix``.
        step: the RL step (``prepare``'s output).
        trajectories: the trajectories of every batch consumed (JSONL).
        results: their test results (JSONL).
        selection: what dynamic sampling kept and its ``sampling/…`` counts (one KeptBatch record, JSONL).
        metrics: ``sampling/…``, ``rollout/…`` and ``sandbox/…`` of the step, and the batches'
            ``perf/rollout_s`` and ``perf/sandbox_s`` summed.
        train_batch_groups: mixed groups the update trains on (dynamic sampling keeps at most these).
    """
    from gagar.pipeline import store_stages

    store_stages.log_metrics(
        metrics,
        store_stages.select(
            storage=storage,
            step=step,
            train_batch_groups=train_batch_groups,
            trajectories=trajectories.path,
            results=results.path,
            selection=selection.path,
        ),
    )
