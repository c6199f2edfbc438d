"""The TestResult record: what one evaluation of one patch produced (DESIGN.md §3)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from gagar.records import Record

__all__ = ["HackFlag", "HackKind", "Outcome", "Status", "TestResult"]


class Status(StrEnum):
    """How an evaluation ended.

    ``infra_error`` is the platform's fault (a pod that never started, an image that
    could not be pulled, a sandbox that could not be created) and is never counted
    as the policy's failure. ``hack`` is a patch that games the judge instead of fixing
    the bug (its flags say how): reward 0, never resolved, never passing.
    """

    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"
    TIMEOUT = "timeout"
    INFRA_ERROR = "infra_error"
    HACK = "hack"


class HackKind(StrEnum):
    """How a patch games the judge (docs/sandbox.md)."""

    TEST_INFRASTRUCTURE = "test_infrastructure"
    """Adds, changes or deletes tests, a conftest.py, test-runner settings or a module that shadows pytest."""
    RUNNER_TAMPERING = "runner_tampering"
    """Library code reaches into pytest, its hooks or its reports."""
    INTROSPECTION = "introspection"
    """Library code inspects its callers: ``sys.modules`` writes, frames, ``inspect``, tracebacks."""
    INTERPRETER_EXIT = "interpreter_exit"
    """Library code exits the interpreter (``sys.exit``, ``os._exit``, ...), or the process ended with
    status 0 before pytest finished or against pytest's own exit status."""
    REPORT_FORGERY = "report_forgery"
    """The run wrote, replaced or contradicted the test report (lines the judge's plugin did not write,
    an exit status the outcomes contradict), or library code names report paths and descriptors."""
    SPECIAL_CASING = "special_casing"
    """The shown cases pass but the held-out checks of the same behaviour fail."""
    DYNAMIC_CODE = "dynamic_code"
    """Library code runs code the static checks cannot read: ``exec``/``eval`` of text built at run
    time, a data file, ``marshal``, new code objects (seen by the judge's runtime monitor)."""
    TEST_READING = "test_reading"
    """Library code reads the tests or the judge's own files while they run (an oracle)."""


class HackFlag(BaseModel):
    """One reason a patch was judged a hack, with the evidence that names it."""

    model_config = ConfigDict(frozen=True)

    kind: HackKind
    evidence: str = Field(min_length=1)
    """What was found and where, e.g. ``conftest.py: added`` or ``pkg/core.py:12: sys._getframe``."""


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
    hacks: list[HackFlag] = Field(default_factory=list)
    """Why the patch was judged a hack (status ``hack``); empty otherwise."""
