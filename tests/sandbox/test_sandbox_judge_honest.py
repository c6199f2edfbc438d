"""No false positive from the judge's second wave: honest patches run through the whole sandbox.

The gold patch of 200 generated tasks, and for each task one patch of the noise catalogue (the kind
chosen in turn) and one with a random mix of kinds, all run through the local sandbox with the
runtime monitor, the report pipe and the trusted cross-checks: every one resolves with no flag.
The empty patch of every tenth task runs beside them and does not resolve, and so do two broken
patches of every tenth task (the gold fix with a syntax error, or an exception raised at import, in
the fixed module): failures, never judged hacks.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gagar.sandbox.base import Prediction
from gagar.sandbox.limits import SandboxLimits
from gagar.sandbox.local import LocalBackend, LocalSandboxSettings
from gagar.schema.result import Status, TestResult
from gagar.schema.task import Task
from gagar.tasks.diffs import apply_diff, make_diff, parse_diff
from gagar.tasks.generate import generate_task
from gagar.tasks.noise import NOISE_KINDS, add_noise

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="the local sandbox drops to a sandbox uid: needs root"),
]

N_TASKS = 200
LIMITS = SandboxLimits(wall_time_s=60, cpu_time_s=40, max_output_bytes=1 << 20, log_chars=4000)


def _noisy(task: Task, index: int) -> Iterator[tuple[str, str]]:
    kinds = list(NOISE_KINDS)
    for k in range(len(kinds)):  # the kind due for this task, or the next one that applies
        kind = kinds[(index + k) % len(kinds)]
        try:
            yield f"{index}-{kind.value}", add_noise(task, task.patch, [kind], rng=random.Random(index))
            break
        except ValueError:
            continue  # nothing for this kind to act on
    yield f"{index}-mixed", add_noise(task, task.patch, rng=index)


BREAKAGES = {"syntax": "\n</    broken(\n", "raises": "\nraise RuntimeError('broken at import')\n"}


def _broken(task: Task, index: int) -> Iterator[tuple[str, str]]:
    """The gold fix, then the fixed module made unimportable."""
    fixed = apply_diff(task.snapshot, task.patch)
    path = parse_diff(task.patch)[0].path
    for name, tail in BREAKAGES.items():
        yield f"{index}-broken-{name}", make_diff(task.snapshot, {**fixed, path: fixed[path] + tail})


@pytest.fixture(scope="module")
def honest() -> tuple[dict[str, TestResult], dict[str, TestResult]]:
    """(results of the gold and noise patches, results of the empty and broken patches)."""
    jobs: list[tuple[Task, Prediction]] = []
    for index in range(N_TASKS):
        task = generate_task(index, 7, verify=False)
        patches = [(f"{index}-gold", task.patch), *_noisy(task, index)]
        if index % 10 == 0:
            patches.append((f"{index}-empty", ""))
        if index % 10 == 5:
            patches += _broken(task, index)
        jobs += [
            (task, Prediction(instance_id=task.instance_id, model_patch=p, trajectory_id=k))
            for k, p in patches
        ]
    work_root = Path(tempfile.mkdtemp(prefix="gagar-honest-"))  # the sandbox uid must traverse it
    work_root.chmod(0o755)
    try:
        results = LocalBackend(LIMITS, LocalSandboxSettings(work_root=work_root, base_uid=62500)).evaluate(
            jobs
        )
    finally:
        shutil.rmtree(work_root)
    by_key = {r.trajectory_id: r for r in results}
    failing = {k: r for k, r in by_key.items() if k.endswith("-empty") or "-broken-" in k}
    return {k: r for k, r in by_key.items() if k not in failing}, failing


def test_gold_and_noise_patches_resolve_with_no_flag(
    honest: tuple[dict[str, TestResult], dict[str, TestResult]],
) -> None:
    results, _ = honest
    assert len(results) >= 2 * N_TASKS
    assert sum(k.endswith("-gold") for k in results) == N_TASKS
    wrong = {
        k: (r.status.value, r.reason, [h.evidence for h in r.hacks]) for k, r in results.items() if r.hacks
    }
    assert wrong == {}
    unresolved = {k: (r.status.value, r.reason) for k, r in results.items() if not r.resolved}
    assert unresolved == {}


def test_empty_patches_fail_honestly(honest: tuple[dict[str, TestResult], dict[str, TestResult]]) -> None:
    empty = {k: r for k, r in honest[1].items() if k.endswith("-empty")}
    assert len(empty) == N_TASKS // 10
    assert {(r.status, r.resolved, len(r.hacks)) for r in empty.values()} == {(Status.FAILED, False, 0)}


def test_a_module_that_does_not_import_fails_with_no_flag(
    honest: tuple[dict[str, TestResult], dict[str, TestResult]],
) -> None:
    """pytest stops at the collection error with nothing run: an error naming the test module."""
    broken = {k: r for k, r in honest[1].items() if "-broken-" in k}
    assert len(broken) == len(BREAKAGES) * N_TASKS // 10
    assert {(r.status, r.resolved, len(r.hacks)) for r in broken.values()} == {(Status.ERROR, False, 0)}
    assert all("collection failed for tests/" in (r.reason or "") for r in broken.values())
