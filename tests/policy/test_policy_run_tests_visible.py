"""RUN_TESTS runs the repository's own tests in the real sandbox, never the judge's hidden ones.

One conversation proposes a patch that passes the judge's hidden test but fails the visible one,
runs the tests, corrects it into a patch that passes the visible test but fails the hidden one, runs
them again and submits. The agent only ever reads about the visible test; the judge, given the hidden
test, decides on the final patch as it always does.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from gagar.policy.agent import AgentSettings
from gagar.policy.tokenizer import train_tokenizer
from gagar.policy.tool_demos import ReplayBackend
from gagar.policy.tool_loop import run_tool_loops
from gagar.policy.visible_tests import VisibleTests, run_report
from gagar.sandbox.base import Prediction
from gagar.sandbox.limits import SandboxLimits
from gagar.sandbox.local import LocalBackend, LocalSandboxSettings
from gagar.schema.result import Outcome, Status, TestResult
from gagar.schema.task import Task
from gagar.schema.trajectory import SamplingParams
from gagar.tasks.diffs import make_diff

HIDDEN = "tests/test_hidden.py::test_adds"
VISIBLE = "tests/test_visible.py::test_adds_zero"


def _task() -> Task:
    buggy = {
        "calc/__init__.py": "",
        "calc/ops.py": "def add(a, b):\n    return a - b\n",
        "tests/__init__.py": "",
        "tests/test_visible.py": (
            "from calc.ops import add\n\n\ndef test_adds_zero():\n    assert add(4, 0) == 4\n"
        ),
    }
    fixed = {**buggy, "calc/ops.py": "def add(a, b):\n    return a + b\n"}
    hidden = {
        "tests/test_hidden.py": "from calc.ops import add\n\n\ndef test_adds():\n    assert add(2, 3) == 5\n"
    }
    return Task(
        instance_id="calc-hidden",
        repo="local/calc",
        snapshot=buggy,
        problem_statement="`add(2, 3)` returns `-1`, expected `5`.",
        patch=make_diff(buggy, fixed),
        test_patch=make_diff({}, hidden),
        FAIL_TO_PASS=[HIDDEN],
        PASS_TO_PASS=[VISIBLE],
    )


def _edit(search: str, replace: str) -> str:
    return f"EDIT\ncalc/ops.py\n<<<<<<< SEARCH\n    {search}\n=======\n    {replace}\n>>>>>>> REPLACE\n"


HIDDEN_ONLY = _edit("return a - b", "return 5")  # add(2, 3) == 5, add(4, 0) != 4
VISIBLE_ONLY = _edit("return 5", "return abs(a - b)")  # add(4, 0) == 4, add(2, 3) != 5


class Recording:
    """The real sandbox, remembering every job it was given."""

    def __init__(self, inner: LocalBackend) -> None:
        self.inner, self.jobs = inner, []

    def evaluate(self, jobs, on_result=None) -> list[TestResult]:
        self.jobs += list(jobs)
        return self.inner.evaluate(jobs, on_result)


@pytest.fixture(scope="module")
def sandbox():
    root = Path(tempfile.mkdtemp(prefix="gagar-run-tests-"))
    root.chmod(0o755)  # the sandbox uid must traverse it
    yield LocalBackend(SandboxLimits(wall_time_s=60), LocalSandboxSettings(work_root=root, base_uid=62700), 2)
    shutil.rmtree(root)


def test_the_agent_only_ever_sees_the_visible_tests(sandbox) -> None:
    task = _task()
    tokenizer = train_tokenizer([*task.snapshot.values(), task.test_patch, HIDDEN_ONLY, VISIBLE_ONLY], 400)
    recording = Recording(sandbox)
    script = ReplayBackend(tokenizer, [HIDDEN_ONLY, "RUN_TESTS", VISIBLE_ONLY, "RUN_TESTS", "SUBMIT"])
    [t] = run_tool_loops(
        [(task, "t0", "g")], script, tokenizer, SamplingParams(), AgentSettings(), VisibleTests(recording)
    )
    reports = [m.content for m in t.messages[2:] if m.role == "tool"][1::2][:2]
    first, second = reports
    assert first.startswith("1 failed"), first
    assert f"FAILED {VISIBLE}" in first, first
    assert second.startswith("1 passed"), second
    seen = "\n".join(m.content for m in t.messages)
    assert "test_hidden" not in seen
    assert "add(2, 3) == 5" not in seen
    # What the sandbox ran for the agent: never the test patch, nothing of the judge's required.
    assert len(recording.jobs) == 2
    for job_task, _ in recording.jobs:
        assert (job_task.test_patch, job_task.FAIL_TO_PASS, job_task.PASS_TO_PASS) == ("", [], [VISIBLE])
    # The judge decides on the final patch with the hidden test, as for any trajectory.
    mid_patch = make_diff(task.snapshot, {**task.snapshot, "calc/ops.py": "def add(a, b):\n    return 5\n"})
    judged = sandbox.evaluate(
        [(task, Prediction(instance_id=task.instance_id, model_patch=p, trajectory_id=k))
         for k, p in (("final", t.model_patch), ("mid", mid_patch))]
    )  # fmt: skip
    final, mid = judged
    assert (final.status, final.tests[HIDDEN], final.tests[VISIBLE]) == (
        Status.FAILED,
        Outcome.FAILED,
        Outcome.PASSED,
    )
    assert (mid.tests[HIDDEN], mid.tests[VISIBLE]) == (
        Outcome.PASSED,
        Outcome.FAILED,
    )  # the mid-conversation patch
    assert t.edits_reverted == 1


class Broken:
    def evaluate(self, jobs, on_result=None):
        raise RuntimeError("sandbox on fire")


def test_a_failing_test_run_is_answered_not_raised() -> None:
    task = _task()
    assert VisibleTests(Broken())([(task, "")]) == ["the tests could not run: RuntimeError: sandbox on fire"]


def test_reports_are_cut_and_name_what_did_not_pass() -> None:
    result = TestResult(
        trajectory_id="x", instance_id="i", status=Status.TIMEOUT,
        reason="wall-clock deadline reached after 60.0 s", tests={VISIBLE: Outcome.MISSING}, log="x" * 5000,
    )  # fmt: skip
    text = run_report(result, 200)
    assert len(text) <= 200
    assert text.startswith("test run timeout: wall-clock deadline")
    assert VISIBLE in text
