"""RUN_TESTS: the tests the policy may run are the repository's own, never the judge's.

The judge evaluates a patch with the task's ``test_patch`` applied and FAIL_TO_PASS required. The
agent's RUN_TESTS evaluates it in the same sandbox backend, with the same limits and the same
pristine reset of test files, on :func:`visible_task`: the task without its ``test_patch``,
FAIL_TO_PASS or held-out checks, requiring only the repository's own PASS_TO_PASS tests. The answer
is a short report (counts, the tests that did not pass, the log's tail), cut to ``max_chars``; a
run that cannot happen (a broken sandbox, an exception) is answered too, never raised.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from gagar.sandbox.base import Prediction
from gagar.schema.result import Outcome, Status, TestResult
from gagar.schema.task import Task

__all__ = ["VisibleTests", "run_report", "visible_task"]

log = logging.getLogger(__name__)


def visible_task(task: Task) -> Task:
    """``task`` as the agent may test it: no test patch, nothing of the judge's required.

    ``model_copy`` skips validation on purpose: a Task must name FAIL_TO_PASS tests, and these are
    exactly what the agent must not run.
    """
    return task.model_copy(
        update={
            "test_patch": "",
            "FAIL_TO_PASS": [],
            "held_out_checks": [],
            "PASS_TO_PASS": list(task.PASS_TO_PASS),
        }
    )


def _cut(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[: max_chars - 14] + "\n[… truncated]"


def run_report(result: TestResult, max_chars: int) -> str:
    """What the agent reads after RUN_TESTS: a status line, the tests that did not pass, the log's tail."""
    if result.status is Status.INFRA_ERROR:
        return _cut(f"the tests could not run (sandbox failure): {result.reason}", max_chars)
    if result.status in (Status.TIMEOUT, Status.HACK, Status.ERROR):
        head = f"test run {result.status.value}: {result.reason}"
    else:
        counts = {o: sum(v is o for v in result.tests.values()) for o in Outcome}
        head = ", ".join(f"{n} {o.value}" for o, n in counts.items() if n) or "no tests ran"
    bad = [
        t for t, o in sorted(result.tests.items()) if o in (Outcome.FAILED, Outcome.ERROR, Outcome.MISSING)
    ]
    lines = [head, *(f"{result.tests[t].value.upper()} {t}" for t in bad[:20])]
    if len(bad) > 20:
        lines.append(f"... and {len(bad) - 20} more")
    text = "\n".join(lines)
    if bad or result.status is not Status.PASSED:
        room = max_chars - len(text) - 1
        if room > 40 and result.log.strip():
            text += "\n" + result.log.strip()[-room:]
    return _cut(text, max_chars)


class VisibleTests:
    """Runs the visible tests of many (task, patch) pairs in one sandbox call (a turn's RUN_TESTS).

    Args:
        sandbox: a :class:`gagar.sandbox.base.SandboxBackend`, its limits included.
        max_chars: most characters of one report.
    """

    def __init__(self, sandbox: object, max_chars: int = 1500) -> None:
        self.sandbox, self.max_chars = sandbox, max_chars

    def __call__(self, jobs: Sequence[tuple[Task, str]]) -> list[str]:
        """One report per (task, patch), in order."""
        if not jobs:
            return []
        batch = [
            (
                visible_task(task),
                Prediction(instance_id=task.instance_id, model_patch=patch, trajectory_id=f"run-tests-{i}"),
            )
            for i, (task, patch) in enumerate(jobs)
        ]
        try:
            results = self.sandbox.evaluate(batch)  # type: ignore[attr-defined]
        except Exception as exc:  # a tool failure is answered to the agent, not fatal to the rollout
            log.warning("RUN_TESTS failed for %d conversation(s): %s", len(jobs), exc)
            return [_cut(f"the tests could not run: {type(exc).__name__}: {exc}", self.max_chars)] * len(jobs)
        return [run_report(r, self.max_chars) for r in results]
