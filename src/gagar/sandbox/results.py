"""The TestResult record: what one evaluation of one patch produced (DESIGN.md §3)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from gagar.records import Record

__all__ = ["Outcome", "Status", "TestResult"]


class Status(StrEnum):
    """How an evaluation ended.

    ``infra_error`` is the platform's fault (a pod that never started, an image that
    could not be pulled, a sandbox that could not be created) and is never counted
    as the policy's failure.
    """

    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"
    TIMEOUT = "timeout"
    INFRA_ERROR = "infra_error"


class Outcome(StrEnum):
    """Outcome of one test."""

    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"
    SKIPPED = "skipped"
    MISSING = "missing"


class TestResult(Record):
    """The outcome of running one task's tests against one patch."""

    __test__ = False  # not a pytest test class

    trajectory_id: str
    instance_id: str
    status: Status
    resolved: bool = False
    """True when every FAIL_TO_PASS and PASS_TO_PASS test passed."""
    tests: dict[str, Outcome] = Field(default_factory=dict)
    """Outcome per test id."""
    duration_s: float = 0.0
    reason: str | None = None
    """Why the evaluation did not run the tests or did not finish (refused patch, limit hit, ...)."""
    log: str = ""
    """The test output, truncated."""
