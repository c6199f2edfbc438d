"""Run a trusted snapshot's pytest suite for real and read per-test outcomes.

Used by the task generator to compute FAIL_TO_PASS from real runs and by tests to
check tasks end to end. It runs without isolation: only for code gagar generated
itself. Untrusted patches go through :mod:`gagar.sandbox`.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from gagar.schema.result import Outcome

__all__ = ["DEFAULT_TEST_CMD", "TestRunError", "parse_pytest_report", "run_pytest", "write_snapshot"]

DEFAULT_TEST_CMD = "python -m pytest -q -p no:cacheprovider"
_REPORT_RE = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S+?::\S+)")
_OUTCOMES = {
    "PASSED": Outcome.PASSED,
    "XPASS": Outcome.PASSED,
    "FAILED": Outcome.FAILED,
    "ERROR": Outcome.ERROR,
    "SKIPPED": Outcome.SKIPPED,
    "XFAIL": Outcome.SKIPPED,
}


class TestRunError(RuntimeError):
    """pytest could not run the suite at all (timeout, crash, nothing collected)."""

    __test__ = False


def write_snapshot(snapshot: Mapping[str, str], root: Path) -> None:
    """Write every file of ``snapshot`` under ``root``, refusing paths that leave it."""
    base = root.resolve()
    for rel, text in snapshot.items():
        target = (base / rel).resolve()
        if base not in target.parents:
            raise ValueError(f"snapshot path {rel!r} leaves the repository root")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")


def parse_pytest_report(output: str) -> dict[str, Outcome]:
    """Per-test outcomes from the ``-rA`` short summary of a pytest run."""
    outcomes: dict[str, Outcome] = {}
    for line in output.splitlines():
        match = _REPORT_RE.match(line)
        if match:
            outcomes[match.group(2)] = _OUTCOMES[match.group(1)]
    return outcomes


def run_pytest(
    snapshot: Mapping[str, str],
    test_cmd: str = DEFAULT_TEST_CMD,
    python: str | None = None,
    timeout_s: float = 120.0,
) -> dict[str, Outcome]:
    """Run ``test_cmd`` (its leading ``python`` replaced by ``python``, default this interpreter)
    on ``snapshot`` in a temporary directory; returns the outcome of every test pytest reported.

    Raises:
        TestRunError: if the run times out or reports no test at all.
    """
    argv = shlex.split(test_cmd)
    if argv and argv[0] in ("python", "python3"):
        argv[0] = python or sys.executable
    argv.append("-rA")
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPATH", None)
    with tempfile.TemporaryDirectory(prefix="gagar-task-") as tmp:
        write_snapshot(snapshot, Path(tmp))
        try:
            proc = subprocess.run(argv, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise TestRunError(f"pytest did not finish within {timeout_s:g} s") from None
    outcomes = parse_pytest_report(proc.stdout)
    if not outcomes:
        tail = (proc.stdout + proc.stderr)[-2000:]
        raise TestRunError(f"pytest reported no tests (exit {proc.returncode}):\n{tail}")
    return outcomes
