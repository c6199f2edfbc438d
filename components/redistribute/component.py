"""Redistribute: GRPO advantages, then the estimator's credit redistribution among the passing ones."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Markdown, Metrics, Output

from gagar.pipeline.images import stage_image


@dsl.component(base_image=stage_image("redistribute"), install_kfp_package=False)
def redistribute(
    settings: dict,
    selection: Input[Dataset],
    grades: Input[Dataset],
    batch: Output[Dataset],
    metrics: Output[Metrics],
    credit: Output[Markdown],
):
    """The train batch with each trajectory's advantage (``gagar.pipeline.store_stages.redistribute``:
    ``gagar.rl_step.advantages``).

    Args:
        settings: the pipeline's parameters (the run's training config: ``advantage.*``).
        selection: what dynamic sampling kept (the select stage's KeptBatch record, JSONL).
        grades: the grade stage's grades (JSONL).
        batch: one BatchEntry per kept trajectory (JSONL).
        metrics: ``sampling/…``, ``advantage/…``, ``credit/…`` and ``perf/redistribute_s``.
        credit: where credit moved, as a Markdown table.
    """
    from gagar.pipeline import store_stages

    store_stages.log_metrics(
        metrics,
        store_stages.redistribute(
            settings=settings,
            selection=selection.path,
            grades=grades.path,
            batch=batch.path,
            credit=credit.path,
        ),
    )
