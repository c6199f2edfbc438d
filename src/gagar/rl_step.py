"""One RL step, top to bottom, on in-memory data: rollout, evaluate, select, grade, advantages, update.

Read it like CleanRL's ``ppo.py``: each function below is one phase of the step, in the order the
step runs them, each taking the run's :class:`~gagar.train.config.TrainConfig` (or its section)
and deciding nothing the config does not say. Every runner executes these same functions:
:func:`run_step` strings them together in one process (``gagar train``, through
:class:`gagar.train.trainer.Trainer`), and each stage of the pipelines (``gagar run``, Kubeflow,
Argo) calls one of them with I/O only at its edges (:mod:`gagar.pipeline.store_stages`).

The phases and what they hand on::

    rollout     policy + tasks               -> trajectories        (one generation batch)
    evaluate    tasks + trajectories         -> test results        (the sandbox)
    select      generation batches           -> Selection           (dynamic sampling, once a step)
    grade       kept groups                  -> grades              (estimators that use a grader)
    advantages  kept batch + grades          -> batch entries       (through the estimator registry)
    update      policy + kept trajectories   -> checkpoint step-N   (PPO-clip epochs)
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gagar.advantage import (
    AdvantageInputs,
    Decay,
    Estimator,
    RewardBatch,
    assemble_batch,
    compute_advantages,
)
from gagar.policy.agent import COMMANDS, INVALID, TOOL_CALL_KINDS, AgentKind, ran_tests
from gagar.schema.batch import BatchEntry
from gagar.schema.grade import Grade, ranks_for, scores_for
from gagar.schema.result import HackKind, Status, TestResult
from gagar.schema.selection import GeneratedBatch, KeptBatch, Selection
from gagar.schema.task import Task
from gagar.schema.trajectory import SamplingParams, Trajectory

if TYPE_CHECKING:
    from gagar.grader.base import Grader, GraderMetrics, PositionGuard
    from gagar.train.config import AdvantageSettings, RolloutSettings, TrainConfig

__all__ = [
    "Grading",
    "StepInputs",
    "StepOutput",
    "advantages",
    "evaluate",
    "evaluate_while_generating",
    "generate",
    "generation_batch",
    "grade",
    "make_grader",
    "merge_rollout_metrics",
    "rank",
    "rollout",
    "rollout_metrics",
    "rollout_stream",
    "run_step",
    "sampling_seed",
    "sandbox_metrics",
    "select",
    "select_tasks",
    "tasks_per_call",
    "timed",
    "update",
]


# --------------------------------------------------------------------------- rollout


def select_tasks(tasks: Sequence[Task], n: int, *, seed: int, step: int, gen_batch: int) -> list[Task]:
    """``n`` distinct tasks for generation batch ``gen_batch`` of ``step``, the same for the same seed."""
    if not tasks:
        raise ValueError("the task file holds no tasks")
    rng = np.random.default_rng([seed, step, gen_batch])
    picked = rng.choice(len(tasks), size=min(n, len(tasks)), replace=False)
    return [tasks[int(i)] for i in picked]


def sampling_seed(seed: int, step: int, gen_batch: int) -> int:
    """The sampling seed of one generation batch: distinct per run seed, step and batch."""
    return seed * 1_000_003 + step * 1_009 + gen_batch


def rollout(
    settings: RolloutSettings,
    generator: Any,
    tokenizer: Any,
    tasks: Sequence[Task],
    *,
    seed: int,
    step: int,
    gen_batch: int,
    policy_version: str,
    sandbox: Any = None,
    every_task: bool = False,
    progress: bool = False,
) -> list[Trajectory]:
    """:func:`rollout_stream`, whole."""
    stream = rollout_stream(
        settings, generator, tokenizer, tasks, seed=seed, step=step, gen_batch=gen_batch,
        policy_version=policy_version, sandbox=sandbox, every_task=every_task, progress=progress,
    )  # fmt: skip
    return list(stream)


def tasks_per_call(generator: Any, group_size: int) -> int | None:
    """How many tasks go to the engine at once: an in-process engine that samples in rows of
    ``batch_size`` gets one such row batch of tasks at a time (the same work, and each call's answers
    can be evaluated while the next is sampled); a server (no ``batch_size``) gets them all in flight."""
    rows = getattr(generator, "batch_size", None)
    return max(1, rows // group_size) if isinstance(rows, int) else None


def rollout_stream(
    settings: RolloutSettings,
    generator: Any,
    tokenizer: Any,
    tasks: Sequence[Task],
    *,
    seed: int,
    step: int,
    gen_batch: int,
    policy_version: str,
    sandbox: Any = None,
    every_task: bool = False,
    progress: bool = False,
) -> Iterator[Trajectory]:
    """``settings.group_size`` sampled answers for each of ``settings.gen_batch_groups`` tasks drawn
    for generation batch ``gen_batch`` of ``step`` (every task, in order, with ``every_task``) from
    ``settings.agent``, yielded as each engine call returns. An agent that runs the visible tests
    while sampling runs them in ``sandbox``."""
    from gagar.policy.rollout import agent_for
    from gagar.policy.rollout import rollout as sample
    from gagar.policy.visible_tests import VisibleTests

    agent = agent_for(settings.agent)
    if agent.needs_sandbox and sandbox is None:
        raise ValueError(f"the {settings.agent.kind.value} agent runs the visible tests: it needs a sandbox")
    run_tests = (
        VisibleTests(sandbox, settings.agent.max_tool_chars)
        if agent.needs_sandbox and settings.agent.kind is AgentKind.TOOL_LOOP
        else None
    )
    chosen = (
        list(tasks)
        if every_task
        else select_tasks(tasks, settings.gen_batch_groups, seed=seed, step=step, gen_batch=gen_batch)
    )
    params = SamplingParams(
        temperature=settings.temperature,
        top_p=settings.top_p,
        max_new_tokens=settings.max_new_tokens,
        seed=sampling_seed(seed, step, gen_batch),
    )
    yield from sample(
        chosen,
        generator,
        tokenizer,
        settings.group_size,
        params,
        step=step,
        gen_batch=gen_batch,
        # a conversation agent advances every conversation of the batch one turn per engine call
        tasks_per_call=None
        if agent.samples_conversations
        else tasks_per_call(generator, settings.group_size),
        policy_version=policy_version,
        progress=progress,
        agent=settings.agent,
        run_tests=run_tests,
        sandbox=sandbox,
    )


ROLLOUT_MEANS = (
    "rollout/parse_rate",
    "rollout/response_tokens_mean",
    "rollout/turns_mean",
    "rollout/sampled_tokens_mean",
    "rollout/sampled_tokens_per_turn_mean",
    "rollout/ran_tests_ratio",
    "rollout/submitted_ratio",
    "rollout/edits_reverted_mean",
    *(
        f"rollout/tool_calls/{key}"
        for key in dict.fromkeys(k.lower() for k in (*COMMANDS, INVALID, *TOOL_CALL_KINDS))
    ),
)
"""The per-trajectory means of :func:`rollout_metrics` (merged across generation batches by count)."""


def rollout_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """``rollout/…``: how many trajectories, the share that parsed, the mean response length (tokens,
    tool output included), turns, tokens the policy sampled (per trajectory and per turn), tool calls
    by kind per trajectory, the share that ran tests and that submitted (single-shot answers count
    as submitted), edits reverted."""
    n = len(trajectories)
    if n == 0:
        return {"rollout/trajectories": 0.0, **dict.fromkeys(ROLLOUT_MEANS, 0.0)}

    def mean(values: Iterable[float]) -> float:
        return sum(values) / n

    sampled = [sum(t.loss_mask) for t in trajectories]
    metrics = {
        "rollout/trajectories": float(n),
        "rollout/parse_rate": mean(t.parse_error is None for t in trajectories),
        "rollout/response_tokens_mean": mean(t.n_response_tokens for t in trajectories),
        "rollout/turns_mean": mean(t.turns for t in trajectories),
        "rollout/sampled_tokens_mean": mean(sampled),
        "rollout/sampled_tokens_per_turn_mean": mean(
            s / t.turns for s, t in zip(sampled, trajectories, strict=True)
        ),
        "rollout/ran_tests_ratio": mean(ran_tests(t.tool_calls) for t in trajectories),
        "rollout/submitted_ratio": mean(
            t.finish_reason == "submit" if t.tool_calls else t.finish_reason == "stop" for t in trajectories
        ),
        "rollout/edits_reverted_mean": mean(t.edits_reverted for t in trajectories),
    }
    kinds: dict[str, list[str]] = {}  # the tool loop's VIEW and the tool-call agent's view share a key
    for kind in (*COMMANDS, INVALID, *TOOL_CALL_KINDS):
        kinds.setdefault(kind.lower(), []).append(kind)
    for key, same in kinds.items():  # mean calls per trajectory
        metrics[f"rollout/tool_calls/{key}"] = mean(
            sum(t.tool_calls.get(k, 0) for k in same) for t in trajectories
        )
    return metrics


# --------------------------------------------------------------------------- evaluate


def evaluate(
    tasks: Sequence[Task],
    trajectories: Iterable[Any],
    sandbox: Any,
    on_result: Callable[[TestResult], None] | None = None,
) -> list[TestResult]:
    """Run every trajectory's patch (any record with ``instance_id``, ``model_patch``,
    ``trajectory_id``) against its task's tests in ``sandbox``; one TestResult each.

    ``trajectories`` may arrive lazily: the local sandbox starts on each as it comes.
    """
    from gagar.sandbox.base import Prediction
    from gagar.sandbox.runner import evaluate_jobs, iter_jobs

    predictions = (
        p if isinstance(p, Prediction) else Prediction.model_validate(p.model_dump()) for p in trajectories
    )
    return evaluate_jobs(sandbox, iter_jobs(tasks, predictions), on_result)


def evaluate_while_generating(
    tasks: Sequence[Task], trajectories: Iterable[Trajectory], sandbox: Any, timings: dict[str, float]
) -> GeneratedBatch:
    """Generate ``trajectories`` (a lazy :func:`rollout_stream`) in this thread while ``sandbox``
    evaluates each one generated so far in another, so the tests of one engine call run while the
    next is sampled.

    ``timings`` gains ``perf/rollout_s`` (generating), ``perf/sandbox_s`` (waiting for the sandbox
    once generation ended: the part of its time nothing hid) and ``perf/sandbox_busy_s`` (from the
    first evaluation's start to the last result).
    """
    handoff: queue.SimpleQueue[Trajectory | None] = queue.SimpleQueue()
    started: list[float] = []

    def arriving() -> Iterator[Trajectory]:
        while (trajectory := handoff.get()) is not None:
            if not started:
                started.append(time.perf_counter())
            yield trajectory

    generated: list[Trajectory] = []
    with ThreadPoolExecutor(1, thread_name_prefix="evaluate") as pool:
        results = pool.submit(evaluate, tasks, arriving(), sandbox)
        try:
            with timed(timings, "perf/rollout_s"):
                for trajectory in trajectories:
                    generated.append(trajectory)
                    handoff.put(trajectory)
        finally:
            handoff.put(None)  # the evaluating thread ends with the stream, even when generation failed
        with timed(timings, "perf/sandbox_s"):
            outcome = results.result()
    timings["perf/sandbox_busy_s"] = timings.get("perf/sandbox_busy_s", 0.0) + (
        time.perf_counter() - started[0] if started else 0.0
    )
    return generation_batch(generated, outcome)


def generate(
    config: TrainConfig,
    inputs: StepInputs,
    gen_batch: int,
    timings: dict[str, float],
    *,
    progress: bool = False,
) -> GeneratedBatch:
    """Generation batch ``gen_batch`` of the step: rolled out and evaluated, beside each other where
    the agent allows (:attr:`gagar.policy.agent.AgentKind.overlaps_evaluation`), else one after the
    other. ``timings`` gains ``perf/rollout_s``, ``perf/sandbox_s`` (and ``perf/sandbox_busy_s``)."""
    trajectories = rollout_stream(
        config.rollout, inputs.generator, inputs.tokenizer, inputs.tasks, seed=config.seed,
        step=inputs.step, gen_batch=gen_batch, policy_version=inputs.policy_version,
        sandbox=inputs.sandbox, progress=progress,
    )  # fmt: skip
    from gagar.policy.rollout import agent_for

    if agent_for(config.rollout.agent).overlaps_evaluation:
        return evaluate_while_generating(inputs.tasks, trajectories, inputs.sandbox, timings)
    with timed(timings, "perf/rollout_s"):
        generated = list(trajectories)
    with timed(timings, "perf/sandbox_s"):
        return generation_batch(generated, evaluate(inputs.tasks, generated, inputs.sandbox))


def sandbox_metrics(results: Sequence[TestResult]) -> dict[str, float]:
    """``sandbox/…`` counts by status and by hack kind, the hack ratio and the resolved rate (infra
    errors excluded from both), and mean duration."""
    n = len(results)
    counted = [r for r in results if r.status is not Status.INFRA_ERROR]
    metrics = {f"sandbox/{s.value}": float(sum(r.status is s for r in results)) for s in Status}
    for kind in HackKind:
        metrics[f"sandbox/hacks/{kind.value}"] = float(
            sum(any(f.kind is kind for f in r.hacks) for r in results)
        )
    hacks = sum(r.status is Status.HACK for r in counted)
    metrics["sandbox/hack_ratio"] = hacks / len(counted) if counted else 0.0
    metrics["sandbox/evaluations"] = float(n)
    metrics["sandbox/duration_s_mean"] = sum(r.duration_s for r in results) / n if n else 0.0
    metrics["rollout/resolved_rate"] = sum(r.resolved for r in counted) / len(counted) if counted else 0.0
    return metrics


# --------------------------------------------------------------------------- select


def generation_batch(trajectories: Sequence[Trajectory], results: Iterable[TestResult]) -> GeneratedBatch:
    """The trajectories with their results in trajectory order.

    Raises:
        ValueError: naming the first trajectory that has no result.
    """
    by_id = {r.trajectory_id: r for r in results}
    missing = [t.trajectory_id for t in trajectories if t.trajectory_id not in by_id]
    if missing:
        raise ValueError(f"no result for trajectory {missing[0]!r} ({len(missing)} missing)")
    return GeneratedBatch(list(trajectories), [by_id[t.trajectory_id] for t in trajectories])


def _as_sampling_input(batch: GeneratedBatch) -> RewardBatch:
    return RewardBatch(
        rewards=np.array([float(r.resolved) for r in batch.results]),
        group_ids=np.array([t.group_id for t in batch.trajectories]),
        infra_error=np.array([r.status is Status.INFRA_ERROR for r in batch.results]),
    )


def select(
    batches: Iterable[GeneratedBatch],
    settings: RolloutSettings,
    on_kept: Callable[[GeneratedBatch], None] | None = None,
) -> Selection:
    """Dynamic sampling: consume generation batches (lazily) until ``settings.train_batch_groups``
    mixed groups are kept or ``settings.max_gen_batches`` ran out; see
    :func:`gagar.advantage.assemble_batch`. ``on_kept`` gets each batch's kept part (its kept groups'
    trajectories and results) before the next batch is drawn."""
    train_batch_groups, max_gen_batches = settings.train_batch_groups, settings.max_gen_batches
    consumed: list[GeneratedBatch] = []

    def sampled() -> Iterator[RewardBatch]:
        for batch in batches:
            consumed.append(batch)
            yield _as_sampling_input(batch)

    def kept_part(b: int, mask: np.ndarray) -> None:
        if on_kept is not None:
            rows = np.flatnonzero(mask)
            batch = consumed[b]
            on_kept(GeneratedBatch([batch.trajectories[i] for i in rows], [batch.results[i] for i in rows]))

    assembly = assemble_batch(
        sampled(), train_batch_groups=train_batch_groups, max_gen_batches=max_gen_batches, on_kept=kept_part
    )
    kept = [(b, int(i)) for b, mask in enumerate(assembly.keep) for i in np.flatnonzero(mask)]
    metrics = {**assembly.counts.as_metrics(), "sampling/batch_full": float(assembly.full)}
    return Selection(batches=consumed[: len(assembly.keep)], kept=kept, metrics=metrics)


# --------------------------------------------------------------------------- grade


def make_grader(config: TrainConfig) -> Grader | None:
    """The grader ``config`` names, or None when its estimator uses none (the registry decides)."""
    from gagar.grader.run import make_grader as build

    if not config.advantage.algo.uses_grader:
        return None
    g = config.grader
    return build(g.kind, model_dir=g.model, endpoint=g.endpoint, max_turns=g.max_turns)


class Grading:
    """The grade phase, fed generation batch by generation batch: :meth:`submit` starts grading a
    batch's kept groups in a background thread and returns, so they are graded while the next batch
    generates (the LLM grader's server decodes every conversation in flight together);
    :meth:`result` waits for all of them. :func:`grade` is the same with everything submitted at once.

    When the estimator uses no grader (:attr:`gagar.advantage.Estimator.uses_grader`), nothing is
    graded and :meth:`result` is ``(None, {})``.
    """

    def __init__(
        self,
        config: TrainConfig,
        grader: Grader | None,
        tasks: Sequence[Task],
        workspace: Path,
        *,
        repos_dir: Path | None = None,
        progress: bool = False,
    ) -> None:
        from gagar.grader.base import PositionGuard

        self.used = config.advantage.algo.uses_grader
        if self.used and grader is None:
            raise ValueError(f"algo {config.advantage.algo.value!r} ranks with a grader, and none was given")
        threshold = config.grader.position_guard
        self._guard = None if threshold is None else PositionGuard(threshold)
        self._grader, self._tasks, self._workspace = grader, tasks, workspace
        self._repos_dir, self._progress = repos_dir, progress
        self._pool = ThreadPoolExecutor(thread_name_prefix="grade-ahead")
        self._pending: list[Future[tuple[list[Grade], GraderMetrics]]] = []
        self._first_start: float | None = None
        self._last_end: float | None = None

    def __enter__(self) -> Grading:
        return self

    def __exit__(self, *exc: object) -> None:
        """Stops the background threads: gradings not yet started are cancelled, running ones finish."""
        self._pool.shutdown(wait=True, cancel_futures=True)

    def submit(self, trajectories: Sequence[Trajectory], results: Iterable[TestResult]) -> None:
        """Start grading the groups of ``trajectories`` (whole groups; ``results`` may hold more) in the
        background."""
        if not self.used or not trajectories:
            return
        self._pending.append(self._pool.submit(self._rank, list(trajectories), list(results)))

    def _rank(
        self, trajectories: list[Trajectory], results: list[TestResult]
    ) -> tuple[list[Grade], GraderMetrics]:
        start = time.perf_counter()
        self._first_start = start if self._first_start is None else min(self._first_start, start)
        try:
            return _rank_groups(
                self._grader, self._tasks, trajectories, results, self._workspace, guard=self._guard,
                repos_dir=self._repos_dir, progress=self._progress,
            )  # fmt: skip
        finally:
            end = time.perf_counter()
            self._last_end = end if self._last_end is None else max(self._last_end, end)

    def result(self, timings: dict[str, float] | None = None) -> tuple[list[Grade] | None, dict[str, float]]:
        """One Grade per submitted group, in submission order, and ``grader/…``; ``timings`` gains
        ``perf/grade_busy_s`` (from the first grading's start to the last one's end)."""
        done = [f.result() for f in self._pending]
        if not self.used:
            return None, {}
        if timings is not None and self._first_start is not None and self._last_end is not None:
            busy = self._last_end - self._first_start
            timings["perf/grade_busy_s"] = timings.get("perf/grade_busy_s", 0.0) + busy
        from gagar.grader.base import GraderMetrics

        metrics = GraderMetrics()
        for _, part in done:
            metrics.merge(part)
        return [g for grades, _ in done for g in grades], metrics.as_dict()


def grade(
    config: TrainConfig,
    grader: Grader | None,
    tasks: Sequence[Task],
    trajectories: Sequence[Trajectory],
    results: Iterable[TestResult],
    workspace: Path,
    *,
    repos_dir: Path | None = None,
    progress: bool = False,
) -> tuple[list[Grade] | None, dict[str, float]]:
    """Rank the passing members of each group of ``trajectories`` (the kept ones) when the estimator
    uses a grader (:attr:`gagar.advantage.Estimator.uses_grader`); one Grade per group and
    ``grader/…``. None and no metrics when it does not. :class:`Grading` with everything at once.

    A grader that fails on a group falls back to ties for it (exactly GRPO) and the fallback is counted.
    """
    with Grading(config, grader, tasks, workspace, repos_dir=repos_dir, progress=progress) as grading:
        grading.submit(trajectories, results)
        return grading.result()


def rank(
    grader: Grader,
    tasks: Sequence[Task],
    trajectories: Sequence[Trajectory],
    results: Iterable[TestResult],
    workspace: Path,
    *,
    guard: PositionGuard | None = None,
    repos_dir: Path | None = None,
    progress: bool = False,
) -> tuple[list[Grade], dict[str, float]]:
    """What :func:`grade` does once it knows a grader is used: one Grade per group of
    ``trajectories`` by ``grader`` (twice, in opposite orders, with ``guard``), and ``grader/…``."""
    grades, metrics = _rank_groups(
        grader, tasks, trajectories, results, workspace, guard=guard, repos_dir=repos_dir, progress=progress
    )
    return grades, metrics.as_dict()


def _rank_groups(
    grader: Grader | None,
    tasks: Sequence[Task],
    trajectories: Sequence[Trajectory],
    results: Iterable[TestResult],
    workspace: Path,
    *,
    guard: PositionGuard | None,
    repos_dir: Path | None,
    progress: bool,
) -> tuple[list[Grade], GraderMetrics]:
    from gagar.grader.run import grade_groups

    assert grader is not None  # Grading refuses a missing grader when one is used
    task_map = {t.instance_id: t for t in tasks}
    outcome = {r.trajectory_id: r for r in results}
    return grade_groups(
        grader, task_map, trajectories, outcome, workspace, guard=guard, repos_dir=repos_dir,
        progress=progress,
    )  # fmt: skip


# --------------------------------------------------------------------------- advantages


def advantages(
    settings: AdvantageSettings, kept_batch: KeptBatch, grades: Sequence[Grade] | None
) -> tuple[list[BatchEntry], dict[str, float]]:
    """The advantages of the kept trajectories by ``settings.algo`` (through the estimator registry,
    with every one of ``settings``' constants), as the train batch, and ``advantage/…``.

    An estimator that uses a grader needs ``grades``: a passing member its grader did not rank (its
    group was not graded) ties with its group.
    """
    algo, config = settings.algo, settings.estimator_config()
    kept = kept_batch.kept
    ids = [k.trajectory_id for k in kept]
    rewards = np.array([k.reward for k in kept], dtype=np.float64)  # (n_kept,)
    group_ids = np.array([k.group_id for k in kept])
    ranks = scores = None
    if algo.uses_grader:
        if grades is None:
            raise ValueError(f"algo {algo.value!r} needs the grades of the grade phase")
        ranks = ranks_for(ids, grades)
        unranked = (rewards > 0) & np.isnan(ranks)
        ranks = np.where(unranked, 1.0, ranks)
        if config.decay is Decay.SCORE:
            scores = np.where(unranked, -1.0, scores_for(ids, grades))
    inputs = AdvantageInputs(rewards=rewards, group_ids=group_ids, ranks=ranks, scores=scores)
    base, _ = compute_advantages(Estimator.GRPO, inputs, config)
    advantage, metrics = compute_advantages(algo, inputs, config)
    entries = [
        BatchEntry(
            trajectory_id=k.trajectory_id,
            group_id=k.group_id,
            gen_batch=k.gen_batch,
            reward=k.reward,
            advantage=float(advantage[i]),
            grpo_advantage=float(base[i]),
            rank=None if ranks is None or np.isnan(ranks[i]) else float(ranks[i]),
        )
        for i, k in enumerate(kept)
    ]
    return entries, {"credit/moved_ratio": 0.0, **metrics}


# --------------------------------------------------------------------------- the step


@dataclass(frozen=True)
class StepInputs:
    """What one step needs besides its settings: the step, where its policy is, live backends."""

    step: int
    policy: Path
    """The weights the step samples from and updates (a model or adapter directory)."""
    policy_version: str
    """What the trajectories record as the version they were sampled by."""
    tasks: list[Task]
    generator: Any
    """The generation backend (:class:`gagar.policy.generation.GenerationBackend`)."""
    tokenizer: Any
    sandbox: Any
    """The sandbox backend (:class:`gagar.sandbox.base.SandboxBackend`)."""
    grader: Grader | None
    """The grader (:func:`make_grader`: None when the estimator uses none)."""
    workspace: Path
    """Scratch directory for the graders' shared group workspaces."""
    checkpoints: Path
    """Where the update writes checkpoint ``step-N``."""


@dataclass
class StepOutput:
    """Everything one step produced, in memory, and its metrics."""

    selection: Selection
    grades: list[Grade] | None
    batch: list[BatchEntry]
    metrics: dict[str, float] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    """``perf/<phase>_s``: seconds spent in each phase."""


@contextmanager
def timed(timings: dict[str, float], key: str) -> Iterator[None]:
    """Adds the seconds spent inside the block to ``timings[key]`` (``perf/<phase>_s``)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[key] = timings.get(key, 0.0) + time.perf_counter() - start


def update(
    config: TrainConfig,
    *,
    policy: Path,
    trajectories: Sequence[Trajectory],
    batch: Sequence[BatchEntry],
    checkpoints: Path,
    step: int,
    policy_version: str | None,
    reference: Path | None,
) -> dict[str, float]:
    """One policy update on the train batch by ``config.optim`` (LoRA per ``config.lora``,
    data-parallel per ``config.distributed`` under torchrun): checkpoint ``step-N`` under
    ``checkpoints``; ``loss/…`` and ``train/…``. ``reference`` is the frozen policy of the KL term
    (used only when its coefficient is positive)."""
    from gagar.train.update import run_update

    return run_update(
        policy=policy,
        trajectories=list(trajectories),
        batch=list(batch),
        checkpoints=checkpoints,
        step=step,
        seed=config.seed,
        optim=config.optim,
        reference=reference,
        keep_last=config.keep_checkpoints,
        lora=config.lora,
        policy_version=policy_version,
        strategy=config.distributed.strategy,
    )


def run_step(
    inputs: StepInputs,
    config: TrainConfig,
    *,
    on_generated: Callable[[int, GeneratedBatch], None] | None = None,
    before_update: Callable[[StepOutput], None] | None = None,
    progress: bool = False,
) -> StepOutput:
    """One RL step with ``config``, every phase in this process.

    ``on_generated`` sees each generation batch once evaluated; ``before_update`` sees the step's
    output before the (slow, checkpoint-writing) update, e.g. to save what it has so far.
    """
    timings: dict[str, float] = {}
    rollout_rows: list[dict[str, float]] = []

    def generation() -> Iterator[GeneratedBatch]:  # rolled out and evaluated on demand
        for b in range(config.rollout.max_gen_batches):
            batch = generate(config, inputs, b, timings, progress=progress)
            rollout_rows.append(rollout_metrics(batch.trajectories))
            if on_generated is not None:
                on_generated(b, batch)
            yield batch

    # each batch's kept groups are graded while the next batch generates
    with Grading(config, inputs.grader, inputs.tasks, inputs.workspace, progress=progress) as grading:
        selection = select(
            generation(), config.rollout, on_kept=lambda kept: grading.submit(kept.trajectories, kept.results)
        )
        metrics = {
            **sandbox_metrics([r for b in selection.batches for r in b.results]),
            **merge_rollout_metrics(rollout_rows),
        }
        with timed(timings, "perf/grade_s"):  # the grading nothing hid: waited for once generation ended
            grades, grade_metrics = grading.result(timings)
    metrics |= grade_metrics
    with timed(timings, "perf/redistribute_s"):
        batch, advantage_metrics = advantages(config.advantage, selection.kept_batch, grades)
        metrics |= selection.metrics | advantage_metrics
    output = StepOutput(selection=selection, grades=grades, batch=batch, metrics=metrics, timings=timings)
    if before_update is not None:
        before_update(output)
    with timed(timings, "perf/train_s"):
        metrics |= update(
            config,
            policy=inputs.policy,
            trajectories=selection.trajectories,
            batch=batch,
            checkpoints=inputs.checkpoints,
            step=inputs.step,
            policy_version=inputs.policy_version,
            reference=Path(config.policy),
        )
    return output


def merge_rollout_metrics(rows: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The ``rollout/…`` metrics of several generation batches: counts summed, rates weighted by count."""
    n = sum(row["rollout/trajectories"] for row in rows)
    merged = {"rollout/trajectories": n}
    for key in ROLLOUT_MEANS:
        merged[key] = sum(row[key] * row["rollout/trajectories"] for row in rows) / n if n else 0.0
    return merged
