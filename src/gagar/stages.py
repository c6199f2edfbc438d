"""The standalone stage commands' file I/O: ``gagar rollout``, ``gagar sandbox run`` and ``gagar grade``
read their inputs, call one phase of :mod:`gagar.rl_step` and write their outputs (atomically, so
a command that dies leaves either its previous output or none).

These are tools for one stage on its own (sample a predictions file, judge one, grade one); the RL
step itself runs through :func:`gagar.rl_step.run_step` (``gagar train``) or the pipelines
(:mod:`gagar.pipeline.store_stages`), never through here.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gagar import rl_step
from gagar.grader.llm import GROUP_TIMEOUT_S
from gagar.records import read_records, write_records
from gagar.schema.result import TestResult
from gagar.schema.task import Task
from gagar.schema.trajectory import Trajectory

if TYPE_CHECKING:
    from gagar.grader.run import GraderKind
    from gagar.sandbox.runner import BackendName
    from gagar.train.config import RolloutSettings

__all__ = ["grade_stage", "rollout_stage", "sandbox_stage"]

PathLike = str | os.PathLike[str]


def rollout_stage(
    *,
    policy: PathLike,
    tasks: PathLike,
    out: PathLike,
    settings: RolloutSettings,
    step: int,
    seed: int,
    every_task: bool = False,
    backend: str = "hf",
    endpoint: str | None = None,
    model_name: str | None = None,
    sandbox: BackendName | str = "local",
    progress: bool = True,
) -> dict[str, float]:
    """Sample ``settings.group_size`` answers for each of ``settings.gen_batch_groups`` tasks drawn
    for ``step`` (every task, in file order, with ``every_task``) and write them as trajectories; an
    agent that runs the visible tests runs them in the ``sandbox`` backend."""
    from gagar.policy.rollout import agent_for, make_backend
    from gagar.sandbox.runner import BackendName
    from gagar.sandbox.runner import make_backend as make_sandbox
    from gagar.tasks.loaders import load_tasks

    generator, tokenizer = make_backend(
        str(policy), backend, endpoint=endpoint, model_name=model_name, agent=settings.agent
    )
    runs_tests = agent_for(settings.agent).needs_sandbox
    trajectories = rl_step.rollout(
        settings, generator, tokenizer, load_tasks(tasks), seed=seed, step=step, gen_batch=0,
        policy_version=model_name or str(policy), every_task=every_task, progress=progress,
        sandbox=make_sandbox(BackendName(sandbox)) if runs_tests else None,
    )  # fmt: skip
    write_records(out, trajectories)
    return rl_step.rollout_metrics(trajectories)


def sandbox_stage(
    *,
    tasks: PathLike,
    trajectories: PathLike,
    out: PathLike,
    backend: BackendName | str = "local",
    workers: int | None = None,
    progress: bool = True,
) -> dict[str, float]:
    """Run every trajectory's (or SWE-bench prediction's) patch against its task's tests; write one
    TestResult each."""
    from tqdm import tqdm

    from gagar.sandbox.base import Prediction
    from gagar.sandbox.runner import BackendName, make_backend

    predictions = read_records(trajectories, Prediction)
    sandbox = make_backend(BackendName(backend), workers)
    with tqdm(total=len(predictions), desc="sandbox", unit="eval", disable=not progress) as bar:
        results = rl_step.evaluate(read_records(tasks, Task), predictions, sandbox, lambda _: bar.update(1))
    write_records(out, results)
    return rl_step.sandbox_metrics(results)


def grade_stage(
    *,
    tasks: PathLike,
    trajectories: Sequence[PathLike],
    results: Sequence[PathLike],
    out: PathLike,
    workspace: PathLike,
    grader: GraderKind | str = "heuristic",
    grader_model: PathLike | None = None,
    endpoint: str | None = None,
    model: str | None = None,
    api: str = "chat",
    max_turns: int | None = None,
    timeout_s: float = GROUP_TIMEOUT_S,
    position_guard: float | None = None,
    repos_dir: PathLike | None = None,
    progress: bool = True,
) -> dict[str, float]:
    """Rank the passing trajectories of every group; write one Grade per group.

    A grader that fails on a group falls back to ties for that group (exactly GRPO) and the
    fallback is counted. With ``position_guard`` each group is graded twice in opposite orders and
    tied when the two rankings are further apart (Kendall distance) than it.
    """
    from gagar.grader.base import PositionGuard
    from gagar.grader.run import make_grader

    if api not in ("chat", "completions"):
        raise ValueError(f"api must be 'chat' or 'completions', got {api!r}")
    kept = [t for path in trajectories for t in read_records(path, Trajectory)]
    outcome = [r for path in results for r in read_records(path, TestResult)]
    instance = make_grader(
        grader, model_dir=Path(grader_model) if grader_model is not None else None, endpoint=endpoint,
        model=model, api=api, max_turns=max_turns, timeout_s=timeout_s,  # type: ignore[arg-type]
    )  # fmt: skip
    grades, metrics = rl_step.rank(
        instance,
        read_records(tasks, Task),
        kept,
        outcome,
        Path(workspace),
        guard=PositionGuard(position_guard) if position_guard is not None else None,
        repos_dir=Path(repos_dir) if repos_dir is not None else None,
        progress=progress,
    )
    write_records(out, grades)
    return metrics
