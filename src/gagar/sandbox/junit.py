"""Per-test outcomes from a pytest junit XML report, keyed by pytest node id.

pytest's junit ``classname`` is the dotted module path plus any class
(``tests.test_x.TestA``); the node id is ``tests/test_x.py::TestA::test_name``. Which
dotted prefix is the module is decided by looking for the ``.py`` file in the repository.
The report is written by untrusted code: its size is capped by the caller, and expat
(2.4+) refuses entity-expansion bombs; ElementTree never fetches external entities.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

from gagar.sandbox.results import Outcome

__all__ = ["JunitError", "node_id", "parse_junit"]

_RANK = {Outcome.PASSED: 0, Outcome.SKIPPED: 1, Outcome.FAILED: 2, Outcome.ERROR: 3}


class JunitError(ValueError):
    """A junit report that cannot be read."""


def node_id(classname: str, name: str, is_module: Callable[[str], bool]) -> str:
    """The pytest node id of a junit testcase; ``is_module('a/b.py')`` says whether that file exists."""
    parts = classname.split(".") if classname else []
    for k in range(len(parts), 0, -1):
        module = "/".join(parts[:k]) + ".py"
        if is_module(module):
            return "::".join([module, *parts[k:], name])
    return "::".join(["/".join(parts) + ".py", name]) if parts else name


def _outcome(case: ET.Element) -> Outcome:
    if case.find("error") is not None:
        return Outcome.ERROR
    if case.find("failure") is not None:
        return Outcome.FAILED
    if case.find("skipped") is not None:
        return Outcome.SKIPPED
    return Outcome.PASSED


def parse_junit(xml_text: str, repo: Path | None = None) -> dict[str, Outcome]:
    """Outcome per node id; a test reported twice (e.g. a teardown error) keeps its worst outcome.

    Args:
        xml_text: the report.
        repo: the repository root, to tell modules from classes; None assumes no test classes.

    Raises:
        JunitError: the report is not well-formed XML.
    """
    try:
        root = ET.fromstring(xml_text)
    except ET.ParseError as exc:
        raise JunitError(f"junit report is not valid XML ({exc})") from None

    def is_module(path: str) -> bool:
        return repo is None or (repo / path).is_file()

    outcomes: dict[str, Outcome] = {}
    for case in root.iter("testcase"):
        nid = node_id(case.get("classname", ""), case.get("name", ""), is_module)
        outcome = _outcome(case)
        if nid not in outcomes or _RANK[outcome] > _RANK[outcomes[nid]]:
            outcomes[nid] = outcome
    return outcomes
