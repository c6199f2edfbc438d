"""Evaluate: the quality of a policy's answers (pass@1, parse rate, share of unclean fixes)."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Output

from gagar.pipeline.images import stage_image


@dsl.component(base_image=stage_image("sandbox"), install_kfp_package=False)
def evaluate(
    settings: dict,
    tasks: Input[Dataset],
    trajectories: Input[Dataset],
    results: Output[Dataset],
    metrics: Output[Metrics],
):
    """Run every trajectory's tests and summarise them (``gagar.policy.evaluate``).

    Args:
        settings: the pipeline's parameters (the run's training config: ``sandbox.*``).
        tasks: held-out tasks (JSONL; bundled files let the oracle judge clean fixes).
        trajectories: the policy's answers (JSONL).
        results: one TestResult per trajectory (JSONL).
        metrics: ``eval/pass_at_1``, ``eval/parse_rate``, ``eval/unclean_share_of_resolving``, counts
            and ``perf/evaluate_s``.
    """
    from gagar.pipeline import store_stages

    store_stages.log_metrics(
        metrics,
        store_stages.evaluate(
            settings=settings, tasks=tasks.path, trajectories=trajectories.path, results_out=results.path
        ),
    )
