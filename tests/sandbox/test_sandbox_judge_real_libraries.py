"""No false positive on real libraries: gold patches of tasks synthesized from four PyPI projects.

Each library (the four of docs/tasks-synthesis.md: a single module, src layouts, settings in
``pyproject.toml`` and ``setup.cfg``, unittest classes) is downloaded from PyPI and synthesized into
a few tasks; their gold and empty patches then run in one batch through the local sandbox with the
runtime monitor and the trusted cross-checks: every gold patch resolves with no flag, no empty one
resolves. Set ``GAGAR_TEST_SYNTH_DIR`` to keep the downloads and environments between runs.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gagar.sandbox.base import Prediction
from gagar.sandbox.local import LocalBackend, LocalSandboxSettings
from gagar.schema.result import Status, TestResult
from gagar.schema.task import Task
from gagar.tasks.synthesize import synthesize_from_pypi

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="the local sandbox drops to a sandbox uid: needs root"),
]

LIBRARIES = ("inflection==0.5.1", "isodate==0.7.2", "cachetools==5.5.0", "semver==3.0.2")
PER_LIBRARY = 2


@pytest.fixture(scope="module")
def synth_dir() -> Iterator[Path]:
    """Downloads and environments, under /tmp so that the sandbox uid can read the venvs."""
    kept = os.environ.get("GAGAR_TEST_SYNTH_DIR")
    if kept:
        Path(kept).mkdir(parents=True, exist_ok=True)
        yield Path(kept)
        return
    with tempfile.TemporaryDirectory(prefix="gagar-synth-", dir="/tmp") as folder:
        yield Path(folder)


@pytest.fixture(scope="module")
def tasks(synth_dir: Path) -> list[Task]:
    envs = synth_dir / "envs"
    envs.mkdir(exist_ok=True)
    for folder in (synth_dir, envs):
        folder.chmod(0o755)
    out: list[Task] = []
    for spec in LIBRARIES:
        report = synthesize_from_pypi(spec, PER_LIBRARY, seed=0, work_dir=synth_dir / "work", env_dir=envs)
        out += report.tasks
    return out


@pytest.fixture(scope="module")
def batch(tasks: list[Task]) -> dict[str, TestResult]:
    jobs = [
        (
            task,
            Prediction(
                instance_id=task.instance_id, model_patch=patch, trajectory_id=f"{task.instance_id}:{k}"
            ),
        )
        for task in tasks
        for k, patch in (("gold", task.patch), ("empty", ""))
    ]
    work_root = Path(tempfile.mkdtemp(prefix="gagar-real-"))  # the sandbox uid must traverse it
    work_root.chmod(0o755)
    try:
        results = LocalBackend(settings=LocalSandboxSettings(work_root=work_root, base_uid=62600)).evaluate(
            jobs
        )
    finally:
        shutil.rmtree(work_root)
    return {r.trajectory_id: r for r in results}


def test_every_library_gave_tasks(tasks: list[Task]) -> None:
    libraries = {task.repo for task in tasks}
    assert len(libraries) == len(LIBRARIES), libraries
    assert len(tasks) >= len(LIBRARIES) * PER_LIBRARY - 1


def test_gold_patches_of_real_libraries_resolve_with_no_flag(batch: dict[str, TestResult]) -> None:
    gold = {k: r for k, r in batch.items() if k.endswith(":gold")}
    wrong = {
        k: (r.status.value, r.reason, [h.evidence for h in r.hacks])
        for k, r in gold.items()
        if not r.resolved
    }
    assert wrong == {}
    assert all(r.status == Status.PASSED and r.hacks == [] for r in gold.values())


def test_empty_patches_of_real_libraries_do_not_resolve(batch: dict[str, TestResult]) -> None:
    empty = [r for k, r in batch.items() if k.endswith(":empty")]
    assert empty
    assert not any(r.resolved for r in empty)
    assert all(r.hacks == [] for r in empty)
