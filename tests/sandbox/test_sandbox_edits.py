"""SEARCH/REPLACE edit blocks: strict parsing, exact-once application, and conversion to a diff."""

from __future__ import annotations

import pytest

from gagar.sandbox.edits import (
    EditApplyError,
    EditBlock,
    EditFormatError,
    apply_edit_blocks,
    edit_blocks_to_diff,
    parse_edit_blocks,
)
from gagar.sandbox.patch import apply_patch_to_files

ANSWER = """calc.py
<<<<<<< SEARCH
def add(a, b):
    return a - b
=======
def add(a, b):
    return a + b
>>>>>>> REPLACE

docs/NOTES.md
<<<<<<< SEARCH
=======
fixed add
>>>>>>> REPLACE
"""
FILES = {"calc.py": "import os\n\ndef add(a, b):\n    return a - b\n\ndef sub(a, b):\n    return a - b"}


def test_parses_blocks() -> None:
    assert parse_edit_blocks(ANSWER) == [
        EditBlock("calc.py", "def add(a, b):\n    return a - b\n", "def add(a, b):\n    return a + b\n"),
        EditBlock("docs/NOTES.md", "", "fixed add\n"),
    ]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "no edit blocks"),
        ("<<<<<<< SEARCH\na\n=======\nb\n>>>>>>> REPLACE\n", "empty path"),
        ("x.py\n<<<<<<< SEARCH\na\n>>>>>>> REPLACE\n", "missing '=======' divider"),
        ("x.py\n<<<<<<< SEARCH\na\n=======\nb\n", "unterminated"),
        ("Here is my fix:\nx.py\n<<<<<<< SEARCH\n", "expected a file path"),
        ("../x.py\n<<<<<<< SEARCH\na\n=======\nb\n>>>>>>> REPLACE\n", "block 1: .*'\\.\\.'"),
        ("=======\n", "outside a block"),
    ],
)
def test_format_errors_say_why(text: str, why: str) -> None:
    with pytest.raises(EditFormatError, match=why):
        parse_edit_blocks(text)


def test_apply_and_diff_agree() -> None:
    blocks = parse_edit_blocks(ANSWER)
    new = apply_edit_blocks(FILES, blocks)
    assert new["calc.py"] == FILES["calc.py"].replace("a - b\n\n", "a + b\n\n")
    assert new["docs/NOTES.md"] == "fixed add\n"
    diff = edit_blocks_to_diff(FILES, blocks)
    assert diff.startswith("diff --git a/calc.py b/calc.py\n")
    assert "new file mode 100644" in diff
    assert apply_patch_to_files(FILES, diff) == new


def test_search_matches_at_end_of_file_without_newline() -> None:
    blocks = [EditBlock("calc.py", "def sub(a, b):\n    return a - b\n", "def sub(a, b):\n    return b\n")]
    assert apply_edit_blocks(FILES, blocks)["calc.py"].endswith("def sub(a, b):\n    return b")


@pytest.mark.parametrize(
    ("block", "why"),
    [
        (EditBlock("calc.py", "    return a - b\n", "x\n"), "block 1 \\(calc.py\\): .*matches 2 places"),
        (EditBlock("calc.py", "return a - b\n", "x\n"), "not found"),
        (EditBlock("nope.py", "a\n", "b\n"), "does not exist"),
        (EditBlock("calc.py", "", "b\n"), "file exists"),
    ],
)
def test_apply_errors_name_the_block(block: EditBlock, why: str) -> None:
    with pytest.raises(EditApplyError, match=why):
        apply_edit_blocks(FILES, [block])
