"""Redistribute: GRPO advantages of the select stage's selection, then GAGAR's rank-weighted credit."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Markdown, Metrics, Output

from gagar.pipeline.images import stage_image


@dsl.component(base_image=stage_image("redistribute"), install_kfp_package=False)
def redistribute(
    selection: Input[Dataset],
    grades: Input[Dataset],
    batch: Output[Dataset],
    metrics: Output[Metrics],
    credit: Output[Markdown],
    algo: str = "gagar",
    decay: str = "geometric",
    gamma: float = 0.5,
    floor: float = 0.1,
    norm_std: bool = True,
):
    """The train batch with each trajectory's advantage (``gagar.stages.redistribute_stage``).

    Args:
        selection: what dynamic sampling kept, with its counts (the select stage's ``selection``).
        grades: the kept groups' grades (JSONL; ignored unless algo is gagar).
        batch: the kept trajectories with reward, GRPO and final advantage, rank (JSONL).
        metrics: ``sampling/…`` (``sampling/batch_full`` is 0 when fewer groups than wanted were kept),
            ``credit/…``, ``adv/…`` and ``perf/redistribute_s``.
        credit: Markdown table of the passing trajectories' GRPO and final advantages.
        algo: ``grpo``, ``dr_grpo`` or ``gagar``.
        decay: rank weighting: ``geometric``, ``linear`` or ``score``.
        gamma: geometric weight ratio between consecutive ranks.
        floor: smallest weight of linear and score decay.
        norm_std: divide by the group std (GRPO); false centres only (Dr. GRPO).
    """
    from gagar.pipeline import store_stages

    store_stages.log_metrics(
        metrics,
        store_stages.redistribute(
            selection=selection.path,
            grades=grades.path,
            batch=batch.path,
            credit=credit.path,
            algo=algo,
            decay=decay,
            gamma=gamma,
            floor=floor,
            norm_std=norm_std,
        ),
    )
