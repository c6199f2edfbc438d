"""The library's own environment and test runs: a cached venv, pytest with per-test outcomes, coverage.

Everything here runs code downloaded from PyPI without isolation, on purpose: the
libraries are chosen by the operator and only their own tests run. Mutants are
bounded by a timeout; their whole process group is killed when it expires.

The venv is what the task's judge runs too (``environment.python``), so it is built on an
interpreter the sandbox uid can execute (the sandbox's own, ``/usr/bin/python3`` by default,
never one under ``/root``) in a folder every user can read. pytest's configuration is pinned:
``--rootdir`` is the repository and ``-c`` names the library's own configuration file (a library
without one gets an empty ``pytest.ini``, see :func:`pin_pytest_config`), so pytest never climbs
to a ``pyproject.toml`` of whatever project the repository sits in.
"""

from __future__ import annotations

import configparser
import json
import os
import shlex
import shutil
import signal
import stat
import subprocess
import time
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gagar.schema.result import Outcome

__all__ = [
    "EnvironmentBuildError",
    "PytestRun",
    "TestSuite",
    "covered_lines",
    "ensure_environment",
    "environment_packages",
    "pin_pytest_config",
    "pytest_config_file",
]

_PLUGIN = "gagar_synth_outcomes"


class EnvironmentBuildError(RuntimeError):
    """The library's environment could not be built."""


def _check_traversable(path: Path) -> None:
    """Raise unless every folder above ``path`` lets other users through (the sandbox uid must)."""
    for parent in path.resolve().parents:
        if not parent.stat().st_mode & stat.S_IXOTH:
            raise EnvironmentBuildError(
                f"{parent} is not traversable by other users, so the sandbox cannot run the environment "
                f"in {path}; choose an environment folder outside it (--env-dir)"
            )


def _make_readable_by_everyone(tree: Path) -> None:
    """a+r on every file of ``tree``, a+x on its folders and on files executable by their owner."""
    for root, dirs, files in os.walk(tree):
        for name in [*dirs, *files]:
            entry = Path(root) / name
            if not entry.is_symlink():
                mode = entry.stat().st_mode
                execute = 0o111 if entry.is_dir() or mode & stat.S_IXUSR else 0
                entry.chmod(mode | 0o444 | execute)
    tree.chmod(tree.stat().st_mode | 0o555)


def ensure_environment(
    env_dir: Path, requirements: Sequence[str], base_python: str, timeout_s: float = 900.0
) -> Path:
    """A venv on ``base_python`` with ``requirements`` installed, built once and reused; returns its python.

    The base interpreter and the requirements are recorded in ``env_dir/.gagar-ready``; a different
    base or list rebuilds it. The venv is left readable by every user (see the module docstring).

    Raises:
        EnvironmentBuildError: the venv could not be created, or pip failed.
    """
    python = env_dir / "bin" / "python"
    marker = env_dir / ".gagar-ready"
    wanted = "\n".join([f"base: {base_python}", *requirements])
    if python.exists() and marker.is_file() and marker.read_text(encoding="utf-8") == wanted:
        return python
    shutil.rmtree(env_dir, ignore_errors=True)
    try:
        env_dir.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EnvironmentBuildError(
            f"cannot create {env_dir.parent} ({exc}); choose another --env-dir"
        ) from None
    _check_traversable(env_dir)
    steps = [[base_python, "-m", "venv", str(env_dir)]]
    if requirements:
        steps.append(
            [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *requirements]
        )
    for cmd in steps:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise EnvironmentBuildError(f"{shlex.join(cmd)} failed: {exc}") from None
        if proc.returncode != 0:
            raise EnvironmentBuildError(f"{shlex.join(cmd)} failed:\n{(proc.stdout + proc.stderr)[-2000:]}")
    _make_readable_by_everyone(env_dir)
    marker.write_text(wanted, encoding="utf-8")
    return python


def environment_packages(python: Path) -> list[str]:
    """``NAME==VERSION`` of every distribution installed in the environment of ``python``, sorted."""
    code = (
        "import importlib.metadata as m\n"
        "for d in m.distributions():\n"
        "    print(f\"{d.metadata['Name']}=={d.version}\")\n"
    )
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return sorted({line for line in proc.stdout.splitlines() if line.strip()}, key=str.lower)


def _has_section(path: Path, section: str) -> bool:
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path, encoding="utf-8")
    except configparser.Error:
        return False
    return parser.has_section(section)


def pytest_config_file(root: Path) -> str | None:
    """The library's own pytest configuration file, found as pytest finds it in ``root`` (POSIX path
    relative to it), or None when it has none."""
    for name in ("pytest.ini", ".pytest.ini"):
        if (root / name).is_file():
            return name
    pyproject = root / "pyproject.toml"
    if pyproject.is_file():
        try:
            tool = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("tool", {})
        except (tomllib.TOMLDecodeError, UnicodeDecodeError):
            tool = {}
        if isinstance(tool, dict) and "ini_options" in tool.get("pytest", {}):
            return "pyproject.toml"
    if (root / "tox.ini").is_file() and _has_section(root / "tox.ini", "pytest"):
        return "tox.ini"
    if (root / "setup.cfg").is_file() and _has_section(root / "setup.cfg", "tool:pytest"):
        return "setup.cfg"
    return None


EMPTY_PYTEST_INI = "[pytest]\n# added by gagar: pins pytest's rootdir and configuration to this repository\n"


def pin_pytest_config(root: Path) -> str:
    """The configuration file the tests run with: the library's own, else a new empty ``pytest.ini``.

    Without a file of its own, pytest would take the first configuration it finds above the
    repository, and paths in ``-o pythonpath=`` are relative to the configuration file's folder.
    """
    found = pytest_config_file(root)
    if found is None:
        (root / "pytest.ini").write_text(EMPTY_PYTEST_INI, encoding="utf-8")
        found = "pytest.ini"
    return found


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
    config: str = "pytest.ini"
    """The pytest configuration file, relative to the repository root (:func:`pin_pytest_config`)."""

    @property
    def pytest_options(self) -> list[str]:
        """Options that pin the run to the repository: its rootdir and configuration file, no addopts,
        no cache; the same options with pytest 7.2 (Debian's, the sandbox default) and later."""
        opts = ["-p", "no:cacheprovider", "--rootdir=.", "-c", self.config, "-o", "addopts=", "-q"]
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
