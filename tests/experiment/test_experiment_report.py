"""The report's numbers from hand-made evaluations: per-arm intervals, paired differences, the aim check."""

from __future__ import annotations

import pytest

from gagar.experiment.evaluation import EvalSummary
from gagar.experiment.report import (
    METRICS,
    ExperimentResults,
    arm_interval,
    judge_aim,
    mechanical_check,
    paired_interval,
    render_report,
)
from gagar.experiment.stats import Interval, t_interval
from gagar.policy.evaluate import RolloutQuality

RESOLVED = next(m for m in METRICS if m.key == "resolved")
CLEAN = next(m for m in METRICS if m.key == "clean_resolved")
SIZE = next(m for m in METRICS if m.key == "diff_size")


def _summary(arm: str, seed: int | None, resolved: float, clean: float, size: float | None) -> EvalSummary:
    quality = RolloutQuality(
        n=100,
        parse_rate=0.9,
        pass_at_1=resolved,
        clean_resolved_rate=clean,
        unclean_share_of_resolving=None if not resolved else 1 - clean / resolved,
        relative_diff_size_resolved=size,
        response_tokens_mean=80.0,
        turns_mean=1.0,
        n_resolved=int(resolved * 100),
        n_infra_errors=0,
    )
    return EvalSummary(arm=arm, seed=seed, policy="p", sampling_seed=0, quality=quality, seconds=1.0)


def _results(gagar: list[tuple[float, float, float | None]]) -> ExperimentResults:
    grpo = [(0.40, 0.10, 2.0), (0.50, 0.20, 3.0), (0.30, 0.05, None)]
    config = {
        "arms": [{"name": "grpo", "algo": "grpo"}, {"name": "gagar-heuristic", "algo": "gagar"}],
        "seeds": [0, 1, 2],
        "steps": 8,
        "policy": "policy",
        "train_tasks": "train.jsonl",
        "heldout_tasks": "held.jsonl",
        "train": {},
        "evaluation": {"samples_per_task": 4, "temperature": 1.0, "max_new_tokens": 128},
    }
    summaries = [_summary("sft", None, 0.2, 0.05, 1.5)]
    summaries += [_summary("grpo", s, *v) for s, v in enumerate(grpo)]
    summaries += [_summary("gagar-heuristic", s, *v) for s, v in enumerate(gagar)]
    return ExperimentResults(config, summaries, {}, [], {})


def _triple(i: Interval) -> tuple[float, float | None, float | None]:
    return i.mean, i.low, i.high


def test_arm_intervals_are_over_seeds_in_percent_and_skip_missing_values():
    results = _results([(0.42, 0.30, 1.1), (0.49, 0.41, 1.2), (0.31, 0.25, 1.0)])
    resolved = arm_interval(results, "grpo", RESOLVED)
    expected = t_interval([40.0, 50.0, 30.0])
    assert (resolved.mean, resolved.low, resolved.high) == pytest.approx(
        (expected.mean, expected.low, expected.high)
    )
    size = arm_interval(results, "grpo", SIZE)
    assert size.n == 2  # seed 2 resolved nothing measurable
    assert size.mean == pytest.approx(2.5)
    assert arm_interval(results, "sft", RESOLVED).low is None


def test_paired_differences_use_matching_seeds():
    results = _results([(0.42, 0.30, 1.1), (0.49, 0.41, 1.2), (0.31, 0.25, 1.0)])
    clean = paired_interval(results, "gagar-heuristic", "grpo", CLEAN)
    expected = t_interval([20.0, 21.0, 20.0])
    assert _triple(clean) == pytest.approx(_triple(expected))
    assert paired_interval(results, "gagar-heuristic", "grpo", SIZE).n == 2


def test_the_aim_is_met_only_with_15_points_more_clean_and_no_resolved_loss_beyond_noise():
    results = _results([(0.42, 0.30, 1.1), (0.49, 0.41, 1.2), (0.31, 0.25, 1.0)])
    [line] = mechanical_check(results)
    assert line.startswith("gagar-heuristic vs grpo: clean-resolved +20.3 points, 95% CI [")
    assert "aim met" in line

    lower = _results([(0.30, 0.30, 1.1), (0.41, 0.41, 1.2), (0.21, 0.25, 1.0)])
    [line] = mechanical_check(lower)
    assert "aim not met" in line
    assert "resolved lower beyond noise" in line

    def iv(mean: float, low: float | None, high: float | None) -> Interval:
        return Interval(mean=mean, low=low, high=high, n=3 if low is not None else 1, confidence=0.95)

    assert judge_aim(iv(14.9, 10.0, 19.8), iv(0.0, -1.0, 1.0)).startswith("not met (clean-resolved < +15")
    assert judge_aim(iv(15.0, -5.0, 35.0), iv(-8.0, -20.0, 0.0)).startswith("met")
    assert judge_aim(iv(30.0, None, None), iv(0.0, None, None)) == "cannot be judged with one seed"


def test_the_markdown_has_the_table_the_paired_table_the_check_and_a_blank_verdict():
    text = render_report(
        _results([(0.42, 0.30, 1.1), (0.49, 0.41, 1.2), (0.31, 0.25, 1.0)]), {"bars": "x.png"}
    )
    table = text.split("## Held-out results")[1].split("## Paired")[0]
    assert "| grpo | 3 | 40.0 [" in table
    assert "| sft | 1 | 20.0 (n=1) |" in table
    paired = text.split("## Paired differences against GRPO")[1].split("## Mechanical")[0]
    assert "| gagar-heuristic | " in paired
    assert "+20.3 [" in paired
    assert "![bars](x.png)" in text
    assert text.rstrip().endswith("_To be written by a person after reading the numbers above._")


def test_the_report_names_the_settings_an_arm_changes_for_its_own_runs():
    results = _results([(0.42, 0.30, 1.1), (0.49, 0.41, 1.2), (0.31, 0.25, 1.0)])
    results.config["arms"][1]["train"] = {"advantage": {"gamma": 0.25}}
    text = render_report(results, {})
    assert 'Arm `gagar-heuristic` also: `{"advantage": {"gamma": 0.25}}`.' in text
    assert "Arm `grpo` also" not in text


def test_greedy_evaluations_give_the_last_update_table_and_curves_from_the_shared_start():
    from gagar.experiment.report import greedy_curves

    results = _results([(0.42, 0.30, 1.1), (0.49, 0.41, 1.2), (0.31, 0.25, 1.0)])
    results.config["greedy_eval"] = {"every": 4, "tasks": None}

    def greedy(arm: str, seed: int | None, updates: int, resolved: float, changed: float | None):
        s = _summary(arm, seed, resolved, resolved, 1.0)
        return s.model_copy(update={"updates": updates, "changed_from_start": changed})

    results.greedy.append(greedy("sft", None, 0, 0.9, None))
    for seed in (0, 1, 2):
        results.greedy.extend(
            [greedy("grpo", seed, 4, 0.8, 0.1), greedy("grpo", seed, 8, 0.7, 0.2 + seed / 10)]
        )
        results.greedy.append(greedy("gagar-heuristic", seed, 4, 0.9, 0.05))  # still going: no step 8 yet
    curves = greedy_curves(results)
    changed = curves["answers changed from the start (%)"]
    assert [pytest.approx(v) for v in changed["grpo"]] == [[0, 10, 20], [0, 10, 30], [0, 10, 40]]
    assert changed["gagar-heuristic"] == [[0.0, 5.0]] * 3
    assert curves["resolved rate (%)"]["grpo"][0] == pytest.approx([90.0, 80.0, 70.0])
    text = render_report(results, {})
    section = text.split("## Greedy held-out answers after the last update")[1].split("## Mechanical")[0]
    assert "| grpo | 3 | 70.0 [70.0, 70.0] |" in section
    assert "| sft | 1 | 90.0 (n=1) |" in section
    assert "30.0 [" in section  # grpo's changed share: mean of 20, 30, 40
    assert "| gagar-heuristic | n/a |" in section  # no paired seeds after the last update yet


def _judged(task: str, resolved: bool, quality: float | None = None):
    from gagar.policy.evaluate import TrajectoryEval

    return TrajectoryEval(
        trajectory_id=f"{task}/{quality}",
        instance_id=task,
        status="passed" if resolved else "failed",
        resolved=resolved,
        parsed=True,
        clean=False,
        diff_size=None,
        relative_size=None,
        quality=quality,
        n_response_tokens=10,
        turns=1,
    )


def test_the_oracle_preference_compares_only_tasks_both_resolve_and_counts_a_tie_half():
    from gagar.experiment.report import oracle_preference

    ours = [
        _judged("a", True, 0.9),
        _judged("a", True, 0.5),
        _judged("b", True, 0.4),
        _judged("c", True, 1.0),
    ]
    theirs = [_judged("a", True, 0.5), _judged("b", True, 0.4), _judged("b", False), _judged("d", True, 0.1)]
    found = oracle_preference(ours, theirs)
    # task a: 0.9 > 0.5 wins, 0.5 = 0.5 ties -> 0.75; task b: a tie -> 0.5; c and d are one side's only
    assert found.tasks == 2
    assert found.rate == pytest.approx((0.75 + 0.5) / 2)
    assert found.tie_share == pytest.approx(2 / 3)
    assert oracle_preference(theirs, ours).rate == pytest.approx(1 - found.rate)
    assert oracle_preference(ours, [_judged("a", False)]).rate is None


def test_the_report_gives_the_preference_and_the_training_summary_per_arm():
    from gagar.experiment.report import TRAINING_SUMMARY

    results = _results([(0.42, 0.30, 1.1), (0.49, 0.41, 1.2), (0.31, 0.25, 1.0)])
    for seed in (0, 1, 2):
        results.judged["grpo", seed] = [_judged("a", True, 0.5), _judged("b", True, 0.5)]
        results.judged["gagar-heuristic", seed] = [
            _judged("a", True, 1.0),
            _judged("b", True, 0.5 - seed / 10),
        ]
    rows = [
        {"step": 0, "perf/step_s": 10.0, "perf/grade_s": 4.0, "credit/moved_ratio": 0.2, "loss/policy": -0.3},
        {"step": 1, "perf/step_s": 30.0, "perf/grade_s": 6.0, "credit/moved_ratio": 0.0, "loss/policy": 0.1},
    ]
    assert TRAINING_SUMMARY["grader's share of step time (%)"](rows) == pytest.approx(25.0)
    assert TRAINING_SUMMARY["|policy-gradient loss|"](rows) == pytest.approx(0.2)
    assert TRAINING_SUMMARY["share of passing credit moved (%)"](rows) == pytest.approx(10.0)
    for label, summarise in TRAINING_SUMMARY.items():
        results.training[label] = {"grpo": [summarise(rows)] * 3}
    text = render_report(results, {})
    preference = text.split("## The oracle's preference against grpo")[1].split("## Training")[0]
    # seed 0: (1 + 0.5) / 2; seeds 1 and 2: (1 + 0) / 2
    assert f"| gagar-heuristic | {100 * (0.75 + 0.5 + 0.5) / 3:.1f} [" in preference
    assert "| 2.0 |" in preference
    training = text.split("## Training")[1].split("## Mechanical")[0]
    assert "| grpo | 20.0 [20.0, 20.0] | 25.0 [25.0, 25.0] |" in training
    assert "| gagar-heuristic | n/a |" in training
