"""Prepare an RL step: the tasks as a JSONL artifact, the step number and the policy to sample from."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Dataset, Output

from gagar.pipeline.images import stage_image


@dsl.component(base_image=stage_image("train"), install_kfp_package=False)
def prepare(storage: str, model: str, tasks_uri: str, tasks: Output[Dataset]) -> NamedTuple(
    "StepStart", [("step", int), ("policy", str)]
):
    """Resolve where the step starts from the artifact store.

    Args:
        storage: the run's artifact store: a local directory or ``s3://bucket/prefix``.
        model: the initial policy (a model directory or a store reference), used while the store
            holds no checkpoint.
        tasks_uri: the training tasks (JSONL or parquet; a local path or a store URI).
        tasks: the tasks, validated, as JSONL.

    Returns:
        step: the latest checkpoint's step + 1 (0 on an empty store).
        policy: the latest checkpoint's reference, or ``model``.
    """
    from gagar.pipeline import store_stages

    start = store_stages.prepare(storage=storage, model=model, tasks_uri=tasks_uri, tasks=tasks.path)
    return (start.step, start.policy)
