"""Per-answer judgements and their summary: real sandbox runs of gold, noisy and empty patches."""

from __future__ import annotations

import pytest

from gagar.experiment.evaluation import changed_share
from gagar.policy.agent_format import parse_answer, render_blocks
from gagar.policy.evaluate import TrajectoryEval, evaluate_detailed, evaluate_trajectories, summarise
from gagar.sandbox.edits import UNCHANGED
from gagar.sandbox.local import LocalBackend
from gagar.schema.result import Status
from gagar.schema.trajectory import Trajectory
from gagar.tasks.noise import add_noise


def _answer(
    task, name: str, patch: str, n_tokens: int, response: str = "", parse_error: str = "no edit blocks"
) -> Trajectory:
    return Trajectory(
        trajectory_id=f"{task.instance_id}/{name}",
        instance_id=task.instance_id,
        group_id=task.instance_id,
        model_patch=patch,
        response=response,
        parse_error=None if patch else parse_error,
        response_token_ids=list(range(n_tokens)),
        old_logprobs=[0.0] * n_tokens,
        loss_mask=[1] * n_tokens,
        n_response_tokens=n_tokens,
    )


def test_gold_noisy_and_empty_answers_are_judged_and_summarised(experiment_train_tasks):
    task = experiment_train_tasks[0]
    noisy_patch = add_noise(task, task.patch, ["comment", "dead_code"], rng=1)
    path = next(p for p in task.snapshot if p.endswith(".py") and "test" not in p)
    misquoted = render_blocks([(path, "    return 'a line this file does not hold'\n", "    return 1\n")])
    line = next(line for line in task.snapshot[path].splitlines(keepends=True) if line.strip())
    unchanged = render_blocks([(path, line, line)])
    assert parse_answer(unchanged, task.snapshot) == ("", UNCHANGED)
    answers = [
        _answer(task, "gold", task.patch, 10),
        _answer(task, "noisy", noisy_patch, 30),
        _answer(task, "empty", "", 5),
        _answer(task, "misquoted", "", 15, response=misquoted),
        _answer(task, "unchanged", "", 20, response=unchanged, parse_error=UNCHANGED),
    ]
    quality, results, judged = evaluate_detailed([task], answers, LocalBackend(workers=2))

    gold, noisy, empty, wrong, same = judged
    assert [r.trajectory_id for r in results] == [a.trajectory_id for a in answers]
    assert (gold.resolved, gold.clean, gold.relative_size) == (True, True, 1.0)
    assert noisy.resolved
    assert not noisy.clean
    assert noisy.relative_size > 1.0
    assert noisy.diff_size > gold.diff_size
    assert (empty.resolved, empty.clean, empty.parsed, empty.relative_size) == (False, False, False, None)
    assert (gold.well_formed, empty.well_formed) == (True, False)
    assert (wrong.resolved, wrong.parsed, wrong.well_formed) == (False, False, True)
    assert (same.resolved, same.parsed, same.well_formed, same.unchanged) == (False, False, True, True)
    assert not any(j.unchanged for j in (gold, noisy, empty, wrong))

    assert quality.n == 5
    assert quality.pass_at_1 == pytest.approx(2 / 5)
    assert quality.clean_resolved_rate == pytest.approx(1 / 5)
    assert quality.unclean_share_of_resolving == pytest.approx(1 / 2)
    assert quality.relative_diff_size_resolved == pytest.approx((1.0 + noisy.relative_size) / 2)
    assert quality.response_tokens_mean == pytest.approx(16.0)
    assert quality.turns_mean == 1.0
    assert quality.parse_rate == pytest.approx(2 / 5)
    assert quality.well_formed_rate == pytest.approx(4 / 5)
    assert quality.unchanged_rate == pytest.approx(1 / 5)
    # The evaluate component's entry point gives the same summary.
    assert evaluate_trajectories([task], answers, LocalBackend(workers=2))[0] == quality


def _judged(status: Status, resolved: bool, clean: bool, size: float | None, tokens: int, turns: int = 1):
    return TrajectoryEval(
        trajectory_id=f"t{tokens}",
        instance_id="i",
        status=status,
        resolved=resolved,
        parsed=True,
        clean=clean,
        diff_size=None if size is None else 4,
        relative_size=size,
        n_response_tokens=tokens,
        turns=turns,
    )


def test_infra_errors_are_left_out_of_every_rate():
    judged = [
        _judged(Status.PASSED, True, True, 1.0, 10, turns=2),
        _judged(Status.PASSED, True, False, 3.0, 20),
        _judged(Status.FAILED, False, False, None, 30),
        _judged(Status.INFRA_ERROR, False, False, None, 1000, turns=9),
    ]
    q = summarise(judged)
    assert (q.n, q.n_infra_errors, q.n_resolved) == (3, 1, 2)
    assert q.pass_at_1 == pytest.approx(2 / 3)
    assert q.clean_resolved_rate == pytest.approx(1 / 3)
    assert q.relative_diff_size_resolved == pytest.approx(2.0)
    assert q.response_tokens_mean == pytest.approx(20.0)
    assert q.turns_mean == pytest.approx(4 / 3)


def test_nothing_resolving_leaves_the_resolved_only_metrics_unset():
    q = summarise([_judged(Status.FAILED, False, False, None, 7)])
    assert (q.pass_at_1, q.clean_resolved_rate) == (0.0, 0.0)
    assert q.relative_diff_size_resolved is None
    assert q.unclean_share_of_resolving is None


def _greedy(instance_id: str, tokens: list[int]) -> Trajectory:
    return Trajectory(
        trajectory_id=f"{instance_id}/0",
        instance_id=instance_id,
        group_id=instance_id,
        response_token_ids=tokens,
        old_logprobs=[0.0] * len(tokens),
        loss_mask=[1] * len(tokens),
        n_response_tokens=len(tokens),
    )


def test_the_changed_share_compares_each_answer_with_the_starts_answer_to_the_same_task():
    start = [_greedy("a", [1, 2]), _greedy("b", [3]), _greedy("c", [4, 5]), _greedy("d", [6])]
    answers = [_greedy("b", [3]), _greedy("a", [1, 2, 9]), _greedy("c", [5, 4]), _greedy("d", [6])]
    assert changed_share(answers, start) == pytest.approx(2 / 4)  # a grew a token, c reordered
    assert changed_share(answers[:1], start) == 0.0  # a subset of the tasks
    with pytest.raises(ValueError, match="'e' has no starting answer"):
        changed_share([_greedy("e", [1])], start)
    with pytest.raises(ValueError, match="answers hold task 'b' twice"):
        changed_share([_greedy("b", [3]), _greedy("b", [3])], start)
    with pytest.raises(ValueError, match="no answers"):
        changed_share([], start)
