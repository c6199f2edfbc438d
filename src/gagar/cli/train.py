"""``gagar train``: the in-process RL loop over the stage functions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from gagar.advantage import Estimator
from gagar.grader.run import GraderKind


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
