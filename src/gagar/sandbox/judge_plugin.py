"""The judge's pytest plugin: each test's outcome and pytest's exit status, written where the tests cannot.

Loaded inside the sandbox with ``-p gagar_judge_plugin`` (a copy of this file in a folder the
tested code cannot write), before any of the repository's code. At import it takes its two
descriptors from ``GAGAR_JUDGE_FDS`` (removing the variable): it reads the run's nonce from
the first, a pipe the judge filled and closed, so nothing read later can find it again; it
writes JSON lines stamped with that nonce to the second, an unlinked file the sandbox uid
cannot reopen by any path. The judge (:func:`gagar.sandbox.pristine.read_report`) treats any
other line there as forged.

It also puts the repository root on ``sys.path`` once pytest has loaded (the judge starts
Python with ``PYTHONSAFEPATH`` so the working directory is not searched while pytest and
this plugin import), as ``python -m pytest`` would have.

Standard library and pytest only, Python 3.8 compatible: shipped verbatim to sandbox pods.
"""

import json
import os
import sys

import pytest

_RANK = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}


def _take_channels():
    raw = os.environ.pop("GAGAR_JUDGE_FDS", "")
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
    return nonce, report_fd


_NONCE, _REPORT_FD = _take_channels()
_outcomes = {}


def _emit(event, **fields):
    data = (json.dumps(dict(fields, nonce=_NONCE, event=event)) + "\n").encode("utf-8")
    while data:
        data = data[os.write(_REPORT_FD, data) :]


def _record(nodeid, outcome):
    if nodeid not in _outcomes or _RANK[outcome] > _RANK[_outcomes[nodeid]]:
        _outcomes[nodeid] = outcome


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config):
    root = str(early_config.rootpath)
    if root not in sys.path:
        sys.path.insert(0, root)


def pytest_configure(config):
    _emit("configured")


def pytest_runtest_logreport(report):
    if report.when == "call":
        _record(report.nodeid, "skipped" if report.skipped else report.outcome)
    elif report.failed:
        _record(report.nodeid, "error")
    elif report.skipped:
        _record(report.nodeid, "skipped")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    _emit("finished", exitstatus=int(session.exitstatus), tests=_outcomes)
