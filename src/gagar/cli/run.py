"""``gagar run`` (the RL pipeline on this machine, through kfp.local) and ``gagar schedule``."""

from __future__ import annotations

from pathlib import Path

import typer

from gagar.advantage import Estimator
from gagar.grader.run import GraderKind
from gagar.policy.agent import AgentKind

__all__ = ["run", "schedule"]


def run(
    policy: Path | None = typer.Option(
        None,
        "--policy",
        exists=True,
        file_okay=False,
        help="Initial policy directory [default: the embedded default's SFT policy, built once].",
    ),
    tasks: Path | None = typer.Option(
        None, "--tasks", exists=True, dir_okay=False, help="Training tasks (JSONL) [default: embedded]."
    ),
    out: Path = typer.Option(Path("runs/pipeline"), "--out", help="Where KFP's task artifacts go."),
    storage: str | None = typer.Option(
        None, "--storage", help="Artifact store: a directory or s3://bucket/prefix (default <out>/store)."
    ),
    steps: int = typer.Option(2, "--steps", min=1, help="RL steps of this run (each resumes the store)."),
    algo: Estimator = typer.Option(Estimator.GAGAR, "--algo", help="Advantage estimator."),
    grader: GraderKind = typer.Option(GraderKind.HEURISTIC, "--grader", help="Who ranks the passing ones."),
    group_size: int = typer.Option(4, "--group-size", min=2, help="Trajectories per task."),
    train_batch_groups: int = typer.Option(4, "--train-batch-groups", min=1, help="Groups trained on."),
    gen_batch_groups: int = typer.Option(
        16, "--gen-batch-groups", min=1, help="Tasks sampled per generation batch."
    ),
    max_gen_batches: int = typer.Option(
        3, "--max-gen-batches", min=1, help="Generation batches a step may draw while its batch is short."
    ),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", min=1, help="Longest answer."),
    seed: int = typer.Option(0, "--seed", help="Run seed."),
    pushgateway: str = typer.Option("", "--pushgateway", help="Pushgateway URL for the step metrics."),
    agent: AgentKind = typer.Option(AgentKind.SINGLE, "--agent", help="single or tool-loop (multi-turn)."),
    max_turns: int = typer.Option(8, "--max-turns", min=1, help="Tool loop: most assistant turns."),
    warm: bool = typer.Option(
        True,
        "--warm-stages/--cold-stages",
        help="Run each task's stage function in a fork of one interpreter that imported torch and gagar "
        "once (warm), or in the task's own fresh process (cold, as in a cluster).",
    ),
    param: list[str] = typer.Option(
        [],
        "--param",
        help="Any other pipeline parameter name=value (repeatable), e.g. rollout_backend=openai.",
    ),
) -> None:
    """Run the RL pipeline through kfp.local on CPU: artifacts, metrics and checkpoints in the store.

    Without --policy and --tasks, the embedded default is prepared first under <out>/embedded
    (generated tasks and the SFT policy, reused on later runs).
    """
    from gagar.pipeline.argo_entry import convert
    from gagar.pipeline.client import parse_params
    from gagar.pipeline.graph import parameter
    from gagar.pipeline.local import run_local

    try:
        extra = {name: convert(value, parameter(name).type) for name, value in parse_params(param).items()}
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--param") from None

    if policy is None or tasks is None:
        from gagar.embedded import prepare

        typer.echo(f"preparing the embedded default under {out / 'embedded'} (reused when present)")
        embedded = prepare(out / "embedded")
        policy = policy or embedded.policy
        tasks = tasks or embedded.rl_tasks

    arguments = {
        "model": str(policy.resolve()),
        "tasks": str(tasks.resolve()),
        "storage": storage or str(out / "store"),
        "algo": algo.value,
        "grader": grader.value,
        "group_size": group_size,
        "train_batch_groups": train_batch_groups,
        "gen_batch_groups": gen_batch_groups,
        "max_new_tokens": max_new_tokens,
        "seed": seed,
        "sandbox_backend": "local",
        "pushgateway": pushgateway,
        "agent": agent.value,
        "max_turns": max_turns,
        **extra,
    }
    result = run_local(arguments, out=out, steps=steps, max_gen_batches=max_gen_batches, warm=warm)
    for row in result.steps:
        typer.echo(
            f"step {row['step']:.0f}: resolved rate {row.get('rollout/resolved_rate', 0.0):.3f}, "
            f"groups kept {row.get('sampling/groups_kept', 0.0):.0f}, "
            f"credit moved {row.get('credit/moved_ratio', 0.0):.1%}"
        )
    typer.echo(f"{result.summary()}; store {arguments['storage']}, KFP artifacts {result.pipeline_root}")


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
    from gagar.pipeline.client import Schedule, connect, create_schedule, parse_params

    try:
        request = Schedule(
            pipeline=pipeline,
            version=pipeline_version,
            experiment=experiment,
            name=name,
            cron=cron,
            max_concurrency=max_concurrency,
            catchup=catchup,
            service_account=service_account,
            params=parse_params(param),
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    run_id = create_schedule(connect(host), request)
    typer.echo(f"recurring run {name} ({run_id}): {pipeline} {pipeline_version} at '{request.cron}'")
