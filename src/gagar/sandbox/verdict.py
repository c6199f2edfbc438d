"""Turn a finished test run into a status, a resolved flag and a reason (pure functions).

Statuses: ``passed`` (resolved), ``failed`` (tests ran, not resolved), ``error`` (the run
crashed, did not collect, or was stopped for its output), ``timeout`` (wall or CPU
deadline). ``infra_error`` and refused patches are decided before the run.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence

from gagar.sandbox.process import RunOutcome
from gagar.sandbox.results import Outcome, Status

__all__ = ["PYTEST_EXIT", "Verdict", "exit_reason", "expected_outcomes", "verdict"]

PYTEST_EXIT = {
    2: "pytest was interrupted or hit collection errors",
    3: "pytest internal error",
    4: "pytest usage error",
    5: "no tests were collected",
}

Verdict = tuple[Status, bool, str | None]


def expected_outcomes(found: Mapping[str, Outcome], expected: Sequence[str]) -> dict[str, Outcome]:
    """All reported outcomes, plus ``missing`` for each expected test that was not reported."""
    outcomes = dict(found)
    for test in expected:
        outcomes.setdefault(test, Outcome.MISSING)
    return outcomes


def exit_reason(code: int | None) -> str:
    """Words for an exit status (None: not waited for); bwrap reports a signal N as 128 + N."""
    if code is None:
        return "exit status unknown"
    if code > 128 and code - 128 in signal.valid_signals():
        return f"killed by {signal.Signals(code - 128).name}"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


def verdict(run: RunOutcome, outcomes: Mapping[str, Outcome] | None, expected: Sequence[str]) -> Verdict:
    """Status, resolved and reason of a run; ``outcomes`` is None when no junit report was read."""
    code = run.returncode
    if run.output_exceeded:
        return Status.ERROR, False, f"output exceeded the limit ({run.output_bytes} bytes read); run stopped"
    if run.timed_out:
        return Status.TIMEOUT, False, f"wall-clock deadline reached after {run.duration_s:.1f} s"
    if code in (128 + signal.SIGXCPU, -signal.SIGXCPU):
        return Status.TIMEOUT, False, "CPU time limit reached (SIGXCPU)"
    if code in (0, 1) and outcomes is not None:
        resolved = all(outcomes.get(t) == Outcome.PASSED for t in expected)
        if resolved:
            return Status.PASSED, True, None
        bad = [t for t in expected if outcomes.get(t) != Outcome.PASSED]
        return Status.FAILED, False, f"{len(bad)} required test(s) did not pass, first: {bad[0]}"
    if code is not None and code in PYTEST_EXIT:
        return Status.ERROR, False, PYTEST_EXIT[code]
    return Status.ERROR, False, f"test run crashed ({exit_reason(code)}) without a usable report"
