"""Evaluate one policy on the held-out tasks: rollout, sandbox, oracle, then records and a summary.

The output folder holds ``trajectories.jsonl``, ``results.jsonl`` (TestResult), ``eval.jsonl`` (one
:class:`~gagar.policy.evaluate.TrajectoryEval` per answer) and ``summary.json`` (an :class:`EvalSummary`),
written last: a folder with a summary is a finished evaluation and is never redone.
"""

from __future__ import annotations

import time
from pathlib import Path

from pydantic import BaseModel

from gagar.experiment.config import EvalSettings
from gagar.policy.agent import AgentKind
from gagar.policy.evaluate import RolloutQuality, evaluate_detailed
from gagar.policy.rollout import make_backend
from gagar.policy.rollout import rollout as sample
from gagar.policy.visible_tests import VisibleTests
from gagar.records import atomic_write_text, write_records
from gagar.sandbox.runner import BackendName
from gagar.sandbox.runner import make_backend as make_sandbox
from gagar.schema.trajectory import SamplingParams
from gagar.tasks.loaders import load_tasks

__all__ = ["SUMMARY", "EvalSummary", "evaluate_policy", "read_summary"]

SUMMARY = "summary.json"


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


def read_summary(out: Path) -> EvalSummary | None:
    """The summary of a finished evaluation in ``out``; None when it has not finished."""
    path = out / SUMMARY
    return EvalSummary.model_validate_json(path.read_text(encoding="utf-8")) if path.exists() else None


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
) -> EvalSummary:
    """Sample ``settings.samples_per_task`` answers per task from ``policy`` with ``settings.agent``
    (the tool loop's RUN_TESTS in the same sandbox backend, visible tests only), test and judge them.

    Raises:
        ValueError: an empty task file or an unknown backend.
    """
    started = time.perf_counter()
    held_out = load_tasks(tasks)
    if not held_out:
        raise ValueError(f"{tasks}: no held-out tasks")
    generator, tokenizer = make_backend(str(policy), settings.backend)
    sandbox_backend = make_sandbox(BackendName(sandbox), workers)
    tool_loop = settings.agent.kind is AgentKind.TOOL_LOOP
    params = SamplingParams(
        temperature=settings.temperature,
        top_p=settings.top_p,
        max_new_tokens=settings.max_new_tokens,
        seed=sampling_seed,
    )
    trajectories = list(
        sample(
            held_out,
            generator,
            tokenizer,
            settings.samples_per_task,
            params,
            policy_version=str(policy),
            progress=progress,
            agent=settings.agent,
            run_tests=VisibleTests(sandbox_backend, settings.agent.max_tool_chars) if tool_loop else None,
        )
    )
    out.mkdir(parents=True, exist_ok=True)
    write_records(out / "trajectories.jsonl", trajectories)
    quality, results, judged = evaluate_detailed(held_out, trajectories, sandbox_backend)
    write_records(out / "results.jsonl", results)
    write_records(out / "eval.jsonl", judged)
    summary = EvalSummary(
        arm=arm,
        seed=seed,
        policy=str(policy),
        sampling_seed=sampling_seed,
        quality=quality,
        seconds=time.perf_counter() - started,
    )
    atomic_write_text(out / SUMMARY, summary.model_dump_json(indent=1))
    return summary
