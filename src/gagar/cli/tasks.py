"""``gagar tasks``: generate task files (``synthesize`` lives in :mod:`gagar.tasks.synthesize`)."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import typer
from tqdm import tqdm

from gagar.cli.core import GagarGroup
from gagar.tasks.generate import Mutations, Split, generate_tasks, summary_line
from gagar.tasks.loaders import write_tasks

__all__ = ["app"]

app = typer.Typer(cls=GagarGroup, name="tasks", help="Create and inspect repair tasks.", no_args_is_help=True)


@app.callback()
def _group() -> None:
    """Create and inspect repair tasks."""


@app.command("generate")
def generate(
    n: int = typer.Option(..., "--n", min=1, help="Number of tasks (one generated repository each)."),
    seed: int = typer.Option(0, "--seed", help="Seed; the same seed and split give the same tasks."),
    out: Path = typer.Option(..., "--out", dir_okay=False, help="Output file (.jsonl or .parquet)."),
    split: str = typer.Option("train", "--split", help="train or heldout; they never share a repository."),
    workers: int = typer.Option(1, "--workers", min=1, help="Processes generating in parallel."),
    verify: bool = typer.Option(
        True, "--verify/--no-verify", help="Run pytest for FAIL_TO_PASS; --no-verify is for SFT data only."
    ),
    mutations: str = typer.Option(
        "catalogue",
        "--mutations",
        help="Bug source: 'catalogue' (hand-written, a few per function) or 'all' (also the AST operators).",
    ),
) -> None:
    """Generate buggy packages with gold patches; FAIL_TO_PASS comes from real pytest runs."""
    if split not in ("train", "heldout"):
        raise typer.BadParameter("must be 'train' or 'heldout'", param_hint="--split")
    chosen: Split = "train" if split == "train" else "heldout"
    if mutations not in get_args(Mutations):
        raise typer.BadParameter(f"must be one of {', '.join(get_args(Mutations))}", param_hint="--mutations")
    source: Mutations = "all" if mutations == "all" else "catalogue"
    with tqdm(total=n, desc="tasks", unit="task") as bar:
        tasks = generate_tasks(
            n,
            seed,
            chosen,
            workers=workers,
            progress=lambda _: bar.update(1),
            verify=verify,
            mutations=source,
        )
    write_tasks(out, tasks)
    typer.echo(f"{summary_line(tasks)} -> {out}")
