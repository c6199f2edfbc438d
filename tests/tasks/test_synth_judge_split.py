"""Synthesized tasks keep their judge out of the snapshot and pin pytest to the repository."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from gagar.schema.result import Outcome, Status, TestResult
from gagar.schema.task import Task
from gagar.tasks.diffs import apply_diff, parse_diff
from gagar.tasks.synth.runner import (
    EMPTY_PYTEST_INI,
    EnvironmentBuildError,
    TestSuite,
    ensure_environment,
    pin_pytest_config,
    pytest_config_file,
)
from gagar.tasks.synth.tasks import split_judge_tests
from gagar.tasks.synthesize import _judge_verdict
from gagar.tasks.testrun import write_snapshot

_TESTS = """import pytest

from lib import double


def test_one():
    assert double(1) == 2


@pytest.mark.parametrize("x", [1, 2])
def test_many(x):
    assert double(x) == 2 * x


class TestDouble:
    def test_zero(self):
        assert double(0) == 0

    def test_negative(self):
        assert double(-1) == -2
"""


def test_split_takes_out_whole_definitions_and_the_test_patch_puts_them_back() -> None:
    snapshot = {"src/lib.py": "def double(x):\n    return 2 * x\n", "tests/test_lib.py": _TESTS}
    failing = [
        "tests/test_lib.py::test_many[1]",
        "tests/test_lib.py::test_many[2]",
        "tests/test_lib.py::TestDouble::test_zero",
        "tests/test_lib.py::test_missing",
    ]
    visible, test_patch, kept = split_judge_tests(snapshot, failing)
    shown = visible["tests/test_lib.py"]
    assert "def test_one" in shown
    assert "def test_negative" in shown
    assert "test_many" not in shown
    assert "parametrize" not in shown  # decorators go with their function
    assert "test_zero" not in shown
    assert kept == ["tests/test_lib.py::test_missing"]
    assert apply_diff(visible, test_patch) == snapshot
    assert [fp.new_path for fp in parse_diff(test_patch)] == ["tests/test_lib.py"]


def test_a_test_method_inherited_from_a_mixin_is_taken_out_of_the_mixin() -> None:
    mixin = "class CacheMixin:\n    def test_get(self):\n        assert 1\n\n"
    mixin += "    def test_set(self):\n        assert 2\n"
    lru = "import unittest\n\nfrom . import CacheMixin as Base\n\n\nclass LRUTest(Base, unittest.TestCase):\n"
    lru += "    pass\n"
    snapshot = {"tests/__init__.py": mixin, "tests/test_lru.py": lru}
    visible, test_patch, kept = split_judge_tests(snapshot, ["tests/test_lru.py::LRUTest::test_get"])
    assert kept == []
    assert "test_get" not in visible["tests/__init__.py"]
    assert "test_set" in visible["tests/__init__.py"]
    assert visible["tests/test_lru.py"] == lru
    assert apply_diff(visible, test_patch) == snapshot


def test_a_test_that_cannot_be_taken_out_cleanly_stays_in_the_snapshot() -> None:
    tests = "class TestOnly:\n    def test_it(self):\n        assert True\n"
    visible, test_patch, kept = split_judge_tests({"test_x.py": tests}, ["test_x.py::TestOnly::test_it"])
    assert visible == {"test_x.py": tests}  # the class would be left empty: not valid Python
    assert test_patch == ""
    assert kept == ["test_x.py::TestOnly::test_it"]


def test_pytest_config_is_found_as_pytest_finds_it(tmp_path: Path) -> None:
    assert pytest_config_file(tmp_path) is None
    (tmp_path / "setup.cfg").write_text("[metadata]\nname = x\n")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    assert pytest_config_file(tmp_path) is None  # neither has a pytest section
    (tmp_path / "setup.cfg").write_text("[tool:pytest]\nxfail_strict = true\n")
    assert pytest_config_file(tmp_path) == "setup.cfg"
    (tmp_path / "pyproject.toml").write_text("[tool.pytest.ini_options]\naddopts = '-x'\n")
    assert pytest_config_file(tmp_path) == "pyproject.toml"
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    assert pytest_config_file(tmp_path) == "pytest.ini"


def test_tests_run_pinned_to_the_library_from_inside_another_project(tmp_path: Path) -> None:
    """An enclosing pyproject.toml with hostile pytest settings changes nothing."""
    outer = tmp_path / "outer"
    (outer / "lib-1.0").mkdir(parents=True)
    (outer / "pyproject.toml").write_text(
        "[tool.pytest.ini_options]\naddopts = '-p no_such_plugin --strict-markers'\ntestpaths = ['nowhere']\n"
    )
    repo = outer / "lib-1.0"
    write_snapshot({"src/lib.py": "def double(x):\n    return 2 * x\n", "tests/test_lib.py": _TESTS}, repo)
    config = pin_pytest_config(repo)
    assert config == "pytest.ini"
    assert (repo / "pytest.ini").read_text() == EMPTY_PYTEST_INI
    suite = TestSuite(Path(sys.executable), "src", ("tests",), tmp_path / "plugin", config)
    suite.install_plugin()
    run = suite.run(repo, timeout_s=120)
    assert not run.broken, run.log_tail
    assert set(run.outcomes.values()) == {Outcome.PASSED}
    assert len(run.outcomes) == 5
    assert "--rootdir=." in suite.test_cmd
    assert "-c pytest.ini" in suite.test_cmd


def test_an_environment_the_sandbox_could_not_read_is_refused(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    os.chmod(private, 0o700)
    with pytest.raises(EnvironmentBuildError, match="not traversable by other users"):
        ensure_environment(private / "env", [], sys.executable)


class _ScriptedJudge:
    """A sandbox backend whose verdicts are given: (gold resolved, empty resolved, status)."""

    def __init__(self, gold: bool, empty: bool, status: Status = Status.FAILED) -> None:
        self.gold, self.empty, self.status = gold, empty, status

    def evaluate(self, jobs, on_result=None) -> list[TestResult]:
        out = []
        for _, pred in jobs:
            resolved = self.gold if pred.model_patch else self.empty
            status = Status.PASSED if resolved else self.status
            out.append(
                TestResult(
                    trajectory_id=pred.key, instance_id=pred.instance_id, status=status, resolved=resolved
                )
            )
        return out


@pytest.mark.parametrize(
    ("judge", "verdict"),
    [
        (_ScriptedJudge(gold=True, empty=False), "kept"),
        (_ScriptedJudge(gold=False, empty=False), "judge_gold_unresolved"),
        (_ScriptedJudge(gold=True, empty=True), "judge_empty_resolved"),
        (_ScriptedJudge(gold=False, empty=False, status=Status.INFRA_ERROR), "judge_infra_error"),
    ],
)
def test_the_judge_keeps_only_tasks_gold_resolves_and_empty_does_not(judge, verdict: str) -> None:
    task = Task(
        instance_id="lib-1.0-mut-0", repo="pypi/lib", snapshot={"lib.py": "x = 2\n"}, problem_statement="p",
        patch="diff --git a/lib.py b/lib.py\n--- a/lib.py\n+++ b/lib.py\n@@ -1 +1 @@\n-x = 2\n+x = 1\n",
        FAIL_TO_PASS=["test_lib.py::test_x"],
    )  # fmt: skip
    assert _judge_verdict(judge, task)[0] == verdict
