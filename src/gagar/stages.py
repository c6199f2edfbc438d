"""The I/O layer: one function per pipeline stage that reads its inputs, calls its step function
in :mod:`gagar.rl_step`, and writes its outputs (paths and parameters in, files and a metrics dict out).

The CLI commands (``gagar rollout``, ``sandbox run``, ``grade``), the KFP components (through
:mod:`gagar.pipeline.store_stages`, which adds the artifact store) and the Argo entry point all call these;
no stage's logic lives anywhere else. Every output file is written atomically, so a stage that
dies leaves either its previous output or none.

Stages and their files, for one RL step::

    rollout      tasks.jsonl + policy/            -> trajectories-<b>.jsonl   (one per generation batch b)
    sandbox      tasks.jsonl + trajectories-<b>   -> results-<b>.jsonl
    select       trajectories + results           -> selection.jsonl          (dynamic sampling, once a step)
    grade        tasks + trajectories + results   -> grades.jsonl             (the selection's groups)
    redistribute selection + grades               -> batch.jsonl              (advantages)
    train        policy/ + trajectories + batch   -> checkpoint step-N/       (the next policy)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gagar import rl_step
from gagar.advantage import AdvantageConfig, Decay, Estimator
from gagar.records import read_records, write_records
from gagar.schema.batch import BatchEntry
from gagar.schema.grade import Grade
from gagar.schema.result import TestResult
from gagar.schema.selection import KeptBatch
from gagar.schema.task import Task
from gagar.schema.trajectory import Trajectory

if TYPE_CHECKING:
    from gagar.grader.run import GraderKind
    from gagar.policy.agent import AgentSettings
    from gagar.sandbox.runner import BackendName
    from gagar.train.distributed import Strategy
    from gagar.train.lora import LoraSettings
    from gagar.train.update import OptimConfig

__all__ = [
    "grade_stage",
    "redistribute_stage",
    "rollout_stage",
    "sandbox_stage",
    "select_stage",
    "train_stage",
]

PathLike = str | os.PathLike[str]


def rollout_stage(
    *,
    policy: PathLike,
    tasks: PathLike,
    out: PathLike,
    step: int,
    gen_batch: int = 0,
    groups: int | None = 8,
    group_size: int = 8,
    seed: int = 0,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_new_tokens: int = 256,
    backend: str = "hf",
    endpoint: str | None = None,
    model_name: str | None = None,
    progress: bool = True,
    agent: AgentSettings | None = None,
    sandbox: BackendName | str = "local",
    sandbox_workers: int | None = None,
) -> dict[str, float]:
    """Sample ``group_size`` answers for each of ``groups`` tasks drawn for this generation batch (every
    task, in file order, when ``groups`` is None) and write them as trajectories; the tool-loop agent
    runs its visible tests in the ``sandbox`` backend."""
    from gagar.policy.agent import AgentKind
    from gagar.policy.rollout import make_backend
    from gagar.sandbox.runner import BackendName
    from gagar.sandbox.runner import make_backend as make_sandbox
    from gagar.tasks.loaders import load_tasks

    generator, tokenizer = make_backend(str(policy), backend, endpoint=endpoint, model_name=model_name)
    tool_loop = agent is not None and agent.kind is AgentKind.TOOL_LOOP
    trajectories = rl_step.rollout(
        generator, tokenizer, load_tasks(tasks), step=step, gen_batch=gen_batch, groups=groups,
        group_size=group_size, seed=seed, temperature=temperature, top_p=top_p,
        max_new_tokens=max_new_tokens, policy_version=model_name or str(policy), progress=progress,
        agent=agent, sandbox=make_sandbox(BackendName(sandbox), sandbox_workers) if tool_loop else None,
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


def select_stage(
    *,
    trajectories: Sequence[PathLike],
    results: Sequence[PathLike],
    out: PathLike,
    train_batch_groups: int,
) -> dict[str, float]:
    """Dynamic sampling over the generation batches in these files (one trajectories and one results
    file per batch); write what it keeps and its counts as one :class:`KeptBatch` record.

    The only place a step's I/O selects: grade and redistribute both read this file.
    """
    if len(trajectories) != len(results):
        raise ValueError(f"{len(trajectories)} trajectory files but {len(results)} result files")
    batches = []
    for t_path, r_path in zip(trajectories, results, strict=True):
        try:
            batches.append(
                rl_step.generation_batch(read_records(t_path, Trajectory), read_records(r_path, TestResult))
            )
        except ValueError as exc:
            raise ValueError(f"{r_path}: {exc}") from None
    selection = rl_step.select(
        batches, train_batch_groups=train_batch_groups, max_gen_batches=max(len(batches), 1)
    )
    write_records(out, [selection.kept_batch])
    return dict(selection.metrics)


def _read_selection(path: PathLike) -> KeptBatch:
    found = read_records(path, KeptBatch)
    if len(found) != 1:
        raise ValueError(f"{path}: a selection file holds one record, found {len(found)}")
    return found[0]


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
    max_steps: int = 8,
    timeout_s: float = 300.0,
    position_guard: float | None = None,
    repos_dir: PathLike | None = None,
    selection: PathLike | None = None,
    progress: bool = True,
) -> dict[str, float]:
    """Rank the passing trajectories of each group in ``selection`` (a :func:`select_stage` output;
    every group when None); write one Grade per group.

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
    if selection is not None:
        chosen = {k.trajectory_id for k in _read_selection(selection).kept}
        kept = [t for t in kept if t.trajectory_id in chosen]
    instance = make_grader(
        grader, model_dir=Path(grader_model) if grader_model is not None else None, endpoint=endpoint,
        model=model, api=api, max_steps=max_steps, timeout_s=timeout_s,  # type: ignore[arg-type]
    )  # fmt: skip
    grades, metrics = rl_step.grade(
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


def redistribute_stage(
    *,
    selection: PathLike,
    grades: PathLike | None,
    out: PathLike,
    algo: Estimator | str = Estimator.GAGAR,
    decay: Decay | str = Decay.GEOMETRIC,
    gamma: float = 0.5,
    floor: float = 0.1,
    norm_std: bool = True,
) -> dict[str, float]:
    """GRPO or GAGAR advantages of what dynamic sampling kept (``selection``, a :func:`select_stage`
    output); its ``sampling/…`` counts come back with the ``advantage/…`` metrics."""
    kept = _read_selection(selection)
    estimator = Estimator(algo)
    if estimator.uses_grader and grades is None:
        raise ValueError(f"algo {estimator.value!r} needs the grades file of the grade stage")
    graded = read_records(grades, Grade) if estimator.uses_grader and grades is not None else None
    config = AdvantageConfig(norm_std=norm_std, decay=Decay(decay), gamma=gamma, floor=floor)
    entries, metrics = rl_step.advantages(kept, graded, algo=estimator, config=config)
    write_records(out, entries)
    return {**kept.metrics, **metrics}


def train_stage(
    *,
    policy: PathLike,
    trajectories: Sequence[PathLike],
    batch: PathLike,
    checkpoints: PathLike,
    step: int,
    seed: int = 0,
    optim: OptimConfig | None = None,
    reference: PathLike | None = None,
    keep_last: int = 3,
    lora: LoraSettings | None = None,
    policy_version: str | None = None,
    strategy: Strategy | str = "ddp",
) -> dict[str, float]:
    """One policy update on the train batch; writes checkpoint ``step-N`` (model, optimizer, RNG) atomically.

    Under ``torchrun`` every process calls this alike: a data-parallel update (``strategy`` ddp or
    fsdp) equal to one process's, the checkpoint written by rank 0.

    The optimizer state continues from the latest checkpoint under ``checkpoints`` when there is
    one; the weights come from ``policy`` (the directory the step's rollouts were sampled from);
    ``reference`` is the frozen policy of the KL term, used only when its coefficient is positive.
    ``lora`` trains an adapter instead of every weight; ``policy_version``, when set, is the
    version every trajectory must have been sampled by. See :func:`gagar.train.update.run_update`.
    """
    from gagar.train.distributed import Strategy
    from gagar.train.update import run_update

    return run_update(
        policy=Path(policy),
        trajectories=[t for path in trajectories for t in read_records(path, Trajectory)],
        batch=read_records(batch, BatchEntry),
        checkpoints=Path(checkpoints),
        step=step,
        seed=seed,
        optim=optim,
        reference=Path(reference) if reference is not None else None,
        keep_last=keep_last,
        lora=lora,
        policy_version=policy_version,
        strategy=Strategy(strategy),
    )
