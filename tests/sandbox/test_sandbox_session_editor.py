"""The session editor's pure functions (it runs inside the sandbox; these run it on the host)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gagar.sandbox.session_editor import (
    EditError,
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
