"""Train: one PPO-clip update on the step's batch; publishes checkpoint step-N to the artifact store."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Markdown, Metrics, Model, Output

from gagar.pipeline.images import stage_image


@dsl.component(base_image=stage_image("train"), install_kfp_package=False)
def train(
    settings: dict,
    policy: str,
    step: int,
    ends_run: bool,
    trajectories: Input[Dataset],
    results: Input[Dataset],
    grades: Input[Dataset],
    batch: Input[Dataset],
    select_metrics: Input[Metrics],
    grade_metrics: Input[Metrics],
    redistribute_metrics: Input[Metrics],
    metrics: Output[Metrics],
    summary: Output[Markdown],
    model: Output[Model],
):
    """Update the policy (``gagar.pipeline.store_stages.train``: ``gagar.rl_step.update``) and publish
    ``checkpoints/step-N`` to the store, with the step's metrics.

    Args:
        settings: the pipeline's parameters (the run's training config: ``optim.*``, ``lora.*``,
            ``distributed.*``, ``metrics.*``).
        policy: the policy the step sampled from (``prepare``'s output).
        step: the RL step.
        ends_run: whether this is the run's last step (it marks the run finished for monitoring).
        trajectories: the step's trajectories (JSONL).
        results: their test results (JSONL; the sandbox durations for the histograms).
        grades: the step's grades (JSONL; the grading durations for the histograms).
        batch: the train batch with advantages (JSONL).
        select_metrics: the select stage's metrics.
        grade_metrics: the grade stage's metrics.
        redistribute_metrics: the redistribute stage's metrics.
        metrics: ``loss/…``, ``train/…`` and ``perf/train_s``.
        summary: the step's headline numbers as Markdown.
        model: the checkpoint this step published (where it is in the store, its step and version),
            so the run page shows the model and its lineage.
    """
    from gagar.pipeline import store_stages

    store_stages.log_metrics(
        metrics,
        store_stages.train(
            settings=settings,
            policy=policy,
            step=step,
            ends_run=ends_run,
            trajectories=trajectories.path,
            results=results.path,
            grades=grades.path,
            batch=batch.path,
            select_metrics=select_metrics.metadata,
            grade_metrics=grade_metrics.metadata,
            redistribute_metrics=redistribute_metrics.metadata,
            summary=summary.path,
            model=model.path,
        ),
    )
    model.metadata.update(store_stages.checkpoint_card(model.path))
