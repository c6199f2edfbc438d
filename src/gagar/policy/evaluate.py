"""Quality of a policy's sampled answers: parse rate, pass@1, clean fixes, patch size and length.

Passing is decided by a sandbox backend (the real one: each patch runs the task's tests);
unnecessary modifications and patch size by the patch-quality oracle
(:func:`gagar.tasks.oracle.score_patch`). :func:`judge_trajectories` gives one
:class:`TrajectoryEval` record per answer, :func:`summarise` the :class:`RolloutQuality` of a set.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel, Field

from gagar.policy.agent import ran_tests
from gagar.records import Record
from gagar.sandbox.base import Prediction, SandboxBackend
from gagar.sandbox.edits import UNCHANGED, parse_edit_blocks
from gagar.sandbox.runner import evaluate_jobs
from gagar.schema.result import Status, TestResult
from gagar.schema.task import Task
from gagar.schema.trajectory import Trajectory
from gagar.tasks.diffs import DiffApplyError, DiffParseError
from gagar.tasks.oracle import score_patch

__all__ = [
    "RolloutQuality",
    "TrajectoryEval",
    "evaluate_detailed",
    "evaluate_trajectories",
    "judge_trajectories",
    "summarise",
]


class TrajectoryEval(Record):
    """One answer judged: its test verdict, and for a resolving answer the oracle's view of its patch."""

    trajectory_id: str
    instance_id: str
    status: Status
    resolved: bool
    parsed: bool
    """The answer parsed into a patch: well-formed blocks that apply to the repository."""
    well_formed: bool | None = None
    """The strict parser accepts the answer's blocks, whether or not their SEARCH text is in the
    file; None for a multi-turn trajectory (its edits are tool calls)."""
    unchanged: bool | None = None
    """Single-turn: the answer's blocks parse and apply but change nothing (so it does not parse into
    a patch); None for a multi-turn trajectory."""
    clean: bool
    """Resolved, and the oracle finds no unnecessary modification."""
    diff_size: int | None
    """Changed lines (added + removed) of a resolving patch; None when it does not resolve."""
    relative_size: float | None
    """``diff_size`` over the gold patch's changed lines; None when it does not resolve."""
    quality: float | None = None
    """The oracle's quality score of a resolving patch (:attr:`PatchQuality.quality`, higher is
    better); None when it does not resolve or the oracle could not score it."""
    n_response_tokens: int
    n_sampled_tokens: int = 0
    """Tokens the policy sampled (``loss_mask`` 1): the whole answer single-shot, the turns without
    tool output multi-turn."""
    turns: int
    submitted: bool = True
    """The answer ended by itself: the end token single-shot, SUBMIT within the budgets multi-turn."""
    tool_calls: dict[str, int] = Field(default_factory=dict)
    """Multi-turn: commands by kind."""
    oracle_error: str | None = None
    """Why the oracle could not score a resolving patch (counted as not clean, size unknown)."""


class RolloutQuality(BaseModel):
    """Summary of one evaluation (pass@1 is the mean over all sampled answers)."""

    n: int
    """Trajectories evaluated (infra errors excluded)."""
    parse_rate: float
    """Share of answers that parse into a patch (well-formed, and every SEARCH text found)."""
    well_formed_rate: float | None = None
    """Share of single-turn answers the strict parser accepts, found in the file or not; the gap to
    ``parse_rate`` is answers naming a missing file or a SEARCH text the file does not hold, and
    ``unchanged_rate``."""
    unchanged_rate: float | None = None
    """Share of single-turn answers whose blocks parse and apply but change nothing: SEARCH and REPLACE
    the same (a line quoted right and left as it was)."""
    pass_at_1: float
    """Share of answers that resolve their task (the resolved rate)."""
    clean_resolved_rate: float
    """Share of answers that resolve their task with no unnecessary modification."""
    unclean_share_of_resolving: float | None
    """Among resolving answers, the share the oracle calls not clean; None when none resolves."""
    relative_diff_size_resolved: float | None
    """Mean over resolving answers the oracle could score of changed lines relative to gold; None if none."""
    response_tokens_mean: float
    turns_mean: float
    sampled_tokens_mean: float = 0.0
    """Tokens the policy sampled per trajectory (tool output and chat scaffolding left out)."""
    sampled_tokens_per_turn_mean: float = 0.0
    submitted_rate: float = 0.0
    """Share that ended by themselves: SUBMIT within ``max_turns`` and the budgets (multi-turn),
    the end token within ``max_new_tokens`` (single-shot)."""
    ran_tests_rate: float = 0.0
    """Share of trajectories that ran the visible tests before they ended (RUN_TESTS, or a bash call
    running them; 0 for single-shot answers)."""
    tested_submissions_rate: float | None = None
    """Among the multi-turn trajectories that submitted, the share that ran the visible tests before
    submitting; None when none submitted (or single-shot)."""
    tool_calls_mean: dict[str, float] = Field(default_factory=dict)
    """Multi-turn: mean calls per trajectory by command."""
    n_resolved: int
    n_infra_errors: int


def judge_trajectories(
    tasks: Mapping[str, Task], trajectories: Sequence[Trajectory], results: Sequence[TestResult]
) -> list[TrajectoryEval]:
    """One record per trajectory, pairing it with its result (same order) and scoring resolving patches.

    Raises:
        KeyError: a trajectory whose instance_id is not in ``tasks``.
        ValueError: trajectories and results differ in length or trajectory ids.
    """
    if len(trajectories) != len(results):
        raise ValueError(f"{len(trajectories)} trajectories but {len(results)} test results")
    judged = []
    for tr, result in zip(trajectories, results, strict=True):
        if result.trajectory_id != tr.trajectory_id:
            raise ValueError(
                f"result {result.trajectory_id!r} does not belong to trajectory {tr.trajectory_id!r}"
            )
        quality, oracle_error = None, None
        if result.resolved:
            try:
                quality = score_patch(tasks[tr.instance_id], tr.model_patch)
            except (DiffParseError, DiffApplyError) as exc:  # the sandbox applied it; the oracle could not
                oracle_error = f"{type(exc).__name__}: {exc}"
        judged.append(
            TrajectoryEval(
                trajectory_id=tr.trajectory_id,
                instance_id=tr.instance_id,
                status=result.status,
                resolved=result.resolved,
                parsed=tr.parse_error is None,
                well_formed=_well_formed(tr),
                unchanged=None if _multi_turn(tr) else tr.parse_error == UNCHANGED,
                clean=quality is not None and quality.clean,
                diff_size=quality.diff_size if quality else None,
                relative_size=quality.relative_size if quality else None,
                quality=quality.quality if quality else None,
                n_response_tokens=tr.n_response_tokens,
                n_sampled_tokens=sum(tr.loss_mask),
                turns=tr.turns,
                submitted=tr.finish_reason == ("submit" if tr.tool_calls else "stop"),
                tool_calls=tr.tool_calls,
                oracle_error=oracle_error,
            )
        )
    return judged


def _multi_turn(trajectory: Trajectory) -> bool:
    return trajectory.turns != 1 or 0 in trajectory.loss_mask  # a tool loop: its edits are tool calls


def _well_formed(trajectory: Trajectory) -> bool | None:
    if _multi_turn(trajectory):
        return None
    if trajectory.parse_error is None:
        return True
    try:
        parse_edit_blocks(trajectory.response)
    except ValueError:
        return False
    return True


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarise(judged: Sequence[TrajectoryEval]) -> RolloutQuality:
    """The :class:`RolloutQuality` of ``judged``; infra errors are counted apart and excluded."""
    kept = [j for j in judged if j.status != Status.INFRA_ERROR]
    resolving = [j for j in kept if j.resolved]
    n = len(kept)
    return RolloutQuality(
        n=n,
        parse_rate=_mean([float(j.parsed) for j in kept]) or 0.0,
        well_formed_rate=_mean([float(j.well_formed) for j in kept if j.well_formed is not None]),
        unchanged_rate=_mean([float(j.unchanged) for j in kept if j.unchanged is not None]),
        pass_at_1=len(resolving) / n if n else 0.0,
        clean_resolved_rate=sum(j.clean for j in resolving) / n if n else 0.0,
        unclean_share_of_resolving=_mean([float(not j.clean) for j in resolving]),
        relative_diff_size_resolved=_mean(
            [j.relative_size for j in resolving if j.relative_size is not None]
        ),
        response_tokens_mean=_mean([float(j.n_response_tokens) for j in kept]) or 0.0,
        turns_mean=_mean([float(j.turns) for j in kept]) or 0.0,
        sampled_tokens_mean=_mean([float(j.n_sampled_tokens) for j in kept]) or 0.0,
        sampled_tokens_per_turn_mean=_mean([j.n_sampled_tokens / j.turns for j in kept]) or 0.0,
        submitted_rate=_mean([float(j.submitted) for j in kept]) or 0.0,
        ran_tests_rate=_mean([float(ran_tests(j.tool_calls)) for j in kept]) or 0.0,
        tested_submissions_rate=_mean(
            [float(ran_tests(j.tool_calls)) for j in kept if j.submitted and j.tool_calls]
        ),
        tool_calls_mean={
            kind: sum(j.tool_calls.get(kind, 0) for j in kept) / n
            for kind in sorted({k for j in kept for k in j.tool_calls})
        },
        n_resolved=len(resolving),
        n_infra_errors=len(judged) - n,
    )


def evaluate_detailed(
    tasks: Sequence[Task], trajectories: Sequence[Trajectory], sandbox: SandboxBackend
) -> tuple[RolloutQuality, list[TestResult], list[TrajectoryEval]]:
    """Run every trajectory's patch through ``sandbox``; the summary, the results and the judged records.

    Raises:
        KeyError: a trajectory whose instance_id is not among ``tasks``.
    """
    by_id = {t.instance_id: t for t in tasks}
    jobs = [
        (
            by_id[tr.instance_id],
            Prediction(
                instance_id=tr.instance_id,
                model_patch=tr.model_patch,
                trajectory_id=tr.trajectory_id,
                infra_error=tr.infra_error,
            ),
        )
        for tr in trajectories
    ]
    results = evaluate_jobs(sandbox, jobs)
    judged = judge_trajectories(by_id, trajectories, results)
    return summarise(judged), results, judged


def evaluate_trajectories(
    tasks: Sequence[Task], trajectories: Sequence[Trajectory], sandbox: SandboxBackend
) -> tuple[RolloutQuality, list[TestResult]]:
    """Run every trajectory's patch through ``sandbox`` and summarise (see :class:`RolloutQuality`).

    Raises:
        KeyError: a trajectory whose instance_id is not among ``tasks``.
    """
    quality, results, _ = evaluate_detailed(tasks, trajectories, sandbox)
    return quality, results
