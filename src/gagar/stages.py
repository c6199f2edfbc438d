"""One plain function per pipeline stage: paths and parameters in, files and a metrics dict out.

The KFP components in ``components/<stage>/`` are thin wrappers around these functions, and the
in-process trainer (:mod:`gagar.train.trainer`) calls them directly; there is no other place a
stage's logic lives. Every output file is written atomically, so a stage that dies leaves either
its previous output or none.

Stages and their files, for one RL step::

    rollout      tasks.jsonl + policy/            -> trajectories-<b>.jsonl   (one per generation batch b)
    sandbox      tasks.jsonl + trajectories-<b>   -> results-<b>.jsonl
    grade        tasks + trajectories + results   -> grades.jsonl             (kept groups only)
    redistribute trajectories + results + grades  -> batch.jsonl              (dynamic sampling + advantages)
    train        policy/ + trajectories + batch   -> checkpoint step-N/       (the next policy)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from gagar.advantage import (
    AdvantageConfig,
    AdvantageInputs,
    Decay,
    Estimator,
    GenerationBatch,
    assemble_batch,
    compute_advantages,
)
from gagar.records import read_records, write_records
from gagar.schema.batch import BatchEntry
from gagar.schema.result import HackKind, Status, TestResult
from gagar.schema.task import Task

__all__ = [
    "generation_batch",
    "grade_stage",
    "redistribute_stage",
    "rollout_stage",
    "sandbox_metrics",
    "sandbox_stage",
    "select_tasks",
    "train_stage",
]

PathLike = str | os.PathLike[str]


# --------------------------------------------------------------------------- rollout


def select_tasks(tasks: Sequence[Task], n: int, *, seed: int, step: int, gen_batch: int) -> list[Task]:
    """``n`` distinct tasks for generation batch ``gen_batch`` of ``step``, the same for the same seed."""
    if not tasks:
        raise ValueError("the task file holds no tasks")
    rng = np.random.default_rng([seed, step, gen_batch])
    picked = rng.choice(len(tasks), size=min(n, len(tasks)), replace=False)
    return [tasks[int(i)] for i in picked]


def rollout_stage(
    *,
    policy: PathLike,
    tasks: PathLike,
    out: PathLike,
    step: int,
    gen_batch: int = 0,
    groups: int = 8,
    group_size: int = 8,
    seed: int = 0,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_new_tokens: int = 256,
    backend: str = "hf",
    endpoint: str | None = None,
    model_name: str | None = None,
    progress: bool = True,
) -> dict[str, float]:
    """Sample ``group_size`` answers for each of ``groups`` tasks and write them as trajectories."""
    from gagar.policy.rollout import make_backend, rollout
    from gagar.schema.trajectory import SamplingParams
    from gagar.tasks.loaders import load_tasks

    chosen = select_tasks(load_tasks(tasks), groups, seed=seed, step=step, gen_batch=gen_batch)
    generator, tokenizer = make_backend(str(policy), backend, endpoint=endpoint, model_name=model_name)
    params = SamplingParams(
        temperature=temperature,
        top_p=top_p,
        max_new_tokens=max_new_tokens,
        seed=seed * 1_000_003 + step * 1_009 + gen_batch,
    )
    trajectories = list(
        rollout(
            chosen,
            generator,
            tokenizer,
            group_size,
            params,
            step=step,
            gen_batch=gen_batch,
            policy_version=model_name or str(policy),
            progress=progress,
        )
    )
    write_records(out, trajectories)
    n = len(trajectories)
    parsed = sum(t.parse_error is None for t in trajectories)
    tokens = sum(t.n_response_tokens for t in trajectories)
    return {
        "rollout/trajectories": float(n),
        "rollout/parse_rate": parsed / n if n else 0.0,
        "rollout/response_tokens_mean": tokens / n if n else 0.0,
    }


# --------------------------------------------------------------------------- sandbox


def sandbox_stage(
    *,
    tasks: PathLike,
    trajectories: PathLike,
    out: PathLike,
    backend: str = "local",
    workers: int | None = None,
    progress: bool = True,
) -> dict[str, float]:
    """Run every trajectory's patch against its task's tests; write one TestResult each."""
    from tqdm import tqdm

    from gagar.sandbox.runner import BackendName, evaluate_to_file, load_jobs, make_backend

    jobs = load_jobs(tasks, trajectories)
    sandbox = make_backend(BackendName(backend), workers)
    with tqdm(total=len(jobs), desc="sandbox", unit="eval", disable=not progress) as bar:
        results = evaluate_to_file(jobs, out, sandbox, on_result=lambda _: bar.update(1))
    return sandbox_metrics(results)


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


# --------------------------------------------------------------------------- dynamic sampling


def generation_batch(trajectories: PathLike, results: PathLike) -> tuple[list[str], GenerationBatch]:
    """Trajectory ids and the :class:`GenerationBatch` of one generation batch's files."""
    from gagar.schema.trajectory import Trajectory

    trajs = read_records(trajectories, Trajectory)
    by_id = {r.trajectory_id: r for r in read_records(results, TestResult)}
    missing = [t.trajectory_id for t in trajs if t.trajectory_id not in by_id]
    if missing:
        raise ValueError(f"{results}: no result for trajectory {missing[0]!r} ({len(missing)} missing)")
    outcome = [by_id[t.trajectory_id] for t in trajs]
    batch = GenerationBatch(
        rewards=np.array([float(r.resolved) for r in outcome]),
        group_ids=np.array([t.group_id for t in trajs]),
        infra_error=np.array([r.status is Status.INFRA_ERROR for r in outcome]),
    )
    return [t.trajectory_id for t in trajs], batch


def _keep(
    batches: Sequence[tuple[list[str], GenerationBatch]], train_batch_groups: int
) -> tuple[list[tuple[str, int]], dict[str, float]]:
    """(trajectory id, generation batch) of every kept trajectory, and the ``sampling/…`` metrics."""
    assembly = assemble_batch(
        (b for _, b in batches), train_batch_groups=train_batch_groups, max_gen_batches=max(len(batches), 1)
    )
    kept = [
        (tid, b)
        for b, ((ids, _), mask) in enumerate(zip(batches, assembly.keep, strict=False))
        for tid, k in zip(ids, mask, strict=True)
        if k
    ]
    return kept, {**assembly.counts.as_metrics(), "sampling/batch_full": float(assembly.full)}


def _load_batches(
    trajectories: Sequence[PathLike], results: Sequence[PathLike]
) -> list[tuple[list[str], GenerationBatch]]:
    if len(trajectories) != len(results):
        raise ValueError(f"{len(trajectories)} trajectory files but {len(results)} result files")
    return [generation_batch(t, r) for t, r in zip(trajectories, results, strict=True)]


# --------------------------------------------------------------------------- grade


def grade_stage(
    *,
    tasks: PathLike,
    trajectories: Sequence[PathLike],
    results: Sequence[PathLike],
    out: PathLike,
    workspace: PathLike,
    grader: str = "heuristic",
    grader_model: PathLike | None = None,
    endpoint: str | None = None,
    train_batch_groups: int | None = None,
    progress: bool = True,
) -> dict[str, float]:
    """Rank the passing trajectories of each group dynamic sampling keeps; write one Grade per group.

    With ``train_batch_groups`` unset every group is graded. A grader that fails on a group
    falls back to ties for that group (exactly GRPO) and the fallback is counted.
    """
    from gagar.grader.run import grade_groups, make_grader
    from gagar.schema.trajectory import Trajectory

    trajs = [t for path in trajectories for t in read_records(path, Trajectory)]
    outcome = {r.trajectory_id: r for path in results for r in read_records(path, TestResult)}
    if train_batch_groups is not None:
        kept, _ = _keep(_load_batches(trajectories, results), train_batch_groups)
        keep = {tid for tid, _ in kept}
        trajs = [t for t in trajs if t.trajectory_id in keep]
    task_map = {t.instance_id: t for t in read_records(tasks, Task)}
    model_dir = Path(grader_model) if grader_model is not None else None
    instance = make_grader(grader, model_dir=model_dir, endpoint=endpoint)
    grades, metrics = grade_groups(instance, task_map, trajs, outcome, Path(workspace), progress=progress)
    write_records(out, grades)
    return metrics.as_dict()


# --------------------------------------------------------------------------- redistribute


def redistribute_stage(
    *,
    trajectories: Sequence[PathLike],
    results: Sequence[PathLike],
    grades: PathLike | None,
    out: PathLike,
    algo: str = "gagar",
    train_batch_groups: int = 8,
    decay: str = "geometric",
    gamma: float = 0.5,
    floor: float = 0.1,
    norm_std: bool = True,
) -> dict[str, float]:
    """Dynamic sampling over the generation batches, then GRPO or GAGAR advantages of what it keeps."""
    from gagar.schema.grade import Grade, ranks_for, scores_for

    batches = _load_batches(trajectories, results)
    kept, metrics = _keep(batches, train_batch_groups)
    where = {tid: (b, i) for b, (ids, _) in enumerate(batches) for i, tid in enumerate(ids)}
    ids = [tid for tid, _ in kept]
    rewards = np.array([batches[where[t][0]][1].rewards[where[t][1]] for t in ids], dtype=np.float64)
    group_ids = np.array([str(batches[where[t][0]][1].group_ids[where[t][1]]) for t in ids])
    estimator = Estimator(algo)
    ranks = scores = None
    if estimator is Estimator.GAGAR:
        if grades is None:
            raise ValueError("algo 'gagar' needs the grades file of the grade stage")
        graded = read_records(grades, Grade)
        ranks = ranks_for(ids, graded)
        # A passing member its grader did not rank (its group was not graded) ties with its group.
        unranked = (rewards > 0) & np.isnan(ranks)
        ranks = np.where(unranked, 1.0, ranks)
        if Decay(decay) is Decay.SCORE:
            scores = np.where(unranked, -1.0, scores_for(ids, graded))
    config = AdvantageConfig(norm_std=norm_std, decay=Decay(decay), gamma=gamma, floor=floor)
    inputs = AdvantageInputs(rewards=rewards, group_ids=group_ids, ranks=ranks, scores=scores)
    base, _ = compute_advantages(Estimator.GRPO, inputs, config)
    advantages, adv_metrics = compute_advantages(estimator, inputs, config)
    write_records(
        out,
        [
            BatchEntry(
                trajectory_id=tid,
                group_id=str(group_ids[i]),
                gen_batch=b,
                reward=float(rewards[i]),
                advantage=float(advantages[i]),
                grpo_advantage=float(base[i]),
                rank=None if ranks is None or np.isnan(ranks[i]) else float(ranks[i]),
            )
            for i, (tid, b) in enumerate(kept)
        ],
    )
    return {**metrics, "credit/moved_ratio": 0.0, **adv_metrics}


# --------------------------------------------------------------------------- train


def train_stage(
    *,
    policy: PathLike,
    trajectories: Sequence[PathLike],
    batch: PathLike,
    checkpoints: PathLike,
    step: int,
    seed: int = 0,
    optim: dict | None = None,
    reference: PathLike | None = None,
    keep_last: int = 3,
    lora: dict | None = None,
    policy_version: str | None = None,
) -> dict[str, float]:
    """One policy update on the train batch; writes checkpoint ``step-N`` (model, optimizer, RNG) atomically.

    The optimizer state continues from the latest checkpoint under ``checkpoints`` when there is
    one; the weights come from ``policy`` (the directory the step's rollouts were sampled from);
    ``reference`` is the frozen policy of the KL term, used only when its coefficient is positive.
    ``lora`` (:class:`gagar.train.lora.LoraSettings` fields) trains an adapter instead of every
    weight; ``policy_version``, when set, is the version every trajectory must have been sampled by.
    """
    from gagar.train.lora import LoraSettings
    from gagar.train.update import OptimConfig, run_update

    return run_update(
        policy=Path(policy),
        trajectories=[Path(p) for p in trajectories],
        batch=Path(batch),
        checkpoints=Path(checkpoints),
        step=step,
        seed=seed,
        optim=OptimConfig.model_validate(optim or {}),
        reference=Path(reference) if reference is not None else None,
        keep_last=keep_last,
        lora=LoraSettings.model_validate(lora or {}),
        policy_version=policy_version,
    )
