"""``gagar tasks synthesize``: repair tasks from a PyPI library's own tests and mutants of its code."""

from __future__ import annotations

from pathlib import Path

import typer
from tqdm import tqdm

from gagar.records import write_records
from gagar.tasks.synth.runner import EnvironmentBuildError
from gagar.tasks.synth.sdist import SdistError
from gagar.tasks.synthesize import DEFAULT_ENV_DIR, DEFAULT_WORK_DIR, CandidateResult, synthesize_from_pypi

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
    env_dir: Path = typer.Option(
        DEFAULT_ENV_DIR,
        "--env-dir",
        file_okay=False,
        help="Parent of the venv the tasks record and run in: the sandbox uid must be able to read it.",
    ),
    python: str | None = typer.Option(
        None, "--python", help="Interpreter the venv is built on (default: the sandbox's, /usr/bin/python3)."
    ),
) -> None:
    """Mutate code covered by the library's tests; keep mutants that break tests, verify, and that the
    sandbox resolves with the gold patch and not with an empty one."""
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
                env_dir=env_dir,
                base_python=python,
            )
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--from-pypi") from None
        except (SdistError, EnvironmentBuildError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None
    write_records(out, report.tasks)
    typer.echo(report.summary())
    for note in report.judge_notes[:5]:
        typer.echo(f"dropped by the judge: {note}")
