"""Pipeline mode: each step pushes a fresh registry, and its counters are still totals that only grow."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from gagar.metrics import RUN_ACTIVE_KEY, build_metrics, cumulative_totals, record_step

# Two scheduled runs of two steps each into one run store (step numbers continue across runs).
STEPS = [
    {
        "step": 0.0,
        "sandbox/passed": 3.0,
        "sandbox/failed": 5.0,
        "sampling/groups_kept": 2.0,
        "rollout/resolved_rate": 0.375,
    },
    {"step": 1.0, "sandbox/passed": 4.0, "sandbox/failed": 4.0, "sampling/dropped/all_fail": 1.0},
    {"step": 2.0, "sandbox/passed": 6.0, "sampling/groups_kept": 3.0, "rollout/resolved_rate": 0.75},
    {"step": 3.0, "sandbox/failed": 2.0, "grader/fallbacks/timeout": 1.0, "rollout/resolved_rate": 0.5},
]


def pushed(step_index: int) -> CollectorRegistry:
    """What the train task of ``STEPS[step_index]`` pushes: a fresh registry, the store's earlier steps."""
    registry = CollectorRegistry()
    values = {**cumulative_totals(STEPS[:step_index], STEPS[step_index]), RUN_ACTIVE_KEY: 1.0}
    assert record_step(build_metrics(registry), values) == []
    return registry


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    assert value is not None, (name, labels)
    return value


def test_pushed_counters_are_running_totals_across_steps_and_runs() -> None:
    passed = [sample(pushed(i), "gagar_trajectories_total", status="passed") for i in range(4)]
    failed = [sample(pushed(i), "gagar_sandbox_evaluations_total", status="failed") for i in range(4)]
    kept = [sample(pushed(i), "gagar_groups_kept_total") for i in range(4)]
    assert passed == [3, 7, 13, 13]
    assert failed == [5, 9, 9, 11]
    assert kept == [2, 2, 5, 5]
    for series in (passed, failed, kept):
        assert series == sorted(series), "a total never decreases, so rate() sees no reset"


def test_a_series_an_earlier_step_had_is_carried_not_dropped() -> None:
    last = pushed(3)
    assert sample(last, "gagar_groups_dropped_total", reason="all_fail") == 1
    assert sample(last, "gagar_grader_fallbacks_total", reason="timeout") == 1


def test_gauges_keep_the_steps_own_value_and_the_run_is_active() -> None:
    last = pushed(3)
    assert sample(last, "gagar_resolved_ratio") == 0.5
    assert sample(last, "gagar_train_step") == 3
    assert sample(last, "gagar_run_active") == 1


def test_the_same_answer_before_and_after_the_step_is_stored_or_retried() -> None:
    before = cumulative_totals(STEPS[:2], STEPS[2])
    assert cumulative_totals(STEPS[:3], STEPS[2]) == before  # this step's own record left out
    assert cumulative_totals(STEPS, STEPS[2]) == before  # a retried step: later records left out
    assert before["sandbox/passed"] == 13
    assert before["rollout/resolved_rate"] == 0.75
