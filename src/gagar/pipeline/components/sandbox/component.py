"""Sandbox: run every trajectory's patch against its task's tests, all evaluations inside this one task."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Output

from gagar.pipeline.images import stage_image


@dsl.component(base_image=stage_image("sandbox"), install_kfp_package=False)
def sandbox(
    tasks: Input[Dataset],
    trajectories: Input[Dataset],
    results: Output[Dataset],
    metrics: Output[Metrics],
    backend: str = "kubernetes",
    workers: int = 0,
):
    """Evaluate every trajectory (``gagar.stages.sandbox_stage``); one TestResult each.

    Args:
        tasks: the tasks (JSONL).
        trajectories: the trajectories to evaluate (JSONL; each carries its ``model_patch``).
        results: one TestResult per trajectory (JSONL).
        metrics: ``sandbox/…`` counts, ``rollout/resolved_rate`` and ``perf/sandbox_s``.
        backend: ``kubernetes`` (one hardened pod per evaluation) or ``local`` (bubblewrap).
        workers: evaluations at once; 0 lets the backend choose.
    """
    from gagar.pipeline import store_stages

    store_stages.log_metrics(
        metrics,
        store_stages.sandbox(
            tasks=tasks.path,
            trajectories=trajectories.path,
            results=results.path,
            backend=backend,
            workers=workers,
        ),
    )
