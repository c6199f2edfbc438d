"""junit XML to pytest node ids and outcomes."""

from __future__ import annotations

from pathlib import Path

import pytest

from gagar.sandbox.junit import JunitError, parse_junit
from gagar.sandbox.results import Outcome

REPORT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_a" name="test_ok" />
<testcase classname="tests.test_a.TestK" name="test_p[1-2]"><failure message="x">boom</failure></testcase>
<testcase classname="tests.test_a" name="test_skip"><skipped message="s" /></testcase>
<testcase classname="tests.test_a" name="test_teardown" />
<testcase classname="tests.test_a" name="test_teardown"><error message="teardown">e</error></testcase>
</testsuite></testsuites>"""


def test_node_ids_and_outcomes(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests/test_a.py").write_text("")
    assert parse_junit(REPORT, tmp_path) == {
        "tests/test_a.py::test_ok": Outcome.PASSED,
        "tests/test_a.py::TestK::test_p[1-2]": Outcome.FAILED,
        "tests/test_a.py::test_skip": Outcome.SKIPPED,
        "tests/test_a.py::test_teardown": Outcome.ERROR,
    }


def test_invalid_report_raises() -> None:
    with pytest.raises(JunitError, match="not valid XML"):
        parse_junit("<testsuite><testcase", None)
