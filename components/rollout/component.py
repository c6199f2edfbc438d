"""Rollout: sample a group of answers per task from the current policy (one generation batch)."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Output

from gagar.pipeline.images import stage_image


@dsl.component(base_image=stage_image("rollout"), install_kfp_package=False)
def rollout(
    settings: dict,
    policy: str,
    step: int,
    gen_batch: int,
    tasks: Input[Dataset],
    trajectories: Output[Dataset],
    metrics: Output[Metrics],
):
    """Sample one generation batch (``gagar.pipeline.store_stages.rollout``: ``gagar.rl_step.rollout``).

    Args:
        settings: the pipeline's parameters (the run's training config).
        policy: the policy to sample from (``prepare``'s output): a model directory or store reference.
        step: the RL step (seeds task selection and sampling; names the groups).
        gen_batch: which generation batch of the step (0, 1, … for refills; seeds the tasks drawn).
        tasks: the training tasks (JSONL).
        trajectories: the sampled trajectories (JSONL).
        metrics: ``rollout/…`` metrics and ``perf/rollout_s``.
    """
    from gagar.pipeline import store_stages

    store_stages.log_metrics(
        metrics,
        store_stages.rollout(
            settings=settings,
            policy=policy,
            step=step,
            gen_batch=gen_batch,
            tasks=tasks.path,
            trajectories=trajectories.path,
        ),
    )
