"""The ``gagar`` command. Each command group lives in a module of its own; this one only wires them."""

from __future__ import annotations

import warnings

import typer

from gagar import __version__
from gagar.cli import (
    advantages,
    experiment,
    grader,
    models,
    pipeline,
    policy,
    run,
    runs,
    sandbox,
    serve,
    tasks,
)
from gagar.cli.core import GagarGroup, escape_help
from gagar.cli.synthesize import synthesize
from gagar.cli.train import train
from gagar.cli.train import update as train_update

__all__ = ["app", "main"]

# kfp.Client warns on every connection that it needs KFP >= 2.0.0-beta.2: the only servers GAGAR supports.
warnings.filterwarnings(
    "ignore", message="This client only works with Kubeflow Pipeline", category=FutureWarning
)

app = typer.Typer(
    name="gagar",
    cls=GagarGroup,
    help="GRPO with grader-aware credit redistribution for code agents.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"gagar {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """GRPO with grader-aware credit redistribution for code agents."""


app.command("advantages")(advantages.advantages)
app.add_typer(tasks.app, name="tasks")
tasks.app.command("synthesize")(synthesize)
app.add_typer(sandbox.app, name="sandbox")
app.add_typer(grader.app, name="grader")
app.add_typer(policy.app, name="policy")
app.command("rollout")(policy.rollout)
app.command("grade")(grader.grade)
app.command("train")(train)
app.command("train-update")(train_update)
app.command("run")(run.run)
app.add_typer(pipeline.app, name="pipeline")
app.command("schedule")(run.schedule)
app.add_typer(runs.app, name="runs")
app.add_typer(serve.app, name="serve")
app.add_typer(experiment.app, name="experiment")
app.add_typer(models.app, name="models")
escape_help(app)


def main() -> None:
    app()
