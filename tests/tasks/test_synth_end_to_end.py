"""End to end on a real PyPI library (inflection 0.5.1, about 450 tests in a second).

Downloads the sdist from PyPI and builds a venv once for the module. The verification
test re-runs every task with tools independent of the synthesizer's own: ``patch -p1``
for the gold and test patches and pytest's ``-rA`` summary for outcomes.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from gagar.cli.synthesize import synthesize
from gagar.records import read_records
from gagar.schema.task import Task
from gagar.tasks.synthesize import synthesize_from_pypi
from gagar.tasks.testrun import write_snapshot

pytestmark = pytest.mark.slow

SPEC = "inflection==0.5.1"


@pytest.fixture(scope="module")
def work_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("synth-work")


@pytest.fixture(scope="module")
def env_dir() -> Iterator[Path]:
    """Under /tmp itself: pytest's own temporary folders are private, the sandbox uid could not read it."""
    with tempfile.TemporaryDirectory(prefix="gagar-synth-envs-", dir="/tmp") as folder:
        os.chmod(folder, 0o755)
        yield Path(folder)


@pytest.fixture(scope="module")
def tasks(work_dir: Path, env_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Task]:
    out = tmp_path_factory.mktemp("synth-out") / "tasks.jsonl"
    app = typer.Typer()
    app.command()(synthesize)
    args = ["--from-pypi", SPEC, "--n", "3", "--out", str(out), "--work-dir", str(work_dir), "--seed", "0"]
    args += ["--env-dir", str(env_dir)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "kept 3 of" in result.output
    return read_records(out, Task)


def _outcomes(root: Path, task: Task, tests: list[str]) -> dict[str, str]:
    """Status word (PASSED, FAILED, ERROR, ...) per test id, from pytest's ``-rA`` short summary."""
    argv = shlex.split(task.test_cmd or "")
    assert argv[0] == "python"
    assert task.environment.python is not None
    argv = [task.environment.python, *argv[1:], "-rA"]
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    found: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        status, _, rest = line.partition(" ")
        for test in tests:
            if rest == test or rest.startswith(test + " - "):
                found[test] = status
    return found


def _materialize(snapshot: Mapping[str, str], root: Path, *patches: str) -> Path:
    root.mkdir()
    write_snapshot(snapshot, root)
    for patch in patches:
        applied = subprocess.run(
            ["patch", "-p1", "--batch", "--forward"], cwd=root, input=patch, text=True, capture_output=True
        )
        assert applied.returncode == 0, applied.stdout + applied.stderr
    return root


def test_cli_writes_the_requested_number_of_tasks(tasks: list[Task]) -> None:
    assert len(tasks) == 3
    assert len({t.instance_id for t in tasks}) == 3
    for task in tasks:
        assert task.instance_id.startswith("inflection-0.5.1-mut-")
        assert task.repo == "pypi/inflection"
        assert task.FAIL_TO_PASS
        assert not set(task.FAIL_TO_PASS) & set(task.PASS_TO_PASS)
        assert len(task.FAIL_TO_PASS) + len(task.PASS_TO_PASS) > 400
        assert {"inflection/__init__.py", "test_inflection.py", "setup.cfg"} <= set(task.snapshot or {})
        assert task.patch.startswith("diff --git a/inflection/__init__.py b/inflection/__init__.py\n")
        assert task.patch.count("diff --git") == 1
        assert task.FAIL_TO_PASS[0] in task.problem_statement
        removed = [ln[1:].strip() for ln in task.patch.splitlines() if ln.startswith("-") and len(ln) > 4]
        assert not any(line and line in task.problem_statement for line in removed)
        assert task.test_patch.startswith("diff --git a/test_inflection.py b/test_inflection.py\n")
        for test in task.FAIL_TO_PASS:  # the judge's tests are not in the snapshot the policy reads
            assert f"def {test.split('::')[-1].split('[')[0]}(" not in task.snapshot["test_inflection.py"]
        assert any(r.startswith("pytest==") for r in task.environment.requirements)
        assert "--rootdir=." in (task.test_cmd or "")


def test_original_passes_and_mutant_fails_for_every_task(tasks: list[Task], tmp_path: Path) -> None:
    for i, task in enumerate(tasks):
        assert task.snapshot is not None
        wanted = task.FAIL_TO_PASS + task.PASS_TO_PASS
        buggy = _outcomes(_materialize(task.snapshot, tmp_path / f"buggy{i}", task.test_patch), task, wanted)
        assert all(buggy.get(t) in ("FAILED", "ERROR") for t in task.FAIL_TO_PASS), task.instance_id
        assert all(buggy.get(t) == "PASSED" for t in task.PASS_TO_PASS), task.instance_id
        fixed_root = _materialize(task.snapshot, tmp_path / f"fixed{i}", task.patch, task.test_patch)
        fixed = _outcomes(fixed_root, task, wanted)
        assert all(fixed.get(t) == "PASSED" for t in wanted), task.instance_id


def test_same_seed_tries_the_same_mutants_first(tasks: list[Task], work_dir: Path, env_dir: Path) -> None:
    report = synthesize_from_pypi(SPEC, n=1, seed=0, work_dir=work_dir, env_dir=env_dir)
    assert [t.instance_id for t in report.tasks] == [tasks[0].instance_id]
    assert report.tasks[0].patch == tasks[0].patch


def test_an_unpinned_spec_is_refused_before_any_download(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="NAME==VERSION"):
        synthesize_from_pypi("inflection", n=1, work_dir=tmp_path)
    assert not any(tmp_path.iterdir())
