"""``gagar sandbox``: evaluate model patches against their tasks' tests."""

from __future__ import annotations

from pathlib import Path

import typer

from gagar.cli.core import GagarGroup
from gagar.sandbox.runner import BackendName, summary_line

__all__ = ["app"]

app = typer.Typer(
    cls=GagarGroup, name="sandbox", help="Run model patches against task tests.", no_args_is_help=True
)


@app.callback()
def _group() -> None:
    """Run model patches against task tests, isolated from the host and each other."""


@app.command("run")
def run(
    tasks: Path = typer.Option(..., "--tasks", exists=True, dir_okay=False, help="Tasks JSONL."),
    predictions: Path = typer.Option(
        ..., "--predictions", exists=True, dir_okay=False, help="Predictions JSONL (SWE-bench form)."
    ),
    out: Path = typer.Option(..., "--out", dir_okay=False, help="Results JSONL (TestResult records)."),
    backend: BackendName = typer.Option(BackendName.LOCAL, "--backend", help="Where the tests run."),
    workers: int | None = typer.Option(None, "--workers", min=1, help="Parallel runs [default: cores]."),
) -> None:
    """Evaluate every prediction and write one TestResult per prediction (the pipeline's sandbox stage)."""
    from gagar.records import read_records
    from gagar.schema.result import TestResult
    from gagar.stages import sandbox_stage

    sandbox_stage(tasks=tasks, trajectories=predictions, out=out, backend=backend, workers=workers)
    typer.echo(summary_line(read_records(out, TestResult)))
