"""Local backend plumbing: infra errors are infra_error (never failed), the CLI, bounded output."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gagar.cli.sandbox import app
from gagar.records import read_records, write_records
from gagar.sandbox.base import Prediction
from gagar.sandbox.limits import SandboxLimits
from gagar.sandbox.local import LocalBackend, LocalSandboxSettings
from gagar.sandbox.patch import file_diff
from gagar.sandbox.process import BoundedOutput
from gagar.sandbox.runner import join_jobs
from gagar.schema.result import Outcome, Status, TestResult
from gagar.schema.task import Task

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="the local sandbox drops to a sandbox uid: needs root"
)

CALC = "def mul(a, b):\n    return a + b\n"
TESTS = (
    "from calc import mul\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n\n\n"
    "def test_one():\n    assert mul(1, 1) >= 1\n"
)
GOLD = file_diff("calc.py", CALC, CALC.replace("a + b", "a * b"))
LIMITS = SandboxLimits(wall_time_s=30)


def _task(**overrides: object) -> Task:
    fields = {
        "instance_id": "mul-1",
        "repo": "gagar/mul",
        "snapshot": {"calc.py": CALC, "tests/test_calc.py": TESTS},
        "problem_statement": "mul adds",
        "patch": GOLD,
        "FAIL_TO_PASS": ["tests/test_calc.py::test_mul"],
        "PASS_TO_PASS": ["tests/test_calc.py::test_one"],
        **overrides,
    }
    return Task.model_validate(fields)


def _one(backend: LocalBackend, task: Task, patch: str = GOLD) -> TestResult:
    return backend.evaluate([(task, Prediction(instance_id=task.instance_id, model_patch=patch))])[0]


@pytest.mark.parametrize(
    ("settings", "task", "why"),
    [
        (
            LocalSandboxSettings(bwrap="/nonexistent/bwrap"),
            _task(),
            "sandbox tool '/nonexistent/bwrap' not found",
        ),
        (LocalSandboxSettings(work_root=Path("/dev/null/work")), _task(), "cannot create a workspace"),
        (LocalSandboxSettings(), _task(environment={"python": "/nonexistent/python"}), "interpreter"),
        (LocalSandboxSettings(), _task(snapshot=None, base_commit="abc123"), "no repos_dir"),
    ],
)
def test_infra_problems_are_infra_errors(settings: LocalSandboxSettings, task: Task, why: str) -> None:
    result = _one(LocalBackend(LIMITS, settings, workers=1), task)
    assert result.status == Status.INFRA_ERROR
    assert not result.resolved
    assert why in (result.reason or "")


@needs_root
def test_sandbox_that_cannot_start_is_an_infra_error() -> None:
    # the venv's interpreter lives under /root, which the sandbox uid cannot traverse
    unreadable = os.path.realpath(sys.executable)
    if not unreadable.startswith("/root/"):
        pytest.skip("this interpreter is readable by other users")
    result = _one(LocalBackend(LIMITS, workers=1), _task(environment={"python": unreadable}))
    assert result.status == Status.INFRA_ERROR
    # the reason names how bwrap exited and carries its own message
    assert "did not start the sandbox (exit status 1): bwrap: " in (result.reason or "")


@needs_root
def test_custom_test_cmd_and_test_patch() -> None:
    extra = "def test_extra():\n    from calc import mul\n    assert mul(3, 3) == 9\n"
    task = _task(
        test_cmd="python -m pytest -q tests/test_extra.py tests/test_calc.py::test_mul",
        test_patch=file_diff("tests/test_extra.py", None, extra),
        FAIL_TO_PASS=["tests/test_extra.py::test_extra", "tests/test_calc.py::test_mul"],
        PASS_TO_PASS=[],
    )
    result = _one(LocalBackend(LIMITS, workers=1), task)
    assert result.status == Status.PASSED, result.log
    assert result.tests == {t: Outcome.PASSED for t in task.FAIL_TO_PASS}


@needs_root
def test_cli_run_writes_results_and_a_summary(tmp_path: Path) -> None:
    tasks, preds, out = tmp_path / "tasks.jsonl", tmp_path / "preds.jsonl", tmp_path / "results.jsonl"
    write_records(tasks, [_task()])
    rows = [
        {"instance_id": "mul-1", "model_patch": GOLD, "trajectory_id": "t-good", "turns": 3},
        {"instance_id": "mul-1", "model_patch": ""},
    ]
    preds.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["--tasks", str(tasks), "--predictions", str(preds), "--out", str(out), "--workers", "2"]
    res = CliRunner().invoke(app, ["run", *args])
    assert res.exit_code == 0, res.output
    assert (
        "2 evaluated, 1 resolved (50.0%): passed 1, failed 1, error 0, timeout 0, infra_error 0" in res.output
    )
    results = read_records(out, TestResult)
    assert [(r.trajectory_id, r.status) for r in results] == [
        ("t-good", Status.PASSED),
        ("mul-1", Status.FAILED),
    ]


def test_predictions_for_unknown_tasks_are_rejected() -> None:
    with pytest.raises(ValueError, match="prediction #2: instance_id 'other' is not in the tasks file"):
        join_jobs([_task()], [Prediction(instance_id="mul-1"), Prediction(instance_id="other")])


def test_bounded_output_keeps_head_and_tail() -> None:
    out = BoundedOutput(keep_bytes=10)
    for chunk in (b"abc", b"defgh", b"x" * 100, b"12345"):
        out.add(chunk)
    assert out.total == 113
    assert out.text() == "abcde\n[... 103 bytes omitted ...]\n12345"


def test_orphaned_workspaces_of_dead_processes_are_swept_when_a_backend_starts(tmp_path: Path) -> None:
    import subprocess

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    hour_ago = os.path.getmtime(tmp_path) - 3700
    made = {
        "orphan": f"gagar-sbx-{dead.pid}-abc",
        "recent_orphan": f"gagar-sbx-{dead.pid}-def",
        "live": f"gagar-sbx-{os.getpid()}-ghi",
        "other": "gagar-sbx-notapid",
    }
    for name in made.values():
        (tmp_path / name / "repo").mkdir(parents=True)
    for key in ("orphan", "live", "other"):
        os.utime(tmp_path / made[key], (hour_ago, hour_ago))

    LocalBackend(settings=LocalSandboxSettings(work_root=tmp_path), workers=1)

    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        made[k] for k in ("recent_orphan", "live", "other")
    )


@needs_root
def test_schema_2_tests_in_the_test_patch_cannot_be_pre_empted_by_the_model_patch() -> None:
    """FAIL_TO_PASS tests travel in test_patch: a model patch writing that file first is reset and flagged."""
    hidden = "from calc import mul\n\n\ndef test_mul_hidden():\n    assert mul(3, 4) == 12\n"
    task = _task(
        snapshot={"calc.py": CALC, "tests/test_calc.py": TESTS},
        test_patch=file_diff("tests/test_hidden.py", None, hidden),
        FAIL_TO_PASS=["tests/test_hidden.py::test_mul_hidden"],
    )
    trivial = file_diff("tests/test_hidden.py", None, "def test_mul_hidden():\n    pass\n")
    backend = LocalBackend(LIMITS, workers=1)
    gold, empty, pre_empted = (_one(backend, task, patch) for patch in (GOLD, "", trivial))
    assert (gold.status, gold.resolved) == (Status.PASSED, True), gold.reason
    assert gold.tests["tests/test_hidden.py::test_mul_hidden"] == Outcome.PASSED
    assert empty.status == Status.FAILED
    assert (pre_empted.status, pre_empted.resolved) == (Status.HACK, False)
    assert pre_empted.hacks[0].evidence.startswith("tests/test_hidden.py: added")
    assert pre_empted.tests["tests/test_hidden.py::test_mul_hidden"] == Outcome.FAILED  # the task's test ran


@pytest.fixture(scope="module")
def venv_with_a_package() -> Iterator[Path]:
    """A venv on Debian's python3 (pytest from its system site-packages) holding a module that
    exists nowhere else, in a folder the sandbox uid can read."""
    import shutil
    import subprocess
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="gagar-venv-test-", dir="/var/tmp"))
    try:
        root.chmod(0o755)
        venv = root / "env"
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(venv)], check=True)
        purelib = subprocess.run(
            [str(venv / "bin/python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
        (Path(purelib) / "only_in_the_venv.py").write_text("FACTOR = 6\n")
        for path in [root, *root.rglob("*")]:
            path.chmod(path.stat().st_mode | 0o555 if path.is_dir() else path.stat().st_mode | 0o444)
        yield venv
    finally:
        shutil.rmtree(root, ignore_errors=True)


@needs_root
@pytest.mark.parametrize("isolate", [True, False])
def test_a_task_runs_in_the_venv_it_was_verified_in(venv_with_a_package: Path, isolate: bool) -> None:
    tests = (
        "from calc import mul\nfrom only_in_the_venv import FACTOR\n\n\n"
        "def test_mul():\n    assert mul(2, 3) == FACTOR\n"
    )
    task = _task(
        snapshot={"calc.py": CALC, "tests/test_calc.py": tests},
        PASS_TO_PASS=[],
        environment={"python": str(venv_with_a_package / "bin/python")},
    )
    assert _one(LocalBackend(LIMITS, workers=1, isolate=isolate), task).status == Status.PASSED
    bare = _one(
        LocalBackend(LIMITS, workers=1, isolate=isolate), _task(snapshot=task.snapshot, PASS_TO_PASS=[])
    )
    assert bare.status != Status.PASSED  # the module exists only in the venv
