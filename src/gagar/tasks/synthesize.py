"""Synthesize repair tasks from a real library: mutate code its own tests cover, keep what they catch.

``synthesize_from_pypi("inflection==0.5.1", n=10)`` downloads the sdist, builds a
virtual environment with its runtime requirements, pytest and coverage, runs its test
suite twice (once under coverage) and keeps the tests that pass both times. It then
tries mutations (:mod:`gagar.tasks.mutate`) of executed lines of the library, in an
order fixed by ``seed``, running the whole suite on each. A mutant that makes at least
one of those tests fail becomes a :class:`~gagar.tasks.schema.Task` (buggy snapshot,
reverse diff as the gold patch, FAIL_TO_PASS, PASS_TO_PASS), and is kept only if a
re-run from the task record itself confirms it (:func:`gagar.tasks.synth.tasks.verify_task`).

Work files live under ``work_dir/NAME-VERSION/``: the archive, the unpacked source,
the venv (reused between calls), a scratch copy that mutants are written into.
"""

from __future__ import annotations

import fcntl
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gagar.tasks.mutate import find_mutations
from gagar.tasks.schema import Task
from gagar.tasks.synth.runner import TestSuite, covered_lines, ensure_environment
from gagar.tasks.synth.sdist import (
    SdistError,
    detect_layout,
    download_sdist,
    parse_spec,
    read_requirements,
    safe_extract,
    snapshot_files,
)
from gagar.tasks.synth.tasks import MutantSource, classify, make_task, stable_passing, verify_task

__all__ = ["CandidateResult", "SynthesisReport", "synthesize_from_pypi"]

DEFAULT_WORK_DIR = Path(".work/synth")


@dataclass(frozen=True)
class CandidateResult:
    """What happened to one candidate mutant: ``kept``, ``survived`` (no test failed),
    ``broken`` (timeout, crash, collection error) or ``unverified`` (the re-run disagreed)."""

    index: int
    verdict: str
    seconds: float


@dataclass
class SynthesisReport:
    """The tasks and the numbers of one synthesis run."""

    project: str
    tasks: list[Task] = field(default_factory=list)
    candidates_available: int = 0
    tried: int = 0
    verdicts: dict[str, int] = field(default_factory=dict)
    stable_tests: int = 0
    setup_seconds: float = 0.0
    seconds: float = 0.0

    def summary(self) -> str:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(self.verdicts.items()))
        return (
            f"{self.project}: kept {len(self.tasks)} of {self.tried} mutants tried ({counts}); "
            f"{self.candidates_available} candidates on covered lines, {self.stable_tests} stable tests; "
            f"setup {self.setup_seconds:.0f} s, total {self.seconds:.0f} s"
        )


def _prepare_source(name: str, version: str, base: Path) -> Path:
    source = base / "source"
    if not source.is_dir():
        archive = download_sdist(name, version, base / "archive")
        shutil.rmtree(base / "unpacked.tmp", ignore_errors=True)  # left by an interrupted run
        unpacked = safe_extract(archive, base / "unpacked.tmp")
        unpacked.rename(source)
        shutil.rmtree(base / "unpacked.tmp")
    return source


def synthesize_from_pypi(
    spec: str,
    n: int,
    seed: int = 0,
    work_dir: Path = DEFAULT_WORK_DIR,
    max_candidates: int | None = None,
    extra_requirements: Sequence[str] = (),
    on_candidate: Callable[[CandidateResult], None] | None = None,
) -> SynthesisReport:
    """Up to ``n`` verified tasks from the library pinned by ``spec`` (``NAME==VERSION``).

    Args:
        spec: exact pin of a PyPI project whose sdist ships its pytest suite.
        n: how many tasks to keep.
        seed: fixes the order in which candidate mutants are tried.
        work_dir: cache of downloads, environments and scratch copies.
        max_candidates: mutants to try at most; default ``20 * n``.
        extra_requirements: packages the tests need beyond the library's runtime requirements.
        on_candidate: called after each candidate (progress).

    Raises:
        ValueError: a malformed spec or ``n < 1``.
        SdistError: the sdist has no usable tests, or no test passes on the original.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    name, version = parse_spec(spec)
    base = work_dir.resolve() / f"{name}-{version}"
    base.mkdir(parents=True, exist_ok=True)
    with open(base / ".lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SdistError(f"another synthesis is already using {base}") from None
        return _synthesize(name, version, base, n, seed, max_candidates, extra_requirements, on_candidate)


def _synthesize(
    name: str,
    version: str,
    base: Path,
    n: int,
    seed: int,
    max_candidates: int | None,
    extra_requirements: Sequence[str],
    on_candidate: Callable[[CandidateResult], None] | None,
) -> SynthesisReport:
    project = f"{name}=={version}"
    started = time.monotonic()
    source = _prepare_source(name, version, base)
    layout = detect_layout(source)
    requirements = [*read_requirements(source), *extra_requirements]
    python = ensure_environment(base / "venv", ["pytest", "coverage", *requirements])
    suite = TestSuite(python, layout.source_root, layout.test_targets, base / "plugin")
    suite.install_plugin()

    scratch = base / "scratch"
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(source, scratch)
    first = suite.run(scratch, timeout_s=600, coverage_file=base / "coverage.data")
    second = suite.run(scratch, timeout_s=600)
    stable = stable_passing([first, second])
    if first.broken or not stable:
        raise SdistError(f"{project}: no test passes on the original sources:\n{first.log_tail[-1500:]}")
    timeout_s = max(20.0, 10 * max(first.duration_s, second.duration_s))
    lines = covered_lines(python, scratch, base / "coverage.data")
    snapshot = snapshot_files(source)

    candidates = [
        MutantSource(path, snapshot[path], mutation)
        for path in layout.package_files
        if path in snapshot
        for mutation in find_mutations(snapshot[path], lines.get(path, set()))
    ]
    random.Random(seed).shuffle(candidates)
    report = SynthesisReport(project, candidates_available=len(candidates), stable_tests=len(stable))
    report.setup_seconds = time.monotonic() - started
    budget = max_candidates if max_candidates is not None else 20 * n

    for index, candidate in enumerate(candidates[:budget]):
        if len(report.tasks) >= n:
            break
        t0 = time.monotonic()
        target = scratch / candidate.path
        target.write_text(candidate.mutant, encoding="utf-8")
        try:
            run = suite.run(scratch, timeout_s)
        finally:
            target.write_text(candidate.original, encoding="utf-8")
        verdict = "broken"
        split = classify(stable, run)
        if split is not None and not split[0]:
            verdict = "survived"
        elif split is not None:
            task = make_task(
                instance_id=f"{name}-{version}-mut-{index:04d}",
                project=project,
                snapshot=snapshot,
                mutant=candidate,
                fail_to_pass=split[0],
                pass_to_pass=split[1],
                messages=run.messages,
                suite=suite,
                requirements=requirements,
            )
            verdict = "unverified" if verify_task(task, suite, snapshot, timeout_s) else "kept"
            if verdict == "kept":
                report.tasks.append(task)
        report.tried += 1
        report.verdicts[verdict] = report.verdicts.get(verdict, 0) + 1
        if on_candidate is not None:
            on_candidate(CandidateResult(index, verdict, time.monotonic() - t0))
    report.seconds = time.monotonic() - started
    return report
