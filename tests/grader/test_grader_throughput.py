"""All of a step's gradings at once, and groups larger than the grader's context split and merged."""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from gagar.grader.base import PositionGuard
from gagar.grader.kendall import scores_from_ranking
from gagar.grader.llm import LLMGrader
from gagar.grader.run import grade_groups
from gagar.grader.sft import LabelledGroup, noise_groups
from gagar.grader.split import chunks, merge_tiers, rank_in_chunks
from gagar.schema.result import TestResult
from gagar.schema.task import Task
from gagar.schema.trajectory import Trajectory
from gagar.tasks.generate import generate_task

TASKS = [generate_task(i, 23, "heldout", verify=False) for i in range(4)]
GROUPS = noise_groups(TASKS, groups_per_task=1, size=5, min_size=3, seed=1)


class TeacherModel:
    """The teacher's answer without a network: score = -lines of the grader's opening ``diff_stats``.

    ``barrier`` (when given) holds every request until that many conversations have started, so a
    grading that runs alone waits in vain and fails; ``shown`` records the candidates of each grading;
    a task whose statement starts with one of ``broken`` gets prose instead of JSON.
    """

    def __init__(self, barrier: threading.Barrier | None = None, broken: Sequence[str] = ()) -> None:
        self.barrier, self.broken = barrier, set(broken)
        self.shown: list[int] = []
        self._lock = threading.Lock()

    def next_message(self, messages: list[dict[str, str]], timeout: float) -> str:
        prompt = messages[1]["content"]
        if any(statement in prompt for statement in self.broken):
            return "I think the first one is best."
        with self._lock:
            self.shown.append(len(prompt.rsplit("Candidates: ", 1)[1].split(", ")))
        if self.barrier is not None:
            self.barrier.wait()
        stats = next(m["content"] for m in messages if m["content"].startswith("TOOL RESULT diff_stats"))
        sizes = re.findall(r"\b(c\d+): (\d+) lines", stats)
        notes = "\n".join(f"{alias}: {n} lines" for alias, n in sizes)
        scores = ", ".join(f'"{alias}": -{n}' for alias, n in sizes)
        return f'{notes}\n{{"scores": {{{scores}}}}}'


def _rollout(
    groups: Sequence[LabelledGroup],
) -> tuple[dict[str, Task], list[Trajectory], dict[str, TestResult]]:
    tasks = {g.task.instance_id: g.task for g in groups}
    trajectories, results = [], {}
    for g in groups:
        for c in g.candidates:
            trajectories.append(
                Trajectory(trajectory_id=c.trajectory_id, instance_id=g.task.instance_id, group_id=g.group_id,
                           model_patch=c.patch)
            )  # fmt: skip
            results[c.trajectory_id] = TestResult(
                trajectory_id=c.trajectory_id, instance_id=g.task.instance_id, status="passed", resolved=True
            )
    return tasks, trajectories, results


def _grade(model: TeacherModel, root: Path, concurrency: int, groups=GROUPS, **kwargs):  # type: ignore[no-untyped-def]
    grader = LLMGrader(model, concurrency=concurrency, total_timeout_s=60, **kwargs)
    tasks, trajectories, results = _rollout(groups)
    return grade_groups(grader, tasks, trajectories, results, root, guard=PositionGuard(), progress=False)


def test_every_group_in_both_orders_is_graded_at_once(tmp_path: Path) -> None:
    conversations = 2 * len(GROUPS)  # both candidate orders of every group
    together = TeacherModel(threading.Barrier(conversations, timeout=30))
    grades, metrics = _grade(together, tmp_path / "together", concurrency=16)
    assert metrics.as_dict()["grader/fallbacks"] == 0  # the barrier was reached: all ran at once
    assert metrics.guard_checks == len(GROUPS)
    alone, _ = _grade(TeacherModel(), tmp_path / "alone", concurrency=1)
    assert [g.ranking for g in grades] == [g.ranking for g in alone]
    assert [g.group_id for g in grades] == [g.group_id for g in GROUPS]


def test_gradings_that_cannot_overlap_wait_in_vain(tmp_path: Path) -> None:
    """The barrier test above can fail: one grading at a time never reaches it."""
    model = TeacherModel(threading.Barrier(2, timeout=0.5))
    grades, metrics = _grade(model, tmp_path, concurrency=1, groups=GROUPS[:1])
    assert grades[0].fallback
    assert metrics.fallbacks["grader_error"] == 1


def test_a_failing_group_is_tied_and_counted_while_the_others_rank(tmp_path: Path) -> None:
    broken = " ".join(GROUPS[1].task.problem_statement.split())[:60]
    assert sum(broken in " ".join(g.task.problem_statement.split()) for g in GROUPS) == 1
    grades, metrics = _grade(TeacherModel(broken=[broken]), tmp_path, concurrency=16)
    by_group = {g.group_id: g for g in grades}
    assert by_group[GROUPS[1].group_id].fallback_reason == "malformed_json"
    assert len(by_group[GROUPS[1].group_id].ranking) == 1  # an all-way tie: GRPO for that group
    assert metrics.fallbacks == {"malformed_json": 1}
    assert all(not g.fallback for gid, g in by_group.items() if gid != GROUPS[1].group_id)


def test_chunks_are_consecutive_and_balanced() -> None:
    ids = [f"t{i}" for i in range(16)]
    assert [len(c) for c in chunks(ids, 8)] == [8, 8]
    assert [len(c) for c in chunks(ids[:9], 8)] == [5, 4]
    assert [len(c) for c in chunks(ids[:13], 4)] == [4, 3, 3, 3]
    assert [t for c in chunks(ids, 5) for t in c] == ids
    with pytest.raises(ValueError, match="at least 2"):
        chunks(ids, 1)


def _by_value(values: dict[str, int], seen: list[int]):  # type: ignore[no-untyped-def]
    """A rank function from hidden values (higher is better, equal tied) that records its group sizes."""

    def rank(subset: Sequence[str]) -> list[list[str]]:
        seen.append(len(subset))
        tiers: dict[int, list[str]] = {}
        for t in subset:
            tiers.setdefault(values[t], []).append(t)
        return [tiers[v] for v in sorted(tiers, reverse=True)]

    return rank


@pytest.mark.parametrize("size", [9, 16, 17])
def test_a_group_larger_than_the_context_ranks_as_a_whole(size: int) -> None:
    values = {f"t{i}": (i * 7) % 5 for i in range(size)}  # ties inside and across chunks
    seen: list[int] = []
    tiers = rank_in_chunks(_by_value(values, seen), list(values), max_candidates=8)
    assert tiers == _by_value(values, [])(list(values))  # as if ranked in one call
    assert max(seen) <= 8
    assert sorted(t for tier in tiers for t in tier) == sorted(values)  # none dropped


def test_merge_compares_head_tiers_by_pairs() -> None:
    values = {"a": 3, "b": 1, "c": 2, "d": 1}
    seen: list[int] = []
    merged = merge_tiers([["a"], ["b"]], [["c"], ["d"]], _by_value(values, seen))
    assert merged == [["a"], ["c"], ["b", "d"]]
    assert seen == [2, 2, 2]  # a>c, b<c, b=d


def test_the_llm_grader_splits_a_group_beyond_max_candidates(tmp_path: Path) -> None:
    big = noise_groups(TASKS[:2], groups_per_task=1, size=9, seed=3)
    big = [g for g in big if len(g.candidates) >= 7]
    assert big, "the catalogue gives ladders of 7 or more"
    model = TeacherModel()
    split, metrics = _grade(model, tmp_path / "split", concurrency=16, groups=big, max_candidates=4)
    whole, _ = _grade(TeacherModel(), tmp_path / "whole", concurrency=16, groups=big, max_candidates=16)
    assert metrics.as_dict()["grader/fallbacks"] == 0
    assert max(model.shown) <= 4
    for a, b in zip(split, whole, strict=True):
        assert scores_from_ranking(a.ranking) == scores_from_ranking(b.ranking)
