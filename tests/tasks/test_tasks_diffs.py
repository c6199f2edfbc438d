"""Unified diffs on snapshots: make, parse, apply; checked against git apply and patch -p1."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gagar.tasks.diffs import DiffApplyError, DiffParseError, apply_diff, diff_stats, make_diff, parse_diff
from gagar.tasks.testrun import write_snapshot

BEFORE = {
    "pkg/a.py": "def f(x):\n    return x + 1\n\n\ndef g(y):\n    return y * 2\n",
    "README.md": "# pkg\n",
    "gone.txt": "bye\n",
    "tail.txt": "no newline at end",
}
AFTER = {
    "pkg/a.py": "def f(x):\n    return x - 1\n\n\ndef g(y):\n    return y * 2\n",
    "README.md": "# pkg\n",
    "new/file.py": "VALUE = 1\n",
    "tail.txt": "no newline at end, changed",
}


def test_make_diff_is_git_style_and_round_trips():
    diff = make_diff(BEFORE, AFTER)
    assert "diff --git a/pkg/a.py b/pkg/a.py\n--- a/pkg/a.py\n+++ b/pkg/a.py\n" in diff
    assert "new file mode 100644\n--- /dev/null\n+++ b/new/file.py" in diff
    assert "deleted file mode 100644\n--- a/gone.txt\n+++ /dev/null" in diff
    assert "\\ No newline at end of file" in diff
    assert apply_diff(BEFORE, diff) == AFTER
    assert make_diff(BEFORE, BEFORE) == ""


def test_parse_diff_reports_changed_line_numbers():
    files = {f.path: f for f in parse_diff(make_diff(BEFORE, AFTER))}
    assert files["pkg/a.py"].removed_lines == [2]
    assert files["pkg/a.py"].added_lines == [2]
    assert files["new/file.py"].old_path is None
    assert files["new/file.py"].added_lines == [1]
    assert files["gone.txt"].new_path is None
    assert files["gone.txt"].removed_lines == [1]
    assert diff_stats(make_diff(BEFORE, AFTER)) == (3, 3)


@pytest.mark.parametrize("tool", ["git", "patch"])
def test_diff_applies_with_git_and_patch(tmp_path: Path, tool: str):
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed")
    write_snapshot(BEFORE, tmp_path)
    (tmp_path / "change.diff").write_text(make_diff(BEFORE, AFTER))
    argv = ["git", "apply", "change.diff"] if tool == "git" else ["patch", "-p1", "-s", "-i", "change.diff"]
    subprocess.run(argv, cwd=tmp_path, check=True, capture_output=True)
    for path, text in AFTER.items():
        assert (tmp_path / path).read_text() == text
    assert not (tmp_path / "gone.txt").exists()


def test_apply_is_strict_about_context():
    diff = make_diff(BEFORE, AFTER)
    changed = {**BEFORE, "pkg/a.py": BEFORE["pkg/a.py"].replace("return x + 1", "return x + 2")}
    with pytest.raises(DiffApplyError, match=r"pkg/a.py: hunk 1"):
        apply_diff(changed, diff)
    with pytest.raises(DiffApplyError, match="already exists"):
        apply_diff({**BEFORE, "new/file.py": "x\n"}, diff)
    with pytest.raises(DiffApplyError, match="not in the snapshot"):
        apply_diff({"README.md": "# pkg\n"}, diff)


def test_apply_finds_a_hunk_at_an_offset():
    diff = make_diff(BEFORE, AFTER)
    shifted = {k: ("# header\n" * 5 + v if k == "pkg/a.py" else v) for k, v in BEFORE.items()}
    assert apply_diff(shifted, diff)["pkg/a.py"].startswith("# header\n" * 5 + "def f(x):\n    return x - 1")


def test_malformed_diff_names_the_line():
    with pytest.raises(DiffParseError, match="diff line 4: hunk line must start"):
        parse_diff("--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@ def f():\n?oops\n")
    with pytest.raises(DiffParseError, match="diff line 3: malformed hunk header"):
        parse_diff("--- a/x\n+++ b/x\n@@ -x +1 @@\n-a\n+b\n")
    with pytest.raises(DiffParseError, match="hunk before"):
        parse_diff("@@ -1 +1 @@\n-a\n+b\n")
    with pytest.raises(DiffParseError, match="ends before"):
        parse_diff("--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n a\n")


lines = st.lists(st.sampled_from(["a", "b", "c", "", "def f():", "    return 1"]), max_size=12)


@settings(max_examples=150, deadline=None)
@given(old=lines, new=lines, old_nl=st.booleans(), new_nl=st.booleans())
def test_apply_of_make_diff_reproduces_the_target(old: list[str], new: list[str], old_nl: bool, new_nl: bool):
    before = {"f.txt": "\n".join(old) + ("\n" if old_nl and old else "")}
    after = {"f.txt": "\n".join(new) + ("\n" if new_nl and new else "")}
    assert apply_diff(before, make_diff(before, after)) == after
