"""Grader: dynamic sampling (once a step), then rank the passing trajectories of every kept group."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Output

from gagar.pipeline.images import stage_image


@dsl.component(base_image=stage_image("grader"), install_kfp_package=False)
def grade(
    tasks: Input[Dataset],
    trajectories: Input[Dataset],
    results: Input[Dataset],
    selection: Output[Dataset],
    grades: Output[Dataset],
    metrics: Output[Metrics],
    algo: str = "gagar",
    train_batch_groups: int = 8,
    grader: str = "heuristic",
    grader_model: str = "",
    endpoint: str = "",
    max_steps: int = 8,
    position_guard: float = 0.0,
):
    """The step's selection (``gagar.stages.select_stage``) and one Grade per kept group
    (``gagar.stages.grade_stage``); nothing to grade unless algo is gagar.

    Args:
        tasks: the tasks (JSONL).
        trajectories: the step's trajectories (JSONL).
        results: their test results (JSONL).
        selection: what dynamic sampling kept and its ``sampling/…`` counts (one KeptBatch record,
            JSONL); redistribute reads it instead of selecting again.
        grades: one Grade per kept group (JSONL; empty for grpo and dr_grpo).
        metrics: ``grader/…`` metrics and ``perf/grade_s``.
        algo: the advantage estimator; only ``gagar`` needs grades.
        train_batch_groups: groups the update trains on (dynamic sampling keeps at most these).
        grader: ``heuristic``, ``learned`` or ``llm``.
        grader_model: directory of the learned grader inside the image or a mounted volume.
        endpoint: OpenAI-compatible base URL of the ``llm`` grader.
        max_steps: most tool-calling turns of the ``llm`` grader per group.
        position_guard: grade twice in opposite orders and tie a group whose two rankings are further
            apart (Kendall distance) than this; 0 grades once.
    """
    from gagar.pipeline import store_stages

    store_stages.log_metrics(
        metrics,
        store_stages.grade(
            algo=algo,
            tasks=tasks.path,
            trajectories=trajectories.path,
            results=results.path,
            selection=selection.path,
            grades=grades.path,
            grader=grader,
            grader_model=grader_model,
            endpoint=endpoint,
            train_batch_groups=train_batch_groups,
            max_steps=max_steps,
            position_guard=position_guard,
        ),
    )
