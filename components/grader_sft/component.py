"""Grader SFT: train the learned grader on labelled groups and measure it on held-out tasks."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Model, Output

from gagar.pipeline.images import stage_image


@dsl.component(base_image=stage_image("grader"), install_kfp_package=False)
def grader_sft(
    tasks: Input[Dataset],
    trajectories: Input[Dataset],
    results: Input[Dataset],
    eval_tasks: Input[Dataset],
    grader_model: Output[Model],
    metrics: Output[Metrics],
    groups_per_task: int = 3,
    epochs: int = 300,
    seed: int = 0,
):
    """Train the learned grader on noise groups of ``tasks`` plus the rollout's passing groups.

    Args:
        tasks: training tasks with bundled files (JSONL; the patch-quality oracle labels their groups).
        trajectories: rollout trajectories of those tasks (JSONL).
        results: their test results (JSONL).
        eval_tasks: held-out tasks (JSONL) whose noise groups measure the trained grader.
        grader_model: the learned grader's directory.
        metrics: groups trained on, Kendall tau and top-1 accuracy on the held-out groups.
        groups_per_task: noise groups built per task.
        epochs: training epochs (full batch).
        seed: seed of the noise groups and the model.
    """
    from gagar.pipeline import store_stages

    store_stages.log_metrics(
        metrics,
        store_stages.grader_sft(
            tasks=tasks.path,
            trajectories=trajectories.path,
            results=results.path,
            out=grader_model.path,
            eval_tasks=eval_tasks.path,
            groups_per_task=groups_per_task,
            epochs=epochs,
            seed=seed,
        ),
    )
