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
(:mod:`gagar.sandbox.judge_plugin`) loaded with ``-p``: it writes the report to one end of a
socket pair whose other end only the judge holds (the tested code can write to it, never read back
what was written), stamped with a nonce it reads from a pipe once, at import.
:func:`open_channels` and :func:`read_report` are the judge's ends of those two channels.

Standard library only and Python 3.8 compatible: the Kubernetes pod runner ships this file
verbatim (as ``gagar_pristine.py``, beside ``gagar_patch.py``).
"""

from __future__ import annotations

import ast
import configparser
import contextlib
import io
import json
import os
import re
import secrets
import shlex
import socket
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, NamedTuple

if __name__ == "gagar.sandbox.pristine":
    from gagar.pyast import parse as _parse_python
    from gagar.sandbox import judge_monitor as _monitor
    from gagar.sandbox import patch as _patch
else:  # shipped to a sandbox pod as gagar_pristine.py, beside gagar_patch.py and gagar_judge_monitor.py
    from ast import parse as _parse_python  # a pod's runner parses in one thread (gagar.pyast)

    import gagar_judge_monitor as _monitor  # type: ignore[import-not-found,no-redef]
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
    "Reference",
    "Reset",
    "SourceChange",
    "apply_pristine",
    "config_file",
    "is_runner_config",
    "is_test_file",
    "judged_paths",
    "node_ids",
    "open_channels",
    "pytest_env",
    "read_report",
    "reference",
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
MONITOR_MODULE = "gagar_judge_monitor"
"""Module name of the judge's runtime monitor inside the sandbox."""
FDS_ENV = "GAGAR_JUDGE_FDS"
"""Environment variable telling the plugin its nonce pipe and report descriptor (``"R,W"``)."""
WATCH_ENV = "GAGAR_JUDGE_WATCH"
"""Environment variable telling the monitor what to watch (JSON, see :func:`watch_spec`)."""
EXECUTABLE_SUFFIXES = (".py", ".pyw", ".pth")
"""Library files Python may execute: the static checks read every one the patch adds or changes."""
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
    """Library files Python may execute (``.py``, ``.pyw``, ``.pth``) the patch changed, before and
    after, for the hack detector and the runtime monitor."""
    own_packages: list[str]
    """Top-level names the repository itself provides (root and ``src/``) before the patch."""
    kept: list[str] = []  # noqa: RUF012 (never mutated)
    """Every file the patch added or changed and the reset kept (data files included): the runtime
    monitor's suspects."""


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
    kept: list[str] = []
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
        else:
            if new is not None:
                kept.append(path)
            if path.endswith(EXECUTABLE_SUFFIXES):
                sources.append(SourceChange(path, old, new))
    return Pristine(resets, sources, sorted(present), kept)


# ----------------------------------------------------------------------------- running pytest pinned


def watch_spec(
    repo: str, judge_dir: str, pristine: Pristine | None, judged: Iterable[str], test_dirs: Sequence[str]
) -> dict:
    """What the runtime monitor watches: the patched files (repository-relative) are its suspects."""
    return {
        "repo": repo,
        "judge": judge_dir,
        "patched": sorted(pristine.kept) if pristine else [],
        "own": list(pristine.own_packages) if pristine else [],
        "judged": sorted(judged),
        "test_dirs": list(test_dirs),
    }


def pytest_env(
    repo: str, judge_dir: str, config: str | None, fds: tuple[int, int], watch: dict | None = None
) -> dict[str, str]:
    """Environment variables that pin pytest and load the judge's plugin inside the sandbox.

    Args:
        repo: the repository as the test command sees it.
        judge_dir: folder holding the plugin, the monitor and the empty ``pytest.ini`` (read-only to
            the tests).
        config: the repository's own root settings file (:func:`config_file`), or None.
        fds: the plugin's (nonce pipe, report) descriptors, as numbered in the test process.
        watch: what the runtime monitor watches (:func:`watch_spec`); None watches no patched file.
    """
    ini = f"{repo}/{config}" if config else f"{judge_dir}/pytest.ini"
    addopts = f"-p {PLUGIN_MODULE} -p no:cacheprovider --rootdir={shlex.quote(repo)} -c {shlex.quote(ini)}"
    spec = dict(watch or {"repo": repo, "judge": judge_dir}, fds=[fds[1]])
    return {
        "PYTHONPATH": judge_dir,
        "PYTHONSAFEPATH": "1",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "PYTEST_ADDOPTS": addopts,
        FDS_ENV: f"{fds[0]},{fds[1]}",
        WATCH_ENV: json.dumps(spec),
    }


def write_judge_dir(
    judge_dir: Path, plugin_source: str, monitor_source: str, monitor_pyc: tuple[str, bytes] | None = None
) -> None:
    """Lay out the judge's folder: the plugin and monitor modules and an empty ``pytest.ini``.

    ``monitor_pyc`` is the monitor's byte code (file name in ``__pycache__``, content) as an
    unchecked-hash ``.pyc``, which spares the sandbox's interpreter compiling it at every start (an
    interpreter of another version ignores it)."""
    judge_dir.mkdir(parents=True, exist_ok=True)
    (judge_dir / f"{PLUGIN_MODULE}.py").write_text(plugin_source, encoding="utf-8")
    (judge_dir / f"{MONITOR_MODULE}.py").write_text(monitor_source, encoding="utf-8")
    (judge_dir / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    if monitor_pyc is not None:
        (judge_dir / "__pycache__").mkdir(exist_ok=True)
        (judge_dir / "__pycache__" / monitor_pyc[0]).write_bytes(monitor_pyc[1])


class ReportStream:
    """The judge's end of the report: a stream drained by a thread into memory (at most ``max_bytes`` kept).

    The test process gets only the write end: it can add lines, never read back what was written.
    That end is a socket, not a pipe: a pipe's write end reopens for reading through
    ``/proc/self/fd/N``, which let tested code steal the report (the monitor's flags with it) and
    write back a forged one; a socket does not reopen there, and reading the test process's end
    gives only what the judge sends, which is nothing (the judge's end is shut for writing).
    Each end is closed exactly once (a descriptor number closed twice could be another evaluation's
    by then): the write end by :meth:`collect` or :meth:`close`, the read end by the thread."""

    def __init__(self, max_bytes: int) -> None:
        judge_end, test_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        judge_end.shutdown(socket.SHUT_WR)
        self._read, self.write_fd = judge_end.detach(), test_end.detach()
        self._max = max_bytes
        self._data = bytearray()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        try:
            while chunk := os.read(self._read, 1 << 16):
                if len(self._data) <= self._max:
                    self._data += chunk
        finally:
            os.close(self._read)

    def _close_writer(self) -> None:
        with self._lock:
            fd, self.write_fd = self.write_fd, -1
        if fd >= 0:
            os.close(fd)

    def collect(self, timeout_s: float = 10.0) -> IO[bytes]:
        """Close the judge's write end and return everything written (once every writer is gone, or
        after ``timeout_s``: a process the run left behind may still hold the write end)."""
        self._close_writer()
        self._thread.join(timeout_s)
        return io.BytesIO(bytes(self._data))

    def close(self) -> None:
        """Close the judge's write end if :meth:`collect` did not (the thread closes the read end)."""
        self._close_writer()


class Channels(NamedTuple):
    """The judge's end of the plugin's channels: the nonce, and the two descriptors to pass on."""

    nonce: str
    nonce_fd: int
    """Read end of a pipe already holding the nonce (its write end is closed)."""
    report: ReportStream
    """The report stream; read it with ``read_report(channels.report.collect(), ...)`` after the run."""

    @property
    def fds(self) -> tuple[int, int]:
        """The descriptors the test process inherits: (nonce pipe, report stream's write end)."""
        return self.nonce_fd, self.report.write_fd

    def close(self) -> None:
        """Close every descriptor (after the run)."""
        with contextlib.suppress(OSError):
            os.close(self.nonce_fd)
        self.report.close()


def open_channels(max_report_bytes: int = 32 << 20) -> Channels:
    """A fresh nonce in a pipe, and a report stream whose read end stays with the judge."""
    nonce = secrets.token_hex(16)
    read_fd, write_fd = os.pipe()
    os.write(write_fd, nonce.encode())
    os.close(write_fd)
    report = ReportStream(max_report_bytes)
    os.set_inheritable(read_fd, True)
    os.set_inheritable(report.write_fd, True)
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
    hacks: list[tuple[str, str]] = []  # noqa: RUF012 (never mutated)
    """(kind, evidence) of each flag the runtime monitor raised."""
    code: dict[str, dict] | None = None
    """Fingerprint of each test's code object (base node id -> :func:`judge_monitor.code_fingerprint`)."""
    collected: int | None = None
    """How many tests pytest collected."""
    collect_errors: tuple[str, ...] = ()
    """Node ids of the collectors that failed (a test module that does not import)."""


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
    """Parse the report the plugin wrote; lines without the nonce are ``foreign``."""
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
    hacks = [(str(e.get("kind")), str(e.get("evidence"))[:300]) for e in events if e.get("event") == "hack"]
    if len(configured) > 1 or len(finished) > 1:
        foreign.append("the plugin's events appear more than once")
    exitstatus, tests, code, collected, collect_errors = None, {}, None, None, ()
    if finished:
        last = finished[-1]
        status, raw = last.get("exitstatus"), last.get("tests")
        exitstatus = status if isinstance(status, int) else None
        tests = {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
        code = last.get("code") if isinstance(last.get("code"), dict) else None
        collected = last.get("collected") if isinstance(last.get("collected"), int) else None
        collect_errors = node_ids(last.get("collect_errors"))
    return JudgeReport(bool(configured), exitstatus, tests, foreign, hacks, code, collected, collect_errors)


def node_ids(raw: object) -> tuple[str, ...]:
    """The failed collectors' node ids of a report (anything else: none)."""
    return tuple(str(n)[:300] for n in raw) if isinstance(raw, list) else ()


# ----------------------------------------------------------------------------- the trusted reference


class Reference(NamedTuple):
    """What the pristine test files hold, computed before the tests run, outside the test process."""

    code: dict[str, list[dict]]
    """Per test file: the fingerprint of every function compiled from it."""
    tests: dict[str, list[str]]
    """Per test file: the tests pytest's default rules collect from it (``func``, ``Class::func``)."""


def _functions(code: object, literals: set) -> list[dict]:
    """The fingerprint of every function in ``code``, keeping only constants written literally in the
    source: pytest's rewriting splits the expressions of an assert (``-1`` becomes ``-(1)``), so a
    constant the compiler folded may not survive it."""
    out, stack = [], [code]
    while stack:
        current = stack.pop()
        for const in getattr(current, "co_consts", ()):
            if hasattr(const, "co_code"):
                printed = _monitor.code_fingerprint(const)
                printed["consts"] = [c for c in printed["consts"] if c in literals]
                out.append(printed)
                stack.append(const)
    return out


def _not_a_test(body: list[ast.stmt]) -> bool:
    """``__test__ = False`` in a module's or a class's body: pytest collects nothing from it."""
    return any(
        isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "__test__" for t in node.targets)
        and isinstance(node.value, ast.Constant)
        and node.value.value is False
        for node in body
    )


def static_tests(tree: ast.Module) -> list[str]:
    """Tests pytest collects from a module by its default rules: ``test*`` functions, and ``test*``
    methods of ``Test*`` classes without ``__init__`` (nothing under ``__test__ = False``)."""
    found: list[str] = []
    if _not_a_test(tree.body):
        return found
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            found.append(node.name)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            methods = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
            if any(m.name == "__init__" for m in methods) or _not_a_test(node.body):
                continue
            found += [f"{node.name}::{m.name}" for m in methods if m.name.startswith("test")]
    return found


def reference(repo: Path, files: Iterable[str]) -> Reference:
    """Compile the pristine test ``files`` (repository-relative) afresh: the trusted side's reference."""
    code: dict[str, list[dict]] = {}
    tests: dict[str, list[str]] = {}
    for rel in sorted(set(files)):
        path = repo / rel
        if not rel.endswith(".py") or not path.is_file():
            continue
        source = path.read_bytes()
        try:
            compiled = compile(source, rel, "exec", dont_inherit=True, optimize=0)
            tree = _parse_python(source, rel)
        except (SyntaxError, ValueError):
            continue
        literals = {repr(n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant)}
        code[rel] = _functions(compiled, literals)
        tests[rel] = static_tests(tree)
    return Reference(code, tests)
