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
        None, "--agent", help=_help("single, tool-loop or tool-call (multi-turn)", "rollout.agent.kind")
    ),
    max_turns: int | None = typer.Option(
        None, "--max-turns", min=1, help=_help("Tool loop: most turns", "rollout.agent.max_turns")
    ),
    set_: list[str] = typer.Option(
        [], "--set", help="Override one setting, path=value (repeatable), e.g. rollout.group_size=8."
    ),
    resume: bool = typer.Option(False, "--resume", help="Continue from the last complete checkpoint."),
) -> None:
    """Train the policy with GRPO or GAGAR; command line > environment > config file > defaults."""
    from gagar.train.config import load_config, parse_overrides
    from gagar.train.trainer import train as run_training

    overrides: dict[str, Any] = parse_overrides(set_)
    overrides |= {
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
        overrides.setdefault("advantage", {})["algo"] = algo
    grader_overrides = {k: v for k, v in {"kind": grader, "model": grader_model}.items() if v is not None}
    overrides.setdefault("grader", {}).update(grader_overrides)
    agent_overrides = {k: v for k, v in {"kind": agent, "max_turns": max_turns}.items() if v is not None}
    overrides.setdefault("rollout", {}).setdefault("agent", {}).update(agent_overrides)
    settings = load_config(config, overrides)
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
    settings: str = typer.Option(
        ...,
        "--settings",
        help="The run's pipeline parameters as a JSON object (a file or a store URI): its training config.",
    ),
    policy: str = typer.Option(
        ..., "--policy", help="The policy the batch was sampled from (directory or store reference)."
    ),
    trajectories: str = typer.Option(..., "--trajectories", help="Trajectories JSONL (a file or store URI)."),
    batch: str = typer.Option(..., "--batch", help="Train batch JSONL (a file or store URI)."),
    step: int = typer.Option(..., "--step", min=0, help="The RL step of this update."),
    policy_version: str | None = typer.Option(
        None, "--policy-version", help="Refuse samples of any other policy version."
    ),
) -> None:
    """One policy update of a pipeline run, publishing checkpoint step-N to its store; data-parallel
    under torchrun (what the train stage runs on several processes or a TrainJob's nodes).

    ``torchrun --nproc-per-node N -m gagar train-update ...`` runs it on N processes (gloo on CPU,
    nccl on GPUs): the same loss and token-mean as one process, the checkpoint written by rank 0.
    """
    import json
    import logging
    import tempfile

    from gagar.pipeline import store
    from gagar.pipeline.store_stages import update as update_in_store

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with tempfile.TemporaryDirectory() as tmp:
        values = json.loads(
            store.fetch_file(settings, Path(tmp) / "settings.json").read_text(encoding="utf-8")
        )
    metrics = update_in_store(
        settings=values, policy=policy, trajectories=trajectories, batch=batch, step=step,
        policy_version=policy_version,
    )  # fmt: skip
    typer.echo(f"step {step}: loss {metrics.get('loss/total', float('nan')):.6f}")
