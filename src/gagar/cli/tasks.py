"""``gagar tasks``: generate task files (``synthesize`` lives in :mod:`gagar.tasks.synthesize`)."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import typer
from tqdm import tqdm

from gagar.cli.core import GagarGroup
from gagar.tasks.generate import Mutations, Split, generate_tasks, summary_line
from gagar.tasks.images import CliEngine, ImageSettings, build_images
from gagar.tasks.loaders import load_tasks, write_tasks

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


@app.command("build-images")
def build_images_command(
    tasks_path: Path = typer.Option(
        ..., "--tasks", exists=True, dir_okay=False, help="Tasks file (JSONL or parquet)."
    ),
    out: Path = typer.Option(..., "--out", dir_okay=False, help="The tasks with environment.image set."),
    engine: str | None = typer.Option(
        None, "--engine", help="podman or docker (env GAGAR_TASK_IMAGES__ENGINE)."
    ),
    repository: str | None = typer.Option(
        None, "--repository", help="Repository of the tags (env GAGAR_TASK_IMAGES__REPOSITORY)."
    ),
    base_image: str | None = typer.Option(
        None, "--base-image", help="Image the base layer starts from (env GAGAR_TASK_IMAGES__BASE_IMAGE)."
    ),
    instance: bool | None = typer.Option(
        None, "--instance/--no-instance", help="Also bake each snapshot in (env GAGAR_TASK_IMAGES__INSTANCE)."
    ),
) -> None:
    """Build an image per distinct task environment (base, environment, optional instance layer),
    tagged by a hash of its specification; skip what exists; record it as environment.image."""
    given = {"engine": engine, "repository": repository, "base_image": base_image, "instance": instance}
    settings = ImageSettings(**{k: v for k, v in given.items() if v is not None})
    tasks = load_tasks(tasks_path)

    def show(tag: str, built: bool) -> None:
        typer.echo(f"{'built' if built else 'exists'} {tag}")

    updated, report = build_images(tasks, settings, CliEngine(settings.engine), on_layer=show)
    write_tasks(out, updated)
    typer.echo(f"{report.line(len(tasks))} -> {out}")
