"""``gagar experiment run|report``: the GRPO-vs-GAGAR comparison of issue #8."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import typer

from gagar.cli.core import GagarGroup

__all__ = ["app"]

app = typer.Typer(
    cls=GagarGroup,
    name="experiment",
    help="Compare GRPO and GAGAR from the same SFT checkpoint.",
    no_args_is_help=True,
)


@app.command("run")
def run(
    config: Path = typer.Option(..., "--config", exists=True, dir_okay=False, help="Experiment YAML."),
    out: Path | None = typer.Option(None, "--out", file_okay=False, help="Output folder (default: out_dir)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show progress bars."),
) -> None:
    """Train every arm and seed (finished runs are skipped, interrupted ones resumed), evaluate, report."""
    from gagar.experiment import load_experiment_config, run_experiment, write_report

    try:
        settings = load_experiment_config(config, {"out_dir": out} if out is not None else None)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--config") from None
    command = shlex.join(["gagar", *sys.argv[1:]])  # as typed, whichever entry point ran it
    run_experiment(settings, command=command, progress=progress)
    report = settings.out_dir / "report.md"
    for line in write_report(settings.out_dir, report):
        typer.echo(line)
    typer.echo(f"report: {report}")


@app.command("report")
def report(
    directory: Path = typer.Option(..., "--dir", exists=True, file_okay=False, help="Experiment folder."),
    out: Path | None = typer.Option(
        None, "--out", dir_okay=False, help="Markdown file (default DIR/report.md); plots go beside it."
    ),
) -> None:
    """Write the report (table, CIs, paired differences, plots) and print the mechanical check."""
    from gagar.experiment import write_report

    target = out or directory / "report.md"
    try:
        lines = write_report(directory, target)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--dir") from None
    for line in lines:
        typer.echo(line)
    typer.echo(f"report: {target}")
