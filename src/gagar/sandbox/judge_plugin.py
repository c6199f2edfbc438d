"""The judge's pytest plugin: each test's outcome and pytest's exit status, written where the tests cannot.

Loaded inside the sandbox with ``-p gagar_judge_plugin`` (a copy of this file, beside the runtime
monitor ``gagar_judge_monitor``, in a folder the tested code cannot write), before any of the
repository's code. At import it takes its two descriptors from ``GAGAR_JUDGE_FDS`` and what to
watch from ``GAGAR_JUDGE_WATCH`` (removing both variables): it reads the run's nonce from the
first, a pipe the judge filled and closed, and keeps it only inside its emitter's closure; it
writes JSON lines stamped with that nonce to the second, the write end of a pipe whose read end
only the judge holds, so nothing in the process can read the report back. It then installs the
runtime monitor (:mod:`gagar.sandbox.judge_monitor`), whose flags it streams as ``hack`` lines the
moment they are found, so a process that dies later cannot take them back.

Before the repository's first conftest loads it snapshots pytest's internals, the builtins and
the tracers, and removes itself and the monitor from ``sys.modules``; after collection, after each
test's teardown and at the session's end it compares. Its last line carries each test's outcome,
pytest's exit status, the number of tests collected, the collectors that failed and a fingerprint of
each test's code object (:func:`gagar.sandbox.judge_monitor.code_fingerprint`), which the judge
compares with a fresh compile of the pristine test files.

It also puts the repository root on ``sys.path`` once pytest has loaded (the judge starts
Python with ``PYTHONSAFEPATH`` so the working directory is not searched while pytest and
this plugin import), as ``python -m pytest`` would have.

Standard library and pytest only, Python 3.8 compatible: shipped verbatim to sandbox pods.
"""

import json
import os
import sys
import types

import gagar_judge_monitor as _monitor
import pytest

_RANK = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
_OWN_MODULES = ("gagar_judge_plugin", "gagar_judge_monitor")


def _take_channels():
    raw = os.environ.pop("GAGAR_JUDGE_FDS", "")
    watch = json.loads(os.environ.pop("GAGAR_JUDGE_WATCH", "") or "{}")
    try:
        nonce_fd, report_fd = (int(part) for part in raw.split(","))
    except ValueError:
        raise RuntimeError("gagar_judge_plugin: GAGAR_JUDGE_FDS is unset or malformed") from None
    chunks = []
    while True:
        chunk = os.read(nonce_fd, 256)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(nonce_fd)
    nonce = b"".join(chunks).decode("ascii")
    if not nonce:
        raise RuntimeError(
            "gagar_judge_plugin: the nonce was taken already: one pytest session per test command"
        )
    return nonce, report_fd, watch


def _emitter(nonce, report_fd):
    """A function writing one stamped JSON line per event; the nonce lives only in its closure."""
    dumps, write = json.dumps, os.write

    def emit(event, **fields):
        data = (dumps(dict(fields, nonce=nonce, event=event)) + "\n").encode("utf-8")
        while data:
            data = data[write(report_fd, data) :]

    return emit


def _start():
    nonce, report_fd, watch = _take_channels()
    emit = _emitter(nonce, report_fd)
    watch.setdefault("fds", [report_fd])
    monitor = _monitor.Monitor(watch, lambda kind, evidence: emit("hack", kind=kind, evidence=evidence))
    monitor.install()
    return emit, monitor


_emit, _MONITOR = _start()
_outcomes = {}
_collect_errors = []
_own = {}
_fingerprint = _monitor.code_fingerprint
_module_type = types.ModuleType


def _record(nodeid, outcome):
    if nodeid not in _outcomes or _RANK[outcome] > _RANK[_outcomes[nodeid]]:
        _outcomes[nodeid] = outcome


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config):
    root = str(early_config.rootpath)
    if root not in sys.path:
        sys.path.insert(0, root)
    _MONITOR.snapshot()
    _own.update(globals())
    for name in _OWN_MODULES:
        sys.modules.pop(name, None)


def pytest_configure(config):
    _emit("configured")


def pytest_collection_finish(session):
    _MONITOR.check("after collection")
    for module in {id(i.module): i.module for i in session.items if hasattr(i, "module")}.values():
        if type(module) is not _module_type:
            _MONITOR.flag(_monitor.RUNNER_TAMPERING, f"the test module {module.__name__} is a {type(module)}")


def pytest_collectreport(report):
    if report.failed:
        _collect_errors.append(report.nodeid)


def pytest_runtest_logreport(report):
    if report.when == "call":
        _record(report.nodeid, "skipped" if report.skipped else report.outcome)
    elif report.failed:
        _record(report.nodeid, "error")
    elif report.skipped:
        _record(report.nodeid, "skipped")
    if report.when == "teardown":
        _MONITOR.check(report.nodeid, full=False)


def _test_code(item, root):
    """The fingerprint of the function a test item runs (None: not a Python function)."""
    function = getattr(item, "obj", None)
    function = getattr(function, "__func__", function)
    for _ in range(8):
        wrapped = getattr(function, "__wrapped__", None)
        if wrapped is None:
            break
        function = wrapped
    code = getattr(function, "__code__", None)
    if not isinstance(code, types.CodeType):
        return None
    printed = _fingerprint(code)
    if os.path.isabs(printed["file"]):
        printed["file"] = os.path.relpath(printed["file"], root)
    return printed


def _own_changes():
    return sorted(k for k, v in _own.items() if globals().get(k) is not v)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    _MONITOR.check("at the session's end")
    for name in _own_changes():
        _MONITOR.flag(_monitor.RUNNER_TAMPERING, f"the judge plugin's {name} was replaced")
    root = str(session.config.rootpath)
    code = {}
    for item in getattr(session, "items", []):
        base = item.nodeid.split("[", 1)[0]
        if base not in code:
            code[base] = _test_code(item, root)
    _emit(
        "finished",
        exitstatus=int(session.exitstatus),
        tests=_outcomes,
        collected=len({item.nodeid for item in getattr(session, "items", [])}),
        collect_errors=_collect_errors,
        code={k: v for k, v in code.items() if v is not None},
    )
