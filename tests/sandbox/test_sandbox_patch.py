"""Unified diff validation and application: what is refused, and that good diffs apply exactly."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gagar.sandbox.patch import (
    PatchError,
    apply_patch,
    apply_patch_to_files,
    check_path,
    file_diff,
    parse_patch,
)

LIMIT = 1 << 20


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("", "empty"),
        ("/etc/passwd", "absolute"),
        ("../x.py", "'..'"),
        ("a/../../x.py", "'..'"),
        ("a//b.py", "empty"),
        ("./a.py", "'.'"),
        (".git/config", ".git"),
        ("sub/.GIT/hooks/x", ".git"),
        ("a\\b.py", "backslash"),
        ("a\nb.py", "control"),
    ],
)
def test_unsafe_paths_are_refused(path: str, why: str) -> None:
    with pytest.raises(PatchError, match=why):
        check_path(path)


@pytest.mark.parametrize(
    ("patch", "why"),
    [
        ("", "no file patches"),
        ("just prose\n", "no file patches"),
        ("diff --git a/x b/x\nGIT binary patch\nliteral 3\n", "binary"),
        ("diff --git a/x b/x\nBinary files a/x and b/x differ\n", "binary"),
        (
            "diff --git a/l b/l\nnew file mode 120000\n--- /dev/null\n+++ b/l\n@@ -0,0 +1 @@\n+/etc\n",
            "symlink",
        ),
        ("diff --git a/a b/b\nrename from a\nrename to b\n", "renames"),
        ("--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@\n-a\n", "ends early"),
        ("--- a/x.py\n@@ -1 +1 @@\n-a\n+b\n", "without '\\+\\+\\+'"),
        ("--- a/x.py\n+++ b/x.py\n", "no hunks"),
        ("--- a/x\x00\n+++ b/x\n", "NUL"),
    ],
)
def test_malformed_and_unsafe_patches_are_refused(patch: str, why: str) -> None:
    with pytest.raises(PatchError, match=why):
        parse_patch(patch, LIMIT)


def test_oversized_patch_is_refused() -> None:
    patch = file_diff("big.py", None, "x = 1\n" * 1000)
    with pytest.raises(PatchError, match="over the 100-byte limit"):
        parse_patch(patch, 100)


def test_diff_applies_with_offset_and_no_trailing_newline() -> None:
    old = {"m.py": "".join(f"line {i}\n" for i in range(20)) + "end", "gone.py": "x\n"}
    new = {"m.py": old["m.py"].replace("line 15\n", "LINE 15\n").replace("end", "END"), "n.py": "new\n"}
    patch = file_diff("gone.py", old["gone.py"], None) + file_diff("m.py", old["m.py"], new["m.py"])
    patch += file_diff("n.py", None, new["n.py"])
    shifted = {**old, "m.py": "extra\nextra\n" + old["m.py"]}
    assert apply_patch_to_files(old, patch) == new
    assert apply_patch_to_files(shifted, patch)["m.py"] == "extra\nextra\n" + new["m.py"]


def test_mismatched_context_does_not_apply() -> None:
    patch = file_diff("m.py", "a\nb\n", "a\nc\n")
    with pytest.raises(PatchError, match="hunk 1"):
        apply_patch_to_files({"m.py": "a\nz\n"}, patch)
    with pytest.raises(PatchError, match="does not exist"):
        apply_patch_to_files({}, patch)
    with pytest.raises(PatchError, match="already exists"):
        apply_patch_to_files({"m.py": "q\n"}, file_diff("m.py", None, "a\n"))


LINES = ["a\n", "b\n", "c\n", "def f():\n", "    pass\n", "", "x = 1\x0c\n", "\x0cy\x0b\n"]
lines = st.lists(st.sampled_from(LINES), max_size=12)


@given(old=lines, new=lines)
def test_file_diff_round_trips(old: list[str], new: list[str]) -> None:
    old_text, new_text = "".join(old), "".join(new)
    patch = file_diff("f.py", old_text, new_text)
    if old_text == new_text:
        assert patch == ""
    else:
        assert apply_patch_to_files({"f.py": old_text}, patch) == {"f.py": new_text}


def test_apply_patch_writes_files_and_refuses_symlinked_paths(tmp_path: Path) -> None:
    repo, outside = tmp_path / "repo", tmp_path / "outside"
    repo.mkdir()
    outside.mkdir()
    (repo / "m.py").write_text("a\n")
    assert apply_patch(repo, file_diff("m.py", "a\n", "b\n") + file_diff("pkg/n.py", None, "n\n"), LIMIT)
    assert (repo / "m.py").read_text() == "b\n"
    assert (repo / "pkg/n.py").read_text() == "n\n"
    os.symlink(outside, repo / "link")
    (outside / "t.py").write_text("a\n")
    with pytest.raises(PatchError, match="symlink"):
        apply_patch(repo, file_diff("link/t.py", "a\n", "pwned\n"), LIMIT)
    with pytest.raises(PatchError, match="symlink"):
        apply_patch(repo, file_diff("link/new.py", None, "pwned\n"), LIMIT)
    assert (outside / "t.py").read_text() == "a\n"
    assert not (outside / "new.py").exists()


def test_apply_patch_is_all_or_nothing(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("a\n")
    (tmp_path / "b.py").write_text("b\n")
    patch = file_diff("a.py", "a\n", "A\n") + file_diff("b.py", "not b\n", "B\n")
    with pytest.raises(PatchError, match=r"b\.py: hunk 1"):
        apply_patch(tmp_path, patch, LIMIT)
    assert (tmp_path / "a.py").read_text() == "a\n"


def test_only_line_feeds_end_a_line_as_in_git() -> None:
    """A form feed or vertical tab stays inside its line, as git and Python's tokenizer keep it."""
    old = "import os\x0c\ndef f():\n    return 1\n"
    new = "import os\x0c\ndef f():\n    return 2\n"
    patch = file_diff("m.py", old, new)
    assert apply_patch_to_files({"m.py": old}, patch) == {"m.py": new}
    assert [h.old_start for fp in parse_patch(patch, LIMIT) for h in fp.hunks] == [1]
