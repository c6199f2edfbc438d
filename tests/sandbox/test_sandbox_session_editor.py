"""The session editor's pure functions (it runs inside the sandbox; these run it on the host)."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gagar.sandbox.session_editor import (
    SIMILAR_BUDGET,
    SIMILAR_RATIO,
    EditError,
    closest_lines,
    insert_after,
    replace_unique,
    resolve,
    same_name,
    view_lines,
)

LINES = st.lists(st.text(alphabet="abc xyz()=:", max_size=12), max_size=12)


@given(LINES, st.data(), st.text(alphabet="pqr\n", max_size=10))
def test_insert_puts_the_new_lines_after_the_line(lines: list[str], data: st.DataObject, new: str) -> None:
    text = "".join(f"{line}\n" for line in lines)
    at = data.draw(st.integers(0, len(lines)))
    added = (new[:-1] if new.endswith("\n") else new).split("\n")
    assert insert_after(text, at, new) == "".join(f"{line}\n" for line in [*lines[:at], *added, *lines[at:]])


@given(
    st.text(alphabet="ab\n", max_size=30),
    st.text(alphabet="ab\n", min_size=1, max_size=4),
    st.text(max_size=5),
)
def test_replace_changes_exactly_one_occurrence_or_refuses(text: str, old: str, new: str) -> None:
    if text.count(old) != 1 or new == old:
        with pytest.raises(EditError):
            replace_unique(text, old, new)
        return
    after, line = replace_unique(text, old, new)
    at = text.index(old)
    assert after == text[:at] + new + text[at + len(old) :]
    assert line == text[:at].count("\n") + 1


@given(
    st.lists(st.text(alphabet="ab (x)", max_size=8), min_size=1, max_size=10),
    st.text(alphabet="ab (x)\n", max_size=12),
)
def test_the_closest_lines_are_the_most_similar_run_of_lines(lines: list[str], old: str) -> None:
    text = "".join(f"{line}\n" for line in lines)
    wanted = old.strip("\n")
    span = min(wanted.count("\n") + 1, len(lines))
    ratios = [
        difflib.SequenceMatcher(None, "\n".join(lines[i : i + span]), wanted, autojunk=False).ratio()
        for i in range(len(lines) - span + 1)
    ]
    close = closest_lines(text, old)
    if max(ratios) < SIMILAR_RATIO:
        assert close is None
        return
    assert close is not None
    first, shown = close
    assert shown == "\n".join(lines[first - 1 : first - 1 + span])
    assert ratios[first - 1] == max(ratios)
    assert first - 1 == ratios.index(max(ratios))


def test_a_misquote_is_answered_with_the_lines_it_meant() -> None:
    text = "def f(a, b):\n    return a - b\n\n\ndef g(x):\n    return x * 2\n"
    with pytest.raises(EditError) as refused:
        replace_unique(text, "  return a-b\n", "    return a + b\n")
    assert str(refused.value).endswith("without the line numbers\n     2\t    return a - b")
    with pytest.raises(EditError) as refused:
        replace_unique(text, "def g(x):\n    return x*3", "")
    assert str(refused.value).endswith("     5\tdef g(x):\n     6\t    return x * 2")
    with pytest.raises(EditError, match=r"view the lines and quote them exactly$"):
        replace_unique(text, "class Unrelated(Base): pass", "")
    long_file = "".join(f"    value_{n} = {n}\n" for n in range(SIMILAR_BUDGET // 16 + 1))
    assert closest_lines(long_file, "    value_7 = 7\n" * 4) is None  # beyond the search's budget
    assert closest_lines(long_file, "  value_7 = 7\n") == (8, "    value_7 = 7")


def test_view_numbers_lines_and_ranges() -> None:
    text = "a\nb\nc\n"
    assert view_lines(text, None) == "     1\ta\n     2\tb\n     3\tc"
    assert view_lines(text, [2, -1]) == "     2\tb\n     3\tc"
    with pytest.raises(EditError, match="outside"):
        view_lines(text, [4, 5])
    with pytest.raises(EditError, match="occurs 2 times"):
        replace_unique("x\nx\n", "x", "y")
    with pytest.raises(EditError, match="would change nothing"):
        replace_unique(text, "b\n", "b\n")


def test_paths_stay_in_the_tree() -> None:
    assert resolve("pkg/a.py") == "/sandbox/repo/pkg/a.py"
    assert resolve("/sandbox/repo/a.py") == "/sandbox/repo/a.py"
    for bad in ("../etc/passwd", "/etc/passwd", "/sandbox/repository/x", ""):
        with pytest.raises(EditError):
            resolve(bad)


def test_a_missing_file_names_the_files_of_its_name(tmp_path: Path) -> None:
    tree = ("src/pkg/mod.py", "tests/mod.py", "src/pkg/__pycache__/mod.py", ".git/mod.py", "src/other.py")
    for rel in tree:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n")
    found = same_name(str(tmp_path / "pkg/mod.py"), root=str(tmp_path))
    assert sorted(found) == ["src/pkg/mod.py", "tests/mod.py"]
    assert same_name(str(tmp_path / "nothing.py"), root=str(tmp_path)) == []
