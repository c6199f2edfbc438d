"""The step's phases on in-memory records: generation batches, dynamic sampling once, advantages."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from gagar import rl_step
from gagar.advantage import Estimator, TierFactors
from gagar.sandbox.patch import file_diff
from gagar.schema import Grade, Status, TestResult, Trajectory
from gagar.schema.selection import GeneratedBatch
from gagar.tasks.generate import generate_tasks
from gagar.train.config import AdvantageSettings, RolloutSettings, TrainConfig


def _rollout(train_batch_groups: int, max_gen_batches: int) -> RolloutSettings:
    return RolloutSettings(train_batch_groups=train_batch_groups, max_gen_batches=max_gen_batches)


def _batch(gen: int, outcomes: dict[str, list[Status]]) -> GeneratedBatch:
    """One generation batch: per group id, one member per status (passed = resolved)."""
    trajectories, results = [], []
    for group, statuses in outcomes.items():
        for member, status in enumerate(statuses):
            tid = f"{group}-gen{gen}/{member}"
            trajectories.append(
                Trajectory(trajectory_id=tid, instance_id=group, group_id=f"{group}-gen{gen}")
            )
            results.append(
                TestResult(
                    trajectory_id=tid, instance_id=group, status=status, resolved=status is Status.PASSED
                )
            )
    return rl_step.generation_batch(trajectories, reversed(results))  # results in any order


P, F, INFRA = Status.PASSED, Status.FAILED, Status.INFRA_ERROR


def test_generation_batch_pairs_results_and_names_a_missing_one() -> None:
    batch = _batch(0, {"a": [P, F]})
    assert [r.trajectory_id for r in batch.results] == [t.trajectory_id for t in batch.trajectories]
    with pytest.raises(ValueError, match=r"no result for trajectory 'a-gen0/1'"):
        rl_step.generation_batch(batch.trajectories, batch.results[:1])


def test_select_stops_generating_once_the_batch_is_full() -> None:
    drawn: list[int] = []

    def batches() -> Iterator[GeneratedBatch]:
        for gen, outcome in enumerate(
            [{"a": [P, P], "b": [P, F]}, {"c": [F, P], "d": [P, F]}, {"e": [P, F]}]
        ):
            drawn.append(gen)
            yield _batch(gen, outcome)

    selection = rl_step.select(batches(), _rollout(train_batch_groups=2, max_gen_batches=3))
    assert drawn == [0, 1]  # the third batch was never rolled out
    assert [t.group_id for t in selection.trajectories] == ["b-gen0", "b-gen0", "c-gen1", "c-gen1"]
    assert selection.kept == [(0, 2), (0, 3), (1, 0), (1, 1)]
    assert selection.metrics["sampling/dropped/all_pass"] == 1
    assert selection.metrics["sampling/dropped/surplus"] == 1
    assert selection.metrics["sampling/batch_full"] == 1.0


def test_infra_errors_leave_their_group_before_sampling() -> None:
    selection = rl_step.select(
        [_batch(0, {"a": [P, F, INFRA]})], _rollout(train_batch_groups=4, max_gen_batches=1)
    )
    assert [r.status for r in selection.results] == [P, F]
    assert selection.metrics["sampling/infra_error_trajectories"] == 1
    assert rl_step.sandbox_metrics(selection.batches[0].results)["rollout/resolved_rate"] == 0.5


def test_select_stops_at_max_gen_batches_short_of_a_full_batch() -> None:
    outcomes = [{"a": [P, F]}, {"b": [F, F]}, {"c": [P, F]}]
    selection = rl_step.select(
        (_batch(g, o) for g, o in enumerate(outcomes)), _rollout(train_batch_groups=3, max_gen_batches=2)
    )
    assert len(selection.batches) == 2
    assert [t.group_id for t in selection.trajectories] == ["a-gen0", "a-gen0"]
    assert selection.metrics["sampling/batch_full"] == 0.0


def test_advantages_follow_the_registry_and_the_grades() -> None:
    selection = rl_step.select(
        [_batch(0, {"a": [P, P, F, F]})], _rollout(train_batch_groups=1, max_gen_batches=1)
    )
    grpo, metrics = rl_step.advantages(AdvantageSettings(algo=Estimator.GRPO), selection.kept_batch, None)
    assert metrics["credit/moved_ratio"] == 0.0
    assert [e.advantage for e in grpo] == [e.grpo_advantage for e in grpo]
    grade = Grade(group_id="a-gen0", ranking=[["a-gen0/1"], ["a-gen0/0"]], grader="test")
    settings = AdvantageSettings(algo=Estimator.GAGAR)
    gagar, metrics = rl_step.advantages(settings, selection.kept_batch, [grade])
    passing = np.array([e.advantage for e in gagar[:2]])
    assert passing[1] > passing[0]  # the better-ranked passing member gains credit
    assert passing.sum() == pytest.approx(sum(e.grpo_advantage for e in gagar[:2]))  # the sum is kept
    assert [e.advantage for e in gagar[2:]] == [e.grpo_advantage for e in gagar[2:]]  # failing untouched
    assert metrics["credit/moved_ratio"] > 0
    assert [e.rank for e in gagar] == [2.0, 1.0, None, None]
    with pytest.raises(ValueError, match="needs the grades"):
        rl_step.advantages(settings, selection.kept_batch, None)


@pytest.mark.parametrize("algo", [e for e in Estimator if e.uses_grader], ids=lambda a: a.value)
def test_every_setting_of_the_advantage_section_reaches_the_estimator(algo: Estimator) -> None:
    """The tier constants, the decay and its constants are the config's, none dropped on the way."""
    selection = rl_step.select(
        [_batch(0, {"a": [P, P, P, F, F]})], _rollout(train_batch_groups=1, max_gen_batches=1)
    )
    grade = Grade(group_id="a-gen0", ranking=[["a-gen0/2"], ["a-gen0/0"], ["a-gen0/1"]], grader="test")

    def advantages(**changed: object) -> list[float]:
        settings = AdvantageSettings.model_validate({"algo": algo.value, **changed})
        entries, _ = rl_step.advantages(settings, selection.kept_batch, [grade])
        return [e.advantage for e in entries]

    default = advantages()
    if algo is Estimator.GAGAR_TIERED:  # the paper's form: centred advantages, whatever norm_std says
        assert advantages(tiers=TierFactors(tier2_top=0.5, tier2_bottom=0.3)) != pytest.approx(default)
        assert advantages(tiers={"cutoffs": (0.5, 0.9)}) != pytest.approx(default)
    else:
        assert advantages(gamma=0.9) != pytest.approx(default)
        assert advantages(decay="linear", floor=0.5) != pytest.approx(advantages(decay="linear", floor=0.1))
        assert advantages(norm_std=False) != pytest.approx(default)


def test_grading_runs_only_for_an_estimator_that_uses_a_grader(tmp_path) -> None:
    paths = {"tasks": "tasks.jsonl", "policy": "policy"}
    for algo in Estimator:
        config = TrainConfig.from_values({**paths, "advantage": {"algo": algo.value}})
        grader = rl_step.make_grader(config)
        assert (grader is not None) is algo.uses_grader, algo
        if not algo.uses_grader:
            assert rl_step.grade(config, None, [], [], [], tmp_path) == (None, {})
        else:
            with pytest.raises(ValueError, match="ranks with a grader, and none was given"):
                rl_step.grade(config, None, [], [], [], tmp_path)


def test_select_tasks_is_seeded_and_distinct() -> None:
    from gagar.tasks.generate import generate_tasks

    tasks = generate_tasks(5, seed=0)
    first = rl_step.select_tasks(tasks, 3, seed=1, step=2, gen_batch=0)
    assert first == rl_step.select_tasks(tasks, 3, seed=1, step=2, gen_batch=0)
    assert len({t.instance_id for t in first}) == 3
    assert first != rl_step.select_tasks(tasks, 3, seed=1, step=2, gen_batch=1)


class _RecordingSandbox:
    """Resolves every job; records how many trajectories had been generated when each job arrived."""

    def __init__(self, generated: list[str]) -> None:
        self.generated, self.seen_after = generated, []

    def evaluate(self, jobs, on_result=None) -> list[TestResult]:
        results = []
        for _, pred in jobs:
            self.seen_after.append(len(self.generated))
            results.append(
                TestResult(trajectory_id=pred.key, instance_id=pred.instance_id, status=P, resolved=True)
            )
        return results


def test_the_sandbox_evaluates_each_answer_while_the_next_is_generated() -> None:
    generated: list[str] = []
    sandbox = _RecordingSandbox(generated)
    task = generate_tasks(1, seed=0)[0]

    def stream() -> Iterator[Trajectory]:
        for member in range(3):
            deadline = time.monotonic() + 10  # a sandbox that waits for the whole batch fails, not hangs
            while len(sandbox.seen_after) < member and time.monotonic() < deadline:
                time.sleep(0.01)  # the sandbox has the previous answer before this one exists
            generated.append(f"t/{member}")
            yield Trajectory(trajectory_id=f"t/{member}", instance_id=task.instance_id, group_id="t")

    timings: dict[str, float] = {}
    batch = rl_step.evaluate_while_generating([task], stream(), sandbox, timings)
    assert sandbox.seen_after == [1, 2, 3]
    assert [r.trajectory_id for r in batch.results] == ["t/0", "t/1", "t/2"]
    assert set(timings) == {"perf/rollout_s", "perf/sandbox_s", "perf/sandbox_busy_s"}


def test_a_failing_generation_ends_the_evaluation_and_raises() -> None:
    sandbox = _RecordingSandbox([])
    task = generate_tasks(1, seed=0)[0]

    def stream() -> Iterator[Trajectory]:
        yield Trajectory(trajectory_id="t/0", instance_id=task.instance_id, group_id="t")
        raise RuntimeError("engine died")

    with pytest.raises(RuntimeError, match="engine died"):
        rl_step.evaluate_while_generating([task], stream(), sandbox, {})
    assert len(sandbox.seen_after) == 1


def test_tasks_per_call_is_one_row_batch_for_an_in_process_engine_and_all_for_a_server() -> None:
    class Engine:
        batch_size = 32

    assert rl_step.tasks_per_call(Engine(), 8) == 4
    assert rl_step.tasks_per_call(Engine(), 64) == 1
    assert rl_step.tasks_per_call(object(), 8) is None


class _SignallingGrader:
    """The heuristic grader; each ranking first waits (10 s at most) for ``generating`` and records
    whether it came: whether the grading ran while a later batch generated."""

    def __init__(self) -> None:
        from gagar.grader.heuristic import HeuristicGrader

        self.inner, self.generating, self.overlapped = HeuristicGrader(), threading.Event(), []
        self.name, self.version = self.inner.name, self.inner.version
        self.concurrency, self.max_candidates = 1, None

    def rank(self, ws, order):
        self.overlapped.append(self.generating.wait(timeout=10))
        return self.inner.rank(ws, order)


def _gold_batch(gen: int, tasks, statuses: list[Status]) -> GeneratedBatch:
    """One group per task, members per status, each carrying the task's gold patch and a note of its own
    (identical candidates would be graded as one)."""
    trajectories, results = [], []
    for task in tasks:
        for member, status in enumerate(statuses):
            tid = f"{task.instance_id}-gen{gen}/{member}"
            patch = task.patch + file_diff(f"NOTE-{member}.md", None, "note\n")
            trajectories.append(
                Trajectory(trajectory_id=tid, instance_id=task.instance_id,
                           group_id=f"{task.instance_id}-gen{gen}", model_patch=patch)
            )  # fmt: skip
            results.append(
                TestResult(trajectory_id=tid, instance_id=task.instance_id, status=status,
                           resolved=status is Status.PASSED)
            )  # fmt: skip
    return rl_step.generation_batch(trajectories, results)


def test_kept_groups_are_graded_while_the_next_batch_generates(tmp_path) -> None:
    tasks = generate_tasks(2, seed=0)
    config = TrainConfig.from_values(
        {
            "tasks": "tasks.jsonl",
            "policy": "policy",
            "advantage": {"algo": "gagar"},
            "grader": {"kind": "heuristic"},
        }
    )
    grader = _SignallingGrader()

    def batches() -> Iterator[GeneratedBatch]:
        yield _gold_batch(0, tasks[:1], [P, P, F])
        grader.generating.set()  # batch 1 generates while batch 0's group is graded in the background
        yield _gold_batch(1, tasks[1:], [P, F, P])

    with rl_step.Grading(config, grader, tasks, tmp_path / "ws") as grading:
        selection = rl_step.select(
            batches(), _rollout(train_batch_groups=2, max_gen_batches=2),
            on_kept=lambda kept: grading.submit(kept.trajectories, kept.results),
        )  # fmt: skip
        timings: dict[str, float] = {}
        grades, metrics = grading.result(timings)
    assert grader.overlapped
    assert all(grader.overlapped)  # a blocking grade phase would have waited in vain
    assert grades is not None
    assert [g.group_id for g in grades] == [f"{t.instance_id}-gen{i}" for i, t in enumerate(tasks)]
    assert timings["perf/grade_busy_s"] > 0
    # the same grades and counts as grading the whole selection at once
    at_once, at_once_metrics = rl_step.grade(
        config, grader, tasks, selection.trajectories, selection.results, tmp_path / "ws2"
    )
    assert at_once is not None
    assert [(g.group_id, g.ranking, g.fallback) for g in grades] == [
        (g.group_id, g.ranking, g.fallback) for g in at_once
    ]
    assert {k: v for k, v in metrics.items() if "duration" not in k} == {
        k: v for k, v in at_once_metrics.items() if "duration" not in k
    }
    assert metrics["grader/groups"] == 2


def test_select_hands_on_each_batch_kept_part_before_drawing_the_next() -> None:
    events: list[str] = []

    def batches() -> Iterator[GeneratedBatch]:
        for gen, outcome in enumerate([{"a": [P, P], "b": [P, F]}, {"c": [F, P], "d": [P, F]}]):
            events.append(f"draw {gen}")
            yield _batch(gen, outcome)

    parts: list[GeneratedBatch] = []

    def kept(part: GeneratedBatch) -> None:
        events.append(f"kept {len(parts)}")
        parts.append(part)

    selection = rl_step.select(batches(), _rollout(train_batch_groups=2, max_gen_batches=2), on_kept=kept)
    assert events == ["draw 0", "kept 0", "draw 1", "kept 1"]
    assert [t for p in parts for t in p.trajectories] == selection.trajectories
    assert [r for p in parts for r in p.results] == selection.results
