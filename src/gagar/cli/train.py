"""``gagar train``: the in-process RL loop over the stage functions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from gagar.advantage import Estimator
from gagar.errors import UserError
from gagar.grader.run import GraderKind
from gagar.policy.agent import AgentKind


def _help(text: str, field: str) -> str:
    """``text`` with the setting's environment variable and its default in the training config."""
    from enum import Enum

    from pydantic_core import PydanticUndefined

    from gagar.train.config import TrainConfig

    model: Any = TrainConfig
    *parents, leaf = field.split(".")
    for parent in parents:
        model = model.model_fields[parent].annotation
    info = model.model_fields[leaf]
    value = info.default_factory() if info.default_factory is not None else info.default  # type: ignore[call-arg]
    env = "GAGAR_" + field.upper().replace(".", "__")
    if value is PydanticUndefined:
        shown = "required"
    elif value is None:
        shown = "default: none"
    else:
        shown = f"default: {value.value if isinstance(value, Enum) else value}"
    return f"{text} [env: {env}; {shown}]."


def train(
    config: Path | None = typer.Option(
        None, "--config", exists=True, dir_okay=False, help="YAML run config [default: none]."
    ),
    algo: Estimator | None = typer.Option(
        None, "--algo", help=_help("Advantage estimator", "advantage.algo")
    ),
    steps: int | None = typer.Option(None, "--steps", min=1, help=_help("RL steps", "steps")),
    run_dir: Path | None = typer.Option(None, "--run-dir", help=_help("Run directory", "run_dir")),
    tasks: Path | None = typer.Option(None, "--tasks", help=_help("Training tasks JSONL", "tasks")),
    policy: Path | None = typer.Option(None, "--policy", help=_help("Initial policy directory", "policy")),
    seed: int | None = typer.Option(None, "--seed", help=_help("Run seed", "seed")),
    grader: GraderKind | None = typer.Option(
        None, "--grader", help=_help("Who ranks the passing trajectories", "grader.kind")
    ),
    grader_model: Path | None = typer.Option(
        None, "--grader-model", help=_help("Learned grader directory", "grader.model")
    ),
    agent: AgentKind | None = typer.Option(
        None, "--agent", help=_help("single or tool-loop (multi-turn)", "rollout.agent.kind")
    ),
    max_turns: int | None = typer.Option(
        None, "--max-turns", min=1, help=_help("Tool loop: most turns", "rollout.agent.max_turns")
    ),
    resume: bool = typer.Option(False, "--resume", help="Continue from the last complete checkpoint."),
) -> None:
    """Train the policy with GRPO or GAGAR; command line > environment > config file > defaults."""
    from gagar.train.config import load_config
    from gagar.train.trainer import train as run_training

    overrides: dict[str, Any] = {
        k: v
        for k, v in {
            "steps": steps,
            "run_dir": run_dir,
            "tasks": tasks,
            "policy": policy,
            "seed": seed,
        }.items()
        if v is not None
    }
    if algo is not None:
        overrides["advantage"] = {"algo": algo}
    grader_overrides = {k: v for k, v in {"kind": grader, "model": grader_model}.items() if v is not None}
    if grader_overrides:
        overrides["grader"] = grader_overrides
    agent_overrides = {k: v for k, v in {"kind": agent, "max_turns": max_turns}.items() if v is not None}
    if agent_overrides:
        overrides["rollout"] = {"agent": agent_overrides}
    try:
        settings = load_config(config, overrides)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--config") from None
    given = {"tasks": tasks, "policy": policy}
    for field, path, kind in (("tasks", settings.tasks, "file"), ("policy", settings.policy, "directory")):
        if not (path.is_file() if kind == "file" else path.is_dir()):
            source = _source(field, given[field], config)
            raise UserError(f"{field} {kind} {path} does not exist (set by {source})")
    rows = run_training(settings, resume=resume)
    last = rows[-1] if rows else {}
    typer.echo(
        f"{len(rows)} steps in {settings.run_dir}: last resolved rate "
        f"{last.get('rollout/resolved_rate', float('nan')):.3f}, "
        f"groups kept {last.get('sampling/groups_kept', 0):.0f}, credit moved "
        f"{last.get('credit/moved_ratio', 0.0):.1%}; curve in {Path(settings.run_dir) / 'training.png'}"
    )


def _source(field: str, flag: object, config: Path | None) -> str:
    """Where a setting came from, as the user would name it: the option, the variable or the file."""
    import os

    if flag is not None:
        return f"--{field}"
    if os.environ.get(f"GAGAR_{field.upper()}"):
        return f"GAGAR_{field.upper()}"
    return f"{field}: in {config}" if config is not None else "the defaults"


def update(
    policy: str = typer.Option(
        ..., "--policy", help="The policy the batch was sampled from (directory or store ref)."
    ),
    trajectories: list[str] = typer.Option(..., "--trajectories", help="Trajectories JSONL (repeatable)."),
    batch: str = typer.Option(..., "--batch", help="Train batch JSONL."),
    step: int = typer.Option(..., "--step", min=0, help="The RL step of this update."),
    checkpoints: Path | None = typer.Option(
        None, "--checkpoints", help="Checkpoint root (without --storage)."
    ),
    storage: str | None = typer.Option(
        None, "--storage", help="Run store: fetch the inputs from it, publish checkpoint step-N to it."
    ),
    model: str | None = typer.Option(None, "--model", help="With --storage: the initial policy (LoRA base)."),
    seed: int = typer.Option(0, "--seed", help="Run seed (minibatch order)."),
    lr: float = typer.Option(2e-5, "--lr", help="AdamW learning rate."),
    epochs: int = typer.Option(1, "--epochs", min=1, help="Passes over the batch."),
    minibatch_size: int = typer.Option(
        16, "--minibatch-size", min=1, help="Trajectories per optimizer step."
    ),
    keep_last: int = typer.Option(3, "--keep-last", min=1, help="Checkpoints kept (without --storage)."),
    lora: bool = typer.Option(False, "--lora/--no-lora", help="Train a LoRA adapter."),
    lora_rank: int = typer.Option(8, "--lora-rank", min=1, help="LoRA rank."),
    lora_alpha: float = typer.Option(16.0, "--lora-alpha", help="LoRA alpha."),
    strategy: str = typer.Option("ddp", "--strategy", help="ddp or fsdp (under torchrun)."),
    policy_version: str | None = typer.Option(
        None, "--policy-version", help="Refuse other versions' samples."
    ),
) -> None:
    """One policy update on a train batch, writing checkpoint step-N; data-parallel under torchrun.

    ``torchrun --nproc-per-node N -m gagar train-update ...`` runs it on N processes (gloo on CPU,
    nccl on GPUs): the same loss and token-mean as one process, the checkpoint written by rank 0.
    With --storage the inputs may be store URIs and rank 0 publishes the checkpoint there (what the
    train stage's TrainJob runs).
    """
    import logging

    from gagar.train.distributed import Strategy
    from gagar.train.lora import LoraSettings
    from gagar.train.update import OptimConfig

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    optim = OptimConfig(lr=lr, epochs=epochs, minibatch_size=minibatch_size)
    settings = LoraSettings(enabled=lora, rank=lora_rank, alpha=lora_alpha)
    try:
        if storage is not None:
            from gagar.pipeline.store_stages import update as update_in_store

            if len(trajectories) != 1:
                raise ValueError("with --storage give one --trajectories file")
            metrics = update_in_store(
                storage=storage, policy=policy, model=model or policy, trajectories=trajectories[0],
                batch=batch, step=step, seed=seed, optim=optim, lora=settings, policy_version=policy_version,
                strategy=Strategy(strategy),
            )  # fmt: skip
        else:
            from gagar.stages import train_stage

            if checkpoints is None:
                raise ValueError("give --checkpoints (or --storage)")
            metrics = train_stage(
                policy=policy, trajectories=trajectories, batch=batch, checkpoints=checkpoints, step=step,
                seed=seed, optim=optim, keep_last=keep_last, lora=settings, policy_version=policy_version,
                strategy=Strategy(strategy),
            )  # fmt: skip
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    typer.echo(f"step {step}: loss {metrics.get('loss/total', float('nan')):.6f}")
