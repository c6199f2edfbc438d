"""Prepare an RL step: validate the run's settings, the tasks as JSONL, the step number and its policy."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Dataset, Output

from gagar.pipeline.images import stage_image


@dsl.component(base_image=stage_image("train"), install_kfp_package=False)
def prepare(settings: dict, tasks: Output[Dataset]) -> NamedTuple(
    "StepStart", [("step", int), ("policy", str)]
):
    """Check the run's settings and resolve where the step starts from the artifact store
    (``gagar.pipeline.store_stages.prepare``).

    Args:
        settings: the pipeline's parameters (the run's training config).
        tasks: the training tasks, validated, as JSONL.

    Returns:
        step: the latest checkpoint's step + 1 (0 on an empty store).
        policy: the latest checkpoint's reference, or the initial policy.
    """
    from gagar.pipeline import store_stages

    start = store_stages.prepare(settings=settings, tasks=tasks.path)
    return (start.step, start.policy)
