"""Run the experiment: train every (arm, seed) with the trainer, evaluate every final policy, resumably.

Under ``config.out_dir``:

- ``config.json``: the settings the runs were made with; a rerun with other run-shaping settings is refused
  (adding seeds or arms is allowed: finished runs stay valid);
- ``grader-learned/``: the learned grader the harness trained once, when an arm asks for one without a model;
- ``runs/<arm>/seed-<s>/``: each trainer run (checkpoints, metrics.jsonl, training.png);
- ``eval/sft/`` and ``eval/<arm>/seed-<s>/``: each held-out evaluation (:mod:`gagar.experiment.evaluation`);
- ``greedy/sft/after-0000/`` and ``greedy/<arm>/seed-<s>/after-<n>/``: with ``greedy_eval.every`` set,
  the greedy held-out evaluation of the start and of each run after ``n`` updates (the run is trained
  up to each such point, evaluated, then resumed);
- ``timing.jsonl`` (seconds of each piece of work done) and ``sessions.jsonl`` (each invocation: command,
  start, wall time, machine).

A finished run is skipped, a half-finished one resumes from its last complete checkpoint
(:func:`gagar.train.trainer.train` with ``resume``), a finished evaluation is never redone.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import platform
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from gagar.experiment.config import ArmConfig, ExperimentConfig
from gagar.experiment.evaluation import (
    GREEDY_TOP_P,
    EvalSummary,
    evaluate_policy,
    read_summary,
    read_trajectories,
)
from gagar.grader.run import GraderKind
from gagar.records import atomic_write_text

__all__ = [
    "CONFIG",
    "SESSIONS",
    "TIMING",
    "Session",
    "check_disjoint_repositories",
    "ensure_learned_grader",
    "machine_description",
    "run_experiment",
    "train_run",
]

log = logging.getLogger(__name__)

CONFIG = "config.json"
SESSIONS = "sessions.jsonl"
TIMING = "timing.jsonl"
_MAY_CHANGE = ("seeds", "arms", "out_dir")
"""Settings a rerun may change without invalidating the runs already made (arms may be added or
left out; an arm kept under its name keeps its settings)."""


class Session(BaseModel):
    """One invocation of the harness."""

    command: str
    started: str
    """UTC start time, ISO 8601."""
    wall_s: float
    machine: str
    load_start: list[float] | None = None
    """1-, 5- and 15-minute load averages when the session started."""
    load_end: list[float] | None = None
    """The same when it ended."""
    niceness: int | None = None
    """The process's nice value."""


def machine_description() -> str:
    """The machine in words: OS, CPU, cores, memory, torch threads."""
    import torch

    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    cpu = platform.processor() or platform.machine()
    return (
        f"{platform.system()} {platform.release()}, {cpu}, {os.cpu_count()} cores, {memory:.0f} GiB RAM, "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads), Python {platform.python_version()}"
    )


def _append(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record, sort_keys=True) + "\n")


def _check_and_record_config(config: ExperimentConfig) -> None:
    """Write ``config.json``; refuse when the runs already there were made with other settings.

    Raises:
        ValueError: naming the settings that differ.
    """
    path = config.out_dir / CONFIG
    current = json.loads(config.model_dump_json())
    if path.exists():
        before = json.loads(path.read_text(encoding="utf-8"))
        changed = sorted(
            k
            for k in current.keys() | before.keys()
            if k not in _MAY_CHANGE and current.get(k) != before.get(k)
        )
        arms_before = {arm["name"]: _arm_as_now(arm) for arm in before.get("arms", [])}
        changed += [
            f"arm {arm['name']!r}"
            for arm in current["arms"]
            if arm["name"] in arms_before and arms_before[arm["name"]] != arm
        ]
        if changed:
            raise ValueError(
                f"{config.out_dir} holds runs made with other settings ({', '.join(changed)} differ): "
                "restore them or choose another output folder"
            )
    config.out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(current, indent=1, sort_keys=True))


def _arm_as_now(recorded: dict[str, Any]) -> dict[str, Any] | None:
    """A recorded arm as this version writes it (settings added since take their defaults); None
    when this version refuses it."""
    try:
        return json.loads(ArmConfig.model_validate(recorded).model_dump_json())
    except ValidationError:
        return None


def check_disjoint_repositories(config: ExperimentConfig) -> None:
    """Refuse held-out tasks from a repository the training tasks also come from.

    Raises:
        ValueError: naming the shared repositories (the first few).
    """
    from gagar.tasks.loaders import load_tasks

    shared = {t.repo for t in load_tasks(config.train_tasks)} & {
        t.repo for t in load_tasks(config.heldout_tasks)
    }
    if shared:
        names = ", ".join(sorted(shared)[:3])
        raise ValueError(
            f"{config.heldout_tasks} shares {len(shared)} repositories with {config.train_tasks} ({names}): "
            "held-out tasks must come from repositories never seen in training"
        )


def ensure_learned_grader(config: ExperimentConfig, progress: bool = True) -> Path:
    """The harness's learned grader, trained once on the training tasks (``gagar grader sft``)."""
    from gagar.grader.learned import ScorerConfig
    from gagar.grader.sft import load_labelled_groups, train_grader

    out = config.out_dir / "grader-learned"
    if (out / "config.json").exists():  # save_scorer writes it last
        return out
    started = time.perf_counter()
    s = config.grader_sft
    groups = load_labelled_groups(
        config.train_tasks,
        groups_per_task=s.groups_per_task,
        seed=s.seed,
        misleading_per_task=s.misleading_per_task,
    )
    train_grader(groups, out, ScorerConfig(epochs=s.epochs, seed=s.seed), progress=progress)
    _append(config.out_dir / TIMING, {"kind": "grader_sft", "seconds": time.perf_counter() - started})
    return out


def _finished(run_dir: Path, steps: int) -> Path | None:
    """The final policy of a run that completed ``steps`` steps and logged them all; None otherwise."""
    from gagar.train.checkpoint import CheckpointManager, MetricsLog

    if not (run_dir / "checkpoints").exists():
        return None
    latest = CheckpointManager(run_dir / "checkpoints", keep_last=None).latest()
    if latest is None or latest.step < steps - 1:
        return None
    logged = {int(row["step"]) for row in MetricsLog(run_dir / "metrics.jsonl").read()}
    return latest.path / "model" if logged >= set(range(steps)) else None


def train_run(
    config: ExperimentConfig,
    arm: ArmConfig,
    seed: int,
    grader_model: Path | None,
    progress: bool = True,
    steps: int | None = None,
) -> Path:
    """Train (or resume, or skip when finished) the run of ``arm`` at ``seed`` up to ``steps`` steps
    (default: all of them); the policy directory of its checkpoint at that point.

    Raises:
        RuntimeError: the run went past ``steps`` and no longer holds that checkpoint.
    """
    from gagar.train.checkpoint import CheckpointManager
    from gagar.train.trainer import train

    steps = config.steps if steps is None else steps
    run_dir = config.run_dir(arm, seed)
    if _finished(run_dir, steps) is None:
        started = time.perf_counter()
        train(config.train_config(arm, seed, grader_model, steps), resume=True, progress=progress)
        _append(
            config.out_dir / TIMING,
            {"kind": "train", "arm": arm.name, "seed": seed, "seconds": time.perf_counter() - started},
        )
        if _finished(run_dir, steps) is None:
            raise RuntimeError(f"{run_dir}: the trainer returned without a checkpoint of step {steps - 1}")
    else:
        log.info("%s: %d steps finished, skipped", run_dir, steps)
    at = CheckpointManager(run_dir / "checkpoints", keep_last=None).path_for(steps - 1) / "model"
    if not at.is_dir():
        raise RuntimeError(f"{run_dir}: the checkpoint of step {steps - 1} is gone (keep_checkpoints)")
    return at


def _evaluate(
    config: ExperimentConfig, policy: Path, arm: str, seed: int | None, progress: bool
) -> EvalSummary:
    """The final held-out evaluation of ``policy`` (done once)."""
    return _held_out(
        config,
        config.eval_dir(arm, seed),
        {"kind": "eval", "arm": arm, "seed": seed},
        progress,
        policy=policy,
        settings=config.evaluation,
        arm=arm,
        seed=seed,
        sampling_seed=config.evaluation.seed_offset + (config.seeds[0] if seed is None else seed),
    )


def _greedy(
    config: ExperimentConfig,
    policy: Path,
    arm: str,
    seed: int | None,
    updates: int,
    progress: bool,
) -> EvalSummary:
    """The greedy held-out evaluation of ``policy`` after ``updates`` updates (done once), compared with
    the start's greedy answers."""
    start = None if arm == "sft" else read_trajectories(config.greedy_dir("sft", None, 0))
    settings = config.evaluation.model_copy(
        update={"samples_per_task": 1, "temperature": 1.0, "top_p": GREEDY_TOP_P}
    )
    return _held_out(
        config,
        config.greedy_dir(arm, seed, updates),
        {"kind": "greedy_eval", "arm": arm, "seed": seed, "updates": updates},
        progress,
        policy=policy,
        settings=settings,
        arm=arm,
        seed=seed,
        sampling_seed=config.evaluation.seed_offset,
        max_tasks=config.greedy_eval.tasks,
        updates=updates,
        start=start,
    )


def _held_out(
    config: ExperimentConfig, out: Path, timing: dict[str, Any], progress: bool, **how: Any
) -> EvalSummary:
    """``evaluate_policy`` on the held-out tasks into ``out``, unless a summary is there already; the
    seconds it took are appended to the timing file under ``timing``'s keys."""
    done = read_summary(out)
    if done is not None:
        return done
    summary = evaluate_policy(
        tasks=config.heldout_tasks,
        out=out,
        sandbox=config.sandbox.backend,
        workers=config.sandbox.workers,
        progress=progress,
        **how,
    )
    _append(config.out_dir / TIMING, {**timing, "seconds": summary.seconds})
    return summary


def run_experiment(config: ExperimentConfig, *, command: str, progress: bool = True) -> list[EvalSummary]:
    """Run every missing piece of the experiment; the evaluations of the SFT start and of every run.

    Raises:
        ValueError: ``config.out_dir`` holds runs made with other settings, or the held-out tasks share
            a repository with the training tasks.
    """
    started, wall, load_start = dt.datetime.now(dt.UTC), time.perf_counter(), list(os.getloadavg())
    check_disjoint_repositories(config)
    _check_and_record_config(config)
    try:
        learned = None
        if any(a.grader is GraderKind.LEARNED and a.grader_model is None for a in config.arms):
            learned = ensure_learned_grader(config, progress)
        points = config.greedy_points
        if points:
            _greedy(config, config.policy, "sft", None, 0, progress)
        summaries = [_evaluate(config, config.policy, "sft", None, progress)]
        for seed in config.seeds:  # seed-major: every finished seed already gives paired differences
            for arm in config.arms:
                grader_model = arm.grader_model or (learned if arm.grader is GraderKind.LEARNED else None)
                for updates in (p for p in points if p > 0):
                    if read_summary(config.greedy_dir(arm.name, seed, updates)) is None:
                        policy = train_run(config, arm, seed, grader_model, progress, steps=updates)
                        _greedy(config, policy, arm.name, seed, updates, progress)
                final = train_run(config, arm, seed, grader_model, progress)
                summaries.append(_evaluate(config, final, arm.name, seed, progress))
    finally:
        session = Session(
            command=command,
            started=started.isoformat(timespec="seconds"),
            wall_s=time.perf_counter() - wall,
            machine=machine_description(),
            load_start=load_start,
            load_end=list(os.getloadavg()),
            niceness=os.nice(0),
        )
        _append(config.out_dir / SESSIONS, session.model_dump())
    return summaries
