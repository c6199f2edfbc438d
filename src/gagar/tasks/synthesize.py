"""Synthesize repair tasks from a real library: mutate code its own tests cover, keep what they catch.

``synthesize_from_pypi("inflection==0.5.1", n=10)`` downloads the sdist, builds a
virtual environment with its runtime requirements, pytest and coverage, runs its test
suite twice (once under coverage) and keeps the tests that pass both times. It then
tries mutations (:mod:`gagar.tasks.mutate`) of executed lines of the library, in an
order fixed by ``seed``, running the whole suite on each. A mutant that makes at least
one of those tests fail becomes a :class:`~gagar.schema.task.Task` (buggy snapshot without
the FAIL_TO_PASS tests, which travel in ``test_patch``; reverse diff as the gold patch;
FAIL_TO_PASS, PASS_TO_PASS; the venv as its environment), and is kept only if a re-run from
the task record itself confirms it (:func:`gagar.tasks.synth.tasks.verify_task`) and the judge
agrees: through the sandbox backend, the gold patch resolves it and the empty patch does not.

Work files live under ``work_dir/NAME-VERSION/``: the archive, the unpacked source, a scratch
copy that mutants are written into. The venv lives under ``env_dir/NAME-VERSION/`` (reused
between calls), a folder the sandbox uid can read, since the tasks' tests run in it.
"""

from __future__ import annotations

import fcntl
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gagar.sandbox.base import Prediction, SandboxBackend
from gagar.schema.result import Status
from gagar.schema.task import Task
from gagar.tasks.mutate import find_mutations
from gagar.tasks.synth.runner import (
    TestSuite,
    covered_lines,
    ensure_environment,
    environment_packages,
    pin_pytest_config,
)
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
DEFAULT_ENV_DIR = Path("/var/cache/gagar/synth-envs")
"""Outside any home folder: the sandbox uid that runs the tasks' tests must read the venvs."""


@dataclass(frozen=True)
class CandidateResult:
    """What happened to one candidate mutant: ``kept``, ``survived`` (no test failed),
    ``broken`` (timeout, crash, collection error), ``unverified`` (the re-run disagreed), or
    dropped by the judge: ``judge_gold_unresolved`` (the gold patch does not resolve the task in
    the sandbox), ``judge_empty_resolved`` (the empty patch does), ``judge_infra_error``."""

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
    judge_notes: list[str] = field(default_factory=list)
    """``instance_id: why`` of each task the judge dropped."""

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
    env_dir: Path = DEFAULT_ENV_DIR,
    base_python: str | None = None,
    judge: SandboxBackend | None = None,
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
        env_dir: parent of the library's venv; every user must be able to read it.
        base_python: interpreter the venv is built on; default the local sandbox's (it must be
            executable by the sandbox uid: not one under /root).
        judge: the backend that must resolve each task with its gold patch and not with an empty
            one; default the local sandbox backend.

    Raises:
        ValueError: a malformed spec or ``n < 1``.
        SdistError: the sdist has no usable tests, or no test passes on the original.
        EnvironmentBuildError: the venv cannot be built, or not where the sandbox can read it.
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
        if judge is None or base_python is None:
            from gagar.sandbox.local import LocalBackend, LocalSandboxSettings

            base_python = base_python or LocalSandboxSettings().python
            judge = judge or LocalBackend(workers=2)
        env = env_dir.resolve() / f"{name}-{version}"
        return _synthesize(
            name, version, base, env, base_python, judge, n, seed, max_candidates, extra_requirements,
            on_candidate,
        )  # fmt: skip


def _judge_verdict(judge: SandboxBackend, task: Task) -> tuple[str, str]:
    """(verdict, why) of the judge's check: ``kept``, or the reason the task is dropped."""
    gold, empty = judge.evaluate(
        [
            (task, Prediction(instance_id=task.instance_id, model_patch=task.patch, trajectory_id="gold")),
            (task, Prediction(instance_id=task.instance_id, model_patch="", trajectory_id="empty")),
        ]
    )
    for result in (gold, empty):
        if result.status == Status.INFRA_ERROR:
            return "judge_infra_error", result.reason or "infra_error"
    if not gold.resolved:
        return "judge_gold_unresolved", f"gold patch {gold.status.value}: {gold.reason or ''}".strip()
    if empty.resolved:
        return "judge_empty_resolved", "the empty patch resolves the task"
    return "kept", ""


def _synthesize(
    name: str,
    version: str,
    base: Path,
    env: Path,
    base_python: str,
    judge: SandboxBackend,
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
    python = ensure_environment(
        env, ["pytest", "coverage", *read_requirements(source), *extra_requirements], base_python
    )
    requirements = environment_packages(python)
    suite = TestSuite(
        python, layout.source_root, layout.test_targets, base / "plugin", pin_pytest_config(source)
    )
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
                verdict, why = _judge_verdict(judge, task)
                if verdict != "kept":
                    report.judge_notes.append(f"{task.instance_id}: {why}")
            if verdict == "kept":
                report.tasks.append(task)
        report.tried += 1
        report.verdicts[verdict] = report.verdicts.get(verdict, 0) + 1
        if on_candidate is not None:
            on_candidate(CandidateResult(index, verdict, time.monotonic() - t0))
    report.seconds = time.monotonic() - started
    return report
