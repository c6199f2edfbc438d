"""Grade a rollout: group the trajectories, lay out each group's workspace, rank, write grades.jsonl.

A group whose workspace cannot be built (a task whose repository is not available, say) gets a
tie with reason ``workspace_error``; nothing about one group stops the others. A grader with
``concurrency > 1`` (the LLM grader) grades that many groups at once, each in both candidate orders
at once under the position guard, so one warm server decodes all of a step's gradings together.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from enum import StrEnum
from pathlib import Path
from typing import Literal

from tqdm import tqdm

from gagar.grader.base import Grader, GraderMetrics, PositionGuard, grade_group
from gagar.grader.heuristic import HeuristicGrader
from gagar.grader.llm import CONCURRENCY, GROUP_TIMEOUT_S, MAX_CANDIDATES, MAX_TURNS, LLMGrader
from gagar.grader.llm_client import MAX_TOKENS, ChatClient
from gagar.grader.workspace import CandidateInput, build_group_workspace
from gagar.schema.grade import Grade, tie_grade
from gagar.schema.result import TestResult
from gagar.schema.task import Task
from gagar.schema.trajectory import Trajectory

__all__ = ["GraderKind", "check_health", "discover_model", "grade_groups", "make_grader"]


class GraderKind(StrEnum):
    """The graders ``gagar grade`` can run."""

    HEURISTIC = "heuristic"
    LEARNED = "learned"
    LLM = "llm"


def discover_model(endpoint: str, timeout: float = 10.0) -> str:
    """The first model an OpenAI-compatible server lists at ``GET /models``."""
    with urllib.request.urlopen(endpoint.rstrip("/") + "/models", timeout=timeout) as response:
        data = json.loads(response.read())
    try:
        return str(data["data"][0]["id"])
    except (KeyError, IndexError, TypeError):
        raise ValueError(f"{endpoint}/models lists no model") from None


def check_health(endpoint: str, timeout: float = 10.0) -> None:
    """Raise ValueError naming ``endpoint`` unless its server answers ``GET /health`` (beside ``/v1``)."""
    root = endpoint.rstrip("/").removesuffix("/v1")
    try:
        with urllib.request.urlopen(root + "/health", timeout=timeout) as response:
            response.read()
    except (OSError, ValueError) as exc:
        raise ValueError(
            f"the llm grader's server at {endpoint} is not healthy ({exc}); start one: gagar serve grader"
        ) from None


def make_grader(
    kind: GraderKind | str,
    *,
    model_dir: Path | None = None,
    endpoint: str | None = None,
    model: str | None = None,
    api: Literal["chat", "completions"] = "chat",
    max_turns: int | None = None,
    timeout_s: float = GROUP_TIMEOUT_S,
    max_tokens: int = MAX_TOKENS,
    concurrency: int = CONCURRENCY,
    max_candidates: int = MAX_CANDIDATES,
) -> Grader:
    """The grader ``kind``, configured; raises ValueError naming the missing option.

    ``concurrency`` and ``max_candidates`` apply to the LLM grader (:class:`LLMGrader`).
    """
    kind = GraderKind(kind)
    if kind is GraderKind.HEURISTIC:
        return HeuristicGrader()
    if kind is GraderKind.LEARNED:
        if model_dir is None:
            raise ValueError("the learned grader needs --grader-model DIR")
        from gagar.grader.learned import LearnedGrader  # torch: imported only when asked for

        return LearnedGrader.load(model_dir)
    if endpoint is None:
        raise ValueError("the llm grader needs --endpoint URL (an OpenAI-compatible /v1 base URL)")
    check_health(endpoint)
    client = ChatClient(endpoint, model or discover_model(endpoint), api=api, max_tokens=max_tokens)
    turns = MAX_TURNS if max_turns is None else max_turns
    return LLMGrader(
        client, max_turns=turns, request_timeout_s=timeout_s, total_timeout_s=timeout_s,
        concurrency=concurrency, max_candidates=max_candidates,
    )  # fmt: skip


def grade_groups(
    grader: Grader,
    tasks: dict[str, Task],
    trajectories: Sequence[Trajectory],
    results: dict[str, TestResult],
    workspace_root: Path,
    guard: PositionGuard | None = None,
    repos_dir: Path | None = None,
    progress: bool = True,
) -> tuple[list[Grade], GraderMetrics]:
    """One grade per group of ``trajectories``, in order of first appearance, and the metrics.

    Raises:
        ValueError: if a trajectory names a task that is not in ``tasks``.
    """
    groups: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        if t.instance_id not in tasks:
            raise ValueError(f"trajectory {t.trajectory_id!r}: task {t.instance_id!r} is not in the tasks")
        groups.setdefault(t.group_id, []).append(t)

    def one(group_id: str) -> tuple[Grade, GraderMetrics]:
        members, own = groups[group_id], GraderMetrics()
        task = tasks[members[0].instance_id]
        return _grade_one(
            grader, task, group_id, members, results, workspace_root, guard, repos_dir, own
        ), own

    metrics = GraderMetrics()
    grades = []
    bar = tqdm(total=len(groups), desc="grading", unit="group", disable=not progress)
    with ThreadPoolExecutor(max(1, grader.concurrency), thread_name_prefix="gagar-group") as pool:
        for grade, own in pool.map(one, groups):  # in order of first appearance
            grades.append(grade)
            metrics.merge(own)
            bar.update()
    bar.close()
    return grades, metrics


def _grade_one(
    grader: Grader,
    task: Task,
    group_id: str,
    members: list[Trajectory],
    results: dict[str, TestResult],
    workspace_root: Path,
    guard: PositionGuard | None,
    repos_dir: Path | None,
    metrics: GraderMetrics,
) -> Grade:
    found = {m.trajectory_id: r for m in members if (r := results.get(m.trajectory_id)) is not None}
    passed = {tid: r.resolved for tid, r in found.items()}
    candidates = [CandidateInput.of(m, found.get(m.trajectory_id)) for m in members]
    start = time.monotonic()
    try:
        ws = build_group_workspace(workspace_root, group_id, task, candidates, passed, repos_dir)
    except Exception as exc:  # one unbuildable group must not stop the rest
        passing = [t for t, ok in passed.items() if ok]
        elapsed = time.monotonic() - start
        grade = tie_grade(group_id, passing, "workspace_error", detail=str(exc)[:1000], duration_s=elapsed)
        metrics.add(grade)
        return grade
    return grade_group(grader, ws, guard, metrics)
