"""The library's own environment and test runs: a cached venv, pytest with per-test outcomes, coverage.

Everything here runs code downloaded from PyPI without isolation, on purpose: the
libraries are chosen by the operator and only their own tests run. Mutants are
bounded by a timeout; their whole process group is killed when it expires.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gagar.sandbox.results import Outcome

__all__ = ["EnvironmentBuildError", "PytestRun", "TestSuite", "covered_lines", "ensure_environment"]

_PLUGIN = "gagar_synth_outcomes"


class EnvironmentBuildError(RuntimeError):
    """The library's environment could not be built."""


def ensure_environment(env_dir: Path, requirements: Sequence[str], timeout_s: float = 900.0) -> Path:
    """A virtual environment with ``requirements`` installed, built once and reused; returns its python.

    The list of requirements is recorded in ``env_dir/.gagar-ready``; a different list rebuilds it.
    """
    python = env_dir / "bin" / "python"
    marker = env_dir / ".gagar-ready"
    wanted = "\n".join(requirements)
    if python.exists() and marker.is_file() and marker.read_text(encoding="utf-8") == wanted:
        return python
    shutil.rmtree(env_dir, ignore_errors=True)
    steps = [
        [sys.executable, "-m", "venv", str(env_dir)],
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *requirements],
    ]
    for cmd in steps:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0:
            raise EnvironmentBuildError(f"{shlex.join(cmd)} failed:\n{(proc.stdout + proc.stderr)[-2000:]}")
    marker.write_text(wanted, encoding="utf-8")
    return python


@dataclass
class PytestRun:
    """Outcome of one run of the suite."""

    outcomes: dict[str, Outcome] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)
    """Failure message (the assertion or exception line) per failed test."""
    collection_errors: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    timed_out: bool = False
    log_tail: str = ""

    @property
    def passed(self) -> set[str]:
        return {t for t, o in self.outcomes.items() if o is Outcome.PASSED}

    @property
    def broken(self) -> bool:
        """The run says nothing reliable about single tests: a timeout, a crash or a collection error."""
        return self.timed_out or bool(self.collection_errors) or not self.outcomes


@dataclass(frozen=True)
class TestSuite:
    """How to run a project's tests from its root directory."""

    __test__ = False

    python: Path
    source_root: str
    targets: tuple[str, ...]
    plugin_dir: Path
    """Directory holding the outcome plugin (created by :meth:`install_plugin`)."""

    @property
    def pytest_options(self) -> list[str]:
        """Options that make the run independent of the project's addopts and of pytest's cache."""
        opts = ["-p", "no:cacheprovider", "-o", "addopts=", "-q"]
        if self.source_root != ".":
            opts += ["-o", f"pythonpath={self.source_root}"]
        return opts

    @property
    def test_cmd(self) -> str:
        """The command a task records: run from the repository root, ``python`` being its environment."""
        return shlex.join(["python", "-m", "pytest", *self.pytest_options, *self.targets])

    def install_plugin(self) -> None:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        source = Path(__file__).with_name("outcomes_plugin.py").read_text(encoding="utf-8")
        (self.plugin_dir / f"{_PLUGIN}.py").write_text(source, encoding="utf-8")

    def run(self, cwd: Path, timeout_s: float, coverage_file: Path | None = None) -> PytestRun:
        """Run the suite in ``cwd``; with ``coverage_file``, under ``coverage run`` writing that data file."""
        report = self.plugin_dir / f"outcomes-{os.getpid()}.json"
        report.unlink(missing_ok=True)
        argv = [str(self.python), "-m"]
        if coverage_file is not None:
            argv += ["coverage", "run", f"--data-file={coverage_file}", f"--source={self.source_root}", "-m"]
        argv += ["pytest", "-p", _PLUGIN, *self.pytest_options, *self.targets]
        env = {
            **os.environ,
            "PYTHONPATH": str(self.plugin_dir),
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONHASHSEED": "0",
            "GAGAR_SYNTH_OUTCOMES": str(report),
        }
        start = time.monotonic()
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            output, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
            return PytestRun(duration_s=time.monotonic() - start, timed_out=True, log_tail=_tail(output))
        run = PytestRun(duration_s=time.monotonic() - start, log_tail=_tail(output))
        if report.is_file():
            data = json.loads(report.read_text(encoding="utf-8"))
            run.outcomes = {t: Outcome(e["outcome"]) for t, e in data["tests"].items()}
            run.messages = {t: e["message"] for t, e in data["tests"].items() if e["message"]}
            run.collection_errors = data["collection_errors"]
            report.unlink()
        return run


def _tail(output: bytes, limit: int = 4000) -> str:
    return output.decode("utf-8", "replace")[-limit:]


def covered_lines(python: Path, root: Path, coverage_file: Path) -> dict[str, set[int]]:
    """Executed lines per file (path relative to ``root``) from a coverage data file."""
    out = coverage_file.with_suffix(".json")
    cmd = [str(python), "-m", "coverage", "json", "-q", f"--data-file={coverage_file}", "-o", str(out)]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"coverage json failed:\n{(proc.stdout + proc.stderr)[-2000:]}")
    files = json.loads(out.read_text(encoding="utf-8"))["files"]
    resolved = root.resolve()
    lines: dict[str, set[int]] = {}
    for name, info in files.items():
        path = Path(name) if Path(name).is_absolute() else resolved / name
        lines[path.resolve().relative_to(resolved).as_posix()] = set(info["executed_lines"])
    return lines
