"""``gagar tasks synthesize``: repair tasks from a PyPI library's own tests and mutants of its code."""

from __future__ import annotations

from pathlib import Path

import typer
from tqdm import tqdm

from gagar.records import write_records
from gagar.tasks.synth.runner import EnvironmentBuildError
from gagar.tasks.synth.sdist import SdistError
from gagar.tasks.synthesize import DEFAULT_WORK_DIR, CandidateResult, synthesize_from_pypi

__all__ = ["synthesize"]


def synthesize(
    from_pypi: str = typer.Option(
        ..., "--from-pypi", help="Exact pin NAME==VERSION of a library whose sdist ships its pytest suite."
    ),
    n: int = typer.Option(10, "--n", min=1, help="How many verified tasks to keep."),
    out: Path = typer.Option(..., "--out", dir_okay=False, help="Where to write the tasks (JSONL)."),
    seed: int = typer.Option(0, help="Fixes the order in which mutants are tried."),
    work_dir: Path = typer.Option(
        DEFAULT_WORK_DIR, "--work-dir", file_okay=False, help="Cache of sdists, venvs and scratch copies."
    ),
    max_candidates: int | None = typer.Option(
        None, "--max-candidates", min=1, help="Mutants to try at most (default 20 x --n)."
    ),
    test_requirement: list[str] = typer.Option(
        [], "--test-requirement", help="Extra package the tests need (repeatable)."
    ),
) -> None:
    """Mutate code covered by the library's tests; keep mutants that break tests and verify as tasks."""
    with tqdm(total=n, desc=from_pypi, unit="task") as bar:

        def progress(result: CandidateResult) -> None:
            bar.update(result.verdict == "kept")
            bar.set_postfix(tried=result.index + 1, last=result.verdict)

        try:
            report = synthesize_from_pypi(
                from_pypi,
                n,
                seed=seed,
                work_dir=work_dir,
                max_candidates=max_candidates,
                extra_requirements=test_requirement,
                on_candidate=progress,
            )
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--from-pypi") from None
        except (SdistError, EnvironmentBuildError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None
    write_records(out, report.tasks)
    typer.echo(report.summary())
