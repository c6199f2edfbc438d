"""``gagar run`` (the RL pipeline on this machine, through kfp.local) and ``gagar schedule``."""

from __future__ import annotations

from pathlib import Path

import typer

__all__ = ["run", "schedule"]


def run(
    config: Path | None = typer.Option(
        None,
        "--config",
        exists=True,
        dir_okay=False,
        help="Training config (YAML), the same file gagar train takes (default: the embedded default's "
        "run, src/gagar/data/embedded-run.yaml).",
    ),
    set_: list[str] = typer.Option(
        [], "--set", help="Override one setting, path=value (repeatable), e.g. rollout.group_size=8."
    ),
    policy: Path | None = typer.Option(
        None,
        "--policy",
        exists=True,
        file_okay=False,
        help="Initial policy directory (default: the config's policy, else the embedded default's).",
    ),
    tasks: Path | None = typer.Option(
        None,
        "--tasks",
        exists=True,
        dir_okay=False,
        help="Training tasks (JSONL) (default: the config's tasks, else the embedded default's).",
    ),
    out: Path = typer.Option(Path("runs/pipeline"), "--out", help="Where KFP's task artifacts go."),
    storage: str | None = typer.Option(
        None, "--storage", help="Artifact store: a directory or s3://bucket/prefix (default: <out>/store)."
    ),
    steps: int = typer.Option(2, "--steps", min=1, help="RL steps of this run (each resumes the store)."),
    verbose: bool = typer.Option(
        False, "--verbose", help="Show KFP's own output (every task's logs) instead of one line per task."
    ),
    warm: bool = typer.Option(
        True,
        "--warm-stages/--cold-stages",
        help="Run each task's stage function in a fork of one interpreter that imported torch and gagar "
        "once (warm), or in the task's own fresh process (cold, as in a cluster).",
    ),
) -> None:
    """Run the RL pipeline through kfp.local on CPU: artifacts, metrics and checkpoints in the store.

    It takes the same training config as gagar train; without --config, the embedded default's run,
    its policy and tasks prepared first under <out>/embedded (reused on later runs).
    """
    from gagar.pipeline.local import run_local
    from gagar.pipeline.parameters import parameters_from_config
    from gagar.train.config import EMBEDDED_RUN, load_config, parse_overrides

    overrides = parse_overrides(set_)
    if policy is not None:
        overrides["policy"] = policy.resolve()
    if tasks is not None:
        overrides["tasks"] = tasks.resolve()
    if config is None and ("policy" not in overrides or "tasks" not in overrides):
        from gagar.embedded import prepare

        typer.echo(f"preparing the embedded default under {out / 'embedded'} (reused when present)")
        embedded = prepare(out / "embedded")
        overrides.setdefault("policy", embedded.policy.resolve())
        overrides.setdefault("tasks", embedded.rl_tasks.resolve())
    settings = load_config(config or EMBEDDED_RUN, overrides)
    arguments = {**parameters_from_config(settings), "storage": storage or str((out / "store").resolve())}
    log = None if verbose else out / "kfp.log"
    typer.echo(
        f"running {steps} RL step(s) of the pipeline through kfp.local"
        + (f" (its logs: {log})" if log else "")
    )
    result = run_local(
        arguments,
        out=out,
        steps=steps,
        max_gen_batches=settings.rollout.max_gen_batches,
        warm=warm,
        log_file=log,
    )
    for row in result.steps:
        typer.echo(
            f"step {row['step']:.0f}: resolved rate {row.get('rollout/resolved_rate', 0.0):.3f} "
            f"of {row.get('rollout/trajectories', 0.0):.0f} trajectories, "
            f"groups kept {row.get('sampling/groups_kept', 0.0):.0f} of "
            f"{row.get('sampling/groups_generated', 0.0):.0f}, "
            f"credit moved {row.get('credit/moved_ratio', 0.0):.1%}"
        )
    typer.echo(result.summary())
    typer.echo(f"checkpoints and step metrics: {arguments['storage']}; KFP artifacts: {result.pipeline_root}")


def schedule(
    host: str = typer.Option(..., "--host", envvar="GAGAR_KFP_HOST", help="URL of the KFP API server."),
    pipeline: str = typer.Option(..., "--pipeline", help="Pipeline name in KFP."),
    pipeline_version: str = typer.Option(..., "--pipeline-version", help="Version name to run."),
    experiment: str = typer.Option(
        "gagar", "--experiment", help="Experiment of the runs (created if missing)."
    ),
    name: str = typer.Option(..., "--name", help="Name of the recurring run (one of that name is replaced)."),
    cron: str = typer.Option(..., "--cron", help="6-field cron, seconds first, e.g. '0 0 2 * * *'."),
    max_concurrency: int = typer.Option(1, "--max-concurrency", help="Runs at once (keep 1: runs resume)."),
    catchup: bool = typer.Option(False, "--catchup/--no-catchup", help="Run the schedules missed."),
    service_account: str | None = typer.Option(None, "--service-account", help="ServiceAccount of the runs."),
    param: list[str] = typer.Option([], "--param", help="Pipeline parameter name=value (repeatable)."),
) -> None:
    """Create a recurring run of an uploaded pipeline version; each run resumes from the latest checkpoint."""
    from gagar.cli.params import typed_params
    from gagar.pipeline.client import Schedule, connect, create_schedule

    request = Schedule(
        pipeline=pipeline,
        version=pipeline_version,
        experiment=experiment,
        name=name,
        cron=cron,
        max_concurrency=max_concurrency,
        catchup=catchup,
        service_account=service_account,
        params=typed_params(param),
    )
    run_id = create_schedule(connect(host), request)
    typer.echo(f"recurring run {name} ({run_id}): {pipeline} {pipeline_version} at '{request.cron}'")
