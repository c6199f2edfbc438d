"""A pytest plugin, loaded into the library's own test runs, that records each test's outcome.

It is copied next to the runs and loaded with ``-p gagar_synth_outcomes``; it writes JSON
``{"tests": {nodeid: {"outcome", "message"}}, "collection_errors": [nodeid, ...]}`` to the
path in ``$GAGAR_SYNTH_OUTCOMES``. It imports nothing from gagar (it runs in the library's venv).
"""

import json
import os

_tests = {}
_collection_errors = []


def pytest_collectreport(report):
    if report.failed:
        _collection_errors.append(report.nodeid)


def pytest_runtest_logreport(report):
    entry = _tests.setdefault(report.nodeid, {"outcome": "passed", "message": ""})
    if report.failed:
        if entry["outcome"] != "failed":
            entry["outcome"] = "failed" if report.when == "call" else "error"
        crash = getattr(report.longrepr, "reprcrash", None)
        entry["message"] = crash.message if crash is not None else str(report.longrepr)[-1000:]
    elif report.skipped and entry["outcome"] == "passed":
        entry["outcome"] = "skipped"


def pytest_sessionfinish(session, exitstatus):
    with open(os.environ["GAGAR_SYNTH_OUTCOMES"], "w", encoding="utf-8") as fh:
        json.dump({"tests": _tests, "collection_errors": _collection_errors}, fh)
