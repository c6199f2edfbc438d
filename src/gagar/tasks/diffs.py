"""Unified diffs on in-memory snapshots (path -> text): make, parse, apply.

A pure-Python counterpart of ``git diff`` / ``git apply`` for trusted code paths
(task generation, tests, the patch-quality oracle). Untrusted patches are applied
by the hardened applier in :mod:`gagar.sandbox`, never here.

Diffs are git-style (``diff --git a/x b/x``, ``--- a/x``, ``+++ b/x``) so they apply
with ``git apply`` and ``patch -p1``; file creation and deletion use ``/dev/null``.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "DiffApplyError",
    "DiffParseError",
    "FilePatch",
    "Hunk",
    "apply_diff",
    "changed_lines",
    "diff_stats",
    "make_diff",
    "parse_diff",
]

NO_NEWLINE = "\\ No newline at end of file"
_HEADER_PREFIXES = (
    "diff ", "index ", "new file mode", "deleted file mode", "similarity", "old mode", "new mode", "rename ",
    "Binary files",
)  # fmt: skip
_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class DiffParseError(ValueError):
    """A diff that is not a well-formed unified diff, naming the offending diff line."""

    def __init__(self, line: int, message: str) -> None:
        self.line = line
        super().__init__(f"diff line {line}: {message}")


class DiffApplyError(ValueError):
    """A diff that does not apply to a snapshot, naming the file and hunk."""


@dataclass
class Hunk:
    """One ``@@`` hunk. ``lines`` holds (tag, text) with tag in ``' '``, ``'-'``, ``'+'``;
    ``text`` keeps its newline unless the file ends without one."""

    old_start: int
    old_len: int
    new_start: int
    new_len: int
    lines: list[tuple[str, str]] = field(default_factory=list)

    @property
    def removed_lines(self) -> list[int]:
        """1-based line numbers, in the old file, of the lines this hunk removes."""
        return [n for n, tag in self._numbered("-") if tag == "-"]

    @property
    def added_lines(self) -> list[int]:
        """1-based line numbers, in the new file, of the lines this hunk adds."""
        return [n for n, tag in self._numbered("+") if tag == "+"]

    def _numbered(self, side: str) -> list[tuple[int, str]]:
        number = self.old_start if side == "-" else self.new_start
        out = []
        for tag, _ in self.lines:
            if tag in (" ", side):
                out.append((number, tag))
                number += 1
        return out


@dataclass
class FilePatch:
    """The hunks of one file; ``old_path``/``new_path`` are None for a created/deleted file."""

    old_path: str | None
    new_path: str | None
    hunks: list[Hunk] = field(default_factory=list)

    @property
    def path(self) -> str:
        """The file's path (the new one, or the old one for a deletion)."""
        path = self.new_path or self.old_path
        assert path is not None
        return path

    @property
    def removed_lines(self) -> list[int]:
        """Old-file line numbers of every removed line."""
        return [n for h in self.hunks for n in h.removed_lines]

    @property
    def added_lines(self) -> list[int]:
        """New-file line numbers of every added line."""
        return [n for h in self.hunks for n in h.added_lines]


def _lines_for_diff(text: str) -> list[str]:
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n" + NO_NEWLINE + "\n"
    return lines


def changed_lines(old: str | None, new: str | None) -> tuple[list[int], list[int]]:
    """(removed line numbers in ``old``, added line numbers in ``new``), 1-based, by ``difflib``."""
    a, b = (old or "").splitlines(), (new or "").splitlines()
    removed: list[int] = []
    added: list[int] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag != "equal":
            removed.extend(range(i1 + 1, i2 + 1))
            added.extend(range(j1 + 1, j2 + 1))
    return removed, added


def make_diff(before: Mapping[str, str], after: Mapping[str, str], context: int = 3) -> str:
    """A git-style unified diff turning snapshot ``before`` into ``after`` (files in path order)."""
    chunks: list[str] = []
    for path in sorted(set(before) | set(after)):
        old, new = before.get(path), after.get(path)
        if old == new:
            continue
        header = [f"diff --git a/{path} b/{path}\n"]
        if old is None:
            header.append("new file mode 100644\n")
        elif new is None:
            header.append("deleted file mode 100644\n")
        body = list(
            difflib.unified_diff(
                _lines_for_diff(old or ""),
                _lines_for_diff(new or ""),
                fromfile="/dev/null" if old is None else f"a/{path}",
                tofile="/dev/null" if new is None else f"b/{path}",
                n=context,
            )
        )
        if body:
            body[0], body[1] = body[0].rstrip() + "\n", body[1].rstrip() + "\n"
        chunks.extend(header + body)
    return "".join(chunks)


def _strip_prefix(name: str) -> str | None:
    name = name.split("\t", 1)[0].strip()
    if name == "/dev/null":
        return None
    return name[2:] if name[:2] in ("a/", "b/") else name


def parse_diff(text: str) -> list[FilePatch]:
    """Parse a unified diff (git-style or plain ``---``/``+++``) into per-file hunks.

    Raises:
        DiffParseError: on a hunk whose body does not match its header, or lines outside any file.
    """
    lines = text.splitlines(keepends=True)
    files: list[FilePatch] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            files.append(FilePatch(_strip_prefix(line[4:]), _strip_prefix(lines[i + 1][4:])))
            i += 2
        elif line.startswith("@@"):
            if not files:
                raise DiffParseError(i + 1, "hunk before any '---'/'+++' file header")
            i = _parse_hunk(lines, i, files[-1])
        elif line.startswith(_HEADER_PREFIXES) or not line.strip() or not files:
            i += 1
        else:
            raise DiffParseError(i + 1, f"unexpected line {line.rstrip()!r}")
    return files


def _parse_hunk(lines: list[str], i: int, target: FilePatch) -> int:
    match = _HUNK_RE.match(lines[i])
    if not match:
        raise DiffParseError(i + 1, f"malformed hunk header {lines[i].rstrip()!r}")
    old_start, old_len, new_start, new_len = (int(g) if g is not None else 1 for g in match.groups())
    hunk = Hunk(old_start, old_len, new_start, new_len)
    old_seen = new_seen = 0
    i += 1
    while old_seen < old_len or new_seen < new_len:
        if i >= len(lines):
            raise DiffParseError(i, "hunk ends before its header's line counts are reached")
        line = lines[i]
        tag, body = (line[0], line[1:]) if line not in ("\n", "") else (" ", "\n")
        if tag not in " -+":
            raise DiffParseError(i + 1, f"hunk line must start with ' ', '-' or '+', got {line.rstrip()!r}")
        old_seen += tag in " -"
        new_seen += tag in " +"
        hunk.lines.append((tag, body))
        i += 1
        if i < len(lines) and lines[i].startswith("\\"):
            hunk.lines[-1] = (tag, body.rstrip("\n"))
            i += 1
    if old_seen != old_len or new_seen != new_len:
        raise DiffParseError(i, "hunk body longer than its header says")
    target.hunks.append(hunk)
    return i


def _find(old: list[str], block: list[str], expected: int, start: int) -> int | None:
    """Where ``block`` occurs in ``old`` at or after ``start``, nearest to ``expected`` (as git apply)."""
    candidates = range(start, len(old) - len(block) + 1)
    for pos in sorted(candidates, key=lambda p: (abs(p - expected), p)):
        if old[pos : pos + len(block)] == block:
            return pos
    return None


def _apply_file(old_text: str, fp: FilePatch) -> str:
    old = old_text.splitlines(keepends=True)
    out: list[str] = []
    cursor = 0
    for number, hunk in enumerate(fp.hunks, start=1):
        block = [text for tag, text in hunk.lines if tag in " -"]
        expected = max(hunk.old_start - 1, 0) if hunk.old_len else hunk.old_start
        pos = _find(old, block, expected, cursor)
        if pos is None:
            raise DiffApplyError(f"{fp.path}: hunk {number} (@@ -{hunk.old_start}) does not match the file")
        out.extend(old[cursor:pos])
        out.extend(text for tag, text in hunk.lines if tag in " +")
        cursor = pos + len(block)
    out.extend(old[cursor:])
    return "".join(out)


def apply_diff(snapshot: Mapping[str, str], diff: str) -> dict[str, str]:
    """A new snapshot with ``diff`` applied; ``snapshot`` is not modified.

    Context and removed lines must match exactly; a hunk may sit at an offset from the
    line its header names (as with ``git apply``), but no fuzz is allowed.

    Raises:
        DiffParseError: if ``diff`` is malformed.
        DiffApplyError: if a hunk does not match, a created file exists or a patched file is missing.
    """
    result = dict(snapshot)
    for fp in parse_diff(diff):
        if fp.old_path is None:
            if fp.path in result:
                raise DiffApplyError(f"{fp.path}: created by the diff but already exists")
            result[fp.path] = _apply_file("", fp)
            continue
        if fp.old_path not in result:
            raise DiffApplyError(f"{fp.old_path}: patched by the diff but not in the snapshot")
        new_text = _apply_file(result.pop(fp.old_path), fp)
        if fp.new_path is not None:
            result[fp.new_path] = new_text
        elif new_text:
            raise DiffApplyError(f"{fp.old_path}: deleted by the diff but lines remain")
    return result


def diff_stats(diff: str) -> tuple[int, int]:
    """(added, removed) line counts of a diff."""
    files = parse_diff(diff)
    return sum(len(f.added_lines) for f in files), sum(len(f.removed_lines) for f in files)
