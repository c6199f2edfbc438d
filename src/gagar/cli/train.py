"""``gagar train``: the in-process RL loop over the stage functions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from gagar.advantage import Estimator
from gagar.grader.run import GraderKind
from gagar.policy.agent import AgentKind


def train(
    config: Path | None = typer.Option(
        None, "--config", exists=True, dir_okay=False, help="YAML run config."
    ),
    algo: Estimator | None = typer.Option(
        None, "--algo", help="Advantage estimator [env: GAGAR_ADVANTAGE__ALGO]."
    ),
    steps: int | None = typer.Option(None, "--steps", min=1, help="RL steps [env: GAGAR_STEPS]."),
    run_dir: Path | None = typer.Option(None, "--run-dir", help="Run directory [env: GAGAR_RUN_DIR]."),
    tasks: Path | None = typer.Option(None, "--tasks", help="Training tasks JSONL [env: GAGAR_TASKS]."),
    policy: Path | None = typer.Option(
        None, "--policy", help="Initial policy directory [env: GAGAR_POLICY]."
    ),
    seed: int | None = typer.Option(None, "--seed", help="Run seed [env: GAGAR_SEED]."),
    grader: GraderKind | None = typer.Option(
        None, "--grader", help="Who ranks the passing trajectories [env: GAGAR_GRADER__KIND]."
    ),
    grader_model: Path | None = typer.Option(
        None, "--grader-model", help="Learned grader directory [env: GAGAR_GRADER__MODEL]."
    ),
    agent: AgentKind | None = typer.Option(
        None, "--agent", help="single or tool-loop (multi-turn) [env: GAGAR_ROLLOUT__AGENT__KIND]."
    ),
    max_turns: int | None = typer.Option(
        None, "--max-turns", min=1, help="Tool loop: most turns [env: GAGAR_ROLLOUT__AGENT__MAX_TURNS]."
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
    rows = run_training(settings, resume=resume)
    last = rows[-1] if rows else {}
    typer.echo(
        f"{len(rows)} steps in {settings.run_dir}: last resolved rate "
        f"{last.get('rollout/resolved_rate', float('nan')):.3f}, "
        f"groups kept {last.get('sampling/groups_kept', 0):.0f}, credit moved "
        f"{last.get('credit/moved_ratio', 0.0):.1%}; curve in {Path(settings.run_dir) / 'training.png'}"
    )


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
