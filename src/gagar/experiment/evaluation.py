"""Evaluate one policy on the held-out tasks: rollout, sandbox, oracle, then records and a summary.

The output folder holds ``trajectories.jsonl``, ``results.jsonl`` (TestResult), ``eval.jsonl`` (one
:class:`~gagar.policy.evaluate.TrajectoryEval` per answer) and ``summary.json`` (an :class:`EvalSummary`),
written last: a folder with a summary is a finished evaluation and is never redone.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel

from gagar import rl_step
from gagar.experiment.config import EvalSettings
from gagar.policy.evaluate import RolloutQuality, evaluate_detailed
from gagar.policy.rollout import make_backend
from gagar.records import atomic_write_text, read_records, write_records
from gagar.sandbox.runner import BackendName
from gagar.sandbox.runner import make_backend as make_sandbox
from gagar.schema.trajectory import Trajectory
from gagar.tasks.loaders import load_tasks
from gagar.train.config import RolloutSettings

__all__ = [
    "EVAL_RECORDS",
    "GREEDY_TOP_P",
    "SUMMARY",
    "EvalSummary",
    "changed_share",
    "evaluate_policy",
    "read_summary",
    "read_trajectories",
]

SUMMARY = "summary.json"
EVAL_RECORDS = "eval.jsonl"
"""The judged answers (:class:`~gagar.policy.evaluate.TrajectoryEval`) of an evaluation folder."""
GREEDY_TOP_P = 1e-9
"""Nucleus mass of greedy decoding: a nucleus this small holds only the most likely token, so the
sampler (whatever its seed) picks the argmax each step."""


class EvalSummary(BaseModel):
    """One policy's held-out evaluation."""

    arm: str
    """Arm name, or ``sft`` for the starting policy."""
    seed: int | None
    """Training seed of the run; None for the starting policy."""
    policy: str
    """The weights evaluated."""
    sampling_seed: int
    quality: RolloutQuality
    seconds: float
    """Wall time of the evaluation."""
    updates: int | None = None
    """Updates the evaluated policy had (greedy evaluations during training); None for a final one."""
    changed_from_start: float | None = None
    """Share of the tasks whose answer differs, token for token, from the starting policy's answer
    under the same decoding (greedy evaluations only)."""


def read_summary(out: Path) -> EvalSummary | None:
    """The summary of a finished evaluation in ``out``; None when it has not finished."""
    path = out / SUMMARY
    return EvalSummary.model_validate_json(path.read_text(encoding="utf-8")) if path.exists() else None


def read_trajectories(out: Path) -> list[Trajectory]:
    """The answers of the evaluation in ``out``."""
    return read_records(out / "trajectories.jsonl", Trajectory)


def changed_share(answers: Sequence[Trajectory], start: Sequence[Trajectory]) -> float:
    """Share of ``answers`` whose response tokens differ from the ``start`` answer to the same task.

    One answer per task on each side (greedy evaluations).

    Raises:
        ValueError: no answers, a task answered twice, or a task ``start`` did not answer.
    """
    before: dict[str, list[int]] = {}
    for t in start:
        if t.instance_id in before:
            raise ValueError(f"the starting answers hold task {t.instance_id!r} twice")
        before[t.instance_id] = t.response_token_ids
    if not answers:
        raise ValueError("no answers to compare with the start")
    seen: set[str] = set()
    changed = 0
    for t in answers:
        if t.instance_id in seen:
            raise ValueError(f"the answers hold task {t.instance_id!r} twice")
        if t.instance_id not in before:
            raise ValueError(f"task {t.instance_id!r} has no starting answer to compare with")
        seen.add(t.instance_id)
        changed += t.response_token_ids != before[t.instance_id]
    return changed / len(answers)


def evaluate_policy(
    *,
    policy: Path,
    tasks: Path,
    settings: EvalSettings,
    out: Path,
    arm: str,
    seed: int | None,
    sampling_seed: int,
    sandbox: str = "local",
    workers: int | None = None,
    progress: bool = True,
    max_tasks: int | None = None,
    updates: int | None = None,
    start: Sequence[Trajectory] | None = None,
) -> EvalSummary:
    """Sample ``settings.samples_per_task`` answers per task from ``policy`` with ``settings.agent``
    through the step's own rollout phase (:func:`gagar.rl_step.rollout`, run seed ``sampling_seed``;
    an agent's visible tests in the same sandbox backend), test and judge them.

    Args:
        max_tasks: evaluate on the first this many tasks only.
        updates: recorded in the summary (how many updates the policy had).
        start: the starting policy's answers under the same decoding; the summary's
            ``changed_from_start`` compares against them (:func:`changed_share`).

    Raises:
        ValueError: an empty task file or an unknown backend.
    """
    started = time.perf_counter()
    held_out = load_tasks(tasks)[:max_tasks]
    if not held_out:
        raise ValueError(f"{tasks}: no held-out tasks")
    generator, tokenizer = make_backend(str(policy), settings.backend, agent=settings.agent)
    sandbox_backend = make_sandbox(BackendName(sandbox), workers)
    sampling = RolloutSettings(
        group_size=settings.samples_per_task,
        temperature=settings.temperature,
        top_p=settings.top_p,
        max_new_tokens=settings.max_new_tokens,
        agent=settings.agent,
    )
    trajectories = rl_step.rollout(
        sampling,
        generator, tokenizer, held_out, seed=sampling_seed, step=0, gen_batch=0,
        policy_version=str(policy), sandbox=sandbox_backend, every_task=True, progress=progress,
    )  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    write_records(out / "trajectories.jsonl", trajectories)
    quality, results, judged = evaluate_detailed(held_out, trajectories, sandbox_backend)
    write_records(out / "results.jsonl", results)
    write_records(out / EVAL_RECORDS, judged)
    summary = EvalSummary(
        arm=arm,
        seed=seed,
        policy=str(policy),
        sampling_seed=sampling_seed,
        quality=quality,
        seconds=time.perf_counter() - started,
        updates=updates,
        changed_from_start=None if start is None else changed_share(trajectories, start),
    )
    atomic_write_text(out / SUMMARY, summary.model_dump_json(indent=1))
    return summary
