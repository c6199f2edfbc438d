"""A hand-made group for the grader tests: a two-module package with an off-by-one bug."""

from __future__ import annotations

from pathlib import Path

from gagar.grader.workspace import CandidateInput, GroupWorkspace, build_group_workspace
from gagar.sandbox.patch import file_diff
from gagar.schema.task import Task

CALC = """def add(a, b):
    return a + b + 1


def scale(values, factor):
    out = []
    for v in values:
        out.append(v * factor)
    return out
"""
FMT = """def show(x):
    text = str(x)
    return text
"""
TESTS = """from pkg.calc import add, scale


def test_add():
    assert add(2, 3) == 5


def test_scale():
    assert scale([1, 2], 2) == [2, 4]
"""
SNAPSHOT = {
    "pkg/__init__.py": "",
    "pkg/calc.py": CALC,
    "pkg/fmt.py": FMT,
    "tests/test_calc.py": TESTS,
    "README.md": "# pkg\n",
}
FIXED = CALC.replace("a + b + 1", "a + b")
GOLD = file_diff("pkg/calc.py", CALC, FIXED)
PRINTY = file_diff(
    "pkg/calc.py", CALC, FIXED.replace("    return a + b\n", '    print("DEBUG", a, b)\n    return a + b\n')
)
WIDE = GOLD + file_diff("pkg/fmt.py", FMT, FMT.replace("text = str(x)", "# to text\n    text = str(x)"))
README = GOLD + file_diff("README.md", "# pkg\n", "# pkg\n\nSee the changelog.\n")
HOSTILE = file_diff("x.py", None, "print(1)\n").replace("x.py", "../escape.py")


def task() -> Task:
    return Task(
        instance_id="pkg-1",
        repo="gagar/pkg",
        snapshot=SNAPSHOT,
        problem_statement="add(2, 3) returns 6 instead of 5.",
        patch=GOLD,
        FAIL_TO_PASS=["tests/test_calc.py::test_add"],
        PASS_TO_PASS=["tests/test_calc.py::test_scale"],
    )


CANDIDATES = {
    "gold": GOLD,
    "printy": PRINTY,
    "wide": WIDE,
    "readme": README,
    "hostile": HOSTILE,
    "failing": "",
}
PASSING = ("gold", "printy", "wide", "readme", "hostile")


def group(root: Path, passing: tuple[str, ...] = PASSING) -> GroupWorkspace:
    """The group laid out under ``root``; ``hostile`` does not apply, so it never counts as passing."""
    candidates = [CandidateInput(t, p) for t, p in CANDIDATES.items()]
    return build_group_workspace(root, "group/1", task(), candidates, {t: t in passing for t in CANDIDATES})
