"""Grader: rank the passing trajectories of every group the step's selection kept."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Output

from gagar.pipeline.images import stage_image


@dsl.component(base_image=stage_image("grader"), install_kfp_package=False)
def grade(
    tasks: Input[Dataset],
    trajectories: Input[Dataset],
    results: Input[Dataset],
    selection: Input[Dataset],
    grades: Output[Dataset],
    metrics: Output[Metrics],
    algo: str = "gagar",
    grader: str = "heuristic",
    grader_model: str = "",
    endpoint: str = "",
    max_steps: int = 8,
    position_guard: float = 0.0,
):
    """One Grade per group the step's selection kept (``gagar.stages.grade_stage``); nothing to grade
    unless algo is gagar.

    Args:
        tasks: the tasks (JSONL).
        trajectories: the step's trajectories, every generation batch consumed (JSONL).
        results: their test results (JSONL).
        selection: what dynamic sampling kept (the select stage's KeptBatch record, JSONL).
        grades: one Grade per kept group (JSONL; empty for grpo and dr_grpo).
        metrics: ``grader/…`` metrics and ``perf/grade_s``.
        algo: the advantage estimator; only ``gagar`` needs grades.
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
            max_steps=max_steps,
            position_guard=position_guard,
        ),
    )
