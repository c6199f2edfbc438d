"""The pristine judge, repository side: apply a model patch, then reset what judges it; pin pytest.

After the model patch, every file that judges the patch is put back as the task shipped it
before the task's ``test_patch`` goes on: test files (``test_*.py``, ``*_test.py``, anything
under a ``tests``/``test`` folder, the files the task's test ids and ``test_patch`` name),
every ``conftest.py``, every test-runner settings file (``pytest.ini``, ``.pytest.ini``,
``tox.ini``, ``setup.cfg``, ``pyproject.toml``: the whole file), and a new module or package at
the repository root or under ``src/`` that would shadow pytest, its dependencies or the standard
library. What the patch touched there is returned as :class:`Reset` records (a settings file
counts only when its test-runner section changed).

pytest then runs pinned (:func:`pytest_env`): ``--rootdir`` the repository, ``-c`` the task's own
root settings file (or the judge's empty one), plugin autoload off, ``PYTHONSAFEPATH`` so the
working directory is not first on ``sys.path`` when pytest starts, and the judge's plugin
(:mod:`gagar.sandbox.judge_plugin`) loaded with ``-p``: it writes the report to a file descriptor
whose file the tested code cannot open, stamped with a nonce it reads from a pipe once, at import.
:func:`open_channels` and :func:`read_report` are the judge's ends of those two channels.

Standard library only and Python 3.8 compatible: the Kubernetes pod runner ships this file
verbatim (as ``gagar_pristine.py``, beside ``gagar_patch.py``).
"""

from __future__ import annotations

import configparser
import contextlib
import json
import os
import re
import secrets
import shlex
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, NamedTuple

if __name__ == "gagar.sandbox.pristine":
    from gagar.sandbox import patch as _patch
else:  # shipped to a sandbox pod as gagar_pristine.py, beside gagar_patch.py
    import gagar_patch as _patch  # type: ignore[import-not-found,no-redef]

__all__ = [
    "CONFIG_FILES",
    "FDS_ENV",
    "PLUGIN_MODULE",
    "RUNNER_MODULES",
    "TEST_DIRS",
    "Channels",
    "JudgeReport",
    "Pristine",
    "Reset",
    "SourceChange",
    "apply_pristine",
    "config_file",
    "is_runner_config",
    "is_test_file",
    "judged_paths",
    "open_channels",
    "pytest_env",
    "read_report",
    "repository_top_levels",
    "runner_section",
    "top_level",
    "write_judge_dir",
]

TEST_DIRS = ("tests", "test")
"""Folders whose every file belongs to the tests."""
CONFIG_FILES = ("pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")
"""Files pytest reads its settings from, in pytest's order of precedence."""
RUNNER_MODULES = ("pytest", "_pytest", "pluggy", "py", "iniconfig", "exceptiongroup", "tomli")
"""pytest and the modules it imports before any test: a repository copy of one shadows it."""
PLUGIN_MODULE = "gagar_judge_plugin"
"""Module name of the judge's pytest plugin inside the sandbox."""
FDS_ENV = "GAGAR_JUDGE_FDS"
"""Environment variable telling the plugin its nonce pipe and report descriptor (``"R,W"``)."""
_SECTIONS = {"tox.ini": "pytest", "setup.cfg": "tool:pytest"}
_TOML_TABLE = re.compile(r"^\s*\[+\s*([^\]]+?)\s*\]+\s*(#.*)?$")


class Reset(NamedTuple):
    """A judged file the model patch touched, put back as the task shipped it."""

    path: str
    how: str
    """``added``, ``changed`` or ``deleted`` (by the model patch)."""


class Pristine(NamedTuple):
    """What :func:`apply_pristine` did."""

    resets: list[Reset]
    """Judged files the patch touched (a settings file only when its test-runner section changed)."""
    sources: list[SourceChange]
    """Library ``.py`` files the patch changed, before and after, for the hack detector."""
    own_packages: list[str]
    """Top-level names the repository itself provides (root and ``src/``) before the patch."""


class SourceChange(NamedTuple):
    """A library file the model patch touched and the judge kept: its text before and after."""

    path: str
    old: str | None
    new: str | None


def is_test_file(path: str, test_dirs: Sequence[str] = TEST_DIRS) -> bool:
    """Whether ``path`` is part of the tests: a test module, a conftest.py, or under a tests folder."""
    parts = path.split("/")
    name = parts[-1]
    if name == "conftest.py" or (
        name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))
    ):
        return True
    return any(part in test_dirs for part in parts[:-1])


def is_runner_config(path: str) -> bool:
    """Whether ``path`` is a file pytest may read its settings from (at any depth)."""
    return path.split("/")[-1] in CONFIG_FILES


def top_level(path: str) -> str | None:
    """The importable top-level name ``path`` provides from the root or ``src/`` (None: nothing)."""
    parts = path.split("/")
    if parts[0] == "src" and len(parts) > 1:
        parts = parts[1:]
    head = parts[0]
    if len(parts) == 1:
        if not head.endswith((".py", ".pyc", ".so", ".pth")):
            return None
        head = head.split(".", 1)[0]
    return head if head.isidentifier() else None


def judged_paths(test_ids: Iterable[str], test_patch: str) -> set:
    """Files that judge the patch whatever their name: those of the task's test ids and test patch."""
    files = {test.split("::", 1)[0] for test in test_ids}
    patched = {fp.path for fp in _patch.parse_patch(test_patch, 1 << 30)} if test_patch.strip() else set()
    return {p for p in files if p.endswith(".py")} | patched


def _normalized(lines: Iterable[str]) -> list[str]:
    out = []
    for line in lines:
        text = line.strip()
        if text and not text.startswith(("#", ";")):
            out.append(text)
    return out


def runner_section(path: str, text: str | None) -> list[str] | None:
    """The test-runner settings of a settings file, comments and blank lines dropped (None: none).

    ``pytest.ini``/``.pytest.ini``: the whole file; ``tox.ini``: ``[pytest]``; ``setup.cfg``:
    ``[tool:pytest]``; ``pyproject.toml``: the ``[tool.pytest...]`` tables.
    """
    if text is None:
        return None
    name = path.split("/")[-1]
    if name in ("pytest.ini", ".pytest.ini"):
        return _normalized(text.splitlines())
    if name in _SECTIONS:
        parser = configparser.RawConfigParser(strict=False, interpolation=None)
        try:
            parser.read_string(text)
        except configparser.Error:
            return ["<unparseable: " + name + ">"]
        if not parser.has_section(_SECTIONS[name]):
            return None
        return sorted(f"{k}={' '.join(v.split())}" for k, v in parser.items(_SECTIONS[name]))
    if name == "pyproject.toml":
        kept: list[str] = []
        inside = False
        for line in text.splitlines():
            match = _TOML_TABLE.match(line)
            if match:
                inside = match.group(1).replace('"', "").startswith("tool.pytest")
            if inside:
                kept.append(line)
        return _normalized(kept) or None
    return None


def config_file(repo: Path) -> str | None:
    """The root settings file pytest would pick in ``repo`` (relative name), None when there is none."""
    for name in CONFIG_FILES:
        path = repo / name
        if not path.is_file() or path.is_symlink():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if name in ("pytest.ini", ".pytest.ini") or runner_section(name, text) is not None:
            return name
    return None


def _how(old: str | None, new: str | None) -> str:
    return "added" if old is None else "deleted" if new is None else "changed"


def repository_top_levels(repo: Path) -> set:
    """Top-level importable names the repository provides from its root and ``src/``."""
    names = set()
    for base in (repo, repo / "src"):
        if base.is_dir():
            for entry in os.listdir(base):
                name = top_level(entry if base == repo else "src/" + entry)
                if name is not None and (entry.endswith(".py") or (base / entry).is_dir()):
                    names.add(name)
    return names


def apply_pristine(
    repo: Path,
    patch_text: str,
    max_bytes: int,
    judged: Iterable[str],
    shadowed: Iterable[str],
    test_dirs: Sequence[str] = TEST_DIRS,
) -> Pristine:
    """Apply the model patch to ``repo``, then put every judged file back as it was before.

    Args:
        judged: files that judge the patch whatever their name (:func:`judged_paths`).
        shadowed: top-level module names a new root module must not take (pytest's, the stdlib's).

    Raises:
        PatchError: the patch is refused or does not apply; nothing was written.
    """
    judged, shadowed = set(judged), set(shadowed)
    touched = [fp.path for fp in _patch.parse_patch(patch_text, max_bytes)]
    before = {path: _patch.read_file(repo, path) for path in touched}
    present = repository_top_levels(repo)
    _patch.apply_patch(repo, patch_text, max_bytes)
    resets: list[Reset] = []
    sources: list[SourceChange] = []
    for path in touched:
        old, new = before[path], _patch.read_file(repo, path)
        name = top_level(path)
        shadows = old is None and name is not None and name in shadowed and name not in present
        if path in judged or is_test_file(path, test_dirs) or shadows:
            _patch.write_file(repo, path, old)
            resets.append(Reset(path, _how(old, new)))
        elif is_runner_config(path):
            _patch.write_file(repo, path, old)
            if runner_section(path, old) != runner_section(path, new):
                resets.append(Reset(path, _how(old, new)))
        elif path.endswith(".py"):
            sources.append(SourceChange(path, old, new))
    return Pristine(resets, sources, sorted(present))


# ----------------------------------------------------------------------------- running pytest pinned


def pytest_env(repo: str, judge_dir: str, config: str | None, fds: tuple[int, int]) -> dict[str, str]:
    """Environment variables that pin pytest and load the judge's plugin inside the sandbox.

    Args:
        repo: the repository as the test command sees it.
        judge_dir: folder holding the plugin and the empty ``pytest.ini`` (read-only to the tests).
        config: the repository's own root settings file (:func:`config_file`), or None.
        fds: the plugin's (nonce pipe, report) descriptors, as numbered in the test process.
    """
    ini = f"{repo}/{config}" if config else f"{judge_dir}/pytest.ini"
    addopts = f"-p {PLUGIN_MODULE} -p no:cacheprovider --rootdir={shlex.quote(repo)} -c {shlex.quote(ini)}"
    return {
        "PYTHONPATH": judge_dir,
        "PYTHONSAFEPATH": "1",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "PYTEST_ADDOPTS": addopts,
        FDS_ENV: f"{fds[0]},{fds[1]}",
    }


def write_judge_dir(judge_dir: Path, plugin_source: str) -> None:
    """Lay out the judge's folder: the plugin module and an empty ``pytest.ini``."""
    judge_dir.mkdir(parents=True, exist_ok=True)
    (judge_dir / f"{PLUGIN_MODULE}.py").write_text(plugin_source, encoding="utf-8")
    (judge_dir / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")


class Channels(NamedTuple):
    """The judge's end of the plugin's channels: the nonce, and the two descriptors to pass on."""

    nonce: str
    nonce_fd: int
    """Read end of a pipe already holding the nonce (its write end is closed)."""
    report: IO[bytes]
    """An unlinked file the plugin writes to through its descriptor; read with :func:`read_report`."""

    @property
    def fds(self) -> tuple[int, int]:
        """The descriptors the test process inherits: (nonce pipe, report file)."""
        return self.nonce_fd, self.report.fileno()

    def close(self) -> None:
        """Close both descriptors (after the run)."""
        for close in (lambda: os.close(self.nonce_fd), self.report.close):
            with contextlib.suppress(OSError):
                close()


def open_channels(directory: str | None = None) -> Channels:
    """A fresh nonce in a pipe, and an unlinked report file only this process can reopen."""
    nonce = secrets.token_hex(16)
    read_fd, write_fd = os.pipe()
    os.write(write_fd, nonce.encode())
    os.close(write_fd)
    report = tempfile.TemporaryFile(dir=directory)  # noqa: SIM115 (closed by Channels.close)
    os.set_inheritable(read_fd, True)
    os.set_inheritable(report.fileno(), True)
    return Channels(nonce, read_fd, report)


class JudgeReport(NamedTuple):
    """What the plugin reported, and what else was found on its channel."""

    configured: bool
    """The plugin loaded and pytest configured itself."""
    exitstatus: int | None
    """pytest's own exit status at the end of the session; None when the session never finished."""
    tests: dict[str, str]
    """Outcome (passed, failed, error, skipped) per test node id."""
    foreign: list[str]
    """Descriptions of what was on the channel without the nonce: the tested code's writing."""


def _events(data: bytes, nonce: str) -> tuple[list[dict], list[str]]:
    events, foreign = [], []
    for n, line in enumerate(data.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            event = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            event = None
        if isinstance(event, dict) and event.get("nonce") == nonce:
            events.append(event)
        else:
            foreign.append(f"line {n}: {line[:60].decode('utf-8', 'replace')!r}")
    return events, foreign


def read_report(report: IO[bytes], nonce: str, max_bytes: int) -> JudgeReport:
    """Parse the report file the plugin wrote; lines without the nonce are ``foreign``."""
    report.seek(0)
    data = report.read(max_bytes + 1)
    foreign: list[str] = []
    if len(data) > max_bytes:
        foreign.append(f"the report exceeds {max_bytes} bytes")
        data = data[:max_bytes]
    events, bad = _events(data, nonce)
    foreign += bad
    configured = [e for e in events if e.get("event") == "configured"]
    finished = [e for e in events if e.get("event") == "finished"]
    if len(configured) > 1 or len(finished) > 1:
        foreign.append("the plugin's events appear more than once")
    exitstatus, tests = None, {}
    if finished:
        status, raw = finished[-1].get("exitstatus"), finished[-1].get("tests")
        exitstatus = status if isinstance(status, int) else None
        tests = {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
    return JudgeReport(bool(configured), exitstatus, tests, foreign)
